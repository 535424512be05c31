"""Runs dispatched tasks as local processes and reports them into their workload records.

Per kind (the prompt is always `/bin/sh -c PROMPT`, cwd `<data>/tasks/<task>/work`):
- one-shot-command: `running`, then `succeeded` (exit 0, and the verifier passed if one was
  given), `failed` (non-zero exit or failed verifier) or `timed-out` (budget exceeded; the
  process group is killed);
- daemon: `starting` (health unknown), `healthy` (health healthy) once it has stayed up for
  the settle time, `failed` (health unhealthy) when it exits. No time budget: it runs until
  cancelled;
- persistent-agent: `running` while alive; on exit `succeeded`/`failed` by exit status;
- scheduled-collector: `scheduled` between runs; each cron tick runs the prompt under the
  time budget (`running`), then back to `scheduled` with that run's artifacts. A failed or
  timed-out run ends the collector (`failed`/`timed-out`): fail closed, no silent retries.

Every report is a new revision written through `FleetService.record` (the same CAS path as
any observer) together with the task's A2A state, in one transaction. stdout becomes the
`result` artifact and stderr the `log` artifact (files under the task directory, sha256 of
their content); a passing verifier adds a `verifier` artifact.

Stopping: cancel kills the process group and records `cancelled`. Shutdown kills every group, or
leaves them running when `keep_processes_on_stop` is set, and records nothing; processes also
outlive a crash. On the next start `recover()` re-adopts the tasks whose processes still run and
ends the others by their recorded exit status, or as `unknown` (fail closed) when there is none
(`substrate/adoption.py`). Children never inherit the substrate's bearer tokens.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from activities.a2a import TERMINAL_TASK_STATES, Artifact, TextPart, task_state_for
from substrate.auth import TOKEN_ENV_VARS
from activities.sandbox_api import RuntimeIdentity
from substrate import procs
from substrate.adoption import Readoption, exit_file
from substrate.cron import CronSchedule
from substrate.errors import SubstrateError
from substrate.fleet import FleetService
from substrate.store import Store, TaskRow
from workflows.contract import REVIEW_REQUIRED_STATES, TERMINAL_OBSERVED_STATES, WorkloadRecord

log = logging.getLogger(__name__)


def _utc_now() -> datetime:
    return datetime.now(UTC)


def timestamp() -> str:
    return _utc_now().isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class RunnerSettings:
    data_dir: Path
    kill_grace_seconds: float = 2.0
    daemon_settle_seconds: float = 0.5
    artifact_text_limit: int = 256 * 1024
    #: A clean stop leaves the processes running for the next start to re-adopt (`adoption.py`).
    keep_processes_on_stop: bool = False
    #: Values that must never reach a child's environment (the bearer tokens).
    secrets: tuple[str, ...] = field(default=(), repr=False)
    #: Wall clock for cron schedules only; tests shift it to reach a tick quickly.
    clock: Callable[[], datetime] = _utc_now


@dataclass(frozen=True)
class RunOutcome:
    returncode: int | None  # None: could not start
    timed_out: bool
    stdout: Path
    stderr: Path
    spawn_error: str | None = None


@dataclass
class _Job:
    task: TaskRow
    started: asyncio.Event = field(default_factory=asyncio.Event)
    supervisor: asyncio.Task[None] | None = None
    stop_reason: str | None = None  # "cancel" | "shutdown"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 16), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _exit_error_code(returncode: int) -> str:
    return f"process.signal_{-returncode}" if returncode < 0 else f"process.exit_status_{returncode}"


class Runner(Readoption):
    def __init__(self, store: Store, fleet: FleetService, settings: RunnerSettings) -> None:
        self._store = store
        self._fleet = fleet
        self._settings = settings
        self._jobs: dict[str, _Job] = {}
        self._closing = False

    # -- reporting ---------------------------------------------------------------------

    def _report(
        self,
        task: TaskRow,
        observed_state: str,
        *,
        health: str | None = None,
        exit_classification: str | None = None,
        error_code: str | None = None,
        artifacts: list[dict[str, str]] | None = None,
        a2a_artifacts: list[dict[str, Any]] | None = None,
        text: str | None = None,
        identity: RuntimeIdentity | None = None,
        task_state: str | None = None,
    ) -> None:
        """One new revision of the record and the matching task state, atomically."""

        def build(current: WorkloadRecord) -> dict[str, Any]:
            fields: dict[str, Any] = {
                "observed_state": observed_state,
                "artifacts": artifacts
                if artifacts is not None
                else [a.model_dump(mode="json") for a in current.status.artifacts],
            }
            if current.kind == "daemon":  # the contract requires health for daemons only
                fields["health"] = health or "unknown"
            if exit_classification is not None:
                fields["exit_classification"] = exit_classification
            if error_code is not None:
                fields["error_code"] = error_code
            return fields

        updates: dict[str, Any] = {
            "state": task_state or task_state_for(observed_state),
            "status_text": text,
            "updated_at": timestamp(),
        }
        if a2a_artifacts is not None:
            updates["artifacts"] = a2a_artifacts
        with self._store.transaction():
            self._fleet.record(task.child_id, build, identity)
            self._store.update_task(task.task_id, **updates)

    def _artifacts(self, outputs: list[tuple[str, Path]]) -> tuple[list[dict[str, str]], list[dict[str, Any]]]:
        """(fleet artifacts, A2A artifacts) for (kind, file) pairs that exist."""
        fleet: list[dict[str, str]] = []
        a2a: list[dict[str, Any]] = []
        limit = self._settings.artifact_text_limit
        for kind, path in outputs:
            if not path.exists():
                continue
            digest = _sha256(path)
            uri = path.resolve().as_uri()
            fleet.append({"kind": kind, "uri": uri, "sha256": digest})
            with open(path, "rb") as handle:
                data = handle.read(limit + 1)
            metadata: dict[str, Any] = {"kind": kind, "uri": uri, "sha256": digest}
            if len(data) > limit:
                metadata["truncated"] = True
            a2a.append(
                Artifact(
                    artifact_id=f"{kind}-{digest[:16]}",
                    name=kind,
                    parts=[TextPart(text=data[:limit].decode("utf-8", errors="replace"))],
                    metadata=metadata,
                ).wire()
            )
        return fleet, a2a

    # -- processes ---------------------------------------------------------------------

    def _task_dir(self, task: TaskRow) -> Path:
        return self._settings.data_dir / "tasks" / task.task_id

    def _environment(self, task: TaskRow) -> dict[str, str]:
        secrets = set(self._settings.secrets)
        env = {k: v for k, v in os.environ.items() if k not in TOKEN_ENV_VARS and v not in secrets}
        env["CONDUCTOR_CHILD_ID"] = task.child_id
        env["CONDUCTOR_TASK_ID"] = task.task_id
        return env

    async def _run(
        self,
        job: _Job,
        command: str,
        out_dir: Path,
        timeout: float | None,
        *,
        name: str = "",
        on_spawn: Callable[[procs.ShellProcess], None] | None = None,
    ) -> RunOutcome:
        task = job.task
        work = self._task_dir(task) / "work"
        work.mkdir(parents=True, exist_ok=True)
        out_dir.mkdir(parents=True, exist_ok=True)
        stdout, stderr = out_dir / f"{name}stdout.txt", out_dir / f"{name}stderr.txt"
        try:
            process = await procs.spawn_shell(
                command, cwd=work, stdout=stdout, stderr=stderr, env=self._environment(task),
                exit_file=exit_file(out_dir, name),
            )  # fmt: skip
        except OSError as error:
            return RunOutcome(None, False, stdout, stderr, spawn_error=f"cannot start /bin/sh: {error.strerror}")
        self._record_process(task, process, out_dir, name)
        try:
            if on_spawn is not None:
                on_spawn(process)
            try:
                returncode = await asyncio.wait_for(process.wait(), timeout)
                return RunOutcome(returncode, False, stdout, stderr)
            except TimeoutError:
                await procs.stop_group(process, self._settings.kill_grace_seconds)
                return RunOutcome(process.returncode, True, stdout, stderr)
        finally:
            # Cancelled, timed out or finished: nothing of the group outlives this run.
            await asyncio.shield(procs.stop_group(process, self._settings.kill_grace_seconds))

    async def _run_and_verify(
        self, job: _Job, run_dir: Path, *, running_state: str = "running"
    ) -> tuple[RunOutcome, RunOutcome | None]:
        request = job.task.request
        timeout = request["timeout_seconds"]

        def report_running(_: asyncio.subprocess.Process) -> None:
            self._report(job.task, running_state)
            job.started.set()

        outcome = await self._run(job, request["prompt"], run_dir, timeout, on_spawn=report_running)
        verification = None
        if outcome.returncode == 0 and not outcome.timed_out and request.get("verifier"):
            verification = await self._run(job, request["verifier"], run_dir, timeout, name="verifier-")
        return outcome, verification

    def _finish_run(self, job: _Job, outcome: RunOutcome, verification: RunOutcome | None, *, success_state: str) -> bool:
        """Report the end of one run; True if it succeeded."""
        outputs = [("result", outcome.stdout), ("log", outcome.stderr)]
        if verification is not None and verification.returncode == 0 and not verification.timed_out:
            outputs.append(("verifier", verification.stdout))
        artifacts, a2a = self._artifacts(outputs)
        if outcome.spawn_error:
            self._report(job.task, "failed", health="unhealthy", exit_classification="failure",
                         error_code="substrate.spawn_failed", artifacts=artifacts, a2a_artifacts=a2a,
                         text=outcome.spawn_error)  # fmt: skip
            return False
        if outcome.timed_out:
            self._report(job.task, "timed-out", health="unhealthy", exit_classification="timeout",
                         error_code="substrate.timeout", artifacts=artifacts, a2a_artifacts=a2a,
                         text=f"killed after the {job.task.request['timeout_seconds']} s time budget")  # fmt: skip
            return False
        assert outcome.returncode is not None
        if outcome.returncode != 0:
            self._report(job.task, "failed", health="unhealthy", exit_classification="failure",
                         error_code=_exit_error_code(outcome.returncode), artifacts=artifacts, a2a_artifacts=a2a,
                         text=f"the command exited with status {outcome.returncode}")  # fmt: skip
            return False
        if verification is not None and (verification.returncode != 0 or verification.timed_out):
            detail = "timed out" if verification.timed_out else f"exited with status {verification.returncode}"
            self._report(job.task, "failed", health="unhealthy", exit_classification="failure",
                         error_code="substrate.verifier_failed", artifacts=artifacts, a2a_artifacts=a2a,
                         text=f"the command succeeded but its verifier {detail}")  # fmt: skip
            return False
        self._report(job.task, success_state, exit_classification="success", artifacts=artifacts,
                     a2a_artifacts=a2a, text=None)  # fmt: skip
        return True

    # -- per kind ----------------------------------------------------------------------

    async def _one_shot(self, job: _Job) -> None:
        outcome, verification = await self._run_and_verify(job, self._task_dir(job.task))
        self._finish_run(job, outcome, verification, success_state="succeeded")

    async def _persistent_agent(self, job: _Job) -> None:
        def report_running(_: asyncio.subprocess.Process) -> None:
            self._report(job.task, "running")
            job.started.set()

        outcome = await self._run(job, job.task.request["prompt"], self._task_dir(job.task), None,
                                  on_spawn=report_running)  # fmt: skip
        self._finish_run(job, outcome, None, success_state="succeeded")

    async def _daemon(self, job: _Job) -> None:
        settle = self._settings.daemon_settle_seconds

        async def watch_settle(process: asyncio.subprocess.Process) -> None:
            try:
                await asyncio.wait_for(asyncio.shield(process.wait()), settle)
            except TimeoutError:
                self._report(job.task, "healthy", health="healthy")

        watchers: list[asyncio.Task[None]] = []

        def on_spawn(process: asyncio.subprocess.Process) -> None:
            watchers.append(asyncio.ensure_future(watch_settle(process)))
            job.started.set()

        try:
            outcome = await self._run(job, job.task.request["prompt"], self._task_dir(job.task), None,
                                      on_spawn=on_spawn)  # fmt: skip
        finally:
            for watcher in watchers:
                watcher.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
        artifacts, a2a = self._artifacts([("result", outcome.stdout), ("log", outcome.stderr)])
        if outcome.spawn_error:
            code, text = "substrate.spawn_failed", outcome.spawn_error
        else:
            code, text = "substrate.daemon_exited", f"the daemon exited with status {outcome.returncode}"
        self._report(job.task, "failed", health="unhealthy",
                     exit_classification="success" if outcome.returncode == 0 else "failure",
                     error_code=code, artifacts=artifacts, a2a_artifacts=a2a, text=text)  # fmt: skip

    async def _collector(self, job: _Job) -> None:
        schedule = CronSchedule.parse(job.task.request["schedule"])
        clock = self._settings.clock
        self._report(job.task, "scheduled")
        job.started.set()
        fired = clock()
        run = 0
        while True:
            fire_at = schedule.next_after(max(clock(), fired))
            while (delay := (fire_at - clock()).total_seconds()) > 0:
                await asyncio.sleep(min(delay, 60.0))
            fired, run = fire_at, run + 1
            outcome, verification = await self._run_and_verify(job, self._task_dir(job.task) / "runs" / str(run))
            if not self._finish_run(job, outcome, verification, success_state="scheduled"):
                return

    _KINDS = {
        "one-shot-command": _one_shot,
        "daemon": _daemon,
        "persistent-agent": _persistent_agent,
        "scheduled-collector": _collector,
    }

    async def _supervise(self, job: _Job) -> None:
        try:
            await self._KINDS[job.task.kind](self, job)
        except asyncio.CancelledError:
            raise  # cancel() or shutdown() records (or deliberately does not record) the end
        except Exception as error:  # a bug or a broken data dir: fail closed, never succeed
            log.exception("task %s failed inside the substrate", job.task.task_id)
            try:
                self._report(job.task, "failed", health="unhealthy", exit_classification="unknown",
                             error_code="substrate.internal_error", text=f"substrate error: {error}")  # fmt: skip
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
        job = _Job(task)
        self._jobs[task.task_id] = job
        job.supervisor = asyncio.create_task(self._supervise(job), name=f"task-{task.task_id}")
        await job.started.wait()

    async def cancel(self, task_id: str) -> None:
        """Kill the task's process group and record `cancelled`; idempotent for a cancelled task."""
        task = self._store.get_task(task_id)
        if task is None:
            raise SubstrateError(404, "executor.task_not_found", f"no task {task_id!r}")
        job = self._jobs.get(task_id)
        if job is not None and job.supervisor is not None and task.state not in TERMINAL_TASK_STATES:
            job.stop_reason = "cancel"
            job.supervisor.cancel()
            await asyncio.wait({job.supervisor})
            task = self._store.get_task(task_id)
            assert task is not None
        if task.state == "canceled":
            return
        if task.state in TERMINAL_TASK_STATES:
            raise SubstrateError(409, "executor.task_not_cancelable", f"task {task_id!r} already ended: {task.state}")
        self._report(task, "cancelled", health="unhealthy", exit_classification="cancelled",
                     error_code="substrate.cancelled", text="cancelled on request")  # fmt: skip

    def recover(self) -> int:
        """At startup: re-adopt the tasks whose processes still run, end the others (`adoption.py`).

        Returns how many were not re-adopted (ended by their exit status, or `unknown`)."""
        return self.readopt()

    async def shutdown(self) -> None:
        """Kill every process group, or leave them running (`keep_processes_on_stop`); record nothing.

        The next start re-adopts what still runs and ends the rest (`recover`)."""
        self._closing = True
        self._detach_if_kept()
        jobs = list(self._jobs.values())
        for job in jobs:
            job.stop_reason = "shutdown"
            if job.supervisor is not None:
                job.supervisor.cancel()
        supervisors = [job.supervisor for job in jobs if job.supervisor is not None]
        if supervisors:
            await asyncio.wait(supervisors)

    def active_jobs(self) -> Mapping[str, _Job]:
        return dict(self._jobs)
