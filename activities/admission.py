"""The AdmissionWorkflow's dealings with the Temporal server itself.

Workflows cannot signal-with-start, so the first submit of every requester goes
through an activity: it creates the singleton if it is missing (with the
host group's configured policy) and delivers the batch in the same call.

Nor can a workflow list workflows: the requester sweep asks visibility which of the
singleton's requesters closed without giving their leases back.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone

from temporalio import activity
from temporalio.client import Client
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

from activities.visibility import literal, quotable, runs_of
from activities.workflow_status import running_workflow_ids
from workflows.admission.messages import (
    ADMISSION_WORKFLOW,
    BETWEEN_RESTORE_SLICES,
    FIND_GONE_REQUESTERS,
    REQUESTERS_QUERY,
    AdmissionWorkflowInput,
    PolicyChange,
    RequesterSweep,
    SubmitAdmission,
    SweepResult,
    admission_workflow_id,
)
from workflows.admission.model import AdmissionPolicy
from workflows.mission.search import MISSION_HOST_GROUP



@activity.defn(name=BETWEEN_RESTORE_SLICES)
async def between_restore_slices() -> None:
    """Nothing. Run as a local activity between two slices of a continued singleton's restore:
    it ends the workflow activation (the SDK's deadlock detector times each activation) without
    ending the workflow task, so the whole restore is one task and costs no server round trip.
    A timer would end the task too, and on the dev server a short timer fires about a second later."""


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

    @activity.defn(name=FIND_GONE_REQUESTERS)
    async def find_gone_requesters(self, sweep: RequesterSweep) -> SweepResult:
        return await find_gone_requesters(self._client, sweep)


# Visibility is eventually consistent: a run that closed just before a sweep may be listed only
# by a later one, so each sweep reads from this long before the previous one began.
VISIBILITY_LAG = timedelta(seconds=60)
_CLOSED = "ExecutionStatus != 'Running' AND ExecutionStatus != 'ContinuedAsNew'"


async def find_gone_requesters(client: Client, sweep: RequesterSweep) -> SweepResult:
    """The singleton's requesters whose latest run has closed.

    It asks the singleton for its requesters (a query, so the list never enters its history),
    lists which of them have a run that closed since `closed_since` (named ids, so the cost
    follows this host group's requesters and never the namespace's churn: every host group
    sweeps), and confirms each by describing its latest run: a workflow continued as new, reset
    or started again under its id has a running run and keeps its leases. An id visibility cannot
    quote is described whatever its runs."""
    began = datetime.now(timezone.utc)
    next_since = max(sweep.closed_since, began - VISIBILITY_LAG)
    requesters = await client.get_workflow_handle(admission_workflow_id(sweep.host_group)).query(
        REQUESTERS_QUERY, result_type=list[str],
    )
    closed_since = literal(sweep.closed_since.astimezone(timezone.utc).isoformat())
    candidates = {requester for requester in requesters if not quotable(requester)}
    try:
        async for execution in runs_of(client, requesters, f"{_CLOSED} AND CloseTime >= {closed_since}"):
            candidates.add(execution.id)
    except RPCError as error:
        if error.status == RPCStatusCode.UNIMPLEMENTED:
            return SweepResult(gone=[], next_closed_since=sweep.closed_since, supported=False)
        raise
    running = set(await running_workflow_ids(client, sorted(candidates)))
    return SweepResult(gone=sorted(candidates - running), next_closed_since=next_since)


# How long a worker may hold one of the singleton's workflow tasks. A worker killed while holding
# one holds its host group still for this long (Temporal's default is 10 s); a task is a decision
# pass of milliseconds, and each activation stays under the SDK's 2 s deadlock detector (a pass
# takes at most max_requests_per_pass, a continued run decodes its records in slices). Continue-
# as-new keeps it.
SINGLETON_TASK_TIMEOUT = timedelta(seconds=5)


async def signal_with_start_admission(
    client: Client, task_queue: str, host_group: str, policy: AdmissionPolicy, signal: str, payload: object,
    *, search_attributes: bool = False, **limits: int | None,
) -> None:
    """Deliver `signal` to `admission:<host_group>`, starting it first if it is not running.
    `limits` set the singleton's own bounds (`AdmissionWorkflowInput`: max_history_events, ...)."""
    await client.start_workflow(
        ADMISSION_WORKFLOW,
        _input(host_group, policy, **limits),
        id=admission_workflow_id(host_group),
        task_queue=task_queue,
        start_signal=signal,
        start_signal_args=[payload],
        task_timeout=SINGLETON_TASK_TIMEOUT,
        search_attributes=_attributes(host_group, search_attributes),
        static_summary=_summary(host_group),
    )


async def set_policy_with_start(
    client: Client, task_queue: str, host_group: str, change: PolicyChange, *, search_attributes: bool = True,
) -> AdmissionPolicy:
    """Send the operator's policy change to `admission:<host_group>` (its `set_policy` signal),
    starting the workflow with that policy if none runs. It applies on the singleton's next pass."""
    await client.start_workflow(
        ADMISSION_WORKFLOW,
        _input(host_group, change.policy),
        id=admission_workflow_id(host_group),
        task_queue=task_queue,
        start_signal="set_policy",
        start_signal_args=[change],
        task_timeout=SINGLETON_TASK_TIMEOUT,
        search_attributes=_attributes(host_group, search_attributes),
        static_summary=_summary(host_group),
    )
    return change.policy


def _input(host_group: str, policy: AdmissionPolicy, **limits: int | None) -> AdmissionWorkflowInput:
    """The singleton's input; a limit left None keeps the model's default."""
    return AdmissionWorkflowInput(
        host_group=host_group, policy=policy, **{name: value for name, value in limits.items() if value is not None},
    )


def _summary(host_group: str) -> str:
    return f"admission singleton of host group {host_group}: every lease there is granted, renewed and audited here"


def _attributes(host_group: str, wanted: bool) -> TypedSearchAttributes | None:
    return TypedSearchAttributes([SearchAttributePair(MISSION_HOST_GROUP, host_group)]) if wanted else None
