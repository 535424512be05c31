"""Attempts through their pure parts: the retry rules (`workflows.mission.attempts.judge`), the
per-attempt ids (`workflows.ids`) and the ledger functions that number attempts
(`aggregation.start_attempt`, `mark_stopping`, `close_attempt`)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workflows.contract import Backpressure, Lineage
from workflows.ids import (
    context_id,
    verifier_message_id,
    MAX_ATTEMPT_NUMBER,
    admission_request_id,
    dispatch_id,
    fleet_child_id,
    idempotency_key,
    workload_workflow_id,
)
from workflows.mission.aggregation import (
    apply_admission,
    apply_observation,
    close_attempt,
    initial_ledger,
    mark_stopping,
    start_attempt,
)
from workflows.admission.model import LANE_OVERRIDE_POLICY, REQUEUE_POLICY
from workflows.mission.attempts import AttemptStop, judge
from workflows.mission.ledger import ChildAdmission
from workflows.mission.observation import ChildObservation
from workflows.mission.spec import ChildSpec, MissionSpec
from workflows.workload.messages import WorkloadInput
from workflows.workload.record import build_dispatch, build_verifier_run
from worker.ledger_view import render_ledger

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
REQUEUED = AttemptStop(kind="requeued", reason="lease expired; requeued by the admission engine")
DISPLACED = AttemptStop(kind="displaced", reason="displaced by m2:fix (priority-wip-override-v1)", interrupted_by="m2:fix",
                        policy=LANE_OVERRIDE_POLICY)
LAPSED = AttemptStop(kind="lapsed", reason="lease expired", policy=REQUEUE_POLICY)
PREEMPTED = AttemptStop(kind="preempted", reason="preempted by m2:fix (preemption)", interrupted_by="m2:fix")


def _judge(stop, state="cancelled", *, retryable=False, attempt=1, counted=0, budget=2):
    return judge(stop, observed_state=state, retryable_refusal=retryable, attempt=attempt, counted=counted, max_attempts=budget)


# --- the rules -----------------------------------------------------------------------------------


def test_a_lease_timeout_is_retried_while_budget_is_left_and_costs_it():
    first = _judge(REQUEUED, counted=0, budget=2)
    assert (first.retry, first.counts) == (True, True) and "1/2 used" in first.why
    last = _judge(REQUEUED, attempt=2, counted=1, budget=2)
    assert (last.retry, last.counts) == (False, True) and "retry budget exhausted (2/2 attempts)" in last.why
    assert not _judge(AttemptStop(kind="lapsed", reason="lease expired"), budget=1).retry  # the default budget


def test_a_retryable_refusal_is_retried_within_the_budget_and_a_plain_failure_never():
    assert _judge(None, "failed", retryable=True).retry
    assert not _judge(None, "failed", retryable=True, counted=1).retry
    for state in ("failed", "unknown", "operator-review-required", "timed-out", "cancelled", "succeeded"):
        assert not _judge(None, state, budget=100).retry, state


@pytest.mark.parametrize("stop", [DISPLACED, PREEMPTED])
def test_an_attempt_taken_away_is_retried_without_costing_the_budget(stop):
    judged = _judge(stop, counted=5, budget=1)  # even with the budget spent
    assert (judged.retry, judged.counts) == (True, False)
    assert not _judge(stop, attempt=MAX_ATTEMPT_NUMBER).retry  # but never past the last attempt number


@pytest.mark.parametrize("stop", [REQUEUED, DISPLACED, PREEMPTED])
def test_an_attempt_that_succeeded_before_it_was_stopped_is_not_run_again(stop):
    assert not _judge(stop, "succeeded", budget=100).retry


# --- ids -----------------------------------------------------------------------------------------


@given(st.integers(min_value=1, max_value=MAX_ATTEMPT_NUMBER), st.integers(min_value=1, max_value=MAX_ATTEMPT_NUMBER))
def test_every_attempt_has_ids_of_its_own_and_the_first_keeps_the_plain_ones(a, b):
    builds = (admission_request_id, dispatch_id, fleet_child_id, idempotency_key, workload_workflow_id,
              verifier_message_id, context_id)
    for build in builds:
        assert (build("m", "c", a) == build("m", "c", b)) == (a == b)
        assert build("m", "c", 1) == build("m", "c")


def test_a_verifier_runs_in_its_attempts_workspace_and_an_agent_keeps_one_session() -> None:
    """A retried command's verifier must not see what an earlier attempt left in the shared
    workspace (tasks of one A2A context share one); a persistent agent's session goes on."""
    def input(kind: str, attempt: int, **child: object) -> WorkloadInput:
        return WorkloadInput(mission_id="m", orchestrator_id="o", target_id="t", executor_id="e", attempt=attempt,
                             child=ChildSpec(child_id="c", kind=kind, prompt="true", **child))  # type: ignore[arg-type]

    checked = [build_dispatch(input("one-shot-command", n, verifier="true")).context_id for n in (1, 2)]
    assert checked == ["m:c:context", "m:c:attempt-2:context"]
    assert build_verifier_run(input("one-shot-command", 2, verifier="true")).context_id == checked[1]
    agent = {build_dispatch(input("persistent-agent", n)).context_id for n in (1, 2, 3)}
    assert agent == {"m:c:context"}
    assert build_dispatch(input("one-shot-command", 2)).context_id is None  # nothing shares its workspace


