"""The ledger reducer: every change to a mission's ledger (observations, admissions, attempts,
reviews, refusals, cancellation), each returning a new, aggregated ledger with `snapshot_seq`
moved exactly when something changed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from workflows.admission.messages import Backpressure as AdmissionBackpressure
from workflows.contract import (
    REVIEW_REQUIRED_STATES,
    TERMINAL_OBSERVED_STATES,
    Backpressure,
)
from workflows.inbound import MAX_REFUSALS_KEPT, Refusal
from workflows.mission.aggregation.outcome import attempt_started, dispatched, refresh
from workflows.mission.aggregation.verdict import (
    check_spec,
    evaluate,
    named_ids,
    settle,
    successes_needed,
    verdict_due,
)
from workflows.mission.attempts import STOP_KIND_OF_POLICY, AttemptStop, Judgement, judge
from workflows.mission.ledger import (
    FINAL_PARENT_STATES,
    AggregationSummary,
    ChildAdmission,
    ChildAttempt,
    ChildLedger,
    MissionLedger,
    ReviewDecision,
)
from workflows.mission.observation import ChildObservation
from workflows.mission.questions import APPROVAL_TIMEOUT_CODE, GATE_REJECTED_CODE, Answer, Question, with_answer
from workflows.mission.spec import MissionSpec
from workflows.workload.record import fleet_child_id

# Admission states after which a child that never reached the substrate will not run.
LEASE_EXPIRED = "admission.lease_expired"
# Fields of an observation that make up its content (observed_at is when it was seen, not what).
_OBSERVED_FIELDS = (
    "lineage", "observed_state", "health", "backpressure", "exit_classification", "error_code", "note", "output",
    "question",
)  # fmt: skip
_WAITING_FOR_CAPACITY = Backpressure(reason="capacity", retryable=True)
_AWAITING_APPROVAL = Backpressure(reason="approval", retryable=False)
_DENIED_BY_POLICY = Backpressure(reason="policy", retryable=False)


class ReviewNotAccepted(ValueError):
    """A review decision that cannot be applied now; the message says why and what to do."""


def initial_ledger(spec: MissionSpec) -> MissionLedger:
    """Every child pending and not yet submitted for admission; parent `planning`; snapshot 0."""
    children = tuple(
        refresh(
            ChildLedger(child_id=c.child_id, kind=c.kind, required_evidence=tuple(dict.fromkeys(c.required_evidence)))
        )
        for c in spec.children
    )
    ledger = MissionLedger(
        mission_id=spec.mission_id,
        parent_state="planning",
        aggregation=AggregationSummary(mode=spec.aggregation.mode, required_successes=successes_needed(spec)),
        children=children,
    )
    return settle(ledger).model_copy(update={"snapshot_seq": 0})


def _commit(before: MissionLedger, after: MissionLedger) -> MissionLedger:
    """Aggregate `after`; return `before` itself if nothing changed, else the result with seq + 1.
    For changes to the ledger as a whole (a review, a cancellation); a change to children goes
    through `_commit_each`."""
    settled = settle(after)
    if settled.model_copy(update={"snapshot_seq": before.snapshot_seq}) == before:
        return before
    return settled.model_copy(update={"snapshot_seq": before.snapshot_seq + 1})


ChildChange = Callable[[ChildLedger], ChildLedger]


def _commit_each(before: MissionLedger, changes: Iterable[tuple[str, ChildChange]]) -> MissionLedger:
    """Apply child changes in order, with exactly the ledger that a `_commit` after each would give.
    Every function here that changes one child at a time goes through it, alone or in a batch.

    Committing each change alone aggregates the whole ledger every time: a batch of n changes to a
    mission of n children cost O(n^2), half a second of workflow CPU to fold 1,000 admission decisions
    (`bench/ledger_fold.py`), all inside one workflow task. Here each change that alters its child
    still counts one `snapshot_seq`, and a verdict reached part-way still sticks (the parent state,
    reason and best output of that moment), but whether a verdict is due is read off running
    outcome counts, and the whole ledger is aggregated at most twice: where a verdict is reached,
    and at the end.

    Relies on what every function here returns: an aggregated ledger (so an unchanged child
    leaves the ledger unchanged). `tests/engine/test_mission_aggregation.py` checks that a batch gives
    the ledger of its changes folded one call each, on random batches.
    """
    position = {child.child_id: index for index, child in enumerate(before.children)}
    children = list(before.children)
    outcomes = Counter(child.outcome for child in children)
    seq = before.snapshot_seq
    verdict_at: dict[str, Any] = {}
    final = before.parent_state in FINAL_PARENT_STATES
    for child_id, change in changes:
        if child_id not in position:
            before.child(child_id)  # raises ValueError: the mission has no such child
        index = position[child_id]
        old = children[index]
        new = change(old)
        if new is old or new == old:
            continue
        children[index] = new
        seq += 1
        outcomes[old.outcome] -= 1
        outcomes[new.outcome] += 1
        if not final and verdict_due(before, outcomes):
            decided, reason, _, best = evaluate(before.model_copy(update={"children": tuple(children)}))
            verdict_at = {"parent_state": decided, "verdict_reason": reason, "best_output": best}
            final = True
    if seq == before.snapshot_seq:
        return before
    after = before.model_copy(update={"children": tuple(children), **verdict_at})
    return settle(after).model_copy(update={"snapshot_seq": seq})


def _as_stopped_by_lease_expiry(child: ChildLedger) -> ChildLedger:
    """A dispatched child whose lease expired, and which was then stopped, ended `timed-out`: the
    policy's lease timeout is why it ended; `cancelled` (what the substrate reports) is only how."""
    if child.admission.state == "timed-out" and dispatched(child) and child.observed_state == "cancelled":
        return child.model_copy(update={
            "observed_state": "timed-out", "exit_classification": "timeout", "error_code": LEASE_EXPIRED,
            "note": "stopped: its admission lease expired (no renewal reached the admission workflow in time)",
        })
    return child


