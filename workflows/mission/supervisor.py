"""The mission's supervisor: what a mission does about its children, with no Temporal in it.

`MissionWorkflow` is the shell around it: it hands over what arrives and what its loop meets,
and carries out the actions it gets back (cancel workloads and requests, submit requests, start
children, give leases back). The rules live here:

- a child runs only under a current lease: one whose lease went (requeued after it expired,
  displaced, preempted, or no longer provably current) is stopped, once, with why;
- an attempt that ended is judged (`workflows.mission.attempts`): the child is done, runs again
  as its next attempt (a preempted one under a request of its own, a gang's all together), or
  its request, still alive, is withdrawn;
- a child starts once its lease is current, at most `max_children_in_flight` at a time, never
  twice for one attempt, and never after a stop or a cancellation was asked for;
- a child that is done gives its lease back, once, or withdraws its request if the engine had
  requeued it meanwhile (left queued, it would be admitted again for nothing);
- fail-fast cancels the live siblings; the verdict itself is the aggregation's
  (`workflows.mission.aggregation.verdict_rule`).

The shell hands it events: `hear(state, event)` takes what arrives (an observation, a review, a
stop, a cancellation, a refused signal, a child's end, children gone silent), which only changes
the state; `step(state, event, admission, now)` takes what the shell's one loop meets (the plan, a
pass after any news or timer, closing) and returns the actions, in order, which only that loop
carries out. Both change the
`MissionState` in place (the ledger inside it is immutable and replaced, through the pure
aggregation functions). `AdmissionView` is what the supervisor reads of the admission singleton's
answers (`AdmissionClient` is one), so tests drive it with plain data
(tests/engine/test_mission_supervisor.py).
"""

from __future__ import annotations

from collections.abc import Mapping
import dataclasses
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from workflows.admission.messages import AdmissionDecision, admission_workflow_id, queue_place
from workflows.admission.messages import Backpressure as AdmissionBackpressure
from workflows.admission.model import LANE_OVERRIDE_POLICY, PREEMPTION_POLICY, REQUEUE_POLICY, AdmissionRequest
from workflows.ids import ATTEMPT_SEPARATOR, admission_request_id, workload_workflow_id
from workflows.mission import aggregation
from workflows.mission.attempts import TAKEN_AWAY, AttemptStop
from workflows.mission.children import ChildRun, ChildRuns
from workflows.inbound import Refusal
from workflows.mission.ledger import ChildAdmission, ChildLedger, MissionLedger, ReviewDecision
from workflows.mission.messages import MissionProgress
from workflows.mission.observation import ChildObservation, ends_workload
from workflows.contract import Capability
from workflows.mission.planning import Assignment
from workflows.mission.questions import Answer, gate_question, overdue
from workflows.mission.spec import ChildSpec, MissionSpec


UNSUPPORTED_KIND = "executor.unsupported_kind"


class AdmissionView(Protocol):
    """What the supervisor reads of its requests' admission (workflows.admission.client)."""

    @property
    def decisions(self) -> Mapping[str, AdmissionDecision]: ...
    @property
    def interrupted(self) -> Mapping[str, AdmissionDecision]: ...
    def interruptions(self, request_id: str) -> int: ...
    def is_current(self, request_id: str) -> bool: ...
    def state_of(self, request_id: str) -> str | None: ...
    def held(self) -> list[str]: ...
    @property
    def sending(self) -> bool: ...


