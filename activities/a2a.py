"""A2A wire models for the Agentic Sandbox executor plane, and the runtime extension we put on them.

Pure data (no I/O): what the fleet client sends (`build_message`). Responses are read through
`activities.agentic_sandbox_api`; the local substrate has its own reading (`substrate/wire.py`).
The models follow the A2A protocol JSON (camelCase, `kind` discriminators):
`Message{kind:"message", messageId, role, parts[], contextId?, taskId?, metadata?, ...}`,
`Task{kind:"task", id, contextId, status{state, message?, timestamp?}, artifacts?, ...}`,
`Artifact{artifactId, name?, parts[], metadata?}`, parts `{kind:"text", text}` / `{kind:"data", data}`.

Dispatching a workload (`POST /agents/{instance}/v1/messages:send`)
--------------------------------------------------------------------
Request headers: `A2A-Extensions: <RUNTIME_EXTENSION>, <IDEMPOTENCY_EXTENSION>` (comma-separated).
Body (A2A `MessageSendParams`)::

    {"message": {
        "kind": "message", "role": "user",
        "messageId": "<stable per dispatch: the idempotency key of the dispatch>",
        "contextId": "<optional; becomes the task's contextId (a persistent agent's session)>",
        "parts": [{"kind": "text", "text": "<the prompt: a /bin/sh command line>"}],
        "metadata": {
            "https://agentic-sandbox.aiwg.io/extensions/runtime/v1": {
                "child_id": "<lineage.child_id of an admitted workload record>",
                "kind": "one-shot-command | daemon | persistent-agent | scheduled-collector",
                "timeout_seconds": 60,            # optional: defaults to the record's budget
                "schedule": "*/5 * * * *",        # optional: defaults to the record's spec.schedule
                "verifier": "test -s result.json" # optional: run after a successful run
            }}}}

The prompt is the concatenation of the text parts (joined by newlines); data parts are
ignored by the runtime. Extension data lives in `metadata` under the extension's URI, as
A2A extensions do. The same `messageId` always yields the same task (idempotency extension).

Task states and fleet observed states
-------------------------------------
The executor never writes a workload record: the fleet plane projects a bound task's state into
it on reads (agentic-sandbox `management/src/http/fleet.rs` `project_task_observation`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

RUNTIME_EXTENSION = "https://agentic-sandbox.aiwg.io/extensions/runtime/v1"
IDEMPOTENCY_EXTENSION = "https://agentic-sandbox.aiwg.io/extensions/idempotency/v1"
EXTENSIONS_HEADER = "A2A-Extensions"

TaskState = Literal[
    "submitted",
    "working",
    "input-required",
    "auth-required",
    "completed",
    "failed",
    "canceled",
    "rejected",
    "unknown",
]
TERMINAL_TASK_STATES: frozenset[str] = frozenset({"completed", "failed", "canceled", "rejected", "unknown"})

WorkloadKindName = Literal["persistent-agent", "daemon", "scheduled-collector", "one-shot-command"]


class _A2AModel(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        serialize_by_alias=True,
        frozen=True,
    )

    def wire(self) -> dict[str, Any]:
        """JSON-ready dict in A2A spelling, without unset optional fields."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class TextPart(_A2AModel):
    kind: Literal["text"] = "text"
    text: str
    metadata: dict[str, Any] | None = None


class DataPart(_A2AModel):
    kind: Literal["data"] = "data"
    data: dict[str, Any]
    metadata: dict[str, Any] | None = None


Part = Annotated[TextPart | DataPart, Field(discriminator="kind")]


class Message(_A2AModel):
    kind: Literal["message"] = "message"
    message_id: str = Field(min_length=1, max_length=256)
    role: Literal["user", "agent"]
    parts: list[Part] = Field(min_length=1)
    context_id: str | None = Field(default=None, min_length=1, max_length=256)
    task_id: str | None = None
    reference_task_ids: list[str] | None = None
    extensions: list[str] | None = None
    metadata: dict[str, Any] | None = None


class MessageSendParams(_A2AModel):
    message: Message
    configuration: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None


class TaskStatus(_A2AModel):
    state: TaskState
    message: Message | None = None
    timestamp: str | None = None


class Artifact(_A2AModel):
    artifact_id: str
    name: str | None = None
    description: str | None = None
    parts: list[Part]
    metadata: dict[str, Any] | None = None
    extensions: list[str] | None = None


class Task(_A2AModel):
    kind: Literal["task"] = "task"
    id: str
    context_id: str
    status: TaskStatus
    artifacts: list[Artifact] | None = None
    history: list[Message] | None = None
    metadata: dict[str, Any] | None = None

    @property
    def terminal(self) -> bool:
        return self.status.state in TERMINAL_TASK_STATES

    def artifact_text(self, name: str) -> str | None:
        """The text of the first artifact called `name` (e.g. "result"), if any."""
        for artifact in self.artifacts or ():
            if artifact.name == name:
                return "".join(p.text for p in artifact.parts if isinstance(p, TextPart))
        return None


class RuntimeDispatch(BaseModel):
    """What the runtime extension carries in `message.metadata[RUNTIME_EXTENSION]`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    child_id: str = Field(min_length=1, max_length=256, pattern=r"^[^\s]+$")
    kind: WorkloadKindName
    timeout_seconds: int | None = Field(default=None, ge=1)
    schedule: str | None = Field(default=None, min_length=1)
    verifier: str | None = Field(default=None, min_length=1)


class Dispatch(BaseModel):
    """Everything needed to start one workload's task; `build_message` turns it into A2A."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    message_id: str = Field(min_length=1, max_length=256)
    child_id: str = Field(min_length=1, max_length=256, pattern=r"^[^\s]+$")
    kind: WorkloadKindName
    prompt: str = Field(min_length=1)
    timeout_seconds: int | None = Field(default=None, ge=1)
    schedule: str | None = None
    verifier: str | None = None
    context_id: str | None = None


def build_message(dispatch: Dispatch) -> MessageSendParams:
    runtime = RuntimeDispatch(
        child_id=dispatch.child_id,
        kind=dispatch.kind,
        timeout_seconds=dispatch.timeout_seconds,
        schedule=dispatch.schedule,
        verifier=dispatch.verifier,
    )
    message = Message(
        message_id=dispatch.message_id,
        role="user",
        parts=[TextPart(text=dispatch.prompt)],
        context_id=dispatch.context_id,
        metadata={RUNTIME_EXTENSION: runtime.model_dump(mode="json", exclude_none=True)},
    )
    return MessageSendParams(message=message)


def prompt_of(message: Message) -> str:
    return "\n".join(part.text for part in message.parts if isinstance(part, TextPart))


def requested_extensions(header_values: list[str]) -> set[str]:
    """Extension URIs from one or more (comma-separated) `A2A-Extensions` header values."""
    return {uri.strip() for value in header_values for uri in value.split(",") if uri.strip()}
