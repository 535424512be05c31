"""The Agentic Sandbox HTTP API's wire shapes, as the real server speaks them (commit e901dc2).

Owned by neither side of the wire: the client (`activities.sandbox_client`) reads the server
through these models, and they are written from the server's source, not from our local
substrate (which has its own, separately written reading of the same source in
`substrate/wire.py`). Where anything here and the server disagree, the server is right.

Responses are read leniently: a field the server adds must not stop a mission, so unknown
fields are ignored, and each (model, field) is logged once at WARNING so the drift is seen.
Requests are ours and stay strict (`extra="forbid"`). Pure data, no I/O.

The requests we send are built here too: `build_message` turns a workload's `TaskDispatch` into the A2A
`MessageSendParams` of `POST /agents/{instance}/v1/messages:send`, with the runtime extension's
data in `message.metadata[RUNTIME_EXTENSION]` (see the executor-plane requests below).

Sources (all at e901dc2):
- `management/src/http/admin_v2.rs`: `InstancesList`, `Instance`, `DegradedProvider`,
  `list_instances_value`, `build_instance_from_registered_context`.
- `management/src/http/fleet.rs`: `inventory` (200, `records` may be empty), `observe`
  (200 with the bare record), `error` (`{"error": code, "message": text}`).
- `management/agentic-sandbox-executor/src/handlers/mod.rs` `task_row_to_a2a` (the Task),
  `bindings/rest.rs` `error_response` (RFC 7807 problem documents), `extensions/mod.rs`
  `enforce_required` (the runtime extension is required on every mutating route),
  `handlers/artifacts.rs` `list` and `artifact_to_json` (a task's artifacts),
  `management/src/agent_message_dispatch.rs` `spawn_observer` (output chunks as artifacts).
"""

from __future__ import annotations

import logging
import threading
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator
from pydantic.alias_generators import to_camel

from workflows.contract import WorkloadKind, WorkloadRecord
from workflows.workload.messages import TaskDispatch, TaskState

log = logging.getLogger(__name__)

RUNTIME_EXTENSION = "https://agentic-sandbox.aiwg.io/extensions/runtime/v1"
IDEMPOTENCY_EXTENSION = "https://agentic-sandbox.aiwg.io/extensions/idempotency/v1"
EXTENSIONS_HEADER = "A2A-Extensions"
# hitl-prompt/v1 (docs/contracts/extensions/hitl-prompt/v1/spec.md): activated on dispatch, so an
# agent that asks a person puts its prompt envelope at `status.message.metadata[HITL_PROMPT_EXTENSION]`.
HITL_PROMPT_EXTENSION = "https://agentic-sandbox.aiwg.io/extensions/hitl-prompt/v1"

TERMINAL_TASK_STATES: frozenset[str] = frozenset({"completed", "failed", "canceled", "rejected", "unknown"})

_ChildId = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^\s]+$")]

_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def _warn_unknown(model: str, fields: list[str]) -> None:
    for field in fields:
        key = (model, field)
        with _warned_lock:
            if key in _warned:
                continue
            _warned.add(key)
        log.warning("Agentic Sandbox sent a field %s does not know: %r (ignored)", model, field)


def reset_unknown_field_warnings() -> None:
    """Forget which unknown fields were already logged (for tests)."""
    with _warned_lock:
        _warned.clear()


class _Response(BaseModel):
    """A response body: unknown fields are ignored and logged once per (model, field)."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _note_unknown_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            known: set[str] = set()
            for name, info in cls.model_fields.items():
                known.add(name)
                if info.alias:
                    known.add(info.alias)
            unknown = sorted(str(key) for key in data if key not in known)
            if unknown:
                _warn_unknown(cls.__name__, unknown)
        return data


class _A2AResponse(_Response):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True, alias_generator=to_camel)


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- management plane: instances (admin_v2.rs) -------------------------------------------


class Instance(_Response):
    """One item of `GET /api/v2/admin/instances` (admin_v2.rs `Instance`).

    `runtime` is "qemu", "docker" or "host"; `state` is "running" or "stopped" for registered
    executor contexts (`build_instance_from_registered_context`), other words for VMs and
    containers seen only through libvirt or Docker. Fields we do not use (loadout, image, network,
    security posture, ...) are ignored silently only if listed here; the rest are logged once.
    """

    id: str = Field(min_length=1)
    name: str
    runtime: str
    provider: str | None = None
    capabilities: list[str] = Field(default_factory=list)
    capability_constraints: list[dict[str, Any]] = Field(default_factory=list)
    state: str
    agent_card_url: str | None = None
    created_at: str | None = None
    loadout: str | None = None
    image: str | None = None
    image_ref: str | None = None
    source: str | None = None
    cwd: str | None = None
    operation_status: str | None = None
    agent_registered: bool | None = None
    agent_ready: bool | None = None
    container_finished_at: str | None = None
    network: dict[str, Any] | None = None
    transport: str | None = None
    transport_posture: str | None = None
    security_posture: dict[str, Any] | None = None
    host_daemon: dict[str, Any] | None = None


class DegradedProvider(_Response):
    """A runtime provider the server could not list (admin_v2.rs `DegradedProvider`)."""

    runtime: str
    code: str
    detail: str = ""
    retry_after: int | None = None


class InstancesList(_Response):
    """`GET /api/v2/admin/instances` (admin_v2.rs `InstancesList`)."""

    items: list[Instance]
    degraded_providers: list[DegradedProvider] = Field(default_factory=list)


# --- management plane: records and errors (fleet.rs) -------------------------------------


class RuntimeIdentity(_Request):
    """`runtime_identity` of an observation; each field, once bound, never changes."""

    task_id: Annotated[str, Field(min_length=1)] | None = None
    session_id: Annotated[str, Field(min_length=1)] | None = None
    command_id: Annotated[str, Field(min_length=1)] | None = None


class AdmitResponse(BaseModel):
    """`POST /api/v2/fleet/workloads`: the admitted record, and whether this was a resubmission
    of an identical one. The record is the contract's (strict) document, so this stays strict."""

    model_config = ConfigDict(extra="forbid")

    replayed: bool
    workload: WorkloadRecord


