"""Temporal activities over the Agentic Sandbox fleet API and its A2A executor plane.

Built by the worker from its own configuration: base URLs from `worker.config` and the two
bearer tokens from `activities.credentials`. Nothing a workflow passes in names a URL or a
token, so neither can reach a history.

Error mapping (the `type` of every `ApplicationError` is the server's error code):

| client error                                                     | activity error                          |
|------------------------------------------------------------------|-----------------------------------------|
| `FleetRejected`, `Unauthorized`, `IdentityImmutable`, `NotFound`, `ProtocolViolation` | `ApplicationError(non_retryable=True)` |
| `SubstrateUnavailable` (5xx, 408, 429, timeouts, refused)        | `ApplicationError` (retryable)          |
| `StaleRevision` from `observe_workload`                          | no error: `Observed(applied=False, record=<current>)` |
| `TaskNotCancelable` from `cancel_task`                           | no error: the task as it ended          |

Binding: the executor never touches a workload record (the real server's `messages:send` does
not), so `dispatch_and_read` binds the task it got to the record with an observation (the
runtime identity: task id, and a persistent agent's session), as the real server requires of its
orchestrator. It is idempotent across retries: a retry sends the same `messageId` again, gets
the same task back, and binds it unless the record already names it; a 409 stale revision is
answered by reading the record again, and a binding that already landed is recognised there.

Output: a task's text is what it wrote to stdout, read from the executor's artifacts route
(`GET .../tasks/{tid}/artifacts`, the real server's only place for it) and cut to the caller's
`max_output_chars`.

Every message leaving here is scrubbed of the token values, whatever produced it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.agentic_sandbox_api import RuntimeIdentity, Task, TaskArtifacts
from activities.credentials import (
    EXECUTOR_TOKEN_ENV,
    FLEET_TOKEN_ENV,
    BearerToken,
    MissingCredential,
    as_token,
    executor_token,
    fleet_token,
)
from activities.sandbox_client import (
    AnswerInvalid,
    ExecutorClient,
    FleetClient,
    IdentityImmutable,
    NotFound,
    PromptClosed,
    ProtocolViolation,
    SandboxError,
    StaleRevision,
    SubstrateUnavailable,
    TaskNotCancelable,
    TaskNotFound,
    Unauthorized,
)
from workflows.contract import WorkloadRecord
from workflows.workload.messages import (
    ADMIT_AND_DISPATCH,
    ADMIT_WORKLOAD,
    ANSWER_QUESTION,
    CANCEL_TASK,
    DEFAULT_OUTPUT_CHARS,
    DISPATCH_AND_READ,
    DISPATCH_TASK,
    READ_OUTPUT,
    GET_WORKLOAD,
    LIST_TARGETS,
    OBSERVE_WORKLOAD,
    PROJECT_TASK,
    READ_QUESTION,
    RUN_VERIFIER,
    VERIFIER_GRACE_SECONDS,
    WATCH_WORKLOAD,
    AdmitAndDispatch,
    Admitted,
    AdmittedAndDispatched,
    AdmitWorkload,
    AnswerDelivered,
    AskedQuestion,
    DispatchAndRead,
    Dispatched,
    DispatchTask,
    KeptRecord,
    Observed,
    ObserveWorkload,
    QuestionAnswer,
    Refusal,
    RuntimeIdentityUpdate,
    RunVerifier,
    TargetList,
    TaskDispatch,
    TaskOutput,
    TaskRef,
    TaskView,
    VerifierRun,
    WatchWorkload,
    WorkloadRef,
)
from workflows.workload.kept import TaskReading, observed, projected
from workflows.workload.record import finished, next_status, output_version, waits_for_answer

R = TypeVar("R")
log = logging.getLogger(__name__)

MISSING_CREDENTIALS = "credentials.missing"
STORE_UNAVAILABLE = "fleet.store_unavailable"
# How long a fleet API found is trusted before it is probed again (an executor may restart as
# another build); an unexpected 404 on a fleet route probes at once.
FLEET_PROBE_TTL_SECONDS = 60.0
# How long `503 fleet.store_unavailable` may last before the executor counts as fleet-less.
STORE_UNAVAILABLE_GRACE_SECONDS = 10.0
PROBE_CHILD_ID = "conductor-fleet-probe"
TASK_REJECTED = "executor.task_rejected"
FIRST_POLL_SECONDS = 0.05
MAX_BIND_ATTEMPTS = 10


def cut_output(output: str | None, max_output_chars: int) -> TaskOutput:
    truncated = output is not None and len(output) > max_output_chars
    return TaskOutput(output=output[:max_output_chars] if output is not None else None, output_truncated=truncated)


def task_view(
    instance_id: str, task: Task, max_output_chars: int, artifacts: TaskArtifacts | None = None
) -> TaskView:
    """The workflow's view of an A2A task: `output` is what it wrote to stdout (its artifacts),
    else the text of a `result` artifact carried in the task itself."""
    output = artifacts.output("stdout") if artifacts is not None else None
    if output is None:
        output = task.artifact_text("result")
    cut = cut_output(output, max_output_chars)
    return TaskView(
        instance_id=instance_id,
        task_id=task.id,
        context_id=task.context_id,
        state=task.status.state,
        status_text=task.status_text(),
        artifact_names=[a.name or a.artifact_id for a in task.artifacts or ()],
        output=cut.output,
        output_truncated=cut.output_truncated,
    )


V = TypeVar("V")


async def poll(
    value: V, read: Callable[[], Awaitable[V]], done: Callable[[V], bool], *, within: float, longest_pause: float,
    beat: Callable[[V], object] | None = None,
) -> V:
    """Read again until `done(value)` or `within` seconds have passed, never sleeping past that.

    The first pause is FIRST_POLL_SECONDS, doubling to `longest_pause`: a change usually follows
    soon after the last one (a short command ends moments after it started), and a long wait
    should not cost more polls. `beat` runs before every pause: an activity heartbeats there, so
    a dead worker is noticed and a cancellation from the workflow is delivered (as
    `CancelledError` at the next await).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    pause = min(FIRST_POLL_SECONDS, longest_pause)
    while not done(value) and loop.time() < deadline:
        if beat is not None:
            beat(value)
        await asyncio.sleep(min(pause, max(0.0, deadline - loop.time())))
        pause = min(pause * 2, longest_pause)
        value = await read()
    return value


