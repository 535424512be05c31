"""The mission's verdict from its children's outcomes (`verdict_rule`, over a `Tally`), the
summary and the reason in words, and what a settled ledger says (`verdict`, `is_final`, ...).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

from workflows.mission.aggregation.outcome import dispatched, is_live, is_satisfied
from workflows.mission.ledger import (
    FINAL_PARENT_STATES,
    VERDICT_STATES,
    ChildLedger,
    ChosenOutput,
    MissionLedger,
    ParentState,
    ReviewDecision,
    VerdictState,
)
from workflows.mission.spec import MissionSpec, Quorum

_NAMES_SHOWN = 5  # ids named in a reason before "and N more": reasons stay short for 1,000 children


def successes_needed(spec: MissionSpec) -> int | None:
    mode = spec.aggregation.mode
    if mode in ("all-pass", "fail-fast"):
        return len(spec.children)
    if isinstance(spec.aggregation, Quorum):
        return spec.aggregation.minimum_successes
    return None


def verdict(ledger: MissionLedger) -> VerdictState | None:
    """The mission's verdict, or None while undecided (and for a mission cancelled before one)."""
    return ledger.parent_state if ledger.parent_state in VERDICT_STATES else None  # type: ignore[return-value]


def is_final(ledger: MissionLedger) -> bool:
    return ledger.parent_state in FINAL_PARENT_STATES


def live_children(ledger: MissionLedger) -> list[str]:
    """Children that are not known to have ended (sorted): still running, starting or waiting."""
    return sorted(c.child_id for c in ledger.children if is_live(c))


def children_to_cancel(ledger: MissionLedger, spec: MissionSpec) -> list[str]:
    """Live children the mission should cancel now and has not yet asked to (sorted).

    After a fail-fast failure: every live sibling. After `mark_cancelled`: every live child.
    Otherwise none: all-pass and quorum leave the other children to finish, best-output and
    manual-review need them all. Call `mark_cancel_requested` with what this returns once asked.
    """
    check_spec(ledger, spec)
    fail_fast = spec.aggregation.mode == "fail-fast" and ledger.parent_state == "failed"
    if not fail_fast and ledger.cancellation is None:
        return []
    return sorted(c.child_id for c in ledger.children if is_live(c) and not c.cancel_requested)


def output_score(output: str) -> int:
    """The best-output scoring rule: the longest result wins (length in characters)."""
    return len(output)


def check_spec(ledger: MissionLedger, spec: MissionSpec) -> None:
    if ledger.mission_id != spec.mission_id:
        raise ValueError(f"the ledger is for mission {ledger.mission_id} but the spec is for {spec.mission_id}")
    policy = (spec.aggregation.mode, successes_needed(spec))
    if (ledger.aggregation.mode, ledger.aggregation.required_successes) != policy:
        raise ValueError(
            f"the ledger of mission {ledger.mission_id} aggregates with {ledger.aggregation.mode} "
            f"(needs {ledger.aggregation.required_successes}) but the spec says {spec.aggregation.mode}; "
            "a mission's policy cannot change once it has a ledger"
        )
    if [c.child_id for c in ledger.children] != [c.child_id for c in spec.children]:
        raise ValueError(f"the ledger of mission {ledger.mission_id} lists other children than the spec")


def named_ids(ids: Sequence[str]) -> str:
    shown = ", ".join(ids[:_NAMES_SHOWN])
    return shown if len(ids) <= _NAMES_SHOWN else f"{shown} and {len(ids) - _NAMES_SHOWN} more"


def _kinds(kinds: Sequence[str]) -> str:
    return ", ".join(kinds)


def _phrase(child: ChildLedger) -> str:
    """What the child is doing, as part of a sentence: "child-b timed out (exit.timeout)"."""
    cid, state = child.child_id, child.observed_state
    suffix = f" ({child.error_code})" if child.error_code else ""
    admission = child.admission
    if not dispatched(child) and admission.state in ("queued", "denied"):
        why = f": {admission.reason}" if admission.reason else ""
        bp = child.backpressure
        detail = f" ({bp.reason})" if bp else ""
        verb = "is waiting for admission" if admission.state == "queued" else "was denied admission"
        return f"{cid} {verb}{detail}{why}"
    if child.outcome == "failed":
        verb = {"failed": "failed", "cancelled": "was cancelled", "timed-out": "timed out"}[state]
        return f"{cid} {verb}{suffix}"
    if child.outcome == "review-required":
        if state == "unknown":
            return f"{cid} is unknown{suffix}"
        if state == "operator-review-required":
            return f"{cid} needs operator review" + (f" ({child.note})" if child.note else suffix)
        if child.missing_evidence:
            return f"{cid} {state} without required evidence ({_kinds(child.missing_evidence)})"
        return f"{cid} ended {state}, which does not satisfy a {child.kind}"
    if child.outcome == "satisfied":
        return f"{cid} is {state}"
    if child.missing_evidence and is_satisfied(child.kind, state, child.health):
        return f"{cid} is {state} but has not produced required evidence ({_kinds(child.missing_evidence)})"
    if child.kind == "daemon" and state in ("healthy", "running"):
        return f"{cid} is {state} with health {child.health or 'not reported'}"
    return f"{cid} is {state}"


