"""The pure core of mission aggregation: child observations and admissions in, ledgers out.

The MissionWorkflow is a thin shell around these functions: it feeds them observations,
admission decisions and review decisions and writes the ledgers they return. Every function
takes a ledger and returns a new one (never changing its argument), fully aggregated, with
`snapshot_seq` incremented exactly when something changed. So a snapshot numbered `n` always has
the same content, and a redelivered signal costs nothing. The batch forms (`apply_admissions`,
`start_attempts`, `apply_observations`) give the same ledger as their changes applied one at a
time, one `snapshot_seq` per change that altered a child, but aggregate the whole ledger once.

Per child (see `child_outcome`):
- An observation is a whole revision of the child's record. A higher revision replaces the
  previous one; a lower one is stale and only recorded in `stale_event_revisions`; the same
  revision again with the same content (ignoring `observed_at`) is a redelivery and a no-op; the
  same revision with different content breaks the substrate's compare-and-swap promise, so the
  first one stays and the revision is recorded as stale.
- Satisfaction per kind is `is_satisfied`; required evidence is every artifact kind in
  `ChildSpec.required_evidence` present in the child's artifacts. A child counts as satisfied
  only with both (missing evidence fails closed).
- Until the substrate reports the child (`revision is None`), its admission is the only truth:
  queued shows `blocked` with capacity backpressure (retryable), denied shows `blocked` with
  policy backpressure (not retryable) and fails the child (it can never run), a queue timeout
  shows `timed-out`, a cancelled or preempted request shows `cancelled`.

Attempts (`workflows.mission.attempts`): a child runs as numbered attempts, each on a fleet
record of its own, and is judged by its last (`ChildLedger.attempt`); `start_attempt` lists an
attempt when the mission starts it, `close_attempt` records why it ended and, when it is tried
again, shows the child as not yet run (its admission says where it waits). An observation of
an earlier attempt only updates that attempt's entry. While an attempt is being stopped or
will be retried (`ChildLedger.stopping`), how it ended does not count: the child stays pending.

Per mission, with S satisfied, F failed, R review-required and P pending children (N in all) and
k the successes needed (N for all-pass and fail-fast, `minimum_successes` for quorum):
- all-pass, fail-fast, quorum: `failed` as soon as S + P + R < k (success has become impossible
  even if every child needing review turned out fine: for all-pass and fail-fast that is the first
  terminal failure); `completed` as soon as S >= k and R is empty (quorum does not wait for
  stragglers); otherwise, once nothing is pending, `operator-review-required` (a child needing
  review blocks completion, or only reviewed children could still reach k). fail-fast differs from
  all-pass only in that its failure cancels the live siblings (`children_to_cancel`); all-pass
  lets them run to their own end.
- best-output: decides once nothing is pending: `operator-review-required` if any child needs
  review; else `completed` with the best satisfied child's non-empty output (longest wins, ties go
  to the child listed first in the spec); else `failed` (no satisfied child produced output).
- manual-review: decides only on the operator's decision, accepted only once nothing is pending
  (the state is `awaiting-review` then). reject -> `failed`. approve -> `completed`, unless a
  child needs review: then `operator-review-required`, because unknown / operator-review-required
  children and missing evidence never count as success, not even with an approval (the approval is
  still recorded). Terminal failures do not block an approval: accepting them is the operator's call.
- Long-lived children (daemon, persistent-agent, scheduled-collector) count as satisfied while
  running, so a verdict can settle while they keep running. A final parent state never changes
  again; the children and the summary keep following the observations.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, NamedTuple

from workflows.admission.messages import Backpressure as AdmissionBackpressure
from workflows.inbound import MAX_REFUSALS_KEPT, Refusal
from workflows.contract import (
    REVIEW_REQUIRED_STATES,
    TERMINAL_FAILURE_STATES,
    TERMINAL_OBSERVED_STATES,
    Backpressure,
    Health,
    ObservedState,
    WorkloadKind,
)
from workflows.mission.ledger import (
    FINAL_PARENT_STATES,
    VERDICT_STATES,
    AggregationSummary,
    ChildAdmission,
    ChildAttempt,
    ChildLedger,
    ChildOutcome,
    ChosenOutput,
    Evidence,
    EvidenceSource,
    MissionLedger,
    ParentState,
    ReviewDecision,
    VerdictState,
)
from workflows.mission.attempts import AttemptStop, Judgement, judge
from workflows.mission.observation import ChildObservation
from workflows.mission.spec import MissionSpec, Quorum
from workflows.workload.record import fleet_child_id

__all__ = [
    "ReviewNotAccepted",
    "is_satisfied",
    "missing_evidence",
    "child_outcome",
    "initial_ledger",
    "apply_observation",
    "apply_observations",
    "apply_admission",
    "apply_admissions",
    "AttemptStart",
    "start_attempt",
    "start_attempts",
    "close_attempt",
    "judge_attempt",
    "mark_stopping",
    "apply_review",
    "review_refusal",
    "aggregate",
    "verdict",
    "is_final",
    "live_children",
    "children_to_cancel",
    "mark_cancel_requested",
    "mark_cancelled",
    "output_score",
]

_SATISFYING_STATES: dict[str, frozenset[str]] = {
    "one-shot-command": frozenset({"succeeded"}),
    "daemon": frozenset({"healthy", "running"}),  # and health == healthy
    "persistent-agent": frozenset({"retained", "detached", "running"}),
    "scheduled-collector": frozenset({"scheduled", "succeeded"}),
}
# Admission states after which a child that never reached the substrate will not run.
LEASE_EXPIRED = "admission.lease_expired"
_ADMISSION_ENDED = frozenset({"denied", "timed-out", "cancelled", "preempted", "released"})
# Fields of an observation that make up its content (observed_at is when it was seen, not what).
_OBSERVED_FIELDS = (
    "lineage", "observed_state", "health", "backpressure", "exit_classification", "error_code", "note", "output",
)  # fmt: skip
_WAITING_FOR_CAPACITY = Backpressure(reason="capacity", retryable=True)
_DENIED_BY_POLICY = Backpressure(reason="policy", retryable=False)
_NAMES_SHOWN = 5  # ids named in a reason before "and N more": reasons stay short for 1,000 children


class ReviewNotAccepted(ValueError):
    """A review decision that cannot be applied now; the message says why and what to do."""


# --- per child -----------------------------------------------------------------------------------


def is_satisfied(kind: WorkloadKind, observed_state: ObservedState, health: Health | None) -> bool:
    """Whether the kind's lifecycle is satisfied (the design's table), evidence aside.

    one-shot-command: `succeeded`; daemon: `healthy` or `running`, and health `healthy` (a daemon
    that runs but does not report healthy is not yet doing its job); persistent-agent: `retained`,
    `detached` or `running`; scheduled-collector: `scheduled` or `succeeded` (MissionSpec already
    refuses a collector without a schedule).
    """
    if observed_state not in _SATISFYING_STATES[kind]:
        return False
    return kind != "daemon" or health == "healthy"


def missing_evidence(child: ChildLedger) -> tuple[str, ...]:
    """Required artifact kinds the child has not produced, in the spec's order."""
    present = {artifact.kind for artifact in child.artifacts}
    return tuple(kind for kind in child.required_evidence if kind not in present)


