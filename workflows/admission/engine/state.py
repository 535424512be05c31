"""The engine's state: the records, and the classes, gangs, heaps and usage counters that index them.

Times are integer microseconds since the epoch (`to_micros`): exact, cheap to compare and to carry.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from fractions import Fraction

from sortedcontainers import SortedList

from workflows.admission.model import AdmissionPolicy, AdmissionRecord, AdmissionRequest, to_thousandths

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_PRIORITY_CLASS_RANK = {"P0": 0, "P1": 1, "P2": 2, "P3": 3}
FAR_FUTURE_US = 1 << 62
# (environment, provider, runtime kind, lane, priority class, amounts): requests of one class fit
# or do not fit together. Amounts are ((name, thousandths), ...) sorted by name; () for none.
ClassKey = tuple[str, str, str, "str | None", str, tuple]
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
        "gang", "gang_size", "requeue_attempts", "queue_key", "amounts", "duration_us",
    )

    def __init__(self, request: AdmissionRequest) -> None:
        self.request = request
        self.request_id = request.request_id
        resources = request.resources
        self.amounts: tuple = tuple(sorted((name, to_thousandths(amount)) for name, amount in resources.items())) \
            if resources else ()
        duration = request.expected_duration_seconds
        self.duration_us: int | None = None if duration is None else _seconds_to_micros(duration)
        self.class_key: ClassKey = (
            request.environment, request.provider, request.runtime_kind, request.lane, request.priority_class,
            self.amounts,
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

    def copy(self) -> "Rec":
        """A record of its own with the same values (the request itself is immutable, so shared)."""
        twin = Rec.__new__(Rec)
        for name in Rec.__slots__:
            setattr(twin, name, getattr(self, name))
        return twin

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
    amounts: Counter[str] = field(default_factory=Counter)  # thousandths of each named resource held

    def add(self, rec: Rec, sign: int) -> None:
        self.total += sign
        for name, amount in rec.amounts:
            self.amounts[name] += sign * amount
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
        cutoff = state.now_us - steps * state.aging_us if steps else FAR_FUTURE_US
        effective = priority + steps
        held = state.usage.orchestrator
        best: OrderKey | None = None
        for submitted_us, request_id, orchestrator in self.heads[priority]:
            if submitted_us > cutoff:
                break
            share = held_share(state, orchestrator) if orchestrator in held else 0
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


def trie_add(root: ShapeNode, key: tuple) -> None:
    node = root
    for member_key in key[1]:
        child = node.children.get(member_key)
        if child is None:
            child = node.children[member_key] = ShapeNode()
        node = child
    node.shape = key


def trie_remove(root: ShapeNode, key: tuple) -> None:
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
    # single classes, and indexed by a trie over the member class keys (see `fitting_gang_shapes`).
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
    # Limits per class under the current policy (cleared by `install_policy`).
    limits_cache: dict[ClassKey, list[tuple[str, str, int]]] = field(default_factory=dict)
    # True once an admission pass found nothing to do; any change that could let something
    # in (capacity freed, a request queued, a policy change) clears it. With preemption on,
    # time alone can change the answer, so the pass also records the time it ran at.
    settled_at_us: int | None = None
    # The reservation plan (engine.reservations), kept while nothing it depends on changed: the
    # admitted and queued requests naming resources (`amounts_epoch`) and the time.
    amounts_epoch: int = 0
    plan: "object | None" = None
    # Queued single requests naming resources, by base priority, each list by (submitted_us,
    # request_id): in admission order within a priority (without fair share), so the plan walks a
    # merge of a few lists instead of every class's buckets.
    amount_queue: dict[int, SortedList] = field(default_factory=dict)
    # Derived policy values in microseconds, refreshed by `install_policy`.
    lease_ttl_us: int = 0
    aging_us: int = 1
    retention_us: int = 0
    fair: bool = False
    capacity: dict[str, int] = field(default_factory=dict)  # resource_capacity in thousandths

    @property
    def queued_count(self) -> int:
        return sum(queue_class.size for queue_class in self.all_classes()) + len(self.parked)

    def all_classes(self):
        yield from self.classes.values()
        yield from self.gang_classes.values()


def new_state(policy: AdmissionPolicy) -> EngineState:
    state = EngineState(policy=policy)
    install_policy(state, policy)
    return state


def install_policy(state: EngineState, policy: AdmissionPolicy) -> None:
    state.policy = policy
    state.lease_ttl_us = _seconds_to_micros(policy.lease_ttl_seconds)
    state.aging_us = max(1, _seconds_to_micros(policy.aging_interval_seconds))
    state.retention_us = _seconds_to_micros(policy.terminal_retention_seconds)
    state.limits_cache = {}
    state.settled_at_us = None
    state.capacity = {name: to_thousandths(amount) for name, amount in policy.resource_capacity.items()}
    state.amounts_epoch += 1
    fair = policy.fair_share is not None
    if fair != state.fair:
        state.fair = fair
        # The fair-share indexes exist only while fair share is on: rebuild every class.
        for classes in (state.classes, state.gang_classes):
            for key, queue_class in list(classes.items()):
                fresh = classes[key] = QueueClass(key, fair)
                for request_id in queue_class.members():
                    fresh.add(state.records[request_id])


def held_share(state: EngineState, orchestrator: str) -> Fraction | int:
    """Held leases per unit of weight: exact, so equal shares tie and fall back to FIFO."""
    held = state.usage.orchestrator.get(orchestrator, 0)
    if not held:
        return 0
    return Fraction(held, state.policy.fair_share.weight(orchestrator))  # type: ignore[union-attr]


def gang_members(state: EngineState, gang: Gang) -> list[Rec]:
    return [state.records[request_id] for request_id in sorted(gang.members)]


def gang_ready(gang: Gang, members: list[Rec]) -> bool:
    """Every live member queued, and either all of the gang there or a gang that ran before
    (requeued after its lease expired: what is left of it runs together again)."""
    if not members or any(member.state != "queued" for member in members):
        return False
    return len(members) >= gang.size or any(member.lease_revision > 0 for member in members)
