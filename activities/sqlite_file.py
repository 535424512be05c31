"""The one way the SQLite stores (ledger, audit) open their file: WAL, a busy timeout, and one
transaction per connection, closed afterwards, so that worker threads and processes share nothing.

Switching the journal mode needs the database to itself, and SQLite answers a second process
doing the same at that moment with "database is locked" straight away, without waiting out
the connection's busy timeout (seen with two workers starting on one new data directory). The
switch is idempotent, so it is retried for a while before giving up.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

ATTEMPTS = 40
PAUSE_SECONDS = 0.025
BUSY_TIMEOUT_SECONDS = 30


class SqliteFile:
    """A SQLite database file with its schema: `transaction()` is one transaction on a fresh connection."""

    def __init__(self, path: Path | str, schema: Sequence[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.transaction() as db:
            _use_wal(db)
            for statement in schema:
                db.execute(statement)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """Committed when the block ends, rolled back if it raises; the connection is closed either way."""
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_SECONDS)
        try:
            with db:
                yield db
        finally:
            db.close()


def _use_wal(db: sqlite3.Connection) -> None:
    for attempt in range(1, ATTEMPTS + 1):
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or attempt == ATTEMPTS:
                raise
            time.sleep(PAUSE_SECONDS * attempt)
