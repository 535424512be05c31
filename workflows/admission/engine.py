"""The admission engine: a deterministic state machine for one host group.

`apply(state, operation, now)` is the whole interface; `docs/admission-engine.md`
is its exact specification. There is no I/O and no clock here, so the same code
runs inside the AdmissionWorkflow, the `conductor admission simulate` CLI, the
property tests and the benchmarks.

Why the data structures look the way they do (the queue may hold 100,000
requests and an operation must stay well under 100 µs):

* Queued requests are partitioned into *classes* by everything that decides
  whether they fit and how they may displace others: (environment, provider,
  runtime kind, lane, priority class). Requests of one class fit or do not fit
  together, so admission inspects classes, not requests.
* Inside a class, requests are bucketed by base priority, each bucket sorted by
  (submitted_at, request_id). Aging adds the same step function of age to every
  member of a bucket, so the bucket's first element is always its best, and the
  class's best is the best of its bucket heads. Aging therefore never forces a
  re-sort.
* Lease expiries and queue deadlines sit in heaps with lazy deletion: the
  earliest one is O(1) to find and renewals are O(log n).

The state is owned and mutated by `apply`; callers treat the state they pass in
as consumed and use the returned one.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from sortedcontainers import SortedList

from workflows.admission.model import (
    LANE_OVERRIDE_POLICY,
    PREEMPTION_POLICY,
    QUOTA_POLICY,
    TERMINAL_STATES,
    AdmissionPolicy,
    AdmissionRecord,
    AdmissionRequest,
    AuditEvent,
    Cancel,
    OpError,
    OpResult,
    QueueEntry,
    Reconcile,
    Release,
    Renew,
    SetPolicy,
    Snapshot,
    Submit,
    TakeSnapshot,
)

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_PRIORITY_CLASS_RANK = {"P0": 0, "P1": 1, "P2": 2, "P3": 3}

ClassKey = tuple[str, str, str, "str | None", str]
OrderKey = tuple[int, int, str]


def to_micros(moment: datetime) -> int:
    """Exact integer microseconds since the epoch (floats would make aging floors drift)."""
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(micros: int) -> datetime:
    return _EPOCH + timedelta(microseconds=micros)


def _seconds_to_micros(seconds: float) -> int:
    return round(seconds * 1_000_000)


class Rec:
    """The engine's mutable view of one request. Converted to `AdmissionRecord` at the edges."""

    __slots__ = (
        "request", "request_id", "class_key", "priority", "submitted_us", "timeout_us",
        "preemptible", "state", "revision", "reason", "queue_deadline_us", "admitted_us",
        "lease_expires_us", "lease_revision", "finished_us", "preempted_by",
    )

    def __init__(self, request: AdmissionRequest) -> None:
        self.request = request
        self.request_id = request.request_id
        self.class_key: ClassKey = (
            request.environment, request.provider, request.runtime_kind, request.lane, request.priority_class,
        )
        self.priority = request.priority
        self.submitted_us = to_micros(request.submitted_at)
        self.timeout_us = _seconds_to_micros(request.queue_timeout_seconds)
        self.preemptible = request.preemptible
        self.state = "queued"
        self.revision = 0
        self.reason = ""
        self.queue_deadline_us: int | None = None
        self.admitted_us: int | None = None
        self.lease_expires_us: int | None = None
        self.lease_revision = 0
        self.finished_us: int | None = None
        self.preempted_by: str | None = None

    @property
    def environment(self) -> str:
        return self.class_key[0]

    @property
    def provider(self) -> str:
        return self.class_key[1]

    @property
    def runtime_kind(self) -> str:
        return self.class_key[2]

    @property
    def lane(self) -> str | None:
        return self.class_key[3]

    @property
    def priority_class_rank(self) -> int:
        return _PRIORITY_CLASS_RANK[self.class_key[4]]

    def to_model(self) -> AdmissionRecord:
        # model_construct: every value here was validated when the request entered.
        return AdmissionRecord.model_construct(
            **self.request.__dict__,
            state=self.state,
            revision=self.revision,
            reason=self.reason,
            queue_deadline=_opt_time(self.queue_deadline_us),
            admitted_at=_opt_time(self.admitted_us),
            lease_expires_at=_opt_time(self.lease_expires_us),
            lease_revision=self.lease_revision,
            finished_at=_opt_time(self.finished_us),
            preempted_by=self.preempted_by,
        )

    @classmethod
    def from_model(cls, record: AdmissionRecord) -> "Rec":
        request = AdmissionRequest.model_construct(
            **{name: getattr(record, name) for name in AdmissionRequest.model_fields}
        )
        rec = cls(request)
        rec.state = record.state
        rec.revision = record.revision
        rec.reason = record.reason
        rec.queue_deadline_us = _opt_micros(record.queue_deadline)
        rec.admitted_us = _opt_micros(record.admitted_at)
        rec.lease_expires_us = _opt_micros(record.lease_expires_at)
        rec.lease_revision = record.lease_revision
        rec.finished_us = _opt_micros(record.finished_at)
        rec.preempted_by = record.preempted_by
        return rec


