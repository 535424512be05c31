"""Inputs, updates and signals of the MissionWorkflow."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from workflows.admission.messages import RequesterCarry
from workflows.admission.model import OperatorName
from workflows.ids import admission_request_id, mission_workflow_id  # noqa: F401 (defined once there)
from workflows.inbound import Refused, argument, describe
from workflows.limits import MAX_REVIEW_REASON_CHARS
from workflows.mission.children import ChildRuns
from workflows.mission.executor_v1 import ExecutorDispatch, is_dispatch
from workflows.mission.ledger import MissionLedger
from workflows.mission.observation import ChildObservation
from workflows.mission.spec import MissionSpec

MISSION_WORKFLOW = "MissionWorkflow"
RUNNING_WORKFLOWS = "running_workflows"
ANSWER_CHILD = "answer_child"


class WorkflowIds(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ids: list[str]


class MissionProgress(BaseModel):
    """What the mission's supervisor has made of it so far: the ledger, where each routed child
    stands (workflows.mission.children) and the observations not folded yet. Carried whole at
    continue-as-new."""

    model_config = ConfigDict(extra="forbid")

    ledger: MissionLedger
    children: ChildRuns = Field(default_factory=ChildRuns)
    observations: list[ChildObservation] = Field(default_factory=list)


class MissionCarry(BaseModel):
    """What a MissionWorkflow hands to its next run at continue-as-new: its progress, the last
    snapshot written, and its admission requests. Children started by earlier runs keep running;
    the new run follows them by their signals (see `workflows.mission.workflow`)."""

    model_config = ConfigDict(extra="forbid")

    progress: MissionProgress
    written_seq: int
    admission: RequesterCarry


class MissionInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    spec: MissionSpec
    max_children_in_flight: int = Field(default=200, ge=1, le=1000)
    # Off only where the server cannot register them (the time-skipping test server).
    search_attributes: bool = True
    poll_interval_seconds: float = Field(default=1.0, gt=0, le=60)
    # Continue-as-new once the history is this long (or the server suggests it) while only
    # long-lived children run: supervising daemons renews leases for as long as they live.
    max_history_events: int = Field(default=10_000, ge=100)
    # How often a long-lived child shows its mission it is alive when nothing changes.
    alive_every_seconds: float = Field(default=300.0, gt=0, le=3600)
    carried: MissionCarry | None = None


class ReviewRequest(BaseModel):
    """An operator's decision on a manual-review mission; recorded in the ledger with its time."""

    model_config = ConfigDict(extra="forbid")

    operator: OperatorName
    decision: Literal["approve", "reject"]
    reason: str = Field(min_length=1, max_length=MAX_REVIEW_REASON_CHARS)  # what the ledger's ReviewDecision keeps


INPUT_HINT = (
    "expected {\"spec\": MissionSpec} or an executor.v1 dispatch: see `conductor mission schema mission-input` and "
    "docs/mission-control-api.md"
)


def read_mission_input(args: tuple[object, ...]) -> MissionInput:
    """MissionWorkflow's input from what a client sent: a MissionInput, or an AIWG executor.v1
    dispatch payload, which is a one-child mission (`workflows.mission.executor_v1`); Refused otherwise."""
    what = "MissionWorkflow's input"
    if len(args) != 1 or not is_dispatch(args[0]):
        return argument(args, MissionInput, what, hint=INPUT_HINT)
    dispatch = argument(args, ExecutorDispatch, f"{what} (an executor.v1 dispatch)", hint=INPUT_HINT)
    try:
        return MissionInput(spec=dispatch.to_spec())
    except ValidationError as error:
        raise Refused(f"{what} (an executor.v1 dispatch) makes no mission: {describe(error)}") from None
    except ValueError as error:
        raise Refused(f"{what} (an executor.v1 dispatch) makes no mission: {error}") from None
