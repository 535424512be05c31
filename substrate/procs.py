"""Process groups for workload commands: spawn, stop, watch, and find them again after a restart.

Every command runs as `/bin/sh -c PROMPT` in a new session, so it leads its own process group
(everything it forks can be signalled at once) and lives on when the substrate stops or
crashes: the real server keeps its tasks running across a management-server restart, and so
does the substrate. The task row keeps the group leader's pid and its start time
(`/proc/<pid>/stat` field 22, clock ticks since boot); at the next start a leader alive with the
recorded start time is the same process, re-adopted and watched until it exits
(`substrate/adoption.py`). A live pid with another start time is a recycled pid: not ours.

The substrate is not the parent of a re-adopted process, so the kernel will not hand it the
exit status. A small wrapper shell therefore runs the command and writes its exit status to a
file next to the output before it exits (`exit_file`); a process that ended while the substrate
was down is reported by that status, or as `unknown` when there is none (it was killed with its
wrapper).

Processes are `subprocess.Popen` children watched through a pidfd, not asyncio subprocesses:
asyncio kills a child whose transport is closed or collected with its loop, which would end
every workload with the substrate. Output goes to files, not pipes: a background grandchild
holding a pipe open would keep a reader waiting forever, a file never does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: Runs the command ($1) in a shell of its own and writes its exit status to $2 before exiting
#: with it. Killed together with its group (cancel, time budget), it writes nothing: that end is
#: recorded by the substrate itself.
_WRAPPER = '/bin/sh -c "$1"; status=$?; printf "%s\\n" "$status" > "$2"; exit "$status"'
WRAPPER_NAME = "conductor-task"
_POLL_SECONDS = 0.05


class ShellProcess:
    """A spawned group leader with the part of `asyncio.subprocess.Process` the runner uses."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen
        self.pid = popen.pid
        #: Set when the substrate stops but leaves the process running (`stop_group` spares it).
        self.detached = False
        self._pidfd: int | None = None
        with contextlib.suppress(OSError, AttributeError):
            self._pidfd = os.pidfd_open(popen.pid)
        #: While the pidfd is registered with a loop: that loop and the future its exit resolves.
        self._watch: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

    async def wait(self) -> int:
        """The exit status, once the leader has exited; any number of waiters may wait at once."""
        while (code := self._popen.poll()) is None:
            await self._until_exit()
        self.close()
        return code

    async def _until_exit(self) -> None:
        if self._pidfd is None:
            await asyncio.sleep(_POLL_SECONDS)
            return
        if self._watch is None:
            loop = asyncio.get_running_loop()
            try:
                loop.add_reader(self._pidfd, self._unwatch)  # a pidfd turns readable when its process exits
            except (NotImplementedError, ValueError, OSError):
                self.close()
                await asyncio.sleep(_POLL_SECONDS)
                return
            self._watch = (loop, loop.create_future())
        await asyncio.shield(self._watch[1])  # a cancelled waiter leaves the others waiting

    def _unwatch(self) -> None:
        """Unregister the pidfd and wake every waiter, who then look at the process again."""
        if self._watch is None:
            return
        loop, exited = self._watch
        self._watch = None
        loop.remove_reader(self._pidfd)
        if not exited.done():
            exited.set_result(None)

    def close(self) -> None:
        """Stop watching the process and close its pidfd.

        Unregistering comes first. epoll drops a descriptor once it is closed, but asyncio keeps
        its entry; the next pidfd to get that number would be registered onto the stale entry,
        never added to epoll, and its process's exit never reported."""
        self._unwatch()
        if self._pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self._pidfd)
            self._pidfd = None


async def spawn_shell(
    command: str,
    *,
    cwd: Path,
    stdout: Path,
    stderr: Path,
    env: Mapping[str, str],
    exit_file: Path | None = None,
) -> ShellProcess:
    """Start `command` under the exit-status wrapper as the leader of a new session."""
    exit_path = exit_file if exit_file is not None else stdout.with_name(stdout.name + ".exit-status")
    with contextlib.suppress(FileNotFoundError):
        exit_path.unlink()  # a file left by an earlier run must not speak for this one
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        popen = subprocess.Popen(
            ["/bin/sh", "-c", _WRAPPER, WRAPPER_NAME, command, str(exit_path)],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=dict(env),
            start_new_session=True,
            close_fds=True,
        )
    return ShellProcess(popen)


