"""The operations (submit, renew, extend, release, cancel, set a policy, reconcile, snapshot):
`apply(state, operation, now)` is the engine's one entry point that changes anything.
"""

from __future__ import annotations

import heapq
from datetime import datetime

from workflows.admission.engine.indexes import enqueue
from workflows.admission.engine.order import is_gang_key, order_key
from workflows.admission.engine.refusals import (
    gang_refusal,
    never_runs,
    not_found,
    op_error,
)
from workflows.admission.engine.scheduling import tick
from workflows.admission.engine.state import EngineState, Rec, install_policy, to_micros
from workflows.admission.engine.transitions import Changes, finish
from workflows.admission.engine.views import snapshot
from workflows.admission.engine.preemption import preemption_units
from workflows.admission.model import (
    DRAIN_POLICY,
    HOLD_POLICY,
    QUOTA_POLICY,
    AuditEvent,
    Cancel,
    Extend,
    OpResult,
    Reconcile,
    Release,
    Renew,
    SetPolicy,
    Submit,
    TakeSnapshot,
)


def _submit(state: EngineState, changes: Changes, op: Submit) -> Rec | OpResult:
    request = op.request
    existing = state.records.get(request.request_id)
    if existing is not None:
        if existing.request.placement_identity() != request.placement_identity():
            return op_error(
                "submit", "identity-collision",
                f"request {request.request_id} already exists with placement "
                f"{existing.request.placement_identity()}; a replay must repeat it exactly, "
                "a new request needs a new request_id",
            )
        return existing
    if getattr(request, "gang_id", None) is not None:
        refusal = gang_refusal(state, request)
        if refusal is not None:
            return refusal
    rec = Rec(request)
    state.records[rec.request_id] = rec
    denial = never_runs(state.policy, rec.class_key)
    if denial is not None:
        rec.state = "denied"
        rec.finished_us = state.now_us
        state.terminal_fifo.append((state.now_us, rec.request_id))
        changes.emit("denied", rec, None, denial, policy=QUOTA_POLICY)
    else:
        enqueue(state, rec, rec.submitted_us + rec.timeout_us)
        changes.emit("queued", rec, None, "queued")
    return rec


def _renew(state: EngineState, changes: Changes, op: Renew) -> Rec | OpResult:
    rec = state.records.get(op.request_id)
    if rec is None:
        return not_found("renew", op.request_id)
    if rec.state != "admitted":
        return op_error(
            "renew", "not-admitted",
            f"request {op.request_id} is {rec.state} ({rec.reason}); only an admitted lease can be "
            "renewed: submit again to queue for a new one",
        )
    if op.lease_revision is not None and op.lease_revision != rec.lease_revision:
        return op_error(
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


def _release(state: EngineState, changes: Changes, op: Release) -> Rec | OpResult:
    rec = state.records.get(op.request_id)
    if rec is None:
        return not_found("release", op.request_id)
    if rec.state == "queued":
        return op_error(
            "release", "not-admitted",
            f"request {op.request_id} is still queued; cancel it instead of releasing it",
        )
    if rec.state == "admitted":
        finish(state, changes, rec, "released", "released", op.reason or "released by holder")
    return rec


def _cancel(state: EngineState, changes: Changes, op: Cancel) -> Rec | OpResult:
    rec = state.records.get(op.request_id)
    if rec is None:
        return not_found("cancel", op.request_id)
    if rec.state in ("queued", "admitted"):
        finish(state, changes, rec, "cancelled", "cancelled", op.reason or "cancelled by requester")
    return rec


def _set_policy(state: EngineState, changes: Changes, op: SetPolicy) -> OpResult:
    was_held = state.policy.hold
    install_policy(state, op.policy)
    by = f" by {op.operator}" if op.operator else ""
    why = f": {op.policy.hold_reason}" if op.policy.hold_reason else ""
    if op.policy.hold and not was_held:
        reason, kind = f"admission held{by}{why}", HOLD_POLICY
    elif was_held and not op.policy.hold:
        reason, kind = f"admission resumed{by}", HOLD_POLICY
    else:
        reason, kind = f"policy changed{by}", "set_policy"
    changes.emit("policy-changed", None, None, reason, policy=kind)
    if op.drain and op.policy.hold:
        _drain(state, changes, f"drained{by}{why}")
    doomed: list[Rec] = []
    for key, queue_class in [*state.classes.items(), *state.gang_classes.items()]:
        if is_gang_key(key):
            doomed.extend(
                state.records[request_id] for request_id in queue_class.members()
                if never_runs(state.policy, state.records[request_id].class_key) is not None
            )
        elif never_runs(state.policy, key) is not None:
            doomed.extend(state.records[request_id] for request_id in queue_class.members())
    doomed.extend(rec for rec in state.parked.values() if never_runs(state.policy, rec.class_key) is not None)
    doomed.sort(key=lambda rec: order_key(state, rec))
    for rec in doomed:
        finish(state, changes, rec, "denied", "denied", never_runs(state.policy, rec.class_key) or "", policy=QUOTA_POLICY)
    return OpResult(op="set_policy", ok=True)


def _drain(state: EngineState, changes: Changes, reason: str) -> None:
    """Preempt every preemptible lease (a gang only when all its admitted members are), in
    request_id order: what a hold with --drain does (Kueue's HoldAndDrain)."""
    for unit in sorted(preemption_units(state), key=lambda unit: unit[0].request_id):
        for victim in unit:
            finish(state, changes, victim, "preempted", "preempted", reason, policy=DRAIN_POLICY, place=False)


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
    changes = Changes(state)
    if operation.op == "extend":
        result = _extend(state, operation)  # type: ignore[arg-type]
        tick(state, changes)
        return state, result, changes.events
    tick(state, changes)
    handler = _HANDLERS.get(operation.op)
    outcome = handler(state, changes, operation) if handler else None
    tick(state, changes)
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