class MissionState:
    """Everything the supervisor decides from: the spec and the room for children in flight (the
    mission's input), its `progress` (carried whole at continue-as-new: `carry`/`take_over`), and
    what only this run knows: whether an operator asked to stop, and the ends heard but not settled."""

    def __init__(self, spec: MissionSpec, ledger: MissionLedger, max_children_in_flight: int) -> None:
        self.spec = spec
        self.max_children_in_flight = max_children_in_flight
        self.progress = MissionProgress(ledger=ledger)
        self.stop_requested = False
        self.unsettled: list[Ended | Gone] = []  # heard, settled by the next pass or the closing
        self._specs = {child.child_id: child for child in spec.children}

    @property
    def ledger(self) -> MissionLedger:
        return self.progress.ledger

    @ledger.setter
    def ledger(self, ledger: MissionLedger) -> None:
        self.progress.ledger = ledger

    @property
    def children(self) -> ChildRuns:
        return self.progress.children

    @property
    def observations(self) -> list[ChildObservation]:
        """Arrived, not folded yet."""
        return self.progress.observations

    def child_spec(self, child_id: str) -> ChildSpec:
        return self._specs[child_id]

    def workload_id(self, child_id: str) -> str:
        """The workflow id of the child's current attempt."""
        return workload_workflow_id(self.spec.mission_id, child_id, self.ledger.child(child_id).attempt)


# --- actions: what the shell does ------------------------------------------------------------


@dataclass(frozen=True)
class Cancel:
    """Cancel these children's workloads (by workflow id: a long-lived one has continued as new)
    and withdraw these requests from the queue."""

    workloads: list[str]
    requests: list[str]
    why: str


@dataclass(frozen=True)
class Submit:
    requests: list[AdmissionRequest]


@dataclass(frozen=True)
class Start:
    """Start these children's current attempts (already in the ledger and `running`)."""

    child_ids: list[str]


@dataclass(frozen=True)
class Release:
    """Give these leases back, unconfirmed."""

    request_ids: list[str]


@dataclass(frozen=True)
class Note:
    """A line for the workflow's log."""

    text: str
    warning: bool = False


Action = Cancel | Submit | Start | Release | Note


# --- events: what the shell hands over ---------------------------------------------------------


@dataclass(frozen=True)
class Observed:
    """A child's observation arrived by signal."""

    observation: ChildObservation


@dataclass(frozen=True)
class Reviewed:
    decision: ReviewDecision


@dataclass(frozen=True)
class Answered:
    """An operator's answer to a child's question, as `answer_child` took it (its outcome says
    what came of it: a vote towards consensus, delivered to the executor, a gate decided)."""

    child_id: str
    answer: Answer


@dataclass(frozen=True)
class StopAsked:
    """An operator asked the mission to stop supervising and close."""


@dataclass(frozen=True)
class CancelAsked:
    """The mission was cancelled (from the CLI or the UI): the ledger says so, and it closes."""


@dataclass(frozen=True)
class SignalRefused:
    refusal: Refusal


@dataclass(frozen=True)
class Ended:
    """The workload this run started has ended, with its last observation or without one
    (`failure` says how, when it failed)."""

    child_id: str
    at: datetime
    last: ChildObservation | None = None
    failure: str | None = None


@dataclass(frozen=True)
class Gone:
    """Running children an earlier run started whose workflows no longer run."""

    child_ids: list[str]
    at: datetime


Heard = Observed | Reviewed | Answered | StopAsked | CancelAsked | SignalRefused | Ended | Gone


@dataclass(frozen=True)
class Planned:
    """The planner's answer: where each routable child runs, and why the others cannot."""

    assignments: dict[str, Assignment]
    unroutable: Mapping[str, str]
    unsupported: Mapping[str, str] = dataclasses.field(default_factory=dict)  # fails before admission


@dataclass(frozen=True)
class Pass:
    """Something arrived (admission news, an observation, a review, a stop) or a timer fired."""


@dataclass(frozen=True)
class Closing:
    """The mission closes (finished, stopped or cancelled): every live child is stopped."""

    why: str


@dataclass(frozen=True)
class Closed:
    """Every child has ended: judge the last attempts, give the ended children's leases back."""


@dataclass(frozen=True)
class Fold:
    """While closing: the admission's news (the leases going back) into the ledger, nothing to do."""


Event = Planned | Pass | Closing | Closed | Fold


