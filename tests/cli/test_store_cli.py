"""`conductor ledger show` and `conductor admission audit --stored` read whichever store is configured:
the PostgreSQL database CONDUCTOR_DATABASE_URL names, else the SQLite files in CONDUCTOR_DATA_DIR."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest
from temporalio.testing import WorkflowEnvironment

from activities.stores import DATABASE_URL_ENV
from tests.support.processes import ensure_stopped
from tests.support.cli_support import conductor
from tests.support.postgres import PostgresServer
from tests.support.store_backends import BACKENDS, Backend, open_backend
from tests.stores.test_audit_store import export
from tests.stores.test_ledger_store import ledgers, make_spec
from workflows.mission.ledger import content_hash


@pytest.fixture(params=BACKENDS)
async def backend(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Backend]:
    """Stores holding a mission's ledgers and a host group's audit trail; the CLI's environment points at them."""
    async with open_backend(request, request.param, tmp_path) as opened:
        for ledger in ledgers(make_spec()):
            await opened.ledger.write(ledger)
        await opened.audit.append(export(range(1, 31)))
        monkeypatch.setenv("CONDUCTOR_DATA_DIR", str(opened.data_dir if opened.url is None else tmp_path / "unused"))
        if opened.url is None:
            monkeypatch.delenv(DATABASE_URL_ENV, raising=False)
        else:
            monkeypatch.setenv(DATABASE_URL_ENV, opened.url)
        yield opened


async def test_ledger_show_prints_the_latest_snapshot_a_given_one_and_the_history(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    written = ledgers(make_spec())
    shown = await conductor(capsys, "ledger", "show", "m-1")
    assert shown.code == 0, shown.err
    first = shown.out.splitlines()[0]
    assert first.startswith("snapshot 6 of mission m-1, from ")
    assert ("PostgreSQL postgresql://conductor:***@127.0.0.1:" if backend.url else "SQLite files ") in first
    if backend.url:
        assert backend.url.split(":")[2].split("@")[0] not in shown.out  # the password is never printed
    assert "completed" in shown.out and "child-a" in shown.out

    as_json = await conductor(capsys, "ledger", "show", "m-1", "--seq", "2", "--json")
    assert as_json.code == 0 and as_json.json["snapshot_seq"] == 2
    assert as_json.json == written[1].model_dump(mode="json")

    history = await conductor(capsys, "ledger", "show", "m-1", "--history", "--json")
    assert history.json == [
        {"mission_id": "m-1", "seq": ledger.snapshot_seq, "content_hash": content_hash(ledger)} for ledger in written
    ]
    table = await conductor(capsys, "ledger", "show", "m-1", "--history")
    assert table.out.splitlines()[0].split() == ["SEQ", "CONTENT", "SHA256"]
    assert content_hash(written[-1]) in table.out.splitlines()[-1]


async def test_ledger_show_says_in_one_line_what_is_not_there(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = await conductor(capsys, "ledger", "show", "m-unknown")
    assert missing.code == 1 and "no ledger snapshots of mission m-unknown in " in missing.line
    no_seq = await conductor(capsys, "ledger", "show", "m-1", "--seq", "99")
    assert no_seq.code == 1 and "no ledger snapshot 99 of mission m-1" in no_seq.line
    bad = await conductor(capsys, "ledger", "show", "m 1")
    assert bad.code == 2 and "mission id" in bad.line


async def test_admission_audit_stored_reads_the_whole_trail(backend: Backend, capsys: pytest.CaptureFixture[str]) -> None:
    every = await conductor(capsys, "admission", "audit", "--stored", "--host-group", "hg-1", "--limit", "100", "--json")
    assert every.code == 0, every.err
    assert [e["seq"] for e in every.json] == list(range(1, 31))
    last = await conductor(capsys, "admission", "audit", "--stored", "--host-group", "hg-1", "--limit", "5")
    assert last.code == 0 and "(last 5 of 30 stored events shown" in last.out
    assert [line.split()[0] for line in last.out.splitlines()[1:6]] == ["26", "27", "28", "29", "30"]
    one = await conductor(capsys, "admission", "audit", "--stored", "--host-group", "hg-1", "--request-id", "r-1",
                          "--limit", "100", "--json")  # fmt: skip
    assert [e["seq"] for e in one.json] == [s for s in range(1, 31) if s % 3 == 1]
    empty = await conductor(capsys, "admission", "audit", "--stored", "--host-group", "hg-2")
    assert empty.code == 0 and "no audit events for host group hg-2" in empty.out


async def test_readers_refuse_a_bad_url_and_a_missing_store_in_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(DATABASE_URL_ENV, "mysql://conductor:hunter2@db/conductor")
    bad = await conductor(capsys, "ledger", "show", "m-1")
    assert bad.code == 2 and DATABASE_URL_ENV in bad.line and "hunter2" not in bad.err
    monkeypatch.delenv(DATABASE_URL_ENV)
    monkeypatch.setenv("CONDUCTOR_DATA_DIR", str(tmp_path / "nowhere"))
    for argv in (["ledger", "show", "m-1"], ["admission", "audit", "--stored", "--host-group", "hg-1"]):
        missing = await conductor(capsys, *argv)
        assert missing.code == 1 and "no store at " in missing.line and "CONDUCTOR_DATA_DIR" in missing.line
    assert not (tmp_path / "nowhere").exists()  # a reader creates no empty store
    live_only = await conductor(capsys, "admission", "audit", "--host-group", "hg-1", "--request-id", "r-1")
    assert live_only.code == 2 and "--request-id needs --stored" in live_only.line


async def test_conductor_worker_migrates_the_configured_database_or_fails_in_one_line(
    dev_env: WorkflowEnvironment, postgres_server: PostgresServer, postgres_url: str, tmp_path: Path
) -> None:
    """The real command in its own process: a database that refuses the password stops it before it
    polls (one line, exit 1, password redacted); the right one is migrated, and the worker polls."""
    address = dev_env.client.service_client.config.target_host
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONDUCTOR_", "TEMPORAL_"))}
    env |= {"TEMPORAL_CONFIG_FILE": str(tmp_path / "none.toml"), "CONDUCTOR_DATA_DIR": str(tmp_path / "data"),
            "CONDUCTOR_FLEET_TOKEN": "fleet-unused", "CONDUCTOR_EXECUTOR_TOKEN": "executor-unused"}  # fmt: skip
    command = [sys.executable, "-c", "from worker.cli import main; main()", "--address", address, "worker"]
    wrong = postgres_url.replace(postgres_server.password, "wrong-password")
    refused = subprocess.run(command, env=env | {DATABASE_URL_ENV: wrong}, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.count("\n") == 1 and refused.stderr.startswith("conductor: cannot open the stores in PostgreSQL")
    assert "password authentication failed" in refused.stderr and "wrong-password" not in refused.stderr
    assert "polling" not in refused.stdout

    worker = subprocess.Popen(command, env=env | {DATABASE_URL_ENV: postgres_url}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        first = await asyncio.wait_for(asyncio.to_thread(worker.stdout.readline), 60)
        assert "polling task queue" in first, first + worker.stderr.read()
        assert postgres_server.password not in first
        with psycopg.connect(postgres_url) as db:
            assert db.execute("SELECT version FROM schema_migrations").fetchall() == [(1,)]
    finally:
        ensure_stopped(worker)
    assert worker.returncode == 0
    assert not (tmp_path / "data" / "ledger.sqlite").exists()
