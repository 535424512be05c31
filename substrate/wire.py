"""The substrate's own reading of the Agentic Sandbox wire, written from the real server's source.

The client (`activities/`) has its own models of the same API; the two are written apart on
purpose, so a misreading of the real server cannot hide on both sides of the wire at once
(`tests/substrate/test_substrate_imports.py` keeps `substrate/` from importing `activities/`).

Sources, all `jmagly/agentic-sandbox` at commit e901dc2:
- `management/src/http/fleet.rs`: `ObservationRequest`, `RuntimeIdentityRequest` and
  `ReconcileRequest` (`deny_unknown_fields`), `error` (`{"error": code, "message": text}`).
- `management/agentic-sandbox-executor/src/handlers/mod.rs` `task_row_to_a2a` (the Task JSON),
  `handlers/send_message.rs` `handler` (what a message must hold, `contextId` kept only when
  sent), `bindings/rest.rs` `error_response` (RFC 7807 problem documents),
  `extensions/mod.rs` `ActivatedExtensions::from_headers` and `enforce_required`,
  `extensions/runtime.rs` `post_response` (`runtime.*` metadata on a created task),
  `handlers/artifacts.rs` `artifact_to_json`.

What the real executor does not have and the substrate adds, under the runtime extension's key
in `message.metadata`: the workload's `child_id` and `kind`, and optionally `timeout_seconds` and
`schedule` (`RuntimeDispatch`); the substrate checks them against the record. A message without
them, or without a `child_id`, is a plain command for no record, which the real executor also
runs (it reads nothing from a message's metadata).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from workflows.contract import WorkloadStatus

RUNTIME_EXTENSION = "https://agentic-sandbox.aiwg.io/extensions/runtime/v1"
IDEMPOTENCY_EXTENSION = "https://agentic-sandbox.aiwg.io/extensions/idempotency/v1"
HITL_PROMPT_EXTENSION = "https://agentic-sandbox.aiwg.io/extensions/hitl-prompt/v1"
EXTENSIONS_HEADER = "A2A-Extensions"
SUPPORTED_EXTENSIONS = (RUNTIME_EXTENSION, IDEMPOTENCY_EXTENSION, HITL_PROMPT_EXTENSION)
ERROR_TYPE_BASE = "https://agentic-sandbox.aiwg.io/errors/"

#: The executor's task states (`store/task_store.rs` `TaskState`), plus `unknown`, which only the
#: substrate uses: a task whose process vanished while the substrate was down.
TaskState = Literal[
    "submitted", "working", "input-required", "auth-required",
    "completed", "failed", "canceled", "rejected", "unknown",
]  # fmt: skip
#: `TaskState::is_terminal` (+ `unknown`): no transition out, cancel answers 409.
TERMINAL_TASK_STATES: frozenset[str] = frozenset({"completed", "failed", "canceled", "rejected", "unknown"})
ACTIVE_TASK_STATES: tuple[str, ...] = ("submitted", "working", "input-required", "auth-required")

Id = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^\s]+$")]
NonNegative = Annotated[StrictInt, Field(ge=0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- management plane (fleet.rs) -------------------------------------------------------------


class RuntimeIdentity(_Strict):
    """fleet.rs `RuntimeIdentityRequest`; `apply_runtime_identity` binds each field once."""

    task_id: Id | None = None
    session_id: Id | None = None
    command_id: Id | None = None


class ObservationRequest(_Strict):
    """fleet.rs `ObservationRequest`: `status.revision` must be `expected_revision + 1`."""

    expected_revision: NonNegative
    status: WorkloadStatus
    runtime_identity: RuntimeIdentity | None = None


class ReconcileRequest(_Strict):
    """fleet.rs `ReconcileRequest`; an empty `child_ids` is refused."""

    before_revision: NonNegative
    child_ids: list[Id] = Field(min_length=1)


# --- executor plane (A2A) ----------------------------------------------------------------------


class _Part(BaseModel):
    """A message part; only text parts carry the prompt (send_message.rs forwards text only)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    kind: str
    text: str | None = None


