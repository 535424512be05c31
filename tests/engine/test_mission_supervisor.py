"""The mission's supervisor (workflows/mission/supervisor.py) on plain data, no Temporal.

Random missions meet random admission news (admitted, lease taken away by preemption,
displacement or expiry, lease lapsed), children ending, a stop and passes in any order, with
hand-overs to a new run after passes where the workflow could continue as new (the state goes
through `carry` and its JSON, and children an earlier run started end by their last observation), all through `step` and `hear` as the workflow
hands them over; after every pass the lifecycle rules hold:

- a child is started only under a current lease, and never twice for one attempt;
- a running child whose lease is not current is being stopped (the ledger says why: `aggregation.stop_of`);
- a done child's lease goes back in the pass it is done in (its request withdrawn instead, if the
  engine had requeued it), and once the mission has stopped and every child has ended, every
  lease it held went back;
- a verdict, once reached, never changes.
"""

from __future__ import annotations

import os
from collections import Counter
from datetime import datetime, timedelta, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from workflows.admission.messages import AdmissionDecision, RequesterCarry
from workflows.mission import aggregation, supervisor
from workflows.mission.children import ChildRuns
from workflows.mission.dispatch import child_start
from workflows.mission.messages import MissionCarry, MissionInput
from workflows.mission.observation import ChildObservation
from workflows.mission.planning import Assignment
from workflows.mission.spec import MissionSpec
from workflows.mission.supervisor import Cancel, Ended, MissionState, Observed, Pass, Planned, Release, Start, StopAsked, Submit

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
EXAMPLES = int(os.environ.get("CONDUCTOR_PROPERTY_EXAMPLES", "120"))
HERE = Assignment(target_id="t", executor_id="e", runtime_id="r")


class Admission:
    """What a mission hears from its host group's singleton, as `AdmissionClient` keeps it."""

    def __init__(self) -> None:
        self.decisions: dict[str, AdmissionDecision] = {}
        self.interrupted: dict[str, AdmissionDecision] = {}
        self._interruptions: Counter[str] = Counter()
        self.now = T0
        self.sending = False  # unconfirmed releases on their way (the fake delivers them at once)

    def decide(self, request_id: str, state: str, *, happened: tuple[str, ...] = (), expires: timedelta | None = None) -> None:
        known = self.decisions.get(request_id)
        revision = (known.revision if known else 0) + 1
        lease = (known.lease_revision if known else 0) + (state == "admitted")
        decision = AdmissionDecision(
            request_id=request_id, state=state, revision=revision, happened=list(happened), lease_revision=lease,
            lease_expires_at=self.now + expires if expires is not None else None,
        )
        self.decisions[request_id] = decision
        if {"preempted", "displaced", "requeued"} & set(happened):
            self._interruptions[request_id] += 1
            self.interrupted[request_id] = decision

    def interruptions(self, request_id: str) -> int:
        return self._interruptions[request_id]

    def is_current(self, request_id: str) -> bool:
        decision = self.decisions.get(request_id)
        return (
            decision is not None and decision.state == "admitted"
            and decision.lease_expires_at is not None and self.now < decision.lease_expires_at
        )

    def state_of(self, request_id: str) -> str | None:
        decision = self.decisions.get(request_id)
        return None if decision is None else decision.state

    def held(self) -> list[str]:
        return sorted(rid for rid, decision in self.decisions.items() if decision.state == "admitted")


def mission(mode: str, size: int, max_attempts: int, gang: bool, daemons: bool = False) -> MissionSpec:
    """Children c0..; with `daemons`, c0, c2 and c4 are long-lived (a mission hands over while they run)."""
    return MissionSpec(
        mission_id="m", orchestrator_id="o", goal="test",
        aggregation={"mode": mode, **({"minimum_successes": 1} if mode == "quorum" else {})},
        admission={"mode": "gang"} if gang else {},
        children=[
            {"child_id": f"c{i}", "kind": "daemon" if daemons and i % 2 == 0 else "one-shot-command", "prompt": "true", "preemptible": True,
             "budgets": {"max_attempts": max_attempts, "timeout_seconds": 60}}
            for i in range(size)
        ],
    )


