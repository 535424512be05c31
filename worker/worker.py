"""Builds the one worker that runs every Mission Conductor workflow and activity."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.worker import Worker

from activities.admission import AdmissionActivities
from activities.audit_store import AuditActivities, AuditStore
from activities.fleet import FleetActivities
from activities.ledger_store import LedgerActivities, SqliteLedgerStore
from worker.config import WorkerConfig
from workflows.admission.probe import AdmissionProbeWorkflow
from workflows.admission.workflow import AdmissionWorkflow
from workflows.mission.workflow import MissionWorkflow
from workflows.workload.workflow import WorkloadWorkflow

WORKFLOWS = [AdmissionWorkflow, AdmissionProbeWorkflow, MissionWorkflow, WorkloadWorkflow]


def build_worker(
    client: Client,
    config: WorkerConfig,
    *,
    fleet: FleetActivities | None = None,
    extra_workflows: list[type] = (),
    **worker_options: object,
) -> Worker:
    admission = AdmissionActivities(client, config.task_queue, config.policy_for)
    audit = AuditActivities(AuditStore(config.audit_db))
    ledger = LedgerActivities(SqliteLedgerStore(config.ledger_db))
    # Tokens come from the worker's environment (activities.credentials), never from workflows.
    fleet = fleet or FleetActivities.from_environment(config.fleet_url, config.executor_url)
    return Worker(
        client,
        task_queue=config.task_queue,
        workflows=[*WORKFLOWS, *extra_workflows],
        activities=[
            admission.submit_admission_batch,
            audit.export_audit_events,
            ledger.write_ledger_snapshot,
            *fleet.activities(),
        ],
        **worker_options,  # type: ignore[arg-type]
    )
