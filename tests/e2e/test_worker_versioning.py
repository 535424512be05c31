"""Worker Deployment Versioning on the real dev server: a mission keeps the build it started on.

Two worker versions of the real workflows share one task queue. A mission started while v1 is
current stays pinned to v1 after v2 becomes current (its daemon keeps it running past its verdict,
and its stop is handled by v1); a mission started afterwards runs on v2. Workload children follow
their parent's version, even one started after the switch. The old version is then drained with
the `temporal` CLI commands docs/deploy.md gives operators.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType, VersioningBehavior
from temporalio.api.workflowservice.v1 import (
    DescribeWorkerDeploymentRequest,
    SetWorkerDeploymentCurrentVersionRequest,
)
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from activities.fleet import FleetActivities
from tests.support.substrate_fixtures import substrate  # noqa: F401  (fixture)
from tests.support.cli_support import conductor_now
from tests.support.mission_harness import POLICY
from tests.support.processes import eventually
from tests.support.substrate_support import EXECUTOR_TOKEN, FLEET_TOKEN
from worker.binaries import temporal_cli
from worker.config import WorkerConfig
from worker.inputs import InputError
from worker.mission_control import MissionControl, parse_spec
from worker.worker import build_worker
from workflows.ids import admission_workflow_id, workload_workflow_id


async def _make_current(client: Client, deployment: str, build_id: str) -> None:
    """Set the current version once the server knows it (a version exists only after a poll)."""

    async def attempt() -> bool:
        try:
            await client.workflow_service.set_worker_deployment_current_version(
                SetWorkerDeploymentCurrentVersionRequest(
                    namespace=client.namespace, deployment_name=deployment, build_id=build_id, identity="tests"
                )
            )
        except RPCError:
            return False
        return True

    await eventually(attempt, f"{deployment}.{build_id} made current", 20.0, interval=0.2)
    described = await client.workflow_service.describe_worker_deployment(
        DescribeWorkerDeploymentRequest(namespace=client.namespace, deployment_name=deployment)
    )
    assert described.worker_deployment_info.routing_config.current_deployment_version.build_id == build_id


async def _temporal(client: Client, *argv: str) -> subprocess.CompletedProcess[str]:
    """The bundled `temporal` CLI against the test's server, as docs/deploy.md has operators run it."""
    address = ["--address", client.service_client.config.target_host, "--namespace", client.namespace]
    return await asyncio.to_thread(
        subprocess.run, [temporal_cli(), *argv, *address], capture_output=True, text=True, timeout=30
    )


async def _running_on(client: Client, deployment: str, build_id: str) -> set[str]:
    """Ids of the running workflows still pinned to a version (docs/deploy.md's drain check)."""
    query = f"TemporalWorkerDeploymentVersion = '{deployment}:{build_id}' AND ExecutionStatus = 'Running'"
    listed = await _temporal(client, "workflow", "list", "--query", query, "--output", "json")
    assert listed.returncode == 0, listed.stderr
    return {row["execution"]["workflowId"] for row in json.loads(listed.stdout or "[]")}


async def _task_build_ids(handle: WorkflowHandle, after_event: int = 0) -> list[str]:
    """The build id that completed each workflow task past `after_event`."""
    return [
        event.workflow_task_completed_event_attributes.deployment_version.build_id
        async for event in handle.fetch_history_events()
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED and event.event_id > after_event
    ]


async def _pinned_to(handle: WorkflowHandle) -> tuple[int, str]:
    info = (await handle.describe()).raw_description.workflow_execution_info.versioning_info
    return info.behavior, info.deployment_version.build_id


async def _exists(handle: WorkflowHandle) -> bool:
    try:
        await handle.describe()
    except RPCError as error:
        if error.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    return True


async def _last_event_id(handle: WorkflowHandle) -> int:
    return max([event.event_id async for event in handle.fetch_history_events()])


def _spec(suffix: str, name: str) -> dict:
    return {
        "mission_id": f"{name}-{suffix}",
        "orchestrator_id": "tests",
        "goal": f"test {name}",
        # Each mission its own host group, so each has an admission singleton of its own.
        "host_group": f"hg-{name}-{suffix}",
        "children": [{"child_id": "api", "kind": "daemon", "prompt": "sleep 300"}],
    }