# Weighted towards progress (admissions, passes, ends), so that examples reach hand-overs and stops
# with leases in every state; the interruptions come often enough to meet every phase.
EVENTS = st.lists(
    st.tuples(
        st.sampled_from([
            "admit", "admit", "admit", "pass", "pass", "pass", "succeed", "succeed", "fail",
            "preempt", "displace", "requeue", "lapse", "tick",
        ]),
        st.integers(0, 5),
    ),
    min_size=20,
    max_size=60,
)


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    mode=st.sampled_from(["all-pass", "fail-fast", "best-output", "quorum"]),
    size=st.integers(1, 5),
    max_attempts=st.integers(1, 3),
    gang=st.booleans(),
    daemons=st.booleans(),
    events=EVENTS,
)
def test_children_run_only_under_current_leases_start_once_and_give_every_lease_back(mode, size, max_attempts, gang, daemons, events):
    spec = mission(mode, size, max_attempts, gang, daemons)
    state = MissionState(spec=spec, ledger=aggregation.initial_ledger(spec), max_children_in_flight=3)
    admission = Admission()
    [submitted] = supervisor.step(state, Planned({child.child_id: HERE for child in spec.children}, {}), admission, T0)
    assert isinstance(submitted, Submit) and len(submitted.requests) == size
    started: set[tuple[str, int]] = set()
    released: set[str] = set()
    verdict = None
    revision = Counter[str]()

    def run_pass() -> None:
        nonlocal verdict
        before = {run.child_id: run.phase for run in state.children}
        for action in supervisor.step(state, Pass(), admission, admission.now):
            if isinstance(action, Start):
                for child_id in action.child_ids:
                    run = state.children[child_id]
                    assert before[child_id] in ("waiting", "over"), (child_id, before[child_id])  # over: judged, then run again
                    assert admission.is_current(run.request_id), f"{child_id} started without a current lease"
                    attempt = state.ledger.child(child_id).attempt
                    assert (child_id, attempt) not in started, f"{child_id} attempt {attempt} started twice"
                    started.add((child_id, attempt))
            elif isinstance(action, Release):
                released.update(action.request_ids)
                for request_id in action.request_ids:
                    admission.decide(request_id, "released")
            elif isinstance(action, Cancel):
                for request_id in action.requests:
                    if admission.state_of(request_id) in ("queued", "admitted", None):
                        admission.decide(request_id, "cancelled")
        for run in state.children.in_phase("running"):
            being_stopped = aggregation.stop_of(state.ledger.child(run.child_id)) is not None
            assert being_stopped or admission.is_current(run.request_id), f"{run.child_id} runs without a lease"
        for run in state.children.in_phase("done"):  # given back in the pass it was done in, not at closing
            held = admission.state_of(run.request_id)
            assert held != "queued" and (held != "admitted" or run.request_id in released), (
                f"{run.child_id} is done and its request {run.request_id} is still {held}"
            )
        now_verdict = aggregation.verdict(state.ledger)
        if verdict is not None:
            assert now_verdict == verdict, f"the verdict changed from {verdict} to {now_verdict}"
        verdict = now_verdict

    def end(child_id: str, observed_state: str) -> None:
        """The way the workflow hears it: this run's child through its handle, an earlier run's by signal."""
        revision[child_id] += 1
        child = state.ledger.child(child_id)
        last = ChildObservation(
            child_id=child_id, attempt=child.attempt, kind=state.child_spec(child_id).kind, revision=revision[child_id],
            observed_state=observed_state, observed_at=admission.now, output="done" if observed_state == "succeeded" else None,
        )
        if state.children[child_id].followed:
            supervisor.hear(state, Ended(child_id, admission.now, last=last))
        else:
            supervisor.hear(state, Observed(last))
        assert state.children[child_id].phase != "running", f"{child_id} ended and still runs"

    def hand_over() -> MissionState:
        """Continue-as-new, when the workflow would: the next run starts from the carried JSON."""
        carried = MissionCarry(progress=state.progress, written_seq=0,
                               admission=RequesterCarry(decisions={}, mine=[], renew_sent={}, giving_back=[]))
        next_run = MissionState(spec=spec, ledger=aggregation.initial_ledger(spec), max_children_in_flight=3)
        supervisor.take_over(next_run, MissionCarry.model_validate_json(carried.model_dump_json()).progress)
        assert [(run.child_id, run.phase) for run in next_run.children] == [(run.child_id, run.phase) for run in state.children], ([(r.child_id, r.phase) for r in next_run.children], [(r.child_id, r.phase) for r in state.children], [(c.child_id, c.observed_state, c.attempt) for c in next_run.ledger.children])
        return next_run

    for kind, index in events:
        runs = list(state.children)
        run = runs[index % len(runs)]
        if kind == "admit" and admission.state_of(run.request_id) in (None, "queued"):
            admission.decide(run.request_id, "admitted", happened=("admitted",), expires=timedelta(minutes=5))
        elif kind in ("preempt", "displace", "requeue") and admission.state_of(run.request_id) == "admitted":
            happened = {"preempt": "preempted", "displace": "displaced", "requeue": "requeued"}[kind]
            admission.decide(run.request_id, "preempted" if kind == "preempt" else "queued", happened=(happened,))
        elif kind == "lapse":
            admission.now += timedelta(minutes=6)
        elif kind in ("succeed", "fail") and run.phase == "running":
            end(run.child_id, "succeeded" if kind == "succeed" else "failed")
        elif kind == "tick":
            admission.now += timedelta(seconds=1)
        elif kind == "pass":
            run_pass()
            if index % 2 and supervisor.may_hand_over(state, admission):  # continue-as-new, when the workflow could
                state = hand_over()

    # Stop: whatever runs ends (cancelled), the passes settle it, and every lease goes back.
    supervisor.hear(state, StopAsked())
    run_pass()
    for run in state.children.in_phase("running"):
        end(run.child_id, "cancelled")
    run_pass()
    assert not state.children.ids("running", "over"), [(run.child_id, run.phase) for run in state.children]
    for run in state.children:
        if run.phase == "done" and admission.state_of(run.request_id) == "admitted":
            assert run.request_id in released, f"{run.child_id}'s lease {run.request_id} was never given back"


