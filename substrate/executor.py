"""The executor data plane (A2A): accept dispatch messages, show tasks, cancel them.

The message format is documented in `activities.a2a`. What is refused, and how:
- a malformed message, a missing runtime extension, credential material anywhere in the body
  (keys that name a credential, strings that look like one: `workflows.credential_material`;
  a command uses its secrets through `$NAME` from the environment), a command with a NUL: 400;
- the same `messageId` with different content (or for another instance): 422
  `executor.idempotency_collision`; with the same content: the existing task (200), never a
  second process;
- a message that contradicts its workload record (kind, target instance, isolation the
  instance does not offer, a timeout above the record's budget, a missing or invalid
  schedule): 422, no task is created;
- a record that cannot start a task any more (already bound to another task, in a terminal
  or review state, desired state stopped/cancelled): an A2A task in state `rejected`, no
  process, the record untouched.
Otherwise the task is created (`submitted`), the record moves to `starting` with
`lineage.task_id` bound (and `session_id` = contextId for a persistent agent), and the
runner starts it.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from activities.a2a import (
    IDEMPOTENCY_EXTENSION,
    RUNTIME_EXTENSION,
    Artifact,
    Message,
    MessageSendParams,
    RuntimeDispatch,
    Task,
    TaskStatus,
    TextPart,
    prompt_of,
)
from activities.sandbox_api import RuntimeIdentity
from substrate.cron import CronSchedule
from substrate.errors import SubstrateError, not_found
from substrate.fleet import FleetService
from substrate.runner import Runner, timestamp
from substrate.store import Store, TaskRow
from workflows.contract import (
    REVIEW_REQUIRED_STATES,
    TERMINAL_OBSERVED_STATES,
    WorkloadKind,
    describe_validation_error,
)
from workflows.credential_material import find_credential_material

ALL_KINDS: tuple[WorkloadKind, ...] = ("one-shot-command", "daemon", "persistent-agent", "scheduled-collector")
SUPPORTED_EXTENSIONS = (RUNTIME_EXTENSION, IDEMPOTENCY_EXTENSION)


@dataclass(frozen=True)
class Instance:
    id: str
    executor_id: str
    runtime_id: str


def local_instances(count: int) -> list[Instance]:
    return [Instance(f"local-{n}", f"local-executor-{n}", f"local-shell-{n}") for n in range(1, count + 1)]


def _invalid(message: str) -> SubstrateError:
    return SubstrateError(400, "executor.invalid_message", message)


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
    ) -> None:
        self._store = store
        self._fleet = fleet
        self._runner = runner
        self._instances = {instance.id: instance for instance in instances}
        self._isolation_kinds = isolation_kinds

    # -- views -------------------------------------------------------------------------

    def instances(self) -> list[dict[str, Any]]:
        return [
            {
                "id": instance.id,
                "executor_id": instance.executor_id,
                "runtime_id": instance.runtime_id,
                "workload_kinds": list(ALL_KINDS),
                "isolation_kinds": list(self._isolation_kinds),
                "status": "ready",
                "active_tasks": self._store.count_active_tasks(instance.id),
            }
            for instance in self._instances.values()
        ]

    def _instance(self, instance_id: str) -> Instance:
        instance = self._instances.get(instance_id)
        if instance is None:
            known = ", ".join(self._instances)
            raise SubstrateError(
                404, "executor.instance_not_found", f"no executor instance {instance_id!r} (instances: {known})"
            )
        return instance

    @staticmethod
    def view(task: TaskRow) -> dict[str, Any]:
        """The A2A Task for a stored task."""
        message = None
        if task.status_text:
            message = Message(
                message_id=f"{task.task_id}-status-{task.updated_at}",
                role="agent",
                parts=[TextPart(text=task.status_text)],
                task_id=task.task_id,
                context_id=task.context_id,
            )
        return Task(
            id=task.task_id,
            context_id=task.context_id,
            status=TaskStatus(state=task.state, message=message, timestamp=task.updated_at),  # type: ignore[arg-type]
            artifacts=[Artifact.model_validate(a) for a in task.artifacts] or None,
            metadata={RUNTIME_EXTENSION: {"child_id": task.child_id, "instance_id": task.instance_id}},
        ).wire()

    def _task(self, instance_id: str, task_id: str) -> TaskRow:
        self._instance(instance_id)
        task = self._store.get_task(task_id)
        if task is None or task.instance_id != instance_id:
            raise SubstrateError(404, "executor.task_not_found", f"no task {task_id!r} on instance {instance_id!r}")
        return task

    def get(self, instance_id: str, task_id: str) -> dict[str, Any]:
        return self.view(self._task(instance_id, task_id))

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
        try:
            params = MessageSendParams.model_validate(body)
        except ValidationError as error:
            raise _invalid(f"not an A2A MessageSendParams: {_issues(error)}") from None
        raw = (params.message.metadata or {}).get(RUNTIME_EXTENSION)
        if raw is None:
            raise _invalid(f"message.metadata must carry the runtime extension's data under {RUNTIME_EXTENSION!r}")
        try:
            runtime = RuntimeDispatch.model_validate(raw)
        except ValidationError as error:
            raise _invalid(f"invalid runtime extension data: {_issues(error)}") from None
        prompt = prompt_of(params.message)
        if not prompt.strip():
            raise _invalid("the message needs a non-empty text part: the command to run")
        for name, command in (("the command", prompt), ("the verifier", runtime.verifier or "")):
            if "\x00" in command:
                raise _invalid(f"{name} contains a NUL character, which no command line can carry")
        return params, runtime, prompt

    async def send(self, instance_id: str, extensions: set[str], body: object) -> tuple[bool, dict[str, Any]]:
        """Returns (created, A2A task)."""
        instance = self._instance(instance_id)
        if RUNTIME_EXTENSION not in extensions:
            raise SubstrateError(
                400,
                "executor.extension_required",
                f"activate the runtime extension: send the header A2A-Extensions: {RUNTIME_EXTENSION}",
            )
        params, runtime, prompt = self._parse(body)
        message = params.message
        fingerprint = hashlib.sha256(
            json.dumps([instance_id, message.wire()], sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest()
        with self._store.transaction():
            existing = self._store.task_by_message_id(message.message_id)
            if existing is not None:
                if existing.message_sha256 != fingerprint:
                    raise SubstrateError(
                        422,
                        "executor.idempotency_collision",
                        f"messageId {message.message_id!r} was already used for a different message "
                        f"(task {existing.task_id!r}); use a new messageId for a new dispatch",
                    )
                return False, self.view(existing)
            task = self._admit_task(instance, message, runtime, prompt, fingerprint)
        if task.state == "submitted":
            await self._runner.start(task)
        stored = self._store.get_task(task.task_id)
        assert stored is not None
        return True, self.view(stored)

    def _admit_task(
        self, instance: Instance, message: Message, runtime: RuntimeDispatch, prompt: str, fingerprint: str
    ) -> TaskRow:
        record = self._fleet.find(runtime.child_id)
        if record is None:
            raise not_found(runtime.child_id)
        if record.kind != runtime.kind:
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

        task_id = f"task-{uuid.uuid4().hex}"
        context_id = message.context_id or f"ctx-{uuid.uuid4().hex}"
        state = record.status.observed_state
        refusal = None
        if record.lineage.task_id is not None:
            refusal = f"workload {runtime.child_id!r} is already bound to task {record.lineage.task_id!r}"
        elif state in TERMINAL_OBSERVED_STATES or state in REVIEW_REQUIRED_STATES:
            refusal = f"workload {runtime.child_id!r} is {state!r} and cannot start again"
        elif record.spec.desired_state in ("stopped", "cancelled"):
            refusal = f"workload {runtime.child_id!r} has desired_state {record.spec.desired_state!r}"
        task = TaskRow(
            task_id=task_id,
            message_id=message.message_id,
            message_sha256=fingerprint,
            instance_id=instance.id,
            child_id=runtime.child_id,
            context_id=context_id,
            kind=record.kind,
            state="rejected" if refusal else "submitted",
            status_text=refusal,
            updated_at=timestamp(),
            request={
                "prompt": prompt,
                "timeout_seconds": timeout,
                "schedule": schedule,
                "verifier": runtime.verifier,
            },
            artifacts=[],
        )
        self._store.insert_task(task)
        if refusal is None:
            binds_session = record.kind == "persistent-agent" and record.lineage.session_id is None
            identity = RuntimeIdentity(task_id=task_id, session_id=context_id if binds_session else None)
            self._fleet.record(
                runtime.child_id,
                lambda current: {"observed_state": "starting", **({"health": "unknown"} if current.kind == "daemon" else {})},
                identity,
            )
        return task
