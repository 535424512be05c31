"""Record the workflow histories that tests/test_replay.py replays on every run.

    .venv/bin/python -m tests.record_histories [--tag TAG] [--only PREFIX]

Runs real scenarios on a fresh dev server with the local substrate and writes one
JSON history per workflow run into tests/histories/. Re-record after an intended
workflow change only together with a `workflow.patched` branch for the old path,
keeping the old histories: they stand for workflows already running in production.
`--tag TAG` appends `-TAG` to every file name, so a new recording sits beside them;
`--only PREFIX` (repeatable) writes only the histories whose names start with one of them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.admission import signal_with_start_admission
from activities.fleet import FleetActivities
from substrate.server import serve_in_thread
from tests.decision_sink import DecisionSinkWorkflow
from tests.substrate_fixtures import substrate_config
from tests.substrate_support import EXECUTOR_TOKEN, FLEET_TOKEN
from worker.binaries import temporal_cli
from worker.config import WorkerConfig
from worker.mission_control import MissionControl, parse_spec
from worker.worker import build_worker
from workflows.admission.messages import SubmitBatch, admission_workflow_id
from workflows.admission.model import AdmissionPolicy, AdmissionRequest
from workflows.admission.probe import ProbeInput, ProbeRequest
from workflows.mission.search import SEARCH_ATTRIBUTES

HISTORIES = Path(__file__).resolve().parent / "histories"


TAG = ""
ONLY: tuple[str, ...] = ("",)


async def save_chain(client: Client, workflow_id: str, name: str, *, last_runs: int = 2) -> None:
    """Write the last `last_runs` runs of a workflow id (continue-as-new chains have several)."""
    if not name.startswith(ONLY):  # a tuple of prefixes
        return
    runs = [execution async for execution in client.list_workflows(f"WorkflowId = '{workflow_id}'")]
    runs.sort(key=lambda execution: execution.start_time)
    for index, execution in enumerate(runs[-last_runs:]):
        history = await client.get_workflow_handle(workflow_id, run_id=execution.run_id).fetch_history()
        suffix = "" if len(runs) == 1 else f"-run{len(runs) - min(last_runs, len(runs)) + index + 1}"
        (HISTORIES / f"{name}{suffix}{TAG}.json").write_text(json.dumps(json.loads(history.to_json()), indent=1))
        print("recorded", name + suffix + TAG, len(history.events), "events")


async def main() -> None:
    HISTORIES.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        scratch_path = Path(scratch)
        env = await WorkflowEnvironment.start_local(
            data_converter=pydantic_data_converter,
            dev_server_existing_path=temporal_cli(),
            dev_server_extra_args=["--dynamic-config-value", "limit.historyCount.suggestContinueAsNew=100"],
            search_attributes=SEARCH_ATTRIBUTES,
        )
        try:
            with serve_in_thread(substrate_config(scratch_path / "substrate")) as substrate:
                await record(env.client, substrate, scratch_path)
        finally:
            await env.shutdown()


async def record(client: Client, substrate, scratch: Path) -> None:
    policy = AdmissionPolicy(max_concurrent=4, runtime_quotas={"host": 4}, lease_ttl_seconds=6, allow_preemption=True)
    config = WorkerConfig(
        data_dir=scratch, task_queue="record", admission_policy=policy,
        fleet_url=substrate.base_url, executor_url=substrate.base_url,
    )
    fleet = FleetActivities(substrate.base_url, substrate.base_url, FLEET_TOKEN, EXECUTOR_TOKEN)
    async with build_worker(client, config, fleet=fleet, extra_workflows=[DecisionSinkWorkflow]):
        # Admission: probes that wait, renew, get preempted; then a burst across continue-as-new.
        probes = [
            await client.start_workflow(
                "AdmissionProbeWorkflow",
                ProbeInput(host_group="probes", requests=[ProbeRequest(request_id=name, preemptible=True, priority=prio)],
                           hold_seconds=hold),
                id=f"probe-{name}", task_queue="record",
            )
            for name, prio, hold in (("steady", 0, 8), ("waiting", 1, 2), ("urgent", 9, 2))
        ]
        for probe in probes:
            await probe.result()
        sink = await client.start_workflow(DecisionSinkWorkflow.run, id="sink", task_queue="record")
        for index in range(150):
            request = AdmissionRequest(
                request_id=f"burst-{index:03d}", orchestrator_id="recorder", environment="default", provider="local",
                runtime_kind="container", priority=index % 3, submitted_at=datetime.now(timezone.utc), queue_timeout_seconds=600,
            )
            await signal_with_start_admission(client, "record", "burst", policy, "submit",
                                              SubmitBatch(requester=sink.id, requests=[request]), max_history_events=100)
        await asyncio.sleep(3)

        # Missions: a mixed one stopped after its verdict, and a cancelled one.
        control = MissionControl(client, "record")
        mixed = parse_spec({
            "mission_id": "recorded-mixed", "orchestrator_id": "recorder", "goal": "record histories",
            "host_group": "missions", "aggregation": {"mode": "quorum", "minimum_successes": 3},
            "children": [
                {"child_id": "report", "kind": "one-shot-command", "prompt": "echo report", "required_evidence": ["result"]},
                {"child_id": "failing", "kind": "one-shot-command", "prompt": "exit 2"},
                {"child_id": "api", "kind": "daemon", "prompt": "sleep 300"},
                {"child_id": "agent", "kind": "persistent-agent", "prompt": "sleep 300"},
            ],
        })
        await control.run(mixed)
        # Supervising its daemon and agent, the mission continues as new once its history is long
        # (this server suggests it at 100 events); stop it in its second run.
        for _ in range(300):
            runs = [run async for run in client.list_workflows("WorkflowId = 'mission:recorded-mixed'")]
            if len(runs) >= 2:
                break
            await asyncio.sleep(0.2)
        await control.stop(mixed.mission_id)
        await control.handle(mixed.mission_id).result()
        cancelled = parse_spec({
            "mission_id": "recorded-cancel", "orchestrator_id": "recorder", "goal": "record a cancellation",
            "host_group": "missions", "aggregation": {"mode": "fail-fast"},
            "children": [{"child_id": "sleeper", "kind": "one-shot-command", "prompt": "sleep 60"}],
        })
        await control.start(cancelled)
        await asyncio.sleep(3)
        await control.cancel(cancelled.mission_id)
        try:
            await control.handle(cancelled.mission_id).result()
        except Exception:
            pass

        await save_chain(client, "probe-steady", "admission-probe-steady")
        await save_chain(client, "probe-urgent", "admission-probe-urgent")
        await save_chain(client, admission_workflow_id("probes"), "admission-probes", last_runs=2)
        await save_chain(client, admission_workflow_id("burst"), "admission-burst", last_runs=2)
        await save_chain(client, "mission:recorded-mixed", "mission-mixed", last_runs=2)
        await save_chain(client, "mission:recorded-cancel", "mission-cancelled")
        await save_chain(client, "workload:recorded-mixed:report", "workload-one-shot")
        await save_chain(client, "workload:recorded-mixed:api", "workload-daemon")
        await save_chain(client, "workload:recorded-cancel:sleeper", "workload-cancelled")
        await sink.signal("done")
    await fleet.aclose()


if __name__ == "__main__":
    from worker.process import exit_now

    parser = argparse.ArgumentParser(description="Record the histories that tests/test_replay.py replays.")
    parser.add_argument("--tag", default="", help="suffix for every file name, to keep older recordings")
    parser.add_argument("--only", action="append", default=[], help="write only the histories whose names start with this (repeatable)")
    options = parser.parse_args()
    TAG = f"-{options.tag}" if options.tag else ""
    ONLY = tuple(options.only) or ("",)
    asyncio.run(main())
    exit_now(0)
