"""Running the `conductor` CLI in tests: its exit code and what it printed, and an environment in
which only what the test sets decides where it connects (no profile of whoever runs the tests)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from worker.cli import run as run_cli


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def line(self) -> str:
        """The one line on stderr (asserted to be one, the CLI's own: `conductor: ` or, from a
        long-running command, `conductor worker: `; and no traceback)."""
        assert self.err.count("\n") == 1 and self.err.endswith("\n"), f"not one line on stderr: {self.err!r}"
        assert re.match(r"conductor( [a-z-]+)?: ", self.err) and "Traceback" not in self.err, self.err
        return self.err.removesuffix("\n")

    @property
    def json(self) -> Any:
        return json.loads(self.out)


def conductor_now(capsys: pytest.CaptureFixture[str], *argv: str) -> Result:
    """`conductor ARGV` in this thread (for commands that refuse before connecting)."""
    capsys.readouterr()
    code = run_cli(list(argv))
    captured = capsys.readouterr()
    return Result(code, captured.out, captured.err)


async def conductor(capsys: pytest.CaptureFixture[str], *argv: str) -> Result:
    """`conductor ARGV` in a thread (commands run their own event loop)."""
    capsys.readouterr()
    code = await asyncio.to_thread(run_cli, list(argv))
    captured = capsys.readouterr()
    return Result(code, captured.out, captured.err)


def without_profiles(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *also_unset: str) -> Path:
    """An empty Temporal profile file and no TEMPORAL_PROFILE/API key/TLS (nor `also_unset`) from
    the environment of whoever runs the tests; returns the profile file."""
    profile_file = tmp_path / "temporal.toml"
    profile_file.write_text("")
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(profile_file))
    for name in ("TEMPORAL_PROFILE", "TEMPORAL_API_KEY", "TEMPORAL_TLS", *also_unset):
        monkeypatch.delenv(name, raising=False)
    return profile_file


def conductor_command() -> list[str]:
    """`conductor` as a process of its own: the installed script, else this interpreter."""
    script = Path(sys.executable).parent / "conductor"
    return [str(script)] if script.exists() else [sys.executable, "-c", "from worker.cli import main; main()"]


def environment_for(address: str, **extra: str) -> dict[str, str]:
    """This process's environment pointed at the Temporal server at `address` (namespace default),
    without any TEMPORAL_* setting of whoever runs the tests."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("TEMPORAL_")}
    return {**env, "TEMPORAL_ADDRESS": address, "TEMPORAL_NAMESPACE": "default", **extra}


async def run_process(*command: str, env: dict[str, str], cwd: Path | None = None, timeout: float = 120) -> tuple[int, str, str]:
    """A process run beside the test's worker (on the same event loop, so never blocking it): its
    exit status, standard output and standard error."""
    process = await asyncio.create_subprocess_exec(
        *command, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    return await ended(process, timeout)


async def ended(process: asyncio.subprocess.Process, timeout: float = 60) -> tuple[int, str, str]:
    out, err = await asyncio.wait_for(process.communicate(), timeout)
    return process.returncode or 0, out.decode(), err.decode()
