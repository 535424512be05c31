"""MissionWorkflow: plan, admit, dispatch, supervise and aggregate one mission.

A thin shell. Planning is a pure function of the targets (`planning`), the
verdict is the pure aggregation core's (`aggregation`), and admission is the
host group's singleton, reached through `AdmissionClient`. What stays here is
wiring: signals and child completions wake one loop, which folds everything
into the ledger, starts children whose lease is current, stops the running
attempt of a child whose lease is not (requeued, lapsed, displaced, preempted) and
runs it again as its next attempt where the retry rules say so
(`workflows.mission.attempts`), writes a snapshot when the ledger changed, and keeps
the search attributes and current details true for operators in the Temporal UI.

Verdict and lifetime are separate: the verdict settles (ledger, search
attributes, `wait_for_verdict`) as soon as the aggregation decides; the workflow
itself closes only when no child is live, so long-lived children stay
supervised, their leases renewed, until an operator sends `stop`.

That can be days, and every renewal round costs the history about a dozen events (a
requester renewal gets no answer, but its timer, signal and workflow tasks stay), so
the mission hands over to a new run (continue-as-new) once the history is long,
whenever only long-lived children are running. Those children are started
ABANDON and report everything by signal, their last observation included, so they
outlive the run that started them and the current run hears their end. The new run
takes the ledger, the children's bookkeeping and the admission requests along
(`MissionCarry`). Since a terminated mission can no longer cancel them, they show
it a sign of life after every quiet watch and stop their runtime task once it
cannot be signalled (`workflows.workload.workflow`).
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

from pydantic import TypeAdapter
from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import is_cancelled_exception
from temporalio.workflow import ChildWorkflowCancellationType, ParentClosePolicy

from workflows.cancellation import raise_if_cancel_requested
from workflows.timers import KeptTimer

with workflow.unsafe.imports_passed_through():
    from workflows.admission.client import AdmissionClient
    from workflows.admission.messages import AdmissionDecision, Backpressure as AdmissionBackpressure
    from workflows.admission.model import LANE_OVERRIDE_POLICY, PREEMPTION_POLICY, REQUEUE_POLICY, AdmissionRequest
    from workflows.ids import ATTEMPT_SEPARATOR
    from workflows.inbound import Refusal, Refused, argument, no_argument, refused_start, signal_argument
    from workflows.mission import aggregation
    from workflows.mission.attempts import TAKEN_AWAY, AttemptStop, Judgement
    from workflows.mission.ledger import (
        WRITE_LEDGER_SNAPSHOT_ACTIVITY,
        ChildAdmission,
        MissionLedger,
        ReviewDecision,
        SnapshotRef,
    )
    from workflows.mission.messages import (
        MISSION_WORKFLOW,
        RUNNING_WORKFLOWS,
        MissionCarry,
        MissionInput,
        ReviewRequest,
        WorkflowIds,
        admission_request_id,
        read_mission_input,
    )
    from workflows.mission.observation import ALIVE_SIGNAL, OBSERVATION_SIGNAL, ChildObservation, ends_workload
    from workflows.mission.planning import Assignment, plan_targets
    from workflows.metrics import mission_closed
    from workflows.mission.search import (
        MISSION_AGGREGATION,
        MISSION_CHILDREN_FAILED,
        MISSION_CHILDREN_OK,
        MISSION_CHILDREN_PENDING,
        MISSION_HOST_GROUP,
        MISSION_ID,
        MISSION_ORCHESTRATOR,
        MISSION_STATE,
        WORKLOAD_KIND,
        WORKLOAD_STATE,
    )
    from workflows.workload.client import cancel_workload, result_of_failed, workload_workflow_id
    from workflows.workload.messages import LIST_TARGETS, WORKLOAD_WORKFLOW, TargetList, WorkloadInput, WorkloadResult


# How long a stopped child an earlier run started may stay silent before the mission asks the
# server whether its workflow still runs (one that was terminated will never answer).
SILENCE_BEFORE_ASKING = timedelta(seconds=10)
# A snapshot write takes milliseconds; one lost with a killed worker holds back the next write,
# and the closing one, until this timeout says so (found by the chaos suite: 30 s at closing).
SNAPSHOT_WRITE_TIMEOUT = timedelta(seconds=10)
# Background snapshots start at least this far apart (closing and continuing as new write at
# once): each is the whole ledger (about 1.9 KB a child), and a fan-out changes it with every
# child's last word. Written back to back, a 100-child mission stored six to eight snapshots of up
# to 190 KB in three seconds, each also an activity input in its history; a 1,000-child mission
# busy for an hour would store gigabytes. Queries (`conductor mission show`, `watch`) read the
# live ledger, not the store.
SNAPSHOT_INTERVAL = timedelta(seconds=2)
# Where a client that sent a bad argument finds the right shape (docs/mission-control-api.md).
REVIEW_HINT = "see `conductor mission schema review-request` and docs/mission-control-api.md"
_CHILD_ID = TypeAdapter(str)


def _failure_text(error: BaseException) -> str:
    """A child workflow's failure, down to its cause (`ChildWorkflowError` only says that it failed)."""
    parts = []
    while error is not None and len(parts) < 3:
        parts.append(getattr(error, "message", None) or str(error) or type(error).__name__)
        error = error.__cause__ or getattr(error, "cause", None)
    return ": ".join(parts)[:500]


