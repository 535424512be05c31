"""What only the PostgreSQL stores have: versioned migrations that many workers run at once on start,
writers on several hosts (here: several connection pools) racing for the same snapshot numbers, and
the worker wired to the database by CONDUCTOR_DATABASE_URL."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
from temporalio.testing import WorkflowEnvironment

from activities.ledger_store import ImmutableSnapshotError
from activities.postgres_schema import MIGRATIONS, Migration, migrate
from activities.postgres_stores import PostgresDatabase
from activities.stores import StoreUnavailable, select_stores
from tests.support.ledger_workflow import LedgerSnapshotWorkflow
from tests.stores.test_ledger_store import ledgers, make_spec, observations
from worker.config import WorkerConfig
from worker.worker import build_worker
from workflows.mission.ledger import MissionLedger, SnapshotRef, content_hash


def stores_for(url: str, tmp_path: Path, pool_size: int = 4):
    return select_stores(url, ledger_db=tmp_path / "ledger.sqlite", audit_db=tmp_path / "audit.sqlite", pool_size=pool_size)


def rows(url: str, query: str) -> list[tuple]:
    with psycopg.connect(url) as db:
        return db.execute(query).fetchall()


async def test_many_workers_starting_at_once_migrate_a_new_database_once(postgres_url: str, tmp_path: Path) -> None:
    starters = [stores_for(postgres_url, tmp_path, pool_size=1) for _ in range(8)]
    try:
        # Every start is awaited (and every pool closed below) even if one fails, so a failure is reported.
        outcomes = await asyncio.wait_for(asyncio.gather(*(s.open() for s in starters), return_exceptions=True), 60)
        assert outcomes == [None] * len(starters)
        assert rows(postgres_url, "SELECT version, name FROM schema_migrations") == [
            (m.version, m.name) for m in MIGRATIONS
        ]
        tables = {r[0] for r in rows(postgres_url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        assert {"schema_migrations", "mission_ledger_snapshots", "admission_audit"} <= tables
        # A restart applies nothing.
        database = PostgresDatabase(postgres_url, max_size=1)
        assert await database.open() == []
        await database.close()
    finally:
        await asyncio.gather(*(stores.close() for stores in starters))
    assert not (tmp_path / "ledger.sqlite").exists()  # PostgreSQL selected: no SQLite file on the side


async def test_a_new_migration_is_applied_once_and_newer_versions_are_left_alone(postgres_url: str) -> None:
    extra = Migration(2, "a test column", ("ALTER TABLE admission_audit ADD COLUMN note text",))
    async with await psycopg.AsyncConnection.connect(postgres_url) as db:
        assert await migrate(db) == [1]
        assert await migrate(db, (*MIGRATIONS, extra)) == [2]
        assert await migrate(db, (*MIGRATIONS, extra)) == []
        # A newer worker recorded version 3: this code neither fails nor re-applies anything.
        await db.execute("INSERT INTO schema_migrations (version, name) VALUES (3, 'from the future')")
        await db.commit()
        assert await migrate(db) == []
    assert [r[0] for r in rows(postgres_url, "SELECT version FROM schema_migrations ORDER BY version")] == [1, 2, 3]


async def test_two_pools_racing_on_the_same_snapshots_store_one_content_each(postgres_url: str, tmp_path: Path) -> None:
    """Two workers on two hosts (two pools) write the same 20 snapshot numbers at once, 6 writers per
    number with two different contents: exactly one content per number is stored; writers of that
    content succeed (idempotent), writers of the other get ImmutableSnapshotError."""
    base = ledgers(make_spec())[1]
    variants = {
        seq: [base.model_copy(update={"snapshot_seq": seq, "verdict_reason": f"variant {v}"}) for v in (0, 1)]
        for seq in range(20)
    }
    host_a, host_b = stores_for(postgres_url, tmp_path, 6), stores_for(postgres_url, tmp_path, 6)
    async with host_a, host_b:

        async def attempt(store, ledger: MissionLedger) -> tuple[int, str]:
            try:
                return ledger.snapshot_seq, (await store.write(ledger)).content_hash
            except ImmutableSnapshotError as error:
                assert error.new_hash == content_hash(ledger)
                return ledger.snapshot_seq, "refused"

        writes = [
            attempt((host_a, host_b)[w % 2].ledger, variants[seq][w % 3 % 2])
            for seq in variants for w in range(6)
        ]  # fmt: skip
        outcomes = await asyncio.gather(*writes)
        history = await host_b.ledger.history("m-1")
    assert [ref.seq for ref in history] == list(range(20))
    for ref in history:
        winner = ref.content_hash
        assert winner in {content_hash(v) for v in variants[ref.seq]}
        mine = [outcome for seq, outcome in outcomes if seq == ref.seq]
        writers_of_winner = sum(1 for w in range(6) if content_hash(variants[ref.seq][w % 3 % 2]) == winner)
        assert mine.count(winner) == writers_of_winner and mine.count("refused") == 6 - writers_of_winner


async def test_the_worker_writes_snapshots_to_the_database_its_config_names(
    time_skipping_env: WorkflowEnvironment, postgres_url: str, tmp_path: Path
) -> None:
    config = replace(WorkerConfig(data_dir=tmp_path / "data", task_queue=f"pg-{uuid.uuid4()}"), database_url=postgres_url)
    spec = make_spec(f"m-{uuid.uuid4().hex[:8]}", mode="all-pass")
    async with build_worker(time_skipping_env.client, config, extra_workflows=[LedgerSnapshotWorkflow]):
        refs = await time_skipping_env.client.execute_workflow(
            LedgerSnapshotWorkflow.run, args=[spec, observations(spec)], id=f"ledger-{uuid.uuid4()}",
            task_queue=config.task_queue, result_type=list[SnapshotRef],
        )  # fmt: skip
    stored = rows(postgres_url, f"SELECT snapshot_seq, content_hash FROM mission_ledger_snapshots "
                                f"WHERE mission_id = '{spec.mission_id}' ORDER BY snapshot_seq")  # fmt: skip
    assert stored == [(ref.seq, ref.content_hash) for ref in refs] and len(refs) == 4
    assert not config.ledger_db.exists() and not config.audit_db.exists()


async def test_a_worker_whose_database_is_unreachable_fails_before_polling(
    time_skipping_env: WorkflowEnvironment, postgres_server, tmp_path: Path
) -> None:
    wrong = postgres_server.url().replace(postgres_server.password, "not-the-password")
    config = replace(WorkerConfig(data_dir=tmp_path, task_queue=f"pg-{uuid.uuid4()}"), database_url=wrong)
    with pytest.raises(StoreUnavailable) as caught:
        async with build_worker(time_skipping_env.client, config):
            pytest.fail("the worker started without its stores")
    message = str(caught.value)
    assert "CONDUCTOR_DATABASE_URL" in message and "password authentication failed" in message
    assert "not-the-password" not in message and ":***@" in message and "\n" not in message


# One "host": its own process and pool, writing snapshots 0..19 of one mission with its own content.
_HOST = """
import asyncio, json, sys
from pathlib import Path
from activities.ledger_store import ImmutableSnapshotError
from activities.stores import select_stores
from tests.stores.test_ledger_store import ledgers, make_spec

