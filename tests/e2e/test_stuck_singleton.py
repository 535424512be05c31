"""A host group whose singleton stops deciding is found, said in one line, and brought back with
nothing lost (docs/operations.md, "A host group that stopped deciding").

A failing workflow task leaves a workflow `Running` while the server retries the task, so nothing
shows by itself. The test breaks a host group's singleton on purpose, the way a bad deploy or a
replay fault of the SDK does (every task of it fails), and checks what an operator sees
(`conductor admission host-groups` and `usage` say STUCK with the failure's first line), then
brings it back by deploying the right code (the held lease and the queued request are there, and
the queued one is admitted once the other is given back), then resets it to its last task as the
runbook says (the lease is still held).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import httpx

from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.admission import set_policy_with_start
from tests.support.cli_support import conductor_command, environment_for, run_process
from tests.support.processes import eventually
from worker.binaries import temporal_cli
from worker.config import WorkerConfig
from worker.lease import acquire
from worker.metrics import metrics_runtime
from worker.ports import free_port
from worker.stuck import stuck
from worker.worker import build_worker
from workflows.admission.holder_workflow import AdmissionHolderWorkflow
from workflows.admission.holders import HeldRequest
from workflows.admission.messages import ADMISSION_WORKFLOW, LeaseRow, PolicyChange, QueueRow, RenewBatch, admission_workflow_id
from workflows.admission.model import AdmissionPolicy

ONE_SLOT = AdmissionPolicy(max_concurrent=1, runtime_quotas={"host": 1}, lease_ttl_seconds=600)


@workflow.defn(name=ADMISSION_WORKFLOW)
class BrokenAdmission:
    """Every task of the singleton fails, as under a bad deploy or a replay fault."""

    @workflow.run
    async def run(self, *args: Any) -> None:
        raise RuntimeError("broken on purpose by tests/e2e/test_stuck_singleton.py")


async def test_a_broken_singleton_shows_stuck_and_comes_back_with_nothing_lost(dev_client: Client, tmp_path):
    suffix = uuid.uuid4().hex[:8]
    host_group, config = f"stuck-{suffix}", WorkerConfig(data_dir=tmp_path, task_queue=f"stuck-{suffix}", admission_policy=ONE_SLOT)
    singleton = dev_client.get_workflow_handle(admission_workflow_id(host_group))
    env = environment_for(dev_client.service_client.config.target_host, CONDUCTOR_TASK_QUEUE=config.task_queue)

    async def leases_and_queue() -> tuple[list[str], list[str]]:
        leases = await singleton.query("leases", result_type=list[LeaseRow])
        queue = await singleton.query("queue", result_type=list[QueueRow])
        return [row.request_id for row in leases], [row.request_id for row in queue]

    async with build_worker(dev_client, config):
        await set_policy_with_start(dev_client, config.task_queue, host_group, PolicyChange(operator="ops", policy=ONE_SLOT))
        held = await acquire(dev_client, host_group, HeldRequest(request_id="held", orchestrator_id="ops"), holder="ops")
        waiting = asyncio.ensure_future(
            acquire(dev_client, host_group, HeldRequest(request_id="waiting", orchestrator_id="ops"), holder="ci"))

        async def queued() -> bool:
            return await leases_and_queue() == (["held"], ["waiting"])

        await eventually(queued, "one lease held and one request queued")

    # A worker whose code cannot run the singleton takes its next task: every attempt fails. It
    # serves Prometheus metrics as `conductor worker --metrics-address` does.
    metrics = f"127.0.0.1:{free_port('127.0.0.1')}"
    broken_client = await Client.connect(dev_client.service_client.config.target_host, runtime=metrics_runtime(metrics))
    # (The holder workflows run as ever: it is the singleton's code that a bad deploy broke.)
    async with Worker(broken_client, task_queue=config.task_queue, workflows=[BrokenAdmission, AdmissionHolderWorkflow],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        await singleton.signal("renew", RenewBatch(requester=held.requester, everything=True))  # news: a task

        async def found():
            return await stuck(dev_client, singleton.id)

        why = await eventually(found, "the singleton shown stuck", within=60)
        assert "broken on purpose" in why.failure and why.attempts >= 3, why
        code, out, err = await run_process(*conductor_command(), "admission", "host-groups", env=env)
        assert code == 0 and host_group in out and "STUCK" in out and "broken on purpose" in out, out + err
        code, out, err = await run_process(*conductor_command(), "admission", "host-groups", "--json", env=env)
        [row] = [row for row in json.loads(out) if row["host_group"] == host_group]
        assert row["stuck"]["attempts"] >= 3 and "broken on purpose" in row["stuck"]["failure"], row
        code, out, err = await run_process(*conductor_command(), "admission", "usage", "--host-group", host_group, env=env)
        assert code == 1 and err.count("\n") == 1 and "is stuck" in err and "broken on purpose" in err, (code, err)
        # What the alert rules of docs/operations.md read.
        async with httpx.AsyncClient() as http:
            text = (await http.get(f"http://{metrics}/metrics")).text
        failed = [line for line in text.splitlines()
                  if line.startswith("temporal_workflow_task_execution_failed") and 'workflow_type="AdmissionWorkflow"' in line]
        assert failed and float(failed[0].rsplit(" ", 1)[1]) >= 2, [line for line in text.splitlines() if "workflow_task" in line]

    # The right code again: the pending task passes on its next attempt, and nothing was lost.
    async with build_worker(dev_client, config):
        async def recovered() -> bool:
            return await stuck(dev_client, singleton.id) is None and await leases_and_queue() == (["held"], ["waiting"])

        await eventually(recovered, "the singleton with its lease and queue as they were", within=60)
        await held.give_back()  # and it decides again: the queued request is admitted
        lease = await asyncio.wait_for(waiting, 60)
        assert lease.decision.state == "admitted"

        # The runbook's step for a task that cannot be replayed: reset to the last good task. Every
        # input of the singleton is a signal, and the server applies again those after the reset point.
        code, out, err = await run_process(temporal_cli(), "workflow", "reset", "--workflow-id", singleton.id,
                                           "--type", "LastWorkflowTask", "--reason", "tests: the runbook's reset", env=env)
        assert code == 0, out + err

        async def kept() -> bool:
            return await stuck(dev_client, singleton.id) is None and await leases_and_queue() == (["waiting"], [])

        await eventually(kept, "the reset singleton with the lease it held", within=60)
        await lease.give_back()
