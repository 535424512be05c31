"""Async HTTP clients for an Agentic Sandbox (or the local substrate): fleet API and A2A executor.

`FleetClient` talks to the management plane with the fleet token, `ExecutorClient` to the
executor plane with the executor token; tokens are passed in by the caller (see
`activities.credentials`) and only ever go into the `Authorization` header. Results are the
contract models (`workflows.contract`) and the A2A models (`activities.a2a`).

Failures are typed so the activity layer can decide about retries without parsing text:

| response                                  | exception               | retry helps? |
|-------------------------------------------|-------------------------|--------------|
| 400 / 422 (invalid, collision, mismatch)  | `FleetRejected`         | no           |
| 422 `*.idempotency_collision`             | `IdempotencyCollision`  | no           |
| 409 `fleet.stale_revision`                | `StaleRevision`         | re-read first|
| 409 `fleet.runtime_identity_immutable`    | `IdentityImmutable`     | no           |
| 409 `executor.task_not_cancelable`        | `TaskNotCancelable`     | no           |
| 404 (workload / task / instance)          | `WorkloadNotFound`, `TaskNotFound`, `InstanceNotFound` | no |
| 401                                       | `Unauthorized`          | no           |
| 5xx, 408, 429, timeouts, connection errors| `SubstrateUnavailable`  | yes          |
| a 2xx body that breaks the contract       | `ProtocolViolation`     | no           |

Every exception has `code`, `message`, `status` (None without a response) and `retryable`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import quote

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport
from pydantic import BaseModel, ValidationError

from activities.a2a import (
    EXTENSIONS_HEADER,
    IDEMPOTENCY_EXTENSION,
    RUNTIME_EXTENSION,
    Dispatch,
    MessageSendParams,
    Task,
    build_message,
)
from activities.credentials import BearerToken, as_token
from activities.sandbox_api import (
    AdmitResponse,
    ExecutorInstance,
    InstanceList,
    ReconcileRequest,
    RuntimeIdentity,
    WorkloadResponse,
)
from workflows.contract import (
    InventorySnapshot,
    ReconciliationReport,
    WorkloadRecord,
    WorkloadStatus,
    to_wire,
)

M = TypeVar("M", bound=BaseModel)
EventHook = Callable[..., Awaitable[None]]


class SandboxError(Exception):
    """Base of every client error; `retryable` says whether the same call may succeed later."""

    retryable = False

    def __init__(self, code: str, message: str, status: int | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status


class FleetRejected(SandboxError):
    """The request is wrong (400/422 and other 4xx): fix it, do not retry it."""


class IdempotencyCollision(FleetRejected):
    """The idempotency key (child_id / messageId) was already used for different content."""


class TaskNotCancelable(FleetRejected):
    """The task already ended (completed, failed, rejected, unknown)."""


class StaleRevision(SandboxError):
    """Compare-and-swap lost: the record is at `current_revision`; re-read and re-apply."""

    def __init__(self, code: str, message: str, status: int | None, current_revision: int) -> None:
        super().__init__(code, message, status)
        self.current_revision = current_revision


class IdentityImmutable(SandboxError):
    """A runtime identity field (task_id, session_id, command_id) is already set differently."""


class NotFound(SandboxError):
    """404: the named thing does not exist (or the base URL is wrong)."""


class WorkloadNotFound(NotFound):
    pass


class TaskNotFound(NotFound):
    pass


class InstanceNotFound(NotFound):
    pass


class Unauthorized(SandboxError):
    """401: the token is missing, wrong, or belongs to the other plane."""


class SubstrateUnavailable(SandboxError):
    """The substrate could not answer (down, overloaded, timed out): retry later."""

    retryable = True


class ProtocolViolation(SandboxError):
    """A success response whose body is not what the contract promises."""


_BY_CODE: dict[str, type[SandboxError]] = {
    "fleet.idempotency_collision": IdempotencyCollision,
    "executor.idempotency_collision": IdempotencyCollision,
    "fleet.runtime_identity_immutable": IdentityImmutable,
    "executor.task_not_cancelable": TaskNotCancelable,
    "fleet.workload_not_found": WorkloadNotFound,
    "executor.task_not_found": TaskNotFound,
    "executor.instance_not_found": InstanceNotFound,
    "auth.unauthorized": Unauthorized,
}


def error_from_response(response: httpx.Response) -> SandboxError:
    """Map a non-2xx response to its exception (public for the activity layer's tests)."""
    status = response.status_code
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        code, message = body["error"], str(body.get("message", ""))
    else:
        code, message = f"http.{status}", response.text[:300] or response.reason_phrase
    if status >= 500 or status in (408, 429):
        return SubstrateUnavailable(code, message, status)
    if status == 401:
        return Unauthorized(code, message, status)
    if code == "fleet.stale_revision" or (status == 409 and isinstance(body, dict) and "current_revision" in body):
        current = body.get("current_revision") if isinstance(body, dict) else None
        if isinstance(current, int):
            return StaleRevision(code, message, status, current)
        return ProtocolViolation(code, f"stale revision without current_revision: {message}", status)
    cls = _BY_CODE.get(code)
    if cls is not None:
        return cls(code, message, status)
    if status == 404:
        return NotFound(code, message, status)
    return FleetRejected(code, message, status)


def _unavailable(method: str, path: str, error: Exception) -> SubstrateUnavailable:
    """Name what went wrong by the transport's own exception: the aiohttp transport maps every
    connection error to one httpx class (a refused connection becomes `ConnectTimeout`)."""
    cause = error.__cause__ if isinstance(error.__cause__, aiohttp.ClientError) else error
    if isinstance(cause, (httpx.TimeoutException, asyncio.TimeoutError)):
        return SubstrateUnavailable("http.timeout", f"{method} {path} timed out: {type(cause).__name__}")
    return SubstrateUnavailable("http.unreachable", f"{method} {path} failed: {type(cause).__name__} {cause}")


class _Client:
    def __init__(
        self,
        base_url: str,
        token: str | BearerToken,
        *,
        timeout: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
        event_hooks: Mapping[str, list[EventHook]] | None = None,
    ) -> None:
        secret = as_token(token)
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {secret.reveal()}"},
            timeout=timeout,
            # httpx's API over aiohttp's connection pool: with a hundred calls in flight (a mission
            # fanning out) httpcore's pool costs 1.4 ms of CPU per request, aiohttp's 0.4 ms, and
            # these calls run in the workflow worker as local activities.
            transport=transport or AiohttpTransport(),
            event_hooks=dict(event_hooks or {}),
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self._http.base_url)!r})"

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self: Any) -> Any:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def _request(
        self, method: str, path: str, *, body: Any = None, headers: Mapping[str, str] | None = None
    ) -> httpx.Response:
        try:
            response = await self._http.request(
                method, path, content=None if body is None else json.dumps(body), headers={
                    **({"Content-Type": "application/json"} if body is not None else {}),
                    **(headers or {}),
                },
            )  # fmt: skip
        except (httpx.TransportError, aiohttp.ClientError) as error:
            raise _unavailable(method, path, error) from None
        if response.is_success:
            return response
        raise error_from_response(response)

    @staticmethod
    def _parse(model: type[M], response: httpx.Response) -> M:
        try:
            return model.model_validate(response.json())
        except (json.JSONDecodeError, UnicodeDecodeError, ValidationError) as error:
            raise ProtocolViolation(
                "client.invalid_response",
                f"{response.request.method} {response.request.url.path} answered {response.status_code} "
                f"with a body that is not a valid {model.__name__}: {str(error)[:500]}",
                response.status_code,
            ) from None


