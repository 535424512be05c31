"""A deliberately naive reference implementation of docs/admission-engine.md.

It is the oracle the property tests compare `workflows.admission.engine` against, so
it trades every bit of speed for being obviously right: records live in a plain dict,
the whole queue is re-sorted on every decision, every count is a linear scan, and all
time arithmetic is exact `datetime`/`timedelta` (integer microseconds; aging uses
`timedelta // timedelta`). It produces the engine's boundary models
(`AdmissionRecord`, `Snapshot`, `AuditEvent`, `OpResult`) with the same public shape:
`new_state(policy)` and `apply(state, op, now) -> (state, result, events)`.

Reasons, event `policy` / `related_request_id` / `from_state` follow the spec's tables.
Choices where the spec is silent (written down so the engine can be held to them):
- admission (plain, by override or by preemption) keeps `queue_deadline`; finishing keeps
  `admitted_at` and `lease_expires_at` (only displacement clears them);
- a result's record is the record after the final tick, or its last version if that tick
  dropped it (terminal_retention_seconds 0); error results carry no record;
- both ticks run even when the operation fails, and the clamped clock advances on every call;
- float seconds become whole microseconds the way `timedelta(seconds=...)` rounds them (the
  spec does not say; sub-microsecond inputs may round differently elsewhere).

Later rules, written from the spec the same naive way: ADR-004 bounded requeue after lease
expiry (the expired request, and every admitted member of its gang, back to the queue with a
fresh submission time while attempts remain and it fits without itself); gangs (a gang is
whatever live records share orchestrator and gang id, recomputed on every question); fair
share (held leases counted by scanning the admitted records, shares as exact fractions).

Amounts of named resources, reservations, backfill, hold and the forecast (issue 37), the same
naive way: usage is a sum over the admitted records; the reservation plan is rebuilt from the
sorted queue for every question, each request's earliest start found by trying every moment a
lease or reservation ends and checking the amounts in use at every moment of its window; the
forecast runs this reference itself on a deep copy, releasing each lease at its expected end.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from fractions import Fraction
from typing import Callable

from workflows.admission.model import (
    BACKFILL_POLICY,
    DRAIN_POLICY,
    FAIR_SHARE_POLICY,
    HOLD_POLICY,
    GANG_POLICY,
    LANE_OVERRIDE_POLICY,
    PREEMPTION_POLICY,
    QUOTA_POLICY,
    REQUEUE_POLICY,
    TERMINAL_STATES,
    AdmissionPolicy,
    AdmissionRecord,
    AdmissionRequest,
    AuditEvent,
    Cancel,
    Extend,
    OpError,
    OpResult,
    QueueEntry,
    Reconcile,
    Release,
    Renew,
    SetPolicy,
    Snapshot,
    Submit,
    TakeSnapshot,
    amount_text,
)

CLASS_RANK = {"P0": 0, "P1": 1, "P2": 2, "P3": 3}  # P0 highest ... P3 lowest


@dataclass
class RefState:
    policy: AdmissionPolicy
    records: dict[str, AdmissionRecord] = field(default_factory=dict)
    revision: int = 0
    clock: datetime | None = None


def new_state(policy: AdmissionPolicy) -> RefState:
    return RefState(policy=policy)


def seconds(value: float) -> timedelta:
    """Policy/request durations are float seconds; timedelta rounds them to whole microseconds."""
    return timedelta(seconds=value)


# --- one operation's context: the clamped time, the events emitted, records dropped ---------------


@dataclass
class _Op:
    state: RefState
    now: datetime
    events: list[AuditEvent] = field(default_factory=list)
    dropped: dict[str, AdmissionRecord] = field(default_factory=dict)

    @property
    def policy(self) -> AdmissionPolicy:
        return self.state.policy

    def emit(self, type_: str, request_id: str | None, from_state: str | None, to_state: str | None,
             reason: str, related: str | None = None, policy: str | None = None) -> None:
        self.state.revision += 1
        self.events.append(AuditEvent(
            seq=self.state.revision, type=type_, at=self.now, request_id=request_id,
            from_state=from_state, to_state=to_state, reason=reason,
            related_request_id=related, policy=policy,
        ))

    def create(self, request: AdmissionRequest, event: str, policy: str | None = None, **fields: object) -> None:
        record = AdmissionRecord(**request.model_dump(), revision=1, **fields)
        self.state.records[record.request_id] = record
        self.emit(event, record.request_id, None, record.state, record.reason, policy=policy)

    def change(self, request_id: str, event: str, related: str | None = None, policy: str | None = None,
               **updates: object) -> None:
        old = self.state.records[request_id]
        new = old.model_copy(update={**updates, "revision": old.revision + 1})
        self.state.records[request_id] = new
        self.emit(event, request_id, old.state, new.state, new.reason, related, policy)


# --- capacity -------------------------------------------------------------------------------------


def limits(policy: AdmissionPolicy, r: AdmissionRecord | AdmissionRequest) -> list[tuple[str, str, int, Callable[[AdmissionRecord], bool]]]:
    """The applicable limits of r in `fits` order: (kind, label, limit, 'counts against it')."""
    out: list[tuple[str, str, int, Callable[[AdmissionRecord], bool]]] = [
        ("global", "global", policy.max_concurrent, lambda a: True)
    ]
    if r.environment in policy.environment_quotas:
        out.append(("environment", f"environment {r.environment}", policy.environment_quotas[r.environment],
                    lambda a: a.environment == r.environment))
    if r.provider in policy.provider_quotas:
        out.append(("provider", f"provider {r.provider}", policy.provider_quotas[r.provider],
                    lambda a: a.provider == r.provider))
    if r.runtime_kind in policy.runtime_quotas:
        runtime_limit: int | None = policy.runtime_quotas[r.runtime_kind]
    elif r.runtime_kind == "host":
        runtime_limit = policy.default_host_quota
    else:
        runtime_limit = None
    if runtime_limit is not None:
        out.append(("runtime", f"runtime {r.runtime_kind}", runtime_limit,
                    lambda a: a.runtime_kind == r.runtime_kind))
    if r.lane is not None and r.lane in policy.lane_wip_limits:
        out.append(("lane", f"lane {r.lane}", policy.lane_wip_limits[r.lane], lambda a: a.lane == r.lane))
    return out


def thousandths(amount: float) -> int:
    return round(amount * 1000)


def binding(policy: AdmissionPolicy, r: AdmissionRecord, admitted: list[AdmissionRecord]) -> tuple[str, str] | None:
    """(kind, 'label used/limit') of the first limit r does not fit, or None when it fits: quotas
    first, then resources by name."""
    for kind, label, limit, counts in limits(policy, r):
        used = sum(1 for a in admitted if counts(a))
        if used >= limit:
            return kind, f"{label} {used}/{limit}"
    for name in sorted(r.resources):
        used = sum(thousandths(a.resources.get(name, 0)) for a in admitted)
        capacity = thousandths(policy.resource_capacity.get(name, 0))
        if used + thousandths(r.resources[name]) > capacity:
            return "resource", f"resource {name} {amount_text(used)}/{amount_text(capacity)}"
    return None


def never_runs(policy: AdmissionPolicy, r: AdmissionRecord | AdmissionRequest) -> str | None:
    """The denial reason when some applicable limit is 0, else None."""
    names = {
        "global": lambda: "max_concurrent is 0",
        "environment": lambda: f"environment quota for {r.environment} is 0",
        "provider": lambda: f"provider quota for {r.provider} is 0",
        "runtime": lambda: f"runtime quota for {r.runtime_kind} is 0",
        "lane": lambda: f"lane WIP limit for {r.lane} is 0",
    }
    for kind, _label, limit, _counts in limits(policy, r):
        if limit == 0:
            return f"{names[kind]()}: this request can never run"
    offered = policy.resource_capacity
    for name in sorted(r.resources):
        if name not in offered:
            has = f"it offers {', '.join(sorted(offered))}" if offered else "its policy sets no resource_capacity"
            return f"resource {name} is not offered by this host group ({has}): this request can never run"
        if thousandths(r.resources[name]) > thousandths(offered[name]):
            return (f"resource {name}: asks {amount_text(thousandths(r.resources[name]))} but the host group has "
                    f"{amount_text(thousandths(offered[name]))} in all: this request can never run")
    return None


# --- order ----------------------------------------------------------------------------------------


def eff(policy: AdmissionPolicy, r: AdmissionRecord, now: datetime) -> int:
    age = max(timedelta(0), now - r.submitted_at)
    return r.priority + age // seconds(policy.aging_interval_seconds)


def share(op: _Op, orchestrator_id: str) -> Fraction:
    """Held leases per unit of weight (0 when fair share is off: then it orders nothing)."""
    fair = op.policy.fair_share
    if fair is None:
        return Fraction(0)
    held = sum(1 for a in admitted(op) if a.orchestrator_id == orchestrator_id)
    return Fraction(held, fair.weights.get(orchestrator_id, fair.default_weight))


def order(op: _Op, r: AdmissionRecord) -> tuple:
    if op.policy.fair_share is None:
        return (-eff(op.policy, r, op.now), r.submitted_at, r.request_id)
    return (-eff(op.policy, r, op.now), share(op, r.orchestrator_id), r.submitted_at, r.request_id)


def queue(op: _Op) -> list[AdmissionRecord]:
    queued = [r for r in op.state.records.values() if r.state == "queued"]
    return sorted(queued, key=lambda r: order(op, r))


def admitted(op: _Op) -> list[AdmissionRecord]:
    return [r for r in op.state.records.values() if r.state == "admitted"]


def gang_of(op: _Op, r: AdmissionRecord | AdmissionRequest) -> list[AdmissionRecord]:
    """The live members of r's gang (queued or admitted), by request id."""
    return sorted(
        (a for a in op.state.records.values()
         if a.gang_id is not None and a.gang_id == r.gang_id and a.orchestrator_id == r.orchestrator_id
         and a.state in ("queued", "admitted")),
        key=lambda a: a.request_id,
    )


