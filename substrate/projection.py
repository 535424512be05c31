"""A bound task's state, projected into its workload record when the record is read.

The real server never lets its runtime write fleet records: the orchestrator binds a task to a
record with an observation, and every read of the record (GET, inventory) projects the bound
task's current state into it, written as one more revision when it changed (fleet.rs
`refresh_from_task_store` and `project_task_observation`, agentic-sandbox e901dc2). The
substrate does the same, table for table:

| task state      | daemon                                   | persistent-agent | scheduled-collector | one-shot-command |
|-----------------|------------------------------------------|------------------|---------------------|------------------|
| submitted       | starting (health unknown)                | starting         | starting            | starting         |
| working         | healthy (health healthy)                 | running          | catching-up         | running          |
| completed       | operator-review-required, health unknown, exit unknown, `fleet.daemon_task_exited` | retained (success) | scheduled (success) | succeeded (success) |
| failed/rejected | failed, health unhealthy, `fleet.task_failed`                      | failed           | failed              | failed           |
| canceled        | cancelled (exit cancelled)               | cancelled        | cancelled           | cancelled        |
| input-required  | blocked, backpressure approval           | blocked          | blocked             | blocked          |
| auth-required   | blocked, backpressure policy, `fleet.task_auth_required`           | blocked          | blocked             | blocked          |

Daemons carry `health` (unknown where the table says nothing); the others carry none. The
status's artifacts are one `log` per task artifact (`sandbox://tasks/{tid}/artifacts/{aid}`,
sha256 of its canonical JSON) and, once completed, a `result` for the task's status
(`sandbox://tasks/{tid}/status`). `lineage.command_id` is taken from the first artifact that
names one. A record already `succeeded`, `failed`, `cancelled` or `timed-out` is left as it is,
and a projection equal to the stored status writes nothing (no revision churn).

One row the real server does not have: `unknown`, the substrate's state for a task whose process
vanished while the substrate was down, projects to `unknown` (exit unknown, health unknown),
which fails closed.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any

from substrate.store import TaskRow

_SETTLED = frozenset({"succeeded", "failed", "cancelled", "timed-out"})
_COMPARED = ("observed_state", "health", "backpressure", "artifacts", "exit_classification", "error_code")


def canonical_sha256(value: Any) -> str:
    """sha256 of the canonical JSON (sorted keys, no spaces: JCS for the values used here)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _row(kind: str, state: str) -> tuple[str, str | None, str | None, str | None]:
    """(observed_state, health, exit_classification, error_code) of one table row."""
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
        observed = {"persistent-agent": "retained", "scheduled-collector": "scheduled"}.get(kind, "succeeded")
        return observed, None, "success", None
    if state in ("failed", "rejected"):
        return "failed", "unhealthy" if daemon else None, "failure", "fleet.task_failed"
    if state == "canceled":
        return "cancelled", "unknown" if daemon else None, "cancelled", None
    if state == "input-required":
        return "blocked", "unknown" if daemon else None, None, None
    if state == "auth-required":
        return "blocked", "unknown" if daemon else None, None, "fleet.task_auth_required"
    return "unknown", "unknown" if daemon else None, "unknown", None  # the substrate's own `unknown`


def _parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def status_sha256(task: TaskRow) -> str:
    """The `result` artifact's digest: the task's A2A status object as the executor stores it."""
    status: dict[str, Any] = {**task.status_extra, "state": task.state, "timestamp": task.updated_at}
    return canonical_sha256(status)


def project(record: dict[str, Any], task: TaskRow) -> dict[str, Any] | None:
    """The record one revision on with the task's state projected, or None if nothing changes."""
    current = record["status"]
    if current["observed_state"] in _SETTLED:
        return None
    observed, health, exit_classification, error_code = _row(record["kind"], task.state)
    artifacts: list[dict[str, str]] = [
        {
            "kind": "log",
            "uri": f"sandbox://tasks/{task.task_id}/artifacts/{row['artifact_id']}",
            "sha256": canonical_sha256(row["artifact"]),
        }
        for row in task.artifacts
    ]
    if task.state == "completed":
        artifacts.append({"kind": "result", "uri": f"sandbox://tasks/{task.task_id}/status",
                          "sha256": status_sha256(task)})  # fmt: skip
    seen = max([_parse(task.updated_at), *(_parse(row["created_at"]) for row in task.artifacts)])
    status: dict[str, Any] = {
        "observed_state": observed,
        "revision": current["revision"] + 1,
        "last_seen": seen.isoformat().replace("+00:00", "Z"),
        "artifacts": artifacts,
    }
    if health is not None:
        status["health"] = health
    if task.state == "input-required":
        status["backpressure"] = {"reason": "approval", "retryable": False}
    elif task.state == "auth-required":
        status["backpressure"] = {"reason": "policy", "retryable": False}
    if exit_classification is not None:
        status["exit_classification"] = exit_classification
    if error_code is not None:
        status["error_code"] = error_code
    if all(current.get(name) == status.get(name) for name in _COMPARED):
        return None
    lineage = dict(record["lineage"])
    if lineage.get("command_id") is None:
        command = next((row["artifact"].get("command_id") for row in task.artifacts
                        if isinstance(row["artifact"].get("command_id"), str)), None)  # fmt: skip
        if command:
            lineage["command_id"] = command
    return {**record, "lineage": lineage, "status": status}
