"""Reservations and backfill over amounts of named resources (docs/admission-engine.md,
"Reservations and backfill").

Without them a request asking for 4 GPUs waits for ever behind a stream of requests asking for
one: each fits the moment a GPU frees up. So queued requests naming resources are planned the
way Slurm's backfill scheduler plans jobs (conservative backfill): in admission order, each is
given the earliest moment it fits beside the admitted leases (until their expected ends) and the
requests planned before it. One that cannot start now *reserves* its amounts from that moment
on. A request behind a reservation may start now only if it fits beside the reservations ahead
of it for as long as it runs: by ending before they start (it must declare
`expected_duration_seconds`), or by taking amounts none of them needs.

Quotas, which count leases, hold no reservations: a request kept out by a quota lets the ones
behind it pass, as before amounts existed. Only the first `reservation_depth` requests naming
resources are planned (Slurm's `bf_max_job_test`), which bounds the cost of a decision.
"""

from __future__ import annotations

import heapq
from bisect import insort
from itertools import chain
from dataclasses import dataclass, field

from workflows.admission.engine.order import order_key
from workflows.admission.engine.state import FAR_FUTURE_US, EngineState, OrderKey, Rec

# A lease that declared no expected duration ends at an unknown moment, after every known one:
# what waits for it may still be reserved (from then on), but has no predicted start.
UNKNOWN_US = FAR_FUTURE_US - 1
_END = ((FAR_FUTURE_US, 0),)  # after every point of a timeline


def expected_end(rec: Rec, now_us: int) -> int:
    """When an admitted lease is expected to end. One past its expected end is taken to end at any
    moment (the next microsecond): it still holds its amounts now."""
    if rec.duration_us is None:
        return UNKNOWN_US
    return max(rec.admitted_us + rec.duration_us, now_us + 1)  # type: ignore[operator]


class Timeline:
    """Amounts in use over time, per resource, as sorted (moment, change) points."""

    __slots__ = ("capacity", "points")

    def __init__(self, capacity: dict[str, int], leases: list[tuple[tuple, int, int]] = ()) -> None:
        """`leases`: (amounts, start, end) in any order, sorted once here."""
        self.capacity = capacity
        self.points: dict[str, list[tuple[int, int]]] = {}
        for amounts, start, end in leases:
            for name, amount in amounts:
                points = self.points.setdefault(name, [])
                points.append((start, amount))
                if end < FAR_FUTURE_US:
                    points.append((end, -amount))
        for points in self.points.values():
            points.sort()

    def add(self, amounts: tuple, start: int, end: int) -> None:
        for name, amount in amounts:
            points = self.points.setdefault(name, [])
            insort(points, (start, amount))
            if end < FAR_FUTURE_US:
                insort(points, (end, -amount))

    def earliest(self, amounts: tuple, start: int, duration_us: int | None) -> int:
        """The earliest moment >= start from which `amounts` fit for `duration_us` (None: for
        ever); FAR_FUTURE_US when never."""
        blocked: list[tuple[int, int]] = []
        capacity = self.capacity
        for name, asked in amounts:
            room = capacity.get(name, 0) - asked
            used = 0
            begin = last = None
            # The amount in use from `last` on is known once every change at `last` is counted: at
            # the next moment (a sentinel after the last one).
            for moment, change in chain(self.points.get(name, ()), _END):
                if moment != last:
                    if last is not None:
                        if used > room:
                            if begin is None:
                                begin = last
                        elif begin is not None:
                            blocked.append((begin, last))
                            begin = None
                    last = moment
                used += change
            if begin is not None:
                blocked.append((begin, FAR_FUTURE_US))
        blocked.sort()
        at = start
        for begin, end in blocked:
            if end <= at:
                continue
            if duration_us is not None and begin >= at + duration_us:
                break
            at = end
            if at >= FAR_FUTURE_US:
                return FAR_FUTURE_US
        return at


@dataclass
class Reservation:
    key: OrderKey
    rec: Rec
    start_us: int  # after now; UNKNOWN_US or later when it waits for a lease of unknown duration


@dataclass
class Plan:
    epoch: int
    now_us: int
    reservations: list[Reservation] = field(default_factory=list)


