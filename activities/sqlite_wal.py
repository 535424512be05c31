"""Switching a SQLite file to WAL when several worker processes open it at once.

Switching the journal mode needs the database to itself, and SQLite answers a second process
doing the same at that moment with "database is locked" straight away, without waiting out
the connection's busy timeout (seen with two workers starting on one new data directory). The
switch is idempotent, so it is retried for a while before giving up.
"""

from __future__ import annotations

import sqlite3
import time

ATTEMPTS = 40
PAUSE_SECONDS = 0.025


def use_wal(db: sqlite3.Connection) -> None:
    for attempt in range(1, ATTEMPTS + 1):
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or attempt == ATTEMPTS:
                raise
            time.sleep(PAUSE_SECONDS * attempt)
