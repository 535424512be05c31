"""The admission pass: expire what is due, then admit in order while anything fits, overriding a
lane or preempting where the policy allows it.
"""

from __future__ import annotations

import heapq
from datetime import datetime

from workflows.admission.engine.capacity import (
    fits_now,
    fitting_gang_shapes,
    shape_fits,
)
from workflows.admission.engine.order import effective_priority
from workflows.admission.engine.preemption import (
    lane_override_victim,
    preemption_victims,
)
from workflows.admission.engine.reservations import may_start_now
from workflows.admission.engine.state import EngineState, OrderKey, Rec, from_micros, gang_members
from workflows.admission.engine.transitions import (
    Changes,
    admit,
    admit_gang,
    displace,
    drop_expired_terminal,
    expire,
    finish,
)
from workflows.admission.model import (
    BACKFILL_POLICY,
    FAIR_SHARE_POLICY,
    LANE_OVERRIDE_POLICY,
    PREEMPTION_POLICY,
)


def tick(state: EngineState, changes: Changes) -> None:
    now = state.now_us
    drop_expired_terminal(state)

    lease_heap = state.lease_heap
    while lease_heap and lease_heap[0][0] <= now:
        expires_us, request_id = heapq.heappop(lease_heap)
        rec = state.records.get(request_id)
        if rec is not None and rec.state == "admitted" and rec.lease_expires_us == expires_us:
            expire(state, changes, rec)

    deadline_heap = state.deadline_heap
    while deadline_heap and deadline_heap[0][0] <= now:
        deadline_us, request_id = heapq.heappop(deadline_heap)
        rec = state.records.get(request_id)
        if rec is not None and rec.state == "queued" and rec.queue_deadline_us == deadline_us:
            finish(state, changes, rec, "timed-out", "timed-out", "queue deadline elapsed")

    _admission_loop(state, changes)


def _admission_loop(state: EngineState, changes: Changes) -> None:
    if state.settled_at_us is not None and (
        not state.policy.allow_preemption or state.settled_at_us == state.now_us
    ):
        return  # nothing that could admit anything has changed since the last pass
    if state.policy.hold:
        state.settled_at_us = state.now_us
        return  # held: nothing new is admitted (docs/admission-engine.md, "Hold and drain")
    gangs = _GangCandidates()
    # Classes whose head must wait for a reservation ahead of it. Admissions only take capacity,
    # so a class barred in this run stays barred until preemption or displacement frees some.
    barred: set[tuple] = set()
    while state.classes or state.gang_classes:
        if _admit_best_fitting(state, changes, gangs, barred):
            continue
        if not _override_or_preempt(state, changes):
            break
        gangs = _GangCandidates()  # displacement or preemption moved capacity: look again
        barred = set()
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

    def best(self, state: EngineState, barred: set[tuple]) -> tuple[OrderKey, str] | None:
        if self.heap is None:
            self.heap = [
                (state.gang_classes[key].head(state)[0], key)
                for key in fitting_gang_shapes(state, state.policy.max_concurrent - state.usage.total)
            ]
            heapq.heapify(self.heap)
        heap = self.heap
        while heap:
            known, key = heap[0]
            queue_class = state.gang_classes.get(key)
            if queue_class is None or key in barred or not shape_fits(state, key[1]):
                heapq.heappop(heap)
                continue
            head = queue_class.head(state)
            if head[0] != known:
                heapq.heapreplace(heap, (head[0], key))
                continue
            return head
        return None


def _admit_best_fitting(state: EngineState, changes: Changes, gangs: _GangCandidates, barred: set[tuple]) -> bool:
    """Admit the best request that fits now and may pass the reservations ahead of it; False when
    there is none."""
    if state.usage.total >= state.policy.max_concurrent:
        return False
    heads = _fitting_heads(state, barred)
    while True:
        best = min(heads, default=None)
        if state.gang_classes:
            head = gangs.best(state, barred)
            if head is not None and (best is None or head[0] < best[0]):
                best = head
        if best is None:
            return False
        rec = state.records[best[1]]
        allowed, passes = _passes_reservations(state, best[0], rec)
        if allowed:
            break
        # It waits for a reservation ahead: so does its class. Try the next best that fits (with
        # fair share, the classes at the next top effective priority may come into play).
        barred.add(rec.queue_key)  # type: ignore[arg-type]
        heads = _fitting_heads(state, barred) if state.fair else [head for head in heads if head[1] != rec.request_id]
    if rec.gang is not None:
        admit_gang(state, changes, state.gangs[rec.gang])
    else:
        admit(state, changes, rec, policy=BACKFILL_POLICY if passes else FAIR_SHARE_POLICY if state.fair else None)
    return True


def _fitting_heads(state: EngineState, barred: set[tuple]) -> list[tuple[OrderKey, str]]:
    """The head of every single-request class that fits now and is not barred."""
    if not state.fair:
        return [queue_class.head(state) for key, queue_class in state.classes.items()
                if key not in barred and fits_now(state, key)]
    # Fair-share heads cost a walk: only classes at the top effective priority can win.
    fitting = [(queue_class.top_effective(state), queue_class) for key, queue_class in state.classes.items()
               if key not in barred and fits_now(state, key)]
    top = max((effective for effective, _ in fitting), default=None)
    return [queue_class.head(state) for effective, queue_class in fitting if effective == top]


def _passes_reservations(state: EngineState, key: OrderKey, rec: Rec, without: tuple[Rec, ...] | list[Rec] = ()) -> tuple[bool, bool]:
    """A single request, or a gang as a whole (all its amounts, for as long as its longest member
    is expected to run): see `reservations.may_start_now`."""
    if rec.gang is None:
        return may_start_now(state, key, rec.amounts, rec.duration_us, without)
    members = gang_members(state, state.gangs[rec.gang])
    totals: dict[str, int] = {}
    for member in members:
        for name, amount in member.amounts:
            totals[name] = totals.get(name, 0) + amount
    durations = [member.duration_us for member in members]
    duration = None if None in durations else max(durations)  # type: ignore[type-var]
    return may_start_now(state, key, tuple(sorted(totals.items())), duration, without)


def _override_or_preempt(state: EngineState, changes: Changes) -> bool:
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
    for key, request_id in heads:
        candidate = state.records[request_id]
        if lane_override:
            victim = lane_override_victim(state, candidate)
            if victim is not None and _passes_reservations(state, key, candidate, (victim,))[0]:
                displace(state, changes, victim, candidate)
                admit(state, changes, candidate, related=victim.request_id, policy=LANE_OVERRIDE_POLICY)
                return True
        if preemption:
            victims = preemption_victims(state, candidate, key)
            if victims:
                for victim in victims:
                    finish(
                        state, changes, victim, "preempted", "preempted", f"preempted by {candidate.request_id}",
                        related=candidate.request_id, policy=PREEMPTION_POLICY, place=False,
                    )
                    victim.preempted_by = candidate.request_id
                admit(state, changes, candidate, related=victims[0].request_id, policy=PREEMPTION_POLICY)
                return True
    return False


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
