"""A mission that supervises long-lived children for long continues as new, and a long-lived
child whose mission is gone stops its runtime task (dev server, real substrate and processes)."""

from __future__ import annotations

import os
import signal

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.worker import Replayer

from tests.support.mission_harness import mission_harness
from tests.support.processes import process_alive
from tests.support.substrate_fixtures import substrate, substrate_tasks  # noqa: F401  (fixture)
from worker.mission_control import parse_spec
from worker.payloads import DATA_CONVERTER
from workflows.admission.model import AdmissionPolicy
from workflows.mission.workflow import MissionWorkflow
from workflows.workload.client import workload_workflow_id
from workflows.workload.record import fleet_child_id

# Leases renewed every second: even with no answer to its renewals (requester renewals), a
# mission's history grows by about a dozen events a second (the renewal timer, the signal, the
# workflow tasks), and the dev server of the tests suggests continue-as-new at 100 events.
FAST_RENEWALS = AdmissionPolicy(max_concurrent=8, runtime_quotas={"host": 8}, lease_ttl_seconds=3)
LONG_LIVED = [
    {"child_id": "api", "kind": "daemon", "prompt": "sleep 300"},
    {"child_id": "agent", "kind": "persistent-agent", "prompt": "sleep 300"},
]


async def runs_of(client: Client, workflow_id: str) -> list:
    runs = [run async for run in client.list_workflows(f"WorkflowId = '{workflow_id}'")]
    return sorted(runs, key=lambda run: run.start_time)


async def test_a_mission_supervising_long_lived_children_continues_as_new_and_still_stops_them(
    dev_client: Client, substrate, tmp_path
):
    async with mission_harness(dev_client, substrate, tmp_path, policy=FAST_RENEWALS) as h:
        spec = parse_spec(h.spec("long", [{"child_id": "report", "kind": "one-shot-command", "prompt": "echo ready"}, *LONG_LIVED]))
        verdict = await h.control.run(spec, max_history_events=150)
        assert verdict.parent_state == "completed", verdict.aggregation.reason
        handle = h.control.handle(spec.mission_id)

        async def continued_twice():
            # Visibility is eventually consistent: a new run may be listed before its predecessor
            # shows it continued as new.
            runs = await runs_of(dev_client, handle.id)
            done = len(runs) >= 3 and all(run.status == WorkflowExecutionStatus.CONTINUED_AS_NEW for run in runs[:-1])
            return runs if done else None

        await h.until(continued_twice, "the mission to continue as new twice", within=60)
        # The current run took over: it still renews the long-lived children's leases (a lease
        # lasts 3 s, so one that is still held after the handovers was renewed by them) ...
        held = sorted(await h.admission_leases(spec.host_group))
        assert held == sorted(fleet_child_id(spec.mission_id, c["child_id"]) for c in LONG_LIVED)
        ledger = await h.control.show(spec.mission_id)
        assert ledger.parent_state == "completed" and ledger.child("api").health == "healthy"
        assert ledger.snapshot_seq >= verdict.snapshot_seq

        # ... and stopping it stops children an earlier run started, and gives their leases back.
        await h.control.stop(spec.mission_id)
        final = await handle.result()
        assert final.parent_state == "completed"
        for child in LONG_LIVED:
            tasks = substrate_tasks(substrate, fleet_child_id(spec.mission_id, child["child_id"]))
            assert len(tasks) == 1 and not process_alive(tasks[0]["pid"])  # dispatched once, stopped
            assert final.child(child["child_id"]).observed_state == "cancelled"
        assert await h.admission_leases(spec.host_group) == []

        replayer = Replayer(workflows=[MissionWorkflow], data_converter=DATA_CONVERTER)
        for run in await runs_of(dev_client, handle.id):
            await replayer.replay_workflow(await dev_client.get_workflow_handle(handle.id, run_id=run.run_id).fetch_history())


async def test_terminating_a_mission_stops_its_long_lived_children(dev_client: Client, substrate, tmp_path):
    async with mission_harness(dev_client, substrate, tmp_path, policy=FAST_RENEWALS) as h:
        spec = parse_spec(h.spec("terminated", LONG_LIVED[:1]))
        verdict = await h.control.run(spec, alive_every_seconds=1)
        assert verdict.parent_state == "completed", verdict.aggregation.reason
        child_workflow = dev_client.get_workflow_handle(workload_workflow_id(spec.mission_id, "api"))

        # A terminate runs no cleanup in the mission, and the server does not cancel the workload
        # (it must outlive continue-as-new): it notices its mission is gone at its next sign of
        # life and stops the runtime task itself.
        await h.control.handle(spec.mission_id).terminate("operator terminated the mission")
        try:
            await child_workflow.result()
            raise AssertionError("the orphaned workload should have failed")
        except WorkflowFailureError as error:
            assert getattr(error.cause, "type", None) == "workload.orphaned"
        tasks = substrate_tasks(substrate, fleet_child_id(spec.mission_id, "api"))
        assert len(tasks) == 1 and not process_alive(tasks[0]["pid"])


async def test_a_later_run_hears_a_child_an_earlier_run_started_end_and_then_closes(dev_client: Client, substrate, tmp_path):
    async with mission_harness(dev_client, substrate, tmp_path, policy=FAST_RENEWALS) as h:
        spec = parse_spec(h.spec("ends-later", [{"child_id": "api", "kind": "daemon", "prompt": "sleep 8"}]))
        await h.control.run(spec, max_history_events=100)
        handle = h.control.handle(spec.mission_id)
        final = await handle.result()  # the daemon exits after 8 s; nobody stops the mission
        # The closing run's status from the server itself: the list below is eventually consistent
        # and may still show that run running.
        closed = await handle.describe()
        runs = await runs_of(dev_client, handle.id)
        assert len(runs) >= 2 and closed.run_id != runs[0].run_id and closed.status == WorkflowExecutionStatus.COMPLETED
        # The run that closed did not start the daemon: it learnt of its end from its last signal.
        last_run = await dev_client.get_workflow_handle(handle.id, run_id=closed.run_id).fetch_history()
        assert not any(e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED for e in last_run.events)
        assert final.child("api").observed_state not in ("running", "healthy", "starting")
        assert await h.admission_leases(spec.host_group) == []


async def test_a_carried_child_that_vanished_without_a_last_word_is_unknown_when_the_mission_stops(
    dev_client: Client, substrate, tmp_path
):
    async with mission_harness(dev_client, substrate, tmp_path, policy=FAST_RENEWALS) as h:
        spec = parse_spec(h.spec("vanished", LONG_LIVED[:1]))
        verdict = await h.control.run(spec, max_history_events=100)
        handle = h.control.handle(spec.mission_id)

        async def continued():
            return len(await runs_of(dev_client, handle.id)) >= 2 or None

        await h.until(continued, "the mission to continue as new", within=60)
        # The workload disappears without reporting (terminated by hand): no run awaits its handle.
        await dev_client.get_workflow_handle(workload_workflow_id(spec.mission_id, "api")).terminate("lost")
        await h.control.stop(spec.mission_id)
        final = await handle.result()
        api = final.child("api")
        assert api.observed_state == "unknown" and "without a last observation" in (api.note or "")
        assert final.parent_state == verdict.parent_state  # settled before; the child's state tells what happened
        assert await h.admission_leases(spec.host_group) == []
        for task in substrate_tasks(substrate, fleet_child_id(spec.mission_id, "api")):
            if process_alive(task["pid"]):
                os.kill(task["pid"], signal.SIGKILL)  # nobody supervised it any more
