"""A mission of all four kinds end to end, riding out a crash of its substrate.

A real `python -m substrate serve` process (on a fixed port, so the worker's URL stays good)
is SIGKILLed while a mission's one-shot command, daemon and persistent agent run (its scheduled
collector has run once and rests `scheduled`), and started again on the same data directory.
The worker's calls fail meanwhile and are retried. Once the substrate is back, its
reconciliation says `re-adopted`; the one-shot finishes, and the conductor runs its verifier in
the child's context, so the ledger has its output and `verifier` evidence from the conductor
beside the executor's `result`. The daemon and the agent keep their tasks and processes, and no
child was dispatched twice.
"""

from __future__ import annotations

import asyncio
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace

import pytest
from temporalio.client import Client

from activities.sandbox_client import FleetClient
from substrate.server import spawn
from tests.support.mission_harness import mission_harness
from tests.substrate.test_substrate_restart import no_workload_outlives_the_test  # noqa: F401  (autouse: kills what a failure left)
from tests.support.processes import process_dead, read_pid, wait_until
from tests.support.substrate_support import EXECUTOR_TOKEN, FLEET_TOKEN
from worker.mission_control import parse_spec
from worker.ports import free_port
from workflows.workload.record import fleet_child_id

pytestmark = pytest.mark.timeout(120)


async def test_a_mission_of_every_kind_rides_out_a_substrate_crash_with_verifier_evidence(dev_client: Client, tmp_path: Path):
    port = free_port("127.0.0.1")
    data = tmp_path / "substrate"
    gate, report_pid, api_pid, agent_pid = (tmp_path / name for name in ("go", "report.pid", "api.pid", "agent.pid"))
    with ExitStack() as stack:
        first = stack.enter_context(spawn(data, FLEET_TOKEN, EXECUTOR_TOKEN, keep_workloads_on_stop=True, port=port, instances=2))
        url = first.base_url
        async with mission_harness(dev_client, SimpleNamespace(base_url=url), tmp_path) as h:  # type: ignore[arg-type]
            spec = parse_spec(h.spec("crash", [
                {"child_id": "report", "kind": "one-shot-command",
                 "prompt": f"echo $$ > {report_pid}; while [ ! -e {gate} ]; do sleep 0.1; done; echo ready > report.txt; echo report ready",
                 "verifier": "grep -q ready report.txt", "required_evidence": ["result", "verifier"]},
                {"child_id": "api", "kind": "daemon", "prompt": f"echo $$ > {api_pid}; exec sleep 300"},
                {"child_id": "agent", "kind": "persistent-agent", "prompt": f"echo $$ > {agent_pid}; exec sleep 300"},
                {"child_id": "collect", "kind": "scheduled-collector", "prompt": "echo collected", "schedule": "*/5 * * * *"},
            ], aggregation={"mode": "all-pass"}, require_distinct_targets=False))
            await h.control.start(spec)
            running = ("report", "api", "agent")

            async def all_running() -> bool:
                ledger = await h.control.show(spec.mission_id)
                states = tuple(ledger.child(c).observed_state for c in (*running, "collect"))
                return states == ("running", "healthy", "running", "scheduled")

            await h.until(all_running, "every child running (the collector resting)", within=30)
            pids = (await read_pid(report_pid), await read_pid(api_pid), await read_pid(agent_pid))
            before = await h.control.show(spec.mission_id)
            tasks = {c.child_id: c.lineage.task_id for c in before.children if c.lineage is not None}

            first.kill()  # a crash: no shutdown code runs, the workloads live on in their own sessions
            await asyncio.sleep(2.0)  # the worker's watches and calls fail meanwhile, and are retried
            assert not any(process_dead(pid) for pid in pids)
            second = stack.enter_context(spawn(data, FLEET_TOKEN, EXECUTOR_TOKEN, keep_workloads_on_stop=True, port=port, instances=2))
            assert second.base_url == url

            async with FleetClient(url, FLEET_TOKEN) as fleet:
                ids = [fleet_child_id(spec.mission_id, child) for child in running]
                for child_id in ids:
                    await fleet.get(child_id)  # a read projects the task into the record first (fleet.rs)
                classified = {row.child_id: row.classification for row in (await fleet.reconcile(0, ids)).rows}
            assert set(classified.values()) == {"re-adopted"}, classified

            gate.touch()  # the one-shot, re-adopted, finishes now; then its verifier runs
            verdict = await h.control.wait_for_verdict(spec.mission_id)
            assert verdict.parent_state == "completed", verdict.aggregation.reason
            report, api, agent, collect = (verdict.child(c) for c in ("report", "api", "agent", "collect"))
            assert report.observed_state == "succeeded" and report.output == "report ready\n"
            sources = {(e.kind, e.source) for e in report.evidence}
            assert {("result", "executor"), ("verifier", "conductor-verifier")} <= sources, sources
            assert report.note is not None and "passed" in report.note
            assert collect.observed_state == "scheduled" and collect.output == "collected\n"
            assert api.observed_state == "healthy" and agent.observed_state == "running"
            assert agent.lineage is not None and agent.lineage.session_id == f"{spec.mission_id}:agent:context"
            assert not process_dead(pids[1]) and not process_dead(pids[2])
            # Re-adopted, not dispatched again: the same tasks, one process each.
            assert {c.child_id: c.lineage.task_id for c in verdict.children if c.lineage is not None} == tasks
            assert (await read_pid(api_pid), await read_pid(agent_pid)) == pids[1:]

            await h.control.stop(spec.mission_id)
            final = await asyncio.wait_for(h.control.handle(spec.mission_id).result(), 45)
            assert final.parent_state == "completed"
        await wait_until(lambda: process_dead(pids[1]) and process_dead(pids[2]))  # stopped by its mission