def _task_named_by(uri: str) -> str | None:
    """The task id in a `sandbox://tasks/<id>/...` URI, the form the real server writes (fleet.rs)."""
    prefix = "sandbox://tasks/"
    if not uri.startswith(prefix):
        return None
    task = uri[len(prefix):].split("/", 1)[0]
    return task or None


def evidence_of(child: ChildLedger) -> tuple[Evidence, ...]:
    """Each artifact with who produced it (see `Evidence`): what the child's own task left is the
    executor's; a `verifier` artifact from another task is the conductor's verifier run."""
    bound = child.lineage.task_id if child.lineage is not None else None
    rows = []
    for artifact in child.artifacts:
        task = _task_named_by(artifact.uri)
        source: EvidenceSource = "observation"
        if task is not None and task == bound:
            source = "executor"
        elif task is not None and artifact.kind == "verifier":
            source = "conductor-verifier"
        rows.append(Evidence(kind=artifact.kind, source=source, task_id=task))
    return tuple(rows)


def _dispatched(child: ChildLedger) -> bool:
    return child.revision is not None


def _attempt_started(child: ChildLedger) -> bool:
    return any(known.attempt == child.attempt for known in child.attempts)


def child_outcome(child: ChildLedger) -> ChildOutcome:
    """Where the child stands for the verdict (see `ChildOutcome`); fails closed."""
    state = child.observed_state
    if child.stopping is not None:
        return "pending"  # the mission stopped it (its lease went) and judges it once it has ended
    if state in REVIEW_REQUIRED_STATES:
        return "review-required"
    if state in TERMINAL_FAILURE_STATES:
        return "failed"
    if not _dispatched(child) and child.admission.state == "denied":
        return "failed"
    lifecycle = is_satisfied(child.kind, state, child.health)
    if lifecycle and not missing_evidence(child):
        return "satisfied"
    if state in TERMINAL_OBSERVED_STATES:
        # Ended `succeeded` yet not satisfied: evidence is missing or the kind needed something
        # else (a daemon that exits). Nothing will change by itself, and it is not a success.
        return "review-required"
    return "pending"


