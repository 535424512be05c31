"""`conductor substrate check URL`: probe an Agentic Sandbox before any worker points at it.

Each check is one line, `ok`, `FAIL` (and why) or `skip` (an earlier failure left nothing to
check with), in this order:

1. health: `GET /healthz` unauthenticated (the real server's liveness route, `health.rs`);
   when the server cannot be reached at all this is the only line;
2. ready: `GET /readyz` (503 `not_ready` while the server has no agent connected);
3. fleet token: `GET /api/v2/admin/instances` with the fleet token; the fleet routes need the
   `admin` role (`operator_auth.rs`: 401 for an unknown token, 403 for an operator token);
4. executor token: `GET /agents/{instance}/v1/tasks/{unknown}` with the executor token: a 404 shows
   the token was accepted (any valid token passes the executor plane), a 401 that it was not. The
   line names its role: refused on the fleet plane (operator), or accepted there too (admin);
5. instances: the instance list parses with the client's lenient models and names the targets;
   fleet API: a read of a record nobody has: 404 `fleet.workload_not_found` means the fleet API is
   there; a bare 404 (no fleet router) or 503 `fleet.store_unavailable` that the executor is
   fleet-less, which is no failure: workers run one-shot commands and persistent agents there,
   keeping their records themselves. The record checks below need the fleet API;
6. admit: a throw-away workload (`conductor-check-<random>`, a one-shot command that is never
   dispatched) is admitted: 202, `replayed: false`, stored `admitted` at revision 1
   (`fleet.rs`, `dispatch`). Admission stores a record and starts nothing;
7. replay: the identical record again: 200, `replayed: true`, the same revision (the server
   hashes the record without `status.last_seen`);
8. reconcile: `POST /api/v2/fleet/reconcile` for that child names it (not `unknown`, which means
   absent from the durable inventory);
9. retire: an observation moves the probe record to `cancelled`, so nobody mistakes it for work.

The tokens are the worker's (`activities/credentials.py`): `CONDUCTOR_FLEET_TOKEN` and
`CONDUCTOR_EXECUTOR_TOKEN`, their `_FILE` variants, or `--fleet-token-file` /
`--executor-token-file`. They go only into `Authorization` headers, never into the output.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import httpx

from activities.credentials import BearerToken
from activities.sandbox_client import (
    ExecutorClient,
    FleetClient,
    InstanceNotFound,
    NotFound,
    SandboxError,
    TaskNotFound,
    Unauthorized,
)
from workflows.contract import WorkloadRecord, parse_document

OK, FAIL, SKIP = "ok", "FAIL", "skip"


@dataclass(frozen=True)
class Check:
    name: str
    outcome: str  # OK | FAIL | SKIP
    detail: str

    def line(self) -> str:
        return f"{self.outcome:<4} {self.name}: {self.detail}"


class BadArguments(ValueError):
    """The command line cannot be acted on; one line, exit 2."""


def check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadArguments(f"URL must be an http:// or https:// address with a host, e.g. http://127.0.0.1:8122 (got {url!r})")
    if parts.query or parts.fragment:
        raise BadArguments(f"URL must be the server's base address, without a query or fragment (got {url!r})")
    return url.rstrip("/")


def _why(error: Exception) -> str:
    if isinstance(error, SandboxError):
        status = f"{error.status} " if error.status is not None else ""
        return f"{status}{error.code}: {error.message}"[:300]
    return f"{type(error).__name__}: {error}"[:300]


def probe_record(child_id: str, target_id: str) -> WorkloadRecord:
    """A one-shot record nobody dispatches: admitted, replayed, reconciled, then cancelled."""
    document = {
        "document_type": "workload",
        "api_version": "agentic-orchestration/v1",
        "kind": "one-shot-command",
        "lineage": {
            "orchestrator_id": "conductor-substrate-check",
            "mission_id": child_id,
            "dispatch_id": child_id,
            "idempotency_key": child_id,
            "parent_id": child_id,
            "child_id": child_id,
            "target_id": target_id,
            "executor_id": target_id,
            "runtime_id": target_id,
            "session_id": None,
            "task_id": None,
            "command_id": None,
        },
        "spec": {
            "desired_state": "running",
            "capabilities": [],
            "policy": {"trust_tier": "T0", "isolation_kind": "host", "credential_policy_ref": "none"},
            "budgets": {"max_attempts": 1, "timeout_seconds": 60},
        },
        "status": {
            "observed_state": "pending",
            "revision": 0,
            "last_seen": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
            "artifacts": [],
        },
    }
    record = parse_document(document)
    assert isinstance(record, WorkloadRecord)
    return record


class _Run:
    def __init__(self, emit: Callable[[Check], None]) -> None:
        self.results: list[Check] = []
        self._emit = emit

    def add(self, name: str, outcome: str, detail: str) -> Check:
        check = Check(name, outcome, detail)
        self.results.append(check)
        self._emit(check)
        return check

    async def attempt(self, name: str, step: Callable[[], Awaitable[str]]) -> bool:
        """Run one check; its detail on success, the typed error's code and message on failure."""
        try:
            detail = await step()
        except _Failed as failed:
            self.add(name, FAIL, str(failed))
            return False
        except (SandboxError, httpx.HTTPError, ValueError) as error:
            self.add(name, FAIL, _why(error))
            return False
        self.add(name, OK, detail)
        return True


