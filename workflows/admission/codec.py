"""The engine state in a compact, self-contained form for continue-as-new.

Only records, policy and counters are carried; every index (queue classes,
heaps, usage) is rebuilt on load, so the encoding cannot disagree with them.
The whole document is zlib-compressed: zlib output is a pure function of its
input, so this is safe in workflow code.

Format 3 is columnar and carries the requester map too: held leases are what a
busy singleton carries most of, and the server refuses a continue-as-new input
over 2 MB. Format 2 (positional rows, the requester map packed beside them) cost
about 30 bytes a lease and reached that limit near 65,000 held leases; format 3
costs a few bytes a lease (bench/admission_carried.py keeps a format-2 writer as
its baseline, docs/scaling.md). Only format 3 is read: while the version is 0.x,
no run needs to survive a deploy (CONTRIBUTING.md).
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Mapping

from workflows.admission.engine import EngineState, Rec, from_micros, new_state, rebuild_indexes
from workflows.admission.model import AdmissionPolicy, AdmissionRequest

FORMAT = 3  # columns, request ids split around their requester, the requester map folded in (below)


def pack_json(value: object) -> str:
    """Any JSON value, zlib-compressed and base64-encoded (request ids repeat a lot)."""
    raw = json.dumps(value, separators=(",", ":"), sort_keys=True).encode()
    return base64.b64encode(zlib.compress(raw, 6)).decode("ascii")


def unpack_json(blob: str) -> object:
    return json.loads(zlib.decompress(base64.b64decode(blob)))


# Format 3's columns. Values: one dictionary column each (a table of distinct values and an index
# per record), because nearly all of them are few-valued (placement, priority, state, counters):
# a constant column costs its one value, whatever the number of records. Ids: the same, each
# value written relative to the record's stem (below) when it contains it, so `mission:<m>` and
# `<m>` cost one form for every record. Times: integer columns, each written as the difference
# from a value the decoder already has, so times that move together cost next to nothing.
_VALUE_COLUMNS = (
    "environment", "provider", "runtime_kind", "priority", "queue_timeout_seconds", "preemptible", "lane",
    "priority_class", "gang_size", "expected_duration_seconds", "state", "revision", "reason", "lease_revision",
    "requeue_attempts",
)
_ID_COLUMNS = ("requester", "orchestrator_id", "gang_id", "preempted_by")
_RECORD_VALUES = ("state", "revision", "reason", "lease_revision", "requeue_attempts", "preempted_by")


def _ints(values: list[int | None]) -> dict:
    """Each value as its step from the previous one (None kept): ordered times, and indexes that
    change rarely, become runs of small numbers that zlib folds away."""
    if all(value == values[0] for value in values):
        return {"all": values[0] if values else None}
    steps: list[int | None] = []
    previous = 0
    for value in values:
        if value is None:
            steps.append(None)
        else:
            steps.append(value - previous)
            previous = value
    return {"steps": steps}


def _unints(column: dict, count: int) -> list:
    if "all" in column:
        return [column["all"]] * count
    values = []
    previous = 0
    for step in column["steps"]:
        if step is None:
            values.append(None)
        else:
            previous += step
            values.append(previous)
    return values


_NOTHING = object()


def _values(values: list, stems: list[str] | None = None) -> dict:
    """A table of distinct forms and each record's index into it. With `stems`, a string that
    contains its record's stem is the form [before, after]: one form for every record whose id
    column is built from its request id the same way. Forms are keyed by type as well as value,
    so True, 1 and 1.0 stay apart."""
    forms: list = []
    index: dict[tuple, int] = {}
    at: list[int | None] = []
    last: object = _NOTHING
    last_stem = ""
    number = 0
    for position, value in enumerate(values):
        stem = stems[position] if stems is not None else ""
        # Neighbours mostly share a value (one requester's requests, and, once decoded from this
        # format, the very same object): the same object next to the same stem needs no lookup.
        if value is last and stem is last_stem:
            at.append(number)
            continue
        last, last_stem = value, stem
        if stem and isinstance(value, str) and stem in value:
            cut = value.index(stem)
            key: tuple = ("~", value[:cut], value[cut + len(stem):])
            form: object = list(key[1:])
        else:
            key, form = (type(value).__name__, value), value
        number = index.get(key)
        if number is None:
            number = index[key] = len(forms)
            forms.append(form)
        at.append(number)
    return {"forms": forms, "at": _ints(at)}


def _unvalues(column: dict, count: int, stems: list[str] | None = None) -> list:
    forms = column["forms"]
    values = []
    for position, number in enumerate(_unints(column["at"], count)):
        form = forms[number]
        values.append(form[0] + stems[position] + form[1] if isinstance(form, list) else form)  # type: ignore[index]
    return values


def _split(request_id: str, requester: str | None) -> tuple[str, str]:
    """The request id as (stem, tail), the stem being its longest prefix that occurs in the
    requester's id: `<r>/w3` of requester `<r>`, and `<m>:<child>` of mission workflow `mission:<m>`
    (workflows.ids), both give the requester's part as the stem, so ten requests of one requester
    carry its id once. Any split is exact; this one is only the one that shares most. A prefix
    occurs in the requester id only if every shorter one does, so it is found by bisection."""
    if not requester:
        return "", request_id
    low, high = 0, min(len(request_id), len(requester))
    while low < high:
        middle = (low + high + 1) // 2
        if request_id[:middle] in requester:
            low = middle
        else:
            high = middle - 1
    return request_id[:low], request_id[low:]


def _ttl_us(policy: AdmissionPolicy) -> int:
    return round(policy.lease_ttl_seconds * 1_000_000)


def encode(state: EngineState, requesters: Mapping[str, str] | None = None) -> str:
    """`requesters` (request id -> requester workflow id) travels in the same blob, for the records only."""
    requesters = requesters or {}
    recs = list(state.records.values())
    holders = [requesters.get(rec.request_id) for rec in recs]
    stems: list[str] = []
    tails: list[str] = []
    for rec, holder in zip(recs, holders):
        stem, tail = _split(rec.request_id, holder)
        stems.append(stem)
        tails.append(tail)
    stem_table: dict[str, int] = {}
    for stem in stems:
        stem_table.setdefault(stem, len(stem_table))
    ttl_us = _ttl_us(state.policy)
    request = [rec.request for rec in recs]
    columns: dict[str, dict] = {
        "stem": _ints([stem_table[stem] for stem in stems]),
        "tail": _values(tails),
        "requester": _values(holders, stems),
        "orchestrator_id": _values([r.orchestrator_id for r in request], stems),
        "gang_id": _values([r.gang_id for r in request], stems),
        "preempted_by": _values([rec.preempted_by for rec in recs], stems),
        "submitted_us": _ints([rec.submitted_us for rec in recs]),
        # A queue deadline is (nearly always) submission plus queue timeout; the rest is kept exactly.
        "queue_deadline_us": _ints([
            None if rec.queue_deadline_us is None else rec.queue_deadline_us - rec.submitted_us - rec.timeout_us
            for rec in recs
        ]),
        # Admission follows submission by the wait in the queue: zero for most (nothing was waiting).
        "admitted_us": _ints([None if rec.admitted_us is None else rec.admitted_us - rec.submitted_us for rec in recs]),
        # A lease expires a TTL after admission until renewed; a requester's renewal moves all its
        # leases alike, so the offsets repeat within a requester.
        "lease_expires_us": _ints([
            rec.lease_expires_us if rec.lease_expires_us is None or rec.admitted_us is None
            else rec.lease_expires_us - rec.admitted_us - ttl_us
            for rec in recs
        ]),
        "finished_us": _ints([rec.finished_us for rec in recs]),
    }
    for name in _VALUE_COLUMNS:
        columns[name] = _values([getattr(rec, name) if name in _RECORD_VALUES else getattr(rec.request, name) for rec in recs])
    # Amounts as one canonical form per distinct map ({"gpu": 1} and {"gpu": 1.0} alike): few-valued.
    columns["resources"] = _values([
        json.dumps(sorted(r.resources.items())) if r.resources else None for r in request
    ])
    document = {
        "format": FORMAT,
        "policy": state.policy.model_dump(mode="json"),
        "now_us": state.now_us,
        "revision": state.revision,
        "count": len(recs),
        "stems": list(stem_table),
        "columns": columns,
    }
    return pack_json(document)


def decode(blob: str) -> EngineState:
    return decode_carried(blob)[0]


def decode_carried(blob: str) -> tuple[EngineState, dict[str, str]]:
    """The state and the requester map it carries."""
    restore = Restore(blob)
    restore.step(restore.count)
    return restore.state, restore.requesters


class Restore:
    """A carried state decoded a slice of records at a time.

    Decoding costs about 15 us a record, so 50,000 held leases take most of a second on a quiet
    core, and a workflow activation that runs past the Python SDK's 2 s deadlock detector fails,
    as does every retry of it: on a busy worker a singleton that carried that much never started
    again (bench/admission_sustained.py, docs/scaling.md). So a continued run decodes the records
    `step` by `step`, each in an activation of its own. The columns are unpacked once, up
    front; `state` and `requesters` fill as the steps go, and the indexes are rebuilt after the
    last one, so the state is usable only once `done`.
    """

    def __init__(self, blob: str) -> None:
        document = unpack_json(blob)
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            found = document.get("format") if isinstance(document, dict) else None
            raise ValueError(f"unknown admission state format {found!r}; expected {FORMAT}")
        self.state = new_state(AdmissionPolicy.model_validate(document["policy"]))
        self.state.now_us = document["now_us"]
        self.state.revision = document["revision"]
        self.requesters: dict[str, str] = {}
        self.done = False
        self._columns: _Columns | None = _Columns(document, self.state.policy)
        self.count, self.position = document["count"], 0

    def step(self, records: int) -> bool:
        """Decode up to `records` more records; True once the state is whole (indexes rebuilt)."""
        if self.done:
            return True
        stop = min(self.count, self.position + max(1, records))
        if self._columns is not None:
            self._columns.decode(self.state, self.requesters, self.position, stop)
        self.position = stop
        if self.position >= self.count:
            rebuild_indexes(self.state)
            self._columns = None
            self.done = True
        return self.done


class _Columns:
    """Format 3's columns, unpacked into one list per field."""

    def __init__(self, document: dict, policy: AdmissionPolicy) -> None:
        count = document["count"]
        columns = document["columns"]
        stem_table = document["stems"]
        self.stems = [stem_table[number] for number in _unints(columns["stem"], count)]
        self.tails = _unvalues(columns["tail"], count)
        self.ids = {name: _unvalues(columns[name], count, self.stems) for name in _ID_COLUMNS}
        self.values = {name: _unvalues(columns[name], count) for name in _VALUE_COLUMNS}
        self.values["resources"] = [
            dict(json.loads(form)) if form else {} for form in _unvalues(columns["resources"], count)
        ]
        self.times = {name: _unints(columns[name], count) for name in (
            "submitted_us", "queue_deadline_us", "admitted_us", "lease_expires_us", "finished_us",
        )}
        self.ttl_us = _ttl_us(policy)

    def decode(self, state: EngineState, requesters: dict[str, str], start: int, stop: int) -> None:
        stems, tails, ids, values, times, ttl_us = self.stems, self.tails, self.ids, self.values, self.times, self.ttl_us
        request_names = [name for name in _VALUE_COLUMNS if name not in _RECORD_VALUES] + ["resources"]
        for position in range(start, stop):
            request_id = stems[position] + tails[position]
            fields = {name: values[name][position] for name in request_names}
            request = AdmissionRequest.model_construct(
                request_id=request_id, orchestrator_id=ids["orchestrator_id"][position], gang_id=ids["gang_id"][position],
                submitted_at=from_micros(times["submitted_us"][position]), **fields,
            )
            rec = Rec(request)
            for name in _RECORD_VALUES:
                setattr(rec, name, ids[name][position] if name in ids else values[name][position])
            deadline = times["queue_deadline_us"][position]
            rec.queue_deadline_us = None if deadline is None else deadline + rec.submitted_us + rec.timeout_us
            admitted = times["admitted_us"][position]
            rec.admitted_us = None if admitted is None else admitted + rec.submitted_us
            expires = times["lease_expires_us"][position]
            rec.lease_expires_us = expires if expires is None or rec.admitted_us is None else expires + rec.admitted_us + ttl_us
            rec.finished_us = times["finished_us"][position]
            state.records[request_id] = rec
            holder = ids["requester"][position]
            if holder is not None:
                requesters[request_id] = holder