def _opt_time(micros: int | None) -> datetime | None:
    return None if micros is None else from_micros(micros)


def _opt_micros(moment: datetime | None) -> int | None:
    return None if moment is None else to_micros(moment)


@dataclass
class Usage:
    """How many admitted requests count against each limit."""

    total: int = 0
    environment: Counter[str] = field(default_factory=Counter)
    provider: Counter[str] = field(default_factory=Counter)
    runtime: Counter[str] = field(default_factory=Counter)
    lane: Counter[str] = field(default_factory=Counter)

    def add(self, rec: Rec, sign: int) -> None:
        self.total += sign
        self.environment[rec.environment] += sign
        self.provider[rec.provider] += sign
        self.runtime[rec.runtime_kind] += sign
        if rec.lane is not None:
            self.lane[rec.lane] += sign


class QueueClass:
    """Queued requests that share a class key, bucketed by base priority."""

    __slots__ = ("key", "buckets", "size")

    def __init__(self, key: ClassKey) -> None:
        self.key = key
        # priority -> SortedList[(submitted_us, request_id)]
        self.buckets: dict[int, SortedList] = {}
        self.size = 0

    def add(self, rec: Rec) -> None:
        bucket = self.buckets.get(rec.priority)
        if bucket is None:
            bucket = self.buckets[rec.priority] = SortedList()
        bucket.add((rec.submitted_us, rec.request_id))
        self.size += 1

    def remove(self, rec: Rec) -> None:
        bucket = self.buckets[rec.priority]
        bucket.remove((rec.submitted_us, rec.request_id))
        if not bucket:
            del self.buckets[rec.priority]
        self.size -= 1

    def head(self, now_us: int, aging_us: int) -> tuple[OrderKey, str]:
        """The class's best request at `now`: the best of its bucket heads."""
        best: tuple[OrderKey, str] | None = None
        for priority, bucket in self.buckets.items():
            submitted_us, request_id = bucket[0]
            effective = priority + max(0, now_us - submitted_us) // aging_us
            key = (-effective, submitted_us, request_id)
            if best is None or key < best[0]:
                best = (key, request_id)
        assert best is not None, "an empty class is removed from the queue"
        return best


@dataclass
class EngineState:
    """Everything the engine knows about one host group."""

    policy: AdmissionPolicy
    now_us: int = 0
    revision: int = 0
    records: dict[str, Rec] = field(default_factory=dict)
    classes: dict[ClassKey, QueueClass] = field(default_factory=dict)
    admitted: dict[str, Rec] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)
    lease_heap: list[tuple[int, str]] = field(default_factory=list)
    deadline_heap: list[tuple[int, str]] = field(default_factory=list)
    terminal_fifo: deque[tuple[int, str]] = field(default_factory=deque)
    preemptible_admitted: set[str] = field(default_factory=set)
    # Limits per class under the current policy (cleared by `_install_policy`).
    limits_cache: dict[ClassKey, list[tuple[str, str, int]]] = field(default_factory=dict)
    # True once an admission pass found nothing to do; any change that could let something
    # in (capacity freed, a request queued, a policy change) clears it. With preemption on,
    # time alone can change the answer, so the pass also records the time it ran at.
    settled_at_us: int | None = None
    # Derived policy values in microseconds, refreshed by `_install_policy`.
    lease_ttl_us: int = 0
    aging_us: int = 1
    retention_us: int = 0

    @property
    def queued_count(self) -> int:
        return sum(queue_class.size for queue_class in self.classes.values())


