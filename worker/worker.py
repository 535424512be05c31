"""Builds the one worker that runs every Mission Conductor workflow and activity."""

from __future__ import annotations

from datetime import timedelta

from typing import Any

from temporalio.client import Client
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.worker import UnsandboxedWorkflowRunner, Worker, WorkerDeploymentConfig

from activities.admission import AdmissionActivities, between_restore_slices
from activities.audit_store import AuditActivities
from activities.fleet import FleetActivities
from activities.ledger_store import LedgerActivities
from activities.stores import Stores, select_stores
from activities.workflow_status import WorkflowStatusActivities
from worker.config import WorkerConfig
from workflows.admission.holder_workflow import AdmissionHolderWorkflow
from workflows.admission.workflow import AdmissionWorkflow
from workflows.mission.workflow import MissionWorkflow
from workflows.workload.workflow import WorkloadWorkflow

WORKFLOWS = [AdmissionWorkflow, AdmissionHolderWorkflow, MissionWorkflow, WorkloadWorkflow]  # the product's; tests and benchmarks add theirs


class ConductorWorker(Worker):
    """A Worker that opens its stores before it polls (PostgreSQL: connect and migrate), and closes them
    and the substrate clients it opened once it stops running.

    `async with` opens the stores before entering, so a database that cannot be reached fails there
    (`activities.stores.StoreUnavailable`) instead of inside the background run task.
    """

    def __init__(self, client: Client, *, owned_fleet: FleetActivities | None, stores: Stores, **options: Any) -> None:
        super().__init__(client, **options)
        self._owned_fleet = owned_fleet
        self.stores = stores

    async def __aenter__(self) -> "ConductorWorker":
        await self.stores.open()
        return await super().__aenter__()

    async def run(self) -> None:
        try:
            await self.stores.open()
            await super().run()
        finally:
            await self.stores.close()
            if self._owned_fleet is not None:
                await self._owned_fleet.aclose()


def deployment_config(config: WorkerConfig) -> WorkerDeploymentConfig | None:
    """The worker's deployment version, or None (unversioned: any worker on the queue takes any task).

    PINNED by default: a mission lives for hours or days (its daemons and agents outlive its verdict),
    and a workflow that moved to new code mid-run would need every change guarded by patches. Pinned,
    each mission, and the workload children it starts on the same queue, finishes on the build it
    started on; only new missions go to the version made current. The price: a version's workers must
    keep running until every workflow pinned to it has closed (docs/deploy.md, "Rolling out new
    workflow code"), including the per-host-group admission singleton, which continues-as-new on its
    pinned version until it is moved (`temporal workflow update-options`) or closes.
    """
    if config.deployment_name is None or config.build_id is None:
        return None
    return WorkerDeploymentConfig(
        version=WorkerDeploymentVersion(deployment_name=config.deployment_name, build_id=config.build_id),
        use_worker_versioning=True,
        default_versioning_behavior=VersioningBehavior.PINNED,
    )


# Every module under `workflows/` is deterministic and side-effect free (CONTRIBUTING.md; checked
# by tests/workflows/test_workflow_determinism.py), so the worker runs workflows outside the SDK's sandbox:
# with the whole package passed through it refused nothing in our modules and still cost 0.3 s
# of CPU per 100-child mission. Its refusals stay where they guard releases: the replays of
# tests/workflows/test_replay.py and `conductor replay` run under the SDK's strict default sandbox
# (docs/workflow-costs.md, "The workflow sandbox").
PRODUCTION_WORKFLOW_RUNNER = UnsandboxedWorkflowRunner()
# How long the server holds a workflow task for the worker that has the workflow cached before it
# gives the task to any worker (which replays the history). A worker that stops cleanly says so at
# once; one SIGKILLed cannot, and every workflow it had cached waits this long: the admission
# singleton of every host group it ran, with all its holders and missions. The SDK's 10 s made each
# crash a 10 s stop of every host group (bench/admission_storm.py --kill-every 15); 2 s still keeps
# a slow but living worker's tasks its own (a cached task is cheaper than a replay).
STICKY_SCHEDULE_TO_START = timedelta(seconds=2)


async def take_over_singletons(client: Client, task_queue: str) -> int:
    """Send the next task of every admission singleton on `task_queue` to any worker rather than the
    one that ran it last (ResetStickyTaskQueue). A starting worker does this because the worker
    before it may have died with them cached: a SIGKILLed worker cannot give its sticky queue back,
    and until STICKY_SCHEDULE_TO_START passes every host group it ran would decide nothing. A living
    worker that had one cached replays it once. Returns how many singletons it reset."""
    from temporalio.api.common.v1 import WorkflowExecution
    from temporalio.api.workflowservice.v1 import ResetStickyTaskQueueRequest
    from temporalio.service import RPCError

    from activities.visibility import literal
    from workflows.admission.messages import ADMISSION_WORKFLOW

    reset = 0
    query = (f"WorkflowType = {literal(ADMISSION_WORKFLOW)} AND ExecutionStatus = 'Running' "
             f"AND TaskQueue = {literal(task_queue)}")
    async for execution in client.list_workflows(query):
        try:
            await client.workflow_service.reset_sticky_task_queue(ResetStickyTaskQueueRequest(
                namespace=client.namespace, execution=WorkflowExecution(workflow_id=execution.id, run_id=execution.run_id),
            ))
            reset += 1
        except RPCError:
            pass  # closed meanwhile, or its sticky queue is already gone
    return reset


def build_worker(
    client: Client,
    config: WorkerConfig,
    *,
    fleet: FleetActivities | None = None,
    extra_workflows: list[type] = (),
    **worker_options: object,
) -> Worker:
    admission = AdmissionActivities(client, config.task_queue, config.policy_for)
    stores = select_stores(config.database_url, ledger_db=config.ledger_db, audit_db=config.audit_db)
    audit = AuditActivities(stores.audit)
    ledger = LedgerActivities(stores.ledger)
    # Tokens come from the worker's environment (activities.credentials), never from workflows.
    owned_fleet = FleetActivities.from_environment(config.fleet_url, config.executor_url) if fleet is None else None
    fleet = fleet or owned_fleet
    versioning = deployment_config(config)
    if versioning is not None:
        worker_options.setdefault("deployment_config", versioning)
    worker_options.setdefault("workflow_runner", PRODUCTION_WORKFLOW_RUNNER)
    worker_options.setdefault("sticky_queue_schedule_to_start_timeout", STICKY_SCHEDULE_TO_START)
    return ConductorWorker(
        client,
        owned_fleet=owned_fleet,
        stores=stores,
        task_queue=config.task_queue,
        workflows=[*WORKFLOWS, *extra_workflows],
        activities=[
            admission.submit_admission_batch,
            admission.find_gone_requesters,
            between_restore_slices,
            audit.export_audit_events,
            ledger.write_ledger_snapshot,
            WorkflowStatusActivities(client).running_workflows,
            *fleet.activities(),
        ],
        **worker_options,  # type: ignore[arg-type]
    )
