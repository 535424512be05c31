"""The executor data plane (A2A): accept dispatch messages, show tasks and their artifacts, cancel.

Shapes and codes follow the real executor (agentic-sandbox e901dc2,
`management/agentic-sandbox-executor/src/handlers/`; the substrate's reading of them is
`substrate.wire`). What is refused, and how (RFC 7807 problem documents, rendered by `app.py`):
- a body that is not a JSON object: 400 `executor.invalid_message`; one without a `message`
  object, or one the message format does not fit: 400 `request.invalid_params` (send_message.rs);
  credential material anywhere in the body (keys that name a
  credential, strings that look like one: `workflows.credential_material`; a command uses its
  secrets through `$NAME` from the environment), a command with a NUL, an invalid
  runtime-extension entry in `message.metadata`: 400 `executor.invalid_message` (the substrate's
  own checks; the real executor has no such entry);
- the same `messageId` with different content (or for another instance): 422
  `idempotency.key_reused`; with the same content: the same task again (202,
  `Idempotent-Replayed: true`), never a second process;
- a message that contradicts its workload record (kind, target instance, isolation the
  instance does not offer, a timeout above the record's budget, a missing or invalid
  schedule): 422 with an `executor.*` code, no task is created (the substrate's own checks);
- a record that cannot start a task any more (bound to another task, in a terminal or review
  state, desired state stopped/cancelled): an A2A task in state `rejected`, no process.
A message for no record (no runtime-extension entry, or one without `child_id`) is a one-shot
command on the instance, within `timeout_seconds` or PLAIN_TASK_TIMEOUT_SECONDS: the real
executor runs whatever it is sent. The conductor sends a child's verifier that way.
Otherwise the task is created (`submitted`) and the runner starts it (`working`). The record is
not touched: the orchestrator binds the task with an observation, and reads of the record then
project the task into it (`substrate.projection`), as on the real server.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from substrate import questions
from substrate.cron import CronSchedule
from substrate.errors import SubstrateError, not_found
from substrate.fleet import FleetService
from substrate.runner import Runner, timestamp
from substrate.store import Store, TaskRow
from substrate.wire import (
    HITL_PROMPT_EXTENSION,
    RUNTIME_EXTENSION,
    SUPPORTED_EXTENSIONS,
    Message,
    MessageSendParams,
    RuntimeDispatch,
    artifact_json,
    runtime_metadata,
    task_json,
)
from workflows.contract import (
    REVIEW_REQUIRED_STATES,
    TERMINAL_OBSERVED_STATES,
    WorkloadKind,
    describe_validation_error,
)
from workflows.credential_material import find_credential_material

ALL_KINDS: tuple[WorkloadKind, ...] = ("one-shot-command", "daemon", "persistent-agent", "scheduled-collector")
PLAIN_TASK_TIMEOUT_SECONDS = 3600  # a command for no record has no budget of its own: an hour
__all__ = ["SUPPORTED_EXTENSIONS", "ExecutorService", "Instance", "local_instances"]
# The real instance list's `runtime` for an isolation tier the substrate is configured to offer.
_RUNTIME_FOR_ISOLATION = {"host": "host", "container": "docker", "vm": "qemu"}
HOST = "substrate.local"


@dataclass(frozen=True)
class Instance:
    id: str
    executor_id: str
    runtime_id: str


def local_instances(count: int) -> list[Instance]:
    return [Instance(f"local-{n}", f"local-executor-{n}", f"local-shell-{n}") for n in range(1, count + 1)]


def _invalid(message: str) -> SubstrateError:
    return SubstrateError(400, "executor.invalid_message", message, title="Invalid message")


def _invalid_params(message: str) -> SubstrateError:
    return SubstrateError(400, "request.invalid_params", message, title="Invalid params")


def _issues(error: ValidationError) -> str:
    return "; ".join(f"{path}: {text}" for path, text in describe_validation_error(error)[:8])


class ExecutorService:
    def __init__(
        self,
        store: Store,
        fleet: FleetService,
        runner: Runner,
        instances: list[Instance],
        isolation_kinds: tuple[str, ...] = ("host",),
        *,
        fleet_api: bool = True,
    ) -> None:
        self._store = store
        self._fleet = fleet
        self._runner = runner
        self._instances = {instance.id: instance for instance in instances}
        self._isolation_kinds = isolation_kinds
        self._fleet_api = fleet_api
        self._started_at = timestamp()

    # -- views -------------------------------------------------------------------------

    def instances(self) -> dict[str, Any]:
        """`GET /api/v2/admin/instances` as admin_v2.rs `InstancesList` answers: `{"items": [...]}`.

        Each instance runs commands on this machine, so its `runtime` is "host" unless the
        substrate is configured to stand in for other isolation tiers (tests of routing do), in
        which case the first tier it offers is named as the real server would (docker, qemu)."""
        runtime = _RUNTIME_FOR_ISOLATION.get(self._isolation_kinds[0], self._isolation_kinds[0])
        items = [
            {
                "id": instance.id,
                "name": instance.runtime_id,
                "runtime": runtime,
                "provider": "local-substrate",
                "capabilities": [],
                "state": "running",
                "agent_card_url": f"/agents/{instance.id}/.well-known/agent-card.json",
                "created_at": self._started_at,
            }
            for instance in self._instances.values()
        ]
        return {"items": items}

    def instance(self, instance_id: str) -> Instance:
        instance = self._instances.get(instance_id)
        if instance is None:
            raise SubstrateError(404, "instance.not_found", f"Instance '{instance_id}' not registered",
                                 title="Instance not found")  # fmt: skip
        return instance

    @staticmethod
    def view(task: TaskRow, *, created: bool = False) -> dict[str, Any]:
        """The A2A Task for a stored task (handlers/mod.rs `task_row_to_a2a`); a created task also
        carries the runtime extension's `runtime.*` metadata (extensions/runtime.rs)."""
        return task_json(
            task_id=task.task_id,
            state=task.state,
            timestamp=task.updated_at,
            context_id=task.context_id or None,
            fail_kind=task.fail_kind,
            terminal_at=task.terminal_at,
            status_extra=task.status_extra,
            metadata=runtime_metadata(task.instance_id, HOST) if created else None,
        )

    def _task(self, instance_id: str, task_id: str) -> TaskRow:
        self.instance(instance_id)
        task = self._store.get_task(task_id)
        if task is None or task.instance_id != instance_id:
            raise SubstrateError(404, "task.not_found", f"Task '{task_id}' not found", title="Task not found")
        return task

    def get(self, instance_id: str, task_id: str) -> dict[str, Any]:
        return self.view(self._task(instance_id, task_id))

    def artifacts(self, instance_id: str, task_id: str) -> dict[str, Any]:
        """handlers/artifacts.rs `list`: `{"task_id", "artifacts": [{artifact_id, task_id, created_at, artifact}]}`."""
        task = self._task(instance_id, task_id)
        rows = [artifact_json(row["artifact_id"], task_id, row["created_at"], row["artifact"]) for row in task.artifacts]
        return {"task_id": task_id, "artifacts": rows}

    async def cancel(self, instance_id: str, task_id: str) -> dict[str, Any]:
        self._task(instance_id, task_id)
        await self._runner.cancel(task_id)
        return self.get(instance_id, task_id)

    # -- dispatch ----------------------------------------------------------------------

    def _parse(self, body: object) -> tuple[MessageSendParams, RuntimeDispatch, str]:
        findings = find_credential_material(body, limit=8)
        if findings:
            raise _invalid(
                "credential material must not be sent to the executor: remove "
                + ", ".join(f"{finding.path} ({finding.what})" for finding in findings)
                + "; pass secrets through the executor's environment and refer to them as $NAME"
            )
        if not isinstance(body, dict):
            raise _invalid("the request body must be a JSON object (an A2A MessageSendParams)")
        if not isinstance(body.get("message"), dict):
            raise _invalid_params("Request body must be a JSON object with a `message` object")
        try:
            params = MessageSendParams.model_validate(body)
        except ValidationError as error:
            raise _invalid_params(f"not an A2A message: {_issues(error)}") from None
        raw = (params.message.metadata or {}).get(RUNTIME_EXTENSION, {})
        try:
            runtime = RuntimeDispatch.model_validate(raw)
        except ValidationError as error:
            raise _invalid(f"invalid runtime extension data: {_issues(error)}") from None
        prompt = params.message.prompt()
        if not prompt.strip():
            raise _invalid("the message needs a non-empty text part: the command to run")
        if "\x00" in prompt:
            raise _invalid("the command contains a NUL character, which no command line can carry")
        return params, runtime, prompt

    def answer(self, instance_id: str, body: object, response: object) -> dict[str, Any]:
        """An answer to a task's question (`substrate.questions`): the task works on, 202 with it."""
        self.instance(instance_id)
        message = body["message"]  # type: ignore[index]  (wire.hitl_response found it there)
        task_id = message.get("taskId")
        if not isinstance(task_id, str):
            raise SubstrateError(400, "hitl_response.missing_task_id", "HITL response messages must include message.taskId",
                                 title="Invalid HITL response")  # fmt: skip

        def closed(detail: str) -> SubstrateError:
            return SubstrateError(409, "hitl_already_answered_or_unknown", detail, title="HITL response rejected")

        with self._store.transaction():
            task = self._store.get_task(task_id)
            if task is None or task.instance_id != instance_id:
                raise closed("HITL prompt is unknown for this instance")
            if task.state != "input-required":
                raise closed(f"Task '{task_id}' is not waiting for HITL input")
            envelope = ((task.status_extra.get("message") or {}).get("metadata") or {}).get(HITL_PROMPT_EXTENSION)
            if not isinstance(envelope, dict):
                raise closed("Task is input-required but has no stored hitl-prompt envelope")
            problem = questions.response_problems(envelope, response)
            if problem is not None:
                status, detail, errors = problem
                if status == 409:
                    raise closed(detail)
                raise SubstrateError(422, "hitl_response_invalid", detail, title="HITL response invalid",
                                     prompt_id=envelope["prompt_id"], validation_errors=errors)  # fmt: skip
            self._runner.answer(task, message, response)  # type: ignore[arg-type]
        stored = self._store.get_task(task_id)
        assert stored is not None
        return self.view(stored)

    async def send(self, instance_id: str, body: object, extensions: frozenset[str] = frozenset()) -> tuple[bool, dict[str, Any]]:
        """Returns (created, A2A task). The HTTP layer has checked the runtime extension;
        `extensions`: the activated ones (hitl-prompt/v1 lets the task's process ask in envelopes)."""
        instance = self.instance(instance_id)
        params, runtime, prompt = self._parse(body)
        message = params.message
        fingerprint = hashlib.sha256(
            json.dumps([instance_id, body], sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest()
        with self._store.transaction():
            existing = self._store.task_by_message_id(message.message_id)
            if existing is not None:
                if existing.message_sha256 != fingerprint:
                    raise SubstrateError(
                        422,
                        "idempotency.key_reused",
                        f"messageId {message.message_id!r} was already used for a different message "
                        f"(task {existing.task_id!r}); use a new messageId for a new dispatch",
                        title="Idempotency key reused with different payload",
                    )
                return False, self.view(existing, created=True)
            task = self._admit_task(instance, message, runtime, prompt, fingerprint, HITL_PROMPT_EXTENSION.lower() in extensions)
        if task.state == "submitted":
            await self._runner.start(task)
        stored = self._store.get_task(task.task_id)
        assert stored is not None
        return True, self.view(stored, created=True)

    def _admit_task(
        self, instance: Instance, message: Message, runtime: RuntimeDispatch, prompt: str, fingerprint: str, hitl: bool,
    ) -> TaskRow:
        if runtime.child_id is None:
            return self._admit_plain_task(instance, message, runtime, prompt, fingerprint, hitl)
        if not self._fleet_api:
            # No fleet plane, so no record to check the message against: it runs as its runtime data
            # says, as an executor without the fleet router runs whatever it is sent.
            kind = runtime.kind or "one-shot-command"
            request = {"prompt": prompt, "timeout_seconds": runtime.timeout_seconds or PLAIN_TASK_TIMEOUT_SECONDS,
                       "schedule": runtime.schedule, "hitl": hitl}  # fmt: skip
            return self._insert_task(instance, message, fingerprint, runtime.child_id, kind, request, None)
        record = self._fleet.find(runtime.child_id)
        if record is None:
            raise not_found(runtime.child_id)
        if runtime.kind is not None and record.kind != runtime.kind:
            raise SubstrateError(
                422,
                "executor.kind_mismatch",
                f"the message says kind {runtime.kind!r} but workload {runtime.child_id!r} is a {record.kind!r}",
            )
        if record.lineage.target_id != instance.id:
            raise SubstrateError(
                422,
                "executor.target_mismatch",
                f"workload {runtime.child_id!r} targets {record.lineage.target_id!r}; send it to that instance",
            )
        isolation = record.spec.policy.isolation_kind
        if isolation not in self._isolation_kinds:
            raise SubstrateError(
                422,
                "executor.isolation_unsupported",
                f"workload {runtime.child_id!r} needs {isolation!r} isolation; instance {instance.id!r} offers "
                + ", ".join(self._isolation_kinds),
            )
        budget = record.spec.budgets.timeout_seconds
        timeout = runtime.timeout_seconds or budget
        if timeout > budget:
            raise SubstrateError(
                422,
                "executor.budget_exceeded",
                f"timeout_seconds {timeout} exceeds the record's budget of {budget} s",
            )
        schedule = runtime.schedule or record.spec.schedule
        if record.kind == "scheduled-collector":
            if schedule is None:
                raise SubstrateError(422, "executor.schedule_required", "a scheduled collector needs a schedule")
            try:
                CronSchedule.parse(schedule)
            except ValueError as error:  # CronError, or whatever else the text makes the parser raise
                shown = schedule if len(schedule) <= 80 else schedule[:77] + "..."
                raise SubstrateError(422, "executor.invalid_schedule", f"schedule {shown!r}: {error}") from None

        refusal = None
        state = record.status.observed_state
        if record.lineage.task_id is not None:
            refusal = f"workload {runtime.child_id!r} is already bound to task {record.lineage.task_id!r}"
        elif state in TERMINAL_OBSERVED_STATES or state in REVIEW_REQUIRED_STATES:
            refusal = f"workload {runtime.child_id!r} is {state!r} and cannot start again"
        elif record.spec.desired_state in ("stopped", "cancelled"):
            refusal = f"workload {runtime.child_id!r} has desired_state {record.spec.desired_state!r}"
        request = {"prompt": prompt, "timeout_seconds": timeout, "schedule": schedule, "hitl": hitl}
        return self._insert_task(instance, message, fingerprint, runtime.child_id, record.kind, request, refusal)

    def _admit_plain_task(
        self, instance: Instance, message: Message, runtime: RuntimeDispatch, prompt: str, fingerprint: str, hitl: bool,
    ) -> TaskRow:
        if runtime.kind not in (None, "one-shot-command"):
            raise _invalid(
                f"a {runtime.kind} runs for a workload record: name it with `child_id` in the runtime extension's data"
            )
        if runtime.schedule is not None:
            raise _invalid("a schedule belongs to a scheduled-collector's record: name it with `child_id`")
        request = {"prompt": prompt, "timeout_seconds": runtime.timeout_seconds or PLAIN_TASK_TIMEOUT_SECONDS, "schedule": None,
                   "hitl": hitl}  # fmt: skip
        return self._insert_task(instance, message, fingerprint, "", "one-shot-command", request, None)

    def _insert_task(
        self, instance: Instance, message: Message, fingerprint: str, child_id: str, kind: str,
        request: dict[str, Any], refusal: str | None,
    ) -> TaskRow:
        """A new task row: `submitted`, or `rejected` with why when the record cannot start one."""
        task_id = f"task-{uuid.uuid4().hex}"
        task = TaskRow(
            task_id=task_id,
            message_id=message.message_id,
            message_sha256=fingerprint,
            instance_id=instance.id,
            child_id=child_id,
            context_id=message.context_id or "",  # kept only when the message carried one (send_message.rs)
            kind=kind,
            state="rejected" if refusal else "submitted",
            status_text=refusal,
            updated_at=timestamp(),
            request=request,
            artifacts=[],
            terminal_at=timestamp() if refusal else None,
            status_extra={"task_id": task_id, **({"error": refusal} if refusal else {})},
        )
        self._store.insert_task(task)
        return task
