"""The ledger and audit stores in PostgreSQL, shared by every worker on every host.

Same rules as the SQLite stores (`activities.ledger_store`, `activities.audit_store`), now with
writers on several hosts: the database's constraints decide, not the writer. A snapshot write is
`INSERT ... ON CONFLICT DO NOTHING` and, when nothing was inserted, a read of the stored hash in the
same transaction. Under READ COMMITTED the insert waits for a concurrent insert of the same key to
commit or roll back, so the read that follows always sees the row that won, and exactly one content
is ever stored for a `(mission_id, snapshot_seq)`. Audit batches insert in key order (two batches
with overlapping keys then cannot deadlock) and ignore events already stored.

One `psycopg_pool.AsyncConnectionPool` serves both stores; `open` runs the schema migrations
(`activities.postgres_schema`) before the pool takes any work.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import psycopg
from psycopg import errors
from psycopg_pool import AsyncConnectionPool

from activities.ledger_store import ImmutableSnapshotError, load_snapshot, snapshot_ref
from activities.postgres_schema import migrate
from workflows.admission.model import AuditEvent
from workflows.audit import AuditExport
from workflows.mission.ledger import MissionLedger, SnapshotRef

T = TypeVar("T")
# A deadlock or serialization failure is the database asking us to run the transaction again.
RETRIES = 5
# A database that does not answer fails a worker's start (or an activity) in seconds, not never.
CONNECT_TIMEOUT_SECONDS = 10


class PostgresDatabase:
    """The pool both stores share; opened once per worker (or CLI command), closed when it stops."""

    def __init__(self, url: str, *, max_size: int = 10) -> None:
        self._url = url
        self.pool = AsyncConnectionPool(
            url, min_size=1, max_size=max_size, open=False, check=AsyncConnectionPool.check_connection,
            kwargs={"connect_timeout": CONNECT_TIMEOUT_SECONDS}, name="conductor-stores",
        )  # fmt: skip

    async def open(self) -> list[int]:
        """Migrate, then open the pool; returns the migration versions applied now.

        The migration runs on a connection of its own so that a database that cannot be reached
        fails here with libpq's reason (host, port, authentication), not a pool timeout later.
        """
        async with await psycopg.AsyncConnection.connect(self._url, connect_timeout=CONNECT_TIMEOUT_SECONDS) as db:
            applied = await migrate(db)
        await self.pool.open(wait=True, timeout=CONNECT_TIMEOUT_SECONDS)
        return applied

    async def close(self) -> None:
        await self.pool.close()


async def _retrying(operation: Callable[[], Awaitable[T]]) -> T:
    """Run `operation` again when PostgreSQL aborts it only to break a deadlock or a serialization conflict."""
    for attempt in range(1, RETRIES + 1):
        try:
            return await operation()
        except (errors.DeadlockDetected, errors.SerializationFailure):
            if attempt == RETRIES:
                raise
    raise AssertionError("unreachable")


class PostgresLedgerStore:
    """`AsyncLedgerStore` in PostgreSQL: `(mission_id, snapshot_seq)` immutable across every writer."""

    def __init__(self, database: PostgresDatabase) -> None:
        self._pool = database.pool

    async def write(self, ledger: MissionLedger) -> SnapshotRef:
        """Store `ledger` as snapshot `ledger.snapshot_seq`; a no-op if that exact snapshot is stored.

        Raises `ImmutableSnapshotError` if the seq is stored with different content.
        """
        ref, text = snapshot_ref(ledger)
        async with self._pool.connection() as db:
            async with db.transaction():
                inserted = await db.execute(
                    "INSERT INTO mission_ledger_snapshots (mission_id, snapshot_seq, content_hash, parent_state, ledger) "
                    "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (mission_id, snapshot_seq) DO NOTHING",
                    (ref.mission_id, ref.seq, ref.content_hash, ledger.parent_state, text),
                )
                if inserted.rowcount:
                    return ref
                cursor = await db.execute(
                    "SELECT content_hash FROM mission_ledger_snapshots WHERE mission_id = %s AND snapshot_seq = %s",
                    (ref.mission_id, ref.seq),
                )
                (stored_hash,) = await cursor.fetchone()
        if stored_hash != ref.content_hash:
            raise ImmutableSnapshotError(ref.mission_id, ref.seq, stored_hash, ref.content_hash)
        return ref

    async def latest(self, mission_id: str) -> MissionLedger | None:
        """The snapshot with the highest seq, or None if the mission has none."""
        row = await self._one(
            "SELECT snapshot_seq, content_hash, ledger FROM mission_ledger_snapshots WHERE mission_id = %s "
            "ORDER BY snapshot_seq DESC LIMIT 1",
            (mission_id,),
        )
        return None if row is None else load_snapshot(mission_id, *row)

    async def get(self, mission_id: str, seq: int) -> MissionLedger | None:
        row = await self._one(
            "SELECT snapshot_seq, content_hash, ledger FROM mission_ledger_snapshots "
            "WHERE mission_id = %s AND snapshot_seq = %s",
            (mission_id, seq),
        )
        return None if row is None else load_snapshot(mission_id, *row)

    async def history(self, mission_id: str) -> list[SnapshotRef]:
        """Every stored snapshot of the mission, oldest first (seq numbers may have gaps)."""
        async with self._pool.connection() as db:
            cursor = await db.execute(
                "SELECT snapshot_seq, content_hash FROM mission_ledger_snapshots WHERE mission_id = %s "
                "ORDER BY snapshot_seq",
                (mission_id,),
            )
            rows = await cursor.fetchall()
        return [SnapshotRef(mission_id=mission_id, seq=seq, content_hash=digest) for seq, digest in rows]

    async def _one(self, query: str, params: tuple[object, ...]) -> tuple | None:
        async with self._pool.connection() as db:
            cursor = await db.execute(query, params)
            return await cursor.fetchone()


class PostgresAuditStore:
    """`AsyncAuditStore` in PostgreSQL: append-only, `(host_group, chain, seq)` stored once."""

    def __init__(self, database: PostgresDatabase) -> None:
        self._pool = database.pool

    async def append(self, export: AuditExport) -> int:
        """Store a batch; returns how many events were new."""
        first: dict[int, AuditEvent] = {}
        for event in export.events:  # a seq twice in one batch: the first is kept, as SQLite's OR IGNORE does
            first.setdefault(event.seq, event)
        events = sorted(first.values(), key=lambda event: event.seq)
        if not events:
            return 0
        columns = (
            [event.seq for event in events],
            [event.type for event in events],
            [event.at for event in events],
            [event.request_id for event in events],
            [event.model_dump_json() for event in events],
        )

        async def insert() -> int:
            async with self._pool.connection() as db:
                cursor = await db.execute(
                    "INSERT INTO admission_audit (host_group, chain, seq, type, at, request_id, event) "
                    "SELECT %s, %s, seq, type, at, request_id, event::jsonb "
                    "FROM unnest(%s::bigint[], %s::text[], %s::timestamptz[], %s::text[], %s::text[]) "
                    "WITH ORDINALITY AS batch (seq, type, at, request_id, event, position) ORDER BY position "
                    "ON CONFLICT (host_group, chain, seq) DO NOTHING",
                    (export.host_group, export.chain, *columns),
                )
                return cursor.rowcount

        return await _retrying(insert)

    async def events(self, host_group: str, request_id: str | None = None) -> list[AuditEvent]:
        query = "SELECT event::text FROM admission_audit WHERE host_group = %s"
        params: list[object] = [host_group]
        if request_id is not None:
            query += " AND request_id = %s"
            params.append(request_id)
        async with self._pool.connection() as db:
            cursor = await db.execute(query + " ORDER BY chain, seq", params)
            rows = await cursor.fetchall()
        return [AuditEvent.model_validate_json(row[0]) for row in rows]