def gang_ready(op: _Op, r: AdmissionRecord) -> bool:
    members = gang_of(op, r)
    if any(m.state != "queued" for m in members):
        return False
    return len(members) >= r.gang_size or any(m.lease_revision > 0 for m in members)


def gang_blocked(policy: AdmissionPolicy, members: list[AdmissionRecord], running: list[AdmissionRecord]) -> str | None:
    """'member needs label used/limit' for the first member (by id) that does not fit with the
    earlier ones placed; None when they all fit at once."""
    placed: list[AdmissionRecord] = []
    for m in members:
        bound = binding(policy, m, running + placed)
        if bound is not None:
            return f"{m.request_id} needs {bound[1]}"
        placed.append(m)
    return None


def waiting_on(op: _Op, r: AdmissionRecord) -> str:
    if op.policy.hold:
        return f"hold: {op.policy.hold_reason}" if op.policy.hold_reason else "hold"
    if r.gang_id is None:
        bound = binding(op.policy, r, admitted(op))
        text = "none" if bound is None else bound[1]
    else:
        members = gang_of(op, r)
        if not gang_ready(op, r):
            return f"gang {r.gang_id} waiting for members {len(members)}/{r.gang_size}"
        blocked = gang_blocked(op.policy, members, admitted(op))
        text = "none" if blocked is None else f"gang {r.gang_id}: {blocked}"
    if text != "none" or not r.resources:
        return text
    for q, start in reservations(op):  # it fits every limit: a reservation ahead holds it back
        if order(op, q) < order(op, r) and start < FAR:
            shared = sorted(set(q.resources) & set(r.resources))
            if shared:
                return f"resource {shared[0]} reserved for {q.request_id}"
    return "none"


