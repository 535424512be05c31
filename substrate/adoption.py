"""The runner's half that outlives a restart: processes recorded at spawn, re-adopted at start.

The real server keeps a task `working` across a management-server restart, so reconciliation
then says `re-adopted` (`management/src/http/fleet.rs`, `reconcile`). The substrate does the
same with local processes (`substrate/procs.py`: own session, exit-status wrapper):

- at every spawn the task row gets the leader's pid and start time, and the task directory a
  `process.json` saying where the run writes its output;
- when the substrate stops cleanly and is configured to keep its workloads
  (`RunnerSettings.keep_processes_on_stop`), nothing is killed; after a crash nothing could be;
- at the next start (`readopt`), each task still `working`:
  - whose leader runs with the recorded start time is re-adopted: it stays `working` and is
    watched until it exits (within what is left of its time budget), then ends as it would have
    (its output becomes artifacts, its exit status decides);
  - whose process ended meanwhile is ended by the exit status its wrapper wrote;
  - with no process and no status (killed with its wrapper, never started, a recycled pid) is
    `unknown`: fail closed, never guessed. Stragglers of its group are killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from substrate import procs

from substrate.jobs import Job, RunOutcome
from substrate.store import TaskRow

log = logging.getLogger(__name__)

PROCESS_FILE = "process.json"
_TIMED_KINDS = ("one-shot-command", "scheduled-collector")  # the kinds with a time budget


@dataclass(frozen=True)
class Spawned:
    """What the task directory says about the process the task ran last."""

    pid: int
    start_ticks: int | None
    out_dir: Path

    @property
    def stdout(self) -> Path:
        return self.out_dir / "stdout.txt"

    @property
    def stderr(self) -> Path:
        return self.out_dir / "stderr.txt"

    @property
    def exit_file(self) -> Path:
        return exit_file(self.out_dir)


def exit_file(out_dir: Path) -> Path:
    return out_dir / "exit-status"


def _read_spawned(task_dir: Path) -> Spawned | None:
    try:
        data = json.loads((task_dir / PROCESS_FILE).read_text())
        return Spawned(int(data["pid"]), data["start_ticks"], Path(data["out_dir"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


class Readoption:
    """Mixed into `Runner`; uses its store, settings, jobs and task-ending methods."""

    _store: Any
    _settings: Any
    _jobs: dict[str, Any]
    _closing: bool
    _detaching: bool
    _live_processes: set[procs.ShellProcess]

    # -- at spawn ----------------------------------------------------------------------

    def _record_process(self, task: TaskRow, process: procs.ShellProcess, out_dir: Path) -> None:
        ticks = procs.start_ticks(process.pid)
        self._store.update_task(task.task_id, pid=process.pid, pid_start_ticks=ticks)
        record = {"pid": process.pid, "start_ticks": ticks, "out_dir": str(out_dir)}
        path = self._task_dir(task) / PROCESS_FILE  # type: ignore[attr-defined]
        partial = path.with_suffix(".part")
        partial.write_text(json.dumps(record))
        os.replace(partial, path)
        self._spawned().add(process)

    def _spawned(self) -> set[procs.ShellProcess]:
        spawned = self._live_processes
        spawned.difference_update({p for p in spawned if p.returncode is not None})
        return spawned

    # -- at stop -----------------------------------------------------------------------

    @property
    def closing(self) -> bool:
        """Shutting down (the readiness route says not ready)."""
        return self._closing

    @property
    def detaching(self) -> bool:
        return self._detaching

    def _detach_if_kept(self) -> None:
        """Before shutdown cancels the supervisors: leave the processes running if so configured."""
        if not self._settings.keep_processes_on_stop:
            return
        self._detaching = True
        for process in self._spawned():
            process.detached = True
        if self._jobs:
            log.warning("substrate: stopping; %d task(s) keep running and are re-adopted at the next start",
                        len(self._jobs))  # fmt: skip

    # -- at start ----------------------------------------------------------------------

    def readopt(self) -> int:
        """Re-adopt or end every task a previous run left active; returns how many were not re-adopted."""
        adopted = ended = 0
        for task in self._store.active_tasks():
            try:
                if self._readopt_one(task):
                    adopted += 1
                else:
                    ended += 1
            except Exception:
                log.exception("cannot recover task %s", task.task_id)
        if adopted:
            log.warning("substrate: %d running task(s) from a previous run re-adopted", adopted)
        return ended

    def _readopt_one(self, task: TaskRow) -> bool:
        spawned = _read_spawned(self._task_dir(task))  # type: ignore[attr-defined]
        if spawned is not None and (spawned.pid != task.pid or spawned.start_ticks != task.pid_start_ticks):
            spawned = None  # the row and the file disagree: trust neither
        running = spawned is not None and procs.is_running(spawned.pid, spawned.start_ticks)
        status = None if spawned is None or running else procs.read_exit_status(spawned.exit_file)
        if spawned is not None and not running:
            procs.kill_orphaned_group(spawned.pid, spawned.start_ticks)
        if spawned is None or (not running and status is None):
            if task.pid is not None and spawned is None:
                procs.kill_orphaned_group(task.pid, task.pid_start_ticks)
            self._set(  # type: ignore[attr-defined]
                task, "unknown", fail_kind="infrastructure",
                error="the substrate restarted while this task ran; its process is gone and left no exit "
                "status, so its outcome is unknown",
            )  # fmt: skip
            return False
        job = Job(task)
        job.started.set()
        self._jobs[task.task_id] = job
        job.supervisor = asyncio.get_running_loop().create_task(
            self._supervise_adopted(job, spawned), name=f"task-{task.task_id}-adopted"
        )
        return running

    async def _supervise_adopted(self, job: Job, spawned: Spawned) -> None:
        task = job.task
        try:
            outcome = await self._await_adopted(job, spawned)
            if outcome is None:
                self._set(task, "unknown", fail_kind="infrastructure",  # type: ignore[attr-defined]
                          error="the re-adopted process ended without an exit status; its outcome is unknown")  # fmt: skip
                return
            self._finish_run(job, outcome)  # type: ignore[attr-defined]
        except asyncio.CancelledError:
            if not self.detaching:
                await asyncio.shield(
                    procs.stop_foreign_group(spawned.pid, spawned.start_ticks, self._settings.kill_grace_seconds)
                )
            raise
        except Exception as error:  # a bug or a broken data dir: fail closed, never succeed
            log.exception("re-adopted task %s failed inside the substrate", task.task_id)
            with contextlib.suppress(Exception):
                self._set(task, "failed", fail_kind="infrastructure", error=f"substrate error: {error}")  # type: ignore[attr-defined]
        finally:
            self._jobs.pop(task.task_id, None)

    async def _await_adopted(self, job: Job, spawned: Spawned) -> RunOutcome | None:
        """Wait for the adopted process within what is left of its budget; None: no exit status."""
        request = job.task.request
        remaining = None
        if job.task.kind in _TIMED_KINDS and spawned.start_ticks is not None:
            remaining = max(0.0, float(request["timeout_seconds"]) - procs.elapsed_seconds(spawned.start_ticks))
        try:
            await asyncio.wait_for(procs.wait_gone(spawned.pid, spawned.start_ticks), remaining)
        except TimeoutError:
            await procs.stop_foreign_group(spawned.pid, spawned.start_ticks, self._settings.kill_grace_seconds)
            return RunOutcome(None, True, spawned.stdout, spawned.stderr)
        procs.kill_orphaned_group(spawned.pid, spawned.start_ticks)  # stragglers, as after any run
        status = procs.read_exit_status(spawned.exit_file)
        return None if status is None else RunOutcome(status, False, spawned.stdout, spawned.stderr)
