"""End-to-end harness: dev server + real substrate over HTTP + a worker + MissionControl."""

from __future__ import annotations

import uuid
from contextlib import asynccontextmanager
from pathlib import Path

from temporalio.client import Client

from activities.fleet import FleetActivities
from substrate.server import RunningSubstrate
from tests.support.processes import eventually
from tests.support.substrate_support import EXECUTOR_TOKEN, FLEET_TOKEN
from worker.config import WorkerConfig
from worker.mission_control import MissionControl
from worker.worker import build_worker
from workflows.admission.messages import LeaseRow, admission_workflow_id
from workflows.admission.model import AdmissionPolicy

POLICY = AdmissionPolicy(max_concurrent=8, runtime_quotas={"host": 8}, lease_ttl_seconds=30)


async def events_of_every_run(client: Client, workflow_id: str) -> list:
    """Every event of every run of `workflow_id` (a mission may continue as new), oldest run first."""
    runs = [run async for run in client.list_workflows(f'WorkflowId = "{workflow_id}"')]
    events = []
    for run in sorted(runs, key=lambda run: run.start_time):
        events.extend((await client.get_workflow_handle(workflow_id, run_id=run.run_id).fetch_history()).events)
    return events


class MissionHarness:
    def __init__(self, client: Client, config: WorkerConfig, substrate: RunningSubstrate, suffix: str) -> None:
        self.client = client
        self.config = config
        self.substrate = substrate
        self.suffix = suffix
        self.control = MissionControl(client, config.task_queue)

    def cli_env(self) -> dict[str, str]:
        """Environment that points the `conductor` CLI at this harness."""
        return {
            "TEMPORAL_ADDRESS": self.client.service_client.config.target_host,
            "CONDUCTOR_TASK_QUEUE": self.config.task_queue,
        }

    async def admission_leases(self, host_group: str) -> list[str]:
        handle = self.client.get_workflow_handle(admission_workflow_id(host_group))
        return [row.request_id for row in await handle.query("leases", result_type=list[LeaseRow])]

    async def until(self, check, what: str, within: float = 30.0):
        return await eventually(check, what, within, interval=0.1)

    def spec(self, mission: str, children: list[dict], **fields: object) -> dict:
        """A spec dict with ids unique to this test (the substrate is shared by the session)."""
        return {
            "mission_id": f"{mission}-{self.suffix}",
            "orchestrator_id": "tests",
            "goal": f"test {mission}",
            "host_group": f"hg-{self.suffix}",
            "children": children,
            **fields,
        }


@asynccontextmanager
async def mission_harness(
    client: Client, substrate: RunningSubstrate, tmp_path: Path, policy: AdmissionPolicy = POLICY, suffix: str | None = None,
    *, as_in_production: bool = False,
):
    """A worker for one test; pass the `suffix` of an earlier harness to restart "the same" worker.
    Tests fail a workflow on any exception, so that a bug shows at once; `as_in_production` keeps the
    production worker's rule instead (only typed failures fail a workflow; anything else retries its task)."""
    suffix = suffix or uuid.uuid4().hex[:8]
    config = WorkerConfig(
        data_dir=tmp_path, task_queue=f"tq-{suffix}", admission_policy=policy,
        fleet_url=substrate.base_url, executor_url=substrate.base_url,
    )
    fleet = FleetActivities(substrate.base_url, substrate.base_url, FLEET_TOKEN, EXECUTOR_TOKEN)
    try:
        options = {} if as_in_production else {"workflow_failure_exception_types": [Exception]}
        async with build_worker(client, config, fleet=fleet, **options):
            yield MissionHarness(client, config, substrate, suffix)
    finally:
        await fleet.aclose()