# --- reservations and backfill --------------------------------------------------------------------

FAR = datetime.max.replace(tzinfo=timezone.utc)
UNKNOWN = FAR - timedelta(microseconds=1)


def class_of(r: AdmissionRecord) -> tuple:
    return (r.environment, r.provider, r.runtime_kind, r.lane or "", r.priority_class, tuple(sorted(r.resources.items())))


def lease_end(r: AdmissionRecord, now: datetime) -> datetime:
    if r.expected_duration_seconds is None:
        return UNKNOWN
    return max(r.admitted_at + seconds(r.expected_duration_seconds), now + timedelta(microseconds=1))


def window_end(start: datetime, duration: float | None) -> datetime:
    return FAR if duration is None or start >= UNKNOWN else start + seconds(duration)


def fits_window(policy: AdmissionPolicy, held: list[tuple[datetime, datetime, dict]], resources: dict,
                start: datetime, end: datetime) -> bool:
    """Whether `resources` fit beside `held` (start, end, amounts) at every moment of [start, end)."""
    moments = [start] + [begin for begin, _end, _amounts in held if start < begin < end]
    for moment in moments:
        for name, asked in resources.items():
            used = sum(thousandths(amounts.get(name, 0)) for begin, stop, amounts in held if begin <= moment < stop)
            if used + thousandths(asked) > thousandths(policy.resource_capacity.get(name, 0)):
                return False
    return True


