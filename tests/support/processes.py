"""Waiting in real time, and the processes tests start and must see gone: one module, so every
test polls and reads /proc the same way (free ports come from `worker.ports.free_port`)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TypeVar

from substrate.procs import alive, stat_fields

T = TypeVar("T")


async def eventually(check: Callable[[], Awaitable[T]], what: str, within: float = 30.0, interval: float = 0.05) -> T:
    """Poll `check()` until it returns something truthy and return that; fail naming `what`."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        value = await check()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last value {value!r}")
        await asyncio.sleep(interval)


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0, what: str = "the condition") -> None:
    """`eventually` for a plain predicate."""

    async def check() -> bool:
        return predicate()

    await eventually(check, what, within=timeout, interval=0.02)


async def read_pid(path: Path, timeout: float = 5.0) -> int:
    """The pid a process wrote to `path`, once it has."""
    await wait_until(lambda: path.exists() and path.read_text().strip().isdigit(), timeout, f"a pid in {path}")
    return int(path.read_text().strip())


def process_alive(pid: object) -> bool:
    """`pid` (as read from JSON: maybe not an int) names a process that exists, zombie or not."""
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def process_gone(pid: int) -> bool:
    """No such process at all: exited and reaped (a zombie still counts as present)."""
    return not Path(f"/proc/{pid}").exists()


def process_dead(pid: int) -> bool:
    """Not running: gone, or a zombie waiting for a parent that is not ours (after a crash)."""
    fields = stat_fields(pid)
    return fields is None or fields[0] == "Z"


def all_processes() -> dict[int, list[str]]:
    """Every process's /proc stat fields (from the state on), by pid."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := stat_fields(int(entry.name))) is not None:
            found[int(entry.name)] = fields
    return found


def descendants(*roots: int) -> set[int]:
    """`roots` and every live process below them."""
    processes = all_processes()
    children: dict[int, list[int]] = {}
    for pid, fields in processes.items():
        children.setdefault(int(fields[1]), []).append(pid)
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found and alive(pid):
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found


def session_members(*session_ids: int) -> set[int]:
    """Live processes in the given sessions."""
    return {pid for pid, fields in all_processes().items() if int(fields[3]) in session_ids and fields[0] != "Z"}


async def until_gone(pids: Iterable[int], within: float = 10.0) -> set[int]:
    """Wait for `pids` to exit; the ones still alive after `within`."""
    deadline = asyncio.get_running_loop().time() + within
    remaining = {pid for pid in pids if alive(pid)}
    while remaining and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.1)
        remaining = {pid for pid in remaining if alive(pid)}
    return remaining


def ensure_stopped(process: subprocess.Popen, tree: Iterable[int] = ()) -> None:
    """After a failed assertion: stop the command gracefully, then kill whatever of its tree is left."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    for pid in tree:
        if pid != process.pid and alive(pid):
            os.kill(pid, signal.SIGKILL)
