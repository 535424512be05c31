"""Ledger snapshots in a real SQLite file: numbered, hashed, immutable, idempotent; and the activity."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import uuid
from concurrent.futures import ThreadPoolExecutor
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
from tests.ledger_workflow import LedgerSnapshotWorkflow
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


@pytest.fixture
def store(tmp_path: Path) -> SqliteLedgerStore:
    return SqliteLedgerStore(tmp_path / "ledger" / "snapshots.sqlite3")


def test_write_then_read_latest_history_and_each_snapshot(store: SqliteLedgerStore) -> None:
    assert isinstance(store, LedgerStore)
    spec = make_spec()
    written = ledgers(spec)
    assert [ledger.snapshot_seq for ledger in written] == [1, 2, 3, 4, 5, 6]
    assert store.latest("m-1") is None and store.history("m-1") == []
    refs = [store.write(ledger) for ledger in written]
    assert refs == [SnapshotRef(mission_id="m-1", seq=l.snapshot_seq, content_hash=content_hash(l)) for l in written]
    assert store.history("m-1") == refs
    latest = store.latest("m-1")
    assert latest == written[-1] and latest.parent_state == "completed"
    assert latest.review is not None and latest.review.operator == "alice"
    assert latest.child("child-a").stale_event_revisions == (1,)
    for ledger in written:
        assert store.get("m-1", ledger.snapshot_seq) == ledger
    assert store.get("m-1", 99) is None and store.get("other", 1) is None
    # Missions do not see each other's snapshots.
    other = initial_ledger(make_spec("m-2"))
    store.write(other)
    assert store.latest("m-1") == written[-1] and store.history("m-2") == [store.write(other)]


def test_rewriting_the_same_snapshot_is_a_no_op_even_after_a_restart(store: SqliteLedgerStore) -> None:
    ledger = ledgers(make_spec())[2]
    first = store.write(ledger)
    assert store.write(ledger) == first
    reopened = SqliteLedgerStore(store.path)
    assert reopened.write(MissionLedger.model_validate_json(ledger.model_dump_json())) == first
    assert reopened.history("m-1") == [first]


def test_a_changed_snapshot_is_refused_and_the_stored_one_kept(store: SqliteLedgerStore) -> None:
    ledger = ledgers(make_spec())[2]
    ref = store.write(ledger)
    changed = ledger.model_copy(update={"verdict_reason": "rewritten history"})
    with pytest.raises(ImmutableSnapshotError) as caught:
        store.write(changed)
    message = str(caught.value)
    seq = ledger.snapshot_seq
    assert f"snapshot {seq} of mission m-1 is already stored with content hash {ref.content_hash}" in message
    assert content_hash(changed) in message and "a mission ran under this mission_id before" in message
    assert store.get("m-1", ledger.snapshot_seq) == ledger
    # The changed ledger under the next number is simply a new snapshot.
    store.write(changed.model_copy(update={"snapshot_seq": ledger.snapshot_seq + 1}))
    assert [r.seq for r in store.history("m-1")] == [ledger.snapshot_seq, ledger.snapshot_seq + 1]


def test_concurrent_writers_of_one_seq_store_exactly_one_content(store: SqliteLedgerStore) -> None:
    ledger = ledgers(make_spec())[1]
    variants = [ledger.model_copy(update={"verdict_reason": f"variant {i % 2}"}) for i in range(8)]

    def attempt(candidate: MissionLedger) -> str:
        try:
            return store.write(candidate).content_hash
        except ImmutableSnapshotError:
            return "refused"

    with ThreadPoolExecutor(max_workers=8) as pool:
        outcomes = list(pool.map(attempt, variants))
    stored = store.get("m-1", ledger.snapshot_seq)
    assert stored is not None
    winner = content_hash(stored)
    assert sorted(set(outcomes)) == sorted({winner, "refused"})
    assert outcomes.count(winner) == 4 and outcomes.count("refused") == 4


def test_content_hash_is_sha256_of_canonical_json_and_stable(store: SqliteLedgerStore) -> None:
    ledger = ledgers(make_spec())[-1]
    parsed = json.loads(ledger.model_dump_json())
    independent = json.dumps(parsed, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    expected = hashlib.sha256(independent.encode("utf-8")).hexdigest()
    assert content_hash(ledger) == expected
    assert content_hash(MissionLedger.model_validate_json(ledger.model_dump_json())) == expected
    assert content_hash(ledger) == content_hash(ledgers(make_spec())[-1])  # rebuilt from scratch
    assert content_hash(ledger.model_copy(update={"snapshot_seq": 99})) != expected
    store.write(ledger)
    with sqlite3.connect(store.path) as db:
        text, digest = db.execute("SELECT ledger, content_hash FROM mission_ledger_snapshots").fetchone()
    assert text == independent and digest == expected
    assert text.startswith('{"aggregation":{"completion_eligible":')  # keys sorted, no spaces between tokens
    assert "ünïcödé" in text  # UTF-8 text, not \u escapes


def test_the_database_itself_refuses_changes_and_reads_detect_tampering(store: SqliteLedgerStore) -> None:
    ledger = ledgers(make_spec())[1]
    store.write(ledger)
    with sqlite3.connect(store.path) as db:
        with pytest.raises(sqlite3.DatabaseError, match="immutable"):
            db.execute("UPDATE mission_ledger_snapshots SET parent_state = 'completed'")
        with pytest.raises(sqlite3.DatabaseError, match="immutable"):
            db.execute("DELETE FROM mission_ledger_snapshots")
        # Someone with direct access drops the guard and edits a row: reads must not serve it.
        db.execute("DROP TRIGGER mission_ledger_snapshots_no_update")
        db.execute("UPDATE mission_ledger_snapshots SET ledger = replace(ledger, '\"running\"', '\"completed\"')")
    with pytest.raises(CorruptSnapshotError, match=f"snapshot {ledger.snapshot_seq} of mission m-1 does not match"):
        store.latest("m-1")


def test_ledger_survives_the_pydantic_data_converter() -> None:
    ledger = ledgers(make_spec())[-1]
    converter = pydantic_data_converter.payload_converter
    payloads = converter.to_payloads([ledger])
    (decoded,) = converter.from_payloads(payloads, [MissionLedger])
    assert decoded == ledger and content_hash(decoded) == content_hash(ledger)


async def test_activity_writes_idempotently_and_refuses_changes_non_retryably(store: SqliteLedgerStore) -> None:
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
    assert store.history("m-1") == [ref]


async def test_stored_ledgers_hold_no_bearer_tokens(store: SqliteLedgerStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FLEET_TOKEN_ENV, f"fleet-{uuid.uuid4().hex}")
    monkeypatch.setenv(EXECUTOR_TOKEN_ENV, f"exec-{uuid.uuid4().hex}")
    secrets = [fleet_token().reveal(), executor_token().reveal()]
    activities = LedgerActivities(store)
    for ledger in ledgers(make_spec()):
        await ActivityEnvironment().run(activities.write_ledger_snapshot, ledger)
    stored = store.latest("m-1")
    assert stored is not None
    text = stored.model_dump_json()
    assert find_credential_keys(json.loads(text)) == []
    raw = b"".join(path.read_bytes() for path in store.path.parent.iterdir())  # the database, WAL and index
    for secret in secrets:
        assert secret not in text and secret.encode() not in raw


async def test_a_workflow_in_the_sandbox_writes_snapshots_through_the_activity(
    time_skipping_env: WorkflowEnvironment, store: SqliteLedgerStore
) -> None:
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
    assert store.history(spec.mission_id) == refs
    latest = store.latest(spec.mission_id)
    assert latest is not None and latest.parent_state == "completed" and content_hash(latest) == refs[-1].content_hash
    expected = initial_ledger(spec)
    for obs in observations(spec):
        expected = apply_observation(expected, spec, obs)
    assert latest == expected
