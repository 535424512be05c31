"""Durable SQLite storage for workload records and executor tasks.

One file (WAL, `synchronous=NORMAL`) so an acknowledged admission or observation survives a
crash of the substrate; only a power loss or an OS crash could undo the last commits. (FULL
would fsync every commit: a third of the substrate's time in a 100-child fan-out,
`bench/mission_fanout.py` profiled with py-spy, with its event loop blocked meanwhile.) Records are stored as their wire JSON plus the columns we look
things up by; validation belongs to the callers (`fleet.py`, `executor.py`, `runner.py`). Every
read-check-write (compare-and-swap on revisions, idempotency checks) runs inside
`transaction()`, which holds a process-wide lock and an immediate SQLite write lock, so the
check and the write are one atomic step even with several threads or processes.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS workloads (
    child_id        TEXT PRIMARY KEY,
    idempotency_key TEXT NOT NULL UNIQUE,
    identity_sha256 TEXT NOT NULL,
    revision        INTEGER NOT NULL,
    record          TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS tasks (
    task_id          TEXT PRIMARY KEY,
    message_id       TEXT NOT NULL UNIQUE,
    message_sha256   TEXT NOT NULL,
    instance_id      TEXT NOT NULL,
    child_id         TEXT NOT NULL,
    context_id       TEXT NOT NULL,
    kind             TEXT NOT NULL,
    state            TEXT NOT NULL,
    status_text      TEXT,
    updated_at       TEXT NOT NULL,
    request          TEXT NOT NULL,
    artifacts        TEXT NOT NULL DEFAULT '[]',
    pid              INTEGER,
    pid_start_ticks  INTEGER,
    fail_kind        TEXT,
    terminal_at      TEXT,
    status_extra     TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS tasks_by_child ON tasks(child_id);
CREATE INDEX IF NOT EXISTS tasks_by_state ON tasks(state);
"""

ACTIVE_TASK_STATES = ("submitted", "working", "input-required", "auth-required")

# Columns added after the first release of the table: a data directory written by an older
# substrate gets them on open (SQLite's ADD COLUMN keeps the rows).
_ADDED_TASK_COLUMNS = {
    "fail_kind": "TEXT",
    "terminal_at": "TEXT",
    "status_extra": "TEXT NOT NULL DEFAULT '{}'",
}


@dataclass(frozen=True)
class StoredWorkload:
    child_id: str
    idempotency_key: str
    identity_sha256: str
    revision: int
    record: dict[str, Any]


