"""Async HTTP clients for an Agentic Sandbox (or the local substrate): fleet API and A2A executor.

`FleetClient` talks to the management plane with the fleet token, `ExecutorClient` to the
executor plane with the executor token; tokens are passed in by the caller (see
`activities.credentials`) and only ever go into the `Authorization` header. Results are the
contract models (`workflows.contract`), the Agentic Sandbox wire models
(`activities.agentic_sandbox_api`, written from the real server's source) and `Target`.

The real server is the authority, and the local substrate (`substrate/`) speaks its shapes
too: the instance list as `{"items": [...]}`, an observation answered with the bare record, an
empty inventory as 200 with `records: []`, management errors as `{"error": code, "message":
text}` and executor errors as RFC 7807 problem documents (`code`, `detail`). A task's output is
read from its artifacts route (`ExecutorClient.artifacts`).

Failures are typed so the activity layer can decide about retries without parsing text:

| response                                  | exception               | retry helps? |
|-------------------------------------------|-------------------------|--------------|
| 400 / 422 (invalid, collision, mismatch)  | `FleetRejected`         | no           |
| 422 `*.idempotency_collision`, `idempotency.key_reused` | `IdempotencyCollision` | no |
| 409 `fleet.stale_revision`                | `StaleRevision`         | re-read first|
| 409 `fleet.runtime_identity_immutable`    | `IdentityImmutable`     | no           |
| 409 `task.not_cancelable` (or `executor.task_not_cancelable`) | `TaskNotCancelable` | no |
| 404 (workload / task / instance)          | `WorkloadNotFound`, `TaskNotFound`, `InstanceNotFound` | no |
| 401, 403                                  | `Unauthorized`          | no           |
| 5xx, 408, 429, timeouts, connection errors| `SubstrateUnavailable`  | yes          |
| a 2xx body that breaks the contract       | `ProtocolViolation`     | no           |

Every exception has `code`, `message`, `status` (None without a response) and `retryable`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import quote

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport
from pydantic import BaseModel, ValidationError

from activities.agentic_sandbox_api import (
    EXTENSIONS_HEADER,
    HITL_PROMPT_EXTENSION,
    IDEMPOTENCY_EXTENSION,
    RUNTIME_EXTENSION,
    AdmitResponse,
    FleetError,
    Instance,
    InstancesList,
    MessageSendParams,
    OutgoingMessage,
    OutgoingTextPart,
    Problem,
    ReconcileRequest,
    RuntimeIdentity,
    Task,
    TaskArtifacts,
    build_message,
)
from activities.credentials import BearerToken, as_token
from workflows.contract import (
    InventorySnapshot,
    ReconciliationReport,
    WorkloadRecord,
    WorkloadStatus,
    to_wire,
)
from workflows.workload.messages import TaskDispatch, Target

M = TypeVar("M", bound=BaseModel)
log = logging.getLogger(__name__)
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


class PromptClosed(FleetRejected):
    """409 `hitl_already_answered_or_unknown`: the prompt was answered already, or the task asks no
    question any more (send_message.rs `handle_hitl_response`)."""


class AnswerInvalid(FleetRejected):
    """422 `hitl_response_invalid`: the payload does not match the prompt's schema; still open."""


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
    # the real executor's problem-document codes (agentic-sandbox-executor, commit e901dc2):
    "task.not_cancelable": TaskNotCancelable,  # handlers/cancel_task.rs
    "task.not_found": TaskNotFound,  # handlers/cancel_task.rs, handlers/get_task.rs
    "instance.not_found": InstanceNotFound,  # instance.rs
    "idempotency.key_reused": IdempotencyCollision,  # extensions/idempotency.rs
    "hitl_already_answered_or_unknown": PromptClosed,  # handlers/send_message.rs handle_hitl_response
    "hitl_response_invalid": AnswerInvalid,
}


def _error_body(body: Any) -> tuple[str, str] | None:
    """(code, message) of a fleet error `{"error", "message"}` or an RFC 7807 problem document."""
    if not isinstance(body, dict):
        return None
    try:
        if isinstance(body.get("error"), str):
            fleet = FleetError.model_validate(body)
            return fleet.error, fleet.message
        if isinstance(body.get("code"), str):
            problem = Problem.model_validate(body)
            return problem.code, problem.detail or problem.title
    except ValidationError:
        return None
    return None


def error_from_response(response: httpx.Response) -> SandboxError:
    """Map a non-2xx response to its exception (public for the activity layer's tests)."""
    status = response.status_code
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = None
    parsed = _error_body(body)
    if parsed is not None:
        code, message = parsed
        errors = body.get("validation_errors") if isinstance(body, dict) else None
        if isinstance(errors, list) and errors:  # hitl-prompt/v1 examples/invalid-response-422.json
            message = f"{message}: " + "; ".join(
                f"{e.get('path', '')}: {e.get('message', '')}" if isinstance(e, dict) else str(e) for e in errors[:10]
            )
    else:
        code, message = f"http.{status}", response.text[:300] or response.reason_phrase
    if status >= 500 or status in (408, 429):
        return SubstrateUnavailable(code, message, status)
    if status in (401, 403):
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


