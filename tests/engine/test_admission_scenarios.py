"""One readable scenario per admission rule, against the engine (docs/admission-engine.md).

Each test drives `workflows.admission.engine.apply` through its public operations at
explicit instants and asserts what a caller can see: record states and reasons,
audit events, and snapshots (queue order, effective priority, binding constraint).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from workflows.admission import engine
from workflows.admission.model import (
    AdmissionPolicy,
    AdmissionRecord,
    AdmissionRequest,
    AuditEvent,
    Cancel,
    OpResult,
    PriorityAdmission,
    Reconcile,
    Release,
    Renew,
    SetPolicy,
    Snapshot,
    Submit,
    TakeSnapshot,
)

T0 = datetime(2026, 1, 1, 9, 0, tzinfo=timezone.utc)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def request(
    request_id: str,
    *,
    submitted: float = 0,
    priority: int = 0,
    environment: str = "dev",
    provider: str = "aws",
    runtime: str = "container",
    lane: str | None = None,
    priority_class: str = "P2",
    preemptible: bool = False,
    queue_timeout: float = 3600,
    orchestrator: str = "orch-1",
    gang: tuple[str, int] | None = None,
) -> AdmissionRequest:
    return AdmissionRequest(
        request_id=request_id, orchestrator_id=orchestrator, environment=environment, provider=provider,
        runtime_kind=runtime, priority=priority, submitted_at=at(submitted), queue_timeout_seconds=queue_timeout,
        preemptible=preemptible, lane=lane, priority_class=priority_class,
        gang_id=None if gang is None else gang[0], gang_size=None if gang is None else gang[1],
    )


class HostGroup:
    """Drives one engine state, remembering the clock and every audit event it emitted."""

    def __init__(self, **policy: Any) -> None:
        policy.setdefault("lease_ttl_seconds", 3600)
        self.state = engine.new_state(AdmissionPolicy(**policy))
        self.now = 0.0
        self.events: list[AuditEvent] = []
        self.last_events: list[AuditEvent] = []

    def apply(self, operation: Any, t: float | None = None) -> OpResult:
        if t is not None:
            self.now = t
        self.state, result, events = engine.apply(self.state, operation, at(self.now))
        self.events.extend(events)
        self.last_events = events
        return result

    def submit(self, request_id: str, t: float | None = None, **fields: Any) -> AdmissionRecord:
        if t is not None:
            self.now = t
        fields.setdefault("submitted", self.now)
        result = self.apply(Submit(request=request(request_id, **fields)))
        assert result.ok, result.error
        assert result.record is not None
        return result.record

    def snapshot(self, t: float | None = None) -> Snapshot:
        result = self.apply(TakeSnapshot(), t)
        assert result.snapshot is not None
        return result.snapshot

    def record(self, request_id: str) -> AdmissionRecord:
        return self.snapshot().records[request_id]

    def states(self) -> dict[str, str]:
        return {rid: record.state for rid, record in self.snapshot().records.items()}

    def queue(self) -> list[tuple[str, str]]:
        return [(entry.request_id, entry.binding_constraint) for entry in self.snapshot().queue]

    def admitted(self) -> set[str]:
        return {rid for rid, state in self.states().items() if state == "admitted"}

    def moves(self, events: list[AuditEvent] | None = None) -> list[tuple[str, str | None]]:
        """(event type, request id) of the last operation's events, for compact assertions."""
        return [(event.type, event.request_id) for event in (self.last_events if events is None else events)]


# --- capacity: global and every quota -------------------------------------------------------------


def test_max_concurrent_one_serialises_the_whole_group() -> None:
    group = HostGroup(max_concurrent=1)
    assert group.submit("a").state == "admitted"
    assert group.submit("b").state == "queued"
    assert group.submit("c", environment="prod", provider="gcp", runtime="vm").state == "queued"
    assert group.queue() == [("b", "global 1/1"), ("c", "global 1/1")]

    released = group.apply(Release(request_id="a"), 10)
    assert released.record.state == "released"
    assert group.moves() == [("released", "a"), ("admitted", "b")]
    assert group.admitted() == {"b"}


def test_environment_quota_limits_only_its_environment() -> None:
    group = HostGroup(max_concurrent=10, environment_quotas={"prod": 1})
    group.submit("p1", environment="prod")
    group.submit("p2", environment="prod")
    group.submit("d1", environment="dev")
    group.submit("d2", environment="dev")
    assert group.admitted() == {"p1", "d1", "d2"}
    assert group.queue() == [("p2", "environment prod 1/1")]


def test_provider_quota_limits_only_its_provider() -> None:
    group = HostGroup(max_concurrent=10, provider_quotas={"aws": 2})
    for rid in ("a1", "a2", "a3"):
        group.submit(rid, provider="aws")
    group.submit("g1", provider="gcp")
    assert group.admitted() == {"a1", "a2", "g1"}
    assert group.queue() == [("a3", "provider aws 2/2")]


