"""One child's outcome from its ledger entry: satisfied for its kind, evidence present, pending,
failed or needing review (`child_outcome`).
"""

from __future__ import annotations

from workflows.contract import (
    REVIEW_REQUIRED_STATES,
    TERMINAL_FAILURE_STATES,
    TERMINAL_OBSERVED_STATES,
    Health,
    ObservedState,
    WorkloadKind,
)
from workflows.mission.ledger import ChildLedger, ChildOutcome, Evidence, EvidenceSource

_SATISFYING_STATES: dict[str, frozenset[str]] = {
    "one-shot-command": frozenset({"succeeded"}),
    "daemon": frozenset({"healthy", "running"}),  # and health == healthy
    "persistent-agent": frozenset({"retained", "detached", "running"}),
    "scheduled-collector": frozenset({"scheduled", "succeeded"}),
}
_ADMISSION_ENDED = frozenset({"denied", "timed-out", "cancelled", "preempted", "released"})


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


def dispatched(child: ChildLedger) -> bool:
    return child.revision is not None


def attempt_started(child: ChildLedger) -> bool:
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
    if not dispatched(child) and child.admission.state == "denied":
        return "failed"
    lifecycle = is_satisfied(child.kind, state, child.health)
    if lifecycle and not missing_evidence(child):
        return "satisfied"
    if state in TERMINAL_OBSERVED_STATES:
        # Ended `succeeded` yet not satisfied: evidence is missing or the kind needed something
        # else (a daemon that exits). Nothing will change by itself, and it is not a success.
        return "review-required"
    return "pending"


def refresh(child: ChildLedger) -> ChildLedger:
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


def is_live(child: ChildLedger) -> bool:
    """Could still be running (or start) somewhere: cancelling it is meaningful."""
    if child.observed_state in TERMINAL_OBSERVED_STATES:
        return False
    return dispatched(child) or child.admission.state not in _ADMISSION_ENDED
