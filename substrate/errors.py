"""The one error type the substrate's services raise, and its two renderings.

The management plane answers `{"error": code, "message": text, ...extra}` (fleet.rs `error`);
the executor plane answers RFC 7807 problem documents with the same `code` (executor
`bindings/rest.rs` `error_response`; `substrate.wire.problem`). The HTTP layer picks the
rendering by plane (`substrate/app.py`); bearer refusals stay `{"error": ...}` on both, as the
real server's `operator_auth.rs` answers them.
"""

from __future__ import annotations

from typing import Any

from substrate.wire import problem


class SubstrateError(Exception):
    def __init__(self, status: int, code: str, message: str, *, title: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.title = title
        self.extra = extra

    def body(self) -> dict[str, Any]:
        return {"error": self.code, "message": self.message, **self.extra}

    def problem(self, instance_id: str | None = None) -> dict[str, Any]:
        title = self.title or self.code.rsplit(".", 1)[-1].replace("_", " ").capitalize()
        return {**problem(self.status, self.code, title, self.message, instance_id=instance_id), **self.extra}


def not_found(child_id: str) -> SubstrateError:
    return SubstrateError(404, "fleet.workload_not_found", f"no workload record with child_id {child_id!r}")
