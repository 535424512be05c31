"""What the runner and re-adoption share about a task's process: its job and how its run ended.

A module of its own so that `runner` (which starts processes) and `adoption` (which takes over the
ones an earlier substrate left running) both build on it without importing each other."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from substrate.store import TaskRow


@dataclass(frozen=True)
class RunOutcome:
    returncode: int | None  # None: could not start
    timed_out: bool
    stdout: Path
    stderr: Path
    spawn_error: str | None = None


@dataclass
class Job:
    """One task's process under supervision."""

    task: TaskRow
    started: asyncio.Event = field(default_factory=asyncio.Event)
    supervisor: asyncio.Task[None] | None = None
    stop_reason: str | None = None  # "cancel" | "shutdown"
