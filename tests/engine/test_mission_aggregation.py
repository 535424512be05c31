"""Mission aggregation through its public functions: policies, revisions, evidence, admission, review.

Scenarios are tables: each row gives the children's latest states and what the mission must say.
The property test at the end checks the revision reducer: whatever order a child's observations
arrive in, the child ends where applying them sorted by revision puts it.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from typing import Any, get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workflows.admission.messages import Backpressure as AdmissionBackpressure
from workflows.contract import Artifact, Backpressure, Health, Lineage, ObservedState, WorkloadKind
from workflows.mission.aggregation import (
    Tally,
    verdict_rule,
    AttemptStart,
    ReviewNotAccepted,
    aggregate,
    apply_admission,
    apply_admissions,
    apply_observation,
    apply_observations,
    apply_review,
    children_to_cancel,
    initial_ledger,
    is_final,
    is_satisfied,
    live_children,
    mark_cancel_requested,
    mark_cancelled,
    review_refusal,
    start_attempt,
    start_attempts,
    verdict,
)
from workflows.mission.ledger import ChildAdmission, MissionLedger, ReviewDecision
from workflows.mission.observation import ChildObservation
from workflows.mission.spec import MissionSpec
from worker.ledger_view import evidence_line

T0 = datetime(2026, 8, 2, 15, 0, tzinfo=timezone.utc)
SHA = "a" * 64
IDS = ["child-a", "child-b", "child-c", "child-d", "child-e"]

# A child's latest state in a scenario: (kind, observed_state, health) or a shorthand.
State = tuple[WorkloadKind, ObservedState, Health | None]
OK: State = ("one-shot-command", "succeeded", None)
RUNNING: State = ("one-shot-command", "running", None)
FAILED: State = ("one-shot-command", "failed", None)
CANCELLED: State = ("one-shot-command", "cancelled", None)
TIMED_OUT: State = ("one-shot-command", "timed-out", None)
UNKNOWN: State = ("one-shot-command", "unknown", None)
REVIEW: State = ("one-shot-command", "operator-review-required", None)
DAEMON_UP: State = ("daemon", "running", "healthy")
DAEMON_DEGRADED: State = ("daemon", "running", "degraded")
AGENT_DETACHED: State = ("persistent-agent", "detached", None)
COLLECTOR_SCHEDULED: State = ("scheduled-collector", "scheduled", None)
NOT_STARTED = None  # no observation at all


def make_spec(mode: str, kinds: list[WorkloadKind], minimum: int | None = None, **child_fields: Any) -> MissionSpec:
    aggregation: dict[str, Any] = {"mode": mode}
    if minimum is not None:
        aggregation["minimum_successes"] = minimum
    children = []
    for child_id, kind in zip(IDS, kinds):
        child: dict[str, Any] = {"child_id": child_id, "kind": kind, "prompt": "echo hi"}
        if kind == "scheduled-collector":
            child["schedule"] = "*/5 * * * *"
        child.update(child_fields.get(child_id, {}))
        children.append(child)
    return MissionSpec(
        mission_id="m-1", orchestrator_id="orch-1", goal="test", aggregation=aggregation, children=children
    )


def observation(
    child_id: str,
    revision: int,
    state: ObservedState,
    kind: WorkloadKind = "one-shot-command",
    *,
    health: Health | None = None,
    output: str | None = None,
    artifacts: list[str] = (),  # type: ignore[assignment]
    at: datetime = T0,
    **extra: Any,
) -> ChildObservation:
    return ChildObservation(
        child_id=child_id,
        kind=kind,
        revision=revision,
        observed_state=state,
        observed_at=at,
        health=health,
        output=output,
        artifacts=[Artifact(kind=k, uri=f"file:///{child_id}/{k}", sha256=SHA) for k in artifacts],
        **extra,
    )


def run_scenario(
    mode: str, states: list[State | None], minimum: int | None = None, outputs: list[str | None] | None = None
) -> tuple[MissionSpec, MissionLedger]:
    """A mission whose children last reported `states` (observed in the order given)."""
    kinds = [state[0] if state else "one-shot-command" for state in states]
    spec = make_spec(mode, kinds, minimum)
    ledger = initial_ledger(spec)
    for index, state in enumerate(states):
        if state is None:
            continue
        kind, observed, health = state
        output = outputs[index] if outputs else None
        obs = observation(IDS[index], 1, observed, kind, health=health, output=output)
        ledger = apply_observation(ledger, spec, obs)
    return spec, ledger


def review(decision: str = "approve", operator: str = "alice", reason: str = "results checked") -> ReviewDecision:
    return ReviewDecision(operator=operator, decision=decision, reason=reason, decided_at=T0 + timedelta(hours=1))


# --- satisfaction per kind ------------------------------------------------------------------------

SATISFACTION = [
    ("one-shot-command", "succeeded", None, True),
    ("one-shot-command", "running", None, False),
    ("one-shot-command", "retained", None, False),
    ("daemon", "running", "healthy", True),
    ("daemon", "healthy", "healthy", True),
    ("daemon", "healthy", None, False),
    ("daemon", "running", None, False),
    ("daemon", "running", "degraded", False),
    ("daemon", "running", "unknown", False),
    ("daemon", "degraded", "healthy", False),
    ("daemon", "succeeded", "healthy", False),
    ("persistent-agent", "retained", None, True),
    ("persistent-agent", "detached", None, True),
    ("persistent-agent", "running", None, True),
    ("persistent-agent", "starting", None, False),
    ("persistent-agent", "succeeded", None, False),
    ("scheduled-collector", "scheduled", None, True),
    ("scheduled-collector", "succeeded", None, True),
    ("scheduled-collector", "missed", None, False),
    ("scheduled-collector", "catching-up", None, False),
    ("scheduled-collector", "running", None, False),
]


@pytest.mark.parametrize("kind, state, health, expected", SATISFACTION)
def test_lifecycle_satisfaction_per_kind(kind, state, health, expected) -> None:
    assert is_satisfied(kind, state, health) is expected


@pytest.mark.parametrize("kind", get_args(WorkloadKind))
@pytest.mark.parametrize("state", ["failed", "cancelled", "timed-out", "unknown", "operator-review-required"])
@pytest.mark.parametrize("health", [None, *get_args(Health)])
def test_failure_and_review_states_never_satisfy(kind, state, health) -> None:
    assert not is_satisfied(kind, state, health)


@pytest.mark.parametrize(
    "state, satisfied, outcome",
    [
        (DAEMON_UP, True, "satisfied"),
        (DAEMON_DEGRADED, False, "pending"),
        (("daemon", "healthy", None), False, "pending"),
        (("daemon", "succeeded", "healthy"), False, "review-required"),  # a daemon that exits is not a daemon
        (AGENT_DETACHED, True, "satisfied"),
        (("persistent-agent", "succeeded", None), False, "review-required"),
        (COLLECTOR_SCHEDULED, True, "satisfied"),
        (("scheduled-collector", "missed", None), False, "pending"),
        (OK, True, "satisfied"),
        (RUNNING, False, "pending"),
    ],
)
def test_child_row_shows_satisfaction_and_outcome(state, satisfied, outcome) -> None:
    _, ledger = run_scenario("all-pass", [state])
    child = ledger.child("child-a")
    assert (child.satisfied, child.outcome) == (satisfied, outcome)


# --- all-pass -------------------------------------------------------------------------------------

ALL_PASS = [
    # name, states, parent_state, successful, failed, pending, review_required
    ("all succeeded", [OK, OK, OK], "completed", "abc", "", "", ""),
    ("long-lived children count while running", [DAEMON_UP, AGENT_DETACHED, COLLECTOR_SCHEDULED],
     "completed", "abc", "", "", ""),
    ("one still running", [OK, RUNNING, OK], "running", "ac", "", "b", ""),
    ("one not started", [OK, NOT_STARTED, OK], "running", "ac", "", "b", ""),
    ("degraded daemon is pending", [OK, DAEMON_DEGRADED], "running", "a", "", "b", ""),
    ("first failure decides at once", [FAILED, RUNNING, NOT_STARTED], "failed", "", "a", "bc", ""),
    ("cancelled is a failure", [OK, CANCELLED, OK], "failed", "ac", "b", "", ""),
    ("timed-out is a failure", [OK, OK, TIMED_OUT], "failed", "ab", "c", "", ""),
    ("unknown with the rest settled", [OK, UNKNOWN, OK], "operator-review-required", "ac", "", "", "b"),
    ("review waits for the pending", [OK, REVIEW, RUNNING], "running", "a", "", "c", "b"),
    ("a failure beats a review", [UNKNOWN, FAILED, OK], "failed", "c", "b", "", "a"),
]  # fmt: skip


def ids(letters: str) -> tuple[str, ...]:
    return tuple(f"child-{letter}" for letter in letters)


@pytest.mark.parametrize(
    "states, parent, successful, failed, pending, review_required",
    [row[1:] for row in ALL_PASS],
    ids=[row[0] for row in ALL_PASS],
)
def test_all_pass(states, parent, successful, failed, pending, review_required) -> None:
    spec, ledger = run_scenario("all-pass", states)
    summary = ledger.aggregation
    assert ledger.parent_state == parent
    assert (summary.successful, summary.failed, summary.pending, summary.review_required) == (
        ids(successful), ids(failed), ids(pending), ids(review_required),
    )  # fmt: skip
    assert summary.completion_eligible is (parent == "completed")
    assert verdict(ledger) == (parent if is_final(ledger) else None)
    assert children_to_cancel(ledger, spec) == []  # all-pass never cancels siblings


def test_all_pass_reasons_say_what_to_do() -> None:
    assert run_scenario("all-pass", [OK, OK, OK])[1].aggregation.reason == "all 3 children satisfied"
    failed = run_scenario("all-pass", [OK, TIMED_OUT, RUNNING])[1]
    assert failed.aggregation.reason == "child-b timed out: all-pass needs every child satisfied"
    assert failed.verdict_reason == failed.aggregation.reason
    review_needed = run_scenario("all-pass", [OK, UNKNOWN, OK])[1]
    assert review_needed.aggregation.reason == "child-b is unknown: operator review required"
    waiting = run_scenario("all-pass", [OK, RUNNING, DAEMON_DEGRADED])[1]
    assert waiting.aggregation.reason == (
        "waiting for 2 of 3 children: child-b is running, child-c is running with health degraded"
    )


def test_verdict_settles_while_long_lived_children_keep_running_and_then_stands() -> None:
    spec, ledger = run_scenario("all-pass", [OK, DAEMON_UP])
    assert ledger.parent_state == "completed"
    assert live_children(ledger) == ["child-b"]
    later = apply_observation(ledger, spec, observation("child-b", 2, "failed", "daemon", health="unhealthy"))
    assert later.parent_state == "completed"  # a final verdict never changes
    assert later.verdict_reason == "all 2 children satisfied"
    assert later.aggregation.failed == ("child-b",)  # the summary keeps following the children
    assert later.aggregation.reason == "child-b failed: all-pass needs every child satisfied"
    assert live_children(later) == []


# --- quorum ---------------------------------------------------------------------------------------

QUORUM = [
    # name, minimum, states, parent_state, reason
    ("met early without waiting for stragglers", 2, [OK, RUNNING, OK], "completed",
     "quorum 2/3 met (needs 2): child-a, child-c satisfied"),
    ("met despite a failure", 2, [OK, FAILED, OK], "completed", "quorum 2/3 met (needs 2): child-a, child-c satisfied"),
    ("long-lived children count", 2, [DAEMON_UP, FAILED, AGENT_DETACHED], "completed",
     "quorum 2/3 met (needs 2): child-a, child-c satisfied"),
    ("still reachable", 2, [OK, FAILED, RUNNING], "running",
     "quorum 1/3 (needs 2), child-b failed; waiting for 1 of 3 children: child-c is running"),
    ("unreachable", 2, [FAILED, RUNNING, CANCELLED], "failed",
     "quorum 0/3 (needs 2) unreachable: at most 1 of 3 children can still succeed "
     "(child-a failed, child-c was cancelled)"),
    ("met but a child is unknown", 2, [OK, UNKNOWN, OK], "operator-review-required",
     "child-b is unknown: operator review required"),
    ("only a review could reach it", 2, [OK, UNKNOWN, FAILED], "operator-review-required",
     "child-b is unknown: operator review required; quorum 1/3 (needs 2) counts only satisfied children"),
    ("unreachable even with the review", 2, [FAILED, UNKNOWN, FAILED], "failed",
     "quorum 0/3 (needs 2) unreachable: at most 1 of 3 children can still succeed "
     "(child-a failed, child-c failed)"),
    ("quorum of one", 1, [RUNNING, OK, NOT_STARTED], "completed", "quorum 1/3 met (needs 1): child-b satisfied"),
]  # fmt: skip


@pytest.mark.parametrize("minimum, states, parent, reason", [r[1:] for r in QUORUM], ids=[r[0] for r in QUORUM])
def test_quorum(minimum, states, parent, reason) -> None:
    spec, ledger = run_scenario("quorum", states, minimum=minimum)
    assert ledger.parent_state == parent
    assert ledger.aggregation.reason == reason
    assert ledger.aggregation.required_successes == minimum
    assert children_to_cancel(ledger, spec) == []


def test_quorum_met_before_a_child_turned_unknown_stays_completed() -> None:
    spec, ledger = run_scenario("quorum", [OK, RUNNING], minimum=1)
    assert ledger.parent_state == "completed"
    later = apply_observation(ledger, spec, observation("child-b", 2, "unknown"))
    assert later.parent_state == "completed"
    assert later.verdict_reason == "quorum 1/2 met (needs 1): child-a satisfied"
    assert later.aggregation.review_required == ("child-b",) and not later.aggregation.completion_eligible
    assert later.aggregation.reason == "child-b is unknown: operator review required"


# --- best-output ----------------------------------------------------------------------------------

BEST = [
    # name, states, outputs, parent_state, best child (or None)
    ("longest wins", [OK, OK, OK], ["short", "the longest one", "middle"], "completed", "child-b"),
    ("unsatisfied outputs are ignored", [FAILED, OK, CANCELLED, TIMED_OUT],
     ["x" * 100, "ok", "y" * 100, "z" * 100], "completed", "child-b"),
    ("satisfied without output is skipped", [OK, OK], [None, "something"], "completed", "child-b"),
    ("equal lengths: first in the spec wins", [OK, OK, OK], ["bb", "aa", "cc"], "completed", "child-a"),
    ("long-lived satisfied child can win", [AGENT_DETACHED, OK], ["agent report", "tiny"], "completed", "child-a"),
    ("decides only when nothing is pending", [OK, RUNNING], ["done", None], "running", "child-a"),
    ("no satisfied child produced output", [OK, FAILED], ["", "lost"], "failed", None),
    ("a child needing review blocks it", [OK, UNKNOWN], ["fine", None], "operator-review-required", "child-a"),
]  # fmt: skip


@pytest.mark.parametrize(
    "states, outputs, parent, best", [r[1:] for r in BEST], ids=[r[0] for r in BEST]
)
def test_best_output(states, outputs, parent, best) -> None:
    _, ledger = run_scenario("best-output", states, outputs=outputs)
    assert ledger.parent_state == parent
    if best is None:
        assert ledger.best_output is None
    else:
        index = IDS.index(best)
        assert ledger.best_output is not None
        assert (ledger.best_output.child_id, ledger.best_output.output) == (best, outputs[index])
        assert ledger.best_output.score == len(outputs[index])


def test_best_output_reasons() -> None:
    done = run_scenario("best-output", [OK, OK], outputs=["abc", "abcdef"])[1]
    assert done.aggregation.reason == "best output from child-b (6 characters) among 2 satisfied children with output"
    none = run_scenario("best-output", [OK, FAILED], outputs=[None, "x"])[1]
    assert none.aggregation.reason == (
        "no satisfied child produced output (child-a satisfied without output; child-b failed)"
    )
    waiting = run_scenario("best-output", [OK, RUNNING], outputs=["abc", None])[1]
    assert waiting.aggregation.reason == (
        "waiting for 1 of 2 children: child-b is running; best so far child-a (3 characters)"
    )


def test_best_output_is_fixed_with_the_verdict() -> None:
    spec, ledger = run_scenario("best-output", [OK, DAEMON_UP], outputs=["first", None])
    assert ledger.parent_state == "completed" and ledger.best_output.child_id == "child-a"
    louder = observation("child-b", 2, "running", "daemon", health="healthy", output="x" * 50)
    later = apply_observation(ledger, spec, louder)
    assert later.best_output == ledger.best_output


# --- fail-fast ------------------------------------------------------------------------------------


def test_fail_fast_first_failure_fails_and_cancels_live_siblings() -> None:
    one_shot = "one-shot-command"
    spec = make_spec("fail-fast", [one_shot, one_shot, "daemon", one_shot, one_shot])
    ledger = initial_ledger(spec)
    ledger = apply_observation(ledger, spec, observation("child-a", 1, "running"))
    ledger = apply_observation(ledger, spec, observation("child-c", 1, "running", "daemon", health="healthy"))
    ledger = apply_observation(ledger, spec, observation("child-d", 3, "succeeded"))
    ledger = apply_admission(ledger, "child-e", ChildAdmission(request_id="m-1:child-e", state="queued"))
    assert ledger.parent_state == "running" and children_to_cancel(ledger, spec) == []

    ledger = apply_observation(ledger, spec, observation("child-b", 2, "failed", error_code="exit.nonzero"))
    assert ledger.parent_state == "failed"
    assert ledger.verdict_reason == (
        "child-b failed (exit.nonzero): fail-fast stops the mission and cancels child-a, child-c, child-e"
    )
    # Every sibling that may still run: running, long-lived, waiting for admission; not the finished ones.
    assert children_to_cancel(ledger, spec) == ["child-a", "child-c", "child-e"]

    asked = mark_cancel_requested(ledger, ["child-a", "child-c", "child-e"])
    assert children_to_cancel(asked, spec) == []
    assert [c.child_id for c in asked.children if c.cancel_requested] == ["child-a", "child-c", "child-e"]

    settled = apply_observation(asked, spec, observation("child-a", 2, "cancelled"))
    settled = apply_observation(settled, spec, observation("child-c", 2, "cancelled", "daemon"))
    settled = apply_admission(settled, "child-e", ChildAdmission(request_id="m-1:child-e", state="cancelled"))
    assert settled.parent_state == "failed" and settled.verdict_reason == ledger.verdict_reason
    assert live_children(settled) == []
    assert settled.aggregation.failed == ("child-a", "child-b", "child-c", "child-e")


@pytest.mark.parametrize(
    "states, parent",
    [([OK, OK], "completed"), ([OK, RUNNING], "running"), ([OK, UNKNOWN], "operator-review-required"),
     ([UNKNOWN, RUNNING], "running")],
)  # fmt: skip
def test_fail_fast_without_a_failure_behaves_like_all_pass(states, parent) -> None:
    spec, ledger = run_scenario("fail-fast", states)
    assert ledger.parent_state == parent
    assert children_to_cancel(ledger, spec) == []


# --- cancellation ---------------------------------------------------------------------------------


def test_cancelling_before_a_verdict_ends_cancelled_and_names_live_children() -> None:
    spec, ledger = run_scenario("all-pass", [OK, RUNNING, NOT_STARTED])
    cancelled = mark_cancelled(ledger, "operator bob stopped the mission")
    assert cancelled.parent_state == "cancelled" and is_final(cancelled) and verdict(cancelled) is None
    assert cancelled.verdict_reason == cancelled.cancellation == "operator bob stopped the mission"
    assert children_to_cancel(cancelled, spec) == ["child-b", "child-c"]
    assert mark_cancelled(cancelled, "again") is cancelled
    done = apply_observation(cancelled, spec, observation("child-b", 2, "succeeded"))
    assert done.parent_state == "cancelled"


def test_cancelling_after_a_verdict_keeps_it_and_stops_long_lived_children() -> None:
    spec, ledger = run_scenario("all-pass", [OK, DAEMON_UP])
    cancelled = mark_cancelled(ledger)
    assert cancelled.parent_state == "completed" and cancelled.verdict_reason == "all 2 children satisfied"
    assert cancelled.cancellation == "mission cancelled by an operator"
    assert children_to_cancel(cancelled, spec) == ["child-b"]


# --- manual-review --------------------------------------------------------------------------------


def test_manual_review_waits_for_every_child_then_for_the_operator() -> None:
    spec, ledger = run_scenario("manual-review", [OK, RUNNING])
    assert ledger.parent_state == "running"
    assert review_refusal(ledger, spec) == (
        "child-b is still pending; a review is accepted once every child has settled (state awaiting-review)"
    )
    with pytest.raises(ReviewNotAccepted, match="child-b is still pending"):
        apply_review(ledger, spec, review())

    ledger = apply_observation(ledger, spec, observation("child-b", 2, "failed"))
    assert ledger.parent_state == "awaiting-review" and not is_final(ledger)
    assert ledger.aggregation.reason == (
        "all 2 children settled (1 satisfied, 1 failed, 0 need review): "
        "awaiting an operator decision (approve or reject)"
    )
    assert review_refusal(ledger, spec) is None


@pytest.mark.parametrize(
    "states, decision, parent",
    [
        ([OK, OK], "approve", "completed"),
        ([OK, FAILED], "approve", "completed"),  # accepting a failure is the operator's call
        ([OK, OK], "reject", "failed"),
        ([OK, UNKNOWN], "approve", "operator-review-required"),  # unknown never counts as success
        ([OK, ("one-shot-command", "operator-review-required", None)], "reject", "failed"),
    ],
)
def test_manual_review_decision(states, decision, parent) -> None:
    spec, ledger = run_scenario("manual-review", states)
    assert ledger.parent_state == "awaiting-review"
    decided = apply_review(ledger, spec, review(decision, operator="alice", reason="looked at the logs"))
    assert decided.parent_state == parent
    assert decided.review == ReviewDecision(
        operator="alice", decision=decision, reason="looked at the logs", decided_at=T0 + timedelta(hours=1)
    )
    assert "alice at 2026-08-02T16:00:00+00:00: looked at the logs" in decided.verdict_reason
    assert decided.snapshot_seq == ledger.snapshot_seq + 1


def test_manual_review_approval_cannot_complete_with_a_child_needing_review() -> None:
    spec, ledger = run_scenario("manual-review", [OK, UNKNOWN])
    decided = apply_review(ledger, spec, review("approve", reason="ship it"))
    assert decided.verdict_reason == (
        "approved by alice at 2026-08-02T16:00:00+00:00: ship it; but child-b is unknown: operator review "
        "required (never counts as success, not even approved)"
    )


def test_a_review_is_recorded_once_and_only_for_manual_review() -> None:
    spec, ledger = run_scenario("manual-review", [OK])
    decided = apply_review(ledger, spec, review())
    with pytest.raises(ReviewNotAccepted, match="already reviewed: approve by alice"):
        apply_review(decided, spec, review("reject", operator="mallory"))
    other_spec, other = run_scenario("all-pass", [OK])
    with pytest.raises(ReviewNotAccepted, match="aggregates with all-pass; only manual-review missions take a review"):
        apply_review(other, other_spec, review())


def test_review_decision_requires_operator_reason_and_aware_time() -> None:
    with pytest.raises(ValueError):
        ReviewDecision(operator="alice", decision="approve", reason="", decided_at=T0)
    with pytest.raises(ValueError):
        ReviewDecision(operator="alice", decision="maybe", reason="x", decided_at=T0)
    with pytest.raises(ValueError):
        ReviewDecision(operator="alice", decision="approve", reason="x", decided_at=datetime(2026, 1, 1))


# --- revisions ------------------------------------------------------------------------------------


def test_stale_and_out_of_order_observations_are_recorded_not_applied() -> None:
    spec = make_spec("all-pass", ["one-shot-command"])
    ledger = initial_ledger(spec)
    for revision, state in [(2, "running"), (1, "starting"), (4, "succeeded"), (3, "running"), (1, "starting")]:
        ledger = apply_observation(ledger, spec, observation("child-a", revision, state, output=f"rev {revision}"))
    child = ledger.child("child-a")
    assert (child.revision, child.observed_state, child.output) == (4, "succeeded", "rev 4")
    assert child.stale_event_revisions == (1, 3)
    assert ledger.parent_state == "completed"


def test_a_redelivered_observation_changes_nothing() -> None:
    spec = make_spec("all-pass", ["one-shot-command", "one-shot-command"])
    ledger = apply_observation(initial_ledger(spec), spec, observation("child-a", 5, "running"))
    assert apply_observation(ledger, spec, observation("child-a", 5, "running")) is ledger
    # Seen again later (observed_at differs): still the same revision, still nothing new.
    again = apply_observation(ledger, spec, observation("child-a", 5, "running", at=T0 + timedelta(minutes=3)))
    assert again is ledger and again.child("child-a").stale_event_revisions == ()


def test_same_revision_with_other_content_keeps_the_first_and_records_it() -> None:
    spec = make_spec("all-pass", ["one-shot-command"])
    ledger = apply_observation(initial_ledger(spec), spec, observation("child-a", 5, "running"))
    conflict = apply_observation(ledger, spec, observation("child-a", 5, "succeeded"))
    child = conflict.child("child-a")
    assert (child.observed_state, child.stale_event_revisions) == ("running", (5,))
    assert conflict.parent_state == "running"


def test_a_newer_observation_replaces_the_whole_record() -> None:
    spec = make_spec("all-pass", ["one-shot-command"])
    first = observation("child-a", 1, "running", output="partial", error_code="x.y", note="why")
    ledger = apply_observation(initial_ledger(spec), spec, first)
    ledger = apply_observation(ledger, spec, observation("child-a", 2, "succeeded", artifacts=["result"]))
    child = ledger.child("child-a")
    assert (child.output, child.error_code, child.note) == (None, None, None)
    assert [a.kind for a in child.artifacts] == ["result"]


def test_functions_return_new_ledgers_and_never_change_their_input() -> None:
    spec = make_spec("fail-fast", ["one-shot-command", "one-shot-command"])
    ledger = initial_ledger(spec)
    before = ledger.model_dump()
    changed = apply_observation(ledger, spec, observation("child-a", 1, "failed"))
    changed = mark_cancel_requested(changed, ["child-b"])
    changed = mark_cancelled(apply_admission(changed, "child-b", ChildAdmission(request_id="r", state="queued")))
    assert ledger.model_dump() == before
    assert changed.snapshot_seq == 4
    with pytest.raises(ValueError):
        ledger.parent_state = "completed"  # type: ignore[misc]


def test_snapshot_seq_counts_changes_only() -> None:
    spec = make_spec("all-pass", ["one-shot-command", "one-shot-command"])
    ledger = initial_ledger(spec)
    assert ledger.snapshot_seq == 0
    ledger = apply_observation(ledger, spec, observation("child-a", 1, "running"))
    ledger = apply_observation(ledger, spec, observation("child-a", 2, "running", health="healthy"))
    assert ledger.snapshot_seq == 2
    assert aggregate(ledger, spec) is ledger
    loaded = MissionLedger.model_validate_json(ledger.model_dump_json())
    assert aggregate(loaded, spec) is loaded and loaded == ledger


# --- evidence and fail-closed states ---------------------------------------------------------------


def test_missing_required_evidence_fails_closed() -> None:
    spec = make_spec(
        "all-pass", ["one-shot-command", "daemon"],
        **{"child-a": {"required_evidence": ["result", "verifier"]}, "child-b": {"required_evidence": ["log"]}},
    )  # fmt: skip
    ledger = initial_ledger(spec)
    assert ledger.child("child-a").evidence_complete is False
    ledger = apply_observation(ledger, spec, observation("child-a", 3, "succeeded", artifacts=["result", "log"]))
    ledger = apply_observation(ledger, spec, observation("child-b", 1, "running", "daemon", health="healthy"))
    a, b = ledger.child("child-a"), ledger.child("child-b")
    assert (a.satisfied, a.evidence_complete, a.missing_evidence) == (False, False, ("verifier",))
    assert a.outcome == "review-required"
    # Still running: its evidence may still come, so it is pending, not a reason to stop.
    assert (b.satisfied, b.missing_evidence, b.outcome) == (False, ("log",), "pending")
    assert ledger.aggregation.evidence_missing == ("child-a", "child-b")
    assert ledger.parent_state == "running" and not ledger.aggregation.completion_eligible
    assert ledger.aggregation.reason == (
        "child-a succeeded without required evidence (verifier): operator review required once the others settle; "
        "waiting for 1 of 2 children: child-b is running but has not produced required evidence (log)"
    )
    with_log = observation("child-b", 2, "running", "daemon", health="healthy", artifacts=["log"])
    ledger = apply_observation(ledger, spec, with_log)
    assert ledger.child("child-b").satisfied and ledger.aggregation.evidence_missing == ("child-a",)
    assert ledger.parent_state == "operator-review-required"
    assert ledger.verdict_reason == "child-a succeeded without required evidence (verifier): operator review required"


def test_complete_evidence_satisfies() -> None:
    spec = make_spec("all-pass", ["one-shot-command"], **{"child-a": {"required_evidence": ["result", "verifier"]}})
    ledger = apply_observation(
        initial_ledger(spec), spec, observation("child-a", 3, "succeeded", artifacts=["verifier", "result"])
    )
    assert ledger.child("child-a").evidence_complete and ledger.parent_state == "completed"


def test_the_ledger_says_where_each_piece_of_evidence_came_from() -> None:
    """The substrate projects `log` and `result` from the child's task (fleet.rs
    `project_task_observation`); a `verifier` artifact naming another task is the conductor's own
    verifier run; anything else was written by some observation, which the ledger does not vouch for."""
    spec = make_spec("all-pass", ["one-shot-command"], **{"child-a": {"required_evidence": ["result", "verifier"]}})
    lineage = Lineage(
        orchestrator_id="o", mission_id=spec.mission_id, dispatch_id="d", idempotency_key="k",
        child_id=f"{spec.mission_id}:child-a", target_id="t", executor_id="e", runtime_id="r", task_id="task-1",
    )  # fmt: skip
    artifacts = [
        Artifact(kind="log", uri="sandbox://tasks/task-1/artifacts/a-1", sha256=SHA),
        Artifact(kind="result", uri="sandbox://tasks/task-1/status", sha256=SHA),
        Artifact(kind="verifier", uri="sandbox://tasks/task-9/status", sha256=SHA),
        Artifact(kind="other", uri="https://example.org/report", sha256=SHA),
    ]
    obs = ChildObservation(child_id="child-a", kind="one-shot-command", revision=4, observed_state="succeeded",
                           observed_at=T0, lineage=lineage, artifacts=artifacts)  # fmt: skip
    child = apply_observation(initial_ledger(spec), spec, obs).child("child-a")
    assert [(e.kind, e.source, e.task_id) for e in child.evidence] == [
        ("log", "executor", "task-1"), ("result", "executor", "task-1"),
        ("verifier", "conductor-verifier", "task-9"), ("other", "observation", None),
    ]  # fmt: skip
    assert child.satisfied
    assert evidence_line(child) == (
        "evidence: log, result from the executor, task task-1; verifier from the conductor's verifier, task task-9; "
        "other from an observation"
    )


@pytest.mark.parametrize(
    "mode, minimum", [("all-pass", None), ("quorum", 1), ("best-output", None), ("fail-fast", None)]
)
@pytest.mark.parametrize("state", [UNKNOWN, REVIEW])
def test_unknown_and_review_states_fail_closed_in_every_mode(mode, minimum, state) -> None:
    spec, ledger = run_scenario(mode, [state, OK], minimum=minimum, outputs=["also fine, and longer", "fine"])
    assert ledger.child("child-a").satisfied is False
    assert ledger.aggregation.review_required == ("child-a",)
    assert "child-a" not in ledger.aggregation.successful
    assert ledger.parent_state == "operator-review-required"
    assert not ledger.aggregation.completion_eligible
    assert ledger.aggregation.reason.startswith("child-a ")
    assert ledger.aggregation.reason.endswith("operator review required") or "operator review required;" in (
        ledger.aggregation.reason
    )


def test_operator_review_state_names_the_note() -> None:
    spec = make_spec("all-pass", ["one-shot-command"])
    ledger = apply_observation(
        initial_ledger(spec), spec, observation("child-a", 2, "operator-review-required", note="no eligible target")
    )
    assert ledger.aggregation.reason == "child-a needs operator review (no eligible target): operator review required"


# --- admission and backpressure -------------------------------------------------------------------


def test_waiting_for_admission_shows_blocked_with_capacity_backpressure() -> None:
    spec = make_spec("all-pass", ["one-shot-command", "one-shot-command"])
    ledger = initial_ledger(spec)
    assert ledger.parent_state == "planning"
    assert ledger.child("child-a").admission == ChildAdmission(request_id=None, state="unknown", lease_revision=0)
    queued = ChildAdmission(
        request_id="m-1:child-a", state="queued", revision=1, reason="waiting on environment quota prod 1/1"
    )
    ledger = apply_admission(ledger, "child-a", queued)
    child = ledger.child("child-a")
    assert child.observed_state == "blocked"
    assert child.backpressure == Backpressure(reason="capacity", retryable=True)
    assert child.outcome == "pending" and ledger.parent_state == "admitting"
    assert ledger.aggregation.reason == (
        "waiting for 2 of 2 children: child-a is waiting for admission (capacity): waiting on environment quota "
        "prod 1/1, child-b is pending"
    )
    decision = ChildAdmission(request_id="m-1:child-a", state="admitted", lease_revision=1, revision=2)
    admitted = apply_admission(ledger, "child-a", decision)
    assert admitted.child("child-a").observed_state == "admitted" and admitted.child("child-a").backpressure is None
    assert admitted.parent_state == "running"
    assert admitted.child("child-a").admission.lease_revision == 1
    # An older decision for the same request arriving late changes nothing.
    assert apply_admission(admitted, "child-a", queued) is admitted


def test_denied_admission_is_blocked_by_policy_and_fails_the_child() -> None:
    spec = make_spec("all-pass", ["one-shot-command", "one-shot-command"])
    decision = ChildAdmission(request_id="m-1:child-b", state="denied", reason="environment quota prod is 0")
    pressure = AdmissionBackpressure(reason="policy", retryable=False)  # what AdmissionDecision.backpressure gives
    ledger = apply_admission(initial_ledger(spec), "child-b", decision, pressure)
    child = ledger.child("child-b")
    assert (child.observed_state, child.backpressure) == ("blocked", Backpressure(reason="policy", retryable=False))
    assert child.outcome == "failed" and ledger.parent_state == "failed"
    assert ledger.verdict_reason == (
        "child-b was denied admission (policy): environment quota prod is 0: all-pass needs every child satisfied"
    )
    assert live_children(ledger) == ["child-a"]


@pytest.mark.parametrize(
    "state, shown",
    # released before dispatch: given back at closing, or an ended request of an earlier mission
    # under the same id (whose children otherwise waited forever)
    [("timed-out", "timed-out"), ("cancelled", "cancelled"), ("preempted", "cancelled"), ("released", "cancelled")],
)
def test_admission_that_ends_before_dispatch_ends_the_child(state, shown) -> None:
    spec = make_spec("quorum", ["one-shot-command", "one-shot-command"], minimum=1)
    ledger = apply_admission(initial_ledger(spec), "child-a", ChildAdmission(request_id="r-a", state=state))
    assert ledger.child("child-a").observed_state == shown
    assert ledger.aggregation.failed == ("child-a",)


def test_substrate_observations_own_the_state_once_the_child_is_dispatched() -> None:
    spec = make_spec("all-pass", ["one-shot-command"])
    ledger = apply_observation(initial_ledger(spec), spec, observation("child-a", 2, "running"))
    ledger = apply_admission(ledger, "child-a", ChildAdmission(request_id="r-a", state="preempted", lease_revision=3))
    child = ledger.child("child-a")
    assert (child.observed_state, child.admission.state, child.admission.lease_revision) == ("running", "preempted", 3)


def test_backpressure_reported_by_the_substrate_is_shown() -> None:
    spec = make_spec("all-pass", ["one-shot-command"])
    pressure = Backpressure(reason="rate-limit", retryable=True, retry_after=T0 + timedelta(minutes=5))
    ledger = apply_observation(
        initial_ledger(spec), spec, observation("child-a", 1, "blocked", backpressure=pressure)
    )
    assert ledger.child("child-a").backpressure == pressure
    assert ledger.model_dump(mode="json")["children"][0]["backpressure"] == {
        "reason": "rate-limit", "retryable": True, "retry_after": "2026-08-02T15:05:00Z",
    }  # fmt: skip


# --- wiring errors --------------------------------------------------------------------------------


def test_observations_that_cannot_belong_to_the_mission_are_refused() -> None:
    spec = make_spec("all-pass", ["one-shot-command"])
    ledger = initial_ledger(spec)
    with pytest.raises(ValueError, match="has no child 'child-z'"):
        apply_observation(ledger, spec, observation("child-z", 1, "running"))
    with pytest.raises(ValueError, match="says kind 'daemon' but the spec declares 'one-shot-command'"):
        apply_observation(ledger, spec, observation("child-a", 1, "running", "daemon"))
    lineage = Lineage(
        orchestrator_id="o", mission_id="other", dispatch_id="d", idempotency_key="k", child_id="child-a",
        target_id="t", executor_id="e", runtime_id="r",
    )  # fmt: skip
    with pytest.raises(ValueError, match="belongs to another mission or child"):
        apply_observation(ledger, spec, observation("child-a", 1, "running", lineage=lineage))
    other = make_spec("quorum", ["one-shot-command"], minimum=1)
    with pytest.raises(ValueError, match="a mission's policy cannot change"):
        aggregate(ledger, other)


# --- the ledger shape ------------------------------------------------------------------------------


def test_ledger_json_has_the_documented_fields() -> None:
    _, ledger = run_scenario("all-pass", [OK, RUNNING])
    data = ledger.model_dump(mode="json")
    top = {"mission_id", "parent_state", "aggregation", "children", "best_output", "review", "snapshot_seq"}
    assert top <= set(data)
    assert {"mode", "successful", "failed", "pending", "review_required", "evidence_missing", "completion_eligible",
            "reason"} <= set(data["aggregation"])  # fmt: skip
    assert {"child_id", "kind", "lineage", "observed_state", "revision", "health", "backpressure", "artifacts",
            "stale_event_revisions", "evidence_complete", "satisfied", "output",
            "admission"} <= set(data["children"][0])  # fmt: skip
    assert set(data["children"][0]["admission"]) >= {"request_id", "state", "lease_revision"}


def test_many_children_keep_reasons_short() -> None:
    spec = MissionSpec(
        mission_id="m-big", orchestrator_id="o", goal="g",
        children=[{"child_id": f"c{i:04d}", "kind": "one-shot-command", "prompt": "x"} for i in range(1000)],
    )  # fmt: skip
    ledger = initial_ledger(spec)
    for i in range(0, 1000, 2):
        ledger = apply_observation(ledger, spec, observation(f"c{i:04d}", 1, "succeeded"))
    assert len(ledger.aggregation.successful) == 500
    assert ledger.aggregation.reason.endswith("and 495 more")
    assert len(ledger.aggregation.reason) < 300


# --- property: order does not matter ---------------------------------------------------------------

KIND_STATES: dict[str, list[str]] = {
    "one-shot-command": ["pending", "admitted", "starting", "running", "succeeded", "failed", "timed-out", "unknown"],
    "daemon": ["starting", "running", "healthy", "degraded", "restarting", "stopping", "failed", "unknown"],
    "persistent-agent": ["starting", "running", "detached", "retained", "cancelled", "operator-review-required"],
    "scheduled-collector": ["scheduled", "missed", "catching-up", "running", "succeeded", "failed"],
}


@st.composite
def child_histories(draw: st.DrawFn) -> tuple[str, list[ChildObservation]]:
    kind = draw(st.sampled_from(sorted(KIND_STATES)))
    revisions = draw(st.lists(st.integers(0, 40), min_size=1, max_size=12, unique=True))
    observations = [
        observation(
            "child-a", revision, draw(st.sampled_from(KIND_STATES[kind])), kind,  # type: ignore[arg-type]
            health=draw(st.sampled_from([None, "healthy", "degraded"])),
            output=draw(st.sampled_from([None, "", "out", f"rev {revision}"])),
            artifacts=draw(st.lists(st.sampled_from(["result", "log", "verifier"]), max_size=3, unique=True)),
            at=T0 + timedelta(seconds=revision),
        )
        for revision in revisions
    ]
    redelivered = draw(st.lists(st.sampled_from(observations), max_size=4))
    order = draw(st.permutations(observations + redelivered))
    return kind, order


@settings(max_examples=int(os.environ.get("CONDUCTOR_PROPERTY_EXAMPLES", "300")), deadline=None)
@given(child_histories())
def test_any_arrival_order_ends_in_the_state_of_the_highest_revision(
    history: tuple[str, list[ChildObservation]],
) -> None:
    kind, arrived = history
    spec = make_spec("all-pass", [kind], **{"child-a": {"required_evidence": ["result"]}})  # type: ignore[list-item]

    def replay(observations: list[ChildObservation]) -> MissionLedger:
        ledger = initial_ledger(spec)
        for obs in observations:
            ledger = apply_observation(ledger, spec, obs)
        return ledger

    shuffled = replay(arrived)
    ordered = replay(sorted({obs.revision: obs for obs in arrived}.values(), key=lambda obs: obs.revision))
    assert shuffled.child("child-a").model_copy(update={"stale_event_revisions": ()}) == ordered.child("child-a")
    assert ordered.child("child-a").stale_event_revisions == ()
    # What was recorded as stale is exactly what arrived after a higher revision had been applied.
    late = {
        obs.revision for i, obs in enumerate(arrived) if any(prior.revision > obs.revision for prior in arrived[:i])
    }
    assert set(shuffled.child("child-a").stale_event_revisions) == late
    assert shuffled.aggregation.model_dump(exclude={"reason"}) == ordered.aggregation.model_dump(exclude={"reason"})


@pytest.mark.parametrize("admission_first", [True, False])
def test_a_child_stopped_after_its_lease_expired_ends_timed_out(admission_first: bool) -> None:
    """The mission stops a child whose lease expired; the substrate reports how (cancelled),
    the ledger says why (timed-out), whichever of the two arrives first."""
    spec = make_spec("all-pass", ["one-shot-command"])
    running = apply_observation(initial_ledger(spec), spec, observation("child-a", 2, "running"))
    expired = ChildAdmission(request_id="r-a", state="timed-out", lease_revision=1, revision=4)
    stopped = observation("child-a", 3, "cancelled", exit_classification="cancelled", error_code="substrate.cancelled")
    if admission_first:
        ledger = apply_observation(apply_admission(running, "child-a", expired), spec, stopped)
    else:
        ledger = apply_admission(apply_observation(running, spec, stopped), "child-a", expired)
    child = ledger.child("child-a")
    assert (child.observed_state, child.exit_classification, child.error_code) == ("timed-out", "timeout", "admission.lease_expired")
    assert child.outcome == "failed" and ledger.parent_state == "failed"
    assert apply_observation(ledger, spec, stopped) == ledger  # redelivered: nothing new, nothing stale


def test_a_child_stopped_for_another_reason_stays_cancelled() -> None:
    spec = make_spec("all-pass", ["one-shot-command"])
    ledger = apply_observation(initial_ledger(spec), spec, observation("child-a", 2, "running"))
    ledger = apply_admission(ledger, "child-a", ChildAdmission(request_id="r-a", state="preempted", lease_revision=1))
    ledger = apply_observation(ledger, spec, observation("child-a", 3, "cancelled"))
    assert ledger.child("child-a").observed_state == "cancelled"


# --- folding a batch: the same ledger as a commit after each change -----------------------------

_MODES = ["all-pass", "fail-fast", "quorum", "best-output", "manual-review"]
_OBSERVED: list[ObservedState] = ["running", "succeeded", "failed", "cancelled", "unknown", "operator-review-required"]


@st.composite
def batch_folds(draw: st.DrawFn) -> tuple[MissionSpec, list[tuple[str, list[Any]]]]:
    """A spec and batches for its children, each of one kind as the workflow folds them:
    admission decisions, attempt starts or observations."""
    mode = draw(st.sampled_from(_MODES))
    kinds = draw(st.lists(st.sampled_from(["one-shot-command", "daemon", "persistent-agent"]), min_size=1, max_size=5))
    minimum = draw(st.integers(1, len(kinds))) if mode == "quorum" else None
    spec = make_spec(mode, kinds, minimum, **{IDS[0]: {"required_evidence": ["result"]}})
    ids = IDS[: len(kinds)]
    kind_of = dict(zip(ids, kinds))
    admission = st.tuples(
        st.sampled_from(ids),
        st.builds(
            ChildAdmission,
            request_id=st.just("r-1"),
            state=st.sampled_from(["queued", "admitted", "denied", "timed-out", "preempted", "released"]),
            lease_revision=st.integers(0, 3),
            revision=st.integers(0, 4),
        ),
        st.none(),
    )
    start = st.builds(AttemptStart, st.sampled_from(ids), st.just(1), st.just("r-1"), st.integers(0, 2))
    observed = st.sampled_from(ids).flatmap(lambda child_id: st.builds(
        observation, st.just(child_id), st.integers(1, 4), st.sampled_from(_OBSERVED), st.just(kind_of[child_id]),
        health=st.sampled_from([None, "healthy", "degraded"]), output=st.sampled_from([None, "short", "a longer output"]),
        artifacts=st.sampled_from([[], ["result"]]),
    ))  # fmt: skip
    batch = st.one_of(
        st.tuples(st.just("admissions"), st.lists(admission, max_size=8)),
        st.tuples(st.just("starts"), st.lists(start, max_size=8)),
        st.tuples(st.just("observations"), st.lists(observed, max_size=8)),
    )
    return spec, draw(st.lists(batch, min_size=1, max_size=6))


@settings(max_examples=int(os.environ.get("CONDUCTOR_PROPERTY_EXAMPLES", "300")), deadline=None)
@given(batch_folds())
def test_a_batch_folds_to_the_ledger_of_its_changes_folded_one_call_each(
    case: tuple[MissionSpec, list[tuple[str, list[Any]]]],
) -> None:
    """A batch is aggregated once, yet gives the ledger of folding its changes one call each: the
    same children, summary and `snapshot_seq`, and a verdict reached part-way sticks."""
    spec, batches = case
    batched = one_by_one = initial_ledger(spec)
    for kind, items in batches:
        if kind == "admissions":
            batched = apply_admissions(batched, items)
            for child_id, admission, backpressure in items:
                one_by_one = apply_admission(one_by_one, child_id, admission, backpressure)
        elif kind == "starts":
            batched = start_attempts(batched, items)
            for start in items:
                one_by_one = start_attempt(
                    one_by_one, start.child_id, attempt=start.attempt, request_id=start.request_id,
                    lease_revision=start.lease_revision,
                )  # fmt: skip
        else:
            batched = apply_observations(batched, spec, items)
            for obs in items:
                one_by_one = apply_observation(one_by_one, spec, obs)
        assert batched == one_by_one


def test_a_verdict_reached_part_way_through_a_batch_sticks() -> None:
    """Quorum of one: the first success (a persistent agent running) decides; its later failure in
    the same batch, and another child's, do not undo it."""
    spec = make_spec("quorum", ["persistent-agent", "one-shot-command"], 1)
    ledger = apply_observations(initial_ledger(spec), spec, [
        observation("child-a", 2, "running", "persistent-agent"),
        observation("child-a", 3, "failed", "persistent-agent"),
        observation("child-b", 2, "failed"),
    ])
    assert ledger.parent_state == "completed" and ledger.verdict_reason.startswith("quorum 1/2 met")
    assert ledger.aggregation.failed == ("child-a", "child-b") and ledger.snapshot_seq == 3