@workflow.defn(name=MISSION_WORKFLOW)
class MissionWorkflow:
    @workflow.init
    def __init__(self, *args: Any) -> None:
        # Any client may start a mission (docs/mission-control-api.md): its input is checked here,
        # and a bad one fails the run at once instead of its first workflow task for ever.
        try:
            input = read_mission_input(args)
        except Refused as refused:
            raise refused_start(refused, MISSION_WORKFLOW) from None
        self._input = input
        self._spec = input.spec
        self._child_specs = {child.child_id: child for child in input.spec.children}
        self._ledger = aggregation.initial_ledger(input.spec)
        # Requester renewals: one signal per round that names no lease and gets no answer
        # (docs/scaling.md), so a round writes no decision, lease revision or ledger snapshot.
        self._admission = AdmissionClient(
            input.spec.host_group, search_attributes=input.search_attributes, renewal="requester",
            on_refused=self._refuse,
        )
        self._observations: list[ChildObservation] = []
        self._assignments: dict[str, Assignment] = {}
        self._started: set[str] = set()  # children started, by this run or an earlier one
        self._followed: set[str] = set()  # children this run started, whose end it awaits
        self._running: set[str] = set()  # child workflows started and not yet ended
        self._ended: set[str] = set()
        self._released: set[str] = set()
        # Attempts (workflows.mission.attempts; the ledger numbers them):
        self._requests: dict[str, str] = {}  # child -> its admission request, when not attempt 1's
        self._stops: dict[str, AttemptStop] = {}  # running attempts stopped because their lease went
        self._marks: dict[str, int] = {}  # lease interruptions seen when the running attempt started
        self._resubmit: set[str] = set()  # preempted: to be admitted again under a new request
        self._withdraw: set[str] = set()  # given up while their request is still queued or admitted
        self._over: set[str] = set()  # attempts that ended, to judge once their last word is folded
        self._stop_requested = False
        self._wake = 0
        self._lease_timer = KeptTimer("next lease expiry")  # wakes a pass at the next lease expiry
        self._written_seq = -1
        self._folded: dict[str, AdmissionDecision] = {}  # child -> the decision last folded into its ledger
        self._writing = False
        self._written_at: datetime | None = None  # when the last snapshot write started
        self._flushing = False  # a flush waits: the background writer stops waiting out the interval
        self._closing = False
        self._shown_state: str | None = None
        if input.carried is not None:
            self._take_over(input.carried)

    # --- operator and child inputs ----------------------------------------------------------

    @workflow.signal(name=OBSERVATION_SIGNAL, description=(
        "For this mission's workload workflows only: a child's new observation. Not an operator action."
    ))
    def workload_observed(self, *args: Any) -> None:
        observation = signal_argument(args, ChildObservation, OBSERVATION_SIGNAL, self._refuse)
        if observation is None:
            return
        self._observations.append(observation)
        if observation.attempt == self._ledger.child(observation.child_id).attempt:
            self._note_if_ended(observation.child_id, observation.observed_state)
        self._wake += 1

    @workflow.signal(name=ALIVE_SIGNAL, description=(
        "For this mission's long-lived workload workflows only: a sign of life. Not an operator action."
    ))
    def workload_alive(self, *args: Any) -> None:
        """A long-lived child's sign of life; that the signal was delivered is all it needs."""
        signal_argument(args, _CHILD_ID, ALIVE_SIGNAL, self._refuse)

    @workflow.signal(description=(
        "Operators: once the verdict has settled, stop the long-lived children (their runtime tasks too), "
        "give back their leases and close (`conductor mission stop`). To abandon a mission, cancel it."
    ))
    def stop(self, *args: Any) -> None:
        """Stop supervising: stop every live child's runtime task, release the leases, close."""
        try:
            no_argument(args, "the stop signal")
        except Refused as refused:
            self._refuse("stop", refused)
            return
        self._stop_requested = True
        self._wake += 1

    @workflow.update(description=(
        "Operators: approve or reject a manual-review mission (`conductor mission review`); "
        "requires the operator's name and a reason, which the ledger records."
    ))
    def review(self, *args: Any) -> MissionLedger:
        request = argument(args, ReviewRequest, "the review update's argument")
        decision = ReviewDecision(
            operator=request.operator, decision=request.decision, reason=request.reason, decided_at=workflow.now(),
        )
        self._ledger = aggregation.apply_review(self._ledger, self._spec, decision)
        workflow.logger.info("review %s by %s: %s", request.decision, request.operator, request.reason)
        self._wake += 1
        return self._ledger

    @review.validator
    def _review_allowed(self, *args: Any) -> None:
        argument(args, ReviewRequest, "the review update's argument", hint=REVIEW_HINT)
        refusal = aggregation.review_refusal(self._ledger, self._spec)
        if refusal is not None:
            raise ValueError(refusal)

    @workflow.update(description="Returns the ledger once the verdict has settled (what `conductor mission run` waits on).")
    async def wait_for_verdict(self, *args: Any) -> MissionLedger:
        """Returns the ledger once the verdict has settled (or the mission was cancelled)."""
        await workflow.wait_condition(lambda: aggregation.is_final(self._ledger))
        return self._ledger

    @wait_for_verdict.validator
    def _wait_takes_nothing(self, *args: Any) -> None:
        no_argument(args, "the wait_for_verdict update")

    @workflow.query(description="The mission's ledger now: every child's state, the aggregation and the verdict.")
    def ledger(self, *args: Any) -> MissionLedger:
        no_argument(args, "the ledger query")
        return self._ledger

    def _refuse(self, signal: str, refused: Refused) -> None:
        """A signal refused (workflows.inbound): logged, and kept in the ledger for operators."""
        workflow.logger.warning("signal %s refused: %s", signal, refused)
        self._ledger = aggregation.record_refusal(
            self._ledger, Refusal(at=workflow.now(), signal=signal, reason=str(refused)),
        )
        self._wake += 1  # the next pass writes and shows it

    # --- the run ----------------------------------------------------------------------------

    @workflow.run
    async def run(self, *args: Any) -> MissionLedger:
        try:
            if self._input.carried is None:
                await self._plan()
                await self._submit_for_admission()
            renewals = asyncio.ensure_future(self._admission.keep_leases_alive())
            await self._supervise()
            await self._close("mission finished")
            await renewals  # give_back_everything (in _close) ends the renewal loop
            await workflow.wait_condition(workflow.all_handlers_finished)  # let wait_for_verdict answer
        except BaseException as error:
            # Cancelled from the CLI or the UI (the cancellation may surface through an activity
            # or child it interrupted): stop children and runtime tasks, give back every request
            # and lease, record why, then end as cancelled.
            if isinstance(error, GeneratorExit) or not is_cancelled_exception(error):
                raise
            self._ledger = aggregation.mark_cancelled(self._ledger)
            await asyncio.shield(asyncio.ensure_future(self._close("mission cancelled")))
            raise
        return self._ledger

    async def _plan(self) -> None:
        self._details("planning: listing executor targets")
        # A local activity: one marker event, no round trip through the server.
        targets: TargetList = await workflow.execute_local_activity(
            LIST_TARGETS,
            result_type=TargetList,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=10, non_retryable_error_types=["TypeError"]),
            summary="list executor targets",
        )
        assignments, unroutable = plan_targets(self._spec, targets.targets)
        self._assignments = assignments
        now = workflow.now()
        for child_id, why in unroutable.items():
            child = self._child_specs[child_id]
            self._ledger = aggregation.apply_observation(self._ledger, self._spec, ChildObservation(
                child_id=child_id, kind=child.kind, revision=0, observed_state="operator-review-required",
                observed_at=now, note=f"unroutable: {why}",
            ))
        await self._snapshot()

    async def _submit_for_admission(self) -> None:
        if not self._assignments:
            return
        spec = self._spec
        requests = self._admission_requests(
            [child.child_id for child in spec.children if child.child_id in self._assignments], gang=spec.mission_id,
        )
        self._details(f"admitting: {len(requests)} requests to admission:{spec.host_group}")
        await self._admission.submit(requests)

    def _admission_requests(self, child_ids: list[str], *, gang: str) -> list[AdmissionRequest]:
        """One request per child, under the child's current request id; in gang mode the
        requests are one gang, named `gang` (docs/mission-spec.md, "admission")."""
        now = workflow.now()
        spec = self._spec
        ganged = spec.admission.mode == "gang"
        return [
            AdmissionRequest(
                request_id=self._request_id(child.child_id),
                orchestrator_id=spec.orchestrator_id,
                environment=child.environment,
                provider=child.provider,
                runtime_kind=child.runtime_kind,
                priority=child.priority,
                submitted_at=now,
                queue_timeout_seconds=child.queue_timeout_seconds,
                preemptible=child.preemptible,
                lane=child.lane,
                priority_class=child.priority_class,
                gang_id=gang if ganged else None,
                gang_size=len(child_ids) if ganged else None,
            )
            for child in (self._child_specs[child_id] for child_id in child_ids)
        ]

    def _gang_still_stopping(self) -> bool:
        """A gang is preempted whole and admitted again whole: its new requests go together, once
        every member's preempted attempt has ended."""
        return self._spec.admission.mode == "gang" and any(stop.kind == "preempted" for stop in self._stops.values())

    async def _submit_again(self) -> None:
        """Preempted children go back to admission as new requests (their old ones have ended)."""
        child_ids = sorted(self._resubmit)
        self._resubmit.clear()
        attempt = max(self._ledger.child(child_id).attempt for child_id in child_ids)
        gang = f"{self._spec.mission_id}{ATTEMPT_SEPARATOR}{attempt}"
        await self._admission.submit(self._admission_requests(child_ids, gang=gang))

    async def _supervise(self) -> None:
        while True:
            at_start = (self._wake, self._admission.version)
            self._fold_decisions()
            self._fold_observations()
            self._settle_attempts()
            await self._act()
            finished = aggregation.is_final(self._ledger) and not self._running and not self._waiting()
            if not finished:  # a finished mission's ledger is written and shown by closing
                await self._snapshot()
                self._publish()
            if finished or self._stop_requested:
                return
            # Anything that arrived while this pass awaited (an observation during a snapshot,
            # a child ending during a start) must wake the next pass at once: compare with what
            # the pass started from, not with what it ended with.
            raise_if_cancel_requested()  # one that a completed operation swallowed
            expiry = self._lease_timer.at(self._next_lease_expiry())
            await workflow.wait_condition(
                lambda: (self._wake, self._admission.version) != at_start or (expiry is not None and expiry.done())
            )
            if self._continue_as_new_due():
                await self._snapshot(flush=True)  # the next run starts from a stored ledger
                if self._continue_as_new_due():
                    self._lease_timer.cancel()
                    workflow.continue_as_new(self._carry())

    # --- continue-as-new --------------------------------------------------------------------

    def _continue_as_new_due(self) -> bool:
        """The history is long, and nothing is in flight that the next run could not take over:
        no update handler running, no child waiting to start, only long-lived children running
        (they report by signal, whichever run is current)."""
        info = workflow.info()
        return (
            not self._stop_requested
            and (info.is_continue_as_new_suggested() or info.get_current_history_length() >= self._input.max_history_events)
            and workflow.all_handlers_finished()
            and not self._admission.sending
            and not self._waiting()
            and all(self._child_specs[child_id].long_lived for child_id in self._running)
        )

    def _carry(self) -> MissionInput:
        self._details(f"continuing as new with {len(self._running)} running children")
        return self._input.model_copy(update={"carried": MissionCarry(
            ledger=self._ledger,
            assignments=self._assignments,
            started=sorted(self._started),
            running=sorted(self._running),
            ended=sorted(self._ended),
            released=sorted(self._released),
            observations=self._observations,
            written_seq=self._written_seq,
            admission=self._admission.carry(),
            requests=self._requests,
            stops=self._stops,
            marks=self._marks,
            resubmit=sorted(self._resubmit),
            withdraw=sorted(self._withdraw),
            over=sorted(self._over),
        )})

    def _take_over(self, carried: MissionCarry) -> None:
        """Pick up where the previous run left off (it continued as new)."""
        self._ledger = carried.ledger
        self._assignments = dict(carried.assignments)
        self._started = set(carried.started)
        self._running = set(carried.running)
        self._ended = set(carried.ended)
        self._released = set(carried.released)
        self._written_seq = carried.written_seq
        self._admission.restore(carried.admission)
        self._requests = dict(carried.requests)
        self._stops = dict(carried.stops)
        self._marks = dict(carried.marks)
        self._resubmit = set(carried.resubmit)
        self._withdraw = set(carried.withdraw)
        self._over = set(carried.over)
        self._observations = list(carried.observations)
        self._fold_observations()
        # A running child whose last observation has arrived (in an earlier run, which awaited
        # its handle, or in flight at the handover) has ended: the ledger says so.
        for child_id in sorted(self._running):
            self._note_if_ended(child_id, self._ledger.child(child_id).observed_state)

    def _note_if_ended(self, child_id: str, observed_state: str) -> None:
        """A child an earlier run started ends with its last observation: this run has no handle
        to await (children this run started end when their handle does)."""
        if child_id in self._running and child_id not in self._followed and ends_workload(observed_state):
            self._running.discard(child_id)
            self._over.add(child_id)

    # --- folding inputs into the ledger -----------------------------------------------------

    def _fold_decisions(self) -> None:
        """Fold each decision once: every pass runs this, and folding a hundred unchanged decisions
        again (each one aggregating the whole ledger) was the largest part of a pass. The new ones
        are folded as one batch (`aggregation.apply_admissions`: aggregated once, not per decision)."""
        new: list[tuple[str, ChildAdmission, AdmissionBackpressure | None]] = []
        for child_id in self._assignments:
            decision = self._admission.decisions.get(self._request_id(child_id))
            if decision is None or self._folded.get(child_id) is decision:
                continue
            self._folded[child_id] = decision
            admission = ChildAdmission(
                request_id=decision.request_id, state=decision.state, lease_revision=decision.lease_revision,
                revision=decision.revision, reason=decision.reason,
            )
            new.append((child_id, admission, decision.backpressure))
        if new:
            self._ledger = aggregation.apply_admissions(self._ledger, new)

    def _fold_observations(self) -> None:
        observations, self._observations = self._observations, []
        if observations:
            self._ledger = aggregation.apply_observations(self._ledger, self._spec, observations)

    # --- acting on the ledger ---------------------------------------------------------------

    async def _act(self) -> None:
        cancel = aggregation.children_to_cancel(self._ledger, self._spec)
        if cancel:
            self._ledger = aggregation.mark_cancel_requested(self._ledger, cancel)
            await self._cancel_children(cancel, why="fail-fast: a sibling failed")
        lost = self._leases_gone()
        withdraw = sorted(self._withdraw)  # given up before they ran again: their requests go
        self._withdraw.clear()
        if lost or withdraw:
            await self._cancel_children(lost + withdraw, why="admission lease lost")
        if self._resubmit and not self._stop_requested and not self._gang_still_stopping():
            await self._submit_again()
        await self._start_admitted()
        self._release_ended()

    async def _start_admitted(self) -> None:
        if self._stop_requested:
            return  # stopping: what was admitted is given back, never started
        room = self._input.max_children_in_flight - len(self._running)
        ready = [
            child for child in self._spec.children
            if child.child_id in self._assignments
            and child.child_id not in self._started
            and child.child_id not in self._ended
            and child.child_id not in self._withdraw
            and child.child_id not in self._resubmit
            and not self._ledger.child(child.child_id).cancel_requested
            and self._admission.is_current(self._request_id(child.child_id))
        ][: max(0, room)]
        if not ready:
            return
        # The starts run on in a task of their own when the mission is cancelled meanwhile: a
        # child whose start was already sent runs, so it must be known (and stopped at closing).
        starts = asyncio.ensure_future(self._start_children([child.child_id for child in ready]))
        try:
            await asyncio.shield(starts)
        except asyncio.CancelledError:
            await workflow.wait_condition(starts.done)
            raise

    async def _start_children(self, child_ids: list[str]) -> None:
        attempts = {child.child_id: child.attempt for child in self._ledger.children}
        starts = []
        for child_id in child_ids:  # in the ledger before it runs: its observations name it
            request_id = self._request_id(child_id)
            decision = self._admission.decisions.get(request_id)
            lease_revision = decision.lease_revision if decision is not None else 0
            starts.append(aggregation.AttemptStart(child_id, attempts[child_id], request_id, lease_revision))
            self._marks[child_id] = self._admission.interruptions(request_id)
        self._ledger = aggregation.start_attempts(self._ledger, starts)
        handles = await asyncio.gather(*(self._start_child(child_id) for child_id in child_ids))
        for child_id, handle in zip(child_ids, handles):
            self._started.add(child_id)
            self._followed.add(child_id)
            self._running.add(child_id)
            asyncio.ensure_future(self._follow_child(child_id, handle))

    async def _start_child(self, child_id: str) -> workflow.ChildWorkflowHandle:
        spec = self._spec
        child = self._child_specs[child_id]
        target = self._assignments[child_id]
        attempt = self._ledger.child(child_id).attempt
        # Long-lived children outlive this run when it continues as new: ABANDON, not cancelled
        # with it; they report by signal, their end included (see WorkloadInput), and stop
        # themselves if the mission is ever gone.
        outlives_run = child.long_lived
        return await workflow.start_child_workflow(
            WORKLOAD_WORKFLOW,
            WorkloadInput(
                mission_id=spec.mission_id,
                orchestrator_id=spec.orchestrator_id,
                child=child,
                target_id=target.target_id,
                executor_id=target.executor_id,
                runtime_id=target.runtime_id,
                parent_id=workflow.info().workflow_id,
                attempt=attempt,
                poll_interval_seconds=self._input.poll_interval_seconds,
                **({"report_to_mission_by_signal": True, "watch_max_seconds": self._input.alive_every_seconds} if outlives_run else {}),
            ),
            id=workload_workflow_id(spec.mission_id, child_id, attempt),
            cancellation_type=ChildWorkflowCancellationType.WAIT_CANCELLATION_COMPLETED,
            parent_close_policy=ParentClosePolicy.ABANDON if outlives_run else ParentClosePolicy.REQUEST_CANCEL,
            static_summary=f"{child.kind} {child_id} on {target.target_id}" + (f" (attempt {attempt})" if attempt > 1 else ""),
            search_attributes=TypedSearchAttributes([
                SearchAttributePair(MISSION_ID, spec.mission_id),
                SearchAttributePair(MISSION_HOST_GROUP, spec.host_group),
                SearchAttributePair(WORKLOAD_KIND, child.kind),
                SearchAttributePair(WORKLOAD_STATE, "admitted"),
            ]) if self._input.search_attributes else None,
            result_type=WorkloadResult,
        )

    async def _follow_child(self, child_id: str, handle: workflow.ChildWorkflowHandle) -> None:
        ending = "ended without a last observation"
        try:
            result: WorkloadResult = await handle
            # A workload's last observation travels in its result (a long-lived one signals it
            # too: folding the same revision twice changes nothing).
            self._observations.append(result.observation)
        except Exception as error:  # a failed or cancelled child is reported by its observations
            ended = result_of_failed(error)
            if ended is not None:
                # A workload whose verdict is not success fails its workflow (so the Temporal UI
                # shows it failed); its last observation travels in the failure's details.
                self._observations.append(ended.observation)
            elif not is_cancelled_exception(error):
                workflow.logger.warning("workload %s ended with %s", child_id, error)
                ending = f"failed without a last observation ({_failure_text(error)})"
        finally:
            self._running.discard(child_id)
            self._over.add(child_id)
            self._wake += 1
        # Whatever ended it (a failure, a terminate, a cancellation that could not report), the
        # ledger must not wait for the child: without a last word it is `unknown`, failing closed.
        self._fold_observations()
        if not ends_workload(self._ledger.child(child_id).observed_state):
            self._record_unknown(child_id, f"the workload {ending}: check its runtime task")
        self._settle_attempts()

    # --- attempts ---------------------------------------------------------------------------

    def _leases_gone(self) -> list[str]:
        """Running attempts whose lease is gone (running without one is forbidden): noted with
        why, once each, for the caller to stop. Gone: the engine took it away (requeued after it
        expired, displaced, preempted; perhaps already granted again, as a new lease), or it is
        no longer provably current."""
        gone = []
        for child_id in sorted(self._running):
            if child_id in self._stops:
                continue  # being stopped already
            request_id = self._request_id(child_id)
            stop: AttemptStop | None = None
            if self._admission.interruptions(request_id) != self._marks.get(child_id, 0):
                stop = _stop_by(self._admission.interrupted[request_id])
            elif not self._admission.is_current(request_id):
                decision = self._admission.decisions.get(request_id)
                state = decision.state if decision is not None else "unknown"
                stop = _stop_by(decision) if state == "preempted" and decision is not None else AttemptStop(
                    kind="lapsed", policy=REQUEUE_POLICY,
                    reason="lease expired" if state == "admitted" else f"lease lost (admission {state})",
                )
            if stop is not None:
                self._stops[child_id] = stop
                self._ledger = aggregation.mark_stopping(self._ledger, child_id, stop.reason)
                gone.append(child_id)
        return gone

    def _settle_attempts(self) -> None:
        """Judge every attempt that has ended (workflows.mission.attempts): the child is done,
        or goes on as its next attempt, which starts once its lease is current."""
        for child_id in sorted(self._over):
            self._over.discard(child_id)
            self._attempt_over(child_id)

    def _attempt_over(self, child_id: str) -> None:
        stop = self._stops.pop(child_id, None)
        child = self._ledger.child(child_id)
        closing = self._stop_requested or self._ledger.cancellation is not None or child.cancel_requested
        judgement = aggregation.judge_attempt(child, stop, self._child_specs[child_id].budgets.max_attempts)
        request_state = self._admission.state_of(self._request_id(child_id))
        if judgement.retry and stop is not None and stop.kind not in TAKEN_AWAY and request_state not in ("queued", "admitted"):
            # The engine has ended the request (out of requeue attempts, ADR-004): nothing to run again under.
            judgement = Judgement(False, True, f"{stop.reason}; the admission request ended {request_state}")
        if closing or not judgement.retry:
            if stop is not None or child.stopping is not None:
                self._ledger = aggregation.close_attempt(
                    self._ledger, child_id, why=judgement.why, retry=False, counts=judgement.counts,
                    interrupted_by=stop.interrupted_by if stop else None, policy=stop.policy if stop else None,
                    lease_timeout=stop is not None and not closing and stop.kind not in TAKEN_AWAY,
                )
                if stop is not None and not closing and request_state in ("queued", "admitted"):
                    # Its request lives on (requeued): withdraw it, so that it is never admitted again.
                    self._started.discard(child_id)
                    self._withdraw.add(child_id)
                    return
            self._ended.add(child_id)
            return
        workflow.logger.info("workload %s attempt %d: %s", child_id, child.attempt, judgement.why)
        admission = None
        if stop is not None and stop.kind == "preempted":
            # Its request has ended: the next attempt is admitted under a request of its own.
            request_id = admission_request_id(self._spec.mission_id, child_id, child.attempt + 1)
            self._requests[child_id] = request_id
            self._resubmit.add(child_id)
            admission = ChildAdmission(request_id=request_id)
        self._ledger = aggregation.close_attempt(
            self._ledger, child_id, why=judgement.why, retry=True, counts=judgement.counts,
            interrupted_by=stop.interrupted_by if stop else None, policy=stop.policy if stop else None,
            admission=admission,
        )
        self._started.discard(child_id)
        self._ended.discard(child_id)
        self._wake += 1

    async def _cancel_children(self, child_ids: list[str], why: str) -> None:
        started = [cid for cid in child_ids if cid in self._running]
        waiting = [cid for cid in child_ids if cid not in self._started and cid in self._assignments]
        for child_id in started:
            workflow.logger.info("cancelling workload %s: %s", child_id, why)
        # By workflow id, not through the child handle: a long-lived workload has usually
        # continued-as-new, and only a request by id reaches its current run.
        await asyncio.gather(*(
            cancel_workload(self._workload_id(child_id)) for child_id in started
        ))
        if waiting:
            # Never started: take their requests out of the queue so they are never admitted.
            await self._admission.cancel(self._request_id(cid) for cid in waiting)
            for child_id in waiting:
                self._ended.add(child_id)

    def _release_ended(self) -> None:
        """Give back the leases of children that ended, without confirmation and without waiting
        for the signal's delivery: the admission client records each release as it sends it
        (undone if no singleton takes it), which wakes the next pass. An answer would cost a
        signal each way and a pass, and each wait a workflow task; closing waited for the last
        ones. Closing (`give_back_everything`) and continuing as new wait for what is still on
        its way."""
        done = sorted(self._ended - self._released)
        if not done:
            return
        self._released.update(done)
        held = set(self._admission.held())
        release = [self._request_id(cid) for cid in done if self._request_id(cid) in held]
        self._admission.release_in_background(release)

    def _waiting(self) -> bool:
        """Children that were routed but have neither ended nor been started yet."""
        return any(
            child_id not in self._started and child_id not in self._ended
            and self._admission.state_of(self._request_id(child_id)) in (None, "queued", "admitted")
            for child_id in self._assignments
        )

    def _next_lease_expiry(self) -> datetime | None:
        """When to wake: at the earliest expiry of a running child's lease, to stop it if renewal
        failed (no sooner than a second from now)."""
        expiries = [
            decision.lease_expires_at
            for child_id in self._running
            if (decision := self._admission.decisions.get(self._request_id(child_id))) is not None
            and decision.lease_expires_at is not None
        ]
        if not expiries:
            return None
        return max(workflow.now() + timedelta(seconds=1), min(expiries))

    # --- closing ----------------------------------------------------------------------------

    async def _close(self, why: str) -> None:
        """Stop every live child (runtime tasks included), give back admission, final snapshot."""
        self._lease_timer.cancel()
        live = sorted(self._running)
        if live:
            self._details(f"{why}: stopping {len(live)} live children")
            await self._cancel_children(live, why=why)
            await self._until_children_ended()
        self._fold_observations()
        self._closing = True  # from here on, only the final snapshot is written
        # Leases of children that ended since the last pass go back as every pass gives them back,
        # unconfirmed; what is left (requests never started or still queued) waits for the answer.
        # Confirming the ended ones too cost a fan-out a signal each way and one more snapshot.
        # An unconfirmed release is recorded as it is sent: when only such deliveries are left,
        # the final snapshot is written while they travel (one round trip less before the mission
        # ends), and written again only if one found no singleton. Answers still to come (to what
        # had to be confirmed) change the ledger: then it is written once, after them.
        self._release_ended()
        self._fold_decisions()
        early = asyncio.ensure_future(self._snapshot(flush=True)) if self._admission.only_deliveries_left() else None
        await self._admission.give_back_everything()
        if early is not None:
            await early
        self._fold_decisions()
        await self._snapshot(flush=True)
        self._publish(closing=True)
        mission_closed(workflow.metric_meter(), self._spec.host_group, self._ledger.parent_state)

    async def _until_children_ended(self) -> None:
        """Children this run started end with their handle. One an earlier run started ends
        with its last observation, unless its workflow was terminated or failed first: after a
        silence, ask the server, and record the ones that are gone as `unknown` (fail closed)."""
        while True:
            try:
                await workflow.wait_condition(
                    lambda: not self._running, timeout=SILENCE_BEFORE_ASKING, timeout_summary="stopped children's last word",
                )
                return
            except asyncio.TimeoutError:
                pass
            silent = sorted(self._running - self._followed)
            if not silent:
                continue
            ids = {self._workload_id(child_id): child_id for child_id in silent}
            running = await workflow.execute_local_activity(
                RUNNING_WORKFLOWS, WorkflowIds(ids=list(ids)), result_type=WorkflowIds,
                start_to_close_timeout=timedelta(seconds=30), summary="are the silent children still running",
            )
            for workflow_id, child_id in ids.items():
                if workflow_id not in running.ids:
                    self._record_unknown(
                        child_id, "the workload ended without a last observation (terminated or failed): check its runtime task",
                    )
                    self._running.discard(child_id)
                    self._ended.add(child_id)

    def _record_unknown(self, child_id: str, note: str) -> None:
        child = self._ledger.child(child_id)
        workflow.logger.warning("workload %s: %s", child_id, note)
        self._ledger = aggregation.apply_observation(self._ledger, self._spec, ChildObservation(
            child_id=child_id, attempt=child.attempt, kind=child.kind, revision=(child.revision or 0) + 1,
            observed_state="unknown",
            observed_at=workflow.now(), lineage=child.lineage, note=note,
        ))

    # --- what operators see -----------------------------------------------------------------

    async def _snapshot(self, *, flush: bool = False) -> None:
        """Write the ledger if it changed: handed to the one background writer, so a pass never
        waits for a write (a write in flight or the interval between writes holds back only the
        next one, which then takes the latest ledger); or, when `flush` (before closing or
        continuing as new), written at once after any write in flight."""
        if flush:
            self._flushing = True
            await workflow.wait_condition(lambda: not self._writing)
            self._flushing = False
            await self._write_changed_ledger()
        elif not self._writing and self._ledger.snapshot_seq != self._written_seq:
            self._writing = True
            asyncio.ensure_future(self._write_in_background())

    async def _write_in_background(self) -> None:
        try:
            # A flush (closing, continuing as new) writes the latest ledger itself: chasing the
            # changes closing makes meanwhile (releases recorded, decisions folded) would cost a
            # write each.
            while self._ledger.snapshot_seq != self._written_seq and not (self._closing or self._flushing):
                wait = self._until_next_write()
                if wait <= timedelta(0):
                    await self._write_changed_ledger()
                    continue
                try:
                    await workflow.wait_condition(
                        lambda: self._closing or self._flushing,
                        timeout=wait, timeout_summary="next ledger snapshot",
                    )
                except asyncio.TimeoutError:
                    pass
        finally:
            self._writing = False

    def _until_next_write(self) -> timedelta:
        if self._written_at is None:
            return timedelta(0)
        return self._written_at + SNAPSHOT_INTERVAL - workflow.now()

    async def _write_changed_ledger(self) -> None:
        """Always a scheduled activity, never a local one: a local activity runs before its marker
        is recorded, so a workflow task lost after the write (a worker killed) runs it again with
        whatever the retried task folded meanwhile, under the same snapshot seq, and the store
        refuses the changed content (`ledger.immutable_snapshot`, which failed a mission in CI).
        A scheduled write's input is in the history before it runs."""
        if self._ledger.snapshot_seq == self._written_seq:
            return
        ledger = self._ledger
        # The summary shows on the workflow page's timeline: where waiting children stand goes there too.
        summary = f"ledger snapshot {ledger.snapshot_seq} ({ledger.parent_state}{self._queued_text(at_most=2)})"[:240]
        timeout = SNAPSHOT_WRITE_TIMEOUT
        self._written_at = workflow.now()
        await workflow.execute_activity(
            WRITE_LEDGER_SNAPSHOT_ACTIVITY, ledger, result_type=SnapshotRef, start_to_close_timeout=timeout, summary=summary,
        )
        self._written_seq = ledger.snapshot_seq

    def _publish(self, *, closing: bool = False) -> None:
        """Current details always; search attributes when the state changes, and when closing
        (so a closed mission's children counts are exact)."""
        ledger = self._ledger
        summary = ledger.aggregation
        self._details(
            f"{ledger.parent_state}: {summary.reason} "
            f"({len(summary.successful)} ok, {len(summary.failed)} failed, {len(summary.pending)} pending, "
            f"{len(self._running)} running){self._queued_text()}"
        )
        if ledger.parent_state == self._shown_state and not closing:
            return
        self._shown_state = ledger.parent_state
        if self._input.search_attributes:
            workflow.upsert_search_attributes([
                MISSION_STATE.value_set(ledger.parent_state),
                MISSION_AGGREGATION.value_set(self._spec.aggregation.mode),
                MISSION_HOST_GROUP.value_set(self._spec.host_group),
                MISSION_ORCHESTRATOR.value_set(self._spec.orchestrator_id),
                MISSION_CHILDREN_OK.value_set(len(summary.successful)),
                MISSION_CHILDREN_FAILED.value_set(len(summary.failed)),
                MISSION_CHILDREN_PENDING.value_set(len(summary.pending)),
            ])

    def _queued_text(self, at_most: int = 5) -> str:
        """Where the children waiting for admission stand, as of the singleton's last word on them."""
        waiting = [
            (decision.position or 0, child_id, decision.binding_constraint)
            for child_id in self._assignments
            if child_id not in self._started
            and (decision := self._admission.decisions.get(self._request_id(child_id))) is not None
            and decision.state == "queued"
        ]
        if not waiting:
            return ""
        shown = "; ".join(
            f"{child_id} #{position} in the queue of admission:{self._spec.host_group}"
            + (f", waiting on {constraint}" if constraint else "")
            for position, child_id, constraint in sorted(waiting)[:at_most]
        )
        more = f"; and {len(waiting) - at_most} more" if len(waiting) > at_most else ""
        return f"; queued: {shown}{more}"

    def _details(self, text: str) -> None:
        workflow.set_current_details(f"mission {self._spec.mission_id} ({self._spec.goal}): {text}")

    def _request_id(self, child_id: str) -> str:
        """The child's admission request now: its first attempt's, or the one it was admitted
        again under after a preemption."""
        return self._requests.get(child_id) or admission_request_id(self._spec.mission_id, child_id)

    def _workload_id(self, child_id: str) -> str:
        """The workflow id of the child's current attempt."""
        return workload_workflow_id(self._spec.mission_id, child_id, self._ledger.child(child_id).attempt)


def _stop_by(decision: AdmissionDecision) -> AttemptStop:
    """Why the engine took the lease away, from the decision that said so."""
    if "displaced" in decision.happened:
        by = decision.related_request_id
        return AttemptStop(
            kind="displaced", interrupted_by=by, policy=LANE_OVERRIDE_POLICY,
            reason=f"displaced by {by or 'a higher-priority claim'} ({LANE_OVERRIDE_POLICY})",
        )
    if "preempted" in decision.happened or decision.state == "preempted":
        by = decision.related_request_id
        return AttemptStop(
            kind="preempted", interrupted_by=by, policy=PREEMPTION_POLICY,
            reason=f"preempted by {by or 'a higher-priority request'} ({PREEMPTION_POLICY})",
        )
    return AttemptStop(kind="requeued", policy=REQUEUE_POLICY, reason="lease expired; requeued by the admission engine")
