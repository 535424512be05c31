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
  together, so admission inspects classes, not requests. A gang that is ready
  to run sits in a class of its own kind, keyed by the multiset of its members'
  classes: gangs of one shape fit or do not fit together too.
* Inside a class, requests are bucketed by base priority, each bucket sorted by
  (submitted_at, request_id). Aging adds the same step function of age to every
  member of a bucket, so the bucket's first element is always its best, and the
  class's best is the best of its bucket heads. Aging therefore never forces a
  re-sort.
* With fair share on, requests of equal effective priority are ordered by their
  orchestrator's held leases per unit of weight. Only orchestrators that hold a
  lease have a share above zero, and there are never more of them than leases,
  so each bucket also keeps the oldest request of every orchestrator in it
  (sorted by age): the bucket's best is found by skipping at most the
  lease-holding orchestrators at its top effective priority.
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
from fractions import Fraction

from sortedcontainers import SortedList

from workflows.admission.model import (
    FAIR_SHARE_POLICY,
    GANG_POLICY,
    LANE_OVERRIDE_POLICY,
    PREEMPTION_POLICY,
    QUOTA_POLICY,
    REQUEUE_POLICY,
    TERMINAL_STATES,
    AdmissionPolicy,
    AdmissionRecord,
    AdmissionRequest,
    AuditEvent,
    Cancel,
    Extend,
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
_FAR_FUTURE_US = 1 << 62

ClassKey = tuple[str, str, str, "str | None", str]
GangKey = tuple[str, str]  # (orchestrator_id, gang_id)
OrderKey = tuple


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
        "lease_expires_us", "lease_revision", "finished_us", "preempted_by", "orchestrator",
        "gang", "gang_size", "requeue_attempts", "queue_key",
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
        self.orchestrator = request.orchestrator_id
        gang_id = getattr(request, "gang_id", None)
        self.gang: GangKey | None = None if gang_id is None else (request.orchestrator_id, gang_id)
        self.gang_size: int | None = getattr(request, "gang_size", None)
        self.state = "queued"
        self.revision = 0
        self.reason = ""
        self.queue_deadline_us: int | None = None
        self.admitted_us: int | None = None
        self.lease_expires_us: int | None = None
        self.lease_revision = 0
        self.finished_us: int | None = None
        self.preempted_by: str | None = None
        self.requeue_attempts = 0
        self.queue_key: tuple | None = None  # the queue class it sits in; None while parked or not queued

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

    def resubmit(self, now_us: int) -> None:
        """A fresh submission time (ADR-004 requeue): the request ages again from now."""
        self.submitted_us = now_us
        self.request = self.request.model_copy(update={"submitted_at": from_micros(now_us)})

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
            requeue_attempts=self.requeue_attempts,
        )


def _opt_time(micros: int | None) -> datetime | None:
    return None if micros is None else from_micros(micros)


@dataclass
class Usage:
    """How many admitted requests count against each limit (and, for fair share, per orchestrator)."""

    total: int = 0
    environment: Counter[str] = field(default_factory=Counter)
    provider: Counter[str] = field(default_factory=Counter)
    runtime: Counter[str] = field(default_factory=Counter)
    lane: Counter[str] = field(default_factory=Counter)
    orchestrator: dict[str, int] = field(default_factory=dict)  # only orchestrators holding a lease

    def add(self, rec: Rec, sign: int) -> None:
        self.total += sign
        self.environment[rec.environment] += sign
        self.provider[rec.provider] += sign
        self.runtime[rec.runtime_kind] += sign
        if rec.lane is not None:
            self.lane[rec.lane] += sign
        held = self.orchestrator.get(rec.orchestrator, 0) + sign
        if held:
            self.orchestrator[rec.orchestrator] = held
        else:
            del self.orchestrator[rec.orchestrator]