def test_folding_a_batch_that_changes_nothing_returns_the_same_ledger() -> None:
    spec = make_spec("all-pass", ["one-shot-command", "one-shot-command"])
    ledger = apply_observation(initial_ledger(spec), spec, observation("child-a", 2, "running"))
    assert apply_observations(ledger, spec, [observation("child-a", 2, "running")]) is ledger  # redelivered
    assert start_attempts(ledger, []) is ledger


REVIEWS = st.none() | st.builds(
    ReviewDecision, decision=st.sampled_from(["approve", "reject"]), operator=st.just("ops"), reason=st.just("checked"),
    decided_at=st.just(datetime(2026, 1, 1, tzinfo=timezone.utc)),
)


@settings(max_examples=int(os.environ.get("CONDUCTOR_PROPERTY_EXAMPLES", "300")), deadline=None)
@given(
    mode=st.sampled_from(["all-pass", "fail-fast", "quorum", "best-output", "manual-review"]),
    counts=st.tuples(*(st.integers(0, 4) for _ in range(4))).filter(lambda c: sum(c) > 0),
    with_output=st.integers(0, 4),
    required=st.integers(1, 4),
    review=REVIEWS,
)
def test_the_verdict_rule_decides_from_counts_alone_and_stays_decided_as_children_settle(
    mode, counts, with_output, required, review,
):
    """`_commit_each` asks whether a verdict is due from outcome counts, without outputs: the rule
    must decide alike whatever the output count, and a decided verdict must stay decided when a
    pending child settles either way (the verdict is monotone once due)."""
    satisfied, failed, review_required, pending = counts
    required_successes = min(required, sum(counts)) if mode == "quorum" else None
    tally = Tally(satisfied, failed, review_required, pending, min(with_output, satisfied))
    decided, _, _ = verdict_rule(mode, required_successes, tally, review)
    silent, _, _ = verdict_rule(mode, required_successes, tally._replace(with_output=0), review)
    assert (decided is None) == (silent is None)
    if decided is not None and pending:
        for settled in (tally._replace(pending=pending - 1, satisfied=satisfied + 1),
                        tally._replace(pending=pending - 1, failed=failed + 1)):
            assert verdict_rule(mode, required_successes, settled, review)[0] is not None