def test_runtime_tier_quota_limits_only_its_runtime_kind() -> None:
    group = HostGroup(max_concurrent=10, runtime_quotas={"vm": 2})
    for rid in ("v1", "v2", "v3"):
        group.submit(rid, runtime="vm")
    for rid in ("c1", "c2", "c3"):
        group.submit(rid, runtime="container")
    assert group.admitted() == {"v1", "v2", "c1", "c2", "c3"}
    assert group.queue() == [("v3", "runtime vm 2/2")]


def test_lane_wip_limit_limits_only_its_lane() -> None:
    group = HostGroup(max_concurrent=10, lane_wip_limits={"build": 1})
    group.submit("b1", lane="build")
    group.submit("b2", lane="build")
    group.submit("t1", lane="test")  # no WIP limit for this lane
    group.submit("t2", lane="test")
    group.submit("n1")  # no lane at all
    assert group.admitted() == {"b1", "t1", "t2", "n1"}
    assert group.queue() == [("b2", "lane build 1/1")]


def test_host_runtime_is_serialised_by_default() -> None:
    group = HostGroup(max_concurrent=10)
    group.submit("h1", runtime="host")
    group.submit("h2", runtime="host")
    group.submit("c1", runtime="container")
    assert group.admitted() == {"h1", "c1"}
    assert group.queue() == [("h2", "runtime host 1/1")]


def test_default_host_quota_can_be_raised() -> None:
    group = HostGroup(max_concurrent=10, default_host_quota=2)
    for rid in ("h1", "h2", "h3"):
        group.submit(rid, runtime="host")
    assert group.admitted() == {"h1", "h2"}
    assert group.queue() == [("h3", "runtime host 2/2")]


def test_explicit_host_quota_overrides_the_default() -> None:
    group = HostGroup(max_concurrent=10, default_host_quota=1, runtime_quotas={"host": 3})
    for rid in ("h1", "h2", "h3", "h4"):
        group.submit(rid, runtime="host")
    assert group.admitted() == {"h1", "h2", "h3"}
    assert group.queue() == [("h4", "runtime host 3/3")]


def test_binding_constraint_is_the_first_failing_limit_in_capacity_order() -> None:
    group = HostGroup(
        max_concurrent=2, environment_quotas={"prod": 1}, provider_quotas={"aws": 1},
        runtime_quotas={"vm": 1}, lane_wip_limits={"build": 1},
    )
    group.submit("holder", environment="prod", provider="aws", runtime="vm", lane="build")
    group.submit("env", environment="prod", provider="aws", runtime="vm", lane="build")
    group.submit("prov", environment="dev", provider="aws", runtime="vm", lane="build")
    group.submit("rt", environment="dev", provider="gcp", runtime="vm", lane="build")
    group.submit("lane", environment="dev", provider="gcp", runtime="container", lane="build")
    assert group.admitted() == {"holder"}
    assert dict(group.queue()) == {
        "env": "environment prod 1/1", "prov": "provider aws 1/1", "rt": "runtime vm 1/1", "lane": "lane build 1/1",
    }
    group.submit("fits", environment="dev", provider="gcp", runtime="container")
    assert group.admitted() == {"holder", "fits"}
    assert {binding for _rid, binding in group.queue()} == {"global 2/2"}


# --- order: aging, FIFO ties, no head-of-line blocking ---------------------------------------------


def test_aging_lets_an_old_low_priority_request_beat_a_newer_high_priority_one() -> None:
    group = HostGroup(max_concurrent=1, aging_interval_seconds=10)
    group.submit("holder", t=0)
    group.submit("old-low", t=0, priority=0)
    group.submit("new-high", t=50, priority=3)

    snapshot = group.snapshot(t=60)
    # old-low: 0 + 60//10 = 6; new-high: 3 + 10//10 = 4.
    assert [(e.request_id, e.position, e.effective_priority) for e in snapshot.queue] == [
        ("old-low", 1, 6), ("new-high", 2, 4),
    ]
    group.apply(Release(request_id="holder"), 60)
    assert group.moves() == [("released", "holder"), ("admitted", "old-low")]


def test_without_enough_age_the_higher_priority_wins() -> None:
    group = HostGroup(max_concurrent=1, aging_interval_seconds=10)
    group.submit("holder", t=0)
    group.submit("old-low", t=0, priority=0)
    group.submit("new-high", t=5, priority=3)
    # At 29 s: old-low 0 + 2 = 2 < new-high 3 + 2 = 5.
    group.apply(Release(request_id="holder"), 29)
    assert group.moves() == [("released", "holder"), ("admitted", "new-high")]


def test_aging_floors_exactly_at_interval_boundaries() -> None:
    group = HostGroup(max_concurrent=1, aging_interval_seconds=2.5)
    group.submit("holder", t=0)
    group.submit("w", t=0, submitted=0)
    just_before = group.apply(TakeSnapshot(), 0).snapshot  # age 0
    assert just_before.queue[0].effective_priority == 0
    group.now = 4.999999
    assert group.snapshot().queue[0].effective_priority == 1
    group.now = 5
    assert group.snapshot().queue[0].effective_priority == 2


