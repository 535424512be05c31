"""`conductor admission simulate`: run the admission engine over a JSON-lines trace.

It is both the operator's what-if tool (replay a day of requests against a new
quota policy) and the engine's black-box interface. Every input line yields
exactly one output line, in order; a bad line yields an error line and the run
goes on, so one typo does not hide the rest of a day's trace. Lines come in through
`worker.inputs` (`read_lines`, `parse_json`): a line too long, not UTF-8 or beyond the JSON
limits is such an error line too.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from typing import Any

from pydantic import TypeAdapter, ValidationError

from worker.inputs import InputError, parse_json
from workflows.admission import engine
from workflows.admission.model import (
    AdmissionPolicy,
    AdmissionRequest,
    Cancel,
    OpResult,
    Reconcile,
    Release,
    Renew,
    SetPolicy,
    Submit,
    TakeSnapshot,
)

_MOMENT = TypeAdapter(datetime)
# The engine counts microseconds from 1970 and adds timeouts and leases of up to a year
# (workflows.limits.MAX_DURATION_SECONDS) to a moment: every moment stays inside these years.
EARLIEST = datetime(1970, 1, 1, tzinfo=timezone.utc)
LATEST = datetime(9000, 1, 1, tzinfo=timezone.utc)


class TraceError(ValueError):
    """A trace line that cannot become an operation; `code` is what the error line carries."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def describe_validation_error(error: ValidationError, prefix: str = "") -> str:
    """One line a person can act on: every field that is wrong and why."""
    parts = []
    for item in error.errors():
        path = ".".join(str(part) for part in item["loc"]) or "(document)"
        parts.append(f"{prefix}{path}: {item['msg']}")
    return "; ".join(parts)


def check_moment(moment: datetime, what: str) -> None:
    """TraceError unless `moment` (timezone-aware) lies where the engine's arithmetic works."""
    if not EARLIEST <= moment < LATEST:
        raise TraceError(
            "invalid-line", f"`{what}` must lie between {EARLIEST:%Y-%m-%d} and {LATEST:%Y-%m-%d}: {moment.isoformat()}"
        )


def load_policy(data: object) -> AdmissionPolicy:
    try:
        return AdmissionPolicy.model_validate(data)
    except ValidationError as error:
        raise TraceError("invalid-policy", describe_validation_error(error)) from None


def parse_line(line: str) -> tuple[str | None, datetime, object]:
    """(op name, time, engine operation) for one trace line, or TraceError."""
    try:
        entry = parse_json(line)
    except InputError as error:
        raise TraceError("invalid-line", error.report) from None
    if not isinstance(entry, dict):
        raise TraceError("invalid-line", "a trace line must be a JSON object with `at` and `op`")
    op = entry.get("op")
    if "at" not in entry:
        raise TraceError("invalid-line", "missing `at` (RFC 3339 time of the operation)")
    try:
        at = _MOMENT.validate_python(entry["at"])
    except ValidationError:
        raise TraceError("invalid-line", f"`at` is not an RFC 3339 time: {entry['at']!r}") from None
    if at.tzinfo is None:
        raise TraceError("invalid-line", f"`at` needs a UTC offset, e.g. 2026-01-01T00:00:00Z: {entry['at']!r}")
    check_moment(at, "at")
    allowed = {"submit": {"request"}, "renew": {"request_id", "lease_revision"}, "release": {"request_id"},
               "cancel": {"request_id"}, "reconcile": set(), "snapshot": set(),
               "set_policy": {"policy", "operator", "drain"}}
    if not isinstance(op, str) or op not in allowed:
        shown = repr(op) if isinstance(op, str) and len(op) <= 60 else json.dumps(op)[:60]
        raise TraceError("invalid-line", f"unknown op {shown}; expected one of {', '.join(allowed)}")
    unknown = set(entry) - {"at", "op"} - allowed[op]
    if unknown:
        raise TraceError("invalid-line", f"unknown keys for {op}: {', '.join(sorted(unknown))}")
    try:
        if op == "submit":
            request = entry.get("request")
            if not isinstance(request, dict):
                raise TraceError("invalid-request", "submit needs a `request` object")
            request = {"submitted_at": entry["at"], **request}
            operation: object = Submit(request=AdmissionRequest.model_validate(request))
            try:
                check_moment(operation.request.submitted_at, "request.submitted_at")  # type: ignore[attr-defined]
            except TraceError as error:
                raise TraceError("invalid-request", str(error)) from None
        elif op in ("renew", "release", "cancel"):
            if "request_id" not in entry:
                raise TraceError("invalid-line", f"{op} needs a `request_id`")
            model = {"renew": Renew, "release": Release, "cancel": Cancel}[op]
            operation = model.model_validate({key: entry[key] for key in allowed[op] if key in entry})
        elif op == "set_policy":
            options = {key: entry[key] for key in ("operator", "drain") if key in entry}
            operation = SetPolicy.model_validate({"policy": load_policy(entry.get("policy")), **options})
        else:
            operation = Reconcile() if op == "reconcile" else TakeSnapshot()
    except ValidationError as error:
        code = "invalid-request" if op == "submit" else "invalid-line"
        raise TraceError(code, describe_validation_error(error, "request." if op == "submit" else "")) from None
    return op, at, operation


def simulate(
    policy: AdmissionPolicy, lines: Iterable[str | InputError], *, audit: bool = False
) -> Iterator[dict[str, Any]]:
    """Yield one output object per non-blank input line (plus audit events when asked); a line
    that could not be read (an InputError from `worker.inputs.read_lines`) yields an error line."""
    state = engine.new_state(policy)
    for number, line in enumerate(lines, start=1):
        if isinstance(line, InputError):
            yield {"op": None, "ok": False, "error": {"code": "invalid-line", "message": f"line {number}: {line.report}"}}
            continue
        if not line.strip():
            continue
        try:
            op, at, operation = parse_line(line)
        except TraceError as error:
            yield {"op": _op_name(line), "ok": False, "error": {"code": error.code, "message": f"line {number}: {error}"}}
            continue
        state, result, events = engine.apply(state, operation, at)  # type: ignore[arg-type]
        if result.record is not None and result.record.state == "queued":
            # The operation leaves `eta` to the views (it costs a forecast): the trace shows it.
            eta = engine.forecast(state, [result.record.request_id])[result.record.request_id]
            result = result.model_copy(update={"record": result.record.model_copy(update={"eta": eta})})
        yield result_to_json(result)
        if audit:
            for event in events:
                yield {"event": event.model_dump(mode="json")}


def result_to_json(result: OpResult) -> dict[str, Any]:
    """`{"op", "ok"}` plus whichever of record / snapshot / error the result carries, records in full."""
    output: dict[str, Any] = {"op": result.op, "ok": result.ok}
    for name in ("record", "snapshot", "error"):
        value = getattr(result, name)
        if value is not None:
            output[name] = value.model_dump(mode="json")
    return output


def _op_name(line: str) -> str | None:
    try:
        entry = parse_json(line)
    except InputError:
        return None
    op = entry.get("op") if isinstance(entry, dict) else None
    return op if isinstance(op, str) else None
