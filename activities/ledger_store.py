"""Immutable, numbered mission ledger snapshots (SQLite by default) and the activity that writes them.

The PostgreSQL implementation (`activities.postgres_stores`) keeps the same rules; `activities.stores`
picks one from CONDUCTOR_DATABASE_URL.

A snapshot is identified by `(mission_id, snapshot_seq)` forever and stores the ledger's canonical
JSON with its sha256 (`workflows.mission.ledger.content_hash`). Writing is idempotent because an
activity may run more than once: the same seq with the same content is a no-op. The same seq
with different content is refused, never overwritten: an auditor must be able to trust that
snapshot `n` of a mission is what it was when first written. The aggregation core increments
`snapshot_seq` on every change, so a deterministic workflow never hits the refusal; if it does,
the workflow's code or history has diverged, which no retry can fix.

Reads re-hash the stored text, so a row changed behind the store's back is reported, not served.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol, runtime_checkable

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.sqlite_file import SqliteFile
from workflows.mission.ledger import (
    WRITE_LEDGER_SNAPSHOT_ACTIVITY,
    MissionLedger,
    SnapshotRef,
    canonical_json,
)

__all__ = [
    "IMMUTABLE_SNAPSHOT_ERROR",
    "ImmutableSnapshotError",
    "CorruptSnapshotError",
    "LedgerStore",
    "AsyncLedgerStore",
    "SqliteLedgerStore",
    "ThreadedLedgerStore",
    "snapshot_ref",
    "load_snapshot",
    "LedgerActivities",
    "SnapshotRef",
]

IMMUTABLE_SNAPSHOT_ERROR = "ledger.immutable_snapshot"

_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS mission_ledger_snapshots (
        mission_id TEXT NOT NULL,
        snapshot_seq INTEGER NOT NULL CHECK (snapshot_seq >= 0),
        content_hash TEXT NOT NULL,
        parent_state TEXT NOT NULL,
        ledger TEXT NOT NULL,
        stored_at TEXT NOT NULL,
        PRIMARY KEY (mission_id, snapshot_seq)
    )
    """,
    # Immutability does not depend on this module being the only writer.
    """
    CREATE TRIGGER IF NOT EXISTS mission_ledger_snapshots_no_update
    BEFORE UPDATE ON mission_ledger_snapshots
    BEGIN SELECT RAISE(ABORT, 'mission ledger snapshots are immutable'); END
    """,
    """
    CREATE TRIGGER IF NOT EXISTS mission_ledger_snapshots_no_delete
    BEFORE DELETE ON mission_ledger_snapshots
    BEGIN SELECT RAISE(ABORT, 'mission ledger snapshots are immutable'); END
    """,
)


class ImmutableSnapshotError(RuntimeError):
    """A snapshot number is already stored with other content; snapshots are never overwritten."""

    def __init__(self, mission_id: str, seq: int, stored_hash: str, new_hash: str) -> None:
        super().__init__(
            f"snapshot {seq} of mission {mission_id} is already stored with content hash {stored_hash}, "
            f"and this write has hash {new_hash}: snapshots are immutable. Either a mission ran under "
            f"this mission_id before (start it again under a new mission_id), or the workflow is no "
            f"longer deterministic (compare its history with the stored snapshot {seq})"
        )
        self.mission_id = mission_id
        self.seq = seq
        self.stored_hash = stored_hash
        self.new_hash = new_hash


class CorruptSnapshotError(RuntimeError):
    """A stored snapshot no longer matches its recorded hash: it was changed outside this store."""


@runtime_checkable
class LedgerStore(Protocol):
    """Where snapshots live. Implementations must keep `(mission_id, seq)` immutable."""

    def write(self, ledger: MissionLedger) -> SnapshotRef: ...

    def latest(self, mission_id: str) -> MissionLedger | None: ...

    def history(self, mission_id: str) -> list[SnapshotRef]: ...

    def get(self, mission_id: str, seq: int) -> MissionLedger | None: ...


class AsyncLedgerStore(Protocol):
    """`LedgerStore` for the event loop: what the activity and the CLI use, whichever database is behind."""

    async def write(self, ledger: MissionLedger) -> SnapshotRef: ...

    async def latest(self, mission_id: str) -> MissionLedger | None: ...

    async def history(self, mission_id: str) -> list[SnapshotRef]: ...

    async def get(self, mission_id: str, seq: int) -> MissionLedger | None: ...


