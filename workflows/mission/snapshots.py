"""A mission's ledger snapshots, written by one writer (workflow code only).

Each snapshot is the whole ledger (about 1.9 KB a child) in an immutable store, and a fan-out
changes the ledger with every child's last word: written back to back, a 100-child mission
stored six to eight snapshots of up to 190 KB in three seconds, each also an activity input in
its history. So a pass hands the ledger to the writer and never waits for it; the writer starts
at most one write every `SNAPSHOT_INTERVAL`, and what changed meanwhile leaves with the next.
Closing and continuing as new flush: they write the latest ledger at once, after any write in
flight. Queries (`conductor mission show`, `watch`) read the live ledger, not the store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows.mission.ledger import WRITE_LEDGER_SNAPSHOT_ACTIVITY, MissionLedger, SnapshotRef

SNAPSHOT_INTERVAL = timedelta(seconds=2)
# A write takes milliseconds; one lost with a killed worker holds back the next write, and the
# closing one, until this timeout says so (found by the chaos suite: 30 s at closing).
SNAPSHOT_WRITE_TIMEOUT = timedelta(seconds=10)


class LedgerWriter:
    def __init__(self, ledger: Callable[[], MissionLedger], summary: Callable[[MissionLedger], str], written_seq: int = -1) -> None:
        self._ledger = ledger  # the live ledger
        self._summary = summary  # the write's line on the workflow page's timeline
        self.written_seq = written_seq
        self._writing = False
        self._written_at: datetime | None = None  # when the last write started
        self._flushing = False  # a flush waits: the background writer stops waiting out the interval
        self.closing = False  # from here on, only flushes write

    async def write(self, *, flush: bool = False) -> None:
        """Write the ledger if it changed: handed to the background writer (a write in flight or
        the interval between writes holds back only the next one, which then takes the latest
        ledger); or, when `flush`, written at once after any write in flight."""
        if flush:
            self._flushing = True
            await workflow.wait_condition(lambda: not self._writing)
            self._flushing = False
            await self._write_changed()
        elif not self._writing and self._ledger().snapshot_seq != self.written_seq:
            self._writing = True
            asyncio.ensure_future(self._write_in_background())

    async def _write_in_background(self) -> None:
        try:
            # A flush writes the latest ledger itself: chasing the changes closing makes meanwhile
            # (releases recorded, decisions folded) would cost a write each.
            while self._ledger().snapshot_seq != self.written_seq and not (self.closing or self._flushing):
                wait = timedelta(0) if self._written_at is None else self._written_at + SNAPSHOT_INTERVAL - workflow.now()
                if wait <= timedelta(0):
                    await self._write_changed()
                    continue
                try:
                    await workflow.wait_condition(
                        lambda: self.closing or self._flushing, timeout=wait, timeout_summary="next ledger snapshot",
                    )
                except asyncio.TimeoutError:
                    pass
        finally:
            self._writing = False

    async def _write_changed(self) -> None:
        """Always a scheduled activity, never a local one: a local activity runs before its marker
        is recorded, so a workflow task lost after the write (a worker killed) runs it again with
        whatever the retried task folded meanwhile, under the same snapshot seq, and the store
        refuses the changed content (`ledger.immutable_snapshot`, which failed a mission in CI).
        A scheduled write's input is in the history before it runs."""
        ledger = self._ledger()
        if ledger.snapshot_seq == self.written_seq:
            return
        self._written_at = workflow.now()
        await workflow.execute_activity(
            WRITE_LEDGER_SNAPSHOT_ACTIVITY, ledger, result_type=SnapshotRef,
            start_to_close_timeout=SNAPSHOT_WRITE_TIMEOUT, summary=self._summary(ledger)[:240],
        )
        self.written_seq = ledger.snapshot_seq
