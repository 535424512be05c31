"""Helpers for admission workflow tests: a worker on its own task queue, probes, queries."""

from __future__ import annotations

import uuid
from contextlib import asynccontextmanager
from pathlib import Path

from temporalio.client import Client, WorkflowHandle

from worker.config import WorkerConfig
from worker.worker import build_worker
from workflows.admission.messages import admission_workflow_id
from workflows.admission.model import AdmissionPolicy
from workflows.admission.probe import ProbeInput, ProbeRequest, ProbeResult


class Harness:
    def __init__(self, client: Client, config: WorkerConfig, host_group: str) -> None:
        self.client = client
        self.config = config
        self.host_group = host_group

    @property
    def admission(self) -> WorkflowHandle:
        return self.client.get_workflow_handle(admission_workflow_id(self.host_group))

    async def start_probe(self, name: str, *requests: ProbeRequest, **options: object) -> WorkflowHandle:
        return await self.client.start_workflow(
            "AdmissionProbeWorkflow",
            ProbeInput(host_group=self.host_group, requests=list(requests), **options),  # type: ignore[arg-type]
            id=f"probe:{self.host_group}:{name}",
            task_queue=self.config.task_queue,
            result_type=ProbeResult,
        )

    async def query(self, name: str, *args: object, result_type: type | None = None):
        return await self.admission.query(name, *args, result_type=result_type) if result_type else await self.admission.query(name, *args)


@asynccontextmanager
async def admission_harness(client: Client, tmp_path: Path, policy: AdmissionPolicy, **worker_options: object):
    suffix = uuid.uuid4().hex[:8]
    config = WorkerConfig(data_dir=tmp_path, task_queue=f"tq-{suffix}", admission_policy=policy)
    # A bug in workflow code fails the test's workflow at once instead of retrying the task forever.
    worker_options.setdefault("workflow_failure_exception_types", [Exception])
    async with build_worker(client, config, **worker_options):
        yield Harness(client, config, host_group=f"hg-{suffix}")