def apply_observation(ledger: MissionLedger, spec: MissionSpec, obs: ChildObservation) -> MissionLedger:
    """Reduce one child observation by revision (newer replaces, older is recorded), then aggregate.

    Raises ValueError for an observation that cannot belong to this mission (unknown child, a kind
    other than the spec's, lineage naming another mission or child): that is a wiring bug, not data.
    """
    return apply_observations(ledger, spec, [obs])


def apply_observations(ledger: MissionLedger, spec: MissionSpec, observations: Iterable[ChildObservation]) -> MissionLedger:
    """`apply_observation` of each in turn, aggregated once (`_commit_each`)."""
    check_spec(ledger, spec)
    return _commit_each(ledger, ((obs.child_id, _observed(ledger.mission_id, spec, obs)) for obs in observations))


def _observed(mission_id: str, spec: MissionSpec, obs: ChildObservation) -> ChildChange:
    def change(child: ChildLedger) -> ChildLedger:
        if obs.kind != child.kind:
            raise ValueError(
                f"observation of {obs.child_id} says kind {obs.kind!r} but the spec declares {child.kind!r}; "
                "the WorkloadWorkflow must report the kind it was started with"
            )
        expected = (mission_id, fleet_child_id(mission_id, obs.child_id, obs.attempt))
        if obs.lineage is not None and (obs.lineage.mission_id, obs.lineage.child_id) != expected:
            raise ValueError(
                f"observation of {obs.child_id} (attempt {obs.attempt}) carries lineage for mission "
                f"{obs.lineage.mission_id} child {obs.lineage.child_id}; it belongs to another mission or child, or to another attempt"
            )
        if obs.attempt > child.attempt:
            raise ValueError(
                f"observation of {obs.child_id} is of attempt {obs.attempt}, but the ledger is at attempt "
                f"{child.attempt}; the mission starts an attempt in the ledger before it runs it"
            )
        if obs.attempt < child.attempt:
            # A late word from an earlier attempt: it no longer judges the child, but its attempt shows it.
            return _observe_attempt(child, obs)
        observed = _as_stopped_by_lease_expiry(child.model_copy(
            update={
                **{name: getattr(obs, name) for name in _OBSERVED_FIELDS},
                "capabilities": tuple(obs.capabilities),
                "revision": obs.revision,
                "observed_at": obs.observed_at,
                "artifacts": tuple(obs.artifacts),
            }
        ))
        if child.revision is None or obs.revision > child.revision:
            return refresh(_awaiting_retry(_observe_attempt(observed, obs), spec))
        if obs.revision == child.revision and all(getattr(child, f) == getattr(observed, f) for f in (*_OBSERVED_FIELDS, "artifacts")):
            return child  # redelivered: nothing new
        stale = tuple(sorted(set(child.stale_event_revisions) | {obs.revision}))
        if stale == child.stale_event_revisions:
            return child
        return refresh(child.model_copy(update={"stale_event_revisions": stale}))

    return change