def _phrases(children: Sequence[ChildLedger]) -> str:
    shown = ", ".join(_phrase(c) for c in children[:_NAMES_SHOWN])
    return shown if len(children) <= _NAMES_SHOWN else f"{shown} and {len(children) - _NAMES_SHOWN} more"


def _best(satisfied: Sequence[ChildLedger]) -> ChosenOutput | None:
    best: ChosenOutput | None = None
    for child in satisfied:  # spec order: the first of equal scores wins
        if child.output:
            score = output_score(child.output)
            if best is None or score > best.score:
                best = ChosenOutput(child_id=child.child_id, output=child.output, score=score)
    return best


def _undecided_state(ledger: MissionLedger) -> ParentState:
    children = ledger.children
    if any(dispatched(c) or c.admission.state in ("admitted", "released", "preempted") for c in children):
        return "running"
    if any(c.admission.state != "unknown" or c.admission.request_id is not None for c in children):
        return "admitting"
    return "planning"


class Tally(NamedTuple):
    """How many children have each outcome, and how many satisfied ones produced output."""

    satisfied: int
    failed: int
    review: int
    pending: int
    with_output: int = 0

    @property
    def children(self) -> int:
        return self.satisfied + self.failed + self.review + self.pending


# Which case of the rule decided (or left undecided) the verdict; `evaluate` words each.
Case = Literal[
    "rejected", "approved-needs-review", "approved", "waiting", "awaiting-decision",
    "needs-review", "best-output", "no-output", "unreachable", "met",
]


def verdict_rule(
    mode: str, required_successes: int | None, tally: Tally, review: ReviewDecision | None,
) -> tuple[VerdictState | None, Case, bool]:
    """The verdict rule, the only one: what the children's outcomes call for under `mode`
    (None while undecided), the case that decided it, and whether completion is eligible.

    Whether a verdict is due never depends on `with_output` (a best-output mission with nothing
    pending is decided either way), so `_commit_each` asks with outcome counts alone."""
    t = tally
    if mode == "manual-review":
        eligible = not t.pending and not t.review
        if review is not None:
            if review.decision == "reject":
                return "failed", "rejected", eligible
            if t.review:
                return "operator-review-required", "approved-needs-review", eligible
            return "completed", "approved", eligible
        return None, "waiting" if t.pending else "awaiting-decision", eligible
    if mode == "best-output":
        eligible = not t.pending and not t.review and t.with_output > 0
        if t.pending:
            return None, "waiting", eligible
        if t.review:
            return "operator-review-required", "needs-review", eligible
        return ("completed", "best-output", eligible) if t.with_output else ("failed", "no-output", eligible)
    # all-pass, fail-fast, quorum: a count of satisfied children
    k = required_successes or t.children
    eligible = t.satisfied >= k and not t.review
    if t.satisfied + t.pending + t.review < k:
        return "failed", "unreachable", eligible
    if eligible:
        return "completed", "met", eligible
    if not t.pending:
        return "operator-review-required", "needs-review", eligible
    return None, "waiting", eligible


def evaluate(ledger: MissionLedger) -> tuple[VerdictState | None, str, bool, ChosenOutput | None]:
    """The verdict the children call for now (ignoring stickiness, `verdict_rule`), its reason in
    words, eligibility, and the best output."""
    summary = ledger.aggregation
    mode = summary.mode
    sat, failed, review, pending = (
        [c for c in ledger.children if c.outcome == outcome]
        for outcome in ("satisfied", "failed", "review-required", "pending")
    )
    tally = Tally(len(sat), len(failed), len(review), len(pending), sum(1 for c in sat if c.output))
    decided, case, eligible = verdict_rule(mode, summary.required_successes, tally, ledger.review)
    best = _best(sat) if mode == "best-output" else None
    return decided, _reason(ledger, case, sat, failed, review, pending, best), eligible, best


