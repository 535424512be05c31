"""Keeping the indexes true as records join and leave the queue, and rebuilding them from the
records alone (a carried state).
"""

from __future__ import annotations

import heapq

from sortedcontainers import SortedList

from workflows.admission.engine.order import is_gang_key, sortable
from workflows.admission.engine.state import (
    EngineState,
    Gang,
    QueueClass,
    Rec,
    gang_members,
    gang_ready,
    trie_add,
    trie_remove,
)
from workflows.admission.model import TERMINAL_STATES


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
        place_gang(state, gang)
    terminal.sort()
    state.terminal_fifo.extend(terminal)
    heapq.heapify(state.lease_heap)
    heapq.heapify(state.deadline_heap)
    state.settled_at_us = None
    state.plan = None


def _class_add(state: EngineState, key: tuple, rec: Rec) -> None:
    classes = state.gang_classes if is_gang_key(key) else state.classes
    queue_class = classes.get(key)
    if queue_class is None:
        queue_class = classes[key] = QueueClass(key, state.fair)
        if classes is state.gang_classes:
            trie_add(state.gang_trie, key)
    queue_class.add(rec)
    rec.queue_key = key
    if rec.amounts:
        state.amounts_epoch += 1
        if classes is state.classes:
            waiting = state.amount_queue.get(rec.priority)
            if waiting is None:
                waiting = state.amount_queue[rec.priority] = SortedList()
            waiting.add((rec.submitted_us, rec.request_id))


def _join_gang(state: EngineState, rec: Rec) -> Gang:
    gang = state.gangs.get(rec.gang)  # type: ignore[arg-type]
    if gang is None:
        gang = state.gangs[rec.gang] = Gang(rec.gang, rec.gang_size)  # type: ignore[index, arg-type]
    gang.members.add(rec.request_id)
    if rec.state == "queued":
        state.parked[rec.request_id] = rec
        rec.queue_key = None
    return gang


def unqueue(state: EngineState, rec: Rec) -> None:
    """Take a queued request out of whichever queue index holds it (its state is unchanged)."""
    if rec.amounts:
        state.amounts_epoch += 1
    key = rec.queue_key
    if key is None:
        state.parked.pop(rec.request_id, None)
        return
    classes = state.gang_classes if is_gang_key(key) else state.classes
    queue_class = classes[key]
    queue_class.remove(rec)
    if rec.amounts and classes is state.classes:
        waiting = state.amount_queue[rec.priority]
        waiting.remove((rec.submitted_us, rec.request_id))
        if not waiting:
            del state.amount_queue[rec.priority]
    if queue_class.size == 0:
        del classes[key]
        if classes is state.gang_classes:
            trie_remove(state.gang_trie, key)
    rec.queue_key = None


def place_gang(state: EngineState, gang: Gang) -> None:
    """Put a gang's queued members where they belong: in the class of the gang's shape when it
    is ready to run, parked while it is still forming."""
    members = gang_members(state, gang)
    queued = [member for member in members if member.state == "queued"]
    ready = gang_ready(gang, members)
    shape_key = (None, tuple(sorted((member.class_key for member in members), key=sortable))) if ready else None
    for member in queued:
        if member.queue_key == shape_key and (shape_key is not None or member.request_id in state.parked):
            continue
        unqueue(state, member)
        if shape_key is None:
            state.parked[member.request_id] = member
        else:
            _class_add(state, shape_key, member)
    state.settled_at_us = None


def enqueue(state: EngineState, rec: Rec, deadline_us: int, *, place: bool = True) -> None:
    rec.state = "queued"
    rec.queue_deadline_us = deadline_us
    heapq.heappush(state.deadline_heap, (deadline_us, rec.request_id))
    state.settled_at_us = None
    if rec.gang is None:
        _class_add(state, rec.class_key, rec)
        return
    gang = _join_gang(state, rec)
    if place:
        place_gang(state, gang)
