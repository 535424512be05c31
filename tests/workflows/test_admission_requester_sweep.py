"""The requester sweep: a requester that closed without giving its leases back loses them at the
next sweep, not at the end of a long TTL (docs/scaling.md).

Against the real dev server: visibility's listing of closed runs is the whole mechanism, so a
fake would test nothing. The time-skipping test server has no listing; the singleton must say
so once and go on.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.admission import find_gone_requesters, signal_with_start_admission
from tests.support.admission_harness import admission_harness
from tests.workflows.test_admission_workflow import audit_of
from workflows.admission.messages import (
    FIND_GONE_REQUESTERS,
    REQUESTERS_QUERY,
    PolicyChange,
    RequesterSweep,
    admission_workflow_id,
)
from workflows.admission.model import AdmissionPolicy
from workflows.admission.probe import ProbeRequest

GONE = "requester closed without giving it back"


async def sweeps_in(client: Client, workflow_id: str) -> int:
    """Requester sweeps the singleton has scheduled, over every run of its chain."""
    count = 0
    async for run in client.list_workflows(f"WorkflowId = '{workflow_id}'"):
        history = await client.get_workflow_handle(workflow_id, run_id=run.run_id).fetch_history()
        count += sum(
            1 for event in history.events
            if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            and event.activity_task_scheduled_event_attributes.activity_type.name == FIND_GONE_REQUESTERS
        )
    return count


async def test_a_terminated_requesters_leases_go_to_the_queue_at_the_next_sweep_not_at_the_ttl(
    dev_client: Client, tmp_path,
):
    # An hour's TTL: only the sweep (every 2 s here) can give the capacity back within the test.
    policy = AdmissionPolicy(max_concurrent=2, lease_ttl_seconds=3600, requester_sweep_seconds=2)
    async with admission_harness(dev_client, tmp_path, policy) as h:
        await signal_with_start_admission(
            dev_client, h.config.task_queue, h.host_group, policy, "set_policy",
            PolicyChange(operator="test", policy=policy),
        )
        gone = await h.start_probe("gone", ProbeRequest(request_id="gone-1"), hold_seconds=3600)
        alive = await h.start_probe("alive", ProbeRequest(request_id="alive-1"), hold_seconds=3600)
        await h.until_leased("gone-1", "alive-1")
        waiting = await h.start_probe("waiting", ProbeRequest(request_id="waiting-1"), hold_seconds=3600)
        await h.until_queued("waiting-1")

        assert set(await h.query(REQUESTERS_QUERY, result_type=list[str])) == {gone.id, alive.id, waiting.id}
        await gone.terminate(reason="an operator ended it; it never gave its lease back")
        await h.until_leased("waiting-1", "alive-1")  # within the harness's 30 s, against an hour's TTL
        assert "gone-1" not in await h.leased()

        [released] = [event for event in await audit_of(h, "gone-1") if event.type == "released"]
        assert released.reason == GONE
        # The living holder keeps its lease through sweep after sweep.
        before = await sweeps_in(dev_client, h.admission.id)
        await h.eventually(lambda: _more_sweeps(dev_client, h.admission.id, before + 2), "two more sweeps")
        assert set(await h.leased()) == {"alive-1", "waiting-1"}
        assert set(await h.query(REQUESTERS_QUERY, result_type=list[str])) == {alive.id, waiting.id}
        for probe in (alive, waiting):
            await probe.signal("finish")
            await probe.result()


async def _more_sweeps(client: Client, workflow_id: str, at_least: int) -> bool:
    return await sweeps_in(client, workflow_id) >= at_least


@workflow.defn(name="SweepTestSingleton")
class _Singleton:
    """Stands in for the admission workflow's one query the sweep asks: who its requesters are."""

    def __init__(self) -> None:
        self._requesters: list[str] = []

    @workflow.run
    async def run(self, requesters: list[str]) -> None:
        self._requesters = requesters
        await workflow.wait_condition(lambda: False)

    @workflow.query(name=REQUESTERS_QUERY)
    def requesters(self) -> list[str]:
        return self._requesters