class FleetActivities:
    """One fleet client (management token) and one executor client (executor token) per worker."""

    def __init__(
        self,
        fleet_url: str,
        executor_url: str,
        fleet_token: BearerToken | str | None,
        executor_token: BearerToken | str | None,
        *,
        http_timeout: float = 10.0,
        missing_credentials: str | None = None,
        transport: Any = None,
        store_unavailable_grace: float = STORE_UNAVAILABLE_GRACE_SECONDS,
    ) -> None:
        self._fleet_url = fleet_url.rstrip("/")
        self._executor_url = executor_url.rstrip("/")
        self._missing = missing_credentials
        self._secrets: tuple[str, ...] = ()
        self._fleet: FleetClient | None = None
        self._executor: ExecutorClient | None = None
        self._fleet_api: bool | None = None  # what the last probe found (None: not probed yet)
        self._probed_at = 0.0
        self._unavailable_since: float | None = None
        self._store_grace = store_unavailable_grace
        if fleet_token is not None and executor_token is not None:
            fleet_secret, executor_secret = as_token(fleet_token), as_token(executor_token)
            self._secrets = (fleet_secret.reveal(), executor_secret.reveal())
            # `transport`: an httpx transport for tests that stand in for a server which cannot run here.
            self._fleet = FleetClient(self._fleet_url, fleet_secret, timeout=http_timeout, transport=transport)
            self._executor = ExecutorClient(self._executor_url, executor_secret, timeout=http_timeout,
                                            transport=transport)  # fmt: skip
        elif self._missing is None:
            self._missing = f"the worker has no tokens for the substrate: set {FLEET_TOKEN_ENV} and {EXECUTOR_TOKEN_ENV}"

    @classmethod
    def from_environment(
        cls, fleet_url: str, executor_url: str, *, environ: Mapping[str, str] | None = None, **options: Any
    ) -> FleetActivities:
        """Tokens from the worker's environment / secret files, read once at worker start.

        A worker without them still starts (it also runs workflows that need no substrate);
        every fleet activity then fails, non-retryably, with the reason and how to fix it.
        """
        try:
            fleet = fleet_token(environ=environ)
            executor = executor_token(environ=environ)
        except MissingCredential as error:
            return cls(fleet_url, executor_url, None, None, missing_credentials=str(error), **options)
        return cls(fleet_url, executor_url, fleet, executor, **options)

    def __repr__(self) -> str:
        return f"FleetActivities(fleet={self._fleet_url!r}, executor={self._executor_url!r})"

    @property
    def configured(self) -> bool:
        return self._missing is None

    async def aclose(self) -> None:
        for client in (self._fleet, self._executor):
            if client is not None:
                await client.aclose()

    def activities(self) -> list[Callable[..., Any]]:
        """The activities workflows call, for `Worker(activities=...)`. `admit_workload`,
        `dispatch_task` and `dispatch_and_read` are the steps of `admit_and_dispatch`."""
        return [
            self.list_targets,
            self.get_workload,
            self.observe_workload,
            self.watch_workload,
            self.admit_and_dispatch,
            self.read_output,
            self.cancel_task,
            self.run_verifier,
            self.read_question,
            self.answer_question,
            self.project_task,
        ]

    # --- plumbing -------------------------------------------------------------------------

    def _clients(self) -> tuple[FleetClient, ExecutorClient]:
        if self._fleet is None or self._executor is None:
            raise ApplicationError(
                f"fleet activities are not configured: {self._missing}", type=MISSING_CREDENTIALS, non_retryable=True
            )
        return self._fleet, self._executor

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "****")
        return text

    def _application_error(self, operation: str, error: SandboxError) -> ApplicationError:
        """A message a person can act on, typed with the server's code; retryable only if a retry can help."""
        where = self._executor_url if operation in _EXECUTOR_OPERATIONS else self._fleet_url
        if isinstance(error, Unauthorized):
            env = EXECUTOR_TOKEN_ENV if operation in _EXECUTOR_OPERATIONS else FLEET_TOKEN_ENV
            plane = "executor (A2A)" if operation in _EXECUTOR_OPERATIONS else "management (fleet)"
            text = (
                f"{operation}: {where} refused the worker's {plane} token ({error.message}); set {env} "
                f"(or {env}_FILE) on the worker to the token this substrate expects and restart the worker"
            )
        elif isinstance(error, NotFound):
            text = f"{operation}: {error.message} at {where}; check the id and that the worker points at the right substrate"
        elif isinstance(error, IdentityImmutable):
            text = (
                f"{operation}: {error.message}; the workload is already bound to another runtime identity "
                "and must not be rebound: re-read the record and adopt its identity"
            )
        elif isinstance(error, ProtocolViolation):
            text = (
                f"{operation}: {where} answered with a response that breaks the contract ({error.message}); "
                "check that the URL points at an Agentic Sandbox speaking Fleet Workload v1"
            )
        elif isinstance(error, SubstrateUnavailable):
            text = f"{operation}: the substrate at {where} is unavailable ({error.message}); retrying"
        else:
            text = f"{operation} was refused by {where}: {error.message}"
        details: dict[str, Any] = {"status": error.status}
        if isinstance(error, StaleRevision):
            details["current_revision"] = error.current_revision
        return ApplicationError(
            self._scrub(text),
            details,
            type=error.code,
            non_retryable=not error.retryable,
        )

    async def _call(self, operation: str, call: Callable[[], Awaitable[R]]) -> R:
        try:
            return await call()
        except SandboxError as error:
            if isinstance(error, NotFound) and error.code.startswith("http.") and operation not in _EXECUTOR_OPERATIONS:
                self.forget_fleet_api()  # a fleet route that is not there: the executor may have changed; probe again
            raise self._application_error(operation, error) from None
        except (ApplicationError, asyncio.CancelledError):
            raise
        except Exception as error:
            text = self._scrub(f"{type(error).__name__}: {error}")
            raise ApplicationError(f"{operation} failed unexpectedly: {text}", type="fleet.internal") from None

    # --- which kind of executor ----------------------------------------------------------

    async def fleet_api(self) -> bool:
        """Whether the executor serves the fleet API: probed (a read of a record nobody has),
        and probed again after FLEET_PROBE_TTL_SECONDS or an unexpected 404 (`forget_fleet_api`).
        404 without the fleet's own code: no fleet router, fleet-less. 503 `fleet.store_unavailable`:
        retryable until it has lasted STORE_UNAVAILABLE_GRACE_SECONDS, then fleet-less."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._fleet_api is not None and now - self._probed_at < FLEET_PROBE_TTL_SECONDS:
            return self._fleet_api
        fleet, _ = self._clients()
        try:
            await fleet.get(PROBE_CHILD_ID)
            found = True
        except NotFound as error:
            found = error.code == "fleet.workload_not_found"
        except SubstrateUnavailable as error:
            if error.code != STORE_UNAVAILABLE:
                raise self._application_error("probing the fleet API", error) from None
            self._unavailable_since = self._unavailable_since or now
            if now - self._unavailable_since < self._store_grace:
                raise self._application_error("probing the fleet API", error) from None
            found = False
        except SandboxError as error:
            raise self._application_error("probing the fleet API", error) from None
        else:
            self._unavailable_since = None
        if found != self._fleet_api:
            kind = "serves the fleet API" if found else "has no fleet API: one-shot commands and persistent agents only, records kept by the conductor"
            log.warning("executor at %s %s", self._fleet_url, kind)
        self._fleet_api, self._probed_at = found, now
        return found

    def forget_fleet_api(self) -> None:
        self._fleet_api = None

    # --- management plane -----------------------------------------------------------------

    @activity.defn(name=LIST_TARGETS)
    async def list_targets(self) -> TargetList:
        fleet, _ = self._clients()
        fleet_api = await self.fleet_api()
        instances = await self._call(LIST_TARGETS, fleet.instances)
        return TargetList(targets=[target.model_copy(update={"fleet_api": fleet_api}) for target in instances])

    @activity.defn(name=ADMIT_WORKLOAD)
    async def admit_workload(self, request: AdmitWorkload) -> Admitted:
        fleet, _ = self._clients()
        response = await self._call(ADMIT_WORKLOAD, lambda: fleet.admit(request.record))
        return Admitted(replayed=response.replayed, record=response.workload)

    @activity.defn(name=GET_WORKLOAD)
    async def get_workload(self, request: WorkloadRef) -> WorkloadRecord:
        fleet, _ = self._clients()
        return await self._call(GET_WORKLOAD, lambda: fleet.get(request.child_id))

    @activity.defn(name=OBSERVE_WORKLOAD)
    async def observe_workload(self, request: ObserveWorkload) -> Observed:
        """Compare-and-swap; a lost race returns the current record for the caller to reduce against."""
        fleet, _ = self._clients()
        identity = None
        if request.runtime_identity is not None:
            identity = RuntimeIdentity.model_validate(request.runtime_identity.model_dump())

        async def observe() -> Observed:
            try:
                record = await fleet.observe(request.child_id, request.expected_revision, request.status, identity)
            except StaleRevision:
                return Observed(applied=False, record=await fleet.get(request.child_id))
            return Observed(applied=True, record=record)

        return await self._call(OBSERVE_WORKLOAD, observe)

    @activity.defn(name=WATCH_WORKLOAD)
    async def watch_workload(self, request: WatchWorkload) -> WorkloadRecord:
        """Poll (`poll`, backing off to the request's interval, heartbeating) until the record's
        revision passes `after_revision` or `max_wait_seconds` pass."""
        fleet, _ = self._clients()
        kept, instance = request.kept, request.instance_id

        async def read() -> WorkloadRecord:
            if kept is not None and instance is not None:  # a fleet-less executor: the conductor's record
                return await self._project(instance, kept)
            return await self._call(WATCH_WORKLOAD, lambda: fleet.get(request.child_id))

        return await poll(
            await read(), read, lambda record: record.status.revision > request.after_revision,
            within=request.max_wait_seconds, longest_pause=request.poll_interval_seconds,
            beat=lambda record: activity.heartbeat(record.status.revision),
        )

    # --- executor plane -------------------------------------------------------------------

    @activity.defn(name=DISPATCH_TASK)
    async def dispatch_task(self, request: DispatchTask) -> TaskView:
        """A2A `messages:send` with `messageId` = the dispatch id: sending it again finds the same task."""
        _, executor = self._clients()
        dispatch = request.dispatch
        task = await self._call(DISPATCH_TASK, lambda: executor.send_message(request.instance_id, dispatch))
        return task_view(request.instance_id, task, DEFAULT_OUTPUT_CHARS)

    @activity.defn(name=DISPATCH_AND_READ)
    async def dispatch_and_read(self, request: DispatchAndRead) -> Dispatched:
        """Dispatch, bind the task to the record, then read back what the workflow needs next, in
        one call: the bound record and, if a short task has already ended, its text.

        With `wait_for_end_seconds`, the record is read again (backing off from FIRST_POLL_SECONDS)
        until the task ends or that time is up: a one-shot command that takes a moment then ends
        inside this call, instead of costing the workflow a watch activity and two more tasks.
        """
        return await self._dispatch_and_read(request)

    async def _dispatch_and_read(self, request: DispatchAndRead, admitted: WorkloadRecord | None = None) -> Dispatched:
        """`dispatch_and_read`; `admitted` is the record as admission just answered it, which the
        send does not change (the executor never writes a record): the binding can start from it."""
        fleet, _ = self._clients()
        task = await self.dispatch_task(request.dispatch)
        if task.state == "rejected":
            # Read back all the same: another dispatch may have bound the record meanwhile.
            return Dispatched(task=task, record=await self._call(GET_WORKLOAD, lambda: fleet.get(request.child_id)))
        await self._call(OBSERVE_WORKLOAD, lambda: self._bind(request.child_id, task, admitted))
        # Read it back: the read projects the task's state into the bound record.
        async def read() -> WorkloadRecord:
            return await self._call(GET_WORKLOAD, lambda: fleet.get(request.child_id))

        wait = request.wait_for_end_seconds
        record = await poll(await read(), read, settled_for_now, within=wait, longest_pause=wait)
        if output_version(record) is None:
            return Dispatched(task=task, record=record)
        ended = await self.read_output(
            TaskRef(instance_id=request.dispatch.instance_id, task_id=task.task_id, max_output_chars=request.max_output_chars)
        )
        return Dispatched(task=task, record=record, output=ended)

    async def _bind(self, child_id: str, task: TaskView, known: WorkloadRecord | None = None) -> WorkloadRecord:
        """Bind `task` (and a persistent agent's session) to the record with a compare-and-swap
        observation, as the real server wants of its orchestrator; the record as it then is.

        Starts from `known` when given (a stale one costs a 409 and a read, as any race does),
        else reads the record. Nothing is written when the record already names this task (a
        retry whose binding landed), names another one (the workflow decides about that), or has
        ended."""
        fleet, _ = self._clients()
        record = known if known is not None else await fleet.get(child_id)
        for _ in range(MAX_BIND_ATTEMPTS):
            if record.lineage.task_id is not None or finished(record):
                return record
            binds_session = record.kind == "persistent-agent" and record.lineage.session_id is None
            identity = RuntimeIdentity(task_id=task.task_id, session_id=task.context_id if binds_session else None)
            state = record.status.observed_state
            status = next_status(
                record, datetime.now(UTC), observed_state="starting" if state in ("pending", "admitted") else state
            )
            try:
                return await fleet.observe(child_id, record.status.revision, status, identity)
            except (StaleRevision, IdentityImmutable):
                record = await fleet.get(child_id)  # moved on meanwhile, perhaps by this very binding
        return record

    @activity.defn(name=ADMIT_AND_DISPATCH)
    async def admit_and_dispatch(self, request: AdmitAndDispatch) -> AdmittedAndDispatched:
        """How nearly every workload starts, as one call: admit, then dispatch and read back.

        A record that already names a task is re-adopted, never dispatched again; a retry admits
        again (an identical replay answers with the current record) and so finds the task a lost
        answer had dispatched. A dispatch refused for good, or a task the executor rejected,
        comes back as a refusal, for the workflow to write onto the admitted record; an
        admission refused for good fails the call.
        """
        if request.fleetless:
            return await self._dispatch_kept(request)
        admitted = await self.admit_workload(AdmitWorkload(record=request.record))
        as_admitted = AdmittedAndDispatched(replayed=admitted.replayed, record=admitted.record)
        if admitted.record.lineage.task_id is not None or finished(admitted.record):
            return as_admitted
        try:
            dispatched = await self._dispatch_and_read(request.dispatch, admitted.record)
        except ApplicationError as error:
            if not error.non_retryable:
                raise
            return as_admitted.model_copy(update={"dispatch_refused": Refusal(type=error.type, message=error.message)})
        if dispatched.task.state == "rejected" and dispatched.record.lineage.task_id is None:
            # The record could not start a task (it ended, or an operator stopped it, meanwhile).
            # Bound to another task instead, it goes back as dispatched, for the workflow to adopt.
            reason = dispatched.task.status_text or "the executor rejected the task"
            return as_admitted.model_copy(update={"dispatch_refused": Refusal(type=TASK_REJECTED, message=reason)})
        return AdmittedAndDispatched(
            replayed=admitted.replayed, record=dispatched.record, task=dispatched.task, output=dispatched.output,
        )

    # --- records the conductor keeps (an executor without the fleet API) --------------------

    async def _dispatch_kept(self, request: AdmitAndDispatch) -> AdmittedAndDispatched:
        """`admit_and_dispatch` on a fleet-less executor: `request.record` is the conductor's,
        admitted. A record that names a task is re-read, never dispatched again; otherwise the
        message goes (idempotent by messageId: a retry finds the same task), the task is bound
        and projected into the record (workflows.workload.kept), read on as on a fleet executor.
        A 404 (no such instance) is a placement failure; a 503 stays retryable (the caller shows
        capacity backpressure while it lasts)."""
        record = request.record
        instance = request.dispatch.dispatch.instance_id
        if record.lineage.task_id is not None:
            return AdmittedAndDispatched(replayed=True, record=await self._project(instance, record))
        try:
            task = await self.dispatch_task(request.dispatch.dispatch)
        except ApplicationError as error:
            if not error.non_retryable:
                raise
            return AdmittedAndDispatched(replayed=False, record=record,
                                         dispatch_refused=Refusal(type=error.type, message=error.message))  # fmt: skip
        if task.state == "rejected":
            reason = task.status_text or "the executor rejected the task"
            return AdmittedAndDispatched(replayed=False, record=record, dispatch_refused=Refusal(type=TASK_REJECTED, message=reason))
        binds_session = record.kind == "persistent-agent"
        identity = RuntimeIdentityUpdate(task_id=task.task_id, session_id=task.context_id if binds_session else None)
        bound = observed(record, next_status(record, datetime.now(UTC), observed_state="starting"), identity)

        async def read() -> WorkloadRecord:
            return await self._project(instance, bound)

        wait = request.dispatch.wait_for_end_seconds
        current = await poll(await read(), read, settled_for_now, within=wait, longest_pause=wait)
        output = None
        if output_version(current) is not None:
            output = await self.read_output(TaskRef(instance_id=instance, task_id=task.task_id,
                                                    max_output_chars=request.dispatch.max_output_chars))  # fmt: skip
        return AdmittedAndDispatched(replayed=False, record=current, task=task, output=output)

    async def _reading(self, instance_id: str, task_id: str) -> TaskReading:
        """What the executor says of the task, for `kept.projected`; a task it does not know is lost."""
        _, executor = self._clients()
        try:
            task = await executor.get_task(instance_id, task_id)
        except TaskNotFound:
            return TaskReading(task_id=task_id, state="lost", updated_at=datetime.now(UTC))
        try:
            rows = (await executor.artifacts(instance_id, task_id)).artifacts
        except NotFound:  # an executor without the artifacts route
            rows = []
        status = task.status.model_dump(mode="json", by_alias=True, exclude_none=True)
        updated = _when(task.status.timestamp) or datetime.now(UTC)
        artifacts = tuple((row.artifact_id, _sha256(row.artifact), _when(row.created_at) or updated) for row in rows)
        command = next((row.artifact.get("command_id") for row in rows if isinstance(row.artifact.get("command_id"), str)), None)
        return TaskReading(
            task_id=task_id, state=task.status.state, updated_at=updated, artifacts=artifacts,
            status_sha256=_sha256(status) if task.status.state == "completed" else None, command_id=command,
        )

    async def _project(self, instance_id: str, record: WorkloadRecord) -> WorkloadRecord:
        task_id = record.lineage.task_id
        if task_id is None:
            return record
        reading = await self._call(PROJECT_TASK, lambda: self._reading(instance_id, task_id))
        return projected(record, reading) or record

    @activity.defn(name=PROJECT_TASK)
    async def project_task(self, request: KeptRecord) -> WorkloadRecord:
        """A kept record with its bound task's state projected into it (unchanged if nothing moved)."""
        return await self._project(request.instance_id, request.record)

    @activity.defn(name=READ_OUTPUT)
    async def read_output(self, request: TaskRef) -> TaskOutput:
        """What the task wrote to stdout, from the artifacts route alone (the real server's only
        place for it): the record already said how the task stands, so the task is not read too."""
        _, executor = self._clients()

        async def read() -> str | None:
            try:
                return (await executor.artifacts(request.instance_id, request.task_id)).output("stdout")
            except NotFound:  # an executor without the artifacts route: the task's own artifacts
                return (await executor.get_task(request.instance_id, request.task_id)).artifact_text("result")

        return cut_output(await self._call(READ_OUTPUT, read), request.max_output_chars)

    @activity.defn(name=CANCEL_TASK)
    async def cancel_task(self, request: TaskRef) -> TaskView:
        """Cancel; a task that already ended is returned as it ended (there is nothing left to stop)."""
        _, executor = self._clients()

        async def cancel() -> Task:
            try:
                return await executor.cancel_task(request.instance_id, request.task_id)
            except TaskNotCancelable:
                return await executor.get_task(request.instance_id, request.task_id)

        task = await self._call(CANCEL_TASK, cancel)
        return task_view(request.instance_id, task, request.max_output_chars)


    @activity.defn(name=READ_QUESTION)
    async def read_question(self, request: TaskRef) -> AskedQuestion:
        """The question a task waits on (its hitl-prompt/v1 envelope), read from the task itself:
        the fleet record only says `blocked` with backpressure `approval` (fleet.rs)."""
        _, executor = self._clients()
        task = await self._call(READ_QUESTION, lambda: executor.get_task(request.instance_id, request.task_id))
        waiting = task.status.state == "input-required"
        return AskedQuestion(state=task.status.state, envelope=task.prompt_envelope() if waiting else None)

    @activity.defn(name=ANSWER_QUESTION)
    async def answer_question(self, request: QuestionAnswer) -> AnswerDelivered:
        """Forward an operator's answer; exactly once in effect. A retry (after a lost response or
        a crash) sends it again, and the executor's 409 for a prompt already answered counts as
        delivered: the real executor checks the prompt before its idempotency cache, so the same
        messageId does not find the first answer (send_message.rs). A 422 leaves the question open."""
        _, executor = self._clients()

        async def answer() -> AnswerDelivered:
            try:
                task = await executor.answer_prompt(
                    request.instance_id, request.task_id, request.message_id, request.prompt_id, request.payload,
                )
            except PromptClosed as closed:
                return AnswerDelivered(delivered=True, detail=f"the executor says the prompt is already answered ({closed.message})")
            except AnswerInvalid as invalid:
                return AnswerDelivered(delivered=False, detail=f"the executor refused the payload: {invalid.message}")
            return AnswerDelivered(delivered=True, task_state=task.status.state, detail=f"delivered; the task is {task.status.state}")

        return await self._call(ANSWER_QUESTION, answer)

    @activity.defn(name=RUN_VERIFIER)
    async def run_verifier(self, request: RunVerifier) -> VerifierRun:
        """Send the verifier as a command for no record, in the child's context, and wait for it.

        The real server runs any message it is sent and produces only `log` and `result`
        evidence, so the conductor runs a child's verifier itself: a task of its own on the
        child's instance, in the context the child's task ran in (same machine, same files). The
        same `messageId` on every retry finds the same task, so a verifier never runs twice.
        Heartbeats while it runs; past its time budget (plus a grace for the executor to end it
        itself) it is cancelled and does not pass.
        """
        _, executor = self._clients()
        dispatch = TaskDispatch(
            message_id=request.message_id,
            kind="one-shot-command",
            prompt=request.command,
            timeout_seconds=request.timeout_seconds,
            context_id=request.context_id,
        )
        task = await self._call(RUN_VERIFIER, lambda: executor.send_message(request.instance_id, dispatch))
        running = TaskRef(instance_id=request.instance_id, task_id=task.id, max_output_chars=0)

        async def read() -> Task:
            return await self._call(RUN_VERIFIER, lambda: executor.get_task(request.instance_id, running.task_id))

        try:
            task = await poll(
                task, read, lambda task: task.terminal,
                within=request.timeout_seconds + VERIFIER_GRACE_SECONDS, longest_pause=request.poll_interval_seconds,
                beat=lambda task: activity.heartbeat(task.status.state),
            )
        except asyncio.CancelledError:  # the workload was cancelled: nothing of it may run on
            await asyncio.shield(self.cancel_task(running))
            raise
        overdue = not task.terminal
        if overdue:
            await self.cancel_task(running)
            task = await read()
        status = task.status.model_dump(mode="json", by_alias=True, exclude_none=True)
        text = task.status_text()
        if overdue:
            text = f"still running after its {request.timeout_seconds} s time budget; cancelled"
        return VerifierRun(
            task_id=task.id,
            state=task.status.state,
            passed=task.status.state == "completed",
            status_text=self._scrub(text) if text else None,
            status_sha256=hashlib.sha256(json.dumps(status, sort_keys=True, separators=(",", ":")).encode()).hexdigest(),
        )


def settled_for_now(record: WorkloadRecord) -> bool:
    """Where reading on after a dispatch stops: the task ended, or it asks a person (the question
    must reach an operator now, not after the rest of the wait)."""
    return finished(record) or waits_for_answer(record)


def _sha256(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()).hexdigest()


def _when(text: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None
    except ValueError:
        return None


_EXECUTOR_OPERATIONS = frozenset({PROJECT_TASK, DISPATCH_TASK, READ_OUTPUT, CANCEL_TASK, RUN_VERIFIER, READ_QUESTION, ANSWER_QUESTION})
