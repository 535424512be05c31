"""Process groups for workload commands: spawn, stop, and recognise our own orphans.

Every command runs as `/bin/sh -c PROMPT` in a new session (so it leads its own process
group and everything it forks can be signalled at once) with, on Linux, a parent-death
signal so that the shell dies even if the substrate is SIGKILLed. Grandchildren that
outlive such a crash are found again at the next start through the recorded process group
and the leader's start time (a recycled pid has a different start time), and killed: an
outcome nobody observed is recorded `unknown`, never guessed.

Output goes to files, not pipes: a background grandchild holding a pipe open would keep a
reader waiting forever, a file never does.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_PR_SET_PDEATHSIG = 1

try:  # resolved once at import: nothing may be looked up between fork and exec
    _libc = ctypes.CDLL(None, use_errno=True)
    _prctl = _libc.prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None


def _die_with_parent() -> None:
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


async def spawn_shell(
    command: str,
    *,
    cwd: Path,
    stdout: Path,
    stderr: Path,
    env: Mapping[str, str],
) -> asyncio.subprocess.Process:
    """Start `/bin/sh -c command` as the leader of a new session."""
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        return await asyncio.create_subprocess_exec(
            "/bin/sh",
            "-c",
            command,
            cwd=cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=dict(env),
            start_new_session=True,
            preexec_fn=_die_with_parent if _prctl is not None else None,
        )


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to a process group; False when no process of the group is left."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # not ours (pid reuse by another user): leave it alone
        return False


async def stop_group(process: asyncio.subprocess.Process, grace_seconds: float) -> int | None:
    """SIGTERM the group, SIGKILL it after `grace_seconds`, reap the leader, sweep stragglers."""
    pgid = process.pid
    if process.returncode is None:
        signal_group(pgid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), grace_seconds)
        except TimeoutError:
            signal_group(pgid, signal.SIGKILL)
            await process.wait()
    signal_group(pgid, signal.SIGKILL)
    return process.returncode


def start_ticks(pid: int) -> int | None:
    """The start time of `pid` in clock ticks since boot (Linux), or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # a zombie has finished; it only waits to be reaped
        return None
    return int(fields[19])


def _group_members(pgid: int) -> list[int]:
    members = []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
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
