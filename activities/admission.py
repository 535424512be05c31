"""Signal-with-start of a host group's AdmissionWorkflow, on behalf of a requester workflow.

Workflows cannot signal-with-start, so the first submit of every requester goes
through this activity: it creates the singleton if it is missing (with the
host group's configured policy) and delivers the batch in the same call.
"""

from __future__ import annotations

from collections.abc import Callable

from temporalio import activity
from temporalio.client import Client

from workflows.admission.messages import AdmissionWorkflowInput, SubmitAdmission, admission_workflow_id
from workflows.admission.model import AdmissionPolicy

ADMISSION_WORKFLOW = "AdmissionWorkflow"


class AdmissionActivities:
    def __init__(self, client: Client, task_queue: str, policy_for: Callable[[str], AdmissionPolicy]) -> None:
        self._client = client
        self._task_queue = task_queue
        self._policy_for = policy_for

    @activity.defn(name="submit_admission_batch")
    async def submit_admission_batch(self, submission: SubmitAdmission) -> None:
        await signal_with_start_admission(
            self._client, self._task_queue, submission.host_group, self._policy_for(submission.host_group),
            "submit", submission.batch,
        )


async def signal_with_start_admission(
    client: Client, task_queue: str, host_group: str, policy: AdmissionPolicy, signal: str, payload: object,
    *, max_history_events: int | None = None,
) -> None:
    """Deliver `signal` to `admission:<host_group>`, starting it first if it is not running."""
    workflow_input = AdmissionWorkflowInput(host_group=host_group, policy=policy)
    if max_history_events is not None:
        workflow_input.max_history_events = max_history_events
    await client.start_workflow(
        ADMISSION_WORKFLOW,
        workflow_input,
        id=admission_workflow_id(host_group),
        task_queue=task_queue,
        start_signal=signal,
        start_signal_args=[payload],
    )
