"""Inputs, updates and signals of the MissionWorkflow."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from workflows.mission.spec import MissionSpec

MISSION_WORKFLOW = "MissionWorkflow"


def mission_workflow_id(mission_id: str) -> str:
    return f"mission:{mission_id}"


def admission_request_id(mission_id: str, child_id: str) -> str:
    return f"{mission_id}:{child_id}"


class MissionInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    spec: MissionSpec
    max_children_in_flight: int = Field(default=200, ge=1, le=1000)
    # Off only where the server cannot register them (the time-skipping test server).
    search_attributes: bool = True
    poll_interval_seconds: float = Field(default=1.0, gt=0, le=60)


class ReviewRequest(BaseModel):
    """An operator's decision on a manual-review mission; recorded in the ledger with its time."""

    model_config = ConfigDict(extra="forbid")

    operator: str = Field(min_length=1)
    decision: Literal["approve", "reject"]
    reason: str = Field(min_length=1)