def new_state(policy: AdmissionPolicy) -> EngineState:
    state = EngineState(policy=policy)
    _install_policy(state, policy)
    return state


def _install_policy(state: EngineState, policy: AdmissionPolicy) -> None:
    state.policy = policy
    state.lease_ttl_us = _seconds_to_micros(policy.lease_ttl_seconds)
    state.aging_us = max(1, _seconds_to_micros(policy.aging_interval_seconds))
    state.retention_us = _seconds_to_micros(policy.terminal_retention_seconds)
    state.limits_cache = {}
    state.settled_at_us = None


def effective_priority(state: EngineState, rec: Rec, now_us: int | None = None) -> int:
    now = state.now_us if now_us is None else now_us
    return rec.priority + max(0, now - rec.submitted_us) // state.aging_us


def order_key(state: EngineState, rec: Rec) -> OrderKey:
    return (-effective_priority(state, rec), rec.submitted_us, rec.request_id)


# --- capacity ---------------------------------------------------------------------------------


def _limits(policy: AdmissionPolicy, key: ClassKey) -> list[tuple[str, str, int]]:
    """(kind, label, limit) for every limit that applies to a class, in checking order."""
    environment, provider, runtime_kind, lane, _ = key
    limits = [("global", "global", policy.max_concurrent)]
    if environment in policy.environment_quotas:
        limits.append(("environment", f"environment {environment}", policy.environment_quotas[environment]))
    if provider in policy.provider_quotas:
        limits.append(("provider", f"provider {provider}", policy.provider_quotas[provider]))
    runtime_limit = policy.runtime_limit(runtime_kind)
    if runtime_limit is not None:
        limits.append(("runtime", f"runtime {runtime_kind}", runtime_limit))
    if lane is not None and lane in policy.lane_wip_limits:
        limits.append(("lane", f"lane {lane}", policy.lane_wip_limits[lane]))
    return limits


def _used(usage: Usage, kind: str, key: ClassKey) -> int:
    if kind == "global":
        return usage.total
    if kind == "environment":
        return usage.environment[key[0]]
    if kind == "provider":
        return usage.provider[key[1]]
    if kind == "runtime":
        return usage.runtime[key[2]]
    return usage.lane[key[3]]  # type: ignore[index]


def _shares(victim: Rec, kind: str, key: ClassKey) -> bool:
    """Whether removing `victim` frees a unit of the limit `kind` for class `key`."""
    if kind == "global":
        return True
    if kind == "environment":
        return victim.environment == key[0]
    if kind == "provider":
        return victim.provider == key[1]
    if kind == "runtime":
        return victim.runtime_kind == key[2]
    return victim.lane == key[3]


def _class_limits(state: EngineState, key: ClassKey) -> list[tuple[str, str, int]]:
    limits = state.limits_cache.get(key)
    if limits is None:
        limits = state.limits_cache[key] = _limits(state.policy, key)
    return limits


def blocking_limits(state: EngineState, key: ClassKey, without: Rec | None = None) -> list[tuple[str, str, int, int]]:
    """Every limit a class would exceed now, as (kind, label, used, limit); empty if it fits.

    `without` answers "would it fit if this admitted request were gone?"
    """
    blocked = []
    for kind, label, limit in _class_limits(state, key):
        used = _used(state.usage, kind, key)
        if without is not None and _shares(without, kind, key):
            used -= 1
        if used >= limit:
            blocked.append((kind, label, used, limit))
    return blocked


def _fits(state: EngineState, key: ClassKey, without: Rec | None = None) -> bool:
    usage = state.usage
    for kind, _label, limit in _class_limits(state, key):
        used = _used(usage, kind, key)
        if without is not None and _shares(without, kind, key):
            used -= 1
        if used >= limit:
            return False
    return True