class ReconcileRequest(_Request):
    """`POST /api/v2/fleet/reconcile` (fleet.rs `reconcile`)."""

    before_revision: Annotated[StrictInt, Field(ge=0)]
    child_ids: list[Annotated[str, Field(min_length=1)]] = Field(min_length=1)


class FleetError(_Response):
    """A management-plane error (fleet.rs `error`): `{"error": code, "message": text}`.

    operator_auth.rs answers 401/403 with `{"error": text}` only; `current_revision` comes with
    409 `fleet.stale_revision`.
    """

    error: str
    message: str = ""
    current_revision: int | None = None
    cn: str | None = None
    uid: int | None = None


# --- executor plane (A2A) -----------------------------------------------------------------


class Problem(_Response):
    """An RFC 7807 problem document (executor `bindings/rest.rs` `error_response`)."""

    type: str = "about:blank"
    title: str = ""
    status: int | None = None
    detail: str = ""
    code: str
    trace_id: str | None = None
    instance_id: str | None = None


class Part(_A2AResponse):
    """An A2A part; `kind` is "text", "data" or "file" (any other kind is kept, not refused)."""

    kind: str
    text: str | None = None
    data: Any = None
    file: Any = None
    metadata: dict[str, Any] | None = None


class Message(_A2AResponse):
    kind: Literal["message"] = "message"
    message_id: str | None = None
    role: str | None = None
    parts: list[Part] = Field(default_factory=list)
    context_id: str | None = None
    task_id: str | None = None
    metadata: dict[str, Any] | None = None


class TaskStatus(_A2AResponse):
    """A task's status (handlers/mod.rs `task_row_to_a2a`): the stored status object with
    `state`, `timestamp` and, when set, `fail_kind` and `terminal_at` merged in."""

    state: TaskState
    timestamp: str | None = None
    message: Message | None = None
    fail_kind: str | None = Field(default=None, alias="fail_kind")
    terminal_at: str | None = Field(default=None, alias="terminal_at")
    error: Any = None
    summary: Any = None
    # what agent_message_dispatch.rs `spawn_observer` writes into a terminal status
    exit_code: int | None = Field(default=None, alias="exit_code")
    task_id: str | None = Field(default=None, alias="task_id")
    mission_id: str | None = Field(default=None, alias="mission_id")


class Artifact(_A2AResponse):
    artifact_id: str
    name: str | None = None
    description: str | None = None
    parts: list[Part] = Field(default_factory=list)
    metadata: dict[str, Any] | None = None


class Task(_A2AResponse):
    """An A2A Task (handlers/mod.rs `task_row_to_a2a`): `contextId` only when the message that
    started it carried one; artifacts come from the task store when the binding includes them."""

    kind: Literal["task"] = "task"
    id: str = Field(min_length=1)
    status: TaskStatus
    context_id: str | None = None
    metadata: dict[str, Any] | None = None
    artifacts: list[Artifact] | None = None
    history: list[Message] | None = None

    @property
    def terminal(self) -> bool:
        return self.status.state in TERMINAL_TASK_STATES

    def artifact_text(self, name: str) -> str | None:
        """The text of the first artifact called `name` (e.g. "result"), if any."""
        for artifact in self.artifacts or ():
            if artifact.name == name:
                return "".join(part.text or "" for part in artifact.parts if part.kind == "text")
        return None

    def prompt_envelope(self) -> Any:
        """The hitl-prompt/v1 envelope of a task waiting on a person (`input-required`), if any."""
        message = self.status.message
        return (message.metadata or {}).get(HITL_PROMPT_EXTENSION) if message is not None else None

    def status_text(self) -> str | None:
        """What the status says in words: its message's text, else its `error`, else its `summary`
        (agent_message_dispatch.rs writes `summary` and, for infrastructure failures, `error`)."""
        if self.status.message is not None:
            text = "\n".join(p.text or "" for p in self.status.message.parts if p.kind == "text")
            if text:
                return text
        for value in (self.status.error, self.status.summary):
            if isinstance(value, str) and value:
                return value
        return None