def hear(state: MissionState, event: Heard) -> None:
    """What arrives (by signal, update, a child's end or the server's word) only changes the state;
    the next pass, or the closing, acts on it."""
    if isinstance(event, Observed):
        observed(state, event.observation)
    elif isinstance(event, Reviewed):
        state.ledger = aggregation.apply_review(state.ledger, state.spec, event.decision)
    elif isinstance(event, Answered):
        answered(state, event.child_id, event.answer)
    elif isinstance(event, StopAsked):
        state.stop_requested = True
    elif isinstance(event, CancelAsked):
        state.ledger = aggregation.mark_cancelled(state.ledger)
    elif isinstance(event, Ended):
        handle_ended(state, event.child_id)
        if event.last is not None:
            # A long-lived workload signals its last observation too: folding one revision twice changes nothing.
            state.observations.append(event.last)
        state.unsettled.append(event)
    elif isinstance(event, Gone):
        for child_id in event.child_ids:
            state.children[child_id].phase = "done"
        state.unsettled.append(event)
    else:
        state.ledger = aggregation.record_refusal(state.ledger, event.refusal)


def step(state: MissionState, event: Event, admission: AdmissionView, now: datetime) -> list[Action]:
    """What the shell's loop met, and what to do about it."""
    if isinstance(event, Planned):
        submit = route(state, event.assignments, event.unroutable, now, event.unsupported)
        return [submit] if submit is not None else []
    if isinstance(event, Pass):
        return supervise(state, admission, now)
    if isinstance(event, Closing):
        live = state.children.ids("running")
        return [cancel_children(state, live, why=event.why)] if live else []
    if isinstance(event, Closed):
        # An earlier run's child that ended by its last word is judged too, so that its lease goes
        # back unconfirmed with the others.
        notes = conclude_ended(state)
        return notes + settle(state, admission) + release_ended(state, admission)
    fold(state, admission)
    return []


# --- planning ----------------------------------------------------------------------------------


def route(
    state: MissionState, assignments: dict[str, Assignment], unroutable: Mapping[str, str], now: datetime,
    unsupported: Mapping[str, str] = {},
) -> Submit | None:
    """The planner's answer: routed children wait for admission (one request each, a gang in gang
    mode); the unroutable need an operator (`operator-review-required`, why in the note); the
    unsupported (a kind their executor cannot run) fail at once, with capability status
    `unsupported`: no admission, no lease, no dispatch."""
    spec = state.spec
    state.progress.children = ChildRuns(
        ChildRun(child_id=child.child_id, assignment=assignments[child.child_id],
                 request_id=admission_request_id(spec.mission_id, child.child_id))
        for child in spec.children if child.child_id in assignments
    )
    for child_id, why in unroutable.items():
        child = state.child_spec(child_id)
        state.ledger = aggregation.apply_observation(state.ledger, spec, ChildObservation(
            child_id=child_id, kind=child.kind, revision=0, observed_state="operator-review-required",
            observed_at=now, note=f"unroutable: {why}",
        ))
    for child_id, why in unsupported.items():
        child = state.child_spec(child_id)
        state.ledger = aggregation.apply_observation(state.ledger, spec, ChildObservation(
            child_id=child_id, kind=child.kind, revision=0, observed_state="failed", observed_at=now,
            exit_classification="failure", error_code=UNSUPPORTED_KIND, note=f"unsupported: {why}",
            capabilities=[Capability(name=child.kind, status="unsupported", reason=why[:500])],
        ))
    if not state.children:
        return None
    return Submit(admission_requests(state, [run.child_id for run in state.children], gang=spec.mission_id, now=now))


def admission_requests(state: MissionState, child_ids: list[str], *, gang: str, now: datetime) -> list[AdmissionRequest]:
    """One request per child, under the child's current request id; in gang mode the requests
    are one gang, named `gang` (docs/mission-spec.md, "admission")."""
    spec = state.spec
    ganged = spec.admission.mode == "gang"
    return [
        AdmissionRequest(
            request_id=state.children[child.child_id].request_id,
            orchestrator_id=spec.orchestrator_id,
            submitted_at=now,
            **child.placement(),
            gang_id=gang if ganged else None,
            gang_size=len(child_ids) if ganged else None,
        )
        for child in (state.child_spec(child_id) for child_id in child_ids)
    ]


