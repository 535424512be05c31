"""Helpers for admission workflow tests: a worker on its own task queue, probes, queries."""

from __future__ import annotations

import uuid
from contextlib import asynccontextmanager
from pathlib import Path

from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError

from tests.support.processes import eventually

from worker.config import WorkerConfig
from worker.worker import build_worker
from workflows.admission.messages import LeaseRow, QueueRow, admission_workflow_id
from workflows.admission.model import AdmissionPolicy
from workflows.admission.probe import AdmissionProbeWorkflow, ProbeInput, ProbeRequest, ProbeResult


class Harness:
    def __init__(self, client: Client, config: WorkerConfig, host_group: str) -> None:
        self.client = client
        self.config = config
        self.host_group = host_group
        self.started: list[WorkflowHandle] = []

    @property
    def admission(self) -> WorkflowHandle:
        return self.client.get_workflow_handle(admission_workflow_id(self.host_group))

    async def start_probe(self, name: str, *requests: ProbeRequest, **options: object) -> WorkflowHandle:
        handle = await self.client.start_workflow(
            "AdmissionProbeWorkflow",
            ProbeInput(host_group=self.host_group, requests=list(requests), **options),  # type: ignore[arg-type]
            id=f"probe:{self.host_group}:{name}",
            task_queue=self.config.task_queue,
            result_type=ProbeResult,
        )
        self.started.append(handle)
        return handle

    async def eventually(self, check, what: str, within: float = 30.0):
        return await eventually(check, what, within)

    async def leased(self) -> list[str]:
        try:
            return [row.request_id for row in await self.admission.query("leases", result_type=list[LeaseRow])]
        except RPCError:
            return []  # not started yet

    async def queued(self) -> list[str]:
        try:
            return [row.request_id for row in await self.admission.query("queue", result_type=list[QueueRow])]
        except RPCError:
            return []

    async def until_leased(self, *request_ids: str) -> None:
        await self.eventually(lambda: self._contains(self.leased, request_ids), f"leases {request_ids}")

    async def until_queued(self, *request_ids: str) -> None:
        await self.eventually(lambda: self._contains(self.queued, request_ids), f"queued {request_ids}")

    @staticmethod
    async def _contains(view, request_ids) -> bool:
        current = await view()
        return all(request_id in current for request_id in request_ids)

    async def terminate_everything(self) -> None:
        """Leave nothing running: the time-skipping server cannot skip past a workflow with no worker."""
        for handle in [*self.started, self.admission]:
            try:
                await handle.terminate(reason="test finished")
            except Exception:
                pass  # already closed

    async def query(self, name: str, *args: object, result_type: type | None = None):
        return await self.admission.query(name, *args, result_type=result_type) if result_type else await self.admission.query(name, *args)


@asynccontextmanager
async def admission_harness(
    client: Client, tmp_path: Path, policy: AdmissionPolicy, *, workflows_extra: list[type] = (), **worker_options: object
):
    suffix = uuid.uuid4().hex[:8]
    config = WorkerConfig(data_dir=tmp_path, task_queue=f"tq-{suffix}", admission_policy=policy)
    # A bug in workflow code fails the test's workflow at once instead of retrying the task forever.
    worker_options.setdefault("workflow_failure_exception_types", [Exception])
    async with build_worker(client, config, extra_workflows=[AdmissionProbeWorkflow, *workflows_extra], **worker_options):
        harness = Harness(client, config, host_group=f"hg-{suffix}")
        try:
            yield harness
        finally:
            await harness.terminate_everything()