def test_a_submission_time_in_the_future_ages_nothing_rather_than_negatively() -> None:
    group = HostGroup(max_concurrent=1, aging_interval_seconds=10)
    group.submit("holder", t=0)
    group.submit("future", t=0, submitted=100, priority=1)
    group.submit("now", t=0, submitted=0, priority=0)
    assert [(e.request_id, e.effective_priority) for e in group.snapshot().queue] == [("future", 1), ("now", 0)]
    group.apply(Release(request_id="holder"))
    assert group.moves()[-1] == ("admitted", "future")


def test_equal_priority_is_first_come_first_served_then_by_request_id() -> None:
    group = HostGroup(max_concurrent=1)
    group.submit("holder", t=0)
    group.submit("late", t=1, submitted=5)
    group.submit("zeta", t=1, submitted=2)
    group.submit("alpha", t=1, submitted=2)
    assert [rid for rid, _ in group.queue()] == ["alpha", "zeta", "late"]

    for expected in ("alpha", "zeta", "late"):
        holder = next(iter(group.admitted()))
        group.apply(Release(request_id=holder))
        assert group.moves()[-1] == ("admitted", expected)


def test_a_head_that_does_not_fit_does_not_block_one_behind_it_that_does() -> None:
    group = HostGroup(max_concurrent=3, environment_quotas={"prod": 1})
    group.submit("prod-running", environment="prod")
    blocked = group.submit("prod-urgent", environment="prod", priority=9)
    behind = group.submit("dev-low", environment="dev", priority=-5)
    assert blocked.state == "queued"
    assert behind.state == "admitted"
    assert group.queue() == [("prod-urgent", "environment prod 1/1")]


# --- preemption -----------------------------------------------------------------------------------


def test_preemption_replaces_a_preemptible_low_priority_holder() -> None:
    group = HostGroup(max_concurrent=1, allow_preemption=True)
    group.submit("victim", t=0, priority=0, preemptible=True)
    winner = group.submit("urgent", t=5, priority=5)

    assert winner.state == "admitted"
    assert group.moves() == [("queued", "urgent"), ("preempted", "victim"), ("admitted", "urgent")]
    preempted, admitted = group.last_events[1], group.last_events[2]
    assert (preempted.from_state, preempted.to_state) == ("admitted", "preempted")
    assert preempted.reason == "preempted by urgent"
    assert (preempted.related_request_id, preempted.policy) == ("urgent", "preemption")
    assert admitted.reason == "admitted"
    assert (admitted.related_request_id, admitted.policy) == ("victim", "preemption")

    victim = group.record("victim")
    assert victim.state == "preempted"
    assert victim.preempted_by == "urgent"
    assert victim.finished_at == at(5)
    assert victim.reason == "preempted by urgent"


def test_preemption_victim_is_the_weakest_then_latest_submitted_then_highest_id() -> None:
    def contest(victims: list[tuple[str, int, float]]) -> str:
        group = HostGroup(max_concurrent=len(victims), allow_preemption=True, aging_interval_seconds=1e9)
        for rid, priority, submitted in victims:
            group.submit(rid, t=10, priority=priority, submitted=submitted, preemptible=True)
        group.submit("urgent", t=10, priority=9)
        (_, victim), = [move for move in group.moves() if move[0] == "preempted"]
        return victim

    assert contest([("a", 1, 0), ("b", 0, 0), ("c", 2, 0)]) == "b"  # lowest effective priority
    assert contest([("a", 0, 1), ("b", 0, 3), ("c", 0, 2)]) == "b"  # then the latest submitted
    assert contest([("b", 0, 1), ("c", 0, 1), ("a", 0, 1)]) == "c"  # then the highest request id


def test_preemption_uses_effective_priorities_including_aging() -> None:
    group = HostGroup(max_concurrent=1, allow_preemption=True, aging_interval_seconds=10)
    group.submit("aged-holder", t=0, submitted=0, priority=0, preemptible=True)
    # At 100 s the holder's effective priority is 10; a fresh priority-5 request cannot preempt it.
    assert group.submit("fresh", t=100, priority=5).state == "queued"
    assert group.states()["aged-holder"] == "admitted"


def test_preemption_never_touches_non_preemptible_work() -> None:
    group = HostGroup(max_concurrent=1, allow_preemption=True)
    group.submit("steady", priority=0, preemptible=False)
    assert group.submit("urgent", priority=100).state == "queued"
    assert group.moves() == [("queued", "urgent")]
    assert group.admitted() == {"steady"}


@pytest.mark.parametrize("lane_override", [False, True])
def test_preemption_needs_a_gap_larger_than_the_margin(lane_override: bool) -> None:
    group = HostGroup(
        max_concurrent=1, allow_preemption=True, preemption_margin=2,
        priority_admission=PriorityAdmission(enabled=lane_override),
    )
    group.submit("victim", priority=0, preemptible=True)
    assert group.submit("gap-2", priority=2).state == "queued"  # 0 + 2 < 2 is false
    assert group.admitted() == {"victim"}
    assert group.submit("gap-3", priority=3).state == "admitted"  # 0 + 2 < 3
    assert group.states()["victim"] == "preempted"
    assert group.states()["gap-2"] == "queued"