def _refresh(child: ChildLedger) -> ChildLedger:
    missing = missing_evidence(child)
    outcome = child_outcome(child)
    return child.model_copy(
        update={
            "evidence": evidence_of(child),
            "missing_evidence": missing,
            "evidence_complete": not missing,
            "satisfied": outcome == "satisfied",
            "outcome": outcome,
        }
    )


def _is_live(child: ChildLedger) -> bool:
    """Could still be running (or start) somewhere: cancelling it is meaningful."""
    if child.observed_state in TERMINAL_OBSERVED_STATES:
        return False
    return _dispatched(child) or child.admission.state not in _ADMISSION_ENDED


# --- building and changing ledgers ----------------------------------------------------------------


def _required_successes(spec: MissionSpec) -> int | None:
    mode = spec.aggregation.mode
    if mode in ("all-pass", "fail-fast"):
        return len(spec.children)
    if isinstance(spec.aggregation, Quorum):
        return spec.aggregation.minimum_successes
    return None


def initial_ledger(spec: MissionSpec) -> MissionLedger:
    """Every child pending and not yet submitted for admission; parent `planning`; snapshot 0."""
    children = tuple(
        _refresh(
            ChildLedger(child_id=c.child_id, kind=c.kind, required_evidence=tuple(dict.fromkeys(c.required_evidence)))
        )
        for c in spec.children
    )
    ledger = MissionLedger(
        mission_id=spec.mission_id,
        parent_state="planning",
        aggregation=AggregationSummary(mode=spec.aggregation.mode, required_successes=_required_successes(spec)),
        children=children,
    )
    return _settle(ledger).model_copy(update={"snapshot_seq": 0})


def _commit(before: MissionLedger, after: MissionLedger) -> MissionLedger:
    """Aggregate `after`; return `before` itself if nothing changed, else the result with seq + 1.
    For changes to the ledger as a whole (a review, a cancellation); a change to children goes
    through `_commit_each`."""
    settled = _settle(after)
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
        if not final and _verdict_due(before, outcomes):
            decided, reason, _, best = _evaluate(before.model_copy(update={"children": tuple(children)}))
            verdict_at = {"parent_state": decided, "verdict_reason": reason, "best_output": best}
            final = True
    if seq == before.snapshot_seq:
        return before
    after = before.model_copy(update={"children": tuple(children), **verdict_at})
    return _settle(after).model_copy(update={"snapshot_seq": seq})