class Message(BaseModel):
    """The `message` of `messages:send`: what the substrate reads of it (A2A camelCase)."""

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)

    message_id: str = Field(alias="messageId", min_length=1, max_length=256)
    role: Literal["user", "agent"]
    parts: list[_Part] = Field(min_length=1)
    context_id: str | None = Field(default=None, alias="contextId", min_length=1, max_length=256)
    metadata: dict[str, Any] | None = None

    def prompt(self) -> str:
        return "\n".join(part.text for part in self.parts if part.kind == "text" and part.text is not None)


class MessageSendParams(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    message: Message


class RuntimeDispatch(_Strict):
    """The substrate's data under `message.metadata[RUNTIME_EXTENSION]`; all optional, since the
    real executor needs none of it. No `child_id`: a one-shot command for no workload record."""

    child_id: Id | None = None
    kind: Literal["persistent-agent", "daemon", "scheduled-collector", "one-shot-command"] | None = None
    timeout_seconds: int | None = Field(default=None, ge=1)
    schedule: str | None = Field(default=None, min_length=1)


def hitl_response(body: object) -> object | None:
    """`message.metadata.hitl_response_for` of a `messages:send` body: an answer, not a dispatch
    (send_message.rs looks for it before anything else)."""
    if not isinstance(body, dict) or not isinstance(body.get("message"), dict):
        return None
    metadata = body["message"].get("metadata")
    return metadata.get("hitl_response_for") if isinstance(metadata, dict) else None


def requested_extensions(header_values: Iterable[str]) -> set[str]:
    """URIs of one or more `A2A-Extensions` values (repeated lines or comma-separated), lower-cased:
    `ActivatedExtensions::contains` compares them case-insensitively."""
    return {uri.strip().lower() for value in header_values for uri in value.split(",") if uri.strip()}


def activated(requested: set[str], uri: str) -> bool:
    return uri.lower() in requested


def task_json(
    *,
    task_id: str,
    state: str,
    timestamp: str,
    context_id: str | None,
    fail_kind: str | None = None,
    terminal_at: str | None = None,
    status_extra: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """handlers/mod.rs `task_row_to_a2a`: the stored status object with `state`, `timestamp` and,
    when set, `fail_kind` and `terminal_at`; `contextId` and `metadata` only when there are any."""
    status: dict[str, Any] = {**(status_extra or {}), "state": state, "timestamp": timestamp}
    if fail_kind is not None:
        status["fail_kind"] = fail_kind
    if terminal_at is not None:
        status["terminal_at"] = terminal_at
    task: dict[str, Any] = {"id": task_id, "kind": "task", "status": status}
    if context_id is not None:
        task["contextId"] = context_id
    if metadata is not None:
        task["metadata"] = metadata
    return task


def runtime_metadata(instance_id: str, host: str) -> dict[str, Any]:
    """extensions/runtime.rs `post_response`: what a created task says about where it runs."""
    return {"runtime.instance_id": instance_id, "runtime.kind": "host", "runtime.host": host}


def artifact_json(artifact_id: str, task_id: str, created_at: str, artifact: dict[str, Any]) -> dict[str, Any]:
    """handlers/artifacts.rs `artifact_to_json`."""
    return {"artifact_id": artifact_id, "task_id": task_id, "created_at": created_at, "artifact": artifact}


def problem(status: int, code: str, title: str, detail: str, *, instance_id: str | None = None) -> dict[str, Any]:
    """bindings/rest.rs `error_response`: an RFC 7807 problem document with a machine `code`."""
    slug = code.replace(".", "-").replace("_", "-")
    return {
        "type": f"{ERROR_TYPE_BASE}{slug}",
        "title": title,
        "status": status,
        "detail": detail,
        "code": code,
        "trace_id": "",
        "instance_id": instance_id or "",
    }