def test_preemption_only_when_removing_the_victim_makes_the_candidate_fit() -> None:
    group = HostGroup(max_concurrent=2, allow_preemption=True, environment_quotas={"prod": 1})
    group.submit("dev-victim", environment="dev", priority=0, preemptible=True)
    group.submit("prod-steady", environment="prod", priority=0, preemptible=False)
    # prod-urgent is bound by the prod quota; preempting the dev request would not free it.
    assert group.submit("prod-urgent", environment="prod", priority=9).state == "queued"
    assert group.admitted() == {"dev-victim", "prod-steady"}
    assert group.queue() == [("prod-urgent", "global 2/2")]


def test_preemption_picks_a_victim_whose_removal_helps_over_a_weaker_one_that_would_not() -> None:
    group = HostGroup(max_concurrent=3, allow_preemption=True, environment_quotas={"prod": 1})
    group.submit("dev-weakest", environment="dev", priority=-5, preemptible=True)
    group.submit("prod-weak", environment="prod", priority=0, preemptible=True)
    group.submit("dev-other", environment="dev", priority=1)
    assert group.submit("prod-urgent", environment="prod", priority=9).state == "admitted"
    assert group.states()["prod-weak"] == "preempted"
    assert group.states()["dev-weakest"] == "admitted"


def test_no_preemption_when_it_is_off() -> None:
    group = HostGroup(max_concurrent=1, allow_preemption=False)
    group.submit("victim", priority=0, preemptible=True)
    assert group.submit("urgent", priority=100).state == "queued"
    assert group.admitted() == {"victim"}


# --- leases ---------------------------------------------------------------------------------------


def test_renewal_keeps_a_lease_alive_and_bumps_its_revision() -> None:
    group = HostGroup(max_concurrent=1, lease_ttl_seconds=60)
    admitted = group.submit("a", t=0)
    assert (admitted.lease_revision, admitted.lease_expires_at) == (1, at(60))

    renewed = group.apply(Renew(request_id="a", lease_revision=1), 50)
    assert renewed.ok
    assert (renewed.record.lease_revision, renewed.record.lease_expires_at) == (2, at(110))
    assert renewed.record.reason == "lease renewed"
    (event,) = group.last_events
    assert (event.type, event.from_state, event.to_state, event.reason) == ("renewed", "admitted", "admitted", "lease renewed")

    group.apply(Reconcile(), 100)  # past the first expiry, before the renewed one
    assert group.states()["a"] == "admitted"
    assert group.apply(Renew(request_id="a"), 105).record.lease_revision == 3  # no revision given: accepted


def test_renewal_with_a_stale_lease_revision_is_refused_and_changes_nothing() -> None:
    group = HostGroup(max_concurrent=1, lease_ttl_seconds=60)
    group.submit("a", t=0)
    group.apply(Renew(request_id="a", lease_revision=1), 10)
    before = group.record("a")

    stale = group.apply(Renew(request_id="a", lease_revision=1), 20)
    assert not stale.ok
    assert stale.error.code == "stale-lease-revision"
    assert stale.record is None
    assert group.last_events == []
    assert group.record("a") == before


def test_lease_expiry_recovers_capacity_for_the_next_request() -> None:
    group = HostGroup(max_concurrent=1, lease_ttl_seconds=60, max_requeue_attempts=0)
    group.submit("a", t=0)
    group.submit("b", t=1)
    group.apply(Reconcile(), 59.999999)
    assert group.last_events == []

    result = group.apply(Reconcile(), 60)
    assert result.ok and result.record is None
    assert group.moves() == [("timed-out", "a"), ("admitted", "b")]
    expired = group.last_events[0]
    assert (expired.from_state, expired.to_state) == ("admitted", "timed-out")
    assert expired.reason == "admission lease expired; capacity recovered"
    a = group.record("a")
    assert (a.state, a.finished_at, a.reason) == ("timed-out", at(60), "admission lease expired; capacity recovered")

    too_late = group.apply(Renew(request_id="a"), 61)
    assert not too_late.ok
    assert too_late.error.code == "not-admitted"
    assert "timed-out" in too_late.error.message


def test_expired_leases_time_out_in_expiry_order() -> None:
    group = HostGroup(max_concurrent=5, lease_ttl_seconds=60, max_requeue_attempts=0)
    group.submit("b", t=0)
    group.submit("a", t=0)
    group.submit("c", t=5)
    group.apply(Reconcile(), 1000)
    assert group.moves() == [("timed-out", "a"), ("timed-out", "b"), ("timed-out", "c")]


def test_renew_of_unknown_or_queued_requests() -> None:
    group = HostGroup(max_concurrent=1)
    group.submit("a")
    group.submit("b")
    unknown = group.apply(Renew(request_id="nobody"))
    assert (unknown.ok, unknown.error.code) == (False, "not-found")
    queued = group.apply(Renew(request_id="b"))
    assert (queued.ok, queued.error.code) == (False, "not-admitted")
    assert "queued" in queued.error.message


# --- queue timeout --------------------------------------------------------------------------------


