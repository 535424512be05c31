"""The engine state in a compact, self-contained form for continue-as-new.

Only records, policy and counters are carried; every index (queue classes,
heaps, usage) is rebuilt on load, so the encoding cannot disagree with them.
Rows are positional lists and the whole document is zlib-compressed: 10,000
queued requests must fit well under the server's 2 MB payload limit. zlib
output is a pure function of its input, so this is safe in workflow code.
"""

from __future__ import annotations

import base64
import heapq
import json
import zlib

from workflows.admission.engine import EngineState, QueueClass, Rec, from_micros, new_state
from workflows.admission.model import TERMINAL_STATES, AdmissionPolicy, AdmissionRequest

FORMAT = 1
_REQUEST_FIELDS = (
    "request_id", "orchestrator_id", "environment", "provider", "runtime_kind", "priority",
    "queue_timeout_seconds", "preemptible", "lane", "priority_class",
)
_STATE_FIELDS = (
    "submitted_us", "state", "revision", "reason", "queue_deadline_us", "admitted_us",
    "lease_expires_us", "lease_revision", "finished_us", "preempted_by",
)


def pack_json(value: object) -> str:
    """Any JSON value, zlib-compressed and base64-encoded (request ids repeat a lot)."""
    raw = json.dumps(value, separators=(",", ":"), sort_keys=True).encode()
    return base64.b64encode(zlib.compress(raw, 6)).decode("ascii")


def unpack_json(blob: str) -> object:
    return json.loads(zlib.decompress(base64.b64decode(blob)))


def encode(state: EngineState) -> str:
    rows = [
        [getattr(rec.request, name) for name in _REQUEST_FIELDS] + [getattr(rec, name) for name in _STATE_FIELDS]
        for rec in state.records.values()
    ]
    document = {
        "format": FORMAT,
        "policy": state.policy.model_dump(mode="json"),
        "now_us": state.now_us,
        "revision": state.revision,
        "rows": rows,
    }
    return pack_json(document)


def decode(blob: str) -> EngineState:
    document = unpack_json(blob)
    if document.get("format") != FORMAT:
        raise ValueError(f"unknown admission state format {document.get('format')!r}; expected {FORMAT}")
    state = new_state(AdmissionPolicy.model_validate(document["policy"]))
    state.now_us = document["now_us"]
    state.revision = document["revision"]
    split = len(_REQUEST_FIELDS)
    terminal: list[tuple[int, str]] = []
    for row in document["rows"]:
        fields = dict(zip(_REQUEST_FIELDS, row[:split]))
        values = dict(zip(_STATE_FIELDS, row[split:]))
        request = AdmissionRequest.model_construct(**fields, submitted_at=from_micros(values.pop("submitted_us")))
        rec = Rec(request)
        for name, value in values.items():
            setattr(rec, name, value)
        state.records[rec.request_id] = rec
        _index(state, rec, terminal)
    terminal.sort()
    state.terminal_fifo.extend(terminal)
    heapq.heapify(state.lease_heap)
    heapq.heapify(state.deadline_heap)
    return state


def _index(state: EngineState, rec: Rec, terminal: list[tuple[int, str]]) -> None:
    if rec.state == "queued":
        queue_class = state.classes.get(rec.class_key)
        if queue_class is None:
            queue_class = state.classes[rec.class_key] = QueueClass(rec.class_key)
        queue_class.add(rec)
        state.deadline_heap.append((rec.queue_deadline_us, rec.request_id))
    elif rec.state == "admitted":
        state.admitted[rec.request_id] = rec
        state.usage.add(rec, +1)
        if rec.preemptible:
            state.preemptible_admitted.add(rec.request_id)
        state.lease_heap.append((rec.lease_expires_us, rec.request_id))
    elif rec.state in TERMINAL_STATES:
        terminal.append((rec.finished_us, rec.request_id))
