"""Signal-with-start of a host group's AdmissionWorkflow, on behalf of a requester workflow.

Workflows cannot signal-with-start, so the first submit of every requester goes
through this activity: it creates the singleton if it is missing (with the
host group's configured policy) and delivers the batch in the same call.
"""

from __future__ import annotations

from collections.abc import Callable

from temporalio import activity
from temporalio.client import Client, WithStartWorkflowOperation
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDConflictPolicy

from workflows.admission.messages import AdmissionWorkflowInput, PolicyChange, SubmitAdmission, admission_workflow_id
from workflows.admission.model import AdmissionPolicy
from workflows.mission.search import MISSION_HOST_GROUP

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
            "submit", submission.batch, search_attributes=submission.search_attributes,
        )


async def signal_with_start_admission(
    client: Client, task_queue: str, host_group: str, policy: AdmissionPolicy, signal: str, payload: object,
    *, max_history_events: int | None = None, search_attributes: bool = False, max_requests_per_pass: int | None = None,
) -> None:
    """Deliver `signal` to `admission:<host_group>`, starting it first if it is not running."""
    await client.start_workflow(
        ADMISSION_WORKFLOW,
        _input(host_group, policy, max_history_events, max_requests_per_pass),
        id=admission_workflow_id(host_group),
        task_queue=task_queue,
        start_signal=signal,
        start_signal_args=[payload],
        search_attributes=_attributes(host_group, search_attributes),
        static_summary=_summary(host_group),
    )


async def set_policy_with_start(
    client: Client, task_queue: str, host_group: str, change: PolicyChange, *, search_attributes: bool = True,
) -> AdmissionPolicy:
    """Send the operator's policy change to `admission:<host_group>` as an update (its validator
    requires the operator's name), starting the workflow with that policy if none runs."""
    start = WithStartWorkflowOperation(
        ADMISSION_WORKFLOW,
        _input(host_group, change.policy, None),
        id=admission_workflow_id(host_group),
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        search_attributes=_attributes(host_group, search_attributes),
        static_summary=_summary(host_group),
    )
    return await client.execute_update_with_start_workflow(
        "set_policy", change, start_workflow_operation=start, result_type=AdmissionPolicy,
    )


def _input(
    host_group: str, policy: AdmissionPolicy, max_history_events: int | None, max_requests_per_pass: int | None = None,
) -> AdmissionWorkflowInput:
    workflow_input = AdmissionWorkflowInput(host_group=host_group, policy=policy)
    if max_history_events is not None:
        workflow_input.max_history_events = max_history_events
    if max_requests_per_pass is not None:
        workflow_input.max_requests_per_pass = max_requests_per_pass
    return workflow_input


def _summary(host_group: str) -> str:
    return f"admission singleton of host group {host_group}: every lease there is granted, renewed and audited here"


def _attributes(host_group: str, wanted: bool) -> TypedSearchAttributes | None:
    return TypedSearchAttributes([SearchAttributePair(MISSION_HOST_GROUP, host_group)]) if wanted else None
