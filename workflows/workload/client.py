"""The parent's side of WorkloadWorkflow: its id, and how to cancel it so the cancel lands.

Cancel a workload through `cancel_workload(workflow_id)`, not `ChildWorkflowHandle.cancel()`:
the child handle aims its request at the child's first run, and a workload that has continued
as new (every long-lived one does, eventually) is no longer that run, so the server accepts
the request and nobody receives it (seen on the dev server 1.32 with the Python SDK 1.35;
tests/test_workload_workflow.py covers the path used here). A request by workflow id alone
reaches whichever run is current.
"""

from __future__ import annotations

from temporalio import workflow

from workflows.ids import workload_workflow_id  # noqa: F401 (defined once there)


async def cancel_workload(workflow_id: str) -> None:
    """Request cancellation of the current run of a WorkloadWorkflow (call from a workflow)."""
    await workflow.get_external_workflow_handle(workflow_id).cancel()
