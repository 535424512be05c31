"""WorkloadWorkflow: one child workload from admission on the fleet to its last observation.

Steps: build the Fleet Workload v1 record from the input; admit it and dispatch its task in
one call (`admit_and_dispatch`: an identical replay returns the current record, and a record
that already names a task is re-adopted, so a restarted or repeated workflow never starts a
second task); bind the task with a compare-and-swap observation unless the executor already
did; then follow the record's revisions with one heartbeating watch activity at a time,
signalling every new revision to the parent workflow (`OBSERVATION_SIGNAL`, a
`ChildObservation`).

A mission fans out hundreds of these, so every event, task and call counts
(`docs/workflow-costs.md`):
- the short fleet and executor calls are local activities: one marker event each, and
  consecutive calls can complete inside one workflow task;
- the admitted record is not reported on its own (the bound one follows within moments),
  and the last observation of a workload that ends normally travels in its result, which
  the parent folds like a signalled one: a signal and a workflow task less on each side;
- the dispatch reads the record back in the same call, and a one-shot command is read on
  for up to a second, so a quick command is one local activity and one workflow task from
  start to end.

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
from datetime import datetime, timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception

from workflows.cancellation import raise_if_cancel_requested

with workflow.unsafe.imports_passed_through():
    from workflows.contract import Backpressure, ContractError, WorkloadRecord, WorkloadStatus
    from workflows.failures import refused_start
    from workflows.inbound import Refused, argument, no_argument
    from workflows.metrics import workload_dispatched
    from workflows.mission.search import WORKLOAD_STATE
    from workflows.workload.client import verdict_failure
    from workflows.mission.observation import ALIVE_SIGNAL, OBSERVATION_SIGNAL, ChildObservation
    from workflows.mission.questions import APPROVAL_TIMEOUT_CODE, Question, read_prompt
    from workflows.workload import kept
    from workflows.workload.messages import (
        ADMIT_AND_DISPATCH,
        CANCEL_TASK,
        GET_WORKLOAD,
        OBSERVE_WORKLOAD,
        PROJECT_TASK,
        READ_OUTPUT,
        READ_QUESTION,
        RUN_VERIFIER,
        VERIFIER_GRACE_SECONDS,
        WATCH_WORKLOAD,
        WORKLOAD_WORKFLOW,
        AdmitAndDispatch,
        AdmittedAndDispatched,
        AskedQuestion,
        DispatchAndRead,
        KeptRecord,
        DispatchTask,
        Observed,
        ObserveWorkload,
        RuntimeIdentityUpdate,
        TaskOutput,
        TaskRef,
        TaskView,
        VerifierRun,
        WatchWorkload,
        WorkloadCarry,
        WorkloadInput,
        WorkloadRef,
        WorkloadResult,
    )
    from workflows.workload.record import (
        build_dispatch,
        build_verifier_run,
        fleet_child_id,
        build_record,
        finished,
        missing_evidence,
        next_status,
        observation_of,
        output_version,
        verdict,
        verified_status,
        verifier_due,
        verifier_note,
        waits_for_answer,
    )

T = TypeVar("T")

CALL_TIMEOUT = timedelta(seconds=30)
CALL_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=2, maximum_interval=timedelta(seconds=30))
# A fleet-less executor's dispatch: a few quick tries, then the child shows capacity backpressure
# (retryable) while the executor stays unavailable, and tries again after a durable pause.
UNAVAILABLE_TRIES = RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=2, maximum_attempts=3)
UNAVAILABLE_PAUSES = (5, 10, 20, 40, 60)  # seconds, the last one repeated
MAX_CAS_ATTEMPTS = 10
SCHEMA_HINT = "WorkloadWorkflow is started by MissionWorkflow: start a mission instead (docs/mission-control-api.md)"
ONE_SHOT_WAIT_FOR_END = timedelta(seconds=1)
UNENDED_TASK_STATES = frozenset({"submitted", "working", "input-required", "auth-required", "unknown"})  # may still run

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
    def __init__(self, *args: Any) -> None:
        # Started by missions; a client that starts one itself with a bad input fails it at once.
        try:
            input = argument(args, WorkloadInput, "WorkloadWorkflow's input", hint=SCHEMA_HINT)
        except Refused as refused:
            raise refused_start(refused, WORKLOAD_WORKFLOW) from None
        self._input = input
        self._child_id = input.child.child_id
        self._fleet_id = fleet_child_id(input.mission_id, input.child.child_id, input.attempt)
        carried = input.carried
        self._task_id: str | None = carried.task_id if carried else None
        self._reported = carried.reported_revision if carried else -1
        self._output: str | None = carried.output if carried else None
        self._output_sha256: str | None = carried.output_sha256 if carried else None
        # A person's answer awaited: the question read from the task, and since when it waits.
        self._question: Question | None = carried.question if carried else None
        self._waiting_since: datetime | None = carried.waiting_since if carried else None
        self._note: str | None = None
        self._last: ChildObservation | None = None
        self._mission_gone: str | None = None  # why the mission can no longer be signalled
        # An executor without the fleet API: the record is the conductor's own (workflows.workload.kept).
        self._fleetless = input.fleetless
        self._kept: WorkloadRecord | None = carried.record if carried and input.fleetless else None

    @workflow.query(description="The last observation this workload reported to its mission.")
    def observation(self, *args: Any) -> ChildObservation | None:
        """The last observation reported to the parent."""
        no_argument(args, "the observation query")
        return self._last

    @workflow.run
    async def run(self, *args: Any) -> WorkloadResult:
        input = self._input
        record: WorkloadRecord | None = input.carried.record if input.carried else None
        try:
            if record is None:
                admitted = await self._admit()
                if isinstance(admitted, ChildObservation):
                    raise verdict_failure(WorkloadResult(child_id=self._child_id, verdict="failed", observation=admitted))
                record = await self._start(admitted)
                if self._task_id is not None:
                    workload_dispatched(workflow.metric_meter(), input.child.kind, workflow.info().start_time, workflow.now())
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
        result = WorkloadResult(
            child_id=self._child_id,
            verdict=outcome,
            observation=self._last,
            task_id=record.lineage.task_id or self._task_id,
            missing_evidence=missing,
        )
        if outcome in ("failed", "review-required"):
            raise verdict_failure(result)  # the workflow fails, so the Temporal UI tells the truth
        return result

    # --- admission and dispatch -----------------------------------------------------------

    async def _admit(self) -> AdmittedAndDispatched | ChildObservation:
        """Admit the record and dispatch in one call; a refused admission is reported as a
        failed observation at revision 0."""
        try:
            record = build_record(self._input, workflow.now())
        except ContractError as error:
            raise ApplicationError(
                f"cannot build a valid workload record for child {self._child_id!r}: {error}",
                type="workload.invalid_input",
                non_retryable=True,
            ) from None
        try:
            if self._fleetless:
                started = await self._dispatch_kept(kept.admitted(record))
            else:
                request = AdmitAndDispatch(record=record, dispatch=self._dispatch_and_read())
                started = await self._call(ADMIT_AND_DISPATCH, request, AdmittedAndDispatched)
        except CALL_FAILED as error:
            refusal = _refusal(error)
            if refusal is None:
                raise
            observation = ChildObservation(
                child_id=self._child_id,
                attempt=self._input.attempt,
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
        if started.replayed:
            revision = started.record.status.revision
            workflow.logger.info("workload %s was admitted before (revision %d)", self._child_id, revision)
        return started

    async def _dispatch_kept(self, record: WorkloadRecord) -> AdmittedAndDispatched:
        """Dispatch on a fleet-less executor, keeping the record here. While the executor is
        unavailable (503, unreachable), the child shows `blocked` with capacity backpressure
        (retryable) and the dispatch is tried again after a durable pause: the same messageId,
        so however often it is sent, one task runs."""
        self._kept = record
        pauses = iter(UNAVAILABLE_PAUSES)
        pause = UNAVAILABLE_PAUSES[0]
        while True:
            request = AdmitAndDispatch(record=self._kept, dispatch=self._dispatch_and_read(), fleetless=True)
            try:
                started = await self._call(ADMIT_AND_DISPATCH, request, AdmittedAndDispatched, retry=UNAVAILABLE_TRIES)
            except CALL_FAILED as error:
                if _refusal(error) is not None:
                    raise
                cause = _cause(error)
                code = (cause.type if isinstance(cause, ApplicationError) else None) or "executor.unavailable"
                if self._kept.status.observed_state != "blocked":
                    self._note = f"the executor is unavailable ({cause}); dispatching again"
                    status = next_status(self._kept, workflow.now(), observed_state="blocked", error_code=code,
                                         backpressure=Backpressure(reason="capacity", retryable=True))  # fmt: skip
                    self._kept = kept.observed(self._kept, status, None)
                    await self._report(self._kept)
                pause = next(pauses, pause)
                await workflow.sleep(pause, summary=f"executor unavailable: dispatch {self._child_id} again")
                continue
            self._kept = started.record
            return started

    def _dispatch_and_read(self) -> DispatchAndRead:
        # A one-shot command often ends within moments: read on until it does (up to a second)
        # rather than follow it with a watch. Other kinds run on; their first state is news.
        wait = timedelta(0) if self._input.child.long_lived else ONE_SHOT_WAIT_FOR_END
        return DispatchAndRead(
            dispatch=DispatchTask(instance_id=self._input.target_id, dispatch=build_dispatch(self._input)),
            child_id=self._fleet_id,
            max_output_chars=self._input.max_output_chars,
            wait_for_end_seconds=wait.total_seconds(),
        )

    async def _start(self, started: AdmittedAndDispatched) -> WorkloadRecord:
        """Bind the task `admit_and_dispatch` dispatched, or re-adopt the one the record already names."""
        record, task = started.record, started.task
        if task is None:  # nothing was dispatched: the record as admitted
            if record.lineage.task_id is not None:
                self._task_id = record.lineage.task_id
                workflow.logger.info("re-adopting task %s of %s: not dispatching again", self._task_id, self._child_id)
                return record
            if finished(record):
                return record
            refusal = started.dispatch_refused
            assert refusal is not None  # admit_and_dispatch dispatches whenever the checks above pass
            return await self._fail(record, refusal.type or "executor.rejected", f"dispatch refused: {refusal.message}")
        # Read right after the dispatch: usually bound by the executor already (nothing left to
        # write), and a short task may have ended too, its text read in the same call.
        if task.state == "rejected":  # another dispatch bound the record meanwhile: adopt its task
            self._task_id = record.lineage.task_id
            return record
        self._task_id = task.task_id
        if started.output is not None:
            self._output, self._output_sha256 = started.output.output, output_version(record)
        return await self._bind(record, task)

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
        """Write `change(record)`; on a stale revision reduce against the current record and try again.
        A record the conductor keeps is written here (nobody else writes it)."""
        if self._kept is not None:
            wanted = change(self._kept)
            if wanted is not None:
                self._kept = kept.observed(self._kept, *wanted)
            return self._kept
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
            if verifier_due(record, self._input):
                record = await self._verify(record)
            if by_signal and record.status.revision <= self._reported:
                await self._signal_parent(ALIVE_SIGNAL, self._child_id)  # a quiet watch: show we are here
            await self._read_question(record)
            await self._report(record, in_result=finished(record) and not by_signal)
            if self._mission_gone is not None:
                await _shielded(self._stop())
                raise ApplicationError(
                    f"workload {self._child_id!r} stopped its runtime task: its mission is gone ({self._mission_gone})",
                    type="workload.orphaned",
                    non_retryable=True,
                )
            if finished(record):
                return record
            raise_if_cancel_requested()  # one that a completed call swallowed: never watch on
            if self._history_is_long():
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(self._carry(record))
            deadline = self._answer_deadline()
            if deadline is not None and workflow.now() >= deadline:
                record = await self._time_out(record, deadline)
                continue
            record = await self._watch(record.status.revision, until=deadline)

    # --- questions (hitl-prompt/v1) -------------------------------------------------------

    async def _read_question(self, record: WorkloadRecord) -> None:
        """Blocked on approval: read the question from the task (the record does not carry it),
        once per revision. Anything else: no question is open."""
        if not waits_for_answer(record):
            self._question, self._waiting_since = None, None
            return
        if self._waiting_since is None:
            self._waiting_since = workflow.now()
        task_id = record.lineage.task_id or self._task_id
        if record.status.revision <= self._reported or task_id is None:
            return
        ref = TaskRef(instance_id=self._input.target_id, task_id=task_id, max_output_chars=0)
        asked = await self._call(READ_QUESTION, ref, AskedQuestion)
        if asked.state != "input-required":
            return  # answered meanwhile: the next revision says how it goes on
        read = read_prompt(asked.envelope, asked_at=self._waiting_since, task_id=task_id,
                           timeout_seconds=self._input.child.answer_timeout_seconds)  # fmt: skip
        if isinstance(read, str):
            self._question, self._note = None, read
        elif self._question is None or self._question.prompt_id != read.prompt_id:
            self._question = read

    def _answer_deadline(self) -> datetime | None:
        """When waiting for an answer ends the child: the question's deadline, else the child's
        `approval.timeout_seconds` from when the wait began; None: it may wait for ever."""
        if self._waiting_since is None:
            return None
        if self._question is not None and self._question.deadline is not None:
            return self._question.deadline
        timeout = self._input.child.answer_timeout_seconds
        return self._waiting_since + timedelta(seconds=timeout) if timeout is not None else None

    async def _time_out(self, record: WorkloadRecord, deadline: datetime) -> WorkloadRecord:
        """Nobody answered by the deadline: the record ends `timed-out` (written first, so that the
        cancelled task is not projected over it), then the task is cancelled."""
        asked = f"question {self._question.prompt_id} ({self._question.prompt[:80]!r})" if self._question else "its question"

        def change(current: WorkloadRecord) -> Change:
            if finished(current) or not waits_for_answer(current):
                return None  # answered, or ended, meanwhile
            return next_status(current, workflow.now(), observed_state="timed-out", exit_classification="timeout",
                               error_code=APPROVAL_TIMEOUT_CODE, backpressure=None), None  # fmt: skip

        record = await self._compare_and_swap(record, change)
        if not finished(record):
            return record
        workflow.logger.warning("workload %s: %s unanswered at %s", self._child_id, asked, deadline.isoformat())
        self._note = f"{asked} was not answered by its deadline {deadline.isoformat()}: the task was cancelled"
        self._question, self._waiting_since = None, None
        task_id = record.lineage.task_id or self._task_id
        if task_id is not None:
            try:
                await self._call(CANCEL_TASK, TaskRef(instance_id=self._input.target_id, task_id=task_id, max_output_chars=0), TaskView)
            except CALL_FAILED as error:
                workflow.logger.warning("cancelling %s's task after its deadline failed: %s", self._child_id, _cause(error))
        return record

    async def _watch(self, after_revision: int, until: datetime | None = None) -> WorkloadRecord:
        input = self._input
        wait = input.watch_max_seconds
        if until is not None:  # back in time to end a wait for an answer at its deadline
            wait = min(wait, max(1.0, (until - workflow.now()).total_seconds()))
        record = await workflow.execute_activity(
            WATCH_WORKLOAD,
            WatchWorkload(
                child_id=self._fleet_id,
                after_revision=after_revision,
                poll_interval_seconds=input.poll_interval_seconds,
                max_wait_seconds=wait,
                kept=self._kept,
                instance_id=input.target_id if self._kept is not None else None,
            ),
            result_type=WorkloadRecord,
            start_to_close_timeout=timedelta(seconds=wait) + CALL_TIMEOUT,
            heartbeat_timeout=timedelta(seconds=max(10.0, 5 * input.poll_interval_seconds)),
            retry_policy=CALL_RETRY,
            summary=f"watch {self._child_id} after revision {after_revision}",
        )
        if self._kept is not None:
            self._kept = record
        return record

    async def _verify(self, record: WorkloadRecord) -> WorkloadRecord:
        """Run the child's verifier and record its outcome on the record as `verifier` evidence
        (the real server never produces that kind): `failed` if it did not pass."""
        child = self._input.child
        assert child.verifier is not None  # verifier_due
        run = await workflow.execute_activity(
            RUN_VERIFIER,
            build_verifier_run(self._input),
            result_type=VerifierRun,
            start_to_close_timeout=timedelta(seconds=child.budgets.timeout_seconds + VERIFIER_GRACE_SECONDS) + CALL_TIMEOUT,
            heartbeat_timeout=timedelta(seconds=max(10.0, 5 * self._input.poll_interval_seconds)),
            retry_policy=CALL_RETRY,
            summary=f"verify {self._child_id}: {child.verifier[:60]}",
        )
        self._note = verifier_note(run, child.verifier)

        def change(current: WorkloadRecord) -> Change:
            status = verified_status(current, run, workflow.now())
            return None if status is None else (status, None)

        return await self._compare_and_swap(record, change)

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
            question=self._question,
            waiting_since=self._waiting_since,
        )
        return self._input.model_copy(update={"carried": carry})

    async def _report(self, record: WorkloadRecord, *, in_result: bool = False) -> None:
        """Signal the parent once per new revision, with the result's text when there is one.
        `in_result`: this is the last observation and the workflow's result carries it; no signal."""
        if record.status.revision <= self._reported:
            return
        self._reported = record.status.revision
        task_id = record.lineage.task_id or self._task_id
        sha256 = output_version(record)
        if sha256 is not None and sha256 != self._output_sha256 and task_id is not None:
            ref = TaskRef(instance_id=self._input.target_id, task_id=task_id, max_output_chars=self._input.max_output_chars)
            view = await self._call(READ_OUTPUT, ref, TaskOutput)
            self._output, self._output_sha256 = view.output, sha256
        note, self._note = self._note, None
        observation = observation_of(record, self._child_id, output=self._output, note=note, attempt=self._input.attempt,
                                     question=self._question)  # fmt: skip
        await self._send(observation, signal=not in_result)

    async def _send(self, observation: ChildObservation, *, signal: bool = True) -> None:
        self._last = observation
        shown = workflow.info().typed_search_attributes.get(WORKLOAD_STATE)  # None: started without search attributes
        if shown is not None and shown != observation.observed_state:
            workflow.upsert_search_attributes([WORKLOAD_STATE.value_set(observation.observed_state)])
        workflow.set_current_details(
            f"{observation.kind} {observation.child_id} on {self._input.target_id}: "
            f"{observation.observed_state} (revision {observation.revision})"
            + (f"; asks {observation.question.prompt[:200]!r}" if observation.question is not None else "")
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
        """Cancel the runtime task and report how the workload ended (runs shielded).

        No call of this run is in flight any more (each waits for its cancellation to complete),
        so the record read first names every task this workload was given."""
        try:
            record = await self._get()
        except CALL_FAILED as error:
            workflow.logger.warning("cancelled before %s was admitted: %s", self._child_id, _cause(error))
            return
        try:
            task_id = record.lineage.task_id or self._task_id
            stopped = task_id is None  # never dispatched: nothing runs
            if task_id is not None:
                self._task_id = task_id
                view = await self._call(CANCEL_TASK, TaskRef(instance_id=self._input.target_id, task_id=task_id, max_output_chars=0), TaskView)
                record = await self._get()
                # Nothing runs any more, cancelled now or ended before. A task that ended on its own
                # leaves a finished record (failed, succeeded) as it is; one it leaves unfinished (a
                # collector `scheduled`, an agent `retained`: fleet.rs projects those as resting, not
                # ended) is stopped for good now, so the record ends `cancelled`.
                stopped = view.state not in UNENDED_TASK_STATES
            if stopped and not finished(record):
                # Never dispatched, or cancelled by an executor that leaves the record to its orchestrator.
                record = await self._compare_and_swap(record, self._cancelled_change)
        except CALL_FAILED as error:
            workflow.logger.warning("cancelling %s on the executor failed: %s", self._child_id, _cause(error))
        await self._report(record)

    def _cancelled_change(self, current: WorkloadRecord) -> Change:
        if finished(current) or current.lineage.task_id not in (None, self._task_id):
            return None  # ended meanwhile, or bound to a task this run never saw: not ours to end
        fields: dict[str, Any] = {"observed_state": "cancelled", "exit_classification": "cancelled", "error_code": "conductor.cancelled"}
        if current.kind == "daemon":
            fields["health"] = "unhealthy"
        return next_status(current, workflow.now(), **fields), None

    # --- activities -----------------------------------------------------------------------

    async def _get(self) -> WorkloadRecord:
        if self._fleetless:  # the conductor's record, with its task's state projected into it
            if self._kept is None:
                raise ApplicationError(f"{self._child_id} was never admitted", type="workload.not_admitted", non_retryable=True)
            self._kept = await self._call(PROJECT_TASK, KeptRecord(instance_id=self._input.target_id, record=self._kept), WorkloadRecord)
            return self._kept
        return await self._call(GET_WORKLOAD, WorkloadRef(child_id=self._fleet_id), WorkloadRecord)

    async def _call(self, activity: str, argument: Any, result_type: type[T], retry: RetryPolicy = CALL_RETRY) -> T:
        """One short, idempotent fleet or executor call, as a local activity.

        It runs in this worker, its result is one marker event, and consecutive calls can finish
        inside one workflow task, where a regular activity costs three events, a task dispatch
        and a workflow task each. The long watch stays a regular, heartbeating activity.
        """
        return await workflow.execute_local_activity(
            activity,
            argument,
            result_type=result_type,
            start_to_close_timeout=CALL_TIMEOUT,
            retry_policy=retry,
            # A write that was in flight has landed (or not) before the workflow moves on.
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        )