def _contract_backpressure(value: Backpressure | AdmissionBackpressure | None) -> Backpressure | None:
    if value is None or isinstance(value, Backpressure):
        return value
    return Backpressure(reason=value.reason, retryable=value.retryable)


def apply_admission(
    ledger: MissionLedger,
    child_id: str,
    admission: ChildAdmission,
    backpressure: Backpressure | AdmissionBackpressure | None = None,
) -> MissionLedger:
    """Record the child's admission decision, then aggregate.

    A decision with a lower record `revision` than the one held for the same request is ignored.
    Before the substrate has reported the child, the admission also sets what the child shows
    (see the module docstring); `backpressure` overrides the default one for queued/denied (pass
    `AdmissionDecision.backpressure`). After that, substrate observations own the child's state:
    a preempted lease reaches the mission as the child's cancelled observation.
    """
    return apply_admissions(ledger, [(child_id, admission, backpressure)])


def apply_admissions(
    ledger: MissionLedger,
    decisions: Iterable[tuple[str, ChildAdmission, Backpressure | AdmissionBackpressure | None]],
) -> MissionLedger:
    """`apply_admission` of each (child id, admission, backpressure) in turn, aggregated once."""
    return _commit_each(ledger, ((child_id, _admitted(admission, backpressure)) for child_id, admission, backpressure in decisions))


def _admitted(admission: ChildAdmission, backpressure: Backpressure | AdmissionBackpressure | None) -> ChildChange:
    def change(child: ChildLedger) -> ChildLedger:
        held = child.admission
        if admission.request_id == held.request_id and admission.revision < held.revision:
            return child
        update: dict[str, Any] = {"admission": admission}
        if not dispatched(child) and not attempt_started(child) and not _shown_by_gate(child, admission):
            # A started attempt that has not reported yet is judged by its end, not by its
            # lease: one preempted before its first observation still runs until it is stopped.
            update |= _admission_shown(admission, backpressure)
        return refresh(_as_stopped_by_lease_expiry(child.model_copy(update=update)))

    return change


def _observe_attempt(child: ChildLedger, obs: ChildObservation) -> ChildLedger:
    """The observation's attempt, as the attempt list shows it (its newest revision wins)."""
    attempts = list(child.attempts)
    for index, attempt in enumerate(attempts):
        if attempt.attempt == obs.attempt:
            task_id = obs.lineage.task_id if obs.lineage is not None else None
            update: dict[str, Any] = {"observed_state": obs.observed_state, "error_code": obs.error_code}
            if task_id is not None:
                update["task_id"] = task_id
            if attempt.ended is None and obs.observed_state in TERMINAL_OBSERVED_STATES | REVIEW_REQUIRED_STATES:
                update["ended"] = f"ended {obs.observed_state}" + (f" ({obs.error_code})" if obs.error_code else "")
            attempts[index] = attempt.model_copy(update=update)
            return child.model_copy(update={"attempts": tuple(attempts)})
    return child


def _awaiting_retry(child: ChildLedger, spec: MissionSpec) -> ChildLedger:
    """An attempt that ended in a way the retry rules try again (an executor refusal that says a
    retry may succeed, with budget left) does not judge the child: the mission runs the next
    attempt (`close_attempt`), so until then the child stays pending, never failed for a moment."""
    if child.stopping is not None or not child.attempts or child.observed_state not in TERMINAL_OBSERVED_STATES:
        return child
    max_attempts = next(c.budgets.max_attempts for c in spec.children if c.child_id == child.child_id)
    judged = judge_attempt(child, None, max_attempts)
    return child.model_copy(update={"stopping": judged.why}) if judged.retry else child