def binding_constraint(state: EngineState, key: ClassKey) -> str:
    blocked = blocking_limits(state, key)
    if not blocked:
        return "none"
    _kind, label, used, limit = blocked[0]
    return f"{label} {used}/{limit}"


def _never_runs(policy: AdmissionPolicy, key: ClassKey) -> str | None:
    """The first limit that is zero for this class, named for a person; None if it can run."""
    environment, provider, runtime_kind, lane, _ = key
    names = {
        "global": "max_concurrent",
        "environment": f"environment quota for {environment}",
        "provider": f"provider quota for {provider}",
        "runtime": f"runtime quota for {runtime_kind}",
        "lane": f"lane WIP limit for {lane}",
    }
    for kind, _label, limit in _limits(policy, key):
        if limit == 0:
            return f"{names[kind]} is 0: this request can never run"
    return None


# --- state changes (each emits exactly one audit event) ---------------------------------------


class _Changes:
    """Collects the audit events of one `apply` call."""

    def __init__(self, state: EngineState) -> None:
        self.state = state
        self.events: list[AuditEvent] = []

    def emit(
        self,
        type_: str,
        rec: Rec | None,
        from_state: str | None,
        reason: str,
        *,
        related: str | None = None,
        policy: str | None = None,
    ) -> None:
        state = self.state
        state.revision += 1
        if rec is not None:
            rec.revision += 1
            rec.reason = reason
        self.events.append(
            AuditEvent.model_construct(
                seq=state.revision,
                type=type_,
                at=from_micros(state.now_us),
                request_id=None if rec is None else rec.request_id,
                from_state=from_state,
                to_state=None if rec is None else rec.state,
                reason=reason,
                related_request_id=related,
                policy=policy,
            )
        )


def _enqueue(state: EngineState, rec: Rec, deadline_us: int) -> None:
    rec.state = "queued"
    rec.queue_deadline_us = deadline_us
    queue_class = state.classes.get(rec.class_key)
    if queue_class is None:
        queue_class = state.classes[rec.class_key] = QueueClass(rec.class_key)
    queue_class.add(rec)
    heapq.heappush(state.deadline_heap, (deadline_us, rec.request_id))
    state.settled_at_us = None


def _dequeue(state: EngineState, rec: Rec) -> None:
    queue_class = state.classes[rec.class_key]
    queue_class.remove(rec)
    if queue_class.size == 0:
        del state.classes[rec.class_key]


def _admit(state: EngineState, changes: _Changes, rec: Rec, *, related: str | None = None, policy: str | None = None) -> None:
    _dequeue(state, rec)
    rec.state = "admitted"
    rec.admitted_us = state.now_us
    rec.lease_expires_us = state.now_us + state.lease_ttl_us
    rec.lease_revision += 1
    state.admitted[rec.request_id] = rec
    state.usage.add(rec, +1)
    if rec.preemptible:
        state.preemptible_admitted.add(rec.request_id)
    heapq.heappush(state.lease_heap, (rec.lease_expires_us, rec.request_id))
    changes.emit("admitted", rec, "queued", "admitted", related=related, policy=policy)


def _vacate(state: EngineState, rec: Rec) -> None:
    """Take an admitted request out of the admitted set and give its capacity back."""
    del state.admitted[rec.request_id]
    state.usage.add(rec, -1)
    state.settled_at_us = None
    state.preemptible_admitted.discard(rec.request_id)


def _finish(
    state: EngineState,
    changes: _Changes,
    rec: Rec,
    to_state: str,
    event_type: str,
    reason: str,
    *,
    related: str | None = None,
    policy: str | None = None,
) -> None:
    """Move a live record to a terminal state, freeing what it held."""
    from_state = rec.state
    if from_state == "queued":
        _dequeue(state, rec)
    elif from_state == "admitted":
        _vacate(state, rec)
    rec.state = to_state
    rec.finished_us = state.now_us
    state.terminal_fifo.append((state.now_us, rec.request_id))
    changes.emit(event_type, rec, from_state, reason, related=related, policy=policy)