class TaskArtifact(_Response):
    """One row of `GET /agents/{id}/v1/tasks/{tid}/artifacts` (handlers/artifacts.rs
    `artifact_to_json`); `artifact` is the stored JSON, for command output an `output_chunk`
    `{kind, stream, data, command_id, seq, ...}` (agent_message_dispatch.rs `spawn_observer`)."""

    artifact_id: str
    task_id: str | None = None
    created_at: str | None = None
    artifact: dict[str, Any] = Field(default_factory=dict)


class TaskArtifacts(_Response):
    """`GET /agents/{id}/v1/tasks/{tid}/artifacts` (handlers/artifacts.rs `list`)."""

    task_id: str | None = None
    artifacts: list[TaskArtifact] = Field(default_factory=list)

    def output(self, stream: str = "stdout") -> str | None:
        """The text a command wrote to `stream`: its output chunks' `data` in `seq` order, or
        None if it wrote nothing there."""
        chunks = [
            row.artifact
            for row in self.artifacts
            if row.artifact.get("kind") == "output_chunk" and row.artifact.get("stream") == stream
            and isinstance(row.artifact.get("data"), str)
        ]  # fmt: skip
        if not chunks:
            return None
        chunks.sort(key=lambda chunk: chunk.get("seq") if isinstance(chunk.get("seq"), int) else 0)
        return "".join(chunk["data"] for chunk in chunks)


# --- executor plane requests (A2A messages:send) ------------------------------------------
#
# Headers: `A2A-Extensions: <RUNTIME_EXTENSION>, <IDEMPOTENCY_EXTENSION>`. Body (MessageSendParams):
#
#     {"message": {
#         "kind": "message", "role": "user",
#         "messageId": "<stable per dispatch: the idempotency key of the dispatch>",
#         "contextId": "<optional; becomes the task's contextId (a persistent agent's session)>",
#         "parts": [{"kind": "text", "text": "<the prompt: a /bin/sh command line>"}],
#         "metadata": {"https://agentic-sandbox.aiwg.io/extensions/runtime/v1": {
#             "child_id": "<lineage.child_id of an admitted workload record>",  # absent: no record
#             "kind": "one-shot-command | daemon | persistent-agent | scheduled-collector",
#             "timeout_seconds": 60,            # optional: defaults to the record's budget
#             "schedule": "*/5 * * * *",        # optional: defaults to the record's spec.schedule
#         }}}}
#
# The same `messageId` always yields the same task (idempotency extension). The executor never
# writes a workload record: the fleet plane projects a bound task's state into it on reads
# (fleet.rs `project_task_observation`). The real executor reads nothing from the metadata; the
# local substrate reads it to run a workload per its record. A message without a `child_id` is a
# command for no record: how the conductor runs a child's verifier, in the child's context.


class _A2ARequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, serialize_by_alias=True, frozen=True
    )

    def wire(self) -> dict[str, Any]:
        """JSON-ready dict in A2A spelling, without unset optional fields."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class OutgoingTextPart(_A2ARequest):
    kind: Literal["text"] = "text"
    text: str


class OutgoingMessage(_A2ARequest):
    kind: Literal["message"] = "message"
    message_id: str = Field(min_length=1, max_length=256)
    role: Literal["user", "agent"]
    parts: list[OutgoingTextPart] = Field(min_length=1)
    context_id: str | None = Field(default=None, min_length=1, max_length=256)
    task_id: str | None = Field(default=None, min_length=1, max_length=256)  # an answer names the task that asked
    metadata: dict[str, Any] | None = None


class MessageSendParams(_A2ARequest):
    message: OutgoingMessage


class RuntimeDispatch(_Request):
    """What the runtime extension carries in `message.metadata[RUNTIME_EXTENSION]`."""

    child_id: _ChildId | None = None
    kind: WorkloadKind
    timeout_seconds: int | None = Field(default=None, ge=1)
    schedule: str | None = Field(default=None, min_length=1)


def build_message(dispatch: TaskDispatch) -> MessageSendParams:
    runtime = RuntimeDispatch(
        child_id=dispatch.child_id,
        kind=dispatch.kind,
        timeout_seconds=dispatch.timeout_seconds,
        schedule=dispatch.schedule,
    )
    message = OutgoingMessage(
        message_id=dispatch.message_id,
        role="user",
        parts=[OutgoingTextPart(text=dispatch.prompt)],
        context_id=dispatch.context_id,
        metadata={RUNTIME_EXTENSION: runtime.model_dump(mode="json", exclude_none=True)},
    )
    return MessageSendParams(message=message)