class QueueClass:
    """Queued requests that share a class key, bucketed by base priority.

    With `fair` on, each bucket also keeps its requests by orchestrator, and the oldest request
    of every orchestrator in it by age (`heads`), so a fair-share head costs a skip over the
    lease-holding orchestrators only.
    """

    __slots__ = ("key", "buckets", "size", "fair", "by_orchestrator", "heads", "_top")

    def __init__(self, key: tuple, fair: bool = False) -> None:
        self.key = key
        # priority -> SortedList[(submitted_us, request_id)]
        self.buckets: dict[int, SortedList] = {}
        self.size = 0
        self.fair = fair
        # priority -> SortedList[(orchestrator, submitted_us, request_id)]
        self.by_orchestrator: dict[int, SortedList] = {}
        # priority -> SortedList[(submitted_us, request_id, orchestrator)]: each orchestrator's oldest
        self.heads: dict[int, SortedList] = {}
        self._top: tuple[int, int, int] | None = None  # (now_us, aging_us, top effective priority)

    def add(self, rec: Rec) -> None:
        self._top = None
        bucket = self.buckets.get(rec.priority)
        if bucket is None:
            bucket = self.buckets[rec.priority] = SortedList()
        bucket.add((rec.submitted_us, rec.request_id))
        self.size += 1
        if self.fair:
            by = self.by_orchestrator.get(rec.priority)
            if by is None:
                by = self.by_orchestrator[rec.priority] = SortedList()
                self.heads[rec.priority] = SortedList()
            heads = self.heads[rec.priority]
            orchestrator = rec.orchestrator
            entry = (orchestrator, rec.submitted_us, rec.request_id)
            index = by.bisect_left((orchestrator,))
            old = by[index] if index < len(by) and by[index][0] == orchestrator else None
            by.add(entry)
            if old is None:
                heads.add((rec.submitted_us, rec.request_id, orchestrator))
            elif entry < old:
                heads.remove((old[1], old[2], orchestrator))
                heads.add((rec.submitted_us, rec.request_id, orchestrator))

    def remove(self, rec: Rec) -> None:
        self._top = None
        bucket = self.buckets[rec.priority]
        bucket.remove((rec.submitted_us, rec.request_id))
        self.size -= 1
        if self.fair:
            by = self.by_orchestrator[rec.priority]
            heads = self.heads[rec.priority]
            orchestrator = rec.orchestrator
            entry = (orchestrator, rec.submitted_us, rec.request_id)
            was_head = by[by.bisect_left((orchestrator,))] == entry
            by.remove(entry)
            if was_head:
                heads.remove((rec.submitted_us, rec.request_id, orchestrator))
                index = by.bisect_left((orchestrator,))
                if index < len(by) and by[index][0] == orchestrator:
                    _, submitted_us, request_id = by[index]
                    heads.add((submitted_us, request_id, orchestrator))
            if not by:
                del self.by_orchestrator[rec.priority]
                del self.heads[rec.priority]
        if not bucket:
            del self.buckets[rec.priority]

    def members(self):
        for bucket in self.buckets.values():
            for _submitted, request_id in bucket:
                yield request_id

    def top_effective(self, state: "EngineState") -> int:
        """The highest effective priority in the class (each bucket's oldest member has its bucket's)."""
        now_us, aging_us = state.now_us, state.aging_us
        cached = self._top
        if cached is not None and cached[0] == now_us and cached[1] == aging_us:
            return cached[2]
        top = max(priority + max(0, now_us - bucket[0][0]) // aging_us for priority, bucket in self.buckets.items())
        self._top = (now_us, aging_us, top)
        return top

    def head(self, state: "EngineState") -> tuple[OrderKey, str]:
        """The class's best request at the state's time: the best of its bucket heads."""
        now_us, aging_us = state.now_us, state.aging_us
        best: tuple[OrderKey, str] | None = None
        if self.fair:
            # Fair share only orders requests of equal effective priority: only the buckets that
            # reach the class's top effective priority can hold its head.
            top = self.top_effective(state)
            for priority, bucket in self.buckets.items():
                steps = max(0, now_us - bucket[0][0]) // aging_us
                if priority + steps == top:
                    key = self._fair_head(state, priority, steps)
                    if best is None or key < best[0]:
                        best = (key, key[-1])
            assert best is not None, "an empty class is removed from the queue"
            return best
        for priority, bucket in self.buckets.items():
            submitted_us, request_id = bucket[0]
            key = (-(priority + max(0, now_us - submitted_us) // aging_us), submitted_us, request_id)
            if best is None or key < best[0]:
                best = (key, request_id)
        assert best is not None, "an empty class is removed from the queue"
        return best

    def _fair_head(self, state: "EngineState", priority: int, steps: int) -> OrderKey:
        """Best of one bucket by (-effective priority, share, submitted_at, request_id).

        Requests at the bucket's top effective priority are those submitted no later than
        `cutoff`; an orchestrator holding no lease has share 0, the least there is, so the first
        such orchestrator's oldest request ends the walk.
        """
        cutoff = state.now_us - steps * state.aging_us if steps else _FAR_FUTURE_US
        effective = priority + steps
        held = state.usage.orchestrator
        best: OrderKey | None = None
        for submitted_us, request_id, orchestrator in self.heads[priority]:
            if submitted_us > cutoff:
                break
            share = _share(state, orchestrator) if orchestrator in held else 0
            key = (-effective, share, submitted_us, request_id)
            if best is None or key < best:
                best = key
            if share == 0:
                break
        assert best is not None
        return best


class Gang:
    """The live (queued or admitted) members of one gang."""

    __slots__ = ("key", "size", "members")

    def __init__(self, key: GangKey, size: int) -> None:
        self.key = key
        self.size = size
        self.members: set[str] = set()

    @property
    def gang_id(self) -> str:
        return self.key[1]


class ShapeNode:
    """A trie over gang shapes: the path is the shape's sorted member class keys."""

    __slots__ = ("children", "shape")

    def __init__(self) -> None:
        self.children: dict[ClassKey, ShapeNode] = {}
        self.shape: tuple | None = None


def _trie_add(root: ShapeNode, key: tuple) -> None:
    node = root
    for member_key in key[1]:
        child = node.children.get(member_key)
        if child is None:
            child = node.children[member_key] = ShapeNode()
        node = child
    node.shape = key


def _trie_remove(root: ShapeNode, key: tuple) -> None:
    path = [root]
    for member_key in key[1]:
        path.append(path[-1].children[member_key])
    path[-1].shape = None
    for depth in range(len(key[1]), 0, -1):
        node = path[depth]
        if node.children or node.shape is not None:
            break
        del path[depth - 1].children[key[1][depth - 1]]


@dataclass
class EngineState:
    """Everything the engine knows about one host group."""

    policy: AdmissionPolicy
    now_us: int = 0
    revision: int = 0
    records: dict[str, Rec] = field(default_factory=dict)
    classes: dict[ClassKey, QueueClass] = field(default_factory=dict)
    # Ready gangs, in classes keyed by their shape (None, sorted member class keys), apart from the
    # single classes, and indexed by a trie over the member class keys (see `_fitting_gang_shapes`).
    gang_classes: dict[tuple, QueueClass] = field(default_factory=dict)
    gang_trie: "ShapeNode" = field(default_factory=lambda: ShapeNode())
    admitted: dict[str, Rec] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)
    lease_heap: list[tuple[int, str]] = field(default_factory=list)
    deadline_heap: list[tuple[int, str]] = field(default_factory=list)
    terminal_fifo: deque[tuple[int, str]] = field(default_factory=deque)
    preemptible_admitted: set[str] = field(default_factory=set)
    gangs: dict[GangKey, Gang] = field(default_factory=dict)
    parked: dict[str, Rec] = field(default_factory=dict)  # queued members of gangs still forming
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
    fair: bool = False

    @property
    def queued_count(self) -> int:
        return sum(queue_class.size for queue_class in self.all_classes()) + len(self.parked)

    def all_classes(self):
        yield from self.classes.values()
        yield from self.gang_classes.values()


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
    fair = policy.fair_share is not None
    if fair != state.fair:
        state.fair = fair
        # The fair-share indexes exist only while fair share is on: rebuild every class.
        for classes in (state.classes, state.gang_classes):
            for key, queue_class in list(classes.items()):
                fresh = classes[key] = QueueClass(key, fair)
                for request_id in queue_class.members():
                    fresh.add(state.records[request_id])


def rebuild_indexes(state: EngineState) -> None:
    """Every index from the records alone (after decoding a carried state)."""
    terminal: list[tuple[int, str]] = []
    for rec in state.records.values():
        if rec.state == "queued":
            if rec.gang is not None:
                _join_gang(state, rec)
            else:
                _class_add(state, rec.class_key, rec)
            state.deadline_heap.append((rec.queue_deadline_us, rec.request_id))
        elif rec.state == "admitted":
            state.admitted[rec.request_id] = rec
            state.usage.add(rec, +1)
            if rec.preemptible:
                state.preemptible_admitted.add(rec.request_id)
            state.lease_heap.append((rec.lease_expires_us, rec.request_id))
            if rec.gang is not None:
                _join_gang(state, rec)
        elif rec.state in TERMINAL_STATES:
            terminal.append((rec.finished_us, rec.request_id))
    for gang in list(state.gangs.values()):
        _place_gang(state, gang)
    terminal.sort()
    state.terminal_fifo.extend(terminal)
    heapq.heapify(state.lease_heap)
    heapq.heapify(state.deadline_heap)
    state.settled_at_us = None


def _share(state: EngineState, orchestrator: str) -> Fraction | int:
    """Held leases per unit of weight: exact, so equal shares tie and fall back to FIFO."""
    held = state.usage.orchestrator.get(orchestrator, 0)
    if not held:
        return 0
    return Fraction(held, state.policy.fair_share.weight(orchestrator))  # type: ignore[union-attr]


def effective_priority(state: EngineState, rec: Rec, now_us: int | None = None) -> int:
    now = state.now_us if now_us is None else now_us
    return rec.priority + max(0, now - rec.submitted_us) // state.aging_us


def order_key(state: EngineState, rec: Rec) -> OrderKey:
    if state.fair:
        return (-effective_priority(state, rec), _share(state, rec.orchestrator), rec.submitted_us, rec.request_id)
    return (-effective_priority(state, rec), rec.submitted_us, rec.request_id)


def _is_gang_key(key: tuple) -> bool:
    return key[0] is None


def _sortable(key: ClassKey) -> tuple:
    return (key[0], key[1], key[2], key[3] or "", key[4])


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


def _fits(state: EngineState, key: ClassKey, without: tuple[Rec, ...] | list[Rec] = ()) -> bool:
    usage = state.usage
    for kind, _label, limit in _class_limits(state, key):
        used = _used(usage, kind, key)
        for victim in without:
            if _shares(victim, kind, key):
                used -= 1
        if used >= limit:
            return False
    return True


def _gang_blocker(
    state: EngineState, members: list[Rec], without: list[Rec] | tuple[Rec, ...] = (),
) -> tuple[Rec, str, int, int] | None:
    """(member, limit label, used, limit) of the first member, in request_id order, that does not
    fit once the members before it are placed; None when the whole gang fits at once."""
    placed: Counter[str] = Counter()
    for member in members:
        key = member.class_key
        limits = _class_limits(state, key)
        for kind, label, limit in limits:
            used = _used(state.usage, kind, key) + placed[label]
            for victim in without:
                if _shares(victim, kind, key):
                    used -= 1
            if used >= limit:
                return member, label, used, limit
        for _kind, label, _limit in limits:
            placed[label] += 1
    return None


def _shape_fits(state: EngineState, shape: tuple[ClassKey, ...]) -> bool:
    placed: Counter[str] = Counter()
    for key in shape:
        limits = _class_limits(state, key)
        for kind, label, limit in limits:
            if _used(state.usage, kind, key) + placed[label] >= limit:
                return False
        for _kind, label, _limit in limits:
            placed[label] += 1
    return True


def _fitting_gang_shapes(state: EngineState, free: int):
    """Every ready gang shape that fits at once. A gang fits only if each member fits alone and
    it has no more members than there are free places, so the walk down the shape trie stops at
    a member class that does not fit alone and below the depth of the free places: shapes with
    a member in a full class are never looked at."""
    alone: dict[ClassKey, bool] = {}
    stack = [(state.gang_trie, 0)]
    while stack:
        node, depth = stack.pop()
        if node.shape is not None and _shape_fits(state, node.shape[1]):
            yield node.shape
        if depth >= free:
            continue
        for member_key, child in node.children.items():
            fits = alone.get(member_key)
            if fits is None:
                fits = alone[member_key] = _fits(state, member_key)
            if fits:
                stack.append((child, depth + 1))


def binding_constraint(state: EngineState, key: ClassKey) -> str:
    blocked = blocking_limits(state, key)
    if not blocked:
        return "none"
    _kind, label, used, limit = blocked[0]
    return f"{label} {used}/{limit}"


def _gang_members(state: EngineState, gang: Gang) -> list[Rec]:
    return [state.records[request_id] for request_id in sorted(gang.members)]


def _gang_ready(gang: Gang, members: list[Rec]) -> bool:
    """Every live member queued, and either all of the gang there or a gang that ran before
    (requeued after its lease expired: what is left of it runs together again)."""
    if not members or any(member.state != "queued" for member in members):
        return False
    return len(members) >= gang.size or any(member.lease_revision > 0 for member in members)


def gang_constraint(state: EngineState, gang: Gang) -> str:
    members = _gang_members(state, gang)
    if not _gang_ready(gang, members):
        return f"gang {gang.gang_id} waiting for members {len(members)}/{gang.size}"
    blocker = _gang_blocker(state, members)
    if blocker is None:
        return "none"
    member, label, used, limit = blocker
    return f"gang {gang.gang_id}: {member.request_id} needs {label} {used}/{limit}"


def waiting_on(state: EngineState, rec: Rec) -> str:
    """The binding constraint of one queued request, gang members included."""
    if rec.gang is not None:
        return gang_constraint(state, state.gangs[rec.gang])
    return binding_constraint(state, rec.class_key)


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


def _class_add(state: EngineState, key: tuple, rec: Rec) -> None:
    classes = state.gang_classes if _is_gang_key(key) else state.classes
    queue_class = classes.get(key)
    if queue_class is None:
        queue_class = classes[key] = QueueClass(key, state.fair)
        if classes is state.gang_classes:
            _trie_add(state.gang_trie, key)
    queue_class.add(rec)
    rec.queue_key = key


def _join_gang(state: EngineState, rec: Rec) -> Gang:
    gang = state.gangs.get(rec.gang)  # type: ignore[arg-type]
    if gang is None:
        gang = state.gangs[rec.gang] = Gang(rec.gang, rec.gang_size)  # type: ignore[index, arg-type]
    gang.members.add(rec.request_id)
    if rec.state == "queued":
        state.parked[rec.request_id] = rec
        rec.queue_key = None
    return gang


def _unqueue(state: EngineState, rec: Rec) -> None:
    """Take a queued request out of whichever queue index holds it (its state is unchanged)."""
    key = rec.queue_key
    if key is None:
        state.parked.pop(rec.request_id, None)
        return
    classes = state.gang_classes if _is_gang_key(key) else state.classes
    queue_class = classes[key]
    queue_class.remove(rec)
    if queue_class.size == 0:
        del classes[key]
        if classes is state.gang_classes:
            _trie_remove(state.gang_trie, key)
    rec.queue_key = None


def _place_gang(state: EngineState, gang: Gang) -> None:
    """Put a gang's queued members where they belong: in the class of the gang's shape when it
    is ready to run, parked while it is still forming."""
    members = _gang_members(state, gang)
    queued = [member for member in members if member.state == "queued"]
    ready = _gang_ready(gang, members)
    shape_key = (None, tuple(sorted((member.class_key for member in members), key=_sortable))) if ready else None
    for member in queued:
        if member.queue_key == shape_key and (shape_key is not None or member.request_id in state.parked):
            continue
        _unqueue(state, member)
        if shape_key is None:
            state.parked[member.request_id] = member
        else:
            _class_add(state, shape_key, member)
    state.settled_at_us = None


def _enqueue(state: EngineState, rec: Rec, deadline_us: int, *, place: bool = True) -> None:
    rec.state = "queued"
    rec.queue_deadline_us = deadline_us
    heapq.heappush(state.deadline_heap, (deadline_us, rec.request_id))
    state.settled_at_us = None
    if rec.gang is None:
        _class_add(state, rec.class_key, rec)
        return
    gang = _join_gang(state, rec)
    if place:
        _place_gang(state, gang)


def _admit(state: EngineState, changes: _Changes, rec: Rec, *, related: str | None = None, policy: str | None = None) -> None:
    _unqueue(state, rec)
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


def _admit_gang(state: EngineState, changes: _Changes, gang: Gang) -> None:
    members = _gang_members(state, gang)
    for member in members:
        _unqueue(state, member)
    for member in members:
        _admit(state, changes, member, policy=GANG_POLICY)


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
    place: bool = True,
) -> None:
    """Move a live record to a terminal state, freeing what it held."""
    from_state = rec.state
    if from_state == "queued":
        _unqueue(state, rec)
    elif from_state == "admitted":
        _vacate(state, rec)
    rec.state = to_state
    rec.finished_us = state.now_us
    state.terminal_fifo.append((state.now_us, rec.request_id))
    changes.emit(event_type, rec, from_state, reason, related=related, policy=policy)
    if rec.gang is not None:
        gang = state.gangs[rec.gang]
        gang.members.discard(rec.request_id)
        if not gang.members:
            del state.gangs[rec.gang]
        elif place:
            _place_gang(state, gang)


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


def _expire(state: EngineState, changes: _Changes, rec: Rec) -> None:
    """A lease ran out: the request, and with it every admitted member of its gang, goes back to
    the queue while it has requeue attempts left and fits once it is gone (ADR-004); otherwise
    it ends timed-out."""
    if rec.gang is None:
        unit = [rec]
        fits = _fits(state, rec.class_key, without=unit)
    else:
        others = [member for member in _gang_members(state, state.gangs[rec.gang]) if member is not rec]
        unit = [rec] + [member for member in others if member.state == "admitted"]
        fits = _gang_blocker(state, sorted(unit, key=lambda member: member.request_id), without=unit) is None
    limit = state.policy.max_requeue_attempts
    if rec.requeue_attempts < limit and fits:
        for member in unit:
            _vacate(state, member)
            member.requeue_attempts += 1
            member.admitted_us = None
            member.lease_expires_us = None
            member.resubmit(state.now_us)
            _enqueue(state, member, state.now_us + member.timeout_us, place=False)
            changes.emit(
                "requeued", member, "admitted",
                f"lease expired; requeued (attempt {member.requeue_attempts}/{limit})",
                related=None if member is rec else rec.request_id, policy=REQUEUE_POLICY,
            )
        if rec.gang is not None:
            _place_gang(state, state.gangs[rec.gang])
        return
    for member in unit:
        _finish(
            state, changes, member, "timed-out", "timed-out", "admission lease expired; capacity recovered",
            related=None if member is rec else rec.request_id,
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
            _expire(state, changes, rec)

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
    gangs = _GangCandidates()
    while state.classes or state.gang_classes:
        if _admit_best_fitting(state, changes, gangs):
            continue
        if not _override_or_preempt(state, changes):
            break
        gangs = _GangCandidates()  # displacement or preemption moved capacity: look again
    state.settled_at_us = state.now_us


class _GangCandidates:
    """The ready gangs that fit, best first, for one run of plain admissions.

    While admissions only take capacity (and the clock stands still), a gang that does not fit
    never starts to fit and a gang's order key only gets worse (shares only grow), so the heap is
    built once and entries are checked lazily: dropped when they no longer fit, pushed back with
    their new key when it changed. Without it every admission of a burst would look at every
    fitting gang again.
    """

    __slots__ = ("heap",)

    def __init__(self) -> None:
        self.heap: list[tuple[OrderKey, tuple]] | None = None

    def best(self, state: EngineState) -> tuple[OrderKey, str] | None:
        if self.heap is None:
            self.heap = [
                (state.gang_classes[key].head(state)[0], key)
                for key in _fitting_gang_shapes(state, state.policy.max_concurrent - state.usage.total)
            ]
            heapq.heapify(self.heap)
        heap = self.heap
        while heap:
            known, key = heap[0]
            queue_class = state.gang_classes.get(key)
            if queue_class is None or not _shape_fits(state, key[1]):
                heapq.heappop(heap)
                continue
            head = queue_class.head(state)
            if head[0] != known:
                heapq.heapreplace(heap, (head[0], key))
                continue
            return head
        return None


def _admit_best_fitting(state: EngineState, changes: _Changes, gangs: _GangCandidates) -> bool:
    if state.usage.total >= state.policy.max_concurrent:
        return False
    best: tuple[OrderKey, str] | None = None
    if state.fair:
        # Fair-share heads cost a walk: only classes at the top effective priority can win.
        fitting = [(queue_class.top_effective(state), queue_class) for key, queue_class in state.classes.items()
                   if _fits(state, key)]
        top = max((effective for effective, _ in fitting), default=None)
        for effective, queue_class in fitting:
            if effective == top:
                head = queue_class.head(state)
                if best is None or head[0] < best[0]:
                    best = head
    else:
        for key, queue_class in state.classes.items():
            if _fits(state, key):
                head = queue_class.head(state)
                if best is None or head[0] < best[0]:
                    best = head
    if state.gang_classes:
        head = gangs.best(state)
        if head is not None and (best is None or head[0] < best[0]):
            best = head
    if best is None:
        return False
    rec = state.records[best[1]]
    if rec.gang is not None:
        _admit_gang(state, changes, state.gangs[rec.gang])
    else:
        _admit(state, changes, rec, policy=FAIR_SHARE_POLICY if state.fair else None)
    return True


def _override_or_preempt(state: EngineState, changes: _Changes) -> bool:
    policy = state.policy
    lane_override = policy.priority_admission.enabled
    preemption = policy.allow_preemption and bool(state.preemptible_admitted)
    if not (lane_override or preemption):
        return False
    # Gangs never displace or preempt: they wait until they fit.
    heads = sorted(queue_class.head(state) for queue_class in state.classes.values())
    if not heads:
        return False
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
            victims = _preemption_victims(state, candidate)
            if victims:
                for victim in victims:
                    _finish(
                        state, changes, victim, "preempted", "preempted", f"preempted by {candidate.request_id}",
                        related=candidate.request_id, policy=PREEMPTION_POLICY, place=False,
                    )
                    victim.preempted_by = candidate.request_id
                _admit(state, changes, candidate, related=victims[0].request_id, policy=PREEMPTION_POLICY)
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
    # A gang is spared whole: displacing one member would hold the rest while it waits.
    claims = [
        rec for rec in state.admitted.values()
        if rec.lane == lane and rec.priority_class_rank > rank and rec.gang is None
    ]
    if not claims:
        return None
    victim = max(claims, key=lambda rec: (rec.priority_class_rank, rec.admitted_us, rec.request_id))
    return victim if _fits(state, key, without=(victim,)) else None


def _preemption_units(state: EngineState) -> list[list[Rec]]:
    """What preemption may take: single preemptible holders, and gangs whose every admitted
    member is preemptible (taken whole, members in request_id order)."""
    units: list[list[Rec]] = []
    seen: set[GangKey] = set()
    for request_id in state.preemptible_admitted:
        rec = state.records[request_id]
        if rec.gang is None:
            units.append([rec])
        elif rec.gang not in seen:
            seen.add(rec.gang)
            members = [member for member in _gang_members(state, state.gangs[rec.gang]) if member.state == "admitted"]
            if all(member.preemptible for member in members):
                units.append(members)
    return units


def _preemption_victims(state: EngineState, candidate: Rec) -> list[Rec]:
    margin = state.policy.preemption_margin
    candidate_effective = effective_priority(state, candidate)
    best: list[Rec] = []
    best_order: tuple | None = None
    for unit in _preemption_units(state):
        # A unit is as strong as its strongest member; the latest submission and highest id speak for it.
        unit_effective = max(effective_priority(state, member) for member in unit)
        if unit_effective + margin >= candidate_effective:
            continue
        if not _fits(state, candidate.class_key, without=unit):
            continue
        # Victim order: lowest effective priority, then latest submitted, then highest id.
        order = (unit_effective, -max(member.submitted_us for member in unit))
        unit_id = max(member.request_id for member in unit)
        if best_order is None or order < best_order or (order == best_order and unit_id > max(m.request_id for m in best)):
            best, best_order = unit, order
    return best


# --- operations -------------------------------------------------------------------------------


def _gang_refusal(state: EngineState, request: AdmissionRequest) -> OpResult | None:
    gang = state.gangs.get((request.orchestrator_id, request.gang_id))  # type: ignore[arg-type]
    if gang is None:
        return None
    if gang.size != request.gang_size:
        return _error(
            "submit", "gang-mismatch",
            f"gang {request.gang_id} of {request.orchestrator_id} has gang_size {gang.size}, not "
            f"{request.gang_size}; every member must name the same gang_size",
        )
    members = _gang_members(state, gang)
    if any(member.state == "admitted" for member in members):
        return _error(
            "submit", "gang-running",
            f"gang {request.gang_id} of {request.orchestrator_id} is already admitted; a member cannot join "
            "a gang that runs: give the new request another gang_id",
        )
    if len(members) >= gang.size:
        return _error(
            "submit", "gang-full",
            f"gang {request.gang_id} of {request.orchestrator_id} already has its {gang.size} members; "
            "give the new request another gang_id or raise gang_size for a new gang",
        )
    return None


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
    if getattr(request, "gang_id", None) is not None:
        refusal = _gang_refusal(state, request)
        if refusal is not None:
            return refusal
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


def _extend(state: EngineState, op: Extend) -> OpResult:
    """Applied before the operation's first tick: a renewal took effect when it was sent (never
    later than now), so a lease still alive then is not expired by this pass. A lease that had
    already run out when the renewal was sent is not brought back, and no lease is shortened."""
    now_us = state.now_us
    ttl_us = state.lease_ttl_us
    records = state.records
    for request_id, renewed_at in op.renewals.items():
        rec = records.get(request_id)
        if rec is None or rec.state != "admitted":
            continue
        at_us = min(to_micros(renewed_at), now_us)
        expires_us = at_us + ttl_us
        if rec.lease_expires_us <= at_us or rec.lease_expires_us >= expires_us:
            continue
        rec.lease_expires_us = expires_us
        heapq.heappush(state.lease_heap, (expires_us, request_id))
    return OpResult.model_construct(op="extend", ok=True, record=None, snapshot=None, error=None)


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
        _finish(state, changes, rec, "released", "released", op.reason or "released by holder")
    return rec


def _cancel(state: EngineState, changes: _Changes, op: Cancel) -> Rec | OpResult:
    rec = state.records.get(op.request_id)
    if rec is None:
        return _not_found("cancel", op.request_id)
    if rec.state in ("queued", "admitted"):
        _finish(state, changes, rec, "cancelled", "cancelled", op.reason or "cancelled by requester")
    return rec


def _all_queued(state: EngineState) -> list[Rec]:
    queued = [state.records[request_id] for queue_class in state.all_classes() for request_id in queue_class.members()]
    queued.extend(state.parked.values())
    return queued


def _set_policy(state: EngineState, changes: _Changes, op: SetPolicy) -> OpResult:
    _install_policy(state, op.policy)
    reason = f"policy changed by {op.operator}" if op.operator else "policy changed"
    changes.emit("policy-changed", None, None, reason, policy="set_policy")
    doomed: list[Rec] = []
    for key, queue_class in [*state.classes.items(), *state.gang_classes.items()]:
        if _is_gang_key(key):
            doomed.extend(
                state.records[request_id] for request_id in queue_class.members()
                if _never_runs(state.policy, state.records[request_id].class_key) is not None
            )
        elif _never_runs(state.policy, key) is not None:
            doomed.extend(state.records[request_id] for request_id in queue_class.members())
    doomed.extend(rec for rec in state.parked.values() if _never_runs(state.policy, rec.class_key) is not None)
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
    operation: Submit | Renew | Extend | Release | Cancel | Reconcile | TakeSnapshot | SetPolicy,
    now: datetime,
) -> tuple[EngineState, OpResult, list[AuditEvent]]:
    """Apply one operation at `now`: tick, the operation, tick (an `Extend`: the operation, tick).
    See docs/admission-engine.md."""
    state.now_us = max(state.now_us, to_micros(now))
    changes = _Changes(state)
    if operation.op == "extend":
        result = _extend(state, operation)  # type: ignore[arg-type]
        _tick(state, changes)
        return state, result, changes.events
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
    queued = _all_queued(state)
    queued.sort(key=lambda rec: order_key(state, rec))
    return queued


def queue_view(state: EngineState) -> list[QueueEntry]:
    constraints: dict[tuple, str] = {}

    def constraint(rec: Rec) -> str:
        key = rec.gang if rec.gang is not None else rec.class_key
        text = constraints.get(key)  # type: ignore[arg-type]
        if text is None:
            text = constraints[key] = waiting_on(state, rec)  # type: ignore[index]
        return text

    return [
        QueueEntry(
            request_id=rec.request_id,
            position=position,
            effective_priority=effective_priority(state, rec),
            binding_constraint=constraint(rec),
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
        for queue_class in state.all_classes():
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
    never ages less), so a binary search per bucket counts who is ahead. With fair
    share, who is ahead at the same effective priority is counted per lease-holding
    orchestrator (see `_fair_ahead`).
    """
    target = order_key(state, rec)
    ahead = sum(1 for other in state.parked.values() if order_key(state, other) < target)
    for queue_class in state.all_classes():
        for priority, bucket in queue_class.buckets.items():
            if state.fair:
                ahead += _fair_ahead(state, queue_class, priority, target)
                continue
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


def _fair_ahead(state: EngineState, queue_class: QueueClass, priority: int, target: OrderKey) -> int:
    """How many requests of one bucket come before `target` in fair-share order."""
    bucket = queue_class.buckets[priority]
    by = queue_class.by_orchestrator[priority]
    neg_effective, share, target_submitted, target_id = target
    steps = -neg_effective - priority  # the age steps a bucket member needs to tie with the target
    if steps < 0:
        return len(bucket)  # every member is at least `priority`, above the target
    now, aging = state.now_us, state.aging_us

    def submitted_at_most(moment: int) -> int:
        return bucket.bisect_left((moment + 1,))

    above = submitted_at_most(now - (steps + 1) * aging)  # strictly older steps: higher effective priority
    low_us = now - (steps + 1) * aging  # ties have submitted_us in (low_us, high_us]
    if steps == 0:
        high_us = _FAR_FUTURE_US
        tied = len(bucket) - above
    else:
        high_us = now - steps * aging
        tied = submitted_at_most(high_us) - above
    if tied <= 0:
        return above
    before_target = min(max(bucket.bisect_left((target_submitted, target_id)) - above, 0), tied)
    holders_tied = holders_before = lower_share = 0
    for orchestrator in state.usage.orchestrator:
        first = by.bisect_left((orchestrator, low_us + 1))
        last = by.bisect_left((orchestrator, high_us + 1))
        if last <= first:
            continue
        count = last - first
        holders_tied += count
        earlier = min(max(by.bisect_left((orchestrator, target_submitted, target_id)) - first, 0), count)
        holders_before += earlier
        their_share = _share(state, orchestrator)
        if their_share < share:
            lower_share += count
        elif their_share == share:
            lower_share += earlier
    if share == 0:
        return above + (before_target - holders_before)
    return above + (tied - holders_tied) + lower_share


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
    if rec.gang is not None:
        refusal = _gang_refusal(state, request)
        if refusal is not None:
            return refusal.error.code, refusal.error.message  # type: ignore[union-attr]
        if denial is not None:
            return "denied", denial
        gang = state.gangs.get(rec.gang)
        members = ([] if gang is None else _gang_members(state, gang)) + [rec]
        if len(members) < rec.gang_size:  # type: ignore[operator]
            return "queued", f"gang {rec.gang[1]} waiting for members {len(members)}/{rec.gang_size}"
        blocker = _gang_blocker(state, sorted(members, key=lambda member: member.request_id))
        if blocker is None:
            return "admitted", f"completes gang {rec.gang[1]}, which fits every limit now"
        member, label, used, limit = blocker
        return "queued", f"gang {rec.gang[1]}: {member.request_id} needs {label} {used}/{limit}"
    if denial is not None:
        return "denied", denial
    if _fits(state, rec.class_key):
        return "admitted", "fits every limit now"
    if state.policy.priority_admission.enabled:
        victim = _lane_override_victim(state, rec)
        if victim is not None:
            return "admitted", f"would displace {victim.request_id} ({LANE_OVERRIDE_POLICY})"
    if state.policy.allow_preemption:
        victims = _preemption_victims(state, rec)
        if victims:
            return "admitted", f"would preempt {', '.join(victim.request_id for victim in victims)}"
    ahead = queue_position(state, rec) if state.queued_count else 1
    return "queued", f"position {ahead}, waiting on {binding_constraint(state, rec.class_key)}"
