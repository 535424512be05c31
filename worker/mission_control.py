"""MissionControl: the Python client for missions (the `conductor mission` CLI is a thin layer on it).

What the server answers when an operation cannot go ahead is turned into one-line errors here, in one
place (`MissionControl._refusal`): `MissionNotFound` (no such mission where the client looks) and
`MissionClosed` (its workflow has ended: how, in words); `ReviewRefused` for reviews. All three are
`MissionRefused`, which the CLI prints as `conductor: <message>`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

from pydantic import ValidationError
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, FailureError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from worker.connection import Reconnect
from worker.inputs import one_line
from workflows.failures import INVALID_INPUT
from workflows.inbound import joined, problems
from workflows.mission.aggregation import is_final
from workflows.mission.executor_v1 import ExecutorDispatch, is_dispatch
from workflows.mission.ledger import MissionLedger
from workflows.mission.messages import ANSWER_CHILD, MISSION_WORKFLOW, MissionInput, ReviewRequest, mission_workflow_id
from workflows.mission.questions import AnswerRequest, AnswerResult
from workflows.mission.search import MISSION_AGGREGATION, MISSION_HOST_GROUP, MISSION_ORCHESTRATOR, MISSION_STATE
from workflows.mission.spec import MissionSpec




class MissionSpecError(ValueError):
    """A spec that cannot start a mission; `problems` lists every one of them. The message is
    one line (the first `workflows.inbound.MAX_PROBLEMS_SHOWN` of them), so that a terminal or a log shows it whole."""

    def __init__(self, problems: list[str], source: str | None = None) -> None:
        super().__init__(one_line(f"invalid mission spec{f' {source}' if source else ''}: {joined(problems)}"))
        self.problems = problems


class MissionRefused(RuntimeError):
    """The server's answer that an operation on a mission cannot go ahead, as one line a person can
    act on (the CLI prints it as `conductor: <message>` and exits 1)."""


class MissionNotFound(MissionRefused, RPCError):
    """No mission under this id on the server and namespace the client talks to. It stays the
    server's NOT_FOUND `RPCError` (same status), so code that caught that answer still does."""

    def __init__(self, mission_id: str, *, address: str, namespace: str, raw_grpc_status: bytes = b"") -> None:
        workflow_id = mission_workflow_id(mission_id)
        RPCError.__init__(
            self,
            one_line(
                f"no mission {mission_id} on the Temporal server at {address}, namespace {namespace} "
                f"(no workflow {workflow_id} there); check the id, and TEMPORAL_ADDRESS / TEMPORAL_NAMESPACE "
                "(or the profile) if the mission runs on another server or namespace"
            ),
            RPCStatusCode.NOT_FOUND,
            raw_grpc_status,
        )
        self.mission_id = mission_id
        self.workflow_id = workflow_id


# What each operation says of a mission that has closed already (`closed_as` says how).
_ON_CLOSED = {
    "stop": "nothing to stop",
    "cancel": "it can no longer be cancelled",
    "review": "it takes no review any more",
    "answer": "its children ask nothing any more",
}


class MissionClosed(MissionRefused):
    """The mission's workflow has ended, so it takes no stop, cancel or review now. `closed_as`
    says how: its verdict (completed, failed, operator-review-required, cancelled) when the
    workflow completed, else how Temporal ended it (cancelled, terminated, timed out)."""

    def __init__(self, mission_id: str, operation: str, closed_as: str) -> None:
        then = _ON_CLOSED.get(operation)
        super().__init__(one_line(f"mission {mission_id} has already closed ({closed_as}){f'; {then}' if then else ''}"))
        self.mission_id = mission_id
        self.operation = operation
        self.closed_as = closed_as


class ReviewRefused(MissionRefused):
    """The mission takes no review now (already decided, not awaiting review, or closed)."""


class AnswerRefused(MissionRefused):
    """The mission refused an answer (wrong payload, responder not allowed, not delivered): the
    reasons are in the message; nothing was forwarded (the CLI exits 2)."""


class NoOpenQuestion(MissionRefused):
    """The child asks nothing now (never did, answered already, or ended): exit 1."""


class VerdictPending(MissionRefused):
    """A stop asked for before the verdict settled: stopping then would end children the verdict
    still waits for (and fail an all-pass mission); abandoning a mission is what cancel is for."""


class MissionIdUsed(ValueError):
    """A mission id that a mission already ran under: its ledger, fleet records and admission
    requests all carry that id, so a second mission under it would be mistaken for the first."""


