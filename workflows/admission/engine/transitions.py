"""One record's state changes (admit, finish, displace, expire) with their audit events,
collected in `Changes` for the operation that caused them.
"""

from __future__ import annotations

import heapq

from workflows.admission.engine.capacity import fits_now, gang_blocker
from workflows.admission.engine.indexes import enqueue, place_gang, unqueue
from workflows.admission.engine.state import (
    EngineState,
    Gang,
    Rec,
    from_micros,
    gang_members,
)
from workflows.admission.model import (
    GANG_POLICY,
    LANE_OVERRIDE_POLICY,
    REQUEUE_POLICY,
    TERMINAL_STATES,
    AuditEvent,
)


class Changes:
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


def admit(state: EngineState, changes: Changes, rec: Rec, *, related: str | None = None, policy: str | None = None) -> None:
    unqueue(state, rec)
    rec.state = "admitted"
    rec.admitted_us = state.now_us
    rec.lease_expires_us = state.now_us + state.lease_ttl_us
    rec.lease_revision += 1
    state.admitted[rec.request_id] = rec
    state.usage.add(rec, +1)
    if rec.amounts or state.fair:
        state.amounts_epoch += 1
    if rec.preemptible:
        state.preemptible_admitted.add(rec.request_id)
    heapq.heappush(state.lease_heap, (rec.lease_expires_us, rec.request_id))
    changes.emit("admitted", rec, "queued", "admitted", related=related, policy=policy)


def admit_gang(state: EngineState, changes: Changes, gang: Gang) -> None:
    members = gang_members(state, gang)
    for member in members:
        unqueue(state, member)
    for member in members:
        admit(state, changes, member, policy=GANG_POLICY)


def _vacate(state: EngineState, rec: Rec) -> None:
    """Take an admitted request out of the admitted set and give its capacity back."""
    del state.admitted[rec.request_id]
    state.usage.add(rec, -1)
    state.settled_at_us = None
    if rec.amounts or state.fair:
        state.amounts_epoch += 1
    state.preemptible_admitted.discard(rec.request_id)


def finish(
    state: EngineState,
    changes: Changes,
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
        unqueue(state, rec)
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
            place_gang(state, gang)


def displace(state: EngineState, changes: Changes, victim: Rec, by: Rec) -> None:
    _vacate(state, victim)
    victim.admitted_us = None
    victim.lease_expires_us = None
    enqueue(state, victim, state.now_us + victim.timeout_us)
    changes.emit(
        "displaced", victim, "admitted",
        f"displaced by {by.request_id} ({LANE_OVERRIDE_POLICY})",
        related=by.request_id, policy=LANE_OVERRIDE_POLICY,
    )


def expire(state: EngineState, changes: Changes, rec: Rec) -> None:
    """A lease ran out: the request, and with it every admitted member of its gang, goes back to
    the queue while it has requeue attempts left and fits once it is gone (ADR-004); otherwise
    it ends timed-out."""
    if rec.gang is None:
        unit = [rec]
        fits = fits_now(state, rec.class_key, without=unit)
    else:
        others = [member for member in gang_members(state, state.gangs[rec.gang]) if member is not rec]
        unit = [rec] + [member for member in others if member.state == "admitted"]
        fits = gang_blocker(state, sorted(unit, key=lambda member: member.request_id), without=unit) is None
    limit = state.policy.max_requeue_attempts
    if rec.requeue_attempts < limit and fits:
        for member in unit:
            _vacate(state, member)
            member.requeue_attempts += 1
            member.admitted_us = None
            member.lease_expires_us = None
            member.resubmit(state.now_us)
            enqueue(state, member, state.now_us + member.timeout_us, place=False)
            changes.emit(
                "requeued", member, "admitted",
                f"lease expired; requeued (attempt {member.requeue_attempts}/{limit})",
                related=None if member is rec else rec.request_id, policy=REQUEUE_POLICY,
            )
        if rec.gang is not None:
            place_gang(state, state.gangs[rec.gang])
        return
    for member in unit:
        finish(
            state, changes, member, "timed-out", "timed-out", "admission lease expired; capacity recovered",
            related=None if member is rec else rec.request_id,
        )


def drop_expired_terminal(state: EngineState) -> None:
    fifo = state.terminal_fifo
    horizon = state.now_us - state.retention_us
    while fifo and fifo[0][0] <= horizon:
        finished_us, request_id = fifo.popleft()
        rec = state.records.get(request_id)
        if rec is not None and rec.state in TERMINAL_STATES and rec.finished_us == finished_us:
            del state.records[request_id]