@workflow.defn(name="SweepTestRequester")
class _Requester:
    @workflow.run
    async def run(self, mode: str) -> None:
        if mode == "continue":
            workflow.continue_as_new("wait")
        if mode == "wait":
            await workflow.wait_condition(lambda: False)


async def test_the_sweep_finds_closed_requesters_only_and_never_one_that_lives_on_in_a_new_run(dev_client: Client):
    task_queue = f"sweep-{uuid.uuid4().hex[:8]}"
    host_group = f"sweep-{uuid.uuid4().hex[:8]}"
    ids = {name: f"{host_group}-{name}" for name in ("terminated", "completed", "continued", "restarted", "running", "stranger")}
    ids["unquotable"] = f'{host_group}-"unquotable"'  # visibility cannot be asked about it by name
    since = datetime.now(timezone.utc) - timedelta(seconds=1)
    async with Worker(dev_client, task_queue=task_queue, workflows=[_Singleton, _Requester],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        holders = [ids[name] for name in ("terminated", "completed", "continued", "restarted", "running", "unquotable")]
        await dev_client.start_workflow(_Singleton.run, holders, id=admission_workflow_id(host_group), task_queue=task_queue)
        started = {
            name: await dev_client.start_workflow(_Requester.run, mode, id=ids[name], task_queue=task_queue)
            for name, mode in (("terminated", "wait"), ("completed", "done"), ("continued", "continue"),
                               ("restarted", "wait"), ("running", "wait"), ("stranger", "done"), ("unquotable", "wait"))
        }
        await started["terminated"].terminate()
        await started["unquotable"].terminate()
        await started["restarted"].terminate()
        await dev_client.start_workflow(_Requester.run, "wait", id=ids["restarted"], task_queue=task_queue)
        await started["completed"].result()
        await started["stranger"].result()

        async def found():  # visibility is eventually consistent
            result = await find_gone_requesters(dev_client, RequesterSweep(host_group=host_group, closed_since=since))
            return result if set(result.gone) >= {ids["terminated"], ids["completed"]} else None

        from tests.support.processes import eventually

        result = await eventually(found, "the closed requesters in visibility", 20)
        # Terminated and completed runs are gone, and so is a closed one whose id visibility cannot
        # quote; a run continued as new, an id started again after a termination, a running one
        # and a closed workflow that holds nothing are not.
        assert sorted(result.gone) == sorted([ids["terminated"], ids["completed"], ids["unquotable"]])
        assert result.supported
        # The next sweep reads from a little before this one began (visibility lags), never earlier than this one did.
        assert since <= result.next_closed_since <= datetime.now(timezone.utc)
        for handle_id in (admission_workflow_id(host_group), ids["continued"], ids["restarted"], ids["running"]):
            await dev_client.get_workflow_handle(handle_id).terminate()


async def test_on_a_server_that_cannot_list_workflows_the_singleton_stops_sweeping_and_goes_on(
    fresh_time_skipping_env: WorkflowEnvironment, tmp_path,
):
    client = fresh_time_skipping_env.client
    policy = AdmissionPolicy(max_concurrent=1, lease_ttl_seconds=300)
    async with admission_harness(client, tmp_path, policy) as h:
        probe = await h.start_probe("holder", ProbeRequest(request_id="held"), hold_seconds=3600)
        result = await probe.result()  # an hour of skipped time: 120 sweeps were due at 30 s
        assert result.final["held"].state == "released"
        history = await h.admission.fetch_history()
        sweeps = [
            event for event in history.events
            if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            and event.activity_task_scheduled_event_attributes.activity_type.name == FIND_GONE_REQUESTERS
        ]
        assert len(sweeps) == 1, "the singleton should try once, learn the server cannot list, and stop"