def _as_stopped_by_lease_expiry(child: ChildLedger) -> ChildLedger:
    """A dispatched child whose lease expired, and which was then stopped, ended `timed-out`: the
    policy's lease timeout is why it ended; `cancelled` (what the substrate reports) is only how."""
    if child.admission.state == "timed-out" and _dispatched(child) and child.observed_state == "cancelled":
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
    _check_spec(ledger, spec)
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
                "revision": obs.revision,
                "observed_at": obs.observed_at,
                "artifacts": tuple(obs.artifacts),
            }
        ))
        if child.revision is None or obs.revision > child.revision:
            return _refresh(_awaiting_retry(_observe_attempt(observed, obs), spec))
        if obs.revision == child.revision and all(getattr(child, f) == getattr(observed, f) for f in (*_OBSERVED_FIELDS, "artifacts")):
            return child  # redelivered: nothing new
        stale = tuple(sorted(set(child.stale_event_revisions) | {obs.revision}))
        if stale == child.stale_event_revisions:
            return child
        return _refresh(child.model_copy(update={"stale_event_revisions": stale}))

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
        if not _dispatched(child) and not _attempt_started(child):
            # A started attempt that has not reported yet is judged by its end, not by its
            # lease: one preempted before its first observation still runs until it is stopped.
            update |= _admission_shown(admission, backpressure)
        return _refresh(_as_stopped_by_lease_expiry(child.model_copy(update=update)))

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


