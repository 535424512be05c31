"""The chaos suite's short form: bench/chaos.py --quick, one scenario per test, as separate processes.

Each test runs one scenario of bench/chaos.py in a subprocess (its own Temporal dev server on a
SQLite file, substrate, two `conductor worker` processes, the proxies where the scenario has them,
all on loopback) and passes when the suite found no violated invariant: every mission settled with
the verdict its scenario expects, no command ran twice, no lease is left held, no workload process
outlived its mission, nothing hangs. substrate-kill runs only in the full form (`.venv/bin/python
bench/chaos.py`), which also runs every scenario with more missions and more faults.

Deselect with `-m "not chaos"`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SEED = "20260101"  # a fixed schedule of faults; the timing of the processes still varies

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(75)]


def _ours(scratch: Path) -> dict[int, str]:
    """Live processes whose command line names the scratch directory (servers, workers, workloads)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if str(scratch) in line and state != "Z":
            found[int(entry.name)] = line
    return found


@pytest.mark.parametrize("scenario", ["worker-kill", "temporal-kill", "fault-proxy", "lease-expiry", "holder-chaos"])
def test_chaos_scenario_keeps_every_invariant(scenario: str, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "bench.chaos", "--quick", "--scenario", scenario, "--seed", SEED, "--scratch", str(tmp_path)]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = process.communicate(timeout=65)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)  # the suite kills everything it started on the way out
        output, _ = process.communicate(timeout=20)
        pytest.fail(f"bench/chaos.py --scenario {scenario} did not finish within 65 s:\n{output[-6000:]}")
    finally:
        if process.poll() is None:
            process.kill()
        left = _ours(tmp_path)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    assert process.returncode == 0, f"bench/chaos.py found violations (exit {process.returncode}):\n{output[-6000:]}"
    assert f"RESULT scenario={scenario} ok" in output, output[-6000:]
    assert not left, f"processes outlived bench/chaos.py: {left}"
