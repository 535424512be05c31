"""The engine state in a compact, self-contained form for continue-as-new.

Only records, policy and counters are carried; every index (queue classes,
heaps, usage) is rebuilt on load, so the encoding cannot disagree with them.
Rows are positional lists and the whole document is zlib-compressed: 10,000
queued requests must fit well under the server's 2 MB payload limit. zlib
output is a pure function of its input, so this is safe in workflow code.
"""

from __future__ import annotations

import base64
import json
import zlib

from workflows.admission.engine import EngineState, Rec, from_micros, new_state, rebuild_indexes
from workflows.admission.model import AdmissionPolicy, AdmissionRequest

# 2: rows end with the gang fields and the requeue count (ADR-004); format 1 rows, which lack
# them, still decode (no gang, no requeue yet), so a run continued from an older one loses nothing.
FORMAT = 2
_READABLE = (1, 2)
_REQUEST_FIELDS = (
    "request_id", "orchestrator_id", "environment", "provider", "runtime_kind", "priority",
    "queue_timeout_seconds", "preemptible", "lane", "priority_class",
)
_STATE_FIELDS = (
    "submitted_us", "state", "revision", "reason", "queue_deadline_us", "admitted_us",
    "lease_expires_us", "lease_revision", "finished_us", "preempted_by",
)
_REQUEST_EXTRA = ("gang_id", "gang_size")
_STATE_EXTRA = ("requeue_attempts",)


def pack_json(value: object) -> str:
    """Any JSON value, zlib-compressed and base64-encoded (request ids repeat a lot)."""
    raw = json.dumps(value, separators=(",", ":"), sort_keys=True).encode()
    return base64.b64encode(zlib.compress(raw, 6)).decode("ascii")


def unpack_json(blob: str) -> object:
    return json.loads(zlib.decompress(base64.b64decode(blob)))


def encode(state: EngineState) -> str:
    rows = [
        [getattr(rec.request, name) for name in _REQUEST_FIELDS] + [getattr(rec, name) for name in _STATE_FIELDS]
        + [getattr(rec.request, name) for name in _REQUEST_EXTRA] + [getattr(rec, name) for name in _STATE_EXTRA]
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
    if document.get("format") not in _READABLE:
        raise ValueError(f"unknown admission state format {document.get('format')!r}; expected one of {_READABLE}")
    state = new_state(AdmissionPolicy.model_validate(document["policy"]))
    state.now_us = document["now_us"]
    state.revision = document["revision"]
    split = len(_REQUEST_FIELDS)
    base = split + len(_STATE_FIELDS)
    for row in document["rows"]:
        fields = dict(zip(_REQUEST_FIELDS, row[:split]))
        values = dict(zip(_STATE_FIELDS, row[split:base]))
        extra = row[base:]
        if extra:
            fields.update(zip(_REQUEST_EXTRA, extra[:len(_REQUEST_EXTRA)]))
            values.update(zip(_STATE_EXTRA, extra[len(_REQUEST_EXTRA):]))
        request = AdmissionRequest.model_construct(**fields, submitted_at=from_micros(values.pop("submitted_us")))
        rec = Rec(request)
        for name, value in values.items():
            setattr(rec, name, value)
        state.records[rec.request_id] = rec
    rebuild_indexes(state)
    return state
