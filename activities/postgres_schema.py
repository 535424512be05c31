"""The PostgreSQL stores' schema as numbered migrations, applied on start by every worker.

Each migration runs once per database, in order, and is recorded in `schema_migrations`. Workers
on several hosts may start against a new database at the same moment, so the whole check-and-apply
runs in one transaction holding a transaction-scoped advisory lock: the second starter waits, then
finds every version recorded and applies nothing. A migration is never edited once released; a
change is a new, higher version. A database migrated by newer code (versions this code does not
know) is left alone: migrations only add, so older workers keep running during a rolling upgrade.

Ledger text is kept as `text`, not `jsonb`: the content hash is over the exact canonical bytes,
and jsonb would re-serialise them. Keys that are compared or ordered use the "C" collation, so
ordering is bytewise as in SQLite whatever locale the database was created with. Triggers make the
rows immutable whoever writes (UPDATE, DELETE and TRUNCATE are refused), as the SQLite triggers do.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

# Any fixed 64-bit number, the same in every worker: pg_advisory_xact_lock's key for migrating.
MIGRATION_LOCK_KEY = 0x6D697373696F6E31  # "mission1"


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "ledger snapshots and admission audit", (
        """
        CREATE FUNCTION conductor_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION '% rows are immutable (% refused)', TG_TABLE_NAME, TG_OP
                USING ERRCODE = 'integrity_constraint_violation';
        END
        $$
        """,
        """
        CREATE TABLE mission_ledger_snapshots (
            mission_id text COLLATE "C" NOT NULL,
            snapshot_seq bigint NOT NULL CHECK (snapshot_seq >= 0),
            content_hash text NOT NULL CHECK (content_hash ~ '^[0-9a-f]{64}$'),
            parent_state text NOT NULL,
            ledger text NOT NULL,
            stored_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (mission_id, snapshot_seq)
        )
        """,
        """
        CREATE TRIGGER mission_ledger_snapshots_immutable BEFORE UPDATE OR DELETE ON mission_ledger_snapshots
        FOR EACH ROW EXECUTE FUNCTION conductor_refuse_change()
        """,
        """
        CREATE TRIGGER mission_ledger_snapshots_no_truncate BEFORE TRUNCATE ON mission_ledger_snapshots
        FOR EACH STATEMENT EXECUTE FUNCTION conductor_refuse_change()
        """,
        """
        CREATE TABLE admission_audit (
            host_group text COLLATE "C" NOT NULL,
            chain text COLLATE "C" NOT NULL,
            seq bigint NOT NULL,
            type text NOT NULL,
            at timestamptz NOT NULL,
            request_id text COLLATE "C",
            event jsonb NOT NULL,
            stored_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (host_group, chain, seq)
        )
        """,
        "CREATE INDEX admission_audit_by_request ON admission_audit (host_group, request_id)",
        """
        CREATE TRIGGER admission_audit_append_only BEFORE UPDATE OR DELETE ON admission_audit
        FOR EACH ROW EXECUTE FUNCTION conductor_refuse_change()
        """,
        """
        CREATE TRIGGER admission_audit_no_truncate BEFORE TRUNCATE ON admission_audit
        FOR EACH STATEMENT EXECUTE FUNCTION conductor_refuse_change()
        """,
    )),
)  # fmt: skip

_LEDGER = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


async def migrate(connection: psycopg.AsyncConnection, migrations: tuple[Migration, ...] = MIGRATIONS) -> list[int]:
    """Apply the migrations this database lacks; returns the versions applied now (usually none)."""
    applied_now: list[int] = []
    async with connection.transaction():
        await connection.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
        await connection.execute(_LEDGER)
        cursor = await connection.execute("SELECT version FROM schema_migrations")
        done = {row[0] for row in await cursor.fetchall()}
        for migration in sorted(migrations, key=lambda m: m.version):
            if migration.version in done:
                continue
            for statement in migration.statements:
                await connection.execute(statement)
            await connection.execute(
                "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)", (migration.version, migration.name)
            )
            applied_now.append(migration.version)
    return applied_now
