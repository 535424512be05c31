"""HTTP routes of the local substrate: the Agentic Sandbox wire contract, nothing more.

Management plane (`/api/v2/...`) takes the fleet token, the executor plane (`/agents/...`)
the executor token; each refuses the other's. Management-plane errors are `{"error": code,
"message": text}` (fleet.rs `error`); executor-plane errors are RFC 7807 problem documents
(`application/problem+json`, `{type, title, status, detail, code, ...}`, executor
`bindings/rest.rs`), except bearer refusals, `{"error": ...}` on both planes as the real
`operator_auth.rs` answers (401 `auth.unauthorized` for a missing or wrong token). Every POST
under `/agents` needs the runtime extension (400 `extension.required_not_activated`), and the
A2A routes are served under `/agents/{id}/v1/` and `/agents/{id}/`. The rules live in `fleet.py` and
`executor.py`; this module only authenticates, decodes JSON and picks status codes.

The front door: whatever a client sends is answered with a 4xx JSON error when it is at fault,
never with a 500. A body over `max_request_bytes` is 413 `http.payload_too_large` before it is
read; a JSON body must be `application/json` (or carry no Content-Type; otherwise 415
`http.unsupported_media_type`); too deep, too long a number, not JSON or not valid text is 400
with the route's code (`substrate/body.py`). An exception no handler takes is a substrate bug:
logged once with its traceback and answered 500 `substrate.internal_error`; the tests drive
every route with hostile input to show no input reaches it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from substrate.body import (
    ASGIApp,
    BodyLimit,
    BodyLimits,
    Message,
    Receive,
    Scope,
    Send,
    check_media_type,
    decode_json,
    send_error,
)
from substrate.auth import Role, require
from substrate.config import SubstrateConfig
from substrate.errors import SubstrateError
from substrate.executor import ExecutorService, local_instances
from substrate.fleet import FleetService
from substrate.health import health_routes
from substrate.runner import Runner
from substrate.store import Store
from substrate.wire import (
    EXTENSIONS_HEADER, RUNTIME_EXTENSION, SUPPORTED_EXTENSIONS, activated, hitl_response, requested_extensions,
)

log = logging.getLogger(__name__)


async def _json_body(request: Request, code: str) -> Any:
    check_media_type(request.headers.get("content-type"))
    raw = await request.body()  # at most max_request_bytes: BodyLimit raises past it
    return decode_json(raw, code, request.app.state.limits)


class _Unexpected:
    """Outermost middleware: an exception no handler took is a bug, logged with its traceback once.

    The answer is a JSON 500 (if the response has not started); Starlette's own fallback would
    log the traceback a second time through the server. A client that hung up mid-body is not a
    bug and needs no answer.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except ClientDisconnect:
            return
        except Exception as error:
            log.exception("substrate: unhandled error in %s %s", scope.get("method"), scope.get("path"))
            if not started:
                body = {"error": "substrate.internal_error", "message": f"internal error: {type(error).__name__}"}
                await send_error(send, 500, body, close=False)


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers=headers)


def _fleet_routes(config: SubstrateConfig) -> APIRouter:
    router = APIRouter(prefix="/api/v2", dependencies=[Depends(require(config.token_table, Role.ADMIN, "management"))])

    def fleet(request: Request) -> FleetService:
        return request.app.state.fleet  # type: ignore[no-any-return]

    @router.get("/admin/instances")
    async def instances(request: Request) -> Response:
        return _json(200, request.app.state.executor.instances())

    if not config.fleet_api:  # no fleet router: its routes are not there (404), as on such a build
        return router

    @router.post("/fleet/workloads")
    async def admit(request: Request) -> Response:
        replayed, record = fleet(request).admit(await _json_body(request, "fleet.invalid_record"))
        return _json(200 if replayed else 202, {"replayed": replayed, "workload": record})

    @router.get("/fleet/workloads")
    async def inventory(request: Request) -> Response:
        return _json(200, fleet(request).inventory())  # an empty fleet: 200 with records: []

    @router.get("/fleet/workloads/{child_id}")
    async def get_workload(child_id: str, request: Request) -> Response:
        return _json(200, fleet(request).get_wire(child_id))

    @router.post("/fleet/workloads/{child_id}/observations")
    async def observe(child_id: str, request: Request) -> Response:
        # The bare record, as fleet.rs `observe` answers (no envelope).
        return _json(200, fleet(request).observe(child_id, await _json_body(request, "fleet.invalid_observation")))

    @router.post("/fleet/reconcile")
    async def reconcile(request: Request) -> Response:
        return _json(200, fleet(request).reconcile(await _json_body(request, "fleet.invalid_request")))

    return router


def _extensions(request: Request) -> set[str]:
    return requested_extensions(request.headers.getlist(EXTENSIONS_HEADER))


