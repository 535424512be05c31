"""What a WorkloadWorkflow reports to its Mission each time the workload's record changes."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from workflows.mission.questions import Question

from workflows.contract import (
    REVIEW_REQUIRED_STATES,
    TERMINAL_OBSERVED_STATES,
    Artifact,
    Backpressure,
    Capability,
    ExitClassification,
    Health,
    Lineage,
    ObservedState,
    WorkloadKind,
)

OBSERVATION_SIGNAL = "workload_observed"
# A long-lived workload's sign of life to its mission while nothing changes: if the signal
# cannot be delivered, the mission is gone and the workload stops its runtime task.
ALIVE_SIGNAL = "workload_alive"


class ChildObservation(BaseModel):
    """One revision of one child's fleet record, as seen by its WorkloadWorkflow.

    Revisions are the substrate's `status.revision`; the mission reduces them
    monotonically, so a late or duplicated observation never overwrites newer state.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    child_id: str
    kind: WorkloadKind
    # The attempt this observation is of (workflows.mission.attempts); revisions count per attempt,
    # since each attempt has its own fleet record.
    attempt: int = Field(default=1, ge=1)
    revision: int = Field(ge=0)
    observed_state: ObservedState
    observed_at: datetime
    lineage: Lineage | None = None
    health: Health | None = None
    backpressure: Backpressure | None = None
    artifacts: list[Artifact] = Field(default_factory=list)
    exit_classification: ExitClassification | None = None
    error_code: str | None = None
    output: str | None = None  # the result artifact's text, when the executor returned one
    # What the conductor found its executor cannot do for it (e.g. a daemon on one without the fleet API).
    capabilities: list[Capability] = Field(default_factory=list)
    question: Question | None = None  # blocked on approval: the question its task asks (hitl-prompt/v1)
    note: str | None = None  # why the orchestrator (not the substrate) decided this state, e.g. unroutable


def ends_workload(observed_state: str) -> bool:
    """A state a WorkloadWorkflow reports last: nothing more follows it (the workload's own rule,
    `workflows.workload.record.finished`, applied to what it reported)."""
    return observed_state in TERMINAL_OBSERVED_STATES or observed_state in REVIEW_REQUIRED_STATES
