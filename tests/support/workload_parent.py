"""A stand-in parent for WorkloadWorkflow tests: starts one child, collects its observations
(signalled ones, then the last one from the child's result, as MissionWorkflow does).

It cancels the child when told to (the way a mission does on a lost lease or fail-fast)
and returns everything it saw, in arrival order.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from temporalio import workflow
from temporalio.exceptions import ChildWorkflowError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from workflows.mission.observation import OBSERVATION_SIGNAL, ChildObservation
    from workflows.workload.client import cancel_workload, result_of_failed
    from workflows.workload.messages import WorkloadInput, WorkloadResult


class ParentInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    child_workflow_id: str
    workload: WorkloadInput


class ParentOutcome(BaseModel):
    observations: list[ChildObservation]
    result: WorkloadResult | None = None
    child_cancelled: bool = False


@workflow.defn(name="WorkloadParentProbe")
class WorkloadParentProbe:
    def __init__(self) -> None:
        self._observations: list[ChildObservation] = []
        self._cancel = False

    @workflow.signal(name=OBSERVATION_SIGNAL)
    def observed(self, observation: ChildObservation) -> None:
        self._observations.append(observation)

    @workflow.signal
    def cancel_child(self) -> None:
        self._cancel = True

    @workflow.query
    def observations(self) -> list[ChildObservation]:
        return list(self._observations)

    @workflow.run
    async def run(self, input: ParentInput) -> ParentOutcome:
        child = await workflow.start_child_workflow(
            "WorkloadWorkflow", input.workload, id=input.child_workflow_id, result_type=WorkloadResult
        )
        await workflow.wait_condition(lambda: self._cancel or child.done())
        if not child.done():
            await cancel_workload(input.child_workflow_id)
        try:
            result = await child
        except ChildWorkflowError as error:
            failed = result_of_failed(error)  # a workload that did not succeed fails its workflow
            if failed is not None:
                result = failed
            elif is_cancelled_exception(error):
                return ParentOutcome(observations=self._observations, child_cancelled=True)
            else:
                raise
        # The last observation travels in the result, as MissionWorkflow folds it.
        if not self._observations or self._observations[-1] != result.observation:
            self._observations.append(result.observation)
        return ParentOutcome(observations=self._observations, result=result)