def judge_attempt(
    child: ChildLedger, stop: AttemptStop | None, max_attempts: int, request_ended: str | None = None,
) -> Judgement:
    """`workflows.mission.attempts.judge` for the child's current attempt, as its ledger row has it."""
    backpressure = child.backpressure
    return judge(
        stop,
        observed_state=child.observed_state,
        retryable_refusal=backpressure is not None and backpressure.retryable,
        attempt=child.attempt,
        counted=sum(1 for a in child.attempts if a.attempt < child.attempt and a.counts_against_budget),
        max_attempts=max_attempts,
        request_ended=request_ended,
        unanswered=child.error_code == APPROVAL_TIMEOUT_CODE and bool(child.attempts),
    )


def start_attempt(
    ledger: MissionLedger, child_id: str, *, attempt: int, request_id: str | None, lease_revision: int,
) -> MissionLedger:
    """The mission starts the child's current attempt (under the lease it holds now): listed once."""
    return start_attempts(ledger, [AttemptStart(child_id, attempt, request_id, lease_revision)])


class AttemptStart(NamedTuple):
    child_id: str
    attempt: int
    request_id: str | None
    lease_revision: int


def start_attempts(ledger: MissionLedger, starts: Iterable[AttemptStart]) -> MissionLedger:
    """`start_attempt` of each in turn, aggregated once."""
    return _commit_each(ledger, ((start.child_id, _started(ledger.mission_id, start)) for start in starts))


def _started(mission_id: str, start: AttemptStart) -> ChildChange:
    def change(child: ChildLedger) -> ChildLedger:
        if start.attempt != child.attempt:
            raise ValueError(
                f"{start.child_id} is at attempt {child.attempt}, not {start.attempt}; start the current attempt"
            )
        if attempt_started(child):
            return child
        entry = ChildAttempt(
            attempt=start.attempt, request_id=start.request_id, lease_revision=start.lease_revision,
            fleet_child_id=fleet_child_id(mission_id, start.child_id, start.attempt),
        )
        return child.model_copy(update={"attempts": (*child.attempts, entry)})

    return change


def mark_stopping(ledger: MissionLedger, child_id: str, stop: AttemptStop) -> MissionLedger:
    """The mission is stopping the child's current attempt, whose lease went: why
    (`ChildLedger.stopping`), and by which policy and request (on the attempt's entry). The
    ledger is where this lives: `stop_of` reads it back."""

    def stopping(child: ChildLedger) -> ChildLedger:
        attempts = list(child.attempts)
        if attempts and attempts[-1].attempt == child.attempt:
            attempts[-1] = attempts[-1].model_copy(update={"interrupted_by": stop.interrupted_by, "policy": stop.policy})
        return refresh(child.model_copy(update={"stopping": stop.reason, "attempts": tuple(attempts)}))

    return _commit_each(ledger, [(child_id, stopping)])


def stop_of(child: ChildLedger) -> AttemptStop | None:
    """The stop the mission is carrying out on the child's current attempt, as `mark_stopping`
    recorded it; None when none is (a `stopping` without a policy is an executor's refusal
    waiting for its retry, which the mission did not stop)."""
    current = child.attempts[-1] if child.attempts and child.attempts[-1].attempt == child.attempt else None
    if child.stopping is None or current is None or current.policy is None:
        return None
    return AttemptStop(
        kind=STOP_KIND_OF_POLICY.get(current.policy, "requeued"), reason=child.stopping,
        interrupted_by=current.interrupted_by, policy=current.policy,
    )


def close_attempt(
    ledger: MissionLedger,
    child_id: str,
    *,
    why: str,
    retry: bool,
    counts: bool = True,
    interrupted_by: str | None = None,
    policy: str | None = None,
    lease_timeout: bool = False,
    admission: ChildAdmission | None = None,
) -> MissionLedger:
    """Record why the current attempt ended. `retry`: the child goes on as its next attempt,
    shown as a child that has not run yet (its admission, or `admission` for a new request,
    says where it stands: queued while it waits to be admitted again), and is judged by that
    attempt from now on. `lease_timeout` (not retried): the mission stopped it because its lease
    expired, so it ended `timed-out`, whatever the substrate says its stopped task did."""

    def closed(child: ChildLedger) -> ChildLedger:
        if admission is not None:
            child = child.model_copy(update={"admission": admission})
        attempts = list(child.attempts)
        if attempts and attempts[-1].attempt == child.attempt:
            attempts[-1] = attempts[-1].model_copy(update={
                "ended": why, "retried": retry, "counts_against_budget": counts,
                "interrupted_by": interrupted_by, "policy": policy,
            })
        update: dict[str, Any] = {"attempts": tuple(attempts), "stopping": None}
        if retry:
            fresh = ChildLedger(child_id=child.child_id, kind=child.kind, required_evidence=child.required_evidence)
            update |= {
                name: getattr(fresh, name)
                for name in (*_OBSERVED_FIELDS, "revision", "observed_at", "artifacts", "stale_event_revisions")
            }
            update |= {"attempt": child.attempt + 1}
            update |= _admission_shown(child.admission, None)
        elif lease_timeout and child.observed_state not in ("succeeded", "timed-out"):
            update |= {
                "observed_state": "timed-out", "exit_classification": "timeout", "error_code": LEASE_EXPIRED,
                "note": f"stopped: {why}",
            }
        return refresh(child.model_copy(update=update))

    return _commit_each(ledger, [(child_id, closed)])


