"""HTTP routes of the local substrate: the Agentic Sandbox wire contract, nothing more.

Management plane (`/api/v2/...`) takes the fleet token, the executor plane (`/agents/...`)
the executor token; each refuses the other's. Errors are `{"error": code, "message": text}`
(401 `auth.unauthorized` for a missing or wrong token). The rules live in `fleet.py` and
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

from activities.a2a import EXTENSIONS_HEADER, requested_extensions
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
from substrate.executor import SUPPORTED_EXTENSIONS, ExecutorService, local_instances
from substrate.fleet import FleetService
from substrate.health import health_routes
from substrate.runner import Runner
from substrate.store import Store

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

    @router.post("/fleet/workloads")
    async def admit(request: Request) -> Response:
        replayed, record = fleet(request).admit(await _json_body(request, "fleet.invalid_record"))
        return _json(200 if replayed else 202, {"replayed": replayed, "workload": record})

    @router.get("/fleet/workloads")
    async def inventory(request: Request) -> Response:
        document = fleet(request).inventory()
        # The contract's inventory has at least one record: an empty fleet has no document.
        return Response(status_code=204) if document is None else _json(200, document)

    @router.get("/fleet/workloads/{child_id}")
    async def get_workload(child_id: str, request: Request) -> Response:
        return _json(200, fleet(request).get(child_id).to_wire())

    @router.post("/fleet/workloads/{child_id}/observations")
    async def observe(child_id: str, request: Request) -> Response:
        record = fleet(request).observe(child_id, await _json_body(request, "fleet.invalid_observation"))
        return _json(200, {"workload": record})

    @router.post("/fleet/reconcile")
    async def reconcile(request: Request) -> Response:
        return _json(200, fleet(request).reconcile(await _json_body(request, "fleet.invalid_request")))

    @router.get("/admin/instances")
    async def instances(request: Request) -> Response:
        return _json(200, {"instances": request.app.state.executor.instances()})

    return router


def _executor_routes(config: SubstrateConfig) -> APIRouter:
    router = APIRouter(
        prefix="/agents/{instance_id}/v1", dependencies=[Depends(require(config.token_table, None, "executor"))]
    )

    def executor(request: Request) -> ExecutorService:
        return request.app.state.executor  # type: ignore[no-any-return]

    @router.post("/messages:send")
    async def send(instance_id: str, request: Request) -> Response:
        requested = requested_extensions(
            request.headers.getlist(EXTENSIONS_HEADER) + request.headers.getlist(f"X-{EXTENSIONS_HEADER}")
        )
        body = await _json_body(request, "executor.invalid_message")
        created, task = await executor(request).send(instance_id, requested, body)
        activated = ", ".join(uri for uri in SUPPORTED_EXTENSIONS if uri in requested)
        return _json(202 if created else 200, task, headers={EXTENSIONS_HEADER: activated})

    @router.get("/tasks/{task_id}")
    async def get_task(instance_id: str, task_id: str, request: Request) -> Response:
        return _json(200, executor(request).get(instance_id, task_id))

    @router.post("/tasks/{task_id}/cancel")
    async def cancel_task(instance_id: str, task_id: str, request: Request) -> Response:
        return _json(200, await executor(request).cancel(instance_id, task_id))

    return router


def create_app(config: SubstrateConfig) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = Store(config.database)
        fleet = FleetService(store, max_record_bytes=config.max_record_bytes)
        runner = Runner(store, fleet, config.runner_settings())
        recovered = runner.recover()
        if recovered:
            log.warning("substrate: %d task(s) from a previous run recorded as unknown", recovered)
        app.state.fleet = fleet
        app.state.runner = runner
        app.state.executor = ExecutorService(
            store, fleet, runner, local_instances(config.instances), config.isolation_kinds
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
    app.include_router(_executor_routes(config))
    app.add_middleware(BodyLimit, max_bytes=config.max_request_bytes)
    app.add_middleware(_Unexpected)  # added last: outermost

    @app.exception_handler(SubstrateError)
    async def substrate_error(_: Request, error: SubstrateError) -> Response:
        headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
        if error.code == "http.payload_too_large":
            headers = {"Connection": "close"}  # the rest of the body is never read
        return _json(error.status, error.body(), headers)

    @app.exception_handler(RequestValidationError)
    async def request_error(_: Request, error: RequestValidationError) -> Response:
        return _json(400, {"error": "http.invalid_request", "message": "the request does not fit this route"})

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException) -> Response:
        code = {404: "http.not_found", 405: "http.method_not_allowed"}.get(error.status_code, "http.error")
        return _json(error.status_code, {"error": code, "message": str(error.detail)})

    return app