def _displace(state: EngineState, changes: _Changes, victim: Rec, by: Rec) -> None:
    _vacate(state, victim)
    victim.admitted_us = None
    victim.lease_expires_us = None
    _enqueue(state, victim, state.now_us + victim.timeout_us)
    changes.emit(
        "displaced", victim, "admitted",
        f"displaced by {by.request_id} ({LANE_OVERRIDE_POLICY})",
        related=by.request_id, policy=LANE_OVERRIDE_POLICY,
    )


# --- the tick ---------------------------------------------------------------------------------


def _tick(state: EngineState, changes: _Changes) -> None:
    now = state.now_us
    _drop_expired_terminal(state)

    lease_heap = state.lease_heap
    while lease_heap and lease_heap[0][0] <= now:
        expires_us, request_id = heapq.heappop(lease_heap)
        rec = state.records.get(request_id)
        if rec is not None and rec.state == "admitted" and rec.lease_expires_us == expires_us:
            _finish(state, changes, rec, "timed-out", "timed-out", "admission lease expired; capacity recovered")

    deadline_heap = state.deadline_heap
    while deadline_heap and deadline_heap[0][0] <= now:
        deadline_us, request_id = heapq.heappop(deadline_heap)
        rec = state.records.get(request_id)
        if rec is not None and rec.state == "queued" and rec.queue_deadline_us == deadline_us:
            _finish(state, changes, rec, "timed-out", "timed-out", "queue deadline elapsed")

    _admission_loop(state, changes)


def _drop_expired_terminal(state: EngineState) -> None:
    fifo = state.terminal_fifo
    horizon = state.now_us - state.retention_us
    while fifo and fifo[0][0] <= horizon:
        finished_us, request_id = fifo.popleft()
        rec = state.records.get(request_id)
        if rec is not None and rec.state in TERMINAL_STATES and rec.finished_us == finished_us:
            del state.records[request_id]


def _admission_loop(state: EngineState, changes: _Changes) -> None:
    if state.settled_at_us is not None and (
        not state.policy.allow_preemption or state.settled_at_us == state.now_us
    ):
        return  # nothing that could admit anything has changed since the last pass
    while state.classes:
        if _admit_best_fitting(state, changes):
            continue
        if not _override_or_preempt(state, changes):
            break
    state.settled_at_us = state.now_us


def _admit_best_fitting(state: EngineState, changes: _Changes) -> bool:
    if state.usage.total >= state.policy.max_concurrent:
        return False
    best: tuple[OrderKey, str] | None = None
    for key, queue_class in state.classes.items():
        if _fits(state, key):
            head = queue_class.head(state.now_us, state.aging_us)
            if best is None or head[0] < best[0]:
                best = head
    if best is None:
        return False
    _admit(state, changes, state.records[best[1]])
    return True


def _override_or_preempt(state: EngineState, changes: _Changes) -> bool:
    policy = state.policy
    lane_override = policy.priority_admission.enabled
    preemption = policy.allow_preemption and bool(state.preemptible_admitted)
    if not (lane_override or preemption):
        return False
    heads = sorted(queue_class.head(state.now_us, state.aging_us) for queue_class in state.classes.values())
    if preemption and not lane_override:
        # Fast refusal: the weakest preemptible holder is not weak enough for the strongest head.
        weakest = min(effective_priority(state, state.records[request_id]) for request_id in state.preemptible_admitted)
        if weakest + policy.preemption_margin >= -heads[0][0][0]:
            return False
    for _key, request_id in heads:
        candidate = state.records[request_id]
        if lane_override:
            victim = _lane_override_victim(state, candidate)
            if victim is not None:
                _displace(state, changes, victim, candidate)
                _admit(state, changes, candidate, related=victim.request_id, policy=LANE_OVERRIDE_POLICY)
                return True
        if preemption:
            victim = _preemption_victim(state, candidate)
            if victim is not None:
                _finish(
                    state, changes, victim, "preempted", "preempted", f"preempted by {candidate.request_id}",
                    related=candidate.request_id, policy=PREEMPTION_POLICY,
                )
                victim.preempted_by = candidate.request_id
                _admit(state, changes, candidate, related=victim.request_id, policy=PREEMPTION_POLICY)
                return True
    return False