def _shown_by_gate(child: ChildLedger, admission: ChildAdmission) -> bool:
    """What a gated child shows is its gate's while the gate holds it (admitted, asking) or after
    it refused or timed out the child: its lease going back says nothing new."""
    asking = child.question is not None and child.question.source == "gate" and admission.state == "admitted"
    return asking or child.error_code in (GATE_REJECTED_CODE, APPROVAL_TIMEOUT_CODE)


def _admission_shown(admission: ChildAdmission, backpressure: Backpressure | AdmissionBackpressure | None) -> dict[str, Any]:
    """What a child the substrate has not reported shows, from its admission alone."""
    shown = _contract_backpressure(backpressure)
    if admission.state == "queued":
        return {"observed_state": "blocked", "backpressure": shown or _WAITING_FOR_CAPACITY}
    if admission.state == "denied":
        return {"observed_state": "blocked", "backpressure": shown or _DENIED_BY_POLICY}
    if admission.state == "admitted":
        return {"observed_state": "admitted", "backpressure": None}
    if admission.state == "timed-out":
        return {"observed_state": "timed-out", "backpressure": None}
    if admission.state in ("cancelled", "preempted", "released"):
        # Given back before it ran (released: by this mission at closing, or an ended request
        # of an earlier mission under the same id): it never runs now.
        return {"observed_state": "cancelled", "backpressure": None}
    return {}


# --- questions (workflows.mission.questions) -----------------------------------------------------


def ask_before_dispatch(ledger: MissionLedger, child_id: str, question: Question) -> MissionLedger:
    """A gate's question: the child is admitted, holds its lease and is not dispatched until it is answered."""

    def asked(child: ChildLedger) -> ChildLedger:
        return refresh(child.model_copy(update={
            "question": question, "observed_state": "blocked", "backpressure": _AWAITING_APPROVAL,
            "note": f"admitted; waiting for an answer to {question.prompt!r} before anything is dispatched",
        }))

    return _commit_each(ledger, [(child_id, asked)])


def record_answer(ledger: MissionLedger, child_id: str, answer: Answer, *, closes: bool) -> MissionLedger:
    """Keep an operator's answer; `closes`: the question is answered (delivered, or a gate decided)."""

    def answered(child: ChildLedger) -> ChildLedger:
        update: dict[str, Any] = {"answers": with_answer(child.answers, answer)}
        if closes and child.question is not None and child.question.prompt_id == answer.prompt_id:
            update["question"] = None
        return refresh(child.model_copy(update=update))

    return _commit_each(ledger, [(child_id, answered)])


def decide_gate(ledger: MissionLedger, child_id: str, answer: Answer | None, *, approved: bool, at_deadline: bool = False) -> MissionLedger:
    """A gate answered (its `answer` recorded) or past its deadline: approved, the child shows
    `admitted` again and is dispatched next; rejected, it ends `cancelled` with policy
    backpressure (never retried); unanswered in time, `timed-out`."""

    def decided(child: ChildLedger) -> ChildLedger:
        update: dict[str, Any] = {"question": None}
        if answer is not None:
            update["answers"] = with_answer(child.answers, answer)
        who = f" by {answer.operator}" if answer is not None else ""
        if approved:
            update |= {"observed_state": "admitted", "backpressure": None, "note": f"dispatch approved{who}"}
        elif at_deadline:
            update |= {
                "observed_state": "timed-out", "exit_classification": "timeout", "error_code": APPROVAL_TIMEOUT_CODE,
                "backpressure": None, "note": "not dispatched: nobody approved it before the question's deadline",
            }
        else:
            comment = answer.payload.get("comment") if answer is not None else None
            update |= {
                "observed_state": "cancelled", "exit_classification": "cancelled", "error_code": GATE_REJECTED_CODE,
                "backpressure": _DENIED_BY_POLICY,
                "note": f"dispatch rejected{who}" + (f": {comment}" if isinstance(comment, str) and comment else ""),
            }
        return refresh(child.model_copy(update=update))

    return _commit_each(ledger, [(child_id, decided)])