# --- questions -------------------------------------------------------------------------------


def answered(state: MissionState, child_id: str, answer: Answer) -> None:
    """Record the answer; a gate's decides the child: approved, it is dispatched by the next pass;
    rejected, it is done (its lease goes back with that pass)."""
    if answer.outcome in ("approved-dispatch", "rejected-dispatch"):
        approved = answer.outcome == "approved-dispatch"
        state.ledger = aggregation.decide_gate(state.ledger, child_id, answer, approved=approved)
        run = state.children[child_id]
        if approved:
            run.approved = True
        else:
            run.phase = "done"
        return
    state.ledger = aggregation.record_answer(state.ledger, child_id, answer, closes=answer.outcome == "delivered")


def gates(state: MissionState, admission: AdmissionView, now: datetime) -> None:
    """Gated children (`approval.required`) that hold a current lease are asked "dispatch CHILD?"
    before anything is sent; one whose question passed its deadline ends `timed-out`."""
    if state.stop_requested:
        return
    for run in state.children.in_phase("waiting"):
        if not state.child_spec(run.child_id).gated or run.approved or run.resubmit:
            continue
        child = state.ledger.child(run.child_id)
        question = child.question
        if question is None:
            if not child.cancel_requested and admission.is_current(run.request_id):
                timeout = state.child_spec(run.child_id).answer_timeout_seconds
                question = gate_question(state.spec.mission_id, run.child_id, child.attempt, now, timeout)
                state.ledger = aggregation.ask_before_dispatch(state.ledger, run.child_id, question)
        elif overdue(question, now):
            state.ledger = aggregation.decide_gate(state.ledger, run.child_id, None, approved=False, at_deadline=True)
            run.phase = "done"


def awaiting_answers(state: MissionState) -> list[ChildLedger]:
    """Children with an open question (the `MissionAwaitingAnswer` search attribute says whether any)."""
    return [child for child in state.ledger.children if child.question is not None]


# --- folding what arrived ----------------------------------------------------------------------


def fold(state: MissionState, admission: AdmissionView) -> None:
    """Fold the new admission decisions and the observations that arrived into the ledger.
    Each decision once: folding a hundred unchanged decisions again (each aggregating the whole
    ledger) was the largest part of a pass; the new ones go as one batch."""
    new: list[tuple[str, ChildAdmission, AdmissionBackpressure | None]] = []
    for run in state.children:
        decision = admission.decisions.get(run.request_id)
        if decision is None or run.folded is decision:
            continue
        run.folded = decision
        admission_now = ChildAdmission(
            request_id=decision.request_id, state=decision.state, lease_revision=decision.lease_revision,
            revision=decision.revision, reason=decision.reason,
        )
        new.append((run.child_id, admission_now, decision.backpressure))
    if new:
        state.ledger = aggregation.apply_admissions(state.ledger, new)
    fold_observations(state)


def fold_observations(state: MissionState) -> None:
    observations, state.progress.observations = state.observations, []
    if observations:
        state.ledger = aggregation.apply_observations(state.ledger, state.spec, observations)


def observed(state: MissionState, observation: ChildObservation) -> None:
    """A child's observation arrived (by signal). A child an earlier run started ends with its
    last observation: this run has no handle to await for it."""
    state.observations.append(observation)
    if observation.attempt == state.ledger.child(observation.child_id).attempt:
        note_if_ended(state, observation.child_id, observation.observed_state)


def note_if_ended(state: MissionState, child_id: str, observed_state: str) -> None:
    run = state.children[child_id] if child_id in state.children else None
    if run is not None and run.phase == "running" and not run.followed and ends_workload(observed_state):
        run.phase = "over"


def handle_ended(state: MissionState, child_id: str) -> None:
    """The workload this run started has ended (its handle resolved)."""
    run = state.children[child_id]
    run.phase, run.followed = "over", False


