"""A workload's exit always wakes its waiter (`substrate/procs.py`), however its waits were cut short.

The substrate watches each command's group leader through a pidfd registered with the event
loop. epoll forgets a descriptor once it is closed; asyncio's selector does not. So a pidfd
closed while still registered leaves a stale entry, and the next process whose pidfd gets the
same number is registered onto that entry and never reported: its task stays `working` with
its wrapper a zombie. That happened when a run's wait was cancelled (a stop) and the stop's own
wait then found the process already gone.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from substrate import procs
from tests.support.processes import process_dead

pytestmark = pytest.mark.timeout(60)


async def spawn(tmp_path: Path, name: str, command: str) -> procs.ShellProcess:
    return await procs.spawn_shell(command, cwd=tmp_path, stdout=tmp_path / f"{name}.out",
                                   stderr=tmp_path / f"{name}.err", env=os.environ)  # fmt: skip


def until_zombie(pid: int) -> None:
    """Block the loop until `pid` has exited: it is gone before any waiter has had a turn."""
    while not process_dead(pid):  # our unreaped child: a zombie
        time.sleep(0.005)


def open_pidfds() -> int:
    """How many pidfds this process holds open."""
    fds = Path("/proc/self/fd")
    return sum(1 for fd in fds.iterdir() if _link(fd) == "anon_inode:[pidfd]")


def _link(fd: Path) -> str:
    try:
        return os.readlink(fd)
    except OSError:  # the directory's own descriptor, closed once listed
        return ""


async def test_a_cancelled_wait_then_a_wait_after_exit_leaves_the_next_process_watched(tmp_path: Path) -> None:
    stopped = await spawn(tmp_path, "stopped", "sleep 30")
    first_wait = asyncio.create_task(stopped.wait())
    await asyncio.sleep(0.05)  # the first wait is parked on the pidfd
    first_wait.cancel()  # as a run is when its task is stopped
    with pytest.raises(asyncio.CancelledError):
        await first_wait
    procs.signal_group(stopped.pid, 9)
    until_zombie(stopped.pid)  # gone before the stop's own wait looks
    assert await stopped.wait() == -9  # awaited in place: no loop turn before it looks

    for round_ in range(5):  # each new pidfd likely takes the number the last one freed
        quick = await spawn(tmp_path, f"quick-{round_}", "sleep 0.05")
        assert await asyncio.wait_for(quick.wait(), 5) == 0, "a finished process was never reported"


async def test_two_waiters_on_one_process_both_return_its_status(tmp_path: Path) -> None:
    process = await spawn(tmp_path, "shared", "sleep 0.2; exit 3")
    waits = [asyncio.create_task(process.wait()) for _ in range(2)]
    assert await asyncio.wait_for(asyncio.gather(*waits), 5) == [3, 3]


async def test_a_waiter_wakes_when_another_reaps_the_process_first(tmp_path: Path) -> None:
    process = await spawn(tmp_path, "reaped", "sleep 30")
    parked = asyncio.create_task(process.wait())
    await asyncio.sleep(0.05)
    procs.signal_group(process.pid, 9)
    until_zombie(process.pid)
    assert process.returncode == -9  # reaped here, before the parked waiter's loop turn
    assert await process.wait() == -9  # awaited in place: no loop turn before it looks
    assert await asyncio.wait_for(parked, 5) == -9


async def test_stop_group_closes_the_pidfd_of_a_process_that_ended_under_a_cancelled_wait(tmp_path: Path) -> None:
    process = await spawn(tmp_path, "leak", "sleep 30")
    wait = asyncio.create_task(process.wait())
    await asyncio.sleep(0.05)
    wait.cancel()
    with pytest.raises(asyncio.CancelledError):
        await wait
    procs.signal_group(process.pid, 9)
    until_zombie(process.pid)
    assert process.returncode == -9
    open_before = open_pidfds()
    assert await procs.stop_group(process, 1.0) == -9
    assert open_pidfds() == open_before - 1, "the stopped process's pidfd stayed open"