def earliest(op: _Op, held: list, r: AdmissionRecord, floor: datetime) -> datetime:
    moments = sorted({floor} | {stop for _begin, stop, _amounts in held if stop > floor})
    for moment in moments:
        if moment >= FAR:
            break
        if fits_window(op.policy, held, r.resources, moment, window_end(moment, r.expected_duration_seconds)):
            return moment
    return FAR


def leases_held(op: _Op, without: set[str] = frozenset()) -> list:  # type: ignore[assignment]
    return [(op.now, lease_end(a, op.now), a.resources) for a in admitted(op) if a.resources and a.request_id not in without]


def reservations(op: _Op) -> list[tuple[AdmissionRecord, datetime]]:
    """The plan: the first reservation_depth queued singles naming resources, in order, each
    reserved from its earliest start when that is not now."""
    held = leases_held(op)
    plan = []
    floors: dict[tuple, datetime] = {}
    walked = [r for r in queue(op) if r.gang_id is None and r.resources][: op.policy.reservation_depth]
    for r in walked:
        start = earliest(op, held, r, floors.get(class_of(r), op.now))
        if start == op.now:
            continue
        plan.append((r, start))
        floors[class_of(r)] = start
        if start < FAR:
            held.append((start, window_end(start, r.expected_duration_seconds), r.resources))
    return plan


def passes(op: _Op, r: AdmissionRecord, resources: dict, duration: float | None,
           without: set[str] = frozenset()) -> tuple[bool, bool]:  # type: ignore[assignment]
    """(may r start now beside the reservations ahead of it, is any of them on a resource it asks)."""
    if not resources:
        return True, False
    key = order(op, r)
    ahead = [(q, start) for q, start in reservations(op)
             if order(op, q) < key and set(q.resources) & set(resources) and start < FAR]
    if not ahead:
        return True, False
    held = leases_held(op, without) + [
        (start, window_end(start, q.expected_duration_seconds), q.resources) for q, start in ahead
    ]
    return fits_window(op.policy, held, resources, op.now, window_end(op.now, duration)), True


def gang_demand(members: list[AdmissionRecord]) -> tuple[dict, float | None]:
    totals: dict[str, float] = {}
    for m in members:
        for name, amount in m.resources.items():
            totals[name] = (thousandths(totals.get(name, 0)) + thousandths(amount)) / 1000
    durations = [m.expected_duration_seconds for m in members]
    return totals, (None if None in durations else max(durations))  # type: ignore[type-var]


# --- tick and admission loop ----------------------------------------------------------------------