def _lane_override_victim(state: EngineState, candidate: Rec) -> Rec | None:
    policy = state.policy
    key = candidate.class_key
    lane = candidate.lane
    if lane is None or lane not in policy.lane_wip_limits:
        return None
    if key[4] not in policy.priority_admission.override_priorities:
        return None
    blocked = blocking_limits(state, key)
    if [kind for kind, *_ in blocked] != ["lane"]:
        return None
    rank = candidate.priority_class_rank
    claims = [rec for rec in state.admitted.values() if rec.lane == lane and rec.priority_class_rank > rank]
    if not claims:
        return None
    victim = max(claims, key=lambda rec: (rec.priority_class_rank, rec.admitted_us, rec.request_id))
    return victim if _fits(state, key, without=victim) else None


def _preemption_victim(state: EngineState, candidate: Rec) -> Rec | None:
    margin = state.policy.preemption_margin
    candidate_effective = effective_priority(state, candidate)
    best: Rec | None = None
    best_order: tuple[int, int] | None = None
    for request_id in state.preemptible_admitted:
        victim = state.records[request_id]
        victim_effective = effective_priority(state, victim)
        if victim_effective + margin >= candidate_effective:
            continue
        if not _fits(state, candidate.class_key, without=victim):
            continue
        # Victim order: lowest effective priority, then latest submitted, then highest id.
        order = (victim_effective, -victim.submitted_us)
        if best is None or order < best_order or (order == best_order and request_id > best.request_id):
            best, best_order = victim, order
    return best


# --- operations -------------------------------------------------------------------------------


def _submit(state: EngineState, changes: _Changes, op: Submit) -> Rec | OpResult:
    request = op.request
    existing = state.records.get(request.request_id)
    if existing is not None:
        if existing.request.placement_identity() != request.placement_identity():
            return _error(
                "submit", "identity-collision",
                f"request {request.request_id} already exists with placement "
                f"{existing.request.placement_identity()}; a replay must repeat it exactly, "
                "a new request needs a new request_id",
            )
        return existing
    rec = Rec(request)
    state.records[rec.request_id] = rec
    denial = _never_runs(state.policy, rec.class_key)
    if denial is not None:
        rec.state = "denied"
        rec.finished_us = state.now_us
        state.terminal_fifo.append((state.now_us, rec.request_id))
        changes.emit("denied", rec, None, denial, policy=QUOTA_POLICY)
    else:
        _enqueue(state, rec, rec.submitted_us + rec.timeout_us)
        changes.emit("queued", rec, None, "queued")
    return rec


def _renew(state: EngineState, changes: _Changes, op: Renew) -> Rec | OpResult:
    rec = state.records.get(op.request_id)
    if rec is None:
        return _not_found("renew", op.request_id)
    if rec.state != "admitted":
        return _error(
            "renew", "not-admitted",
            f"request {op.request_id} is {rec.state} ({rec.reason}); only an admitted lease can be "
            "renewed: submit again to queue for a new one",
        )
    if op.lease_revision is not None and op.lease_revision != rec.lease_revision:
        return _error(
            "renew", "stale-lease-revision",
            f"lease {op.request_id} is at revision {rec.lease_revision}, not {op.lease_revision}; "
            "renew with the current revision",
        )
    rec.lease_expires_us = state.now_us + state.lease_ttl_us
    rec.lease_revision += 1
    heapq.heappush(state.lease_heap, (rec.lease_expires_us, rec.request_id))
    changes.emit("renewed", rec, "admitted", "lease renewed")
    return rec


def _release(state: EngineState, changes: _Changes, op: Release) -> Rec | OpResult:
    rec = state.records.get(op.request_id)
    if rec is None:
        return _not_found("release", op.request_id)
    if rec.state == "queued":
        return _error(
            "release", "not-admitted",
            f"request {op.request_id} is still queued; cancel it instead of releasing it",
        )
    if rec.state == "admitted":
        _finish(state, changes, rec, "released", "released", "released by holder")
    return rec


