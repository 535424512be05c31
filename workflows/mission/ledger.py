"""The mission ledger: what `conductor mission show --json` prints and what every snapshot stores.

A ledger is the whole truth about one mission at one moment: the parent state and the verdict,
the aggregation summary, one row per child (its latest observation, the revisions that arrived
too late, its admission and whether it counts as satisfied), the chosen best output and the
operator's review. `workflows.mission.aggregation` is the only code that builds ledgers; the
MissionWorkflow carries them and writes them through the `write_ledger_snapshot` activity.

Why frozen models with tuples: the aggregation functions return new ledgers and must never change
the one they were given (the workflow may still hold it, a snapshot may be in flight). Frozen
models and tuples make an accidental in-place change fail loudly instead of corrupting history.

Why the ledger carries the policy it needs (mode, required successes, each child's kind and
required evidence): a snapshot explains itself without the spec, and functions that get no spec
(`apply_admission`) can still recompute the verdict.

Imported inside the Temporal workflow sandbox: pydantic and side-effect-free stdlib only
(`hashlib` and `json` are deterministic). Never holds credentials: nothing in it is a token, and
`tests/stores/test_ledger_store.py` scans a stored ledger for the worker's token values to keep it so.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from workflows.admission.model import AdmissionState, AwareDatetime, Identifier
from workflows.contract import (
    Artifact,
    ArtifactKind,
    Backpressure,
    Capability,
    ExitClassification,
    Health,
    Lineage,
    ObservedState,
    WorkloadKind,
)
from workflows.inbound import Refusal
from workflows.mission.questions import Answer, Question

__all__ = [
    "WRITE_LEDGER_SNAPSHOT_ACTIVITY",
    "ParentState",
    "VerdictState",
    "ChildOutcome",
    "AggregationMode",
    "FINAL_PARENT_STATES",
    "VERDICT_STATES",
    "ChildAdmission",
    "ChildAttempt",
    "ChildLedger",
    "AggregationSummary",
    "ReviewDecision",
    "ChosenOutput",
    "MissionLedger",
    "SnapshotRef",
    "canonical_json",
    "content_hash",
]

#: The activity that stores a snapshot (`activities.ledger_store.LedgerActivities`).
WRITE_LEDGER_SNAPSHOT_ACTIVITY = "write_ledger_snapshot"

ParentState = Literal[
    # not final: the mission is still working towards a verdict
    "planning",  # nothing submitted or observed yet
    "admitting",  # admission requested, no child admitted or observed yet
    "running",  # at least one child admitted or observed; no verdict yet
    "awaiting-review",  # manual-review: every child settled, waiting for the operator's decision
    # final: never change once reached (children may keep running: verdict and lifetime are separate)
    "completed",
    "failed",
    "operator-review-required",
    "cancelled",  # cancelled before a verdict was reached
]
VerdictState = Literal["completed", "failed", "operator-review-required"]
FINAL_PARENT_STATES: frozenset[str] = frozenset({"completed", "failed", "operator-review-required", "cancelled"})
VERDICT_STATES: frozenset[str] = frozenset({"completed", "failed", "operator-review-required"})

# Where a child stands for the verdict:
# - satisfied: its kind's lifecycle is satisfied and all required evidence is present;
# - failed: a terminal failure (failed, cancelled, timed-out, or denied admission);
# - review-required: fails closed and needs a person (unknown, operator-review-required, or ended
#   without satisfying its kind, e.g. succeeded without the required evidence);
# - pending: anything that can still change on its own.
ChildOutcome = Literal["pending", "satisfied", "failed", "review-required"]
AggregationMode = Literal["all-pass", "quorum", "best-output", "fail-fast", "manual-review"]


class _LedgerModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ChildAdmission(_LedgerModel):
    """Where the child's admission request stands, as the AdmissionWorkflow last decided it."""

    request_id: str | None = None  # None until the mission has submitted the request
    state: AdmissionState | Literal["unknown"] = "unknown"
    lease_revision: int = Field(default=0, ge=0)
    # The admission record's revision: a decision older than the one held is ignored, so an
    # out-of-order decision cannot undo a newer one (0 when the caller does not track it).
    revision: int = Field(default=0, ge=0)
    reason: str | None = None  # the engine's reason, e.g. "waiting on environment quota prod 1/1"


EvidenceSource = Literal["executor", "conductor-verifier", "observation"]


class Evidence(_LedgerModel):
    """Who produced one artifact of the child's record: row i is `artifacts[i]`'s (its URI is
    there, not repeated here, since every snapshot stores the whole ledger).

    - executor: the substrate projected it from the child's own task (its `log` and `result`);
    - conductor-verifier: the conductor ran the child's verifier as a task of its own (`task_id`)
      and recorded the outcome with an observation, since the real server never produces it;
    - observation: some other orchestrator's observation wrote it; nothing here vouches for it.
    """

    kind: ArtifactKind
    source: EvidenceSource
    task_id: str | None = None  # the task the artifact's `sandbox://tasks/<id>/...` URI names


class ChildAttempt(_LedgerModel):
    """One attempt of a child (workflows.mission.attempts): under which admission request and
    lease it ran, on which fleet record and task, how it ended and why."""

    attempt: int = Field(ge=1)
    request_id: str | None = None
    lease_revision: int = Field(default=0, ge=0)
    fleet_child_id: str
    task_id: str | None = None
    observed_state: ObservedState = "pending"
    error_code: str | None = None
    ended: str | None = None  # why it ended; None while it runs
    retried: bool = False  # another attempt follows it
    counts_against_budget: bool = True  # False for an attempt taken away (displaced, preempted)
    interrupted_by: str | None = None  # the admission request that displaced or preempted it
    policy: str | None = None  # the admission policy that took its lease away