def test_a_carried_child_run_keeps_what_the_mission_decided_and_drops_what_the_run_knew():
    spec = mission("all-pass", 2, 2, False)
    state = MissionState(spec=spec, ledger=aggregation.initial_ledger(spec), max_children_in_flight=3)
    admission = Admission()
    supervisor.step(state, Planned({child.child_id: HERE for child in spec.children}, {}), admission, T0)
    admission.decide("m:c0", "admitted", happened=("admitted",), expires=timedelta(minutes=5))
    [start] = [action for action in supervisor.step(state, Pass(), admission, T0) if isinstance(action, Start)]
    assert start.child_ids == ["c0"]
    carried = ChildRuns(type(run).model_validate_json(run.model_dump_json()) for run in state.children.records())
    assert [(run.child_id, run.phase, run.followed) for run in carried] == [("c0", "running", False), ("c1", "waiting", False)]
    assert carried["c0"].folded is None and state.children["c0"].folded is not None


def test_a_childs_start_says_how_it_outlives_the_run_which_attempt_it_is_and_what_operators_search_by():
    spec = mission("all-pass", 2, 2, False, daemons=True)  # c0 a daemon, c1 a one-shot command
    state = MissionState(spec=spec, ledger=aggregation.initial_ledger(spec), max_children_in_flight=3)
    supervisor.step(state, Planned({child.child_id: HERE for child in spec.children}, {}), Admission(), T0)
    plain = MissionInput(spec=spec, search_attributes=False, alive_every_seconds=60)

    daemon = child_start(state, "c0", parent_id="mission:m", mission=plain)
    assert daemon.outlives_run and daemon.input.report_to_mission_by_signal and daemon.input.watch_max_seconds == 60
    assert (daemon.workflow_id, daemon.summary, daemon.search_attributes) == ("workload:m:c0", "daemon c0 on t", None)

    command = child_start(state, "c1", parent_id="mission:m", mission=plain.model_copy(update={"search_attributes": True}))
    assert not command.outlives_run and not command.input.report_to_mission_by_signal
    assert {pair.key.name: pair.value for pair in command.search_attributes} == {
        "MissionId": "m", "MissionHostGroup": "default", "WorkloadKind": "one-shot-command", "WorkloadState": "admitted",
    }
    state.ledger = aggregation.close_attempt(state.ledger, "c1", why="lease expired", retry=True)
    retry = child_start(state, "c1", parent_id="mission:m", mission=plain)
    assert (retry.input.attempt, retry.summary) == (2, "one-shot-command c1 on t (attempt 2)")
    assert retry.workflow_id != command.workflow_id