def conclude_ended(state: MissionState) -> list[Action]:
    """The ends heard since the last pass. Whatever ended a workload (a failure, a terminate, a
    cancellation that could not report), the ledger must not wait for the child: without a last
    word it is `unknown`, failing closed. Judging its attempt is the pass's (`settle`)."""
    fold_observations(state)
    notes: list[Action] = []
    for event in state.unsettled:
        if isinstance(event, Gone):  # an earlier run's children, terminated or failed before their last word
            notes.extend(
                record_unknown(state, child_id, "the workload ended without a last observation (terminated or failed): "
                               "check its runtime task", event.at)
                for child_id in event.child_ids
            )
        elif not ends_workload(state.ledger.child(event.child_id).observed_state):
            how = f"failed without a last observation ({event.failure})" if event.failure else "ended without a last observation"
            notes.append(record_unknown(state, event.child_id, f"the workload {how}: check its runtime task", event.at))
    state.unsettled.clear()
    return notes


def record_unknown(state: MissionState, child_id: str, note: str, now: datetime) -> Note:
    """A child that ended without a last word is `unknown` (failing closed): the ledger must not
    wait for it."""
    child = state.ledger.child(child_id)
    state.ledger = aggregation.apply_observation(state.ledger, state.spec, ChildObservation(
        child_id=child_id, attempt=child.attempt, kind=child.kind, revision=(child.revision or 0) + 1,
        observed_state="unknown", observed_at=now, lineage=child.lineage, note=note,
    ))
    return Note(f"workload {child_id}: {note}", warning=True)


def silent_children(state: MissionState) -> list[str]:
    """Running children this run did not start (it has no handle to await): they end by their
    last observation, or, once the server says their workflow is gone, as `unknown` (`Gone`)."""
    return [run.child_id for run in state.children.in_phase("running") if not run.followed]


# --- the pass ----------------------------------------------------------------------------------


def supervise(state: MissionState, admission: AdmissionView, now: datetime) -> list[Action]:
    """One pass: fold what arrived, judge the attempts that ended, then act on the ledger."""
    actions: list[Action] = conclude_ended(state)
    fold(state, admission)
    actions += settle(state, admission)
    cancel = aggregation.children_to_cancel(state.ledger, state.spec)
    if cancel:
        state.ledger = aggregation.mark_cancel_requested(state.ledger, cancel)
        actions.append(cancel_children(state, cancel, why="fail-fast: a sibling failed"))
    lost = leases_gone(state, admission)
    withdraw = state.children.ids("withdrawing")  # given up before they ran again: their requests go
    if lost or withdraw:
        actions.append(cancel_children(state, lost + withdraw, why="admission lease lost"))
    gates(state, admission, now)
    resubmit = [run.child_id for run in state.children if run.resubmit]
    if resubmit and not state.stop_requested and not gang_still_stopping(state):
        actions.append(submit_again(state, sorted(resubmit), now))
    ready = startable(state, admission)
    if ready:
        actions.append(start(state, ready, admission))
    return actions + release_ended(state, admission)


def cancel_children(state: MissionState, child_ids: list[str], why: str) -> Cancel:
    """Running children get their workloads cancelled; those not started, their requests
    withdrawn (so they are never admitted), and they are done."""
    workloads = [cid for cid in child_ids if state.children.phase_of(cid) == "running"]
    waiting = [cid for cid in child_ids if state.children.phase_of(cid) in ("waiting", "withdrawing")]
    for child_id in waiting:
        run = state.children[child_id]
        run.phase, run.released = "done", True  # its request goes back with this cancel
    return Cancel(
        workloads=[state.workload_id(cid) for cid in workloads],
        requests=[state.children[cid].request_id for cid in waiting],
        why=why,
    )


