"""Runs dispatched tasks as local processes and keeps their A2A task state and artifacts.

As on the real server, the runtime writes only its tasks, never a workload record: the fleet
plane projects a bound task into its record on every read (`substrate.projection`). Per kind
(the prompt is always `/bin/sh -c PROMPT`), the task goes `submitted`, then `working` once its
process runs, then:
- one-shot-command and scheduled-collector: `completed` (exit 0) or `failed` (non-zero exit, or
  the time budget exceeded: the process group is killed). A collector's task is one collection
  run, started at dispatch, as a real executor runs what it is sent; its record then rests
  `scheduled`. A message for no workload record (no `child_id`) runs the same way: the real
  executor runs whatever it is sent, and that is how the conductor runs a child's verifier;
- daemon: no time budget, `working` until cancelled; an exit is `completed` (status 0) or
  `failed`, which the record shows as needing review or failed;
- persistent-agent: `working` while alive; on exit `completed` / `failed` by exit status.
A failure has `fail_kind` "application" (the command's own doing) or "infrastructure" (it could
not start); the status says why (`summary`, `error`, `exit_code`), as the real
`agent_message_dispatch.rs` observer writes it.

Working directory: tasks whose messages name the same A2A context (`contextId`) on one instance
share one, `<data>/contexts/<digest>/work`, as tasks sent to one real agent share its machine;
a task without a context works in `<data>/tasks/<task>/work`. So a verifier sent in a child's
context sees the files the child's command left.

Output: stdout and stderr become task artifacts of the real executor's shape, one
`output_chunk` per stream with text (`{kind, stream, data, command_id, seq, task_id}`, at most
`artifact_text_limit` bytes of text each, `truncated` when cut), served by
`GET /agents/{id}/v1/tasks/{tid}/artifacts`.

Stopping: cancel kills the process group and records `canceled`. Shutdown kills every group, or
leaves them running when `keep_processes_on_stop` is set, and records nothing; processes also
outlive a crash. On the next start `recover()` re-adopts the tasks whose processes still run and
ends the others by their recorded exit status, or as `unknown` (fail closed) when there is none
(`substrate/adoption.py`). Children never inherit the substrate's bearer tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import shlex
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from substrate.auth import TOKEN_ENV_VARS
from substrate import procs, questions
from substrate.adoption import Readoption, exit_file
from substrate.errors import SubstrateError
from substrate.jobs import Job, RunOutcome
from substrate.fleet import FleetService
from substrate.store import Store, TaskRow
from substrate.wire import TERMINAL_TASK_STATES

log = logging.getLogger(__name__)


def _utc_now() -> datetime:
    return datetime.now(UTC)


def timestamp() -> str:
    return _utc_now().isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class RunnerSettings:
    data_dir: Path
    kill_grace_seconds: float = 2.0
    artifact_text_limit: int = 256 * 1024
    #: A clean stop leaves the processes running for the next start to re-adopt (`adoption.py`).
    keep_processes_on_stop: bool = False
    #: Values that must never reach a child's environment (the bearer tokens).
    secrets: tuple[str, ...] = field(default=(), repr=False)


def command_id(task: TaskRow) -> str:
    """The one command a task runs (the real executor names each dispatched command)."""
    return f"cmd-{task.task_id.removeprefix('task-')}"


def _not_cancelable(task_id: str, state: str) -> SubstrateError:
    return SubstrateError(409, "task.not_cancelable", f"Task '{task_id}' is in terminal state '{state}'",
                          title="Task not cancelable")  # fmt: skip


class Runner(Readoption):
    def __init__(self, store: Store, fleet: FleetService, settings: RunnerSettings) -> None:
        self._store = store
        self._fleet = fleet
        self._settings = settings
        self._jobs: dict[str, Job] = {}
        self._closing = False
        self._detaching = False
        self._live_processes: set[procs.ShellProcess] = set()
        self._asking: asyncio.Task[None] | None = None  # watches the running tasks' question files

    # -- task state --------------------------------------------------------------------

    def _set(
        self,
        task: TaskRow,
        state: str,
        *,
        fail_kind: str | None = None,
        summary: str | None = None,
        error: str | None = None,
        exit_code: int | None = None,
        artifacts: list[dict[str, Any]] | None = None,
        message: dict[str, Any] | None = None,
    ) -> None:
        """The task's new A2A state and status fields (and its artifacts, when given)."""
        now = timestamp()
        extra: dict[str, Any] = {"task_id": task.task_id}
        if message is not None:
            extra["message"] = message
        if summary is not None:
            extra["summary"] = summary
        if error is not None:
            extra["error"] = error
        if exit_code is not None:
            extra["exit_code"] = exit_code
        updates: dict[str, Any] = {
            "state": state,
            "status_text": error or summary,
            "updated_at": now,
            "fail_kind": fail_kind,
            "terminal_at": now if state in TERMINAL_TASK_STATES else None,
            "status_extra": extra,
        }
        if artifacts is not None:
            updates["artifacts"] = artifacts
        self._store.update_task(task.task_id, **updates)

    def _artifacts(self, task: TaskRow, outputs: list[tuple[str, Path]]) -> list[dict[str, Any]]:
        """Artifact rows for the (stream, file) pairs with any text, after the task's earlier ones."""
        rows = list(self._store.get_task(task.task_id).artifacts)  # type: ignore[union-attr]
        limit = self._settings.artifact_text_limit
        for stream, path in outputs:
            if not path.exists():
                continue
            with open(path, "rb") as handle:
                data = handle.read(limit + 1)
            if not data:
                continue  # as the real observer, which skips empty chunks
            seq = len(rows) + 1
            artifact: dict[str, Any] = {
                "kind": "output_chunk",
                "stream": stream,
                "data": data[:limit].decode("utf-8", errors="replace"),
                "command_id": command_id(task),
                "seq": seq,
                "task_id": task.task_id,
            }
            if len(data) > limit:
                artifact["truncated"] = True
            rows.append({"artifact_id": f"{task.task_id}-{stream}-{seq:04d}", "created_at": timestamp(),
                         "artifact": artifact})  # fmt: skip
        return rows

    # -- processes ---------------------------------------------------------------------

    def _task_dir(self, task: TaskRow) -> Path:
        return self._settings.data_dir / "tasks" / task.task_id

    def _work_dir(self, task: TaskRow) -> Path:
        """Shared by the tasks of one context on one instance; the task's own otherwise."""
        if not task.context_id:
            return self._task_dir(task) / "work"
        digest = hashlib.sha256(f"{task.instance_id}\0{task.context_id}".encode()).hexdigest()[:32]
        return self._settings.data_dir / "contexts" / digest / "work"

    def _question_dir(self, task: TaskRow) -> Path:
        return self._task_dir(task) / "questions"

    def _environment(self, task: TaskRow) -> dict[str, str]:
        secrets = set(self._settings.secrets)
        env = {k: v for k, v in os.environ.items() if k not in TOKEN_ENV_VARS and v not in secrets}
        env["CONDUCTOR_CHILD_ID"] = task.child_id
        env["CONDUCTOR_TASK_ID"] = task.task_id
        directory = self._question_dir(task)
        directory.mkdir(parents=True, exist_ok=True)
        env[questions.QUESTION_DIR_ENV] = str(directory)
        env[questions.ASK_ENV] = f"{shlex.quote(sys.executable)} -m substrate.ask"
        return env

    # -- questions (substrate.questions) -----------------------------------------------

    QUESTION_POLL_SECONDS = 0.1

    def _watch_questions(self) -> None:
        if self._asking is None or self._asking.done():
            self._asking = asyncio.get_running_loop().create_task(self._questions(), name="questions")

    async def _questions(self) -> None:
        """Every running task's question file, looked at every QUESTION_POLL_SECONDS: one that asks
        puts its task `input-required` with the prompt envelope."""
        while not self._closing:
            for job in list(self._jobs.values()):
                try:
                    self._notice_question(job.task.task_id)
                except Exception:
                    log.exception("cannot read the question of task %s", job.task.task_id)
            await asyncio.sleep(self.QUESTION_POLL_SECONDS)

    def _notice_question(self, task_id: str) -> None:
        task = self._store.get_task(task_id)
        if task is None or task.state != "working":
            return
        envelope = questions.take_question(self._question_dir(task))
        if envelope is None:
            return
        # Without the extension activated on dispatch, the envelope must not be sent (spec.md,
        # "Activation"): the task still waits, with the question as plain text.
        metadata = {questions.HITL_PROMPT_EXTENSION: envelope} if task.request.get("hitl") else None
        message = {"role": "agent", "parts": [{"kind": "text", "text": envelope["prompt"]}], **({"metadata": metadata} if metadata else {})}
        self._set(task, "input-required", message=message)

    def answer(self, task: TaskRow, message: dict[str, Any], response: dict[str, Any]) -> None:
        """The answer is taken: to the process, and the task works on (send_message.rs)."""
        questions.deliver(self._question_dir(task), response)
        self._set(task, "working", message=message)

    async def _run(
        self,
        job: Job,
        command: str,
        out_dir: Path,
        timeout: float | None,
    ) -> RunOutcome:
        task = job.task
        work = self._work_dir(task)
        work.mkdir(parents=True, exist_ok=True)
        out_dir.mkdir(parents=True, exist_ok=True)
        stdout, stderr = out_dir / "stdout.txt", out_dir / "stderr.txt"
        try:
            process = await procs.spawn_shell(
                command, cwd=work, stdout=stdout, stderr=stderr, env=self._environment(task),
                exit_file=exit_file(out_dir),
            )  # fmt: skip
        except OSError as error:
            return RunOutcome(None, False, stdout, stderr, spawn_error=f"cannot start /bin/sh: {error.strerror}")
        self._record_process(task, process, out_dir)
        try:
            self._set(task, "working")  # as the real observer reports once the command runs
            job.started.set()
            try:
                returncode = await asyncio.wait_for(process.wait(), timeout)
                return RunOutcome(returncode, False, stdout, stderr)
            except TimeoutError:
                await procs.stop_group(process, self._settings.kill_grace_seconds)
                return RunOutcome(process.returncode, True, stdout, stderr)
        finally:
            # Cancelled, timed out or finished: nothing of the group outlives this run.
            await asyncio.shield(procs.stop_group(process, self._settings.kill_grace_seconds))

    def _finish_run(self, job: Job, outcome: RunOutcome) -> None:
        """Record the end of the task's run."""
        task = job.task
        artifacts = self._artifacts(task, [("stdout", outcome.stdout), ("stderr", outcome.stderr)])
        command = command_id(task)
        if outcome.spawn_error:
            self._set(task, "failed", fail_kind="infrastructure", error=outcome.spawn_error, artifacts=artifacts)
            return
        if outcome.timed_out:
            self._set(task, "failed", fail_kind="application", artifacts=artifacts, exit_code=outcome.returncode,
                      error=f"command {command} killed after the {task.request['timeout_seconds']} s time budget")  # fmt: skip
            return
        assert outcome.returncode is not None
        if outcome.returncode != 0:
            self._set(task, "failed", fail_kind="application", exit_code=outcome.returncode, artifacts=artifacts,
                      summary=f"command {command} exited {outcome.returncode}")  # fmt: skip
            return
        self._set(task, "completed", exit_code=0, artifacts=artifacts, summary=f"command {command} exited 0")

    # -- per kind ----------------------------------------------------------------------

    async def _one_shot(self, job: Job) -> None:
        request = job.task.request
        self._finish_run(job, await self._run(job, request["prompt"], self._task_dir(job.task), request["timeout_seconds"]))

    async def _long_lived(self, job: Job) -> None:
        """A daemon or persistent agent: no time budget, runs until it exits or is cancelled."""
        self._finish_run(job, await self._run(job, job.task.request["prompt"], self._task_dir(job.task), None))

    _KINDS = {
        "one-shot-command": _one_shot,
        "daemon": _long_lived,
        "persistent-agent": _long_lived,
        "scheduled-collector": _one_shot,
    }

    async def _supervise(self, job: Job) -> None:
        try:
            await self._KINDS[job.task.kind](self, job)
        except asyncio.CancelledError:
            raise  # cancel() or shutdown() records (or deliberately does not record) the end
        except Exception as error:  # a bug or a broken data dir: fail closed, never succeed
            log.exception("task %s failed inside the substrate", job.task.task_id)
            try:
                self._set(job.task, "failed", fail_kind="infrastructure", error=f"substrate error: {error}")
            except Exception:
                log.exception("cannot record the failure of task %s", job.task.task_id)
        finally:
            job.started.set()
            self._jobs.pop(job.task.task_id, None)

    # -- public ------------------------------------------------------------------------

    async def start(self, task: TaskRow) -> None:
        """Start a submitted task; returns once its process runs (or it is scheduled, or failed)."""
        if self._closing:
            raise SubstrateError(503, "executor.shutting_down", "the substrate is shutting down; retry later")
        job = Job(task)
        self._jobs[task.task_id] = job
        job.supervisor = asyncio.create_task(self._supervise(job), name=f"task-{task.task_id}")
        self._watch_questions()
        await job.started.wait()

    async def cancel(self, task_id: str) -> None:
        """Kill the task's process group and record `canceled`.

        A task that already ended (cancelled too) is 409 `task.not_cancelable`, as the real
        executor's `cancel_task` answers."""
        task = self._store.get_task(task_id)
        if task is None:
            raise SubstrateError(404, "task.not_found", f"Task '{task_id}' not found", title="Task not found")
        if task.state in TERMINAL_TASK_STATES:
            raise _not_cancelable(task_id, task.state)
        job = self._jobs.get(task_id)
        if job is not None and job.supervisor is not None:
            job.stop_reason = "cancel"
            job.supervisor.cancel()
            await asyncio.wait({job.supervisor})
            task = self._store.get_task(task_id)
            assert task is not None
            if task.state in TERMINAL_TASK_STATES:  # it ended on its own just before
                raise _not_cancelable(task_id, task.state)
        self._set(task, "canceled", summary="cancelled on request")

    def recover(self) -> int:
        """At startup: re-adopt the tasks whose processes still run, end the others (`adoption.py`).

        Returns how many were not re-adopted (ended by their exit status, or `unknown`)."""
        ended = self.readopt()
        if self._jobs:
            self._watch_questions()
        return ended

    async def shutdown(self) -> None:
        """Kill every process group, or leave them running (`keep_processes_on_stop`); record nothing.

        The next start re-adopts what still runs and ends the rest (`recover`)."""
        self._closing = True
        if self._asking is not None:
            self._asking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._asking
        self._detach_if_kept()
        jobs = list(self._jobs.values())
        for job in jobs:
            job.stop_reason = "shutdown"
            if job.supervisor is not None:
                job.supervisor.cancel()
        supervisors = [job.supervisor for job in jobs if job.supervisor is not None]
        if supervisors:
            await asyncio.wait(supervisors)