def _reason(
    ledger: MissionLedger,
    case: Case,
    sat: list[ChildLedger],
    failed: list[ChildLedger],
    review: list[ChildLedger],
    pending: list[ChildLedger],
    best: ChosenOutput | None,
) -> str:
    """The words for the case `verdict_rule` found."""
    mode = ledger.aggregation.mode
    n = len(ledger.children)
    waiting = f"waiting for {len(pending)} of {n} children: {_phrases(pending)}"
    review_needed = f"{_phrases(review)}: operator review required"
    k = ledger.aggregation.required_successes or n
    counted = f"quorum {len(sat)}/{n} (needs {k})"
    decision = ledger.review
    by_whom = f"{decision.operator} at {decision.decided_at.isoformat()}: {decision.reason}" if decision else ""
    if case == "rejected":
        return f"rejected by {by_whom}"
    if case == "approved-needs-review":
        return f"approved by {by_whom}; but {review_needed} (never counts as success, not even approved)"
    if case == "approved":
        return f"approved by {by_whom}"
    if case == "awaiting-decision":
        tally = f"{len(sat)} satisfied, {len(failed)} failed, {len(review)} need review"
        note = f"; {review_needed}, so approving cannot complete it" if review else ""
        return f"all {n} children settled ({tally}): awaiting an operator decision (approve or reject){note}"
    if case == "best-output":
        assert best is not None
        with_output = sum(1 for c in sat if c.output)
        return (
            f"best output from {best.child_id} ({best.score} characters) among {with_output} satisfied "
            f"{'child' if with_output == 1 else 'children'} with output"
        )
    if case == "no-output":
        silent = [c.child_id for c in sat]
        parts = [f"{named_ids(silent)} satisfied without output"] if silent else []
        if failed:
            parts.append(_phrases(failed))
        return f"no satisfied child produced output ({'; '.join(parts)})"
    if case == "unreachable":
        if mode == "quorum":
            possible = len(sat) + len(pending) + len(review)
            return f"{counted} unreachable: at most {possible} of {n} children can still succeed ({_phrases(failed)})"
        if mode == "fail-fast":
            siblings = [c.child_id for c in ledger.children if is_live(c)]
            cancel = f" and cancels {named_ids(siblings)}" if siblings else ""
            return f"{_phrases(failed)}: fail-fast stops the mission{cancel}"
        return f"{_phrases(failed)}: all-pass needs every child satisfied"
    if case == "met":
        if mode == "quorum":
            return f"quorum {len(sat)}/{n} met (needs {k}): {named_ids([c.child_id for c in sat])} satisfied"
        return f"all {n} children satisfied"
    if case == "needs-review":
        short = f"; {counted} counts only satisfied children" if mode == "quorum" and len(sat) < k else ""
        return review_needed + short
    # waiting
    if mode == "manual-review":
        return waiting
    if mode == "best-output":
        lead = f"; best so far {best.child_id} ({best.score} characters)" if best else ""
        prefix = f"{review_needed} once the others settle; " if review else ""
        return prefix + waiting + lead
    parts = [review_needed + " once the others settle"] if review else []
    if mode == "quorum":
        parts.append(counted + (f", {_phrases(failed)}" if failed else ""))
    parts.append(waiting)
    return "; ".join(parts)


def verdict_due(ledger: MissionLedger, outcomes: Counter[str]) -> bool:
    """Whether `verdict_rule` decides for `ledger`'s mode and review with children of these outcome counts."""
    tally = Tally(outcomes["satisfied"], outcomes["failed"], outcomes["review-required"], outcomes["pending"])
    summary = ledger.aggregation
    return verdict_rule(summary.mode, summary.required_successes, tally, ledger.review)[0] is not None


def settle(ledger: MissionLedger) -> MissionLedger:
    """Recompute the live summary; move the parent state unless it is already final."""
    outcome_of = {c.child_id: c.outcome for c in ledger.children}

    def ids(outcome: str) -> tuple[str, ...]:
        return tuple(sorted(cid for cid, o in outcome_of.items() if o == outcome))

    decided, reason, eligible, best = evaluate(ledger)
    summary = ledger.aggregation.model_copy(
        update={
            "successful": ids("satisfied"),
            "failed": ids("failed"),
            "pending": ids("pending"),
            "review_required": ids("review-required"),
            "evidence_missing": tuple(
                sorted(
                    c.child_id
                    for c in ledger.children
                    if c.missing_evidence and is_satisfied(c.kind, c.observed_state, c.health)
                )
            ),
            "completion_eligible": eligible,
            "reason": reason,
        }
    )
    update: dict[str, Any] = {"aggregation": summary}
    if ledger.parent_state not in FINAL_PARENT_STATES:
        if decided is not None:
            update |= {"parent_state": decided, "verdict_reason": reason, "best_output": best}
        else:
            awaiting = summary.mode == "manual-review" and not summary.pending
            update |= {"parent_state": "awaiting-review" if awaiting else _undecided_state(ledger), "best_output": best}
    return ledger.model_copy(update=update)
