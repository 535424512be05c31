"""MissionControl: the Python client for missions (the `conductor mission` CLI is a thin layer on it)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

from pydantic import ValidationError
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from worker.connection import Reconnect
from worker.inputs import one_line
from workflows.contract import json_path
from workflows.mission.aggregation import is_final
from workflows.mission.ledger import MissionLedger
from workflows.mission.messages import MISSION_WORKFLOW, MissionInput, ReviewRequest, mission_workflow_id
from workflows.mission.search import MISSION_AGGREGATION, MISSION_HOST_GROUP, MISSION_ORCHESTRATOR, MISSION_STATE
from workflows.mission.spec import MissionSpec


MAX_PROBLEMS_SHOWN = 10


class MissionSpecError(ValueError):
    """A spec that cannot start a mission; `problems` lists every one of them. The message is
    one line (the first MAX_PROBLEMS_SHOWN of them), so that a terminal or a log shows it whole."""

    def __init__(self, problems: list[str], source: str | None = None) -> None:
        shown = "; ".join(problems[:MAX_PROBLEMS_SHOWN])
        if len(problems) > MAX_PROBLEMS_SHOWN:
            shown += f"; and {len(problems) - MAX_PROBLEMS_SHOWN} more"
        super().__init__(one_line(f"invalid mission spec{f' {source}' if source else ''}: {shown}"))
        self.problems = problems


class ReviewRefused(RuntimeError):
    pass


class MissionIdUsed(ValueError):
    """A mission id that a mission already ran under: its ledger, fleet records and admission
    requests all carry that id, so a second mission under it would be mistaken for the first."""


def parse_spec(data: object, source: str | None = None) -> MissionSpec:
    """Validate a spec completely, before anything starts; every problem is listed (`source`,
    e.g. the file it came from, names it in the message). The limits a spec is held to are
    the model's own (workflows.mission.spec, workflows.limits), so every way in refuses the same."""
    try:
        return MissionSpec.model_validate(data)
    except ValidationError as error:
        problems = []
        for item in error.errors():
            where = json_path(item["loc"]).removeprefix("$").removeprefix(".")
            message = item["msg"].removeprefix("Value error, ")
            problems.append(f"{where}: {message}" if where else message)
        raise MissionSpecError(problems, source) from None


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
            description = await self._client.get_workflow_handle(workflow_id).describe()
            how = f"{description.status.name.lower() if description.status else 'unknown'}, started {description.start_time:%Y-%m-%d %H:%M:%S} UTC"
        except RPCError:
            how = "closed"
        return (
            f"mission {mission_id} was run before (workflow {workflow_id}, {how}); "
            "a mission id names one mission: give the spec a new mission_id"
        )

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
            description = await self._reconnect.call(handle.describe, doing)
            if description.status == WorkflowExecutionStatus.RUNNING:
                raise
            return await self.show(mission_id)

    async def run(self, spec: MissionSpec, **input_options: object) -> MissionLedger:
        await self.start(spec, **input_options)
        return await self.wait_for_verdict(spec.mission_id)

    async def show(self, mission_id: str) -> MissionLedger:
        handle = self.handle(mission_id)
        return await self._reconnect.call(
            lambda: handle.query("ledger", result_type=MissionLedger), f"reading the ledger of mission {mission_id}",
        )

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

        try:
            return await self._reconnect.call(send, f"sending the review of mission {mission_id}")
        except WorkflowUpdateFailedError as error:
            cause = error.cause
            refusal = ReviewRefused(getattr(cause, "message", None) or str(cause))
        except RPCError as error:
            refusal = ReviewRefused(f"mission {mission_id} cannot take a review: {error.message}")
        if attempts > 1:
            # A repeat after a lost connection is refused when the first attempt landed and the
            # server no longer has its outcome (the mission closed): then the ledger holds this review.
            ledger = await self.show(mission_id)
            if ledger.review is not None and (ledger.review.operator, ledger.review.decision, ledger.review.reason) == (
                request.operator, request.decision, request.reason,
            ):
                return ledger
        raise refusal from None

    async def stop(self, mission_id: str) -> None:
        await self._deliver(mission_id, "stop", lambda handle: handle.signal("stop"))

    async def cancel(self, mission_id: str) -> None:
        await self._deliver(mission_id, "cancel", lambda handle: handle.cancel())

    async def _deliver(self, mission_id: str, what: str, send: Callable[[WorkflowHandle], Awaitable[None]]) -> None:
        """Send a stop or cancel request, repeated after a lost connection (both are idempotent)."""
        handle = self.handle(mission_id)
        attempts = 0

        async def attempt() -> None:
            nonlocal attempts
            attempts += 1
            await send(handle)

        try:
            await self._reconnect.call(attempt, f"sending the {what} request for mission {mission_id}")
        except RPCError:
            # A repeat is refused when the first attempt landed and the mission has closed since: done.
            if attempts == 1:
                raise
            description = await self._reconnect.call(handle.describe, f"checking mission {mission_id}")
            if description.status == WorkflowExecutionStatus.RUNNING:
                raise

    async def watch(
        self,
        mission_id: str,
        on_change: Callable[[MissionLedger], Awaitable[None] | None],
        *,
        interval: float = 0.5,
    ) -> MissionLedger:
        """Call `on_change` with each new ledger until the mission's verdict settles (through restarts:
        each read rides out a lost server)."""
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