def test_queue_deadline_times_out_a_request_that_waited_too_long() -> None:
    group = HostGroup(max_concurrent=1)
    group.submit("holder", t=0)
    waiting = group.submit("w", t=10, submitted=5, queue_timeout=30)
    assert waiting.queue_deadline == at(35)

    group.apply(Reconcile(), 34)
    assert group.states()["w"] == "queued"
    group.apply(Reconcile(), 35)
    assert group.moves() == [("timed-out", "w")]
    (event,) = group.last_events
    assert (event.from_state, event.to_state, event.reason) == ("queued", "timed-out", "queue deadline elapsed")
    assert group.record("w").finished_at == at(35)
    assert group.queue() == []


def test_queue_timeout_wins_over_admission_at_the_same_instant() -> None:
    group = HostGroup(max_concurrent=1, lease_ttl_seconds=30, max_requeue_attempts=0)
    group.submit("holder", t=0)
    group.submit("w", t=0, queue_timeout=30)
    group.apply(Reconcile(), 30)  # the lease and the queue deadline end together
    assert group.moves() == [("timed-out", "holder"), ("timed-out", "w")]
    assert group.admitted() == set()


# --- replays and identity -------------------------------------------------------------------------


def test_replaying_a_submit_returns_the_same_record_without_an_event() -> None:
    group = HostGroup(max_concurrent=1)
    first = group.submit("a", t=0)
    replay = group.apply(Submit(request=request("a", submitted=0)), 5)
    assert replay.ok
    assert replay.record == first
    assert group.last_events == []

    # Fields outside the placement identity do not matter to a replay.
    different_priority = group.apply(Submit(request=request("a", submitted=3, priority=7)), 6)
    assert different_priority.record == first
    assert group.last_events == []


def test_replaying_a_terminal_request_returns_it_unchanged() -> None:
    group = HostGroup(max_concurrent=1)
    group.submit("a", t=0)
    released = group.apply(Release(request_id="a"), 1).record
    replay = group.apply(Submit(request=request("a")), 2)
    assert replay.record == released
    assert group.last_events == []


@pytest.mark.parametrize(
    "changed",
    [{"orchestrator": "orch-2"}, {"environment": "prod"}, {"provider": "gcp"}, {"runtime": "vm"}, {"lane": "build"}],
)
def test_same_id_with_another_placement_is_an_identity_collision_and_changes_nothing(changed: dict) -> None:
    group = HostGroup(max_concurrent=1)
    group.submit("a", t=0)
    group.submit("b", t=0)
    before = group.snapshot()

    collision = group.apply(Submit(request=request("a", **changed)), 1)
    assert not collision.ok
    assert collision.error.code == "identity-collision"
    assert collision.record is None
    assert group.last_events == []
    assert group.snapshot() == before


# --- denial ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "fields", "reason"),
    [
        ({"max_concurrent": 0}, {}, "max_concurrent is 0: this request can never run"),
        ({"environment_quotas": {"prod": 0}}, {"environment": "prod"}, "environment quota for prod is 0: this request can never run"),
        ({"provider_quotas": {"aws": 0}}, {"provider": "aws"}, "provider quota for aws is 0: this request can never run"),
        ({"runtime_quotas": {"vm": 0}}, {"runtime": "vm"}, "runtime quota for vm is 0: this request can never run"),
        ({"default_host_quota": 0}, {"runtime": "host"}, "runtime quota for host is 0: this request can never run"),
        ({"lane_wip_limits": {"build": 0}}, {"lane": "build"}, "lane WIP limit for build is 0: this request can never run"),
    ],
)
def test_a_request_that_can_never_run_is_denied_at_once(policy: dict, fields: dict, reason: str) -> None:
    group = HostGroup(**{"max_concurrent": 5, **policy})
    denied = group.submit("a", t=3, **fields)
    assert (denied.state, denied.reason, denied.finished_at, denied.revision) == ("denied", reason, at(3), 1)
    (event,) = group.last_events
    assert (event.type, event.from_state, event.to_state) == ("denied", None, "denied")
    assert (event.reason, event.policy, event.related_request_id) == (reason, "quota", None)


def test_denial_names_the_first_zero_limit_in_capacity_order() -> None:
    group = HostGroup(max_concurrent=5, provider_quotas={"aws": 0}, lane_wip_limits={"build": 0})
    denied = group.submit("a", provider="aws", lane="build")
    assert denied.reason == "provider quota for aws is 0: this request can never run"


def test_zero_quota_elsewhere_does_not_deny() -> None:
    group = HostGroup(max_concurrent=5, environment_quotas={"prod": 0}, lane_wip_limits={"build": 0})
    assert group.submit("a", environment="dev", lane="test").state == "admitted"


