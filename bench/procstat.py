"""What the benchmarks read from /proc (Linux): CPU time, children, command lines, the dev server.

The benchmarks put their figures as ratios of CPU seconds spent by the processes a run uses
(the worker, the Temporal dev server, the substrate). `/proc/<pid>/stat` is parsed once, by
`substrate.procs.stat_fields`; these helpers say what the fields mean.
"""

from __future__ import annotations

import os
from pathlib import Path

from substrate.procs import stat_fields

# Indexes into `stat_fields` (field N of proc(5) is at N - 3).
_PPID, _UTIME, _STIME, _CUTIME, _CSTIME = 1, 11, 12, 13, 14


def cpu_seconds(pid: int | None, *, reaped: bool = False) -> float | None:
    """User + system CPU seconds of `pid`, None if it is gone. `reaped`: with the children it
    has waited for (the substrate's commands count as its own)."""
    fields = None if pid is None else stat_fields(pid)
    if fields is None:
        return None
    ticks = int(fields[_UTIME]) + int(fields[_STIME])
    if reaped:
        ticks += int(fields[_CUTIME]) + int(fields[_CSTIME])
    return ticks / os.sysconf("SC_CLK_TCK")


def children(parent: int) -> list[int]:
    """The live processes whose parent is `parent`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := stat_fields(int(entry.name))) is not None and int(fields[_PPID]) == parent:
            found.append(int(entry.name))
    return found


def cmdline(pid: int) -> str:
    """The command line of `pid`, its arguments joined by spaces; "" if it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def dev_server_pid() -> int | None:
    """The Temporal dev server this process started (the SDK spawns `temporal server start-dev`)."""
    servers = [pid for pid in children(os.getpid()) if "start-dev" in cmdline(pid)]
    return servers[0] if servers else None
