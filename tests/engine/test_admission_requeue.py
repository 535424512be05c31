"""ADR-004 in the admission engine: bounded requeue after lease expiry and the startup p95 floor.

The rules follow AIWG's reference scheduler (`src/serve/shared-host-scheduler.ts`, its tests
`test/unit/serve/shared-host-scheduler*.test.ts`, ADR-004), read for facts: an expired lease
with attempts left that fits goes back to the queue with a fresh submission time, reason
`lease expired; requeued (attempt n/N)`, at most `max_requeue_attempts` times; a lease TTL
below the measured startup p95 is refused, naming the field to raise.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tests.engine.test_admission_scenarios import HostGroup, at, request
from workflows.admission import codec, engine
from workflows.admission.model import AdmissionPolicy, Reconcile, Release, Renew, SetPolicy, Submit


def test_an_expired_lease_with_attempts_left_is_requeued_and_readmitted_in_the_same_tick() -> None:
    group = HostGroup(max_concurrent=1, lease_ttl_seconds=60)
    group.submit("a", t=0)
    group.apply(Reconcile(), 61)
    assert group.moves() == [("requeued", "a"), ("admitted", "a")]
    requeued = group.last_events[0]
    assert (requeued.from_state, requeued.to_state) == ("admitted", "queued")
    assert requeued.reason == "lease expired; requeued (attempt 1/2)"
    assert requeued.policy == "requeue"
    a = group.record("a")
    assert a.state == "admitted" and a.requeue_attempts == 1
    assert a.submitted_at == at(61)  # a fresh submission time: it ages again from now
    assert a.admitted_at == at(61) and a.lease_expires_at == at(121)
    assert a.lease_revision == 2 and a.finished_at is None


def test_requeue_stops_after_max_requeue_attempts_and_the_request_times_out() -> None:
    group = HostGroup(max_concurrent=1, lease_ttl_seconds=60)
    group.submit("a", t=0)
    group.apply(Reconcile(), 61)
    group.apply(Reconcile(), 122)
    assert group.last_events[0].reason == "lease expired; requeued (attempt 2/2)"
    assert group.record("a").requeue_attempts == 2
    group.apply(Reconcile(), 183)
    assert group.moves() == [("timed-out", "a")]
    a = group.record("a")
    assert (a.state, a.reason, a.requeue_attempts) == ("timed-out", "admission lease expired; capacity recovered", 2)
    assert a.finished_at == at(183)


def test_max_requeue_attempts_zero_keeps_the_old_timed_out_rule() -> None:
    group = HostGroup(max_concurrent=1, lease_ttl_seconds=60, max_requeue_attempts=0)
    group.submit("a", t=0)
    group.apply(Reconcile(), 60)
    assert group.moves() == [("timed-out", "a")]


def test_a_requeued_request_waits_behind_a_stronger_one_for_the_capacity_it_freed() -> None:
    group = HostGroup(max_concurrent=2, provider_quotas={"aws": 1}, lease_ttl_seconds=60)
    group.submit("a", t=0, priority=100)
    group.submit("b", t=0, priority=1000)
    assert group.states() == {"a": "admitted", "b": "queued"}
    group.apply(Reconcile(), 61)
    assert group.moves() == [("requeued", "a"), ("admitted", "b")]
    a = group.record("a")
    assert (a.state, a.reason, a.requeue_attempts) == ("queued", "lease expired; requeued (attempt 1/2)", 1)
    assert a.lease_expires_at is None and a.admitted_at is None and a.finished_at is None
    assert a.queue_deadline == at(61 + 3600)  # the queue timeout runs again from the requeue
    assert group.queue() == [("a", "provider aws 1/1")]


def test_an_expired_lease_that_would_not_fit_even_without_itself_times_out() -> None:
    group = HostGroup(max_concurrent=2, lease_ttl_seconds=60)
    group.submit("a", t=0)
    group.submit("b", t=1)
    group.apply(SetPolicy(policy=AdmissionPolicy(max_concurrent=1, lease_ttl_seconds=60)), 2)
    group.apply(Renew(request_id="b"), 30)
    group.apply(Reconcile(), 60)  # a expires while b still holds the only place left
    assert group.moves() == [("timed-out", "a")]
    assert group.record("a").requeue_attempts == 0


def test_a_stale_lease_revision_from_before_the_requeue_cannot_renew_the_new_lease() -> None:
    group = HostGroup(max_concurrent=1, lease_ttl_seconds=60)
    group.submit("a", t=0)
    group.apply(Reconcile(), 61)
    stale = group.apply(Renew(request_id="a", lease_revision=1), 62)
    assert (stale.ok, stale.error.code) == (False, "stale-lease-revision")
    assert group.apply(Renew(request_id="a", lease_revision=2), 63).ok


def test_a_replay_of_a_requeued_request_returns_it_unchanged() -> None:
    group = HostGroup(max_concurrent=2, provider_quotas={"aws": 1}, lease_ttl_seconds=60)
    group.submit("a", t=0, priority=100)
    group.submit("b", t=0, priority=1000)
    group.apply(Reconcile(), 61)
    replay = group.apply(Submit(request=request("a", priority=100)), 62)
    assert replay.ok and group.last_events == []
    assert replay.record.reason == "lease expired; requeued (attempt 1/2)"


def test_the_requeue_count_survives_the_carried_state_of_continue_as_new() -> None:
    group = HostGroup(max_concurrent=2, provider_quotas={"aws": 1}, lease_ttl_seconds=60)
    group.submit("a", t=0, priority=100)
    group.submit("b", t=0, priority=1000)
    group.apply(Reconcile(), 61)
    restored = codec.decode(codec.encode(group.state))
    assert engine.snapshot(restored) == engine.snapshot(group.state)
    assert restored.records["a"].requeue_attempts == 1
    # And it goes on counting from there: b leaves, a runs, a expires again (attempt 2/2).
    restored, _, events = engine.apply(restored, Release(request_id="b"), at(62))
    assert [(event.type, event.request_id) for event in events] == [("released", "b"), ("admitted", "a")]
    restored, _, events = engine.apply(restored, Reconcile(), at(122))
    assert [(event.type, event.reason) for event in events] == [
        ("requeued", "lease expired; requeued (attempt 2/2)"), ("admitted", "admitted"),
    ]


def test_a_lease_shorter_than_the_startup_p95_is_refused_naming_the_field_to_raise() -> None:
    with pytest.raises(ValidationError) as refused:
        AdmissionPolicy(max_concurrent=1, lease_ttl_seconds=60, startup_p95_seconds=120)
    message = str(refused.value)
    assert "lease_ttl_seconds (60 s) is shorter than startup_p95_seconds (120 s)" in message
    assert "raise lease_ttl_seconds to at least 120" in message
    assert AdmissionPolicy(max_concurrent=1, lease_ttl_seconds=120, startup_p95_seconds=120).startup_p95_seconds == 120


@pytest.mark.parametrize("value", [-1, 1.5])
def test_max_requeue_attempts_is_a_whole_number_at_least_zero(value: float) -> None:
    with pytest.raises(ValidationError, match="max_requeue_attempts"):
        AdmissionPolicy(max_concurrent=1, max_requeue_attempts=value)