class ThreadedLedgerStore:
    """An `AsyncLedgerStore` over a blocking one: each call in a worker thread, so the loop never waits on disk."""

    def __init__(self, store: LedgerStore) -> None:
        self.store = store

    async def write(self, ledger: MissionLedger) -> SnapshotRef:
        return await asyncio.to_thread(self.store.write, ledger)

    async def latest(self, mission_id: str) -> MissionLedger | None:
        return await asyncio.to_thread(self.store.latest, mission_id)

    async def history(self, mission_id: str) -> list[SnapshotRef]:
        return await asyncio.to_thread(self.store.history, mission_id)

    async def get(self, mission_id: str, seq: int) -> MissionLedger | None:
        return await asyncio.to_thread(self.store.get, mission_id, seq)


def _digest(text: str) -> str:
    """The content hash of a stored snapshot's text (`workflows.mission.ledger.content_hash`)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def snapshot_ref(ledger: MissionLedger) -> tuple[SnapshotRef, str]:
    """The snapshot's identity and the exact text stored for it (its hash is over this text)."""
    text = canonical_json(ledger)
    return SnapshotRef(mission_id=ledger.mission_id, seq=ledger.snapshot_seq, content_hash=_digest(text)), text


class SqliteLedgerStore:
    """`LedgerStore` in one SQLite file (WAL), safe for several worker processes on one host."""

    def __init__(self, path: Path | str) -> None:
        self._file = SqliteFile(path, _SCHEMA)
        self.path = self._file.path

    def write(self, ledger: MissionLedger) -> SnapshotRef:
        """Store `ledger` as snapshot `ledger.snapshot_seq`; a no-op if that exact snapshot is stored.

        Raises `ImmutableSnapshotError` if the seq is stored with different content.
        """
        ref, text = snapshot_ref(ledger)
        digest = ref.content_hash
        stored_at = datetime.now(timezone.utc).isoformat()
        with self._file.transaction() as db:
            inserted = db.execute(
                "INSERT INTO mission_ledger_snapshots VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (mission_id, snapshot_seq) DO NOTHING",
                (ref.mission_id, ref.seq, digest, ledger.parent_state, text, stored_at),
            ).rowcount
            if inserted:
                return ref
            row = db.execute(
                "SELECT content_hash FROM mission_ledger_snapshots WHERE mission_id = ? AND snapshot_seq = ?",
                (ref.mission_id, ref.seq),
            ).fetchone()
        if row[0] != digest:
            raise ImmutableSnapshotError(ref.mission_id, ref.seq, row[0], digest)
        return ref

    def latest(self, mission_id: str) -> MissionLedger | None:
        """The snapshot with the highest seq, or None if the mission has none."""
        with self._file.transaction() as db:
            row = db.execute(
                "SELECT snapshot_seq, content_hash, ledger FROM mission_ledger_snapshots WHERE mission_id = ? "
                "ORDER BY snapshot_seq DESC LIMIT 1",
                (mission_id,),
            ).fetchone()
        return None if row is None else load_snapshot(mission_id, *row)

    def get(self, mission_id: str, seq: int) -> MissionLedger | None:
        with self._file.transaction() as db:
            row = db.execute(
                "SELECT snapshot_seq, content_hash, ledger FROM mission_ledger_snapshots "
                "WHERE mission_id = ? AND snapshot_seq = ?",
                (mission_id, seq),
            ).fetchone()
        return None if row is None else load_snapshot(mission_id, *row)

    def history(self, mission_id: str) -> list[SnapshotRef]:
        """Every stored snapshot of the mission, oldest first (seq numbers may have gaps)."""
        with self._file.transaction() as db:
            rows = db.execute(
                "SELECT snapshot_seq, content_hash FROM mission_ledger_snapshots WHERE mission_id = ? "
                "ORDER BY snapshot_seq",
                (mission_id,),
            ).fetchall()
        return [SnapshotRef(mission_id=mission_id, seq=seq, content_hash=digest) for seq, digest in rows]


def load_snapshot(mission_id: str, seq: int, digest: str, text: str) -> MissionLedger:
    if _digest(text) != digest:
        raise CorruptSnapshotError(
            f"snapshot {seq} of mission {mission_id} does not match its recorded hash {digest}: the row was "
            "changed outside the ledger store; restore it from a backup"
        )
    return MissionLedger.model_validate_json(text)


class LedgerActivities:
    """The activity the MissionWorkflow calls to store each ledger snapshot (a blocking store runs in threads)."""

    def __init__(self, store: LedgerStore | AsyncLedgerStore) -> None:
        self._store: AsyncLedgerStore = store if inspect.iscoroutinefunction(store.write) else ThreadedLedgerStore(store)

    @activity.defn(name=WRITE_LEDGER_SNAPSHOT_ACTIVITY)
    async def write_ledger_snapshot(self, ledger: MissionLedger) -> SnapshotRef:
        try:
            return await self._store.write(ledger)
        except ImmutableSnapshotError as error:
            raise ApplicationError(str(error), type=IMMUTABLE_SNAPSHOT_ERROR, non_retryable=True) from error