def test_lowering_a_quota_to_zero_denies_queued_requests_in_queue_order_and_keeps_running_ones() -> None:
    group = HostGroup(max_concurrent=1, environment_quotas={"prod": 5})
    group.submit("running", t=0, environment="prod")
    group.submit("a-low", t=1, environment="prod", priority=0)
    group.submit("b-high", t=2, environment="prod", priority=5)
    group.submit("dev", t=3, environment="dev", priority=1)

    new_policy = AdmissionPolicy(max_concurrent=1, lease_ttl_seconds=3600, environment_quotas={"prod": 0})
    result = group.apply(SetPolicy(policy=new_policy), 10)
    assert result.ok and result.record is None
    # Queue order (b-high first), not id order.
    assert group.moves() == [("policy-changed", None), ("denied", "b-high"), ("denied", "a-low")]
    changed = group.last_events[0]
    assert (changed.policy, changed.reason, changed.from_state, changed.to_state) == ("set_policy", "policy changed", None, None)
    for event in group.last_events[1:]:
        assert (event.from_state, event.to_state, event.policy) == ("queued", "denied", "quota")
        assert event.reason == "environment quota for prod is 0: this request can never run"

    assert group.states() == {"running": "admitted", "a-low": "denied", "b-high": "denied", "dev": "queued"}
    assert group.record("a-low").finished_at == at(10)


@pytest.mark.skipif("operator" not in SetPolicy.model_fields, reason="SetPolicy has no operator field yet")
def test_policy_change_names_its_operator() -> None:
    group = HostGroup(max_concurrent=1)
    group.apply(SetPolicy(policy=AdmissionPolicy(max_concurrent=2), operator="ops-alice"))
    (event,) = group.last_events
    assert (event.type, event.reason, event.policy, event.request_id) == (
        "policy-changed", "policy changed by ops-alice", "set_policy", None,
    )


def test_lowering_a_limit_below_current_use_revokes_nothing_and_admits_nothing_new_while_over() -> None:
    group = HostGroup(max_concurrent=3)
    for rid in ("a", "b", "c"):
        group.submit(rid, t=0)
    group.submit("d", t=1)
    group.apply(SetPolicy(policy=AdmissionPolicy(max_concurrent=1, lease_ttl_seconds=3600)), 2)
    assert group.admitted() == {"a", "b", "c"}
    assert group.queue() == [("d", "global 3/1")]

    group.apply(Release(request_id="a"), 3)
    group.apply(Release(request_id="b"), 4)
    assert group.admitted() == {"c"}
    group.apply(Release(request_id="c"), 5)
    assert group.moves() == [("released", "c"), ("admitted", "d")]


def test_raising_a_limit_admits_waiting_requests() -> None:
    group = HostGroup(max_concurrent=1)
    group.submit("a")
    group.submit("b")
    group.apply(SetPolicy(policy=AdmissionPolicy(max_concurrent=2, lease_ttl_seconds=3600)))
    assert group.moves() == [("policy-changed", None), ("admitted", "b")]


# --- cancel and release ---------------------------------------------------------------------------


def test_cancel_a_queued_request() -> None:
    group = HostGroup(max_concurrent=1)
    group.submit("a", t=0)
    group.submit("b", t=0)
    cancelled = group.apply(Cancel(request_id="b"), 5).record
    assert (cancelled.state, cancelled.reason, cancelled.finished_at) == ("cancelled", "cancelled by requester", at(5))
    (event,) = group.last_events
    assert (event.type, event.from_state, event.to_state) == ("cancelled", "queued", "cancelled")
    assert group.queue() == []


def test_cancel_an_admitted_request_frees_its_capacity() -> None:
    group = HostGroup(max_concurrent=1)
    group.submit("a", t=0)
    group.submit("b", t=0)
    assert group.apply(Cancel(request_id="a"), 5).record.state == "cancelled"
    assert group.moves() == [("cancelled", "a"), ("admitted", "b")]
    assert group.last_events[0].from_state == "admitted"


def test_release_an_admitted_request() -> None:
    group = HostGroup(max_concurrent=1)
    group.submit("a", t=0)
    released = group.apply(Release(request_id="a"), 7).record
    assert (released.state, released.reason, released.finished_at) == ("released", "released by holder", at(7))
    (event,) = group.last_events
    assert (event.type, event.from_state, event.to_state, event.reason) == (
        "released", "admitted", "released", "released by holder",
    )


def test_release_of_a_queued_request_is_refused() -> None:
    group = HostGroup(max_concurrent=1)
    group.submit("a")
    group.submit("b")
    refused = group.apply(Release(request_id="b"))
    assert (refused.ok, refused.error.code) == (False, "not-admitted")
    assert group.last_events == []
    assert group.states()["b"] == "queued"


@pytest.mark.parametrize("operation", [Release, Cancel])
def test_release_or_cancel_of_a_terminal_request_is_a_no_op(operation: type) -> None:
    group = HostGroup(max_concurrent=1)
    group.submit("a", t=0)
    finished = group.apply(Cancel(request_id="a"), 1).record
    again = group.apply(operation(request_id="a"), 2)
    assert again.ok
    assert again.record == finished
    assert group.last_events == []


@pytest.mark.parametrize("operation", [Release, Cancel, Renew])
def test_operations_on_an_unknown_request_are_not_found(operation: type) -> None:
    group = HostGroup(max_concurrent=1)
    result = group.apply(operation(request_id="ghost"))
    assert (result.ok, result.error.code, result.record) == (False, "not-found", None)


# --- lane priority admission (priority-wip-override-v1) -------------------------------------------