async def test_a_running_mission_finishes_on_its_version_while_new_missions_start_on_the_current(
    dev_client: Client, substrate, tmp_path: Path  # noqa: F811
):
    suffix = uuid.uuid4().hex[:8]
    deployment = f"conductor-{suffix}"
    base = dict(
        task_queue=f"tq-{suffix}", admission_policy=POLICY.model_copy(update={"max_concurrent": 1, "runtime_quotas": {"host": 1}}),
        fleet_url=substrate.base_url, executor_url=substrate.base_url, deployment_name=deployment,
    )
    v1 = WorkerConfig(data_dir=tmp_path / "v1", build_id="v1", **base)
    v2 = WorkerConfig(data_dir=tmp_path / "v2", build_id="v2", **base)
    control = MissionControl(dev_client, v1.task_queue)
    fleet = FleetActivities(substrate.base_url, substrate.base_url, FLEET_TOKEN, EXECUTOR_TOKEN)
    try:
        async with build_worker(dev_client, v1, fleet=fleet, workflow_failure_exception_types=[Exception]):
            await _make_current(dev_client, deployment, "v1")
            # One slot: the one-shot holds it, so the daemon's workload starts only once v2 is current.
            old = parse_spec({**_spec(suffix, "old"), "children": [
                {"child_id": "first", "kind": "one-shot-command", "prompt": "sleep 3"}, *_spec(suffix, "old")["children"],
            ]})
            await control.start(old)
            old_mission = control.handle(old.mission_id)
            first = dev_client.get_workflow_handle(workload_workflow_id(old.mission_id, "first"))
            old_workload = dev_client.get_workflow_handle(workload_workflow_id(old.mission_id, "api"))
            await eventually(lambda: _exists(first), "the one-shot's workload started", 20.0, 0.1)

            async with build_worker(dev_client, v2, fleet=fleet, workflow_failure_exception_types=[Exception]):
                switch = await _last_event_id(old_mission)

                async def made_current() -> bool:
                    done = await _temporal(
                        dev_client, "worker", "deployment", "set-current-version",
                        "--deployment-name", deployment, "--build-id", "v2", "--yes",
                    )
                    return done.returncode == 0

                await eventually(made_current, "v2 made current with the temporal CLI", 20.0, interval=0.2)
                await _make_current(dev_client, deployment, "v2")  # idempotent; asserts it is current
                assert not await _exists(old_workload), "the daemon was admitted before v2 became current"

                verdict = await control.wait_for_verdict(old.mission_id)
                assert verdict.parent_state == "completed", verdict.aggregation.reason
                assert verdict.child("api").health == "healthy"
                # The daemon's workload, started after the switch by a mission pinned to v1, is pinned to v1.
                for handle in (old_mission, first, old_workload):
                    assert await _pinned_to(handle) == (VersioningBehavior.VERSIONING_BEHAVIOR_PINNED, "v1")

                new = parse_spec(_spec(suffix, "new"))
                verdict = await control.run(new)
                assert verdict.parent_state == "completed", verdict.aggregation.reason
                new_mission = control.handle(new.mission_id)
                new_workload = dev_client.get_workflow_handle(workload_workflow_id(new.mission_id, "api"))
                for handle in (new_mission, new_workload):
                    assert await _pinned_to(handle) == (VersioningBehavior.VERSIONING_BEHAVIOR_PINNED, "v2")
                # The admission singletons were started on the version current at the time, and stay there.
                for spec, build in ((old, "v1"), (new, "v2")):
                    singleton = dev_client.get_workflow_handle(admission_workflow_id(spec.host_group))
                    assert (await _pinned_to(singleton))[1] == build

                old_singleton = admission_workflow_id(old.host_group)
                pinned_to_v1 = {old_mission.id, old_workload.id, old_singleton}

                async def v1_holds(expected: set[str]) -> bool:
                    return await _running_on(dev_client, deployment, "v1") == expected

                await eventually(lambda: v1_holds(pinned_to_v1), "the old mission's workflows listed on v1", 10.0, 0.2)

                # Stopping the old mission: v2 is current and polling, yet v1 handles every task.
                await control.stop(old.mission_id)
                assert (await old_mission.result()).parent_state == "completed"
                for handle in (old_mission, old_workload):
                    after = await _task_build_ids(handle, switch if handle is old_mission else 0)
                    assert after and set(after) == {"v1"}, (handle.id, after)
                    assert set(await _task_build_ids(handle)) == {"v1"}
                assert set(await _task_build_ids(first)) == {"v1"}

                # Only the host group's admission singleton still needs v1; moved to v2, v1 is drained.
                await eventually(lambda: v1_holds({old_singleton}), "only the singleton left on v1", 10.0, 0.2)
                moved = await _temporal(
                    dev_client, "workflow", "update-options", "--workflow-id", old_singleton,
                    "--versioning-override-behavior", "pinned", "--versioning-override-deployment-name", deployment,
                    "--versioning-override-build-id", "v2",
                )
                assert moved.returncode == 0, moved.stderr
                await eventually(lambda: v1_holds(set()), "nothing left running on v1", 10.0, 0.2)
                # The moved singleton admits a new mission of its host group, on v2.
                singleton = dev_client.get_workflow_handle(old_singleton)
                moved_at = await _last_event_id(singleton)
                again = parse_spec({**_spec(suffix, "again"), "host_group": old.host_group})
                verdict = await control.run(again)
                assert verdict.parent_state == "completed", verdict.aggregation.reason
                await control.stop(again.mission_id)
                await control.handle(again.mission_id).result()
                after = await _task_build_ids(singleton, moved_at)
                assert after and set(after) == {"v2"}, after

                await control.stop(new.mission_id)
                assert (await new_mission.result()).parent_state == "completed"
                for handle in (new_mission, new_workload):
                    assert set(await _task_build_ids(handle)) == {"v2"}, handle.id
    finally:
        await fleet.aclose()