class _Failed(Exception):
    """A check's own verdict that the server answered, but not as the real server must."""


async def run_checks(
    url: str,
    fleet_token: BearerToken,
    executor_token: BearerToken,
    *,
    timeout: float = 10.0,
    emit: Callable[[Check], None] = lambda _: None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> list[Check]:
    run = _Run(emit)
    base = check_url(url)
    async with httpx.AsyncClient(base_url=base, timeout=timeout, transport=transport) as plain:
        try:
            health = await plain.get("/healthz")
        except httpx.HTTPError as error:
            run.add("health", FAIL, f"cannot reach {base}: {type(error).__name__}: {error}"[:300])
            return run.results
        if health.status_code == 200 and _json(health).get("status") == "alive":
            run.add("health", OK, "GET /healthz: alive")
        else:
            run.add("health", FAIL, f"GET /healthz answered {health.status_code} {health.text[:120]!r}; "
                    "expected 200 {\"status\": \"alive\"}: is this an Agentic Sandbox management server?")  # fmt: skip
        ready = await _get(plain, "/readyz")
        if ready is None:
            run.add("ready", FAIL, "GET /readyz did not answer")
        elif ready.status_code == 200:
            count = _json(ready).get("agent_count")
            run.add("ready", OK, f"GET /readyz: ready ({count} agent(s) connected)")
        else:
            run.add("ready", FAIL, f"GET /readyz answered {ready.status_code}: {_json(ready).get('reason') or ready.text[:120]}")

        fleet = FleetClient(base, fleet_token, timeout=timeout, transport=transport)
        executor = ExecutorClient(base, executor_token, timeout=timeout, transport=transport)
        try:
            await _with_clients(run, fleet, executor, plain, executor_token)
        finally:
            await fleet.aclose()
            await executor.aclose()
    return run.results


async def _with_clients(
    run: _Run,
    fleet: FleetClient,
    executor: ExecutorClient,
    plain: httpx.AsyncClient,
    executor_token: BearerToken,
) -> None:
    targets: list[Any] = []

    async def fleet_token_check() -> str:
        try:
            targets.extend(await fleet.instances())
        except Unauthorized as error:
            if error.status == 403:
                raise _Failed("known to the server but refused on the fleet plane (403): it has the operator role; "
                              "the fleet routes need an admin token") from None  # fmt: skip
            raise _Failed(f"refused ({error.status}): the server does not know this token") from None
        return "accepted on GET /api/v2/admin/instances (admin role)"

    fleet_ok = await run.attempt("fleet token", fleet_token_check)

    instance_id = targets[0].id if targets else "conductor-check"

    async def executor_token_check() -> str:
        try:
            await executor.get_task(instance_id, f"conductor-check-{secrets.token_hex(4)}")
        except (TaskNotFound, InstanceNotFound):
            pass  # past authentication: the route itself answered
        except NotFound as error:
            raise _Failed(f"GET /agents/{instance_id}/v1/tasks/... answered 404 {error.code}, not a task or instance "
                          "error: is the executor plane served at this URL?") from None  # fmt: skip
        except Unauthorized as error:
            raise _Failed(f"refused on /agents ({error.status}): the server does not know this token") from None
        role = await _executor_token_role(plain, executor_token)
        return f"accepted on GET /agents/{instance_id}/v1/tasks/... ({role})"

    await run.attempt("executor token", executor_token_check)

    if not fleet_ok:
        for name in ("instances", "fleet API", "admit", "replay", "reconcile", "retire"):
            run.add(name, SKIP, "needs an accepted fleet token")
        return

    async def instances_check() -> str:
        if not targets:
            return "the list parses; it names no instance yet (nothing to dispatch to)"
        shown = ", ".join(f"{t.id} ({'/'.join(t.isolation_kinds) or '?'}, {t.status})" for t in targets[:8])
        more = f" and {len(targets) - 8} more" if len(targets) > 8 else ""
        ready = sum(1 for t in targets if t.status == "ready")
        return f"{len(targets)} listed, {ready} ready: {shown}{more}"

    await run.attempt("instances", instances_check)

    fleet_api: list[bool] = []

    async def fleet_api_check() -> str:
        try:
            await fleet.get(f"conductor-check-{secrets.token_hex(4)}")
        except NotFound as error:
            if error.code == "fleet.workload_not_found":
                fleet_api.append(True)
                return "present: this executor keeps workload records (every kind can run here)"
        except SandboxError as error:
            if error.code != "fleet.store_unavailable":
                raise
            fleet_api.append(False)
            return ("store unavailable (503 fleet.store_unavailable): while that lasts, workers treat this executor as "
                    "fleet-less: one-shot commands and persistent agents only, their records kept by the conductor")
        else:
            raise _Failed("a read of a record nobody admitted found one")
        fleet_api.append(False)
        return ("absent (404 on /api/v2/fleet): a fleet-less executor. Workers dispatch one-shot commands and persistent "
                "agents over A2A alone and keep their records; daemons and scheduled collectors are refused as unsupported")

    await run.attempt("fleet API", fleet_api_check)
    if fleet_api != [True]:
        for name in ("admit", "replay", "reconcile", "retire"):
            run.add(name, SKIP, "needs the fleet API")
        return

    child_id = f"conductor-check-{secrets.token_hex(6)}"
    record = probe_record(child_id, instance_id)
    admitted: list[WorkloadRecord] = []

    async def admit_check() -> str:
        answer = await fleet.admit(record)
        stored = answer.workload
        if answer.replayed:
            raise _Failed(f"a fresh child id {child_id} was answered as a replay")
        if (stored.status.observed_state, stored.status.revision) != ("admitted", 1):
            raise _Failed(f"stored {stored.status.observed_state} at revision {stored.status.revision}; "
                          "expected admitted at revision 1")  # fmt: skip
        admitted.append(stored)
        return f"{child_id} admitted at revision 1 (a record only: nothing is dispatched)"

    if not await run.attempt("admit", admit_check):
        for name in ("replay", "reconcile", "retire"):
            run.add(name, SKIP, "needs the admitted probe record")
        return

    async def replay_check() -> str:
        answer = await fleet.admit(record)
        if not answer.replayed:
            raise _Failed("the identical record was not answered as a replay: resubmissions would duplicate work")
        if answer.workload.status.revision != admitted[0].status.revision:
            raise _Failed(f"the replay moved the record to revision {answer.workload.status.revision}")
        return "the identical record is a replay (200, replayed: true, revision unchanged)"

    async def reconcile_check() -> str:
        report = await fleet.reconcile(0, [child_id])
        rows = [row for row in report.rows if row.child_id == child_id]
        if not rows:
            raise _Failed(f"the reconciliation has no row for {child_id}")
        if rows[0].classification == "unknown":
            raise _Failed(f"{child_id} is absent from the durable inventory (classification unknown)")
        return f"{child_id}: {rows[0].classification} ({rows[0].observed_state}, revision {rows[0].revision})"

    async def retire_check() -> str:
        current = await fleet.get(child_id)
        status = current.status.model_copy(
            update={"observed_state": "cancelled", "revision": current.status.revision + 1,
                    "last_seen": datetime.now(UTC), "exit_classification": "cancelled"}  # fmt: skip
        )
        stored = await fleet.observe(child_id, current.status.revision, status)
        if stored.status.observed_state != "cancelled":
            raise _Failed(f"the observation left the probe record {stored.status.observed_state}")
        return f"{child_id} cancelled at revision {stored.status.revision} (left in the inventory; the API has no delete)"

    await run.attempt("replay", replay_check)
    await run.attempt("reconcile", reconcile_check)
    await run.attempt("retire", retire_check)


async def _executor_token_role(plain: httpx.AsyncClient, token: BearerToken) -> str:
    answer = await _get(plain, "/api/v2/admin/instances", {"Authorization": f"Bearer {token.reveal()}"})
    if answer is None:
        return "role not determined"
    if answer.status_code == 403:
        return "operator role: refused on the fleet plane, as it should be"
    if answer.status_code == 200:
        return "admin role: also accepted on the fleet plane; an operator token is enough here"
    return f"the fleet plane answered it {answer.status_code}"


async def _get(http: httpx.AsyncClient, path: str, headers: dict[str, str] | None = None) -> httpx.Response | None:
    try:
        return await http.get(path, headers=headers)
    except httpx.HTTPError:
        return None


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