def tick(op: _Op) -> None:
    now, policy = op.now, op.policy
    for rid, r in list(op.state.records.items()):
        if r.state in TERMINAL_STATES and r.finished_at + seconds(policy.terminal_retention_seconds) <= now:
            op.dropped[rid] = r
            del op.state.records[rid]
    expired = [r for r in admitted(op) if r.lease_expires_at <= now]
    for r in sorted(expired, key=lambda r: (r.lease_expires_at, r.request_id)):
        if op.state.records[r.request_id].state == "admitted":  # not already gone with its gang
            expire(op, op.state.records[r.request_id])
    overdue = [r for r in op.state.records.values() if r.state == "queued" and r.queue_deadline <= now]
    for r in sorted(overdue, key=lambda r: (r.queue_deadline, r.request_id)):
        op.change(r.request_id, "timed-out", state="timed-out", finished_at=now, reason="queue deadline elapsed")
    admission_loop(op)


def expire(op: _Op, r: AdmissionRecord) -> None:
    now, policy = op.now, op.policy
    unit = [r]
    if r.gang_id is not None:
        unit += [m for m in gang_of(op, r) if m.request_id != r.request_id and m.state == "admitted"]
    ids = {u.request_id for u in unit}
    others = [a for a in admitted(op) if a.request_id not in ids]
    if r.gang_id is None:
        fits = binding(policy, r, others) is None
    else:
        fits = gang_blocked(policy, sorted(unit, key=lambda u: u.request_id), others) is None
    limit = policy.max_requeue_attempts
    requeue = r.requeue_attempts < limit and fits
    for u in unit:
        related = None if u.request_id == r.request_id else r.request_id
        if requeue:
            attempt = u.requeue_attempts + 1
            op.change(u.request_id, "requeued", related, REQUEUE_POLICY, state="queued", requeue_attempts=attempt,
                      submitted_at=now, queue_deadline=now + seconds(u.queue_timeout_seconds),
                      admitted_at=None, lease_expires_at=None,
                      reason=f"lease expired; requeued (attempt {attempt}/{limit})")
        else:
            op.change(u.request_id, "timed-out", related, state="timed-out", finished_at=now,
                      reason="admission lease expired; capacity recovered")


def admit(op: _Op, r: AdmissionRecord, related: str | None = None, policy: str | None = None) -> None:
    op.change(r.request_id, "admitted", related, policy, state="admitted", reason="admitted",
              admitted_at=op.now, lease_expires_at=op.now + seconds(op.policy.lease_ttl_seconds),
              lease_revision=r.lease_revision + 1)


def admission_loop(op: _Op) -> None:
    if op.policy.hold:
        return
    barred: set = set()  # classes (gangs: their first member) whose head waits for a reservation
    while True:
        running = admitted(op)
        waiting = queue(op)
        for r in waiting:
            if r.gang_id is None:
                if class_of(r) in barred or binding(op.policy, r, running) is not None:
                    continue
                allowed, passed = passes(op, r, r.resources, r.expected_duration_seconds)
                if not allowed:
                    barred.add(class_of(r))
                    continue
                policy = BACKFILL_POLICY if passed else FAIR_SHARE_POLICY if op.policy.fair_share is not None else None
                admit(op, r, policy=policy)
                break
            elif gang_ready(op, r) and gang_blocked(op.policy, gang_of(op, r), running) is None:
                members = gang_of(op, r)
                shape = ("gang", tuple(sorted(class_of(m) for m in members)))
                if shape in barred:
                    continue
                if not passes(op, r, *gang_demand(members))[0]:
                    barred.add(shape)
                    continue
                for m in members:
                    admit(op, m, policy=GANG_POLICY)
                break
        else:
            barred = set()
            singles = [r for r in waiting if r.gang_id is None]  # a gang never displaces or preempts
            if not any(try_lane_override(op, r) or try_preemption(op, r) for r in singles):
                return