def read_exit_status(path: Path) -> int | None:
    """The status the wrapper wrote, or None if it wrote none (or the file is not its)."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to a process group; False when no process of the group is left."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # not ours (pid reuse by another user): leave it alone
        return False


async def stop_group(process: ShellProcess, grace_seconds: float) -> int | None:
    """`terminate_group`, then the pidfd closed. A detached process (the substrate is stopping and
    keeps its workloads) is left alone."""
    if process.detached:
        return process.returncode
    await terminate_group(process, grace_seconds)
    process.close()  # its run's wait may have been cancelled before it looked again
    return process.returncode


async def terminate_group(process: ShellProcess | asyncio.subprocess.Process, grace_seconds: float) -> None:
    """SIGTERM the group `process` leads, SIGKILL it after `grace_seconds`, reap the leader, sweep
    stragglers (a workload's shell here, a wrapped command in `conductor admission run`)."""
    pgid = process.pid
    if process.returncode is None:
        signal_group(pgid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), grace_seconds)
        except TimeoutError:
            signal_group(pgid, signal.SIGKILL)
            await process.wait()
    signal_group(pgid, signal.SIGKILL)


def stat_fields(pid: int) -> list[str] | None:
    """`/proc/<pid>/stat` from field 3 (the state) on, so field N is at index N - 3; None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    return stat[stat.rindex(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """The start time of `pid` in clock ticks since boot (Linux), or None if it is gone."""
    fields = stat_fields(pid)
    if fields is None or fields[0] == "Z":  # a zombie has finished; it only waits to be reaped
        return None
    return int(fields[19])


def alive(pid: int) -> bool:
    """`pid` exists and has not exited (a zombie has: it only waits to be reaped)."""
    return start_ticks(pid) is not None


def _group_members(pgid: int) -> list[int]:
    members = []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or (fields := stat_fields(int(entry.name))) is None:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def kill_orphaned_group(pgid: int, leader_start_ticks: int | None) -> bool:
    """Kill what is left of a group we started before a restart; True if anything was killed.

    The group is ours if its leader is still alive with the recorded start time, or if the
    leader is gone but members remain: while any member lives, the kernel does not hand the
    group id out again. A live leader with another start time is a recycled pid: not ours.
    """
    leader_ticks = start_ticks(pgid)
    if leader_ticks is not None and leader_ticks != leader_start_ticks:
        return False
    if leader_ticks is None and not _group_members(pgid):
        return False
    return signal_group(pgid, signal.SIGKILL)


def elapsed_seconds(ticks: int) -> float:
    """How long ago a process with start time `ticks` started (for the rest of its time budget)."""
    try:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))


def is_running(pid: int, ticks: int | None) -> bool:
    """The process `pid` that started at `ticks` still runs (not a zombie, not a recycled pid)."""
    return ticks is not None and start_ticks(pid) == ticks


async def wait_gone(pid: int, ticks: int | None) -> None:
    """Wait until a process we are not the parent of (a re-adopted one) has ended."""
    pidfd = None
    with contextlib.suppress(OSError, AttributeError):
        pidfd = os.pidfd_open(pid)
    try:
        if not is_running(pid, ticks):  # checked after opening: the pidfd names this very process
            return
        if pidfd is not None:
            loop = asyncio.get_running_loop()
            exited: asyncio.Future[None] = loop.create_future()
            try:
                loop.add_reader(pidfd, lambda: exited.done() or exited.set_result(None))
            except (NotImplementedError, ValueError, OSError):
                pass
            else:
                try:
                    while is_running(pid, ticks):
                        # The pidfd turns readable at exit; the timeout also catches a zombie.
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(asyncio.shield(exited), 1.0)
                    return
                finally:
                    loop.remove_reader(pidfd)
        while is_running(pid, ticks):
            await asyncio.sleep(_POLL_SECONDS * 4)
    finally:
        if pidfd is not None:
            os.close(pidfd)


async def stop_foreign_group(pgid: int, ticks: int | None, grace_seconds: float) -> None:
    """`stop_group` for a re-adopted group: SIGTERM, SIGKILL after the grace, sweep stragglers."""
    if is_running(pgid, ticks):
        signal_group(pgid, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wait_gone(pgid, ticks), grace_seconds)
    kill_orphaned_group(pgid, ticks)


def terminate(process: subprocess.Popen[Any], timeout: float) -> int:
    """SIGTERM a server process so it can shut down cleanly; SIGKILL it if it hangs. Returns its status."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode
