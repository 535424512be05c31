"""Which of some workflows are still running: for a workflow that must know whether a workflow
it does not own a handle to (a child an earlier run of it started) has closed."""

from __future__ import annotations

from collections.abc import Iterable

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from workflows.mission.messages import RUNNING_WORKFLOWS, WorkflowIds


class WorkflowStatusActivities:
    def __init__(self, client: Client) -> None:
        self._client = client

    @activity.defn(name=RUNNING_WORKFLOWS)
    async def running_workflows(self, request: WorkflowIds) -> WorkflowIds:
        return WorkflowIds(ids=await running_workflow_ids(self._client, request.ids))


async def running_workflow_ids(client: Client, workflow_ids: Iterable[str]) -> list[str]:
    """The ids whose latest run is still running (an id the server does not know is not)."""
    running = []
    for workflow_id in workflow_ids:
        try:
            description = await client.get_workflow_handle(workflow_id).describe()
        except RPCError as error:
            if error.status != RPCStatusCode.NOT_FOUND:
                raise
            continue
        if description.status == WorkflowExecutionStatus.RUNNING:
            running.append(workflow_id)
    return running