def test_a_child_id_that_looks_like_an_attempt_id_is_refused():
    children = [{"child_id": "c", "kind": "one-shot-command", "prompt": "true"},
                {"child_id": "c:attempt-2", "kind": "one-shot-command", "prompt": "true"}]
    with pytest.raises(ValueError, match="may not end in ':attempt-' and a number"):
        MissionSpec(mission_id="m", orchestrator_id="o", goal="g", children=children)


# --- the ledger ----------------------------------------------------------------------------------

SPEC = MissionSpec(mission_id="m", orchestrator_id="o", goal="g", children=[
    {"child_id": "c", "kind": "one-shot-command", "prompt": "true", "budgets": {"max_attempts": 2, "timeout_seconds": 60}},
])


def _observed(revision: int, state: str, attempt: int = 1, **fields) -> ChildObservation:
    lineage = Lineage(
        orchestrator_id="o", mission_id="m", dispatch_id=dispatch_id("m", "c", attempt),
        idempotency_key=idempotency_key("m", "c", attempt), child_id=fleet_child_id("m", "c", attempt),
        target_id="t", executor_id="e", runtime_id="r", task_id=f"task-{attempt}",
    )
    return ChildObservation(child_id="c", kind="one-shot-command", attempt=attempt, revision=revision,
                            observed_state=state, observed_at=T0, lineage=lineage, **fields)


def _running_attempt_1():
    ledger = apply_admission(initial_ledger(SPEC), "c", ChildAdmission(request_id="m:c", state="admitted", lease_revision=1, revision=2))
    ledger = start_attempt(ledger, "c", attempt=1, request_id="m:c", lease_revision=1)
    return apply_observation(ledger, SPEC, _observed(2, "running"))


def test_a_stopped_attempt_does_not_settle_the_verdict_and_its_retry_waits_queued():
    ledger = mark_stopping(_running_attempt_1(), "c", DISPLACED)
    ledger = apply_admission(ledger, "c", ChildAdmission(request_id="m:c", state="queued", revision=3))
    ledger = apply_observation(ledger, SPEC, _observed(3, "cancelled", exit_classification="cancelled"))
    assert ledger.child("c").outcome == "pending" and ledger.parent_state == "running"  # not failed
    ledger = close_attempt(ledger, "c", why=DISPLACED.reason, retry=True, counts=False,
                           interrupted_by="m2:fix", policy="priority-wip-override-v1")
    child = ledger.child("c")
    assert (child.attempt, child.observed_state, child.revision, child.lineage) == (2, "blocked", None, None)
    assert child.backpressure == Backpressure(reason="capacity", retryable=True) and child.outcome == "pending"
    (first,) = child.attempts
    assert first.observed_state == "cancelled" and first.task_id == "task-1" and first.retried
    assert (first.interrupted_by, first.policy, first.counts_against_budget) == ("m2:fix", "priority-wip-override-v1", False)


