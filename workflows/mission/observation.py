"""What a WorkloadWorkflow reports to its Mission each time the workload's record changes."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from workflows.contract import Artifact, Backpressure, ExitClassification, Health, Lineage, ObservedState, WorkloadKind

OBSERVATION_SIGNAL = "workload_observed"


class ChildObservation(BaseModel):
    """One revision of one child's fleet record, as seen by its WorkloadWorkflow.

    Revisions are the substrate's `status.revision`; the mission reduces them
    monotonically, so a late or duplicated observation never overwrites newer state.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    child_id: str
    kind: WorkloadKind
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
    note: str | None = None  # why the orchestrator (not the substrate) decided this state, e.g. unroutable