LANE_OVERRIDE = {"max_concurrent": 10, "lane_wip_limits": {"build": 1}}


def test_lane_override_displaces_a_lower_class_claim_which_returns_to_the_queue() -> None:
    group = HostGroup(**LANE_OVERRIDE, priority_admission=PriorityAdmission(enabled=True))
    group.submit("low", t=0, submitted=0, lane="build", priority_class="P3", queue_timeout=100)
    urgent = group.submit("urgent", t=20, lane="build", priority_class="P1")

    assert urgent.state == "admitted"
    assert group.moves() == [("queued", "urgent"), ("displaced", "low"), ("admitted", "urgent")]
    displaced, admitted = group.last_events[1], group.last_events[2]
    reason = "displaced by urgent (priority-wip-override-v1)"
    assert (displaced.from_state, displaced.to_state, displaced.reason) == ("admitted", "queued", reason)
    assert (displaced.related_request_id, displaced.policy) == ("urgent", "priority-wip-override-v1")
    assert (admitted.reason, admitted.related_request_id, admitted.policy) == ("admitted", "low", "priority-wip-override-v1")

    low = group.record("low")
    assert low.state == "queued"
    assert low.reason == reason
    assert low.submitted_at == at(0)  # keeps its place in line
    assert (low.admitted_at, low.lease_expires_at) == (None, None)
    assert low.queue_deadline == at(120)  # displaced_at + queue_timeout
    assert low.lease_revision == 1
    assert group.queue() == [("low", "lane build 1/1")]

    group.apply(Release(request_id="urgent"), 30)
    assert group.moves() == [("released", "urgent"), ("admitted", "low")]
    again = group.record("low")
    assert (again.state, again.admitted_at, again.lease_revision) == ("admitted", at(30), 2)


def test_lane_override_victim_is_the_lowest_class_then_latest_admitted_then_highest_id() -> None:
    def contest(claims: list[tuple[str, str, float]]) -> str:
        group = HostGroup(
            max_concurrent=10, lane_wip_limits={"build": len(claims)},
            priority_admission=PriorityAdmission(enabled=True),
        )
        for rid, priority_class, t in claims:
            group.submit(rid, t=t, lane="build", priority_class=priority_class)
        group.submit("urgent", t=100, lane="build", priority_class="P0")
        (_, victim), = [move for move in group.moves() if move[0] == "displaced"]
        return victim

    assert contest([("a", "P2", 0), ("b", "P3", 0), ("c", "P1", 0)]) == "b"  # lowest class
    assert contest([("a", "P3", 0), ("c", "P3", 1), ("b", "P3", 2)]) == "b"  # then latest admitted
    assert contest([("b", "P3", 0), ("c", "P3", 0), ("a", "P3", 0)]) == "c"  # then highest id


def test_lane_override_only_for_override_classes_and_strictly_lower_victims() -> None:
    group = HostGroup(**LANE_OVERRIDE, priority_admission=PriorityAdmission(enabled=True))
    group.submit("holder", lane="build", priority_class="P1")
    assert group.submit("p2", lane="build", priority_class="P2").state == "queued"  # P2 is not an override class
    assert group.submit("p1", lane="build", priority_class="P1").state == "queued"  # P1 is not lower than P1
    assert group.admitted() == {"holder"}
    assert group.submit("p0", lane="build", priority_class="P0").state == "admitted"
    assert group.states()["holder"] == "queued"


def test_lane_override_honours_custom_override_priorities() -> None:
    group = HostGroup(**LANE_OVERRIDE, priority_admission=PriorityAdmission(enabled=True, override_priorities=["P2"]))
    group.submit("holder", lane="build", priority_class="P3")
    assert group.submit("p0", lane="build", priority_class="P0").state == "queued"
    assert group.submit("p2", lane="build", priority_class="P2").state == "admitted"


def test_lane_override_only_when_the_lane_is_the_binding_constraint() -> None:
    group = HostGroup(
        max_concurrent=1, lane_wip_limits={"build": 1}, priority_admission=PriorityAdmission(enabled=True),
    )
    group.submit("holder", lane="build", priority_class="P3")
    urgent = group.submit("urgent", lane="build", priority_class="P0")
    assert urgent.state == "queued"
    assert group.queue() == [("urgent", "global 1/1")]


def test_lane_override_off_behaves_exactly_as_without_it() -> None:
    def run(**extra: Any) -> tuple[list[AuditEvent], Snapshot]:
        group = HostGroup(**LANE_OVERRIDE, **extra)
        group.submit("low", t=0, lane="build", priority_class="P3")
        group.submit("urgent", t=5, lane="build", priority_class="P0")
        return group.events, group.snapshot(t=6)

    off_events, off_snapshot = run(priority_admission=PriorityAdmission(enabled=False, override_priorities=["P0"]))
    plain_events, plain_snapshot = run()
    assert off_events == plain_events
    assert off_snapshot == plain_snapshot
    assert [(e.request_id, e.binding_constraint) for e in off_snapshot.queue] == [("urgent", "lane build 1/1")]
    assert all(event.type != "displaced" for event in off_events)


