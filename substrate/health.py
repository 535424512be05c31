"""Unauthenticated health routes, with the real server's paths, bodies and status codes.

From `management/src/http/server.rs` and `health.rs` (Agentic Sandbox e901dc2), which
`operator_auth.rs` (`is_unauthenticated_metadata_path`) lets through without a token:

- `GET /health` → 200 `{"status": "ok", "service": "agentic-management"}`;
- `GET /healthz` → 200 `{"status": "alive"}` (liveness);
- `GET /healthz/http` → 200 `{"http": "alive"}`, touching no shared state (the real server's
  watchdog probe: it must answer even while every other handler is stuck);
- `GET /readyz` → 200 `{"status": "ready", "agent_count": N}`, or 503 `{"status": "not_ready",
  "reason": ...}`. The real server counts connected agents; the substrate counts its executor
  instances, and is not ready while it starts (recovery and re-adoption not yet done) or once it
  is shutting down.

The service name is the real server's on purpose: a probe cannot tell the two apart, which is
the point of the substrate. Nothing here says how many tasks run or which exist.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse


def health_routes() -> APIRouter:
    router = APIRouter()

    @router.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({"status": "ok", "service": "agentic-management"})

    @router.get("/healthz")
    async def liveness() -> JSONResponse:
        return JSONResponse({"status": "alive"})

    @router.get("/healthz/http")
    async def http_only() -> JSONResponse:
        return JSONResponse({"http": "alive"})

    @router.get("/readyz")
    async def readiness(request: Request) -> JSONResponse:
        executor = getattr(request.app.state, "executor", None)
        if executor is None:  # the lifespan sets the runner, then the executor, once recovery is done
            return JSONResponse({"status": "not_ready", "reason": "starting"}, status_code=503)
        if request.app.state.runner.closing:
            return JSONResponse({"status": "not_ready", "reason": "shutting_down"}, status_code=503)
        count = sum(1 for item in executor.instances()["items"] if item["state"] == "running")
        if count == 0:
            return JSONResponse({"status": "not_ready", "reason": "no_agents_connected"}, status_code=503)
        return JSONResponse({"status": "ready", "agent_count": count})

    return router