def review_refusal(ledger: MissionLedger, spec: MissionSpec) -> str | None:
    """Why a review decision cannot be accepted now (None when it can). For update validators."""
    check_spec(ledger, spec)
    if spec.aggregation.mode != "manual-review":
        return (
            f"mission {ledger.mission_id} aggregates with {spec.aggregation.mode}; "
            "only manual-review missions take a review"
        )
    if ledger.review is not None:
        done = ledger.review
        return (
            f"mission {ledger.mission_id} was already reviewed: {done.decision} by {done.operator} at "
            f"{done.decided_at.isoformat()}; a review is recorded once"
        )
    if ledger.parent_state in FINAL_PARENT_STATES:
        return f"mission {ledger.mission_id} is already {ledger.parent_state}; there is nothing left to review"
    pending = [c.child_id for c in ledger.children if c.outcome == "pending"]
    if pending:
        return (
            f"{named_ids(pending)} {'is' if len(pending) == 1 else 'are'} still pending; a review is accepted "
            "once every child has settled (state awaiting-review)"
        )
    return None


def apply_review(ledger: MissionLedger, spec: MissionSpec, review: ReviewDecision) -> MissionLedger:
    """Record the operator's decision on a manual-review mission and decide the verdict.

    Raises `ReviewNotAccepted` (see `review_refusal`) when the mission is not manual-review, is
    already decided or reviewed, or still has pending children: a reviewer must see every result.
    """
    refusal = review_refusal(ledger, spec)
    if refusal is not None:
        raise ReviewNotAccepted(refusal)
    return _commit(ledger, ledger.model_copy(update={"review": review}))


def record_refusal(ledger: MissionLedger, refusal: Refusal) -> MissionLedger:
    """A signal the mission did not act on, kept for operators (the newest MAX_REFUSALS_KEPT)."""
    kept = (*ledger.refused, refusal)[-MAX_REFUSALS_KEPT:]
    return ledger.model_copy(update={"refused": kept, "snapshot_seq": ledger.snapshot_seq + 1})


def mark_cancel_requested(ledger: MissionLedger, child_ids: Iterable[str]) -> MissionLedger:
    """Record that the mission asked for these children to be cancelled (so it asks once)."""
    wanted = set(child_ids)
    for child_id in sorted(wanted):
        ledger.child(child_id)  # unknown ids are a wiring bug
    children = tuple(
        c.model_copy(update={"cancel_requested": True}) if c.child_id in wanted else c for c in ledger.children
    )
    return _commit(ledger, ledger.model_copy(update={"children": children}))


def mark_cancelled(ledger: MissionLedger, reason: str = "mission cancelled by an operator") -> MissionLedger:
    """The mission was cancelled. Before a verdict it ends `cancelled`; after one, the verdict stands.

    Either way `cancellation` records why, and `children_to_cancel` then names every live child:
    cancelling a mission whose verdict has settled is how its long-lived children are stopped.
    """
    if ledger.cancellation is not None:
        return ledger
    update: dict[str, Any] = {"cancellation": reason}
    if ledger.parent_state not in FINAL_PARENT_STATES:
        update |= {"parent_state": "cancelled", "verdict_reason": reason}
    return _commit(ledger, ledger.model_copy(update=update))


def aggregate(ledger: MissionLedger, spec: MissionSpec) -> MissionLedger:
    """Recompute the summary, best output and parent state of `ledger` under `spec`.

    Every other function here already returns aggregated ledgers; this one is for a ledger from
    elsewhere (a carried or loaded snapshot). Raises ValueError if the ledger is not this spec's.
    """
    check_spec(ledger, spec)
    return _commit(ledger, ledger)
