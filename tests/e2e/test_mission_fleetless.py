"""A mission on an executor without the fleet API (`conductor substrate serve --no-fleet`: 404 on
/api/v2/fleet/*, as an Agentic Sandbox built without the fleet router answers).

The worker probes it and finds it fleet-less; the conductor keeps the one-shot's and the agent's
records itself (workflows/workload/kept.py) and dispatches over A2A alone; a daemon is refused as
`unsupported` before admission; a question is asked and answered on the same wire; the executor
is killed and started again, and nothing is dispatched twice.
"""

from __future__ import annotations

import asyncio
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from temporalio.client import Client

from activities.fleet import FleetActivities
from substrate.server import spawn
from tests.substrate.test_substrate_restart import no_workload_outlives_the_test  # noqa: F401  (autouse)
from tests.support.mission_harness import mission_harness
from tests.support.processes import process_dead, read_pid
from tests.support.substrate_fixtures import substrate_config, substrate_tasks
from tests.support.substrate_support import EXECUTOR_TOKEN, FLEET_TOKEN
from worker.mission_control import parse_spec
from worker.ports import free_port
from workflows.mission.questions import AnswerRequest
from workflows.mission.supervisor import UNSUPPORTED_KIND
from workflows.workload.record import fleet_child_id

pytestmark = pytest.mark.timeout(150)


async def test_one_shots_agents_and_questions_run_without_the_fleet_api_and_ride_out_an_executor_restart(
    dev_client: Client, tmp_path: Path,
) -> None:
    port = free_port("127.0.0.1")
    data = tmp_path / "substrate"
    agent_pid = tmp_path / "agent.pid"
    store = SimpleNamespace(config=substrate_config(data))  # where substrate_tasks reads its tasks
    with ExitStack() as stack:
        first = stack.enter_context(spawn(data, FLEET_TOKEN, EXECUTOR_TOKEN, keep_workloads_on_stop=True, port=port,
                                          instances=2, fleet_api=False))  # fmt: skip
        url = first.base_url
        async with httpx.AsyncClient(base_url=url) as raw:
            probe = await raw.get("/api/v2/fleet/workloads", headers={"Authorization": f"Bearer {FLEET_TOKEN}"})
        assert probe.status_code == 404  # no fleet router
        probed = FleetActivities(url, url, FLEET_TOKEN, EXECUTOR_TOKEN)
        try:
            assert await probed.fleet_api() is False
            assert {t.fleet_api for t in (await probed.list_targets()).targets} == {False}
        finally:
            await probed.aclose()

        async with mission_harness(dev_client, SimpleNamespace(base_url=url), tmp_path) as h:  # type: ignore[arg-type]
            spec = parse_spec(h.spec("fleetless", [
                {"child_id": "cmd", "kind": "one-shot-command", "prompt": "echo one", "required_evidence": ["result"]},
                {"child_id": "ask", "kind": "one-shot-command", "prompt": "$CONDUCTOR_ASK 'Go on?' && echo went on"},
                {"child_id": "agent", "kind": "persistent-agent", "prompt": f"echo $$ > {agent_pid}; exec sleep 300"},
                {"child_id": "api", "kind": "daemon", "prompt": "exec sleep 300"},
            ], aggregation={"mode": "quorum", "minimum_successes": 3}, require_distinct_targets=False))
            await h.control.start(spec)
            mission = spec.mission_id

            async def asking():
                ledger = await h.control.show(mission)
                return ledger if ledger.child("ask").question is not None and ledger.child("agent").observed_state == "running" else None

            ledger = await h.until(asking, "the question asked and the agent running", within=40)
            daemon = ledger.child("api")
            assert (daemon.observed_state, daemon.outcome, daemon.error_code) == ("failed", "failed", UNSUPPORTED_KIND)
            assert [(c.name, c.status) for c in daemon.capabilities] == [("daemon", "unsupported")]
            assert daemon.admission.request_id is None and "fleet API" in daemon.note  # no request, no lease
            assert substrate_tasks(store, fleet_child_id(mission, "api")) == []
            assert ledger.child("cmd").observed_state == "succeeded" and ledger.child("cmd").output.strip() == "one"
            assert [a.kind for a in ledger.child("cmd").artifacts] == ["log", "result"]  # projected as fleet.rs does
            agent_task = ledger.child("agent").lineage.task_id
            assert ledger.child("agent").lineage.session_id is not None
            pid = await read_pid(agent_pid)

            first.kill()  # the executor crashes; its processes live on, its tasks are in its SQLite store
            await asyncio.sleep(1.5)
            second = stack.enter_context(spawn(data, FLEET_TOKEN, EXECUTOR_TOKEN, keep_workloads_on_stop=True,
                                               port=port, instances=2, fleet_api=False))  # fmt: skip
            assert second.base_url == url and not process_dead(pid)

            result = await h.control.answer(mission, AnswerRequest(child_id="ask", operator="alice", payload={"approved": True}))
            assert result.outcome == "delivered"
            verdict = await h.control.wait_for_verdict(mission)
            assert verdict.parent_state == "completed", verdict.aggregation.reason
            assert "went on" in verdict.child("ask").output
            assert verdict.child("agent").lineage.task_id == agent_task  # re-read after the restart, never re-sent
            for child_id in ("cmd", "ask", "agent"):
                assert len(substrate_tasks(store, fleet_child_id(mission, child_id))) == 1
            await h.control.stop(mission)
            final = await h.control.handle(mission).result()
            assert final.child("agent").observed_state == "cancelled"
            assert process_dead(pid)
