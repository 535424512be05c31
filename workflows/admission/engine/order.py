"""Admission order: effective priority (base priority plus aging) and the order key among equals
(fair share, then FIFO).
"""

from __future__ import annotations

from workflows.admission.engine.state import (
    ClassKey,
    EngineState,
    OrderKey,
    Rec,
    held_share,
)


def effective_priority(state: EngineState, rec: Rec, now_us: int | None = None) -> int:
    now = state.now_us if now_us is None else now_us
    return rec.priority + max(0, now - rec.submitted_us) // state.aging_us


def order_key(state: EngineState, rec: Rec) -> OrderKey:
    if state.fair:
        return (-effective_priority(state, rec), held_share(state, rec.orchestrator), rec.submitted_us, rec.request_id)
    return (-effective_priority(state, rec), rec.submitted_us, rec.request_id)


def is_gang_key(key: tuple) -> bool:
    return key[0] is None


def sortable(key: ClassKey) -> tuple:
    return (key[0], key[1], key[2], key[3] or "", key[4], key[5])
