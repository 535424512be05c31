"""When each queued request will start: the queue played forward (docs/admission-engine.md, "ETA").

The forecast runs the engine itself on a copy of the state, so it can never disagree with what
the engine will do: every admitted lease ends at its expected end (`admitted_at +
expected_duration_seconds`; one past it at any moment), every holder renews in time, nothing
new arrives, and the admission pass, with its quotas, amounts, reservations, backfill,
preemption and queue deadlines, runs at each of those moments. A request's ETA is the moment
it is admitted there; None when that never comes before a lease of unknown duration would have
to end (or its queue deadline passes first). Nothing in the real state changes.

It costs a copy of the live records and a pass per forecast moment, so it is a view (the queue,
a snapshot, a decision sent to a requester), never part of an operation.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from datetime import datetime

from workflows.admission.engine.indexes import enqueue, rebuild_indexes
from workflows.admission.engine.reservations import UNKNOWN_US, expected_end
from workflows.admission.engine.scheduling import next_wakeup, tick
from workflows.admission.engine.state import FAR_FUTURE_US, EngineState, Rec, from_micros, new_state, to_micros
from workflows.admission.engine.transitions import Changes, finish
from workflows.admission.model import AdmissionRequest

# A bound on forecast moments, so that a view always answers (an aging step is one too). A moment
# costs an admission pass; inside a workflow task the caller passes a far smaller budget.
MAX_STEPS = 100_000


def forecast(
    state: EngineState, request_ids: Iterable[str] | None = None, moments: int = MAX_STEPS,
) -> dict[str, datetime | None]:
    """The predicted start of each queued request named (every queued one when None); None for
    one not admitted within `moments` forecast moments."""
    queued = {request_id for request_id, rec in state.records.items() if rec.state == "queued"}
    pending = queued if request_ids is None else queued & set(request_ids)
    if not pending:
        return {}
    return _play(_copy(state), pending, moments)


def forecast_new(state: EngineState, request: AdmissionRequest, moments: int = MAX_STEPS) -> datetime | None:
    """The predicted start of a request not submitted (a what-if), were it queued now."""
    sim = _copy(state)
    if request.request_id in sim.records:
        return None
    rec = sim.records[request.request_id] = Rec(request)
    enqueue(sim, rec, rec.submitted_us + rec.timeout_us)
    return _play(sim, {request.request_id}, moments)[request.request_id]


def _play(sim: EngineState, pending: set[str], moments: int) -> dict[str, datetime | None]:
    """Run the copy forward until every pending request is admitted or can no longer be."""
    found: dict[str, datetime | None] = {request_id: None for request_id in pending}
    ends: list[tuple[int, str]] = [
        (expected_end(rec, sim.now_us), request_id) for request_id, rec in sim.admitted.items() if rec.duration_us is not None
    ]
    heapq.heapify(ends)
    for _ in range(moments):
        wake = next_wakeup(sim)
        moment = min(ends[0][0] if ends else UNKNOWN_US, UNKNOWN_US if wake is None else to_micros(wake))
        if moment >= UNKNOWN_US:
            break
        sim.now_us = max(sim.now_us, moment)
        changes = Changes(sim)
        while ends and ends[0][0] <= sim.now_us:
            _end, request_id = heapq.heappop(ends)
            rec = sim.records.get(request_id)
            if rec is not None and rec.state == "admitted":
                finish(sim, changes, rec, "released", "released", "expected end")
        tick(sim, changes)
        for event in changes.events:
            request_id = event.request_id
            if event.type != "admitted" or request_id is None:
                if request_id in pending and event.to_state not in ("queued", "admitted"):
                    pending.discard(request_id)  # it ends in the queue: no start to predict
                continue
            rec = sim.records[request_id]
            if rec.duration_us is not None:
                heapq.heappush(ends, (rec.admitted_us + rec.duration_us, request_id))  # type: ignore[operator]
            if request_id in pending:
                found[request_id] = from_micros(sim.now_us)
                pending.discard(request_id)
        if not pending:
            break
    return found


def _copy(state: EngineState) -> EngineState:
    """The live records (queued and admitted) in a state of their own, leases renewed for ever."""
    sim = new_state(state.policy)
    sim.now_us, sim.revision = state.now_us, state.revision
    sim.lease_ttl_us = FAR_FUTURE_US - state.now_us  # leases never expire: their holders renew
    for request_id, rec in state.records.items():
        if rec.state in ("queued", "admitted"):
            twin = sim.records[request_id] = rec.copy()
            twin.queue_key = None
            if twin.state == "admitted":
                twin.lease_expires_us = FAR_FUTURE_US
    rebuild_indexes(sim)
    sim.settled_at_us = state.settled_at_us
    return sim