def try_lane_override(op: _Op, r: AdmissionRecord) -> bool:
    policy = op.policy
    pa = policy.priority_admission
    if not pa.enabled or r.priority_class not in pa.override_priorities:
        return False
    if r.lane is None or r.lane not in policy.lane_wip_limits:
        return False
    running = admitted(op)
    bound = binding(policy, r, running)
    if bound is None or bound[0] != "lane":
        return False  # lane is checked last, so a lane binding means every other limit fits
    victims = [a for a in running if a.lane == r.lane and CLASS_RANK[a.priority_class] > CLASS_RANK[r.priority_class]
               and a.gang_id is None]  # a gang is spared whole
    if not victims:
        return False
    victim = max(victims, key=lambda a: (CLASS_RANK[a.priority_class], a.admitted_at, a.request_id))
    if binding(policy, r, [a for a in running if a.request_id != victim.request_id]) is not None:
        return False
    if not passes(op, r, r.resources, r.expected_duration_seconds, {victim.request_id})[0]:
        return False
    op.change(victim.request_id, "displaced", r.request_id, LANE_OVERRIDE_POLICY,
              state="queued", admitted_at=None, lease_expires_at=None,
              queue_deadline=op.now + seconds(victim.queue_timeout_seconds),
              reason=f"displaced by {r.request_id} ({LANE_OVERRIDE_POLICY})")
    admit(op, op.state.records[r.request_id], victim.request_id, LANE_OVERRIDE_POLICY)
    return True


def try_preemption(op: _Op, r: AdmissionRecord) -> bool:
    policy = op.policy
    if not policy.allow_preemption:
        return False
    running = admitted(op)
    e_r = eff(policy, r, op.now)
    # Units: a preemptible single, or a gang whose every admitted member is preemptible.
    units: list[list[AdmissionRecord]] = []
    for v in running:
        if v.gang_id is None:
            if v.preemptible:
                units.append([v])
        else:
            members = [m for m in gang_of(op, v) if m.state == "admitted"]
            if members[0].request_id == v.request_id and all(m.preemptible for m in members):
                units.append(members)

    def strength(unit: list[AdmissionRecord]) -> int:
        return max(eff(policy, m, op.now) for m in unit)

    eligible = [unit for unit in units if strength(unit) + policy.preemption_margin < e_r]
    # Victim order: (eff ascending, submitted_at descending, request_id descending), by stable sorts from the last key.
    eligible.sort(key=lambda u: max(m.request_id for m in u), reverse=True)
    eligible.sort(key=lambda u: max(m.submitted_at for m in u), reverse=True)
    eligible.sort(key=strength)

    def fits_without(chosen: list[list[AdmissionRecord]]) -> bool:
        ids = {m.request_id for unit in chosen for m in unit}
        if binding(policy, r, [a for a in running if a.request_id not in ids]) is not None:
            return False
        return passes(op, r, r.resources, r.expected_duration_seconds, ids)[0]

    chosen = next(([unit] for unit in eligible if fits_without([unit])), None)
    if chosen is None and r.resources:
        # Several units: in victim order until it fits, then back every one it can do without, strongest first.
        for count in range(1, len(eligible) + 1):
            if fits_without(eligible[:count]):
                chosen = eligible[:count]
                break
        if chosen is not None:
            for unit in list(reversed(chosen[:-1])):
                rest = [other for other in chosen if other is not unit]
                if fits_without(rest):
                    chosen = rest
    if chosen is None:
        return False
    victims = [m for unit in chosen for m in unit]
    for victim in victims:
        op.change(victim.request_id, "preempted", r.request_id, PREEMPTION_POLICY, state="preempted",
                  preempted_by=r.request_id, finished_at=op.now, reason=f"preempted by {r.request_id}")
    admit(op, op.state.records[r.request_id], victims[0].request_id, PREEMPTION_POLICY)
    return True


# --- operations -----------------------------------------------------------------------------------


def _error(op_name: str, code: str, message: str) -> OpResult:
    return OpResult(op=op_name, ok=False, error=OpError(code=code, message=message))