@dataclass(frozen=True)
class TaskRow:
    task_id: str
    message_id: str
    message_sha256: str
    instance_id: str
    child_id: str
    context_id: str
    kind: str
    state: str
    status_text: str | None
    updated_at: str
    request: dict[str, Any]
    #: Artifact rows in the executor's shape (`handlers/artifacts.rs`): artifact_id, created_at, artifact.
    artifacts: list[dict[str, Any]]
    pid: int | None = None
    pid_start_ticks: int | None = None
    #: "application" | "infrastructure" for a failed task (executor `FailKind`).
    fail_kind: str | None = None
    terminal_at: str | None = None
    #: Further fields of the A2A status object: summary, error, exit_code.
    status_extra: dict[str, Any] = field(default_factory=dict)


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class Store:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._depth = 0
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # see the module's docstring
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(_SCHEMA)
        present = {row["name"] for row in self._db.execute("PRAGMA table_info(tasks)")}
        for name, declaration in _ADDED_TASK_COLUMNS.items():
            if name not in present:
                self._db.execute(f"ALTER TABLE tasks ADD COLUMN {name} {declaration}")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """An atomic unit; nests (inner blocks join the outer transaction)."""
        with self._lock:
            if self._depth:
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            self._db.execute("BEGIN IMMEDIATE")
            self._depth = 1
            try:
                yield
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            else:
                self._db.execute("COMMIT")
            finally:
                self._depth = 0

    # -- workloads ---------------------------------------------------------------------

    @staticmethod
    def _workload(row: sqlite3.Row | None) -> StoredWorkload | None:
        if row is None:
            return None
        return StoredWorkload(
            child_id=row["child_id"],
            idempotency_key=row["idempotency_key"],
            identity_sha256=row["identity_sha256"],
            revision=row["revision"],
            record=json.loads(row["record"]),
        )

    def get_workload(self, child_id: str) -> StoredWorkload | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM workloads WHERE child_id = ?", (child_id,)).fetchone()
        return self._workload(row)

    def workload_by_idempotency_key(self, key: str) -> StoredWorkload | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM workloads WHERE idempotency_key = ?", (key,)).fetchone()
        return self._workload(row)

    def list_workloads(self) -> list[StoredWorkload]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM workloads ORDER BY child_id").fetchall()
        return [w for w in map(self._workload, rows) if w is not None]

    def insert_workload(self, workload: StoredWorkload) -> None:
        with self.transaction():
            self._db.execute(
                "INSERT INTO workloads (child_id, idempotency_key, identity_sha256, revision, record)"
                " VALUES (?, ?, ?, ?, ?)",
                (
                    workload.child_id,
                    workload.idempotency_key,
                    workload.identity_sha256,
                    workload.revision,
                    _dumps(workload.record),
                ),
            )

    def replace_record(self, child_id: str, revision: int, record: dict[str, Any]) -> None:
        """Overwrite a record; callers check the expected revision inside the same transaction."""
        with self.transaction():
            self._db.execute(
                "UPDATE workloads SET revision = ?, record = ? WHERE child_id = ?",
                (revision, _dumps(record), child_id),
            )

    # -- tasks -------------------------------------------------------------------------

    @staticmethod
    def _task(row: sqlite3.Row | None) -> TaskRow | None:
        if row is None:
            return None
        return TaskRow(
            task_id=row["task_id"],
            message_id=row["message_id"],
            message_sha256=row["message_sha256"],
            instance_id=row["instance_id"],
            child_id=row["child_id"],
            context_id=row["context_id"],
            kind=row["kind"],
            state=row["state"],
            status_text=row["status_text"],
            updated_at=row["updated_at"],
            request=json.loads(row["request"]),
            artifacts=json.loads(row["artifacts"]),
            pid=row["pid"],
            pid_start_ticks=row["pid_start_ticks"],
            fail_kind=row["fail_kind"],
            terminal_at=row["terminal_at"],
            status_extra=json.loads(row["status_extra"] or "{}"),
        )

    def get_task(self, task_id: str) -> TaskRow | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
        return self._task(row)

    def task_by_message_id(self, message_id: str) -> TaskRow | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM tasks WHERE message_id = ?", (message_id,)).fetchone()
        return self._task(row)

    def active_tasks(self) -> list[TaskRow]:
        marks = ",".join("?" * len(ACTIVE_TASK_STATES))
        with self._lock:
            rows = self._db.execute(
                f"SELECT * FROM tasks WHERE state IN ({marks}) ORDER BY rowid", ACTIVE_TASK_STATES
            ).fetchall()
        return [t for t in map(self._task, rows) if t is not None]

    def insert_task(self, task: TaskRow) -> None:
        with self.transaction():
            self._db.execute(
                "INSERT INTO tasks (task_id, message_id, message_sha256, instance_id, child_id, context_id,"
                " kind, state, status_text, updated_at, request, artifacts, pid, pid_start_ticks,"
                " fail_kind, terminal_at, status_extra)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    task.task_id,
                    task.message_id,
                    task.message_sha256,
                    task.instance_id,
                    task.child_id,
                    task.context_id,
                    task.kind,
                    task.state,
                    task.status_text,
                    task.updated_at,
                    _dumps(task.request),
                    _dumps(task.artifacts),
                    task.pid,
                    task.pid_start_ticks,
                    task.fail_kind,
                    task.terminal_at,
                    _dumps(task.status_extra),
                ),
            )

    _TASK_COLUMNS = frozenset({
        "state", "status_text", "updated_at", "artifacts", "pid", "pid_start_ticks",
        "fail_kind", "terminal_at", "status_extra",
    })  # fmt: skip

    def update_task(self, task_id: str, **fields: Any) -> None:
        unknown = set(fields) - self._TASK_COLUMNS
        if unknown:
            raise ValueError(f"not updatable task columns: {sorted(unknown)}")
        for name in ("artifacts", "status_extra"):
            if name in fields:
                fields[name] = _dumps(fields[name])
        assignments = ", ".join(f"{name} = ?" for name in fields)
        with self.transaction():
            self._db.execute(f"UPDATE tasks SET {assignments} WHERE task_id = ?", (*fields.values(), task_id))
