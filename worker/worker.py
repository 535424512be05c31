"""Builds the one worker that runs every Mission Conductor workflow and activity."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.worker import Worker

from activities.admission import AdmissionActivities
from activities.audit_store import AuditActivities, AuditStore
from worker.config import WorkerConfig
from workflows.admission.probe import AdmissionProbeWorkflow
from workflows.admission.workflow import AdmissionWorkflow

WORKFLOWS = [AdmissionWorkflow, AdmissionProbeWorkflow]


def build_worker(client: Client, config: WorkerConfig, **worker_options: object) -> Worker:
    admission = AdmissionActivities(client, config.task_queue, config.policy_for)
    audit = AuditActivities(AuditStore(config.audit_db))
    return Worker(
        client,
        task_queue=config.task_queue,
        workflows=WORKFLOWS,
        activities=[admission.submit_admission_batch, audit.export_audit_events],
        **worker_options,  # type: ignore[arg-type]
    )
