"""Several worker processes opening the same new stores at once (two workers on one data dir)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

# Each process waits for the same moment, then opens both stores (as build_worker does).
OPEN_BOTH = (
    "import sys, time; from activities.audit_store import AuditStore; from activities.ledger_store import SqliteLedgerStore; "
    "time.sleep(max(0.0, float(sys.argv[2]) - time.time())); "
    "AuditStore(sys.argv[1] + '/audit.sqlite'); SqliteLedgerStore(sys.argv[1] + '/ledger.sqlite')"
)


def test_processes_opening_new_stores_at_once_all_succeed(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    for round_ in range(4):
        data = tmp_path / f"round-{round_}"
        data.mkdir()
        at = str(time.time() + 1.0)
        processes = [
            subprocess.Popen([sys.executable, "-c", OPEN_BOTH, str(data), at], cwd=root, stderr=subprocess.PIPE, text=True)
            for _ in range(4)
        ]
        errors = [p.communicate(timeout=60)[1] for p in processes]
        assert [p.returncode for p in processes] == [0] * 4, "\n".join(errors)