class FleetClient(_Client):
    """The management plane: workload records, inventory, reconciliation, executor instances."""

    async def admit(self, record: WorkloadRecord) -> AdmitResponse:
        """Admit a `pending`/revision-0 record; `replayed` is True for an identical resubmission."""
        response = await self._request("POST", "/api/v2/fleet/workloads", body=to_wire(record))
        return self._parse(AdmitResponse, response)

    async def get(self, child_id: str) -> WorkloadRecord:
        response = await self._request("GET", f"/api/v2/fleet/workloads/{_segment(child_id)}")
        return self._parse(WorkloadRecord, response)

    async def inventory(self) -> InventorySnapshot | None:
        """The whole fleet, or None while it holds no workload (the contract needs >= 1 record)."""
        response = await self._request("GET", "/api/v2/fleet/workloads")
        if response.status_code == 204:
            return None
        return self._parse(InventorySnapshot, response)

    async def observe(
        self,
        child_id: str,
        expected_revision: int,
        status: WorkloadStatus,
        runtime_identity: RuntimeIdentity | None = None,
    ) -> WorkloadRecord:
        """Compare-and-swap one observation (`status.revision` = `expected_revision` + 1)."""
        body: dict[str, Any] = {"expected_revision": expected_revision, "status": to_wire(status)}
        if runtime_identity is not None:
            body["runtime_identity"] = runtime_identity.model_dump(exclude_none=True)
        response = await self._request("POST", f"/api/v2/fleet/workloads/{_segment(child_id)}/observations", body=body)
        return self._parse(WorkloadResponse, response).workload

    async def reconcile(self, before_revision: int, child_ids: list[str]) -> ReconciliationReport:
        request = ReconcileRequest(before_revision=before_revision, child_ids=child_ids)
        response = await self._request("POST", "/api/v2/fleet/reconcile", body=request.model_dump())
        return self._parse(ReconciliationReport, response)

    async def instances(self) -> list[ExecutorInstance]:
        response = await self._request("GET", "/api/v2/admin/instances")
        return self._parse(InstanceList, response).instances


class ExecutorClient(_Client):
    """The executor plane (A2A): dispatch a workload's task, read it, cancel it."""

    EXTENSIONS = f"{RUNTIME_EXTENSION}, {IDEMPOTENCY_EXTENSION}"

    async def send_message(self, instance_id: str, message: Dispatch | MessageSendParams) -> Task:
        """Start (or, for a known `messageId`, find again) the task for one workload."""
        params = build_message(message) if isinstance(message, Dispatch) else message
        response = await self._request(
            "POST",
            f"/agents/{_segment(instance_id)}/v1/messages:send",
            body=params.wire(),
            headers={EXTENSIONS_HEADER: self.EXTENSIONS},
        )
        return self._parse(Task, response)

    async def get_task(self, instance_id: str, task_id: str) -> Task:
        response = await self._request("GET", f"/agents/{_segment(instance_id)}/v1/tasks/{_segment(task_id)}")
        return self._parse(Task, response)

    async def cancel_task(self, instance_id: str, task_id: str) -> Task:
        """Cancel; idempotent for a task already cancelled, `TaskNotCancelable` if it ended otherwise."""
        response = await self._request(
            "POST", f"/agents/{_segment(instance_id)}/v1/tasks/{_segment(task_id)}/cancel"
        )
        return self._parse(Task, response)


def _segment(value: str) -> str:
    """One URL path segment: ids may contain characters such as '?' or '#' (the contract allows them)."""
    return quote(value, safe="")
