"""Random traces through the admission engine and the naive reference, step by step.

The engine is built for 100,000 queued requests (class partitions, buckets, heaps with
lazy deletion); `tests/support/admission_reference.py` re-sorts everything on every decision.
Both must give the same results, the same audit events and the same state after every
operation, and the engine's output must keep the invariants the spec promises whatever
the trace: quotas (no new admission while over a limit), revisions, gapless event
numbers, terminal records that never change, non-preemptible work never preempted.
Later rules get their own trace families and invariants: ADR-004 bounded requeue (never
more requeues than the policy allows), gangs (no gang ever partly held; a waiting gang
that would fit is never left waiting, so two gangs never deadlock) and fair share (equal
effective priority is ordered by held leases per weight, computed here independently).
The lease rules follow AIWG's reference scheduler (`src/serve/shared-host-scheduler.ts`
and its `test/unit/serve/` tests, ADR-004), read for facts only.

Traces use a handful of request ids so replays and identity collisions happen, small
quotas including 0, clocks that mostly step by seconds but sometimes jump past lease TTLs
and queue timeouts (and occasionally go backwards, which the engine clamps).
"""

from __future__ import annotations

import copy
import os
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import admission_reference as reference
from workflows.admission import engine
from workflows.admission.model import (
    TERMINAL_STATES,
    AdmissionPolicy,
    FairShare,
    AdmissionRequest,
    AuditEvent,
    Cancel,
    Extend,
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

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
# Few ids so replays and collisions happen; contended traces need more live requests at once.
IDS = ["r1", "r2", "r3", "r4", "r5"]
MORE_IDS = IDS + ["r6", "r7", "r8", "r9", "r10"]
ENVIRONMENTS = ["dev", "prod"]
PROVIDERS = ["aws", "gcp"]
RUNTIMES = ["host", "container", "vm"]
LANES = [None, "build", "build", "test"]
CLASSES = ["P0", "P1", "P2", "P3"]

# --- strategies -----------------------------------------------------------------------------------


def quota_maps(keys: list[Any], quota: st.SearchStrategy[int]) -> st.SearchStrategy[dict]:
    return st.dictionaries(st.sampled_from(keys), quota, max_size=len(keys))


def priority_admissions(enabled: st.SearchStrategy[bool]) -> st.SearchStrategy[PriorityAdmission]:
    return st.builds(
        PriorityAdmission,
        enabled=enabled,
        override_priorities=st.one_of(
            st.just(["P0", "P1"]), st.lists(st.sampled_from(CLASSES), unique=True, max_size=3),
        ),
    )


# Zero is rare per limit: a request has up to five limits and any zero one denies it.
mixed_quota = st.sampled_from([0, 1, 1, 1, 2, 2, 2, 3, 3, 4])
busy_quota = st.sampled_from([1, 1, 2, 2, 3])


def fair_share_of(weight: st.SearchStrategy[int], default_weight: st.SearchStrategy[int]) -> st.SearchStrategy:
    return st.builds(
        FairShare, weights=st.dictionaries(st.sampled_from(["o1", "o2", "o3"]), weight, max_size=3),
        default_weight=default_weight,
    )


requeue_limits = st.sampled_from([0, 1, 2, 2, 3])
fair_shares = st.one_of(st.none(), st.none(), fair_share_of(st.integers(1, 3), st.integers(1, 3)))


def policy_family(**fields: st.SearchStrategy) -> st.SearchStrategy[AdmissionPolicy]:
    """A family of policies; every family varies the later rules (ADR-004 bounded requeue, fair
    share) unless it draws them itself."""
    return st.builds(AdmissionPolicy, **{"max_requeue_attempts": requeue_limits, "fair_share": fair_shares, **fields})


# Everything varies, quotas include 0, leases and queue timeouts are short.
mixed_policies = policy_family(
    max_concurrent=st.sampled_from([0, 1, 2, 3, 3, 4, 4, 5, 6, 6]),
    lease_ttl_seconds=st.sampled_from([2.5, 30, 120, 600]),
    aging_interval_seconds=st.sampled_from([1, 2.5, 10, 60, 1e6]),
    allow_preemption=st.booleans(),
    preemption_margin=st.integers(0, 2),
    environment_quotas=quota_maps(ENVIRONMENTS, mixed_quota),
    provider_quotas=quota_maps(PROVIDERS, mixed_quota),
    runtime_quotas=quota_maps(RUNTIMES, mixed_quota),
    default_host_quota=st.sampled_from([0, 1, 1, 1, 2, 2]),
    lane_wip_limits=st.one_of(
        quota_maps(["build", "test"], mixed_quota), st.fixed_dictionaries({"build": st.sampled_from([1, 2])}),
    ),
    priority_admission=priority_admissions(st.sampled_from([True, True, False])),
    terminal_retention_seconds=st.sampled_from([0, 10, 100, 86400, 86400]),
)

# Room everywhere but in the `build` lane, lane override mostly on: displacement territory.
lane_policies = policy_family(
    max_concurrent=st.sampled_from([4, 10]),
    lease_ttl_seconds=st.sampled_from([60, 600]),
    aging_interval_seconds=st.sampled_from([1, 10, 1e6]),
    allow_preemption=st.booleans(),
    preemption_margin=st.integers(0, 2),
    runtime_quotas=st.just({"host": 2}),
    lane_wip_limits=st.fixed_dictionaries({"build": st.sampled_from([1, 2])}, optional={"test": busy_quota}),
    priority_admission=priority_admissions(st.sampled_from([True, True, True, False])),
    terminal_retention_seconds=st.sampled_from([0, 100, 86400]),
)

# A small global limit, sometimes a narrower quota, preemption mostly on: victims to choose from,
# often equally weak so the (submitted_at, request_id) tie-breaks decide.
preemption_policies = policy_family(
    max_concurrent=st.sampled_from([1, 2, 2, 3]),
    lease_ttl_seconds=st.sampled_from([60, 600]),
    aging_interval_seconds=st.sampled_from([30, 1e6, 1e6]),
    allow_preemption=st.sampled_from([True, True, True, False]),
    preemption_margin=st.integers(0, 2),
    environment_quotas=st.one_of(st.just({}), quota_maps(ENVIRONMENTS, busy_quota)),
    provider_quotas=st.one_of(st.just({}), quota_maps(PROVIDERS, busy_quota)),
    runtime_quotas=st.sampled_from([{"host": 3}, {"host": 3, "vm": 1}, {}]),
    priority_admission=priority_admissions(st.booleans()),
    terminal_retention_seconds=st.sampled_from([0, 86400]),
)

# Gangs competing for a small group: tight global and host limits, leases that expire
# (requeues of whole gangs), preemptible gangs and singles.
gang_policies = policy_family(
    max_concurrent=st.sampled_from([2, 3, 3, 4, 5]),
    lease_ttl_seconds=st.sampled_from([20, 60, 600]),
    aging_interval_seconds=st.sampled_from([10, 1e6]),
    allow_preemption=st.booleans(),
    preemption_margin=st.integers(0, 1),
    environment_quotas=st.one_of(st.just({}), quota_maps(ENVIRONMENTS, busy_quota)),
    runtime_quotas=st.sampled_from([{"host": 2}, {"host": 1, "vm": 2}, {}]),
    lane_wip_limits=st.sampled_from([{}, {"build": 1}, {"build": 2}]),
    priority_admission=priority_admissions(st.booleans()),
    terminal_retention_seconds=st.sampled_from([0, 86400]),
)

# Three orchestrators flooding a group with equal priorities: fair share decides most admissions.
fair_policies = policy_family(
    max_concurrent=st.sampled_from([1, 2, 3, 4]),
    lease_ttl_seconds=st.sampled_from([30, 600]),
    aging_interval_seconds=st.sampled_from([5, 1e6, 1e6]),
    allow_preemption=st.booleans(),
    runtime_quotas=st.sampled_from([{"host": 2}, {}]),
    terminal_retention_seconds=st.sampled_from([0, 86400]),
    fair_share=fair_share_of(st.integers(1, 4), st.integers(1, 2)),
)


# Amounts of three resources (one the group may not offer), short and unknown durations, holds,
# preemption, and a reservation depth that is sometimes too small to protect everyone.
RESOURCE_NAMES = ["gpu", "mem", "tpu"]
amount_policies = policy_family(
    max_concurrent=st.sampled_from([2, 4, 6, 10]),
    lease_ttl_seconds=st.sampled_from([60, 600]),
    aging_interval_seconds=st.sampled_from([30, 1e6, 1e6]),
    allow_preemption=st.booleans(),
    preemption_margin=st.integers(0, 1),
    runtime_quotas=st.sampled_from([{"host": 4}, {"host": 1}, {}]),
    environment_quotas=st.one_of(st.just({}), quota_maps(ENVIRONMENTS, busy_quota)),
    resource_capacity=st.fixed_dictionaries(
        {"gpu": st.sampled_from([0, 2, 4, 4])}, optional={"mem": st.sampled_from([1.5, 8])},
    ),
    reservation_depth=st.sampled_from([0, 1, 100, 100]),
    hold=st.sampled_from([False, False, False, True]),
    hold_reason=st.sampled_from([None, "kernel upgrade"]),
    terminal_retention_seconds=st.sampled_from([0, 86400]),
)
resource_maps = st.dictionaries(
    st.sampled_from(RESOURCE_NAMES), st.sampled_from([0.5, 1, 1, 2, 2, 3, 4, 5]), max_size=2,
).filter(lambda amounts: "tpu" not in amounts or len(amounts) == 1)
durations = st.sampled_from([None, None, 5, 20, 20, 60, 300])


@dataclass(frozen=True)
class Profile:
    """What one family of traces looks like."""

    ids: list[str]
    policies: st.SearchStrategy[AdmissionPolicy]
    runtimes: list[str]
    lanes: list[str | None]
    priorities: st.SearchStrategy[int]
    submitted_grid: int  # submission times are rounded down to this many seconds (ties)
    submitted_back: list[int]  # seconds before the (rounded) clock; negative: in the future
    queue_timeouts: list[float]
    preemptible: list[bool]
    classes: list[str]
    time_step: st.SearchStrategy[int]
    length: st.SearchStrategy[int]
    orchestrators: tuple[str, ...] = ("o1", "o2")
    gangs: bool = False  # ids draw a gang (id and size) as part of their identity
    amounts: bool = False  # ids draw amounts of resources (part of their identity) and durations


def weighted(*choices: tuple[int, st.SearchStrategy]) -> st.SearchStrategy:
    """Pick a strategy by weight (repeating a branch in st.one_of does not weight it)."""
    return st.sampled_from([strategy for weight, strategy in choices for _ in range(weight)]).flatmap(lambda s: s)


JUMPS = st.sampled_from([31, 61, 130, 700, 100_000])  # past lease TTLs, queue timeouts, retention
BACKWARDS = st.integers(-3, -1)  # a clock going backwards: clamped by the engine
CALM_STEPS = weighted((40, st.integers(0, 4)), (1, JUMPS), (1, BACKWARDS))

MIXED = Profile(
    ids=IDS, policies=mixed_policies, runtimes=RUNTIMES, lanes=LANES, priorities=st.integers(-2, 5),
    submitted_grid=1, submitted_back=[0, 0, 1, 5, 30, 90, -2], queue_timeouts=[3, 20, 60, 600],
    preemptible=[True, False], classes=CLASSES,
    time_step=weighted((10, st.integers(0, 3)), (8, st.integers(0, 10)), (2, JUMPS), (1, BACKWARDS)),
    length=st.integers(1, 40),
)
LANE_CONTENTION = Profile(
    ids=MORE_IDS, policies=lane_policies, runtimes=["container", "container", "vm", "host"],
    lanes=[None, "build", "build", "build", "test"], priorities=st.integers(-2, 5),
    submitted_grid=10, submitted_back=[0, 0, 1, 5, 30, 90, -2], queue_timeouts=[60, 600],
    # Many P3 claims, so the lane victim is often decided by admitted_at and request_id.
    preemptible=[True, False], classes=["P0", "P1", "P2", "P3", "P3", "P3"], time_step=CALM_STEPS,
    length=st.integers(15, 40),
)
GANG_CONTENTION = Profile(
    ids=MORE_IDS, policies=gang_policies, runtimes=["container", "container", "vm", "host"],
    lanes=[None, None, "build"], priorities=st.sampled_from([0, 0, 1, 3]),
    submitted_grid=10, submitted_back=[0, 0, 5, 30, -10], queue_timeouts=[60, 600],
    preemptible=[True, True, False], classes=CLASSES, time_step=CALM_STEPS, length=st.integers(15, 45),
    orchestrators=("o1", "o2", "o3"), gangs=True,
)
FAIR_SHARE = Profile(
    ids=MORE_IDS, policies=fair_policies, runtimes=["container", "container", "host"],
    lanes=[None], priorities=st.sampled_from([0, 0, 0, 1]),
    submitted_grid=30, submitted_back=[0, 0, 0, 30, 60], queue_timeouts=[600],
    preemptible=[False, True], classes=["P2"], time_step=CALM_STEPS, length=st.integers(15, 45),
    orchestrators=("o1", "o2", "o3"), gangs=False,
)
AMOUNTS = Profile(
    ids=MORE_IDS, policies=amount_policies, runtimes=["container", "container", "host"],
    lanes=[None], priorities=st.sampled_from([0, 0, 0, 1, 5]),
    submitted_grid=10, submitted_back=[0, 0, 0, 10, -10], queue_timeouts=[60, 600, 600],
    preemptible=[True, False], classes=["P2"], time_step=CALM_STEPS, length=st.integers(15, 45),
    orchestrators=("o1", "o2", "o3"), gangs=True, amounts=True,
)
PREEMPTION_CONTENTION = Profile(
    ids=MORE_IDS, policies=preemption_policies, runtimes=["container", "container", "vm", "host"],
    lanes=[None, "build"], priorities=st.sampled_from([0, 0, 0, 1, 5]),
    submitted_grid=60, submitted_back=[0, 0, 0, 0, 60, -60], queue_timeouts=[60, 600],
    preemptible=[True, True, False], classes=CLASSES, time_step=CALM_STEPS, length=st.integers(15, 40),
)

def set_policies(policies: st.SearchStrategy[AdmissionPolicy]) -> st.SearchStrategy[SetPolicy]:
    # The optional operator named in the audit reason; a drain (only a holding policy drains).
    return st.builds(SetPolicy, policy=policies, operator=st.sampled_from([None, "", "ops-alice"]), drain=st.booleans())


# How often each operation appears in a trace (by repetition).
OP_MIX = ["submit"] * 8 + ["renew"] * 4 + ["extend"] * 3 + ["release"] * 2 + ["cancel"] * 2 + ["reconcile", "snapshot", "set_policy"]


@st.composite
def traces(draw: Callable, profile: Profile) -> tuple[AdmissionPolicy, list[tuple[int, Any]]]:
    """A policy and a list of (seconds to advance, operation)."""
    identity = st.tuples(
        st.sampled_from(list(profile.orchestrators)), st.sampled_from(ENVIRONMENTS), st.sampled_from(PROVIDERS),
        st.sampled_from(profile.runtimes), st.sampled_from(profile.lanes),
    )
    canonical = {rid: draw(identity) for rid in profile.ids}
    amounts = {rid: draw(resource_maps) if profile.amounts else {} for rid in profile.ids}
    # Gangs: each id belongs to no gang or to g1/g2 (of a fixed orchestrator each, so members meet);
    # sizes are per gang, and a member sometimes names another size (gang-mismatch).
    gang_size = {"g1": draw(st.integers(1, 3)), "g2": draw(st.integers(2, 3))}
    gang_orchestrator = {"g1": "o1", "g2": "o2"}
    membership = {
        rid: draw(st.sampled_from([None, "g1", "g1", "g2", "g2"])) if profile.gangs else None for rid in profile.ids
    }

    @st.composite
    def submit(draw2: Callable, clock: int) -> Submit:
        rid = draw2(st.sampled_from(profile.ids))
        # Mostly the id's own placement (replays), sometimes another one (collisions).
        orch, env, prov, kind, lane = canonical[rid] if draw2(st.integers(0, 3)) else draw2(identity)
        gang: dict[str, Any] = {}
        if profile.amounts:
            gang["resources"] = amounts[rid] if draw2(st.integers(0, 5)) else draw2(resource_maps)
            gang["expected_duration_seconds"] = draw2(durations)
        if membership[rid] is not None:
            gang_id = membership[rid]
            orch = gang_orchestrator[gang_id]
            size = gang_size[gang_id] if draw2(st.integers(0, 9)) else draw2(st.integers(1, 3))
            gang = {"gang_id": gang_id, "gang_size": size}
        # Submission times near the clock: ties (FIFO by id), age (aging), the future (no aging).
        submitted = clock - clock % profile.submitted_grid - draw2(st.sampled_from(profile.submitted_back))
        return Submit(request=AdmissionRequest(
            request_id=rid, orchestrator_id=orch, environment=env, provider=prov, runtime_kind=kind, lane=lane,
            priority=draw2(profile.priorities),
            submitted_at=T0 + timedelta(seconds=submitted),
            queue_timeout_seconds=draw2(st.sampled_from(profile.queue_timeouts)),
            preemptible=draw2(st.sampled_from(profile.preemptible)),
            priority_class=draw2(st.sampled_from(profile.classes)),
            **gang,
        ))

    policy = draw(profile.policies)
    steps: list[tuple[int, Any]] = []
    clock = 0
    for _ in range(draw(profile.length)):
        delta = draw(profile.time_step)
        clock = max(clock, clock + delta)  # where the engine's clamped clock will be
        rid = st.sampled_from(profile.ids)
        operation = draw({
            "submit": submit(clock),
            "renew": st.builds(Renew, request_id=rid, lease_revision=st.one_of(st.none(), st.integers(0, 3))),
            # A requester renewal: some of the ids, as of a moment near the clock (sometimes one a
            # lease outlived, sometimes the future, which the engine clamps to now).
            "extend": st.builds(Extend, renewals=st.dictionaries(
                rid, st.sampled_from([0, 0, 1, 3, 20, 70, -2]).map(lambda back: T0 + timedelta(seconds=clock - back)),
                max_size=4,
            )),
            "release": st.builds(Release, request_id=rid),
            "cancel": st.builds(Cancel, request_id=rid),
            "reconcile": st.just(Reconcile()),
            "snapshot": st.just(TakeSnapshot()),
            "set_policy": set_policies(profile.policies),
        }[draw(st.sampled_from(OP_MIX))])
        steps.append((delta, operation))
    return policy, steps


# --- invariants -----------------------------------------------------------------------------------


def limits_of(policy: AdmissionPolicy, r: AdmissionRequest) -> list[tuple[str, int, Callable[[AdmissionRequest], bool]]]:
    """Every limit that applies to r, written out independently of both implementations."""
    out = [("global", policy.max_concurrent, lambda a: True)]
    if r.environment in policy.environment_quotas:
        out.append((f"environment {r.environment}", policy.environment_quotas[r.environment],
                    lambda a: a.environment == r.environment))
    if r.provider in policy.provider_quotas:
        out.append((f"provider {r.provider}", policy.provider_quotas[r.provider], lambda a: a.provider == r.provider))
    runtime = policy.runtime_quotas.get(r.runtime_kind, policy.default_host_quota if r.runtime_kind == "host" else None)
    if runtime is not None:
        out.append((f"runtime {r.runtime_kind}", runtime, lambda a: a.runtime_kind == r.runtime_kind))
    if r.lane is not None and r.lane in policy.lane_wip_limits:
        out.append((f"lane {r.lane}", policy.lane_wip_limits[r.lane], lambda a: a.lane == r.lane))
    return out


def over_limits(policy: AdmissionPolicy, r: AdmissionRequest, running: list[AdmissionRequest]) -> list[str]:
    over = [
        f"{name} {used}/{limit}"
        for name, limit, counts in limits_of(policy, r)
        if (used := sum(1 for a in running if counts(a))) > limit
    ]
    # Amounts, in thousandths: used + asked <= capacity for every resource the request names.
    for name in r.resources:
        used = sum(round(a.resources.get(name, 0) * 1000) for a in running)
        if used > round(policy.resource_capacity.get(name, -1) * 1000):
            over.append(f"resource {name} {used / 1000}/{policy.resource_capacity.get(name)}")
    return over


class Observer:
    """Replays the engine's events and snapshots and checks what must always hold."""

    def __init__(self, policy: AdmissionPolicy) -> None:
        self.policy = policy
        self.policy_ever_changed = False
        self.seq = 0
        self.requests: dict[str, AdmissionRequest] = {}  # id -> request of its live record
        self.states: dict[str, str] = {}  # id -> state, from the events
        self.records: dict[str, Any] = {}  # id -> record, from the last snapshot

    def running(self) -> list[AdmissionRequest]:
        return [self.requests[rid] for rid, s in self.states.items() if s == "admitted"]

    def step(self, operation: Any, result: OpResult, events: list[AuditEvent], snap: Snapshot) -> None:
        per_id: Counter[str] = Counter()
        created: set[str] = set()
        for event in events:
            self.seq += 1
            assert event.seq == self.seq, f"event numbers must be 1..N without gaps: {event}"
            if event.type == "policy-changed":
                assert isinstance(operation, SetPolicy) and event.request_id is None
                self.policy, self.policy_ever_changed = operation.policy, True
                continue
            rid = event.request_id
            assert rid is not None
            if event.from_state is None:  # a new record: only a Submit of that id creates one
                assert isinstance(operation, Submit) and operation.request.request_id == rid, event
                assert rid not in created and self.states.get(rid) in (None, *TERMINAL_STATES), event
                self.requests[rid] = operation.request
                created.add(rid)
                per_id[rid] = 0
            else:
                assert event.from_state == self.states[rid], f"event from a state the record is not in: {event}"
                assert event.from_state not in TERMINAL_STATES, f"a terminal record changed: {event}"
            per_id[rid] += 1
            self.states[rid] = event.to_state
            if event.type == "preempted":
                assert self.requests[rid].preemptible, f"non-preemptible work was preempted: {event}"
            if event.type == "admitted":
                over = over_limits(self.policy, self.requests[rid], self.running())
                assert not over, f"{rid} admitted while over a limit: {over}"
                assert not self.policy.hold, f"{rid} admitted while the host group is held: {event}"
        if not self.policy_ever_changed:
            running = self.running()
            for r in running:
                assert not over_limits(self.policy, r, running), "an admitted set exceeds a limit"

        assert snap.revision == self.seq
        # At rest after every operation: nothing queued fits (else the admission loop would have run it).
        assert [entry.position for entry in snap.queue] == list(range(1, len(snap.queue) + 1))
        assert all(entry.binding_constraint != "none" for entry in snap.queue), snap.queue
        for rid, old in self.records.items():
            new = snap.records.get(rid)
            if rid in created:
                continue
            if new is None:
                assert self.states[rid] in TERMINAL_STATES, f"a live record vanished: {old}"
                continue
            assert new.revision == old.revision + per_id[rid], f"revision must add 1 per change: {old} -> {new}"
            if per_id[rid] == 0 and isinstance(operation, Extend) and rid in operation.renewals:
                # The one change without an event: a requester renewal moves a held lease's expiry
                # later, and nothing else (not its revision, not its lease revision).
                assert new.state == old.state, (old, new)
                assert new.lease_expires_at is None or new.lease_expires_at >= old.lease_expires_at, (old, new)
                assert new.model_copy(update={"lease_expires_at": old.lease_expires_at, "eta": old.eta}) == old, (old, new)
            elif per_id[rid] == 0:
                # The predicted start is a view of the whole queue, not of the record: it may move.
                assert new.model_copy(update={"eta": old.eta}) == old, f"a record changed without an event: {old} -> {new}"
            if old.state in TERMINAL_STATES:
                assert new == old, f"a terminal record changed: {old} -> {new}"
        for rid, new in snap.records.items():
            if rid in created:
                assert new.revision == per_id[rid], f"a new record's revision counts its changes: {new}"
            else:
                assert rid in self.records, f"a record appeared without being created: {new}"
            assert new.state == self.states[rid]
        self.records = dict(snap.records)

        self.check_requeues(events)
        self.check_gangs(snap)
        self.check_fair_order(snap)

        if not result.ok and result.error.code == "not-admitted":
            rid = operation.request_id
            assert self.states[rid] in result.error.message, "not-admitted names the record's state"


    def check_requeues(self, events: list[AuditEvent]) -> None:
        for event in events:
            if event.type == "requeued":
                assert (event.from_state, event.to_state) == ("admitted", "queued"), event
                assert event.reason.startswith("lease expired; requeued (attempt "), event
        if self.policy_ever_changed:
            return
        for rid, record in self.records.items():
            assert record.requeue_attempts <= self.policy.max_requeue_attempts, record

    def check_gangs(self, snap: Snapshot) -> None:
        """No gang is ever partly held; a complete gang that fits is never left waiting."""
        gangs: dict[tuple[str, str], list[Any]] = {}
        for record in snap.records.values():
            if record.gang_id is not None and record.state in ("queued", "admitted"):
                gangs.setdefault((record.orchestrator_id, record.gang_id), []).append(record)
        running = [r for r in snap.records.values() if r.state == "admitted"]
        for (orchestrator, gang_id), members in gangs.items():
            states = {member.state for member in members}
            assert states != {"queued", "admitted"}, f"gang {gang_id} of {orchestrator} is partly held: {members}"
            assert len({member.gang_size for member in members}) == 1, members
            assert len(members) <= members[0].gang_size, f"gang {gang_id} has more members than its size"
            complete = len(members) == members[0].gang_size or any(m.lease_revision for m in members)
            waits_on = {entry.request_id: entry.binding_constraint for entry in snap.queue}
            held_back = self.policy.hold or any(" reserved for " in waits_on.get(m.request_id, "") for m in members)
            if states == {"queued"} and complete and not self.policy_ever_changed and not held_back:
                # Would the whole gang fit now? Then the engine left a runnable gang waiting: a deadlock.
                placed: list[AdmissionRequest] = []
                fits = True
                for member in sorted(members, key=lambda m: m.request_id):
                    if over_limits(self.policy, member, running + placed + [member]):
                        fits = False
                        break
                    placed.append(member)
                assert not fits, f"gang {gang_id} fits at once but waits: {members}"

    def check_fair_order(self, snap: Snapshot) -> None:
        """With fair share, equal effective priority is ordered by held leases per weight."""
        fair = self.policy.fair_share
        if fair is None or self.policy_ever_changed:
            return
        held = Counter(r.orchestrator_id for r in snap.records.values() if r.state == "admitted")

        def share(rid: str) -> float:
            orchestrator = snap.records[rid].orchestrator_id
            return held[orchestrator] / fair.weights.get(orchestrator, fair.default_weight)

        for before, after in zip(snap.queue, snap.queue[1:]):
            if before.effective_priority == after.effective_priority:
                assert share(before.request_id) <= share(after.request_id), (before, after, held)


def comparable(result: OpResult) -> dict:
    """Error messages are for people: compare the code, require some message."""
    dumped = result.model_dump()
    if dumped["error"] is not None:
        assert dumped["error"]["message"]
        dumped["error"]["message"] = "..."
    return dumped


# --- the property ---------------------------------------------------------------------------------


# 120 traces per property on every run (about 15 s each on CI's two cores); a deeper search when
# the engine changes: CONDUCTOR_PROPERTY_EXAMPLES=2000 make test PYTEST_ARGS=tests/engine/test_admission_properties.py
SETTINGS = settings(
    max_examples=int(os.environ.get("CONDUCTOR_PROPERTY_EXAMPLES", "120")), deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@SETTINGS
@given(traces(MIXED))
def test_mixed_traces_agree_with_reference_and_keep_invariants(trace: tuple[AdmissionPolicy, list]) -> None:
    run_both(*trace)


@SETTINGS
@given(traces(LANE_CONTENTION))
def test_lane_contention_traces_agree_with_reference_and_keep_invariants(trace: tuple[AdmissionPolicy, list]) -> None:
    run_both(*trace)


@SETTINGS
@given(traces(PREEMPTION_CONTENTION))
def test_preemption_contention_traces_agree_with_reference_and_keep_invariants(
    trace: tuple[AdmissionPolicy, list],
) -> None:
    run_both(*trace)


@SETTINGS
@given(traces(GANG_CONTENTION))
def test_gang_traces_agree_with_reference_never_hold_part_of_a_gang_and_never_deadlock(
    trace: tuple[AdmissionPolicy, list],
) -> None:
    run_both(*trace)


@SETTINGS
@given(traces(AMOUNTS))
def test_amount_traces_agree_with_reference_and_never_exceed_a_capacity(trace: tuple[AdmissionPolicy, list]) -> None:
    """Amounts, reservations, backfill, preemption by amounts, hold and drain, and every queued
    record's eta (the snapshot's): the engine against the naive reference, with the observer's
    invariants (no resource over capacity, nothing admitted while held)."""
    run_both(*trace)


@SETTINGS
@given(traces(FAIR_SHARE))
def test_fair_share_traces_agree_with_reference_and_order_by_weighted_share(trace: tuple[AdmissionPolicy, list]) -> None:
    run_both(*trace)


def run_both(policy: AdmissionPolicy, steps: list[tuple[int, Any]]) -> None:
    eng = engine.new_state(policy)
    ref = reference.new_state(policy)
    observer = Observer(policy)
    now = T0
    for i, (delta, operation) in enumerate(steps):
        now += timedelta(seconds=delta)
        where = f"step {i}: {operation!r} at {now.isoformat()}"
        eng, eng_result, eng_events = engine.apply(eng, operation, now)
        ref, ref_result, ref_events = reference.apply(ref, operation, now)
        assert [e.model_dump() for e in eng_events] == [e.model_dump() for e in ref_events], where
        assert comparable(eng_result) == comparable(ref_result), where

        # The whole state, through the public interface: a snapshot of a copy at the same instant.
        # After an operation the state is at rest, so that snapshot must change nothing.
        _, eng_view, eng_extra = engine.apply(copy.deepcopy(eng), TakeSnapshot(), now)
        _, ref_view, ref_extra = reference.apply(copy.deepcopy(ref), TakeSnapshot(), now)
        assert eng_extra == [] and ref_extra == [], where
        assert eng_view.snapshot.model_dump() == ref_view.snapshot.model_dump(), where
        # The position a decision reports (counted without sorting) is the snapshot's position.
        for entry in eng_view.snapshot.queue:
            assert engine.queue_position(eng, eng.records[entry.request_id]) == entry.position, (where, entry)

        observer.step(operation, eng_result, eng_events, eng_view.snapshot)