def _cancel(state: EngineState, changes: _Changes, op: Cancel) -> Rec | OpResult:
    rec = state.records.get(op.request_id)
    if rec is None:
        return _not_found("cancel", op.request_id)
    if rec.state in ("queued", "admitted"):
        _finish(state, changes, rec, "cancelled", "cancelled", "cancelled by requester")
    return rec


def _set_policy(state: EngineState, changes: _Changes, op: SetPolicy) -> OpResult:
    _install_policy(state, op.policy)
    reason = f"policy changed by {op.operator}" if op.operator else "policy changed"
    changes.emit("policy-changed", None, None, reason, policy="set_policy")
    doomed = [
        rec
        for key, queue_class in list(state.classes.items())
        if _never_runs(state.policy, key) is not None
        for bucket in queue_class.buckets.values()
        for _submitted, request_id in bucket
        for rec in (state.records[request_id],)
    ]
    doomed.sort(key=lambda rec: order_key(state, rec))
    for rec in doomed:
        _finish(state, changes, rec, "denied", "denied", _never_runs(state.policy, rec.class_key) or "", policy=QUOTA_POLICY)
    return OpResult(op="set_policy", ok=True)


def _error(op: str, code: str, message: str) -> OpResult:
    return OpResult.model_construct(op=op, ok=False, record=None, snapshot=None, error=OpError(code=code, message=message))


def _not_found(op: str, request_id: str) -> OpResult:
    return _error(op, "not-found", f"no admission request {request_id} in this host group (never submitted, or dropped after retention)")


_HANDLERS = {
    "submit": _submit,
    "renew": _renew,
    "release": _release,
    "cancel": _cancel,
    "set_policy": _set_policy,
}


def apply(
    state: EngineState,
    operation: Submit | Renew | Release | Cancel | Reconcile | TakeSnapshot | SetPolicy,
    now: datetime,
) -> tuple[EngineState, OpResult, list[AuditEvent]]:
    """Apply one operation at `now`: tick, the operation, tick. See docs/admission-engine.md."""
    state.now_us = max(state.now_us, to_micros(now))
    changes = _Changes(state)
    _tick(state, changes)
    handler = _HANDLERS.get(operation.op)
    outcome = handler(state, changes, operation) if handler else None
    _tick(state, changes)
    if isinstance(outcome, Rec):
        # Rendered after the final tick, so the record shows what the operation led to.
        result = OpResult.model_construct(op=operation.op, ok=True, record=outcome.to_model(), snapshot=None, error=None)
    elif outcome is not None:
        result = outcome
    elif operation.op == "snapshot":
        result = OpResult(op="snapshot", ok=True, snapshot=snapshot(state))
    else:
        result = OpResult(op=operation.op, ok=True)
    return state, result, changes.events


# --- read-only views --------------------------------------------------------------------------


def queued_in_order(state: EngineState) -> list[Rec]:
    queued = [
        state.records[request_id]
        for queue_class in state.classes.values()
        for bucket in queue_class.buckets.values()
        for _submitted, request_id in bucket
    ]
    queued.sort(key=lambda rec: order_key(state, rec))
    return queued


def queue_view(state: EngineState) -> list[QueueEntry]:
    constraints: dict[ClassKey, str] = {key: binding_constraint(state, key) for key in state.classes}
    return [
        QueueEntry(
            request_id=rec.request_id,
            position=position,
            effective_priority=effective_priority(state, rec),
            binding_constraint=constraints[rec.class_key],
        )
        for position, rec in enumerate(queued_in_order(state), start=1)
    ]


def snapshot(state: EngineState) -> Snapshot:
    return Snapshot(
        revision=state.revision,
        records={request_id: rec.to_model() for request_id, rec in state.records.items()},
        queue=queue_view(state),
    )