# --- retention ------------------------------------------------------------------------------------


def test_terminal_records_are_dropped_after_retention_and_the_id_can_be_reused() -> None:
    group = HostGroup(max_concurrent=1, terminal_retention_seconds=60)
    group.submit("a", t=0)
    group.apply(Release(request_id="a"), 10)

    assert "a" in group.snapshot(t=69.999999).records
    assert "a" not in group.snapshot(t=70).records
    assert group.last_events == []  # dropping is silent

    # The id is free again: even another placement is a new request, not a collision.
    fresh = group.submit("a", t=80, environment="prod")
    assert (fresh.state, fresh.revision, fresh.environment, fresh.lease_revision) == ("admitted", 2, "prod", 1)
    assert group.moves() == [("queued", "a"), ("admitted", "a")]
    assert group.last_events[0].from_state is None
    assert group.apply(Renew(request_id="ghost"), 81).error.code == "not-found"


def test_live_records_are_never_dropped() -> None:
    group = HostGroup(max_concurrent=1, terminal_retention_seconds=0)
    group.submit("a", t=0)
    group.submit("b", t=0)
    assert set(group.snapshot(t=1000).records) == {"a", "b"}


# --- snapshot, audit trail, revisions, clock ------------------------------------------------------


def test_snapshot_shows_queue_positions_effective_priorities_and_binding_constraints() -> None:
    group = HostGroup(max_concurrent=3, environment_quotas={"prod": 1}, aging_interval_seconds=10)
    group.submit("prod-run", t=0, environment="prod")
    group.submit("dev-run", t=0)
    group.submit("dev-run2", t=0)
    group.submit("prod-wait", t=0, environment="prod", priority=1)
    group.submit("dev-wait", t=5, priority=1)
    snapshot = group.snapshot(t=20)
    assert snapshot.revision == len(group.events)
    assert [(e.position, e.request_id, e.effective_priority, e.binding_constraint) for e in snapshot.queue] == [
        (1, "prod-wait", 3, "global 3/3"),
        (2, "dev-wait", 2, "global 3/3"),
    ]
    assert set(snapshot.records) == {"prod-run", "dev-run", "dev-run2", "prod-wait", "dev-wait"}


def test_audit_events_are_numbered_without_gaps_and_stamped_with_the_engine_time() -> None:
    group = HostGroup(max_concurrent=1)
    group.submit("a", t=0)
    group.submit("b", t=1)
    group.apply(Release(request_id="a"), 2)
    assert [event.seq for event in group.events] == [1, 2, 3, 4, 5]
    assert [(event.type, event.request_id, event.at) for event in group.events] == [
        ("queued", "a", at(0)), ("admitted", "a", at(0)), ("queued", "b", at(1)),
        ("released", "a", at(2)), ("admitted", "b", at(2)),
    ]
    first = group.events[0]
    assert (first.from_state, first.to_state, first.reason, first.policy, first.related_request_id) == (
        None, "queued", "queued", None, None,
    )
    second = group.events[1]
    assert (second.from_state, second.to_state, second.reason, second.policy) == ("queued", "admitted", "admitted", None)
    assert group.snapshot().revision == 5


def test_record_revisions_count_their_changes() -> None:
    group = HostGroup(max_concurrent=1, lease_ttl_seconds=60)
    a = group.submit("a", t=0)  # created (1) and admitted (2) by one operation
    b = group.submit("b", t=0)
    assert (a.revision, b.revision) == (2, 1)
    assert group.apply(Renew(request_id="a"), 10).record.revision == 3
    group.apply(Reconcile(), 70)  # a times out (4), b is admitted (2)
    records = group.snapshot().records
    assert (records["a"].revision, records["b"].revision) == (4, 2)


def test_admission_stamps_the_lease() -> None:
    group = HostGroup(max_concurrent=1, lease_ttl_seconds=90)
    group.submit("a", t=0)
    waiting = group.submit("b", t=3, submitted=1, queue_timeout=600)
    assert (waiting.state, waiting.lease_revision, waiting.admitted_at, waiting.queue_deadline) == ("queued", 0, None, at(601))
    group.apply(Release(request_id="a"), 40)
    b = group.record("b")
    assert (b.state, b.reason, b.admitted_at, b.lease_expires_at, b.lease_revision) == ("admitted", "admitted", at(40), at(130), 1)


def test_a_clock_that_goes_backwards_is_clamped() -> None:
    group = HostGroup(max_concurrent=1, lease_ttl_seconds=60)
    group.submit("a", t=100)
    group.submit("b", t=100)
    group.apply(Release(request_id="a"), 50)  # earlier than the last operation
    assert group.moves() == [("released", "a"), ("admitted", "b")]
    assert all(event.at == at(100) for event in group.last_events)
    assert group.record("b").lease_expires_at == at(160)


def test_a_submission_already_past_its_deadline_times_out_rather_than_running() -> None:
    group = HostGroup(max_concurrent=1)
    late = group.submit("late", t=100, submitted=0, queue_timeout=50)
    assert late.state == "timed-out"
    assert group.moves() == [("queued", "late"), ("timed-out", "late")]
