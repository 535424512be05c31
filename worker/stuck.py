"""A workflow whose workflow task fails again and again: found, and said in one line.

A failing workflow task does not close a workflow: it stays `Running` while the server retries the
task, and nothing it should decide is decided. For a host group's admission singleton that means
every mission, holder and wrapped agent on those hosts waits. The server keeps the task's attempt
count (`pending_workflow_task.attempt` in DescribeWorkflowExecution) and, in the history, the
failure of the first attempt that failed (later attempts of the same task write no event), so both
are read here: `conductor admission host-groups`, `usage` and the other admission views say
"stuck" with that failure's first line (docs/operations.md, "A host group that stopped deciding").
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.api.workflowservice.v1 import GetWorkflowExecutionHistoryReverseRequest
from temporalio.client import Client
from temporalio.api.common.v1 import WorkflowExecution

# A task attempted this often has failed (or timed out) twice in a row. One timeout is a worker
# that died with the task; two failures in a row is a task that will not pass by itself.
STUCK_AFTER_ATTEMPTS = 3
NEWEST_EVENTS_READ = 200
RPC_TIMEOUT = timedelta(seconds=5)


@dataclass(frozen=True)
class Stuck:
    attempts: int  # the pending task's attempt count (attempts failed so far: one less)
    since: datetime | None  # when the first of those attempts was scheduled
    failure: str  # the newest recorded failure's first line, or how the task timed out

    def line(self, what: str) -> str:
        since = f" since {self.since:%Y-%m-%d %H:%M:%S} UTC" if self.since is not None else ""
        return (f"{what} is stuck: its workflow task has failed {self.attempts - 1} times in a row{since}: {self.failure} "
                "(docs/operations.md, \"A host group that stopped deciding\")")


async def stuck(client: Client, workflow_id: str) -> Stuck | None:
    """Why `workflow_id`'s current run is stuck, or None while its tasks pass (or it is not running)."""
    description = await client.get_workflow_handle(workflow_id).describe(rpc_timeout=RPC_TIMEOUT)
    raw = description.raw_description
    if not raw.HasField("pending_workflow_task") or raw.pending_workflow_task.attempt < STUCK_AFTER_ATTEMPTS:
        return None
    pending = raw.pending_workflow_task
    since = pending.original_scheduled_time.ToDatetime() if pending.HasField("original_scheduled_time") else None
    return Stuck(attempts=pending.attempt, since=since, failure=await _newest_failure(client, workflow_id, description.run_id))


async def _newest_failure(client: Client, workflow_id: str, run_id: str | None) -> str:
    response = await client.workflow_service.get_workflow_execution_history_reverse(
        GetWorkflowExecutionHistoryReverseRequest(
            namespace=client.namespace, execution=WorkflowExecution(workflow_id=workflow_id, run_id=run_id or ""),
            maximum_page_size=NEWEST_EVENTS_READ,
        ),
        timeout=RPC_TIMEOUT,
    )
    for event in response.history.events:
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            attributes = event.workflow_task_failed_event_attributes
            message = attributes.failure.message.strip()
            return message.splitlines()[0][:300] if message else WorkflowTaskFailedCause.Name(attributes.cause)
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
            return "its workflow task timed out (no worker finished it in time)"
    return "no failure recorded in its newest events"
