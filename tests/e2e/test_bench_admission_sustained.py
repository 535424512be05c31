"""bench/admission_sustained.py --quick: every design holds its leases and the table is complete.

It checks what the benchmark's output must always show, never how fast anything was: every
step of every design measured, no lease lost, renewals decided inside the window (so lag
figures exist), probes decided, the requester designs answering no renewal, and every lease of a
killed holder ending before the run does.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def results(output: str) -> list[dict[str, str]]:
    rows = []
    for line in output.splitlines():
        if line.startswith("RESULT "):
            rows.append(dict(field.split("=", 1) for field in line.split()[1:]))
    return rows


def test_quick_run_prints_every_step_of_every_design_and_loses_no_lease():
    run = subprocess.run(
        [sys.executable, "-m", "bench.admission_sustained", "--quick"], cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    rows = results(run.stdout)
    assert [(row["design"], row["held"]) for row in rows] == [
        ("per-lease", "0"), ("per-lease", "100"), ("requester", "0"), ("requester", "100"),
        ("swept", "0"), ("swept", "100"),
    ], run.stdout
    for row in rows:
        assert row["measured"] == "1" and row["lost"] == "0" and row["verdict"] == "ok", row
        assert int(row["probes"]) > 0 and row["new_p99"] != "none", row
    for row in rows:
        if row["held"] == "100":
            assert int(row["renewals"]) > 0, row
            assert float(row["lag_p50"]) <= float(row["lag_p99"]), row
            assert int(row["renew_signals"]) > 0, row
            # Two holders were terminated at the step's start; all their leases ended in the run.
            assert row["dead_max"] not in ("none", "inf"), row
    per_lease, requester, swept = (
        next(r for r in rows if r["design"] == d and r["held"] == "100") for d in ("per-lease", "requester", "swept")
    )
    # Per-lease: a decision goes back for every renewal; requester renewals: only the probes hear
    # back, and each killed holder about once more (the decision about its expired lease, whose
    # failed delivery tells the singleton it is gone), with two to spare.
    assert int(per_lease["signals_out"]) >= int(per_lease["renew_signals"]) // 2, per_lease
    killed = 2
    for row in (requester, swept):
        assert int(row["signals_out"]) <= int(row["probes"]) + killed + 2, row
    assert "breaks at" in run.stdout or "did not break" in run.stdout