def plan_of(state: EngineState) -> Plan:
    """The reservations at the state's time, kept until a request naming resources comes or goes."""
    plan = state.plan
    if isinstance(plan, Plan) and plan.epoch == state.amounts_epoch and plan.now_us == state.now_us:
        return plan
    plan = Plan(state.amounts_epoch, state.now_us)
    state.plan = plan
    now = state.now_us
    timeline: Timeline | None = None  # built only if something is queued: it costs every lease naming resources
    floors: dict[tuple, int] = {}  # a class's members start in their order: no earlier than the one before
    for key, rec in _in_order(state, state.policy.reservation_depth):
        if timeline is None:
            timeline = _leases(state)
        start = timeline.earliest(rec.amounts, floors.get(rec.class_key, now), rec.duration_us)
        if start == now:
            continue  # it may start now as far as amounts go: if a quota keeps it out, it holds nothing
        plan.reservations.append(Reservation(key, rec, start))
        floors[rec.class_key] = start
        if start < FAR_FUTURE_US:
            timeline.add(rec.amounts, start, FAR_FUTURE_US if rec.duration_us is None else start + rec.duration_us)
    return plan


def may_start_now(
    state: EngineState, key: OrderKey, amounts: tuple, duration_us: int | None, without: tuple[Rec, ...] | list[Rec] = (),
) -> tuple[bool, bool]:
    """(whether a request at order `key` asking `amounts` for `duration_us` may start now beside
    the reservations ahead of it, whether any of them is on a resource it asks: then starting now
    is a backfill). `without`: admitted leases it would preempt."""
    if not amounts or _first_in_line(state, key):
        return True, False
    ahead = [reservation for reservation in plan_of(state).reservations if reservation.key < key]
    if not ahead:
        return True, False
    names = {name for name, _ in amounts}
    ahead = [r for r in ahead if any(name in names for name, _ in r.rec.amounts) and r.start_us < FAR_FUTURE_US]
    if not ahead:
        return True, False
    timeline = _leases(state, without)
    for reservation in ahead:
        rec = reservation.rec
        end = FAR_FUTURE_US if rec.duration_us is None else reservation.start_us + rec.duration_us
        timeline.add(rec.amounts, reservation.start_us, end)
    return timeline.earliest(amounts, state.now_us, duration_us) == state.now_us, True


def _first_in_line(state: EngineState, key: OrderKey) -> bool:
    """Whether no queued request naming resources comes before order `key` (so nothing can be
    reserved ahead of it): the heads of the per-priority lists, without a plan."""
    if state.fair:
        return False
    records = state.records
    for waiting in state.amount_queue.values():
        if order_key(state, records[waiting[0][1]]) < key:
            return False
    return True


def reserved_ahead(state: EngineState, key: OrderKey, amounts: tuple) -> tuple[str, str] | None:
    """(resource, request id) of the first reservation ahead of order `key` on a resource it asks:
    what a request that fits but may not pass is shown waiting on."""
    names = [name for name, _ in amounts]
    for reservation in plan_of(state).reservations:
        if reservation.key >= key or reservation.start_us >= FAR_FUTURE_US:
            continue
        reserved = {name for name, _ in reservation.rec.amounts}
        for name in names:
            if name in reserved:
                return name, reservation.rec.request_id
    return None


def _leases(state: EngineState, without: tuple[Rec, ...] | list[Rec] = ()) -> Timeline:
    now = state.now_us
    gone = {rec.request_id for rec in without}
    return Timeline(state.capacity, [
        (rec.amounts, now, expected_end(rec, now))
        for rec in state.admitted.values() if rec.amounts and rec.request_id not in gone
    ])


def _in_order(state: EngineState, depth: int):
    """The first `depth` queued single requests naming resources, in admission order, as (order
    key, record): a merge of streams that are each already in order (the requests of one base
    priority; with fair share, one orchestrator's part of a class's bucket)."""
    if depth <= 0:
        return
    streams = []
    if not state.fair:
        # One list per base priority: aging moves a whole list alike, so each is in order.
        for waiting in state.amount_queue.values():
            streams.append(_stream(state, (request_id for _submitted, request_id in waiting)))
    else:
        for class_key, queue_class in state.classes.items():
            if not class_key[5]:
                continue
            for priority in queue_class.buckets:
                by = queue_class.by_orchestrator[priority]
                for _submitted, _request_id, orchestrator in queue_class.heads[priority]:
                    streams.append(_stream(state, (entry[2] for entry in by.irange((orchestrator,), (orchestrator, FAR_FUTURE_US)))))
    for count, item in enumerate(heapq.merge(*streams)):
        if count >= depth:
            return
        yield item


def _stream(state: EngineState, request_ids):
    records = state.records
    for request_id in request_ids:
        rec = records[request_id]
        yield order_key(state, rec), rec