def parse_spec(data: object, source: str | None = None) -> MissionSpec:
    """Validate a spec completely, before anything starts; every problem is listed (`source`,
    e.g. the file it came from, names it in the message). The limits a spec is held to are
    the model's own (workflows.mission.spec, workflows.limits), so every way in refuses the same."""
    try:
        if is_dispatch(data):  # an AIWG executor.v1 dispatch: a one-child mission
            try:
                return ExecutorDispatch.model_validate(data).to_spec()
            except ValidationError:
                raise
            except ValueError as error:
                raise MissionSpecError([str(error)], source) from None
        return MissionSpec.model_validate(data)
    except ValidationError as error:
        raise MissionSpecError(problems(error), source) from None


class MissionControl:
    """Start and operate missions. Every call after `start` rides out a Temporal restart or a network
    break (see `worker.connection.Reconnect`): it says so once through `announce` (default: a line on
    stderr) and gives up with `TemporalUnreachable` after `reconnect_seconds` (default:
    $CONDUCTOR_RECONNECT_SECONDS, else 60). For the shortest silence before that, connect the client
    with `worker.connection.CLI_RETRY_CONFIG`, as the CLI does."""

    def __init__(
        self,
        client: Client,
        task_queue: str,
        *,
        search_attributes: bool = True,
        reconnect_seconds: float | None = None,
        announce: Callable[[str], None] | None = None,
    ) -> None:
        self._client = client
        self._task_queue = task_queue
        self._search_attributes = search_attributes
        self._reconnect = Reconnect(client, reconnect_seconds, announce=announce)

    @property
    def client(self) -> Client:
        return self._client

    def handle(self, mission_id: str) -> WorkflowHandle:
        return self._client.get_workflow_handle(mission_workflow_id(mission_id), result_type=MissionLedger)

    async def start(self, spec: MissionSpec, **input_options: object) -> str:
        attributes = None
        if self._search_attributes:
            attributes = TypedSearchAttributes([
                SearchAttributePair(MISSION_STATE, "planning"),
                SearchAttributePair(MISSION_AGGREGATION, spec.aggregation.mode),
                SearchAttributePair(MISSION_HOST_GROUP, spec.host_group),
                SearchAttributePair(MISSION_ORCHESTRATOR, spec.orchestrator_id),
            ])
        try:
            await self._client.start_workflow(
                MISSION_WORKFLOW,
                MissionInput(spec=spec, search_attributes=self._search_attributes, **input_options),  # type: ignore[arg-type]
                id=mission_workflow_id(spec.mission_id),
                task_queue=self._task_queue,
                search_attributes=attributes,
                memo={"goal": spec.goal},
                static_summary=f"mission {spec.mission_id}: {spec.goal}",
                # A mission id names one mission for good (ledger, fleet records, admission requests).
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            )
        except WorkflowAlreadyStartedError:
            raise MissionIdUsed(await self._used_before(spec.mission_id)) from None
        return spec.mission_id

    async def _used_before(self, mission_id: str) -> str:
        workflow_id = mission_workflow_id(mission_id)
        try:
            description = await self._describe(mission_id, f"looking up mission {mission_id}")
        except RPCError:  # gone from the server since (past its retention): the id was used all the same
            how = ""
        else:
            started = f"started {description.start_time:%Y-%m-%d %H:%M:%S} UTC"
            if description.status == WorkflowExecutionStatus.RUNNING:
                return one_line(
                    f"mission {mission_id} is already running (workflow {workflow_id}, {started}); a mission id "
                    "names one mission: give the spec a new mission_id, or follow the running one with "
                    f"`conductor mission watch {mission_id}`"
                )
            how = f", {await self._closed_as(mission_id, description.status)}, {started}"
        return one_line(
            f"mission {mission_id} was run before (workflow {workflow_id}{how}); "
            "a mission id names one mission: give the spec a new mission_id"
        )

    # --- the server's answers, in words: one place ---------------------------------------------

    async def _describe(self, mission_id: str, doing: str) -> WorkflowExecutionDescription:
        """The mission workflow's description; `MissionNotFound` if there is none."""
        handle = self.handle(mission_id)
        try:
            return await self._reconnect.call(handle.describe, doing)
        except RPCError as error:
            if error.status == RPCStatusCode.NOT_FOUND:
                raise self._not_found(mission_id, error) from None
            raise

    def _not_found(self, mission_id: str, error: RPCError | None = None) -> MissionNotFound:
        return MissionNotFound(
            mission_id, address=self._reconnect.address, namespace=self._client.namespace,
            raw_grpc_status=error.raw_grpc_status if error is not None else b"",
        )

    async def _closed_as(self, mission_id: str, status: WorkflowExecutionStatus | None) -> str:
        """How a closed mission ended, in a word or two: its verdict if its workflow completed."""
        if status == WorkflowExecutionStatus.COMPLETED:
            try:
                # The close event holds the final ledger: no worker needed to read it (a query would).
                ledger = await self._reconnect.call(self.handle(mission_id).result, f"reading how mission {mission_id} ended")
                return ledger.parent_state
            except Exception:  # only the wording depends on it
                return "its workflow completed"
        if status == WorkflowExecutionStatus.FAILED:
            failure = await self._failure(mission_id)
            if failure is not None:
                return one_line(f"its workflow failed: {failure.message}")
        return {
            WorkflowExecutionStatus.CANCELED: "cancelled",
            WorkflowExecutionStatus.TERMINATED: "terminated in Temporal",
            WorkflowExecutionStatus.TIMED_OUT: "timed out in Temporal",
            WorkflowExecutionStatus.FAILED: "its workflow failed",
        }.get(status, status.name.lower().replace("_", " ") if status else "status unknown")  # type: ignore[arg-type]

    async def _failure(self, mission_id: str) -> FailureError | None:
        """Why a failed mission's workflow failed (an `InvalidInput` when a client's input was refused)."""
        try:
            await self._reconnect.call(self.handle(mission_id).result, f"reading how mission {mission_id} ended")
        except WorkflowFailureError as error:
            return error.cause if isinstance(error.cause, FailureError) else None
        except Exception:  # only the wording depends on it
            return None
        return None

    async def _refusal(
        self, mission_id: str, operation: str, error: RPCError, doing: str,
    ) -> MissionRefused | None:
        """What the server's NOT_FOUND about a mission means: no such mission (`MissionNotFound`), or
        its workflow has closed (`MissionClosed`); None for any other answer, or a mission still running."""
        if error.status != RPCStatusCode.NOT_FOUND:
            return None
        description = await self._describe(mission_id, doing)  # raises MissionNotFound
        if description.status == WorkflowExecutionStatus.RUNNING:
            return None
        return MissionClosed(mission_id, operation, await self._closed_as(mission_id, description.status))

    async def wait_for_verdict(self, mission_id: str) -> MissionLedger:
        """The ledger once the verdict settles; for a mission already closed, its final ledger."""
        handle = self.handle(mission_id)
        # One update id for every attempt: a repeat after a lost connection joins the update the server
        # already holds instead of adding another (the update only waits, so either would be correct).
        update_id = f"wait-for-verdict-{uuid.uuid4()}"
        doing = f"waiting for the verdict of mission {mission_id} (it carries on in Temporal)"
        try:
            return await self._reconnect.call(
                lambda: handle.execute_update("wait_for_verdict", id=update_id, result_type=MissionLedger), doing,
            )
        except (RPCError, WorkflowUpdateFailedError):
            description = await self._describe(mission_id, doing)  # MissionNotFound if there is no such mission
            if description.status == WorkflowExecutionStatus.RUNNING:
                raise
        return await self.show(mission_id)

    async def run(self, spec: MissionSpec, **input_options: object) -> MissionLedger:
        await self.start(spec, **input_options)
        return await self.wait_for_verdict(spec.mission_id)

    async def show(self, mission_id: str) -> MissionLedger:
        doing = f"reading the ledger of mission {mission_id}"
        return await self._ledger_of(mission_id, await self._describe(mission_id, doing), doing)  # or MissionNotFound

    async def _ledger_of(self, mission_id: str, description: WorkflowExecutionDescription, doing: str) -> MissionLedger:
        """The ledger, as its `ledger` query answers; a run that failed on its input has none (a query of
        it is never answered: its replay fails the same way), so it is told from its failure instead."""
        handle = self.handle(mission_id)
        if description.status == WorkflowExecutionStatus.FAILED:
            failure = await self._failure(mission_id)
            if isinstance(failure, ApplicationError) and failure.type == INVALID_INPUT:
                raise MissionClosed(mission_id, "show", one_line(f"its workflow failed: {failure.message}"))
        try:
            return await self._reconnect.call(lambda: handle.query("ledger", result_type=MissionLedger), doing)
        except RPCError as error:
            refusal = await self._refusal(mission_id, "show", error, doing)
            if refusal is None:
                raise
        raise refusal

    async def review(self, mission_id: str, *, approve: bool, operator: str, reason: str) -> MissionLedger:
        request = ReviewRequest(operator=operator, decision="approve" if approve else "reject", reason=reason)
        handle = self.handle(mission_id)
        # The same update id on every attempt: the server answers a repeat of an update it already
        # ran with that update's outcome, instead of running the review again.
        update_id = f"review-{uuid.uuid4()}"
        attempts = 0

        async def send() -> MissionLedger:
            nonlocal attempts
            attempts += 1
            return await handle.execute_update("review", request, id=update_id, result_type=MissionLedger)

        doing = f"sending the review of mission {mission_id}"
        try:
            return await self._reconnect.call(send, doing)
        except WorkflowUpdateFailedError as error:
            cause = error.cause
            refusal = ReviewRefused(getattr(cause, "message", None) or str(cause))
        except RPCError as error:
            closed = await self._refusal(mission_id, "review", error, doing)  # raises MissionNotFound
            refusal = ReviewRefused(
                str(closed) if closed is not None else one_line(f"mission {mission_id} cannot take a review: {error.message}")
            )
        if attempts > 1:
            # A repeat after a lost connection is refused when the first attempt landed and the
            # server no longer has its outcome (the mission closed): then the ledger holds this review.
            ledger = await self.show(mission_id)
            if ledger.review is not None and (ledger.review.operator, ledger.review.decision, ledger.review.reason) == (
                request.operator, request.decision, request.reason,
            ):
                return ledger
        raise refusal from None

    async def answer(self, mission_id: str, request: AnswerRequest) -> AnswerResult:
        """Answer a child's open question (`answer_child`); `AnswerRefused` with the mission's reasons,
        `NoOpenQuestion` when it asks nothing (any more). The update id is the same on every
        attempt, so a repeat after a lost connection gets the first outcome, not a second answer."""
        handle = self.handle(mission_id)
        update_id = f"answer-{uuid.uuid4()}"

        async def send() -> AnswerResult:
            return await handle.execute_update(ANSWER_CHILD, request, id=update_id, result_type=AnswerResult)

        doing = f"answering child {request.child_id} of mission {mission_id}"
        try:
            result = await self._reconnect.call(send, doing)
        except WorkflowUpdateFailedError as error:
            reason = one_line(getattr(error.cause, "message", None) or str(error.cause))
            kind = NoOpenQuestion if reason.startswith(f"child {request.child_id} has no open question") else AnswerRefused
            raise kind(f"mission {mission_id} refused the answer: {reason}") from None
        except RPCError as error:
            closed = await self._refusal(mission_id, "answer", error, doing)  # raises MissionNotFound
            if closed is None:
                raise
            raise closed from None
        if result.outcome == "refused-by-executor":
            raise AnswerRefused(f"the answer to child {request.child_id}'s question was not delivered: {result.detail}")
        return result

    async def stop(self, mission_id: str) -> None:
        """Ask the mission to stop its long-lived children and close. `MissionClosed` if it has closed
        already (stopping is idempotent in intent: callers may take that as done)."""
        await self._deliver(mission_id, "stop", lambda handle: handle.signal("stop"))

    async def stop_after_verdict(self, mission_id: str) -> MissionLedger:
        """`stop`, only once the verdict has settled (the ledger says so); `VerdictPending` before,
        `MissionClosed` if the mission has closed. Returns the ledger the decision was made on."""
        description = await self._describe(mission_id, f"checking mission {mission_id}")
        if description.status != WorkflowExecutionStatus.RUNNING:
            raise MissionClosed(mission_id, "stop", await self._closed_as(mission_id, description.status))
        ledger = await self.show(mission_id)
        if not is_final(ledger):
            raise VerdictPending(one_line(
                f"mission {mission_id} has no verdict yet ({ledger.parent_state}: {ledger.aggregation.reason}); "
                "stop ends long-lived children once the verdict has settled, and is refused before: to abandon "
                f"the mission, `conductor mission cancel {mission_id}`"
            ))
        await self.stop(mission_id)
        return ledger

    async def cancel(self, mission_id: str) -> None:
        """Cancel the mission: its children, runtime tasks and admission. `MissionClosed` if it has
        closed already: then it ended otherwise (see `closed_as`), and nothing was cancelled."""
        # The server takes a cancel request for a closed workflow as done and says nothing: look first.
        description = await self._describe(mission_id, f"checking mission {mission_id}")
        if description.status != WorkflowExecutionStatus.RUNNING:
            raise MissionClosed(mission_id, "cancel", await self._closed_as(mission_id, description.status))
        await self._deliver(mission_id, "cancel", lambda handle: handle.cancel())

    async def _deliver(self, mission_id: str, what: str, send: Callable[[WorkflowHandle], Awaitable[None]]) -> None:
        """Send a stop or cancel request, repeated after a lost connection (both are idempotent)."""
        handle = self.handle(mission_id)
        attempts = 0

        async def attempt() -> None:
            nonlocal attempts
            attempts += 1
            await send(handle)

        doing = f"sending the {what} request for mission {mission_id}"
        try:
            await self._reconnect.call(attempt, doing)
        except RPCError as error:
            if attempts == 1:
                refusal = await self._refusal(mission_id, what, error, doing)
                if refusal is None:
                    raise
                raise refusal from None
            # A repeat is refused when the first attempt landed and the mission has closed since: done.
            description = await self._describe(mission_id, f"checking mission {mission_id}")
            if description.status == WorkflowExecutionStatus.RUNNING:
                raise

    async def watch(
        self,
        mission_id: str,
        on_change: Callable[[MissionLedger], Awaitable[None] | None],
        *,
        interval: float = 0.5,
        until_closed: bool = False,
        on_verdict: Callable[[MissionLedger], Awaitable[None] | None] | None = None,
        on_closed: Callable[[str], Awaitable[None] | None] | None = None,
    ) -> MissionLedger:
        """Call `on_change` with each new ledger until the mission's verdict settles (through restarts:
        each read rides out a lost server). With `until_closed`, until its workflow closes instead
        (see `follow`; `on_closed` hears how, if it ended otherwise than by completing)."""
        if until_closed:
            ledger, closed_as = await self.follow(mission_id, on_change, on_verdict=on_verdict, interval=interval)
            if closed_as is not None and on_closed is not None:
                outcome = on_closed(closed_as)
                if outcome is not None:
                    await outcome
            return ledger
        last_seq = -1
        while True:
            ledger = await self.show(mission_id)
            if ledger.snapshot_seq != last_seq:
                last_seq = ledger.snapshot_seq
                outcome = on_change(ledger)
                if outcome is not None:
                    await outcome
            if is_final(ledger):
                return ledger
            await asyncio.sleep(interval)

    async def follow(
        self,
        mission_id: str,
        on_ledger: Callable[[MissionLedger], Awaitable[None] | None],
        *,
        on_verdict: Callable[[MissionLedger], Awaitable[None] | None] | None = None,
        interval: float = 0.5,
    ) -> tuple[MissionLedger, str | None]:
        """Follow a mission until its workflow closes (past the verdict: long-lived children are
        supervised until `stop`). `on_ledger` gets each new snapshot; `on_verdict` once, when the
        verdict has settled and the workflow still runs. Returns the final ledger (the workflow's
        result) and None, or, if the workflow ended otherwise (cancelled, terminated ...), the last
        ledger read and how it ended."""
        handle = self.handle(mission_id)
        last_seq = -1
        last: MissionLedger | None = None
        told_verdict = False

        async def call(callback, ledger: MissionLedger) -> None:
            outcome = callback(ledger)
            if outcome is not None:
                await outcome

        while True:
            description = await self._describe(mission_id, f"checking mission {mission_id}")
            if description.status != WorkflowExecutionStatus.RUNNING:
                break
            try:
                ledger = await self._ledger_of(mission_id, description, f"reading the ledger of mission {mission_id}")
            except MissionClosed:
                break
            if ledger.snapshot_seq != last_seq:
                last_seq, last = ledger.snapshot_seq, ledger
                await call(on_ledger, ledger)
            if is_final(ledger) and not told_verdict:
                told_verdict = True
                if on_verdict is not None:
                    await call(on_verdict, ledger)
            await asyncio.sleep(interval)
        description = await self._describe(mission_id, f"checking mission {mission_id}")
        if description.status == WorkflowExecutionStatus.COMPLETED:
            final = await self._reconnect.call(handle.result, f"reading the final ledger of mission {mission_id}")
            return final, None
        closed_as = await self._closed_as(mission_id, description.status)
        if last is None:
            try:
                last = await self.show(mission_id)
            except Exception:  # a mission that closed before it was ever read, and cannot be queried
                raise MissionClosed(mission_id, "watch", closed_as) from None
        return last, closed_as