_UNREAD: Any = object()


def _json(response: httpx.Response) -> Any:
    """The body as JSON, or `_UNREAD` if it is not JSON (so `_parse` reports it)."""
    try:
        return response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _UNREAD


class _Client:
    """Requests go straight to an httpx transport, not through an `httpx.AsyncClient`: the client's
    cookie jar, redirect and auth flows and URL merging, which these calls never use, were a third
    of the worker's CPU per request (a hundred-child mission makes about 530 of them, as local
    activities in the workflow worker). Event hooks run as the client ran them."""

    def __init__(
        self,
        base_url: str,
        token: str | BearerToken,
        *,
        timeout: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
        event_hooks: Mapping[str, list[EventHook]] | None = None,
    ) -> None:
        self._base_url = base_url.rstrip("/")
        self._authorization = f"Bearer {as_token(token).reveal()}"
        self._timeout = httpx.Timeout(timeout).as_dict()
        # aiohttp's connection pool under httpx's types: with a hundred calls in flight httpcore's
        # pool costs 1.4 ms of CPU per request, aiohttp's 0.4 ms.
        self._transport = transport or AiohttpTransport()
        hooks = event_hooks or {}
        self._on_request, self._on_response = list(hooks.get("request", ())), list(hooks.get("response", ()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._base_url!r})"

    async def aclose(self) -> None:
        await self._transport.aclose()

    async def __aenter__(self: Any) -> Any:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def _request(
        self, method: str, path: str, *, body: Any = None, headers: Mapping[str, str] | None = None
    ) -> httpx.Response:
        request = httpx.Request(
            method, self._base_url + path, content=None if body is None else json.dumps(body).encode(),
            headers={
                "Authorization": self._authorization,
                **({"Content-Type": "application/json"} if body is not None else {}),
                **(headers or {}),
            },
            extensions={"timeout": self._timeout},
        )  # fmt: skip
        for hook in self._on_request:
            await hook(request)
        try:
            response = await self._transport.handle_async_request(request)
            try:
                await response.aread()
            finally:
                await response.aclose()
        except (httpx.TransportError, aiohttp.ClientError) as error:
            raise _unavailable(method, path, error) from None
        response.request = request
        for hook in self._on_response:
            await hook(response)
        if response.is_success:
            return response
        raise error_from_response(response)

    @staticmethod
    def _parse(model: type[M], response: httpx.Response, body: Any = _UNREAD) -> M:
        try:
            return model.model_validate(response.json() if body is _UNREAD else body)
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
        """The whole fleet, or None while it holds no workload: the server answers an empty fleet
        200 with `records: []` (fleet.rs `inventory`), which the contract's document cannot hold."""
        response = await self._request("GET", "/api/v2/fleet/workloads")
        if response.status_code == 204:
            return None  # no body at all: nothing to read either
        body = _json(response)
        if isinstance(body, dict) and body.get("records") == []:
            return None
        return self._parse(InventorySnapshot, response, body)

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
        return self._parse(WorkloadRecord, response)  # the bare record (fleet.rs `observe`)

    async def reconcile(self, before_revision: int, child_ids: list[str]) -> ReconciliationReport:
        request = ReconcileRequest(before_revision=before_revision, child_ids=child_ids)
        response = await self._request("POST", "/api/v2/fleet/reconcile", body=request.model_dump())
        return self._parse(ReconciliationReport, response)

    async def instances(self) -> list[Target]:
        """The dispatch targets: every instance the server lists, as a `Target` (`target_for`).

        `degraded_providers` (a runtime the server could not enumerate) are logged, not fatal:
        the instances it could list are still targets."""
        response = await self._request("GET", "/api/v2/admin/instances")
        listing = self._parse(InstancesList, response)
        for degraded in listing.degraded_providers:
            log.warning("Agentic Sandbox could not list %s instances: %s %s", degraded.runtime, degraded.code,
                        degraded.detail)  # fmt: skip
        return [target_for(instance) for instance in listing.items]


