"""Append-only audit store (SQLite by default) and the activity that fills it.

Idempotent by construction: `(host_group, chain, seq)` is the primary key and
inserts ignore duplicates, so a retried export never writes an event twice.
Rows are never updated or deleted by this code. The PostgreSQL implementation
(`activities.postgres_stores`) keeps the same rules; `activities.stores` picks one from
CONDUCTOR_DATABASE_URL.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from pathlib import Path
from typing import Protocol

from temporalio import activity

from activities.sqlite_file import SqliteFile
from workflows.admission.model import AuditEvent
from workflows.audit import AuditExport

_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS admission_audit (
        host_group TEXT NOT NULL,
        chain TEXT NOT NULL,
        seq INTEGER NOT NULL,
        type TEXT NOT NULL,
        at TEXT NOT NULL,
        request_id TEXT,
        event TEXT NOT NULL,
        PRIMARY KEY (host_group, chain, seq)
    )
    """,
    # Append-only does not depend on this module being the only writer (as in the PostgreSQL store).
    """
    CREATE TRIGGER IF NOT EXISTS admission_audit_no_update BEFORE UPDATE ON admission_audit
    BEGIN SELECT RAISE(ABORT, 'admission audit rows are immutable'); END
    """,
    """
    CREATE TRIGGER IF NOT EXISTS admission_audit_no_delete BEFORE DELETE ON admission_audit
    BEGIN SELECT RAISE(ABORT, 'admission audit rows are immutable'); END
    """,
)


class AsyncAuditStore(Protocol):
    """The audit store for the event loop: what the activity and the CLI use, whichever database is behind."""

    async def append(self, export: AuditExport) -> int: ...

    async def events(self, host_group: str, request_id: str | None = None) -> list[AuditEvent]: ...


class AuditStore:
    def __init__(self, path: Path | str) -> None:
        self._file = SqliteFile(path, _SCHEMA)
        self.path = self._file.path

    def append(self, export: AuditExport) -> int:
        """Store a batch; returns how many events were new."""
        rows = [
            (export.host_group, export.chain, event.seq, event.type, event.at.isoformat(), event.request_id,
             event.model_dump_json())
            for event in export.events
        ]
        with self._file.transaction() as db:
            before = db.total_changes
            db.executemany("INSERT OR IGNORE INTO admission_audit VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
            return db.total_changes - before

    def events(self, host_group: str, request_id: str | None = None) -> list[AuditEvent]:
        query = "SELECT event FROM admission_audit WHERE host_group = ?"
        params: list[object] = [host_group]
        if request_id is not None:
            query += " AND request_id = ?"
            params.append(request_id)
        with self._file.transaction() as db:
            rows = db.execute(query + " ORDER BY chain, seq", params).fetchall()
        return [AuditEvent.model_validate(json.loads(row[0])) for row in rows]


class ThreadedAuditStore:
    """An `AsyncAuditStore` over the blocking SQLite one: each call in a worker thread."""

    def __init__(self, store: AuditStore) -> None:
        self.store = store

    async def append(self, export: AuditExport) -> int:
        return await asyncio.to_thread(self.store.append, export)

    async def events(self, host_group: str, request_id: str | None = None) -> list[AuditEvent]:
        return await asyncio.to_thread(self.store.events, host_group, request_id)


class AuditActivities:
    def __init__(self, store: AuditStore | AsyncAuditStore) -> None:
        self._store: AsyncAuditStore = store if inspect.iscoroutinefunction(store.append) else ThreadedAuditStore(store)

    @activity.defn(name="export_audit_events")
    async def export_audit_events(self, export: AuditExport) -> int:
        return await self._store.append(export)