async def main(url, variant, scratch):
    base = ledgers(make_spec())[1]
    outcomes = {}
    async with select_stores(url, ledger_db=Path(scratch) / "l", audit_db=Path(scratch) / "a", pool_size=4) as stores:
        async def one(seq):
            ledger = base.model_copy(update={"snapshot_seq": seq, "verdict_reason": f"variant {variant}"})
            try:
                outcomes[seq] = (await stores.ledger.write(ledger)).content_hash
            except ImmutableSnapshotError:
                outcomes[seq] = "refused"
        sys.stdin.readline()  # every host starts writing at the same moment
        await asyncio.gather(*(one(seq) for seq in range(20)))
    print(json.dumps(outcomes))

asyncio.run(main(*sys.argv[1:]))
"""


async def test_writers_in_separate_processes_agree_on_one_content_per_snapshot(postgres_url: str, tmp_path: Path) -> None:
    hosts = [
        subprocess.Popen([sys.executable, "-c", _HOST, postgres_url, str(i % 2), str(tmp_path)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        for i in range(4)
    ]
    for host in hosts:
        host.stdin.write("go\n")
        host.stdin.flush()
    results = []
    for host in hosts:
        out, err = host.communicate(timeout=60)
        assert host.returncode == 0, err
        results.append({int(seq): outcome for seq, outcome in json.loads(out).items()})
    stored = dict(rows(postgres_url, "SELECT snapshot_seq, content_hash FROM mission_ledger_snapshots"))
    assert sorted(stored) == list(range(20))
    for seq, winner in stored.items():
        # The two hosts with the winning content succeed, the two with the other are refused.
        assert sorted(result[seq] for result in results) == sorted([winner, winner, "refused", "refused"])