CLI = "from worker.cli import main; main()"  # as the console script


async def test_conductor_worker_polls_as_the_version_its_options_name(dev_client: Client, tmp_path: Path):
    suffix = uuid.uuid4().hex[:8]
    (tmp_path / "temporal.toml").write_text("")
    env = {
        **os.environ, "TEMPORAL_CONFIG_FILE": str(tmp_path / "temporal.toml"),
        "TEMPORAL_ADDRESS": dev_client.service_client.config.target_host, "CONDUCTOR_DATA_DIR": str(tmp_path),
        "CONDUCTOR_TASK_QUEUE": f"tq-{suffix}", "CONDUCTOR_DEPLOYMENT_NAME": "from-env", "CONDUCTOR_BUILD_ID": "env",
    }
    deployment = f"flag-{suffix}"
    worker = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CLI, "worker", "--deployment-name", deployment, "--build-id", "b7", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        line = (await asyncio.wait_for(worker.stdout.readline(), 30)).decode()  # type: ignore[union-attr]
        assert f"version {deployment}.b7 (pinned)" in line, line

        async def registered() -> list[str]:
            try:
                described = await dev_client.workflow_service.describe_worker_deployment(
                    DescribeWorkerDeploymentRequest(namespace=dev_client.namespace, deployment_name=deployment)
                )
            except RPCError:
                return []
            return [v.deployment_version.build_id for v in described.worker_deployment_info.version_summaries]

        assert await eventually(registered, "the worker's version registered by its poll", 20.0, 0.2) == ["b7"]
    finally:
        worker.send_signal(signal.SIGINT)
        await asyncio.wait_for(worker.wait(), 30)
    assert worker.returncode == 0, (await worker.stderr.read()).decode()  # type: ignore[union-attr]


def test_half_a_deployment_version_is_refused_in_one_line(capsys, monkeypatch):
    for name in ("CONDUCTOR_DEPLOYMENT_NAME", "CONDUCTOR_BUILD_ID"):
        monkeypatch.delenv(name, raising=False)
    refused = conductor_now(capsys, "worker", "--build-id", "b7")
    assert refused.code == 2
    assert "CONDUCTOR_DEPLOYMENT_NAME (--deployment-name)" in refused.line and "CONDUCTOR_BUILD_ID" in refused.line

    with pytest.raises(InputError) as refused:
        WorkerConfig.from_env({"CONDUCTOR_DEPLOYMENT_NAME": "conductor"})
    message = str(refused.value)
    assert "\n" not in message and "CONDUCTOR_DEPLOYMENT_NAME" in message and "CONDUCTOR_BUILD_ID" in message
    config = WorkerConfig.from_env({"CONDUCTOR_DEPLOYMENT_NAME": "conductor", "CONDUCTOR_BUILD_ID": "b7"})
    assert (config.deployment_name, config.build_id) == ("conductor", "b7")
    assert WorkerConfig.from_env({}).deployment_name is None
