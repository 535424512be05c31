"""The one error type the substrate's services raise; the HTTP layer renders it as
`{"error": code, "message": text, ...extra}` with `status`."""

from __future__ import annotations

from typing import Any


class SubstrateError(Exception):
    def __init__(self, status: int, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.extra = extra

    def body(self) -> dict[str, Any]:
        return {"error": self.code, "message": self.message, **self.extra}


def not_found(child_id: str) -> SubstrateError:
    return SubstrateError(404, "fleet.workload_not_found", f"no workload record with child_id {child_id!r}")
