"""The append-only admission audit store, against SQLite and PostgreSQL (`tests.support.store_backends`):
`(host_group, chain, seq)` stored once however often an export is retried, in order, never changed."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from activities.audit_store import AuditActivities
from tests.support.store_backends import BACKENDS, Backend, open_backend
from workflows.admission.model import AuditEvent
from workflows.audit import AuditExport

T0 = datetime(2026, 8, 2, 15, 0, tzinfo=timezone.utc)


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    async with open_backend(request, request.param, tmp_path) as opened:
        yield opened


def event(seq: int, request_id: str | None = None, **fields: object) -> AuditEvent:
    defaults: dict[str, object] = {"type": "queued", "to_state": "queued"} if request_id else {"type": "policy-changed"}
    return AuditEvent(seq=seq, at=T0 + timedelta(seconds=seq), request_id=request_id, **{**defaults, **fields})


def export(seqs, host_group: str = "hg-1", chain: str = "run-1") -> AuditExport:
    return AuditExport(host_group=host_group, chain=chain, events=[event(s, f"r-{s % 3}") for s in seqs])


async def test_append_counts_new_events_and_reads_them_back_in_order(backend: Backend) -> None:
    store = backend.audit
    assert await store.events("hg-1") == []
    assert await store.append(export([3, 1, 2])) == 3
    assert await store.append(export([1, 2, 3])) == 0  # a retried export
    assert await store.append(export([3, 4, 5])) == 2  # overlapping: only the new ones count
    stored = await store.events("hg-1")
    assert [e.seq for e in stored] == [1, 2, 3, 4, 5]
    assert stored[0] == event(1, "r-1")  # every field comes back, the time zone-aware instant included
    assert [e.seq for e in await store.events("hg-1", "r-1")] == [1, 4]
    assert await store.events("hg-1", "nobody") == []
    assert await store.append(AuditExport(host_group="hg-1", chain="run-1", events=[])) == 0


async def test_chains_and_host_groups_are_separate_keys(backend: Backend) -> None:
    store = backend.audit
    # A re-created admission workflow starts a new chain at seq 1: it must not collide with the old one.
    assert await store.append(export([1, 2], chain="run-b")) == 2
    assert await store.append(export([1, 2], chain="run-a")) == 2
    assert await store.append(export([1], host_group="hg-2")) == 1
    assert [(e.seq) for e in await store.events("hg-1")] == [1, 2, 1, 2]  # chain run-a first, then run-b
    assert len(await store.events("hg-2")) == 1 and await store.events("hg-3") == []


async def test_a_seq_twice_in_one_batch_is_stored_once_the_first_kept(backend: Backend) -> None:
    first, second = event(7, "r-1", reason="first"), event(7, "r-1", reason="second")
    assert await backend.audit.append(AuditExport(host_group="hg-1", chain="c", events=[first, second])) == 1
    assert await backend.audit.events("hg-1") == [first]


async def test_the_database_refuses_to_change_or_delete_audit_rows(backend: Backend) -> None:
    await backend.audit.append(export([1, 2]))
    with pytest.raises(backend.database_error, match="immutable"):
        backend.raw("UPDATE admission_audit SET type = 'denied'", database="audit")
    with pytest.raises(backend.database_error, match="immutable"):
        backend.raw("DELETE FROM admission_audit", database="audit")
    if backend.name == "postgres":
        with pytest.raises(backend.database_error, match="immutable"):
            backend.raw("TRUNCATE admission_audit", database="audit")
    assert [e.seq for e in await backend.audit.events("hg-1")] == [1, 2]


async def test_concurrent_overlapping_exports_store_each_event_exactly_once(backend: Backend) -> None:
    """Retries racing each other: batches overlap and arrive in every order, from two sets of stores
    (for PostgreSQL, two connection pools: two workers on two hosts)."""
    rng = random.Random(13)
    batches = []
    for _ in range(24):
        start = rng.randrange(0, 80)
        seqs = list(range(start, start + rng.randrange(1, 30)))
        rng.shuffle(seqs)
        batches.append(seqs)
    async with backend.another() as other:
        stores = [backend.audit, other.audit]
        counts = await asyncio.gather(*(stores[i % 2].append(export(seqs)) for i, seqs in enumerate(batches)))
    distinct = sorted({seq for seqs in batches for seq in seqs})
    assert sum(counts) == len(distinct)
    assert [e.seq for e in await backend.audit.events("hg-1")] == distinct


async def test_the_activity_appends_through_the_store(backend: Backend) -> None:
    activities = AuditActivities(backend.audit)
    env = ActivityEnvironment()
    assert await env.run(activities.export_audit_events, export([1, 2])) == 2
    assert await env.run(activities.export_audit_events, export([1, 2])) == 0  # a retried activity
    assert [e.seq for e in await backend.audit.events("hg-1")] == [1, 2]