class ChildLedger(_LedgerModel):
    """One child: its latest observation, the late ones, its admission and what it counts as."""

    child_id: str
    kind: WorkloadKind
    required_evidence: tuple[ArtifactKind, ...] = ()
    # From the newest observation (all of them replaced together: an observation is a whole record).
    lineage: Lineage | None = None
    observed_state: ObservedState = "pending"
    revision: int | None = None  # None until the first substrate observation arrives
    observed_at: datetime | None = None
    health: Health | None = None
    backpressure: Backpressure | None = None
    artifacts: tuple[Artifact, ...] = ()
    exit_classification: ExitClassification | None = None
    error_code: str | None = None
    note: str | None = None
    output: str | None = None
    # The question the child waits on an answer to (blocked, backpressure approval): its task's
    # hitl-prompt/v1 envelope, or the mission's own gate before dispatch (workflows.mission.questions).
    question: Question | None = None
    # Capabilities the conductor found missing for this child (status `unsupported`, with why).
    capabilities: tuple[Capability, ...] = ()
    # Every answer operators gave this child, oldest first (the newest MAX_ANSWERS_KEPT): who,
    # when, to which prompt, the payload, and whether it was delivered.
    answers: tuple[Answer, ...] = ()
    # Revisions that arrived after a newer one (or conflicted with the applied one): audit only.
    stale_event_revisions: tuple[int, ...] = ()
    # Derived from the fields above by `workflows.mission.aggregation`.
    evidence: tuple[Evidence, ...] = ()
    evidence_complete: bool = True
    missing_evidence: tuple[ArtifactKind, ...] = ()
    satisfied: bool = False
    outcome: ChildOutcome = "pending"
    admission: ChildAdmission = Field(default_factory=ChildAdmission)
    cancel_requested: bool = False  # the mission has asked for this child to be cancelled
    # Attempts (workflows.mission.attempts): the fields above describe the current (last) one,
    # by which the child is judged; `attempts` lists every attempt started, oldest first.
    attempt: int = Field(default=1, ge=1)
    attempts: tuple[ChildAttempt, ...] = ()
    # Why the mission is stopping the current attempt (its lease went): until the attempt is
    # judged, how its stopped task ends does not count (the child stays pending).
    stopping: str | None = None


class AggregationSummary(_LedgerModel):
    """The live view of the children under the mission's policy (ids sorted).

    Always describes the children as they are now; once the parent state is final the verdict
    (`MissionLedger.parent_state` and `verdict_reason`) no longer follows it.
    """

    mode: AggregationMode
    # How many satisfied children a verdict of `completed` needs: every child for all-pass and
    # fail-fast, `minimum_successes` for quorum, None where the rule is not a count.
    required_successes: int | None = None
    successful: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    pending: tuple[str, ...] = ()
    review_required: tuple[str, ...] = ()
    # Lifecycle satisfied but required artifact kinds absent (pending while the child still runs,
    # review-required once it has ended).
    evidence_missing: tuple[str, ...] = ()
    completion_eligible: bool = False  # the children, as they are now, allow `completed`
    reason: str = ""  # a sentence a person can act on


class ReviewDecision(_LedgerModel):
    """An operator's decision on a manual-review mission: who, what, why and when (audit)."""

    operator: Identifier
    decision: Literal["approve", "reject"]
    reason: str = Field(min_length=1, max_length=2000)
    decided_at: AwareDatetime


class ChosenOutput(_LedgerModel):
    """The best output of a best-output mission: whose, what, and the score that chose it."""

    child_id: str
    output: str
    score: int  # the scoring rule's value (the output's length in characters)


class MissionLedger(_LedgerModel):
    mission_id: str
    parent_state: ParentState
    aggregation: AggregationSummary
    children: tuple[ChildLedger, ...]  # in spec order
    best_output: ChosenOutput | None = None
    review: ReviewDecision | None = None
    verdict_reason: str | None = None  # why the final parent state was reached; fixed with it
    cancellation: str | None = None  # why the mission was cancelled, when it was
    # Signals the mission received and did not act on, and why (workflows.inbound): the most
    # recent MAX_REFUSALS_KEPT, so that a client's mistake is visible where operators look.
    refused: tuple[Refusal, ...] = ()
    # Counts the distinct states this ledger went through: every function that changes the ledger
    # increments it, one that changes nothing leaves it. Same seq means same content, which is
    # what makes snapshots numbered by it immutable.
    snapshot_seq: int = Field(default=0, ge=0)

    def child(self, child_id: str) -> ChildLedger:
        for child in self.children:
            if child.child_id == child_id:
                return child
        known = ", ".join(child.child_id for child in self.children[:10])
        raise ValueError(f"mission {self.mission_id} has no child {child_id!r} (children: {known})")


class SnapshotRef(_LedgerModel):
    """Where a stored snapshot is and what it holds: `content_hash` is sha256 of `canonical_json`."""

    mission_id: str
    seq: int = Field(ge=0)
    content_hash: str = Field(pattern=r"^[0-9a-f]{64}$")


def canonical_json(ledger: MissionLedger) -> str:
    """The ledger as canonical JSON: sorted keys, no spaces, UTF-8 text. Stable, so it can be hashed."""
    return json.dumps(ledger.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def content_hash(ledger: MissionLedger) -> str:
    """sha256 (hex) of `canonical_json(ledger)`."""
    return hashlib.sha256(canonical_json(ledger).encode("utf-8")).hexdigest()