def next_wakeup(state: EngineState) -> datetime | None:
    """The earliest future moment at which time alone can change a decision.

    Lease expiries and queue deadlines always can; aging steps can only when a
    queued request might overtake a preemptible holder or another queued request
    for capacity that preemption would free, so they count only while
    preemption is on and something is preemptible.
    """
    candidates: list[int] = []
    _prune_heap(state.lease_heap, lambda expires_us, rec: rec.state == "admitted" and rec.lease_expires_us == expires_us, state)
    _prune_heap(state.deadline_heap, lambda deadline_us, rec: rec.state == "queued" and rec.queue_deadline_us == deadline_us, state)
    if state.lease_heap:
        candidates.append(state.lease_heap[0][0])
    if state.deadline_heap:
        candidates.append(state.deadline_heap[0][0])
    if state.policy.allow_preemption and state.preemptible_admitted and state.classes:
        aging = state.aging_us
        now = state.now_us
        for queue_class in state.classes.values():
            for bucket in queue_class.buckets.values():
                submitted_us = bucket[0][0]
                age = max(0, now - submitted_us)
                candidates.append(submitted_us + (age // aging + 1) * aging)
    return from_micros(min(candidates)) if candidates else None


def _prune_heap(heap: list[tuple[int, str]], live, state: EngineState) -> None:
    while heap:
        moment, request_id = heap[0]
        rec = state.records.get(request_id)
        if rec is not None and live(moment, rec):
            return
        heapq.heappop(heap)


def queue_position(state: EngineState, rec: Rec) -> int:
    """1-based position of a queued request without sorting the queue.

    Inside a bucket the order key is monotone in bucket order (earlier submission
    never ages less), so a binary search per bucket counts who is ahead.
    """
    target = order_key(state, rec)
    ahead = 0
    for queue_class in state.classes.values():
        for priority, bucket in queue_class.buckets.items():
            low, high = 0, len(bucket)
            while low < high:
                middle = (low + high) // 2
                submitted_us, request_id = bucket[middle]
                effective = priority + max(0, state.now_us - submitted_us) // state.aging_us
                if (-effective, submitted_us, request_id) < target:
                    low = middle + 1
                else:
                    high = middle
            ahead += low
    return ahead + 1


def usage_view(state: EngineState) -> list[tuple[str, int, int | None]]:
    """(limit label, used, limit or None for unlimited) for every limit in the policy or in use."""
    policy, usage = state.policy, state.usage
    rows: list[tuple[str, int, int | None]] = [("global", usage.total, policy.max_concurrent)]
    for label, quotas, used in (
        ("environment", policy.environment_quotas, usage.environment),
        ("provider", policy.provider_quotas, usage.provider),
        ("lane", policy.lane_wip_limits, usage.lane),
    ):
        for name in sorted(set(quotas) | {key for key, count in used.items() if count}):
            rows.append((f"{label} {name}", used[name], quotas.get(name)))
    kinds = set(policy.runtime_quotas) | {"host"} | {key for key, count in usage.runtime.items() if count}
    for kind in sorted(kinds):
        rows.append((f"runtime {kind}", usage.runtime[kind], policy.runtime_limit(kind)))
    return rows


def what_if(state: EngineState, request: AdmissionRequest) -> tuple[str, str]:
    """(outcome, explanation) of submitting `request` now, without changing anything.

    After every operation no queued request fits, so a newcomer that fits would
    be admitted at once, and only the newcomer could preempt or displace.
    """
    existing = state.records.get(request.request_id)
    if existing is not None:
        if existing.request.placement_identity() != request.placement_identity():
            return "identity-collision", f"request {request.request_id} exists with another placement"
        return "replay", f"request {request.request_id} already exists: {existing.state}"
    rec = Rec(request)
    denial = _never_runs(state.policy, rec.class_key)
    if denial is not None:
        return "denied", denial
    if _fits(state, rec.class_key):
        return "admitted", "fits every limit now"
    if state.policy.priority_admission.enabled:
        victim = _lane_override_victim(state, rec)
        if victim is not None:
            return "admitted", f"would displace {victim.request_id} ({LANE_OVERRIDE_POLICY})"
    if state.policy.allow_preemption:
        victim = _preemption_victim(state, rec)
        if victim is not None:
            return "admitted", f"would preempt {victim.request_id}"
    ahead = queue_position(state, rec) if state.classes else 1
    return "queued", f"position {ahead}, waiting on {binding_constraint(state, rec.class_key)}"
