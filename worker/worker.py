"""Builds the one worker that runs every Mission Conductor workflow and activity."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.worker import Worker

from activities.admission import AdmissionActivities
from activities.audit_store import AuditActivities, AuditStore
from activities.fleet import FleetActivities
from worker.config import WorkerConfig
from workflows.admission.probe import AdmissionProbeWorkflow
from workflows.admission.workflow import AdmissionWorkflow
from workflows.workload.workflow import WorkloadWorkflow

WORKFLOWS = [AdmissionWorkflow, AdmissionProbeWorkflow, WorkloadWorkflow]


def build_worker(
    client: Client, config: WorkerConfig, *, extra_workflows: list[type] = (), **worker_options: object
) -> Worker:
    admission = AdmissionActivities(client, config.task_queue, config.policy_for)
    audit = AuditActivities(AuditStore(config.audit_db))
    # Tokens come from the worker's environment (activities.credentials), never from workflows.
    fleet = FleetActivities.from_environment(config.fleet_url, config.executor_url)
    return Worker(
        client,
        task_queue=config.task_queue,
        workflows=[*WORKFLOWS, *extra_workflows],
        activities=[admission.submit_admission_batch, audit.export_audit_events, *fleet.activities()],
        **worker_options,  # type: ignore[arg-type]
    )