class ExecutorClient(_Client):
    """The executor plane (A2A): dispatch a workload's task, read it, cancel it.

    Every POST carries `A2A-Extensions` with the runtime extension: the real executor requires it
    on every mutating route and answers 400 `extension.required_not_activated` without it
    (agentic-sandbox-executor `extensions/mod.rs` `enforce_required`); `messages:send` also
    activates the idempotency extension, keyed on `messageId`.
    """

    EXTENSIONS = f"{RUNTIME_EXTENSION}, {IDEMPOTENCY_EXTENSION}, {HITL_PROMPT_EXTENSION}"
    CANCEL_EXTENSIONS = RUNTIME_EXTENSION

    async def send_message(self, instance_id: str, message: TaskDispatch | MessageSendParams) -> Task:
        """Start (or, for a known `messageId`, find again) the task for one workload."""
        params = build_message(message) if isinstance(message, TaskDispatch) else message
        response = await self._request(
            "POST",
            f"/agents/{_segment(instance_id)}/v1/messages:send",
            body=params.wire(),
            headers={EXTENSIONS_HEADER: self.EXTENSIONS},
        )
        return self._parse(Task, response)

    async def answer_prompt(
        self, instance_id: str, task_id: str, message_id: str, prompt_id: str, payload: dict[str, Any]
    ) -> Task:
        """Answer a task's hitl-prompt/v1 question: `messages:send` naming the task, with
        `metadata.hitl_response_for` (spec.md, "Response Envelope"). `PromptClosed` (409) when the
        prompt is answered or unknown, `AnswerInvalid` (422) when the payload does not match."""
        message = OutgoingMessage(
            message_id=message_id, role="user", task_id=task_id,
            parts=[OutgoingTextPart(text=f"answer to prompt {prompt_id}")],
            metadata={"hitl_response_for": {"prompt_id": prompt_id, "payload": payload}},
        )
        response = await self._request(
            "POST",
            f"/agents/{_segment(instance_id)}/v1/messages:send",
            body=MessageSendParams(message=message).wire(),
            headers={EXTENSIONS_HEADER: self.EXTENSIONS},
        )
        return self._parse(Task, response)

    async def get_task(self, instance_id: str, task_id: str) -> Task:
        response = await self._request("GET", f"/agents/{_segment(instance_id)}/v1/tasks/{_segment(task_id)}")
        return self._parse(Task, response)

    async def artifacts(self, instance_id: str, task_id: str) -> TaskArtifacts:
        """A task's artifacts (handlers/artifacts.rs `list`): where a command's output is."""
        response = await self._request(
            "GET", f"/agents/{_segment(instance_id)}/v1/tasks/{_segment(task_id)}/artifacts"
        )
        return self._parse(TaskArtifacts, response)

    async def cancel_task(self, instance_id: str, task_id: str) -> Task:
        """Cancel; idempotent for a task already cancelled, `TaskNotCancelable` if it ended otherwise."""
        response = await self._request(
            "POST",
            f"/agents/{_segment(instance_id)}/v1/tasks/{_segment(task_id)}/cancel",
            headers={EXTENSIONS_HEADER: self.CANCEL_EXTENSIONS},
        )
        return self._parse(Task, response)


_ISOLATION_FOR_RUNTIME: dict[str, str] = {"qemu": "vm", "docker": "container", "host": "host"}
_ALL_KINDS = ["one-shot-command", "daemon", "persistent-agent", "scheduled-collector"]


def target_for(instance: Instance) -> Target:
    """The dispatch target a real server's instance stands for.

    `GET /api/v2/admin/instances` (management/src/http/admin_v2.rs `InstancesList`, items built
    by `build_instance_from_registered_context` and its siblings for VMs and containers) lists
    `{id, name, runtime, provider, capabilities, state, agent_card_url, ...}`; `Target` is what the
    mission's planner needs (`workflows.mission.planning`). The mapping:

    - `id` is the instance id, the `{id}` of `/agents/{id}/v1/...` (its `agent_card_url`).
    - `executor_id` is the instance id too: each instance is its own A2A executor (its own agent
      card); the server has no separate executor identity.
    - `runtime_id` is `<runtime>:<name>` (`name` is the runtime-native launch name).
    - `isolation_kinds` from `runtime`: "qemu" -> vm, "docker" -> container, "host" -> host (the
      three values the server writes); anything else is "custom", so only a child asking for
      custom isolation goes there.
    - `status` is "ready" only for `state == "running"` (a registered context that `is_ready()`);
      "stopped" and every other state is "offline", so nothing is planned onto it.
    - `workload_kinds` is all four: the server advertises no per-instance workload kinds (its
      `capabilities` are instance operations such as `instance.checkpoint`, not workload kinds),
      and the fleet plane admits every kind of the contract. The capabilities are not used.
    - `active_tasks` is 0: the instance list carries no task count.
    """
    return Target(
        id=instance.id,
        executor_id=instance.id,
        runtime_id=f"{instance.runtime}:{instance.name or instance.id}",
        workload_kinds=list(_ALL_KINDS),  # type: ignore[arg-type]
        isolation_kinds=[_ISOLATION_FOR_RUNTIME.get(instance.runtime, "custom")],  # type: ignore[list-item]
        status="ready" if instance.state == "running" else "offline",
        active_tasks=0,
    )


def _segment(value: str) -> str:
    """One URL path segment: ids may contain characters such as '?' or '#' (the contract allows them)."""
    return quote(value, safe="")
