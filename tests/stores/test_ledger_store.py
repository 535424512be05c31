"""Ledger snapshots in real SQLite files and a real PostgreSQL: numbered, hashed, immutable, idempotent;
and the activity. Every store test runs against both back ends (`tests.support.store_backends`)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import Worker

from activities.credentials import EXECUTOR_TOKEN_ENV, FLEET_TOKEN_ENV, executor_token, fleet_token
from activities.ledger_store import (
    IMMUTABLE_SNAPSHOT_ERROR,
    CorruptSnapshotError,
    ImmutableSnapshotError,
    LedgerActivities,
    LedgerStore,
    SqliteLedgerStore,
)
from tests.support.ledger_workflow import LedgerSnapshotWorkflow
from tests.support.store_backends import BACKENDS, Backend, open_backend
from workflows.contract import Artifact, Lineage, find_credential_keys
from workflows.workload.record import fleet_child_id
from workflows.mission.aggregation import apply_admission, apply_observation, apply_review, initial_ledger
from workflows.mission.ledger import ChildAdmission, MissionLedger, ReviewDecision, SnapshotRef, content_hash
from workflows.mission.observation import ChildObservation
from workflows.mission.spec import MissionSpec

T0 = datetime(2026, 8, 2, 15, 0, tzinfo=timezone.utc)
SHA = "b" * 64


def make_spec(mission_id: str = "m-1", mode: str = "manual-review") -> MissionSpec:
    return MissionSpec(
        mission_id=mission_id, orchestrator_id="orch-1", goal="collect and summarise", aggregation={"mode": mode},
        children=[
            {"child_id": "child-a", "kind": "one-shot-command", "prompt": "echo hi", "required_evidence": ["result"]},
            {"child_id": "child-b", "kind": "daemon", "prompt": "serve"},
        ],
    )  # fmt: skip


def lineage(spec: MissionSpec, child_id: str) -> Lineage:
    return Lineage(
        orchestrator_id=spec.orchestrator_id, mission_id=spec.mission_id, dispatch_id=f"d-{child_id}",
        idempotency_key=f"{spec.mission_id}:{child_id}", child_id=fleet_child_id(spec.mission_id, child_id), target_id="host-1",
        executor_id="local", runtime_id=f"rt-{child_id}", task_id=f"task-{child_id}",
    )  # fmt: skip


def observations(spec: MissionSpec) -> list[ChildObservation]:
    return [
        ChildObservation(child_id="child-a", kind="one-shot-command", revision=2, observed_state="running",
                         observed_at=T0, lineage=lineage(spec, "child-a")),
        ChildObservation(child_id="child-b", kind="daemon", revision=3, observed_state="running", health="healthy",
                         observed_at=T0 + timedelta(seconds=5), lineage=lineage(spec, "child-b")),
        ChildObservation(child_id="child-a", kind="one-shot-command", revision=4, observed_state="succeeded",
                         observed_at=T0 + timedelta(seconds=9), lineage=lineage(spec, "child-a"),
                         artifacts=[Artifact(kind="result", uri="file:///results/child-a.txt", sha256=SHA)],
                         exit_classification="success", output="the summary, ünïcödé included"),
    ]  # fmt: skip


def ledgers(spec: MissionSpec) -> list[MissionLedger]:
    """A mission's successive ledgers: admission, observations, a late one, the operator's review."""
    admitted = ChildAdmission(request_id=f"{spec.mission_id}:child-a", state="admitted", lease_revision=1)
    ledger = apply_admission(initial_ledger(spec), "child-a", admitted)
    result = [ledger]
    for obs in observations(spec):
        result.append(ledger := apply_observation(ledger, spec, obs))
    late = ChildObservation(
        child_id="child-a", kind="one-shot-command", revision=1, observed_state="starting", observed_at=T0
    )
    result.append(ledger := apply_observation(ledger, spec, late))
    review = ReviewDecision(
        operator="alice", decision="approve", reason="output read", decided_at=T0 + timedelta(hours=1)
    )
    result.append(apply_review(ledger, spec, review))
    return result


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    async with open_backend(request, request.param, tmp_path) as opened:
        yield opened


async def test_write_then_read_latest_history_and_each_snapshot(backend: Backend) -> None:
    store = backend.ledger
    spec = make_spec()
    written = ledgers(spec)
    assert [ledger.snapshot_seq for ledger in written] == [1, 2, 3, 4, 5, 6]
    assert await store.latest("m-1") is None and await store.history("m-1") == []
    refs = [await store.write(ledger) for ledger in written]
    assert refs == [SnapshotRef(mission_id="m-1", seq=l.snapshot_seq, content_hash=content_hash(l)) for l in written]
    assert await store.history("m-1") == refs
    latest = await store.latest("m-1")
    assert latest == written[-1] and latest.parent_state == "completed"
    assert latest.review is not None and latest.review.operator == "alice"
    assert latest.child("child-a").stale_event_revisions == (1,)
    for ledger in written:
        assert await store.get("m-1", ledger.snapshot_seq) == ledger
    assert await store.get("m-1", 99) is None and await store.get("other", 1) is None
    # Missions do not see each other's snapshots.
    other = initial_ledger(make_spec("m-2"))
    await store.write(other)
    assert await store.latest("m-1") == written[-1] and await store.history("m-2") == [await store.write(other)]


async def test_rewriting_the_same_snapshot_is_a_no_op_even_after_a_restart(backend: Backend) -> None:
    store = backend.ledger
    ledger = ledgers(make_spec())[2]
    first = await store.write(ledger)
    assert await store.write(ledger) == first
    async with backend.another() as reopened:
        assert await reopened.ledger.write(MissionLedger.model_validate_json(ledger.model_dump_json())) == first
        assert await reopened.ledger.history("m-1") == [first]


async def test_a_changed_snapshot_is_refused_and_the_stored_one_kept(backend: Backend) -> None:
    store = backend.ledger
    ledger = ledgers(make_spec())[2]
    ref = await store.write(ledger)
    changed = ledger.model_copy(update={"verdict_reason": "rewritten history"})
    with pytest.raises(ImmutableSnapshotError) as caught:
        await store.write(changed)
    message = str(caught.value)
    seq = ledger.snapshot_seq
    assert f"snapshot {seq} of mission m-1 is already stored with content hash {ref.content_hash}" in message
    assert content_hash(changed) in message and "a mission ran under this mission_id before" in message
    assert (caught.value.stored_hash, caught.value.new_hash) == (ref.content_hash, content_hash(changed))
    assert await store.get("m-1", ledger.snapshot_seq) == ledger
    # The changed ledger under the next number is simply a new snapshot.
    await store.write(changed.model_copy(update={"snapshot_seq": ledger.snapshot_seq + 1}))
    assert [r.seq for r in await store.history("m-1")] == [ledger.snapshot_seq, ledger.snapshot_seq + 1]


async def test_concurrent_writers_of_one_seq_store_exactly_one_content(backend: Backend) -> None:
    store = backend.ledger
    ledger = ledgers(make_spec())[1]
    variants = [ledger.model_copy(update={"verdict_reason": f"variant {i % 2}"}) for i in range(8)]

    async def attempt(candidate: MissionLedger) -> str:
        try:
            return (await store.write(candidate)).content_hash
        except ImmutableSnapshotError:
            return "refused"

    outcomes = await asyncio.gather(*(attempt(variant) for variant in variants))
    stored = await store.get("m-1", ledger.snapshot_seq)
    assert stored is not None
    winner = content_hash(stored)
    assert sorted(set(outcomes)) == sorted({winner, "refused"})
    assert outcomes.count(winner) == 4 and outcomes.count("refused") == 4


async def test_content_hash_is_sha256_of_canonical_json_and_stable(backend: Backend) -> None:
    ledger = ledgers(make_spec())[-1]
    parsed = json.loads(ledger.model_dump_json())
    independent = json.dumps(parsed, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    expected = hashlib.sha256(independent.encode("utf-8")).hexdigest()
    assert content_hash(ledger) == expected
    assert content_hash(MissionLedger.model_validate_json(ledger.model_dump_json())) == expected
    assert content_hash(ledger) == content_hash(ledgers(make_spec())[-1])  # rebuilt from scratch
    assert content_hash(ledger.model_copy(update={"snapshot_seq": 99})) != expected
    await backend.ledger.write(ledger)
    [(text, digest)] = backend.raw("SELECT ledger, content_hash FROM mission_ledger_snapshots")
    assert text == independent and digest == expected
    assert text.startswith('{"aggregation":{"completion_eligible":')  # keys sorted, no spaces between tokens
    assert "ünïcödé" in text  # UTF-8 text, not \u escapes


async def test_the_database_itself_refuses_changes_and_reads_detect_tampering(backend: Backend) -> None:
    ledger = ledgers(make_spec())[1]
    await backend.ledger.write(ledger)
    with pytest.raises(backend.database_error, match="immutable"):
        backend.raw("UPDATE mission_ledger_snapshots SET parent_state = 'completed'")
    with pytest.raises(backend.database_error, match="immutable"):
        backend.raw("DELETE FROM mission_ledger_snapshots")
    if backend.name == "postgres":
        with pytest.raises(backend.database_error, match="immutable"):
            backend.raw("TRUNCATE mission_ledger_snapshots")
    assert await backend.ledger.get("m-1", ledger.snapshot_seq) == ledger
    # Someone with direct access drops the guard and edits a row: reads must not serve it.
    backend.drop_ledger_guard()
    backend.raw("UPDATE mission_ledger_snapshots SET ledger = replace(ledger, '\"running\"', '\"completed\"')")
    with pytest.raises(CorruptSnapshotError, match=f"snapshot {ledger.snapshot_seq} of mission m-1 does not match"):
        await backend.ledger.latest("m-1")


def test_ledger_survives_the_pydantic_data_converter() -> None:
    ledger = ledgers(make_spec())[-1]
    converter = pydantic_data_converter.payload_converter
    payloads = converter.to_payloads([ledger])
    (decoded,) = converter.from_payloads(payloads, [MissionLedger])
    assert decoded == ledger and content_hash(decoded) == content_hash(ledger)


async def test_activity_writes_idempotently_and_refuses_changes_non_retryably(backend: Backend) -> None:
    store = backend.ledger
    activities = LedgerActivities(store)
    env = ActivityEnvironment()
    ledger = ledgers(make_spec())[3]
    ref = await env.run(activities.write_ledger_snapshot, ledger)
    assert ref == SnapshotRef(mission_id="m-1", seq=ledger.snapshot_seq, content_hash=content_hash(ledger))
    assert await env.run(activities.write_ledger_snapshot, ledger) == ref  # a retried activity
    with pytest.raises(ApplicationError) as caught:
        await env.run(activities.write_ledger_snapshot, ledger.model_copy(update={"cancellation": "x"}))
    assert caught.value.type == IMMUTABLE_SNAPSHOT_ERROR == "ledger.immutable_snapshot"
    assert caught.value.non_retryable
    assert "snapshots are immutable" in caught.value.message
    assert await store.history("m-1") == [ref]


async def test_the_activity_takes_a_blocking_store_too(tmp_path: Path) -> None:
    """Code that builds `LedgerActivities(SqliteLedgerStore(...))` directly keeps working (in threads)."""
    store = SqliteLedgerStore(tmp_path / "ledger.sqlite")
    assert isinstance(store, LedgerStore)
    ledger = ledgers(make_spec())[0]
    ref = await ActivityEnvironment().run(LedgerActivities(store).write_ledger_snapshot, ledger)
    assert store.history("m-1") == [ref] and store.latest("m-1") == ledger


async def test_stored_ledgers_hold_no_bearer_tokens(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FLEET_TOKEN_ENV, f"fleet-{uuid.uuid4().hex}")
    monkeypatch.setenv(EXECUTOR_TOKEN_ENV, f"exec-{uuid.uuid4().hex}")
    secrets = [fleet_token().reveal(), executor_token().reveal()]
    activities = LedgerActivities(backend.ledger)
    for ledger in ledgers(make_spec()):
        await ActivityEnvironment().run(activities.write_ledger_snapshot, ledger)
    stored = await backend.ledger.latest("m-1")
    assert stored is not None
    text = stored.model_dump_json()
    assert find_credential_keys(json.loads(text)) == []
    if backend.url is None:
        raw = b"".join(path.read_bytes() for path in backend.data_dir.iterdir())  # the database, WAL and index
    else:
        raw = "\n".join(str(row) for row in backend.raw("SELECT * FROM mission_ledger_snapshots")).encode()
    assert b"child-a" in raw  # the raw text was read
    for secret in secrets:
        assert secret not in text and secret.encode() not in raw


async def test_a_workflow_in_the_sandbox_writes_snapshots_through_the_activity(
    time_skipping_env: WorkflowEnvironment, backend: Backend
) -> None:
    store = backend.ledger
    spec = make_spec(f"m-{uuid.uuid4().hex[:8]}", mode="all-pass")
    task_queue = f"ledger-{uuid.uuid4()}"
    activities = LedgerActivities(store)
    async with Worker(
        time_skipping_env.client, task_queue=task_queue, workflows=[LedgerSnapshotWorkflow],
        activities=[activities.write_ledger_snapshot],
    ):  # fmt: skip
        refs = await time_skipping_env.client.execute_workflow(
            LedgerSnapshotWorkflow.run, args=[spec, observations(spec)], id=f"ledger-{uuid.uuid4()}",
            task_queue=task_queue, result_type=list[SnapshotRef],
        )  # fmt: skip
    assert [ref.seq for ref in refs] == [0, 1, 2, 3]
    assert await store.history(spec.mission_id) == refs
    latest = await store.latest(spec.mission_id)
    assert latest is not None and latest.parent_state == "completed" and content_hash(latest) == refs[-1].content_hash
    expected = initial_ledger(spec)
    for obs in observations(spec):
        expected = apply_observation(expected, spec, obs)
    assert latest == expected
