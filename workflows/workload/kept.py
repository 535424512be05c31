"""The workload record the conductor keeps itself, for an executor without the fleet API.

An Agentic Sandbox built without the fleet router (404 on `/api/v2/fleet/*`), or whose store is
not mounted (503 `fleet.store_unavailable`), still runs A2A tasks (Fleet Workload Contract v1: "old
adapters continue to operate without claiming daemon, schedule, typed backpressure, or fleet
reconciliation support"). On such an executor the WorkloadWorkflow keeps the record in its own
state (carried at continue-as-new, so replay restores it after any crash) and does here what the
fleet plane would do on the server, by the same rules, so the mission sees the same records:

- admission stores the record `admitted` at revision 1 (fleet.rs `dispatch`);
- an observation is a compare-and-swap to the next revision; a runtime identity, once bound,
  never changes (fleet.rs `observe`, `apply_runtime_identity`);
- a read projects the bound task's state into the record (fleet.rs `project_task_observation`:
  the table in `substrate/projection.py`, which is the substrate's own copy of it); a task the
  executor no longer knows is `unknown`, which fails closed.

Pure: the activities read the task and hand over what it says (`TaskReading`); the workflow calls
`admitted` and `observed` itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from workflows.contract import Artifact, Backpressure, WorkloadRecord, WorkloadStatus
from workflows.workload.messages import RuntimeIdentityUpdate
from workflows.workload.record import next_status

SETTLED = frozenset({"succeeded", "failed", "cancelled", "timed-out"})
TASK_LOST = "executor.task_lost"
_COMPARED = ("observed_state", "health", "backpressure", "artifacts", "exit_classification", "error_code")


@dataclass(frozen=True)
class TaskReading:
    """What the executor says of a task: its state, when it last changed, its artifacts as
    (artifact id, sha256 of the artifact's canonical JSON, created at) and, once completed, the
    sha256 of its status; `command_id` from the first artifact that names one."""

    task_id: str
    state: str  # an A2A task state, or "lost": the executor does not know the task
    updated_at: datetime
    artifacts: tuple[tuple[str, str, datetime], ...] = ()
    status_sha256: str | None = None
    command_id: str | None = None


def admitted(record: WorkloadRecord) -> WorkloadRecord:
    """The pending record, as the fleet plane stores it when it admits one."""
    status = record.status.model_copy(update={"observed_state": "admitted", "revision": 1})
    return record.model_copy(update={"status": status})


def observed(record: WorkloadRecord, status: WorkloadStatus, identity: RuntimeIdentityUpdate | None) -> WorkloadRecord:
    """An observation applied as fleet.rs `observe` applies it (the caller wrote `status` for the
    next revision of this very record: nobody else writes a record the conductor keeps)."""
    if status.revision != record.status.revision + 1:
        raise ValueError(f"an observation of revision {status.revision} on a kept record at revision {record.status.revision}")
    lineage = record.lineage
    if identity is not None:
        bound = {name: value for name, value in identity.model_dump().items() if value is not None}
        for name, value in bound.items():
            if getattr(lineage, name) not in (None, value):
                raise ValueError(f"runtime identity {name} is bound to {getattr(lineage, name)!r}, not {value!r}")
        lineage = lineage.model_copy(update=bound)
    return record.model_copy(update={"lineage": lineage, "status": status})


def _row(kind: str, state: str) -> tuple[str, str | None, str | None, str | None]:
    """(observed_state, health, exit_classification, error_code): fleet.rs `project_task_observation`."""
    daemon = kind == "daemon"
    if state == "submitted":
        return "starting", "unknown" if daemon else None, None, None
    if state == "working":
        if daemon:
            return "healthy", "healthy", None, None
        return ("catching-up" if kind == "scheduled-collector" else "running"), None, None, None
    if state == "completed":
        if daemon:
            return "operator-review-required", "unknown", "unknown", "fleet.daemon_task_exited"
        return {"persistent-agent": "retained", "scheduled-collector": "scheduled"}.get(kind, "succeeded"), None, "success", None
    if state in ("failed", "rejected"):
        return "failed", "unhealthy" if daemon else None, "failure", "fleet.task_failed"
    if state == "canceled":
        return "cancelled", "unknown" if daemon else None, "cancelled", None
    if state == "input-required":
        return "blocked", "unknown" if daemon else None, None, None
    if state == "auth-required":
        return "blocked", "unknown" if daemon else None, None, "fleet.task_auth_required"
    # "lost" (the executor does not know the task any more) or a state A2A may add: fail closed.
    return "unknown", "unknown" if daemon else None, "unknown", TASK_LOST if state == "lost" else None


def projected(record: WorkloadRecord, task: TaskReading) -> WorkloadRecord | None:
    """The record one revision on with the task's state in it, or None when nothing changes (an
    ended record stays as it ended)."""
    current = record.status
    if current.observed_state in SETTLED:
        return None
    observed_state, health, exit_classification, error_code = _row(record.kind, task.state)
    artifacts = [Artifact(kind="log", uri=f"sandbox://tasks/{task.task_id}/artifacts/{artifact_id}", sha256=sha256)
                 for artifact_id, sha256, _ in task.artifacts]  # fmt: skip
    if task.state == "completed" and task.status_sha256 is not None:
        artifacts.append(Artifact(kind="result", uri=f"sandbox://tasks/{task.task_id}/status", sha256=task.status_sha256))
    backpressure = None
    if task.state == "input-required":
        backpressure = Backpressure(reason="approval", retryable=False)
    elif task.state == "auth-required":
        backpressure = Backpressure(reason="policy", retryable=False)
    fields = {
        "observed_state": observed_state, "health": health, "backpressure": backpressure, "artifacts": artifacts,
        "exit_classification": exit_classification, "error_code": error_code,
    }
    if all(getattr(current, name) == fields[name] for name in _COMPARED):
        return None
    seen = max([task.updated_at, *(created for _, _, created in task.artifacts)])
    lineage = record.lineage
    if lineage.command_id is None and task.command_id is not None:
        lineage = lineage.model_copy(update={"command_id": task.command_id})
    return record.model_copy(update={"lineage": lineage, "status": next_status(record, seen, **fields)})