def test_a_started_attempt_preempted_before_its_first_word_is_judged_by_its_end_not_by_its_lease():
    # Found by the supervisor's property test: the lease of a started child went before the child
    # had reported, and the ledger showed it `cancelled` (failed: fail-fast failed the mission, and
    # a run taking over judged the child over while it still ran). It runs until it is stopped.
    ledger = apply_admission(initial_ledger(SPEC), "c", ChildAdmission(request_id="m:c", state="admitted", lease_revision=1, revision=2))
    ledger = start_attempt(ledger, "c", attempt=1, request_id="m:c", lease_revision=1)
    ledger = apply_admission(ledger, "c", ChildAdmission(request_id="m:c", state="preempted", lease_revision=1, revision=3))
    child = ledger.child("c")
    assert (child.observed_state, child.outcome, ledger.parent_state) == ("admitted", "pending", "running")
    assert child.admission.state == "preempted"
    # Not started: given back before it ran, it never runs now.
    unstarted = apply_admission(initial_ledger(SPEC), "c", ChildAdmission(request_id="m:c", state="preempted", revision=3))
    assert unstarted.child("c").observed_state == "cancelled"


def test_the_child_is_judged_by_its_last_attempt_and_late_words_of_earlier_ones_only_show_in_their_attempt():
    ledger = close_attempt(mark_stopping(_running_attempt_1(), "c", LAPSED), "c", why="lease expired", retry=True)
    ledger = apply_admission(ledger, "c", ChildAdmission(request_id="m:c", state="admitted", lease_revision=3, revision=5))
    ledger = start_attempt(ledger, "c", attempt=2, request_id="m:c", lease_revision=3)
    ledger = apply_observation(ledger, SPEC, _observed(2, "succeeded", attempt=2, exit_classification="success"))
    assert ledger.parent_state == "completed"
    late = apply_observation(ledger, SPEC, _observed(4, "cancelled"))  # attempt 1's last word, late
    child = late.child("c")
    assert (child.observed_state, child.attempt, late.parent_state) == ("succeeded", 2, "completed")
    assert [a.observed_state for a in child.attempts] == ["cancelled", "succeeded"]
    with pytest.raises(ValueError, match="attempt 3"):
        apply_observation(ledger, SPEC, _observed(1, "running", attempt=3))


def test_a_lease_timeout_without_budget_left_ends_the_child_timed_out():
    ledger = mark_stopping(_running_attempt_1(), "c", LAPSED)
    ledger = apply_observation(ledger, SPEC, _observed(3, "cancelled"))
    ledger = close_attempt(ledger, "c", why="lease expired; retry budget exhausted (2/2 attempts)", retry=False,
                           lease_timeout=True)
    child = ledger.child("c")
    assert (child.observed_state, child.error_code, child.outcome) == ("timed-out", "admission.lease_expired", "failed")
    assert ledger.parent_state == "failed" and "timed out" in ledger.verdict_reason
    assert child.attempts[0].ended.endswith("retry budget exhausted (2/2 attempts)") and not child.attempts[0].retried


def test_a_refusal_that_will_be_retried_keeps_the_child_pending_and_the_last_one_fails_it():
    busy = {"exit_classification": "failure", "error_code": "executor.busy",
            "backpressure": Backpressure(reason="capacity", retryable=True)}
    ledger = apply_observation(_running_attempt_1(), SPEC, _observed(3, "failed", **busy))
    child = ledger.child("c")
    assert child.outcome == "pending" and ledger.parent_state == "running" and "retry may succeed" in child.stopping
    ledger = close_attempt(ledger, "c", why=child.stopping, retry=True)
    ledger = apply_admission(ledger, "c", ChildAdmission(request_id="m:c", state="admitted", lease_revision=1, revision=2))
    ledger = start_attempt(ledger, "c", attempt=2, request_id="m:c", lease_revision=1)
    ledger = apply_observation(ledger, SPEC, _observed(3, "failed", attempt=2, **busy))  # the budget of 2 is spent
    assert ledger.child("c").outcome == "failed" and ledger.parent_state == "failed"
    shown = render_ledger(ledger)
    assert "attempt 1: the executor refused it" in shown and "attempt 2" in shown