def leases_gone(state: MissionState, admission: AdmissionView) -> list[str]:
    """Running attempts whose lease is gone (running without one is forbidden): noted with why,
    once each, for the caller to stop. Gone: the engine took it away (requeued after it expired,
    displaced, preempted; perhaps already granted again, as a new lease), or it is no longer
    provably current."""
    gone = []
    for run in state.children.in_phase("running"):
        if aggregation.stop_of(state.ledger.child(run.child_id)) is not None:
            continue  # being stopped already
        stop: AttemptStop | None = None
        if admission.interruptions(run.request_id) != run.mark:
            stop = stop_by(admission.interrupted[run.request_id])
        elif not admission.is_current(run.request_id):
            decision = admission.decisions.get(run.request_id)
            known = decision.state if decision is not None else "unknown"
            stop = stop_by(decision) if known == "preempted" and decision is not None else AttemptStop(
                kind="lapsed", policy=REQUEUE_POLICY,
                reason="lease expired" if known == "admitted" else f"lease lost (admission {known})",
            )
        if stop is not None:
            state.ledger = aggregation.mark_stopping(state.ledger, run.child_id, stop)
            gone.append(run.child_id)
    return sorted(gone)


def settle(state: MissionState, admission: AdmissionView) -> list[Action]:
    """Judge every attempt that has ended (workflows.mission.attempts): the child is done, or
    goes on as its next attempt, which starts once its lease is current."""
    notes: list[Action] = []
    for child_id in state.children.ids("over"):
        note = _attempt_over(state, state.children[child_id], admission)
        if note is not None:
            notes.append(note)
    return notes


def _attempt_over(state: MissionState, run: ChildRun, admission: AdmissionView) -> Note | None:
    child_id = run.child_id
    child = state.ledger.child(child_id)
    stop = aggregation.stop_of(child)
    closing = state.stop_requested or state.ledger.cancellation is not None or child.cancel_requested
    request_state = admission.state_of(run.request_id)
    request_ended = None if request_state in ("queued", "admitted") else str(request_state)
    judgement = aggregation.judge_attempt(child, stop, state.child_spec(child_id).budgets.max_attempts, request_ended)
    if closing or not judgement.retry:
        if stop is not None or child.stopping is not None:
            state.ledger = aggregation.close_attempt(
                state.ledger, child_id, why=judgement.why, retry=False, counts=judgement.counts,
                interrupted_by=stop.interrupted_by if stop else None, policy=stop.policy if stop else None,
                lease_timeout=stop is not None and not closing and stop.kind not in TAKEN_AWAY,
            )
            if stop is not None and not closing and request_state in ("queued", "admitted"):
                run.phase = "withdrawing"  # its request lives on (requeued): never to be admitted again
                return None
        run.phase = "done"
        return None
    admission_now = None
    if stop is not None and stop.kind == "preempted":
        # Its request has ended: the next attempt is admitted under a request of its own.
        run.request_id = admission_request_id(state.spec.mission_id, child_id, child.attempt + 1)
        run.resubmit = True
        admission_now = ChildAdmission(request_id=run.request_id)
    state.ledger = aggregation.close_attempt(
        state.ledger, child_id, why=judgement.why, retry=True, counts=judgement.counts,
        interrupted_by=stop.interrupted_by if stop else None, policy=stop.policy if stop else None,
        admission=admission_now,
    )
    run.phase = "waiting"
    return Note(f"workload {child_id} attempt {child.attempt}: {judgement.why}")


def gang_still_stopping(state: MissionState) -> bool:
    """A gang is preempted whole and admitted again whole: its new requests go together, once
    every member's preempted attempt has ended."""
    return state.spec.admission.mode == "gang" and any(
        (stop := aggregation.stop_of(state.ledger.child(run.child_id))) is not None and stop.kind == "preempted"
        for run in state.children
    )


def submit_again(state: MissionState, child_ids: list[str], now: datetime) -> Submit:
    """Preempted children go back to admission as new requests (their old ones have ended)."""
    for child_id in child_ids:
        state.children[child_id].resubmit = False
    attempt = max(state.ledger.child(child_id).attempt for child_id in child_ids)
    return Submit(admission_requests(state, child_ids, gang=f"{state.spec.mission_id}{ATTEMPT_SEPARATOR}{attempt}", now=now))