def _operate(op: _Op, operation: object) -> OpResult | str | None:
    """Step 2. Returns an OpResult, or the id of the record the final result must carry."""
    records = op.state.records
    if isinstance(operation, Submit):
        req = operation.request
        existing = records.get(req.request_id)
        if existing is not None:
            if existing.placement_identity() == req.placement_identity():
                return req.request_id
            return _error("submit", "identity-collision",
                          f"request {req.request_id} already exists with placement "
                          f"{existing.placement_identity()}, not {req.placement_identity()}")
        if req.gang_id is not None:
            members = gang_of(op, req)
            if any(m.gang_size != req.gang_size for m in members):
                return _error("submit", "gang-mismatch", f"gang {req.gang_id} has another gang_size")
            if any(m.state == "admitted" for m in members):
                return _error("submit", "gang-running", f"gang {req.gang_id} is admitted")
            if len(members) >= req.gang_size:
                return _error("submit", "gang-full", f"gang {req.gang_id} is full")
        denial = never_runs(op.policy, req)
        if denial is not None:
            op.create(req, "denied", QUOTA_POLICY, state="denied", reason=denial, finished_at=op.now)
        else:
            op.create(req, "queued", state="queued", reason="queued",
                      queue_deadline=req.submitted_at + seconds(req.queue_timeout_seconds))
        return req.request_id
    if isinstance(operation, Renew):
        r = records.get(operation.request_id)
        if r is None:
            return _error("renew", "not-found", f"no request {operation.request_id}")
        if r.state != "admitted":
            return _error("renew", "not-admitted", f"request {r.request_id} is {r.state}, not admitted")
        if operation.lease_revision is not None and operation.lease_revision != r.lease_revision:
            return _error("renew", "stale-lease-revision",
                          f"lease revision {operation.lease_revision} is stale; current is {r.lease_revision}")
        op.change(r.request_id, "renewed", reason="lease renewed",
                  lease_expires_at=op.now + seconds(op.policy.lease_ttl_seconds),
                  lease_revision=r.lease_revision + 1)
        return r.request_id
    if isinstance(operation, Release):
        r = records.get(operation.request_id)
        if r is None:
            return _error("release", "not-found", f"no request {operation.request_id}")
        if r.state == "queued":
            return _error("release", "not-admitted", f"request {r.request_id} is queued, not admitted")
        if r.state == "admitted":
            op.change(r.request_id, "released", state="released", finished_at=op.now, reason="released by holder")
        return r.request_id
    if isinstance(operation, Cancel):
        r = records.get(operation.request_id)
        if r is None:
            return _error("cancel", "not-found", f"no request {operation.request_id}")
        if r.state in ("queued", "admitted"):
            op.change(r.request_id, "cancelled", state="cancelled", finished_at=op.now, reason="cancelled by requester")
        return r.request_id
    if isinstance(operation, Reconcile):
        return OpResult(op="reconcile", ok=True)
    if isinstance(operation, TakeSnapshot):
        return None  # built after the final tick
    if isinstance(operation, SetPolicy):
        was_held = op.policy.hold
        new = op.state.policy = operation.policy
        operator = getattr(operation, "operator", None)  # optional field, newer than the first spec
        by = f" by {operator}" if operator else ""
        why = f": {new.hold_reason}" if new.hold_reason else ""
        if new.hold and not was_held:
            op.emit("policy-changed", None, None, None, f"admission held{by}{why}", policy=HOLD_POLICY)
        elif was_held and not new.hold:
            op.emit("policy-changed", None, None, None, f"admission resumed{by}", policy=HOLD_POLICY)
        else:
            op.emit("policy-changed", None, None, None, f"policy changed{by}", policy="set_policy")
        if operation.drain and new.hold:
            # Every preemptible single, and every gang whose admitted members all are, by request id.
            units = []
            for a in sorted(admitted(op), key=lambda a: a.request_id):
                members = [a] if a.gang_id is None else [m for m in gang_of(op, a) if m.state == "admitted"]
                if members[0].request_id == a.request_id and all(m.preemptible for m in members):
                    units.append(members)
            for unit in units:
                for m in unit:
                    op.change(m.request_id, "preempted", policy=DRAIN_POLICY, state="preempted",
                              finished_at=op.now, reason=f"drained{by}{why}")
        for r in queue(op):
            denial = never_runs(op.policy, r)
            if denial is not None:
                op.change(r.request_id, "denied", policy=QUOTA_POLICY, state="denied", reason=denial,
                          finished_at=op.now)
        return OpResult(op="set_policy", ok=True)
    raise TypeError(f"not an admission operation: {operation!r}")


