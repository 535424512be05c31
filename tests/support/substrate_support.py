"""Helpers for the substrate tests: records, polling, process checks, a body-recording hook."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from activities.sandbox_client import ExecutorClient, FleetClient
from workflows.contract import WorkloadRecord, parse_document

FLEET_TOKEN = "fleet-token-A-3f9c1e"
EXECUTOR_TOKEN = "executor-token-B-7d2a4b"


def record_dict(
    child_id: str,
    kind: str = "one-shot-command",
    *,
    target: str = "local-1",
    timeout_seconds: int = 60,
    schedule: str | None = None,
    isolation: str = "host",
) -> dict[str, Any]:
    record: dict[str, Any] = {
        "document_type": "workload",
        "api_version": "agentic-orchestration/v1",
        "kind": kind,
        "lineage": {
            "orchestrator_id": "conductor-test",
            "mission_id": "mission-substrate",
            "dispatch_id": f"dispatch-{child_id}",
            "idempotency_key": f"idem-{child_id}",
            "parent_id": "mission-substrate",
            "child_id": child_id,
            "target_id": target,
            "executor_id": "local-executor-1",
            "runtime_id": "local-shell-1",
            "session_id": None,
            "task_id": None,
            "command_id": None,
        },
        "spec": {
            "desired_state": "running",
            "capabilities": [{"name": "command:exec", "status": "supported"}],
            "policy": {"trust_tier": "T1", "isolation_kind": isolation, "credential_policy_ref": "policy-none"},
            "budgets": {"max_attempts": 1, "timeout_seconds": timeout_seconds},
        },
        "status": {"observed_state": "pending", "revision": 0, "last_seen": "2026-08-02T15:00:00Z", "artifacts": []},
    }
    if schedule is not None:
        record["spec"]["schedule"] = schedule
    if kind == "daemon":
        record["status"]["health"] = "unknown"
    return record


def make_record(child_id: str, kind: str = "one-shot-command", **options: Any) -> WorkloadRecord:
    document = parse_document(record_dict(child_id, kind, **options))
    assert isinstance(document, WorkloadRecord)
    return document


async def wait_record(
    fleet: FleetClient,
    child_id: str,
    predicate: Callable[[WorkloadRecord], bool],
    timeout: float = 10.0,
) -> WorkloadRecord:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        record = await fleet.get(child_id)
        if predicate(record):
            return record
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{child_id} never reached the expected state; last status: {record.status!r}")
        await asyncio.sleep(0.02)


@dataclass
class Wiretap:
    """httpx event hooks that keep every request body and response status (to look for leaks)."""

    bodies: list[bytes] = field(default_factory=list)
    responses: list[tuple[str, str, int]] = field(default_factory=list)
    response_bodies: list[bytes] = field(default_factory=list)

    async def on_request(self, request: httpx.Request) -> None:
        self.bodies.append(request.content)

    async def on_response(self, response: httpx.Response) -> None:
        await response.aread()
        self.response_bodies.append(response.content)
        self.responses.append((response.request.method, response.request.url.path, response.status_code))

    def hooks(self) -> dict[str, list[Any]]:
        return {"request": [self.on_request], "response": [self.on_response]}

    def last_status(self) -> int:
        return self.responses[-1][2]

    def assert_no_secrets(self, *secrets: str) -> None:
        for body in [*self.bodies, *self.response_bodies]:
            for secret in secrets:
                assert secret.encode() not in body, "a bearer token appeared in an HTTP body"


def clients(base_url: str, tap: Wiretap) -> tuple[FleetClient, ExecutorClient]:
    return (
        FleetClient(base_url, FLEET_TOKEN, event_hooks=tap.hooks()),
        ExecutorClient(base_url, EXECUTOR_TOKEN, event_hooks=tap.hooks()),
    )


def raw_json(response: httpx.Response) -> Any:
    return json.loads(response.content)