def startable(state: MissionState, admission: AdmissionView) -> list[str]:
    """Children to start now: waiting, not cancelled, their lease current, within the room left."""
    if state.stop_requested:
        return []  # stopping: what was admitted is given back, never started
    room = state.max_children_in_flight - len(state.children.ids("running"))
    ready = [
        run.child_id for run in state.children.in_phase("waiting")
        if not run.resubmit
        and (run.approved or not state.child_spec(run.child_id).gated)
        and not state.ledger.child(run.child_id).cancel_requested
        and admission.is_current(run.request_id)
    ]
    return ready[: max(0, room)]


def start(state: MissionState, child_ids: list[str], admission: AdmissionView) -> Start:
    """In the ledger and `running` before the shell starts them: their observations name them."""
    attempts = {child.child_id: child.attempt for child in state.ledger.children}
    starts = []
    for child_id in child_ids:
        run = state.children[child_id]
        decision = admission.decisions.get(run.request_id)
        lease_revision = decision.lease_revision if decision is not None else 0
        starts.append(aggregation.AttemptStart(child_id, attempts[child_id], run.request_id, lease_revision))
        run.mark = admission.interruptions(run.request_id)
        run.phase, run.followed = "running", True
    state.ledger = aggregation.start_attempts(state.ledger, starts)
    return Start(child_ids)


def release_ended(state: MissionState, admission: AdmissionView) -> list[Action]:
    """Leases of children that are done go back (once each) without confirmation: the admission
    client records each release as it sends it (undone if no singleton takes it). A done child's
    request that the engine requeued (its lease expired or was taken away before it went back) is
    withdrawn instead: left queued, it would be admitted again and held for nothing."""
    done = sorted((run for run in state.children.in_phase("done") if not run.released), key=lambda run: run.child_id)
    held = set(admission.held())
    for run in done:
        run.released = True
    actions: list[Action] = []
    if done:
        actions.append(Release([run.request_id for run in done if run.request_id in held]))
    requeued = [run.request_id for run in done if admission.state_of(run.request_id) == "queued"]
    if requeued:
        actions.append(Cancel(workloads=[], requests=requeued, why="requeued after its child was done"))
    return actions


# --- continue-as-new ---------------------------------------------------------------------------


def may_hand_over(state: MissionState, admission: AdmissionView) -> bool:
    """Nothing the next run could not take over: no release on its way, no stop under way, no end
    heard and not settled, no child waiting to start but gated ones asking, only children running
    that report by signal, whichever run is current (long-lived ones, and those with `approval`)."""
    return (
        not admission.sending
        and not state.stop_requested
        and not state.unsettled
        and not waiting(state, admission, but_asking=True)
        and all(state.child_spec(child_id).reports_by_signal for child_id in state.children.ids("running"))
    )


def take_over(state: MissionState, progress: MissionProgress) -> None:
    """Pick up where the previous run left off (the admission client restores its own part)."""
    state.progress = progress
    fold_observations(state)
    # A running child whose last observation has arrived (in an earlier run, which awaited its
    # handle, or in flight at the handover) has ended: the ledger says so.
    for child_id in state.children.ids("running"):
        note_if_ended(state, child_id, state.ledger.child(child_id).observed_state)


# --- reading the state -------------------------------------------------------------------------


def waiting(state: MissionState, admission: AdmissionView, *, but_asking: bool = False) -> bool:
    """Children that were routed but have neither ended nor been started yet; `but_asking`: not
    counting admitted ones whose gate is asking (their question, run record and lease are all
    carried, so a mission may continue as new while a person takes days to answer)."""
    return any(
        admission.state_of(run.request_id) in (None, "queued", "admitted")
        and not (but_asking and admission.state_of(run.request_id) == "admitted" and state.ledger.child(run.child_id).question is not None)
        for run in state.children.in_phase("waiting", "withdrawing")
    )