async def _require_runtime_extension(instance_id: str, request: Request) -> None:
    """Every POST under /agents needs the runtime extension (executor `extensions/mod.rs`
    `require_extensions_middleware`); the instance is resolved first, as its `InstanceLayer` does.
    A coroutine, as `auth.require`'s check is: a plain `def` would run in the thread pool."""
    request.app.state.executor.instance(instance_id)
    if not activated(_extensions(request), RUNTIME_EXTENSION):
        raise SubstrateError(
            400,
            "extension.required_not_activated",
            f"Required extension {RUNTIME_EXTENSION} not in A2A-Extensions header",
            title="Required extension not activated",
        )


def _executor_routes(config: SubstrateConfig, prefix: str) -> APIRouter:
    """The A2A routes under `prefix`: the real executor serves each at `/agents/{id}/` and `/agents/{id}/v1/`."""
    router = APIRouter(prefix=prefix, dependencies=[Depends(require(config.token_table, None, "executor"))])
    mutating = [Depends(_require_runtime_extension)]

    def executor(request: Request) -> ExecutorService:
        return request.app.state.executor  # type: ignore[no-any-return]

    @router.post("/messages:send", dependencies=mutating)
    async def send(instance_id: str, request: Request) -> Response:
        requested = _extensions(request)
        body = await _json_body(request, "executor.invalid_message")
        response = hitl_response(body)
        if response is not None:  # an answer to a task's question (send_message.rs `handle_hitl_response`)
            return _json(202, executor(request).answer(instance_id, body, response))
        created, task = await executor(request).send(instance_id, body, frozenset(requested))
        headers = {EXTENSIONS_HEADER: ", ".join(uri for uri in SUPPORTED_EXTENSIONS if activated(requested, uri))}
        if created:
            headers["Location"] = f"/agents/{instance_id}/v1/tasks/{task['id']}"
        else:
            headers["Idempotent-Replayed"] = "true"  # send_message.rs `build_replay_response`
        return _json(202, task, headers=headers)

    @router.get("/tasks/{task_id}")
    async def get_task(instance_id: str, task_id: str, request: Request) -> Response:
        return _json(200, executor(request).get(instance_id, task_id))

    @router.get("/tasks/{task_id}/artifacts")
    async def task_artifacts(instance_id: str, task_id: str, request: Request) -> Response:
        return _json(200, executor(request).artifacts(instance_id, task_id))

    @router.post("/tasks/{task_id}/cancel", dependencies=mutating)
    async def cancel_task(instance_id: str, task_id: str, request: Request) -> Response:
        return _json(200, await executor(request).cancel(instance_id, task_id))

    return router


def _on_executor_plane(request: Request) -> str | None:
    """The instance id of a request on the A2A plane (errors there are problem documents), else None."""
    parts = request.url.path.split("/")
    return parts[2] if len(parts) > 2 and parts[1] == "agents" else None


def _error(request: Request, error: SubstrateError, headers: dict[str, str] | None = None) -> Response:
    instance_id = _on_executor_plane(request)
    if instance_id is None or error.code.startswith("auth.") or error.code.startswith("http.payload"):
        return _json(error.status, error.body(), headers)
    return JSONResponse(error.problem(instance_id), status_code=error.status, headers=headers,
                        media_type="application/problem+json")  # fmt: skip


def create_app(config: SubstrateConfig) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = Store(config.database)
        fleet = FleetService(store, max_record_bytes=config.max_record_bytes)
        runner = Runner(store, fleet, config.runner_settings())
        recovered = runner.recover()
        if recovered:
            log.warning("substrate: %d task(s) from a previous run ended while it was down (exit status or unknown)", recovered)
        app.state.fleet = fleet
        app.state.runner = runner
        app.state.executor = ExecutorService(
            store, fleet, runner, local_instances(config.instances), config.isolation_kinds, fleet_api=config.fleet_api,
        )
        try:
            yield
        finally:
            await runner.shutdown()
            store.close()

    app = FastAPI(
        title="Mission Conductor local substrate",
        description="The Agentic Sandbox fleet and executor API, running workloads as local processes.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.limits = BodyLimits(config.max_request_bytes, config.max_json_depth, config.max_number_length)
    app.include_router(health_routes())
    app.include_router(_fleet_routes(config))
    app.include_router(_executor_routes(config, "/agents/{instance_id}/v1"))
    app.include_router(_executor_routes(config, "/agents/{instance_id}"))
    app.add_middleware(BodyLimit, max_bytes=config.max_request_bytes)
    app.add_middleware(_Unexpected)  # added last: outermost

    @app.exception_handler(SubstrateError)
    async def substrate_error(request: Request, error: SubstrateError) -> Response:
        headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
        if error.code == "http.payload_too_large":
            headers = {"Connection": "close"}  # the rest of the body is never read
        return _error(request, error, headers)

    @app.exception_handler(RequestValidationError)
    async def request_error(request: Request, error: RequestValidationError) -> Response:
        return _error(request, SubstrateError(400, "http.invalid_request", "the request does not fit this route"))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> Response:
        code = {404: "http.not_found", 405: "http.method_not_allowed"}.get(error.status_code, "http.error")
        return _error(request, SubstrateError(error.status_code, code, str(error.detail)))

    return app
