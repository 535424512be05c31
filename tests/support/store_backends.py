"""Both store back ends behind one test fixture, so every store test runs against SQLite and PostgreSQL.

A `Backend` is opened through `activities.stores.select_stores`, the same door the worker uses:
SQLite files in the test's tmp_path, or a fresh database of the session's throw-away PostgreSQL
(`tests.support.postgres`). `raw` runs SQL on the database directly, as someone with access to it would
(for the tests that the database itself refuses changes and that reads detect tampering);
`another` opens a second, independent set of stores on the same data: a restarted worker, or a
worker on another host with its own connection pool.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from activities.stores import Stores, select_stores

BACKENDS = ("sqlite", "postgres")


@dataclass
class Backend:
    name: str
    url: str | None
    data_dir: Path
    stores: Stores

    @property
    def ledger(self):
        return self.stores.ledger

    @property
    def audit(self):
        return self.stores.audit

    @property
    def ledger_db(self) -> Path:
        return self.data_dir / "ledger.sqlite"

    @property
    def audit_db(self) -> Path:
        return self.data_dir / "audit.sqlite"

    def select(self, **options: object) -> Stores:
        return select_stores(self.url, ledger_db=self.ledger_db, audit_db=self.audit_db, **options)

    @asynccontextmanager
    async def another(self, **options: object) -> AsyncIterator[Stores]:
        async with self.select(**options) as stores:
            yield stores

    @property
    def database_error(self) -> type[Exception]:
        return sqlite3.DatabaseError if self.url is None else psycopg.Error

    def raw(self, statement: str, database: str = "ledger") -> list[tuple]:
        """Run one statement directly on the database (autocommit) and return its rows, if any."""
        if self.url is None:
            with sqlite3.connect(self.ledger_db if database == "ledger" else self.audit_db) as db:
                return db.execute(statement).fetchall()
        with psycopg.connect(self.url, autocommit=True) as db:
            cursor = db.execute(statement)
            return cursor.fetchall() if cursor.description else []

    def drop_ledger_guard(self) -> None:
        """What someone with direct access does before editing a snapshot behind the store's back."""
        if self.url is None:
            self.raw("DROP TRIGGER mission_ledger_snapshots_no_update")
        else:
            self.raw("ALTER TABLE mission_ledger_snapshots DISABLE TRIGGER mission_ledger_snapshots_immutable")


@asynccontextmanager
async def open_backend(request: pytest.FixtureRequest, name: str, tmp_path: Path) -> AsyncIterator[Backend]:
    url = request.getfixturevalue("postgres_url") if name == "postgres" else None
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    stores = select_stores(url, ledger_db=data_dir / "ledger.sqlite", audit_db=data_dir / "audit.sqlite")
    async with stores:
        yield Backend(name=name, url=url, data_dir=data_dir, stores=stores)