def finished(state: MissionState, admission: AdmissionView) -> bool:
    """The verdict is final and no child runs or waits: the mission closes."""
    return aggregation.is_final(state.ledger) and not state.children.ids("running") and not waiting(state, admission)


def supervision_over(state: MissionState, admission: AdmissionView) -> bool:
    """The loop ends: the mission finished, or an operator asked it to stop."""
    return state.stop_requested or finished(state, admission)


def next_wakeup(state: MissionState, admission: AdmissionView, now: datetime) -> datetime | None:
    """When to wake: at the earliest expiry of a running child's lease, to stop it if renewal
    failed, or a gate's deadline (no sooner than a second from now)."""
    moments = [
        decision.lease_expires_at
        for run in state.children.in_phase("running")
        if (decision := admission.decisions.get(run.request_id)) is not None and decision.lease_expires_at is not None
    ]
    moments += [
        question.deadline
        for run in state.children.in_phase("waiting")
        if (question := state.ledger.child(run.child_id).question) is not None and question.deadline is not None
    ]
    return max(now + timedelta(seconds=1), min(moments)) if moments else None


def progress_text(state: MissionState, admission: AdmissionView) -> str:
    """The mission's line in the Temporal UI's current details."""
    ledger = state.ledger
    summary = ledger.aggregation
    return (
        f"{ledger.parent_state}: {summary.reason} "
        f"({len(summary.successful)} ok, {len(summary.failed)} failed, {len(summary.pending)} pending, "
        f"{len(state.children.ids('running'))} running){queued_text(state, admission)}{questions_text(state)}"
    )


def questions_text(state: MissionState, at_most: int = 3) -> str:
    """The open questions, for the UI's current details (answered with `conductor mission approve`)."""
    waiting = awaiting_answers(state)
    if not waiting:
        return ""
    shown = "; ".join(f"{child.child_id} asks {child.question.prompt[:120]!r}" for child in waiting[:at_most])  # type: ignore[union-attr]
    more = f"; and {len(waiting) - at_most} more" if len(waiting) > at_most else ""
    return (
        f"; awaiting an answer: {shown}{more} (answer: conductor mission approve {state.spec.mission_id} CHILD"
        " [--reject] [--payload JSON])"
    )


def queued_text(state: MissionState, admission: AdmissionView, at_most: int = 5) -> str:
    """Where the children waiting for admission stand, as of the singleton's last word on them."""
    queued = [
        (decision.position or 0, run.child_id, decision.binding_constraint, decision.eta)
        for run in state.children.in_phase("waiting", "withdrawing")
        if (decision := admission.decisions.get(run.request_id)) is not None and decision.state == "queued"
    ]
    if not queued:
        return ""
    queue = admission_workflow_id(state.spec.host_group)
    shown = "; ".join(
        f"{child_id} at {queue_place(position, constraint, queue, eta)}"
        for position, child_id, constraint, eta in sorted(queued, key=lambda entry: entry[:2])[:at_most]
    )
    more = f"; and {len(queued) - at_most} more" if len(queued) > at_most else ""
    return f"; queued: {shown}{more}"


def stop_by(decision: AdmissionDecision) -> AttemptStop:
    """Why the engine took the lease away, from the decision that said so."""
    by = decision.related_request_id
    if "displaced" in decision.happened:
        return AttemptStop(
            kind="displaced", interrupted_by=by, policy=LANE_OVERRIDE_POLICY,
            reason=f"displaced by {by or 'a higher-priority claim'} ({LANE_OVERRIDE_POLICY})",
        )
    if "preempted" in decision.happened or decision.state == "preempted":
        return AttemptStop(
            kind="preempted", interrupted_by=by, policy=PREEMPTION_POLICY,
            reason=f"preempted by {by or 'a higher-priority request'} ({PREEMPTION_POLICY})",
        )
    return AttemptStop(kind="requeued", policy=REQUEUE_POLICY, reason="lease expired; requeued by the admission engine")