def forecast(op: _Op) -> dict[str, datetime | None]:
    """Each queued request's predicted start: this reference run forward on a copy, every lease
    released at its expected end and renewed until then, nothing new arriving."""
    waiting = {r.request_id for r in queue(op)}
    found: dict[str, datetime | None] = {rid: None for rid in waiting}
    if not waiting:
        return found
    sim = copy.deepcopy(op.state)
    now = op.now
    for _ in range(10_000):
        for rid, r in sim.records.items():  # holders renew: no lease expires
            if r.state == "admitted":
                sim.records[rid] = r.model_copy(update={"lease_expires_at": FAR})
        step = _Op(sim, now)
        # Expected ends as of the forecast's start: a lease already past its end ends just after it.
        moments = [lease_end(a, op.now) for a in admitted(step) if a.expected_duration_seconds is not None]
        moments += [r.queue_deadline for r in queue(step)]
        singles = [r for r in queue(step) if r.gang_id is None or gang_ready(step, r)]
        if sim.policy.allow_preemption and any(a.preemptible for a in admitted(step)) and \
                any(r.gang_id is None for r in singles):
            aging = seconds(sim.policy.aging_interval_seconds)
            moments += [r.submitted_at + (max(timedelta(0), now - r.submitted_at) // aging + 1) * aging for r in singles]
        if not moments or min(moments) >= UNKNOWN:
            break
        now = max(now, min(moments))
        step = _Op(sim, now)
        for a in admitted(step):
            if a.expected_duration_seconds is not None and lease_end(a, op.now) <= now:
                sim.records[a.request_id] = a.model_copy(update={"state": "released", "finished_at": now})
        tick(step)
        for rid in [rid for rid in waiting if sim.records.get(rid) is None or sim.records[rid].state != "queued"]:
            waiting.discard(rid)
            if sim.records.get(rid) is not None and sim.records[rid].state == "admitted":
                found[rid] = now
        if not waiting:
            break
    return found


def snapshot(op: _Op) -> Snapshot:
    entries = []
    etas = forecast(op)
    for position, r in enumerate(queue(op), start=1):
        entries.append(QueueEntry(request_id=r.request_id, position=position,
                                  effective_priority=eff(op.policy, r, op.now),
                                  binding_constraint=waiting_on(op, r), eta=etas[r.request_id]))
    records = {rid: r.model_copy(update={"eta": etas[rid]}) if rid in etas else r for rid, r in op.state.records.items()}
    return Snapshot(revision=op.state.revision, records=records, queue=entries)


def apply(state: RefState, operation: object, now: datetime) -> tuple[RefState, OpResult, list[AuditEvent]]:
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now must be an aware datetime")
    if state.clock is not None and state.clock > now:
        now = state.clock
    state.clock = now
    op = _Op(state, now)
    if isinstance(operation, Extend):
        # Effective when the holder sent it (never later than now): before this pass's tick.
        for rid, renewed_at in operation.renewals.items():
            at = min(renewed_at, now)
            until = at + seconds(state.policy.lease_ttl_seconds)
            r = state.records.get(rid)
            if r is not None and r.state == "admitted" and at < r.lease_expires_at < until:
                state.records[rid] = r.model_copy(update={"lease_expires_at": until})
        tick(op)
        return state, OpResult(op="extend", ok=True), op.events
    tick(op)
    outcome = _operate(op, operation)
    tick(op)
    if isinstance(outcome, OpResult):
        return state, outcome, op.events
    if outcome is None:
        return state, OpResult(op="snapshot", ok=True, snapshot=snapshot(op)), op.events
    record = state.records.get(outcome) or op.dropped[outcome]
    return state, OpResult(op=operation.op, ok=True, record=record), op.events  # type: ignore[attr-defined]
