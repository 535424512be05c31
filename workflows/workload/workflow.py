"""WorkloadWorkflow: one child workload from admission on the fleet to its last observation.

Steps: build the Fleet Workload v1 record from the input; admit it (an identical replay
returns the current record); dispatch the task through A2A unless the record already names
one (re-adopt: a restarted or repeated workflow never starts a second task); bind the task
with a compare-and-swap observation; then follow the record's revisions with one
heartbeating watch activity at a time, signalling every new revision to the parent
workflow (`OBSERVATION_SIGNAL`, a `ChildObservation`).

Lean runs (patch `LEAN`; older runs replay their old path), because a mission fans
out hundreds of these and every event, task and call counts:
- the short fleet and executor calls are local activities: one marker event each, and
  consecutive calls can complete inside one workflow task;
- the admitted record is not reported on its own (the bound one follows within moments),
  and the last observation of a workload that ends normally travels in its result, which
  the parent folds like a signalled one: a signal and a workflow task less on each side;
- the dispatch reads the record back in the same call: the executor binds the task itself
  when it accepts it, so the compare-and-swap write is only needed when it did not, and a
  short task that has already ended brings its result's text along.
- (patch `ONE_CALL_START`) admission and dispatch are one call, `admit_and_dispatch`, which
  dispatches only when the admitted record names no task yet: a quick one-shot command is
  one local activity and one workflow task from start to end.

It ends when the record is terminal (`succeeded`, `failed`, `cancelled`, `timed-out`) or
needs an operator (`unknown`, `operator-review-required`). Long-lived kinds (daemon,
persistent agent, scheduled collector) are followed past satisfaction, every change
reported, until they end or the workflow is cancelled; the history is kept short with
continue-as-new, carrying the record, the task and what was already reported.

Cancelled (lease lost, preempted, fail-fast, mission stopped): the task is cancelled on the
executor inside a shielded scope, the final record is reported, and the workflow ends
cancelled. Refusals no retry can fix (admission or dispatch refused) end the workload
`failed` with the server's code, reported like any other observation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from workflows.contract import ContractError, WorkloadRecord, WorkloadStatus
    from workflows.mission.observation import ALIVE_SIGNAL, OBSERVATION_SIGNAL, ChildObservation
    from workflows.workload.messages import (
        ADMIT_AND_DISPATCH,
        ADMIT_WORKLOAD,
        CANCEL_TASK,
        DISPATCH_AND_READ,
        DISPATCH_TASK,
        GET_TASK,
        GET_WORKLOAD,
        OBSERVE_WORKLOAD,
        WATCH_WORKLOAD,
        WORKLOAD_WORKFLOW,
        AdmitAndDispatch,
        Admitted,
        AdmittedAndDispatched,
        AdmitWorkload,
        DispatchAndRead,
        Dispatched,
        DispatchTask,
        Observed,
        ObserveWorkload,
        RuntimeIdentityUpdate,
        TaskRef,
        TaskView,
        WatchWorkload,
        WorkloadCarry,
        WorkloadInput,
        WorkloadRef,
        WorkloadResult,
    )
    from workflows.workload.record import (
        build_dispatch,
        fleet_child_id,
        build_record,
        finished,
        missing_evidence,
        next_status,
        observation_of,
        result_artifact_sha256,
        verdict,
    )

T = TypeVar("T")

CALL_TIMEOUT = timedelta(seconds=30)
CALL_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=2, maximum_interval=timedelta(seconds=30))
MAX_CAS_ATTEMPTS = 10
ONE_SHOT_WAIT_FOR_END = timedelta(seconds=1)
LEAN = "workload-lean"
ONE_CALL_START = "workload-admit-and-dispatch"

# A new status to write and the identity to bind with it; None: nothing to write any more.
Change = tuple[WorkloadStatus, RuntimeIdentityUpdate | None] | None


# How a failed call surfaces: a regular activity's as an ActivityError around the activity's
# own error, a local activity's as that error itself.
CALL_FAILED = (ActivityError, ApplicationError)


def _cause(error: BaseException) -> BaseException:
    return (error.cause or error) if isinstance(error, ActivityError) else error


def _refusal(error: BaseException) -> ApplicationError | None:
    """The non-retryable server refusal behind a failed call, if that is what it was."""
    cause = _cause(error)
    if isinstance(cause, ApplicationError) and cause.non_retryable:
        return cause
    return None


async def _shielded(work: Awaitable[None]) -> None:
    """Run `work` to its end even if cancellation is requested again meanwhile."""
    task = asyncio.ensure_future(work)
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                break
    task.result()


@workflow.defn(name=WORKLOAD_WORKFLOW)
class WorkloadWorkflow:
    @workflow.init
    def __init__(self, input: WorkloadInput) -> None:
        self._input = input
        self._child_id = input.child.child_id
        self._fleet_id = fleet_child_id(input.mission_id, input.child.child_id)
        carried = input.carried
        self._task_id: str | None = carried.task_id if carried else None
        self._reported = carried.reported_revision if carried else -1
        self._output: str | None = carried.output if carried else None
        self._output_sha256: str | None = carried.output_sha256 if carried else None
        self._note: str | None = None
        self._last: ChildObservation | None = None
        self._lean = False  # decided at the start of run(): patched() belongs to workflow code
        self._one_call_start = False
        self._mission_gone: str | None = None  # why the mission can no longer be signalled

    @workflow.query
    def observation(self) -> ChildObservation | None:
        """The last observation reported to the parent."""
        return self._last

    @workflow.run
    async def run(self, input: WorkloadInput) -> WorkloadResult:
        self._lean = workflow.patched(LEAN)
        self._one_call_start = self._lean and workflow.patched(ONE_CALL_START)
        record: WorkloadRecord | None = input.carried.record if input.carried else None
        try:
            if record is None:
                admitted = await self._admit()
                if isinstance(admitted, ChildObservation):
                    return WorkloadResult(child_id=self._child_id, verdict="failed", observation=admitted)
                record = await self._start(*admitted)
            record = await self._follow(record)
        except BaseException as error:
            if not is_cancelled_exception(error):
                raise
            await _shielded(self._stop())
            raise
        assert self._last is not None
        outcome = verdict(record)
        missing = missing_evidence(record, list(input.child.required_evidence))
        if outcome == "satisfied" and missing:
            outcome = "failed"  # missing required evidence fails closed
        return WorkloadResult(
            child_id=self._child_id,
            verdict=outcome,
            observation=self._last,
            task_id=record.lineage.task_id or self._task_id,
            missing_evidence=missing,
        )

    # --- admission and dispatch -----------------------------------------------------------

    async def _admit(self) -> tuple[WorkloadRecord, AdmittedAndDispatched | None] | ChildObservation:
        """Admit the record; a refusal is reported as a failed observation at revision 0.

        In runs patched with `ONE_CALL_START` the same call (`admit_and_dispatch`) dispatches too,
        and what it found goes on to `_start`: a local activity and a workflow activation less.
        """
        try:
            record = build_record(self._input, workflow.now())
        except ContractError as error:
            raise ApplicationError(
                f"cannot build a valid workload record for child {self._child_id!r}: {error}",
                type="workload.invalid_input",
                non_retryable=True,
            ) from None
        started: AdmittedAndDispatched | None = None
        try:
            if self._one_call_start:
                request = AdmitAndDispatch(record=record, dispatch=self._dispatch_and_read())
                started = await self._call(ADMIT_AND_DISPATCH, request, AdmittedAndDispatched)
                admitted = started.admitted
            else:
                admitted = await self._call(ADMIT_WORKLOAD, AdmitWorkload(record=record), Admitted)
        except CALL_FAILED as error:
            refusal = _refusal(error)
            if refusal is None:
                raise
            observation = ChildObservation(
                child_id=self._child_id,
                kind=record.kind,
                revision=0,
                observed_state="failed",
                observed_at=workflow.now(),
                lineage=record.lineage,
                exit_classification="failure",
                error_code=refusal.type or "fleet.rejected",
                note=f"admission refused: {refusal.message}",
            )
            await self._send(observation)
            return observation
        if admitted.replayed:
            workflow.logger.info("workload %s was admitted before (revision %d)", self._child_id, admitted.record.status.revision)
        return admitted.record, started

    def _dispatch(self) -> DispatchTask:
        return DispatchTask(instance_id=self._input.target_id, dispatch=build_dispatch(self._input))

    def _dispatch_and_read(self) -> DispatchAndRead:
        # A one-shot command often ends within moments: read on until it does (up to a second)
        # rather than follow it with a watch. Other kinds run on; their first state is news.
        wait = timedelta(0) if self._input.child.long_lived else ONE_SHOT_WAIT_FOR_END
        return DispatchAndRead(
            dispatch=self._dispatch(),
            child_id=self._fleet_id,
            max_output_chars=self._input.max_output_chars,
            wait_for_end_seconds=wait.total_seconds(),
        )

    async def _start(self, record: WorkloadRecord, started: AdmittedAndDispatched | None) -> WorkloadRecord:
        """Dispatch and bind the task, or re-adopt the one the record already names.

        `started` is what `admit_and_dispatch` already did (patch `ONE_CALL_START`), else None.
        """
        if not self._lean:
            await self._report(record)
        if record.lineage.task_id is not None:
            self._task_id = record.lineage.task_id
            workflow.logger.info("re-adopting task %s of %s: not dispatching again", self._task_id, self._child_id)
            return record
        if finished(record):
            return record
        if started is not None:
            dispatched, refusal = started.dispatched, started.dispatch_refused
        else:
            dispatched, refusal = await self._send_task()
        if refusal is not None:
            return await self._fail(record, refusal.type or "executor.rejected", f"dispatch refused: {refusal.message}")
        assert dispatched is not None  # admit_and_dispatch dispatches whenever the checks above pass
        task = dispatched.task
        if task.state == "rejected":
            current = await self._get()
            if current.lineage.task_id is not None:
                self._task_id = current.lineage.task_id
                return current
            reason = task.status_text or "the executor rejected the task"
            return await self._fail(current, "executor.task_rejected", f"dispatch rejected: {reason}")
        self._task_id = task.task_id
        if dispatched.record is not None:
            # Read right after the dispatch: usually bound by the executor already (nothing left to
            # write), and a short task may have ended too, its text read in the same call.
            record = dispatched.record
            if dispatched.output is not None:
                self._output, self._output_sha256 = dispatched.output.output, result_artifact_sha256(record)
        return await self._bind(record, task)

    async def _send_task(self) -> tuple[Dispatched | None, ApplicationError | None]:
        """Dispatch (reading back in the same call in lean runs); or the refusal no retry can fix."""
        try:
            if self._lean:
                return await self._call(DISPATCH_AND_READ, self._dispatch_and_read(), Dispatched), None
            return Dispatched(task=await self._call(DISPATCH_TASK, self._dispatch(), TaskView)), None
        except CALL_FAILED as error:
            refusal = _refusal(error)
            if refusal is None:
                raise
            return None, refusal

    async def _bind(self, record: WorkloadRecord, task: TaskView) -> WorkloadRecord:
        """Bind the task (and a persistent agent's session) to the record; the executor may have already."""

        def change(current: WorkloadRecord) -> Change:
            bound = current.lineage.task_id
            if bound == task.task_id:
                return None
            if bound is not None:
                raise ApplicationError(
                    f"workload {self._child_id!r} is bound to task {bound!r}, not to the dispatched task "
                    f"{task.task_id!r}; an operator must decide which one is real",
                    type="fleet.runtime_identity_immutable",
                    non_retryable=True,
                )
            binds_session = current.kind == "persistent-agent" and current.lineage.session_id is None
            identity = RuntimeIdentityUpdate(task_id=task.task_id, session_id=task.context_id if binds_session else None)
            state = current.status.observed_state
            return next_status(current, workflow.now(), observed_state="starting" if state in ("pending", "admitted") else state), identity

        return await self._compare_and_swap(record, change)

    async def _fail(self, record: WorkloadRecord, code: str, note: str) -> WorkloadRecord:
        """Record a refusal as `failed` on the workload (unless it ended or got bound meanwhile)."""

        def change(current: WorkloadRecord) -> Change:
            if finished(current) or current.lineage.task_id is not None:
                return None
            fields: dict[str, Any] = {"observed_state": "failed", "exit_classification": "failure", "error_code": code}
            if current.kind == "daemon":
                fields["health"] = "unhealthy"
            return next_status(current, workflow.now(), **fields), None

        workflow.logger.warning("workload %s: %s", self._child_id, note)
        record = await self._compare_and_swap(record, change)
        if record.lineage.task_id is not None:
            self._task_id = record.lineage.task_id
        else:
            self._note = note
        return record

    async def _compare_and_swap(self, record: WorkloadRecord, change: Callable[[WorkloadRecord], Change]) -> WorkloadRecord:
        """Write `change(record)`; on a stale revision reduce against the current record and try again."""
        for _ in range(MAX_CAS_ATTEMPTS):
            wanted = change(record)
            if wanted is None:
                return record
            status, identity = wanted
            observed = await self._call(
                OBSERVE_WORKLOAD,
                ObserveWorkload(
                    child_id=self._fleet_id,
                    expected_revision=record.status.revision,
                    status=status,
                    runtime_identity=identity,
                ),
                Observed,
            )
            record = observed.record
            if observed.applied:
                return record
        raise ApplicationError(
            f"workload {self._child_id!r} changed under every one of {MAX_CAS_ATTEMPTS} compare-and-swap attempts",
            type="workload.contention",
            non_retryable=True,
        )

    # --- following ------------------------------------------------------------------------

    async def _follow(self, record: WorkloadRecord) -> WorkloadRecord:
        by_signal = self._input.report_to_mission_by_signal
        while True:
            if by_signal and record.status.revision <= self._reported:
                await self._signal_parent(ALIVE_SIGNAL, self._child_id)  # a quiet watch: show we are here
            await self._report(record, in_result=self._lean and finished(record) and not by_signal)
            if self._mission_gone is not None:
                await _shielded(self._stop())
                raise ApplicationError(
                    f"workload {self._child_id!r} stopped its runtime task: its mission is gone ({self._mission_gone})",
                    type="workload.orphaned",
                    non_retryable=True,
                )
            if finished(record):
                return record
            if self._history_is_long():
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(self._carry(record))
            record = await self._watch(record.status.revision)

    async def _watch(self, after_revision: int) -> WorkloadRecord:
        input = self._input
        return await workflow.execute_activity(
            WATCH_WORKLOAD,
            WatchWorkload(
                child_id=self._fleet_id,
                after_revision=after_revision,
                poll_interval_seconds=input.poll_interval_seconds,
                max_wait_seconds=input.watch_max_seconds,
            ),
            result_type=WorkloadRecord,
            start_to_close_timeout=timedelta(seconds=input.watch_max_seconds) + CALL_TIMEOUT,
            heartbeat_timeout=timedelta(seconds=max(10.0, 5 * input.poll_interval_seconds)),
            retry_policy=CALL_RETRY,
            summary=f"watch {self._child_id} after revision {after_revision}",
        )

    def _history_is_long(self) -> bool:
        info = workflow.info()
        return info.is_continue_as_new_suggested() or info.get_current_history_length() >= self._input.max_history_events

    def _carry(self, record: WorkloadRecord) -> WorkloadInput:
        carry = WorkloadCarry(
            record=record,
            task_id=self._task_id,
            reported_revision=self._reported,
            output=self._output,
            output_sha256=self._output_sha256,
        )
        return self._input.model_copy(update={"carried": carry})

    async def _report(self, record: WorkloadRecord, *, in_result: bool = False) -> None:
        """Signal the parent once per new revision, with the result's text when there is one.
        `in_result`: this is the last observation and the workflow's result carries it; no signal."""
        if record.status.revision <= self._reported:
            return
        self._reported = record.status.revision
        task_id = record.lineage.task_id or self._task_id
        sha256 = result_artifact_sha256(record)
        if sha256 is not None and sha256 != self._output_sha256 and task_id is not None:
            ref = TaskRef(instance_id=self._input.target_id, task_id=task_id, max_output_chars=self._input.max_output_chars)
            view = await self._call(GET_TASK, ref, TaskView)
            self._output, self._output_sha256 = view.output, sha256
        note, self._note = self._note, None
        await self._send(observation_of(record, self._child_id, output=self._output, note=note), signal=not in_result)

    async def _send(self, observation: ChildObservation, *, signal: bool = True) -> None:
        self._last = observation
        workflow.set_current_details(
            f"{observation.kind} {observation.child_id} on {self._input.target_id}: "
            f"{observation.observed_state} (revision {observation.revision})"
        )
        if signal:
            await self._signal_parent(OBSERVATION_SIGNAL, observation)

    async def _signal_parent(self, name: str, payload: Any) -> None:
        parent = workflow.info().parent
        if parent is None:
            return
        try:
            await workflow.get_external_workflow_handle(parent.workflow_id).signal(name, payload)
        except Exception as error:  # a parent that is gone must not fail the workload
            if is_cancelled_exception(error):
                raise
            workflow.logger.warning("cannot signal parent %s: %s", parent.workflow_id, error)
            # A signal to a running workflow cannot fail: the parent has closed or was terminated.
            if self._input.report_to_mission_by_signal:
                self._mission_gone = f"signalling {parent.workflow_id} failed: {error}"

    # --- cancellation ---------------------------------------------------------------------

    async def _stop(self) -> None:
        """Cancel the runtime task and report how the workload ended (runs shielded)."""
        try:
            record = await self._get()
        except CALL_FAILED as error:
            workflow.logger.warning("cancelled before %s was admitted: %s", self._child_id, _cause(error))
            return
        try:
            task_id = record.lineage.task_id or self._task_id
            if task_id is None and not finished(record):
                record = await self._compare_and_swap(record, self._cancelled_change)
                task_id = record.lineage.task_id  # bound meanwhile: cancel that task
            if task_id is not None:
                self._task_id = task_id
                view = await self._call(CANCEL_TASK, TaskRef(instance_id=self._input.target_id, task_id=task_id, max_output_chars=0), TaskView)
                record = await self._get()
                if view.state == "canceled" and not finished(record):
                    record = await self._compare_and_swap(record, self._cancelled_change)
        except CALL_FAILED as error:
            workflow.logger.warning("cancelling %s on the executor failed: %s", self._child_id, _cause(error))
        await self._report(record)

    def _cancelled_change(self, current: WorkloadRecord) -> Change:
        if finished(current) or (current.lineage.task_id is not None and self._task_id is None):
            return None
        fields: dict[str, Any] = {"observed_state": "cancelled", "exit_classification": "cancelled", "error_code": "conductor.cancelled"}
        if current.kind == "daemon":
            fields["health"] = "unhealthy"
        return next_status(current, workflow.now(), **fields), None

    # --- activities -----------------------------------------------------------------------

    async def _get(self) -> WorkloadRecord:
        return await self._call(GET_WORKLOAD, WorkloadRef(child_id=self._fleet_id), WorkloadRecord)

    async def _call(self, activity: str, argument: Any, result_type: type[T]) -> T:
        """One short, idempotent fleet or executor call.

        A local activity in lean runs: it runs in this worker, its result is one marker event,
        and consecutive calls can finish inside one workflow task, where a regular activity
        costs three events, a task dispatch and a workflow task each. Retries and timeouts are
        the same; the long watch stays a regular, heartbeating activity.
        """
        call = workflow.execute_local_activity if self._lean else workflow.execute_activity
        return await call(
            activity,
            argument,
            result_type=result_type,
            start_to_close_timeout=CALL_TIMEOUT,
            retry_policy=CALL_RETRY,
            # A write that was in flight has landed (or not) before the workflow moves on.
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        )