def judge_attempt(child: ChildLedger, stop: AttemptStop | None, max_attempts: int) -> Judgement:
    """`workflows.mission.attempts.judge` for the child's current attempt, as its ledger row has it."""
    backpressure = child.backpressure
    return judge(
        stop,
        observed_state=child.observed_state,
        retryable_refusal=backpressure is not None and backpressure.retryable,
        attempt=child.attempt,
        counted=sum(1 for a in child.attempts if a.attempt < child.attempt and a.counts_against_budget),
        max_attempts=max_attempts,
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
        if _attempt_started(child):
            return child
        entry = ChildAttempt(
            attempt=start.attempt, request_id=start.request_id, lease_revision=start.lease_revision,
            fleet_child_id=fleet_child_id(mission_id, start.child_id, start.attempt),
        )
        return child.model_copy(update={"attempts": (*child.attempts, entry)})

    return change


def mark_stopping(ledger: MissionLedger, child_id: str, why: str) -> MissionLedger:
    """The mission is stopping the child's current attempt, whose lease went (see `ChildLedger.stopping`)."""
    return _commit_each(ledger, [(child_id, lambda child: _refresh(child.model_copy(update={"stopping": why})))])


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
        return _refresh(child.model_copy(update=update))

    return _commit_each(ledger, [(child_id, closed)])


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


def review_refusal(ledger: MissionLedger, spec: MissionSpec) -> str | None:
    """Why a review decision cannot be accepted now (None when it can). For update validators."""
    _check_spec(ledger, spec)
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
            f"{_names(pending)} {'is' if len(pending) == 1 else 'are'} still pending; a review is accepted "
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


# --- reading ledgers -------------------------------------------------------------------------------


def verdict(ledger: MissionLedger) -> VerdictState | None:
    """The mission's verdict, or None while undecided (and for a mission cancelled before one)."""
    return ledger.parent_state if ledger.parent_state in VERDICT_STATES else None  # type: ignore[return-value]


def is_final(ledger: MissionLedger) -> bool:
    return ledger.parent_state in FINAL_PARENT_STATES


def live_children(ledger: MissionLedger) -> list[str]:
    """Children that are not known to have ended (sorted): still running, starting or waiting."""
    return sorted(c.child_id for c in ledger.children if _is_live(c))


def children_to_cancel(ledger: MissionLedger, spec: MissionSpec) -> list[str]:
    """Live children the mission should cancel now and has not yet asked to (sorted).

    After a fail-fast failure: every live sibling. After `mark_cancelled`: every live child.
    Otherwise none: all-pass and quorum leave the other children to finish, best-output and
    manual-review need them all. Call `mark_cancel_requested` with what this returns once asked.
    """
    _check_spec(ledger, spec)
    fail_fast = spec.aggregation.mode == "fail-fast" and ledger.parent_state == "failed"
    if not fail_fast and ledger.cancellation is None:
        return []
    return sorted(c.child_id for c in ledger.children if _is_live(c) and not c.cancel_requested)


def aggregate(ledger: MissionLedger, spec: MissionSpec) -> MissionLedger:
    """Recompute the summary, best output and parent state of `ledger` under `spec`.

    Every other function here already returns aggregated ledgers; this one is for a ledger from
    elsewhere (a carried or loaded snapshot). Raises ValueError if the ledger is not this spec's.
    """
    _check_spec(ledger, spec)
    return _commit(ledger, ledger)


def output_score(output: str) -> int:
    """The best-output scoring rule: the longest result wins (length in characters)."""
    return len(output)


# --- the verdict ----------------------------------------------------------------------------------


def _check_spec(ledger: MissionLedger, spec: MissionSpec) -> None:
    if ledger.mission_id != spec.mission_id:
        raise ValueError(f"the ledger is for mission {ledger.mission_id} but the spec is for {spec.mission_id}")
    policy = (spec.aggregation.mode, _required_successes(spec))
    if (ledger.aggregation.mode, ledger.aggregation.required_successes) != policy:
        raise ValueError(
            f"the ledger of mission {ledger.mission_id} aggregates with {ledger.aggregation.mode} "
            f"(needs {ledger.aggregation.required_successes}) but the spec says {spec.aggregation.mode}; "
            "a mission's policy cannot change once it has a ledger"
        )
    if [c.child_id for c in ledger.children] != [c.child_id for c in spec.children]:
        raise ValueError(f"the ledger of mission {ledger.mission_id} lists other children than the spec")


def _names(ids: Sequence[str]) -> str:
    shown = ", ".join(ids[:_NAMES_SHOWN])
    return shown if len(ids) <= _NAMES_SHOWN else f"{shown} and {len(ids) - _NAMES_SHOWN} more"


def _kinds(kinds: Sequence[str]) -> str:
    return ", ".join(kinds)


def _phrase(child: ChildLedger) -> str:
    """What the child is doing, as part of a sentence: "child-b timed out (exit.timeout)"."""
    cid, state = child.child_id, child.observed_state
    suffix = f" ({child.error_code})" if child.error_code else ""
    admission = child.admission
    if not _dispatched(child) and admission.state in ("queued", "denied"):
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
    if any(_dispatched(c) or c.admission.state in ("admitted", "released", "preempted") for c in children):
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


# Which case of the rule decided (or left undecided) the verdict; `_evaluate` words each.
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


def _evaluate(ledger: MissionLedger) -> tuple[VerdictState | None, str, bool, ChosenOutput | None]:
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
        parts = [f"{_names(silent)} satisfied without output"] if silent else []
        if failed:
            parts.append(_phrases(failed))
        return f"no satisfied child produced output ({'; '.join(parts)})"
    if case == "unreachable":
        if mode == "quorum":
            possible = len(sat) + len(pending) + len(review)
            return f"{counted} unreachable: at most {possible} of {n} children can still succeed ({_phrases(failed)})"
        if mode == "fail-fast":
            siblings = [c.child_id for c in ledger.children if _is_live(c)]
            cancel = f" and cancels {_names(siblings)}" if siblings else ""
            return f"{_phrases(failed)}: fail-fast stops the mission{cancel}"
        return f"{_phrases(failed)}: all-pass needs every child satisfied"
    if case == "met":
        if mode == "quorum":
            return f"quorum {len(sat)}/{n} met (needs {k}): {_names([c.child_id for c in sat])} satisfied"
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


def _verdict_due(ledger: MissionLedger, outcomes: Counter[str]) -> bool:
    """Whether `verdict_rule` decides for `ledger`'s mode and review with children of these outcome counts."""
    tally = Tally(outcomes["satisfied"], outcomes["failed"], outcomes["review-required"], outcomes["pending"])
    summary = ledger.aggregation
    return verdict_rule(summary.mode, summary.required_successes, tally, ledger.review)[0] is not None


def _settle(ledger: MissionLedger) -> MissionLedger:
    """Recompute the live summary; move the parent state unless it is already final."""
    outcome_of = {c.child_id: c.outcome for c in ledger.children}

    def ids(outcome: str) -> tuple[str, ...]:
        return tuple(sorted(cid for cid, o in outcome_of.items() if o == outcome))

    decided, reason, eligible, best = _evaluate(ledger)
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
