"""The admission singleton's pure core: what one host group's workflow decides, with no Temporal in it.

`AdmissionWorkflow` is the shell around it, as `MissionWorkflow` is around the mission's
supervisor. The shell hands over what arrives (`hear`: a signal's batch; `heard_gone`: requesters a
sweep found closed) and asks, with the time, what to do: `decide` runs one pass through the engine
and returns the decisions to signal and the audit events; the `AuditOutbox` says which batch of
events to export and when; the `SweepClock` when to look for requesters that closed without giving
their leases back; `next_wake` when the loop must run again. The shell carries those out (signals,
activities, one timer, continue-as-new) and nothing else.

Everything a continued run needs is in one `SingletonState`, carried whole in its compact form
(`carry`/`SingletonState.restoring`), so tests, the benchmarks and the workflow build it alike
(tests/engine/test_admission_singleton.py).
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from workflows.admission import codec, engine
from workflows.admission.holders import is_holder
from workflows.admission.messages import (
    AdmissionDecision,
    AdmissionWorkflowInput,
    CarriedState,
    DecisionBatch,
    InboxItem,
    LeaseRow,
    QueueRow,
    RenewBatch,
    SweepResult,
    WhatIf,
)
from workflows.admission.model import AdmissionRequest, AuditEvent, Cancel, Extend, OpResult, Reconcile, Release, Renew, SetPolicy, Submit

AUDIT_EXPORT_DELAY = timedelta(seconds=1)  # how long an audit event may wait for others to leave with
MAX_EVENTS_PER_EXPORT = 500  # keeps one export's input far below the server's payload limit
CARRY_AT_MOST = 100  # inbox items a continue-as-new carries without one more decision pass first
HOLDER_EXPIRED = "the holder's lease expired unrenewed; a holder is not requeued (it has stopped what the lease was for)"
REQUESTER_GONE = "requester closed without giving it back"


@dataclass
class AuditOutbox:
    """Audit events not known stored yet. They leave together, at most AUDIT_EXPORT_DELAY after the
    oldest, one export in flight at most: an export is three events and a workflow task of the
    singleton's, and started for every pass of a busy host group they were a quarter of its history."""

    waiting: list[AuditEvent] = field(default_factory=list)
    exporting: list[AuditEvent] = field(default_factory=list)  # kept until the export is stored
    due: datetime | None = None  # when the oldest waiting event must leave

    def add(self, events: Iterable[AuditEvent], now: datetime) -> None:
        self.waiting.extend(events)
        if self.waiting and self.due is None:
            self.due = now + AUDIT_EXPORT_DELAY

    def take(self, now: datetime) -> list[AuditEvent] | None:
        """The batch to export now, if one is due: a full one, or the oldest event's time has come."""
        if self.exporting or not self.waiting:
            return None
        if not (len(self.waiting) >= MAX_EVENTS_PER_EXPORT or (self.due is not None and now >= self.due)):
            return None
        self.due = None
        self.exporting = self.waiting[:MAX_EVENTS_PER_EXPORT]
        del self.waiting[:MAX_EVENTS_PER_EXPORT]
        return self.exporting

    def stored(self, now: datetime) -> datetime | None:
        """The export in flight is stored. Returns when what arrived meanwhile must leave: the
        shell's timer must fire by then whether or not other news wakes the loop."""
        self.exporting = []
        if not self.waiting:
            return None
        if self.due is None:
            self.due = now + AUDIT_EXPORT_DELAY
        return max(self.due, now + timedelta(milliseconds=1))

    @property
    def wake(self) -> datetime | None:
        """When the loop must run to export, unless an export is in flight (its end re-arms)."""
        return None if self.exporting else self.due

    def unstored(self) -> list[AuditEvent]:
        return self.exporting + self.waiting


@dataclass
class SweepClock:
    """When to ask visibility for requesters that closed without giving their leases back.

    Such a requester (terminated by an operator, timed out) would otherwise keep its capacity until
    the lease TTL runs out, or until a decision to it fails; the sweep bounds that by its interval,
    so the TTL can be long and renewals rare (docs/scaling.md)."""

    swept_from: datetime | None = None  # where the next sweep reads visibility from (a run's start at first)
    next_at: datetime | None = None
    unsupported: bool = False  # this server cannot list workflows: off for the run
    running: bool = False

    def start(self, now: datetime, every_seconds: int | None, anything_held: bool) -> timedelta | None:
        """Starts a sweep if one is due and anything is held; returns its interval then."""
        if every_seconds is None or self.unsupported:
            self.next_at = None
            return None
        every = timedelta(seconds=every_seconds)
        if self.next_at is None:  # the first, or sweeps were just turned on
            self.next_at = now + every
        if self.running or now < self.next_at or not anything_held:
            return None
        self.next_at = now + every
        self.running = True
        return every

    def ended(self, result: SweepResult | None) -> list[str]:
        """The requesters found gone (none if the sweep failed: the next one tries again)."""
        self.running = False
        if result is None:
            return []
        if not result.supported:
            self.unsupported = True
            return []
        self.swept_from = result.next_closed_since
        return result.gone


@dataclass
class Decided:
    """One pass: the decisions to signal, one batch per requester, and what happened."""

    signals: list[tuple[str, DecisionBatch]]
    events: list[AuditEvent]


@dataclass
class SingletonState:
    host_group: str
    engine: engine.EngineState
    requesters: dict[str, str]  # request id -> its requester's workflow id (live as long as the record)
    audit_chain: str  # first run id of the chain: keys the audit store across continue-as-new
    max_requests_per_pass: int = 500
    recent: deque[AuditEvent] = field(default_factory=deque)  # the audit query's window
    sweep: SweepClock = field(default_factory=SweepClock)
    inbox: list[InboxItem] = field(default_factory=list)
    gone: set[str] = field(default_factory=set)  # requesters to abandon at the next pass
    outbox: AuditOutbox = field(default_factory=AuditOutbox)
    # requester -> its request ids, for renewals that name none (rebuilt, never carried)
    by_requester: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))

    @classmethod
    def restoring(
        cls, input: AdmissionWorkflowInput, run_id: str, started: datetime, now: datetime,
    ) -> tuple[SingletonState, codec.Restore | None]:
        """A new run's state, and the decoding left to do (`index` once it is done) if it carried
        more records than one activation may decode."""
        carried = input.carried
        recent: deque[AuditEvent] = deque(maxlen=input.recent_audit_events)
        if carried is None:
            return cls(
                host_group=input.host_group, max_requests_per_pass=input.max_requests_per_pass,
                engine=engine.new_state(input.policy), requesters={}, recent=recent, audit_chain=run_id,
                sweep=SweepClock(swept_from=started),
            ), None
        restore = codec.Restore(carried.engine)  # the engine blob carries the requester map too
        recent.extend(_unpack(carried.recent_audit_packed, AuditEvent))
        state = cls(
            host_group=input.host_group, max_requests_per_pass=input.max_requests_per_pass,
            engine=restore.state, requesters=restore.requesters, recent=recent, audit_chain=carried.audit_chain,
            sweep=SweepClock(swept_from=carried.swept_from or started),
            inbox=_unpack(carried.inbox_packed, InboxItem), gone=set(carried.gone_requesters),
            outbox=AuditOutbox(waiting=_unpack(carried.audit_outbox_packed, AuditEvent)),
        )
        if state.outbox.waiting:
            state.outbox.due = now  # what an earlier run left leaves at once
        if restore.step(input.restore_records_per_task):
            state.index()
            return state, None
        return state, restore

    def index(self) -> None:
        self.by_requester = defaultdict(set)
        for request_id, requester in self.requesters.items():
            self.by_requester[requester].add(request_id)

    def carry(self) -> CarriedState:
        """The compact form a continued run starts from (also what the benchmarks size)."""
        return CarriedState(
            engine=codec.encode(self.engine, self.requesters),  # the requester map of the records travels inside
            inbox_packed=_pack(self.inbox),
            gone_requesters=sorted(self.gone),
            swept_from=self.sweep.swept_from,
            recent_audit_packed=_pack(self.recent),
            audit_outbox_packed=_pack(self.outbox.unstored()),
            audit_chain=self.audit_chain,
        )

    def holds_anything(self) -> bool:
        return bool(self.engine.admitted) or self.engine.queued_count > 0

    def live_requests_of(self, requester: str) -> list[str]:
        """The requester's requests that hold a lease or wait for one."""
        records = self.engine.records
        return sorted(
            request_id for request_id in self.by_requester.get(requester, ())
            if (rec := records.get(request_id)) is not None and rec.state in ("queued", "admitted")
        )


def _pack(items: Iterable) -> str | None:
    dumped = [item.model_dump(mode="json") for item in items]
    return codec.pack_json(dumped) if dumped else None


def _unpack(blob: str | None, model):
    return [] if blob is None else [model.model_validate(item) for item in codec.unpack_json(blob)]  # type: ignore[union-attr]


# --- what arrives -------------------------------------------------------------------------------


def hear(state: SingletonState, item: InboxItem) -> None:
    """A signal's batch joins the inbox; the next pass decides it."""
    state.inbox.append(item)


def has_work(state: SingletonState, now: datetime) -> bool:
    """Whether a pass is due now."""
    if state.inbox or state.gone:
        return True
    wake = engine.next_wakeup(state.engine)
    return wake is not None and wake <= now


def next_wake(state: SingletonState) -> datetime | None:
    """When the loop must run with no news: the engine's next wake-up (lease expiry, queue deadline
    or aging step), the next sweep (while anything is held), or the audit events' due time."""
    moments = [engine.next_wakeup(state.engine), state.outbox.wake]
    if state.holds_anything():
        moments.append(state.sweep.next_at)
    return min((moment for moment in moments if moment is not None), default=None)


def hand_over_after_one_more_pass(state: SingletonState) -> bool:
    """A burst arrived while the outbound work settled before continue-as-new: one more pass decides
    it rather than carry it all (what arrives after that is carried)."""
    return len(state.inbox) > CARRY_AT_MOST


# --- one pass -------------------------------------------------------------------------------------


def decide(state: SingletonState, now: datetime, warn: Callable[[str], None] = lambda line: None) -> Decided:
    """One pass: the inbox's next batch through the engine, one decision batch per requester.
    `warn` hears what an operator should see in the log (a refused request id, a requester gone)."""
    items = take_inbox(state)
    touched: dict[str, dict[str, None]] = defaultdict(dict)
    errors: dict[tuple[str, str], OpResult] = {}
    events: list[AuditEvent] = []
    unconfirmed: set[str] = set()  # released or cancelled with confirm=False: nobody to tell

    def apply(op, requester: str | None, request_id: str | None) -> OpResult:
        state.engine, result, new_events = engine.apply(state.engine, op, now)
        events.extend(new_events)
        if requester is not None and request_id is not None:
            touched[requester][request_id] = None
            if not result.ok:
                errors[(requester, request_id)] = result
        return result

    def refuse(requester: str, request_id: str) -> None:
        warn(f"{requester} named request {request_id}, which is not its own; refused")
        touched[requester][request_id] = None  # its decision says `unknown`: "no such request"

    # Requester renewals first: each took effect when it was sent, before this pass's clock
    # could expire what it renews. They touch no one (no event, no decision back).
    _extend(state, [item.renew for item in items if item.renew is not None and item.renew.everything], now, apply)
    for requester in sorted(state.gone):
        live = state.live_requests_of(requester)
        if live:
            warn(f"requester {requester} is gone; releasing {', '.join(live)}")
        for request_id in live:
            rec = state.engine.records[request_id]
            give_back = Release if rec.state == "admitted" else Cancel
            apply(give_back(request_id=request_id, reason=REQUESTER_GONE), None, None)
    state.gone.clear()
    for item in items:
        _apply_item(state, item, apply, unconfirmed, refuse)
    if not items:
        apply(Reconcile(), None, None)
    # A holder whose lease expired has stopped its work (or is gone): requeued, its request would
    # take the capacity again until a second expiry. It ends instead, and the holder hears it.
    for event in [event for event in events if event.type == "requeued"]:
        requester = state.requesters.get(event.request_id or "")
        if requester is not None and is_holder(requester):
            apply(Cancel(request_id=event.request_id, reason=HOLDER_EXPIRED), requester, event.request_id)

    happened: dict[str, list[AuditEvent]] = defaultdict(list)
    for event in events:
        if event.request_id is None:
            continue
        happened[event.request_id].append(event)
        requester = state.requesters.get(event.request_id)
        if requester is not None and event.request_id not in unconfirmed:
            touched[requester].setdefault(event.request_id, None)
    state.recent.extend(events)
    _forget_dropped(state)
    state.outbox.add(events, now)
    signals = []
    etas = _etas(state, [request_id for requests in touched.values() for request_id in requests])
    for requester in sorted(touched):
        decisions = [
            decision(state, requester, request_id, happened.get(request_id, []), errors.get((requester, request_id)), etas)
            for request_id in sorted(touched[requester])
        ]
        signals.append((requester, DecisionBatch(host_group=state.host_group, revision=state.engine.revision, decisions=decisions)))
    return Decided(signals=signals, events=events)


# The forecast runs inside a workflow task (a decision pass, a query), which must stay far below the
# SDK's 2 s deadlock detector: it copies the queue (so only up to FORECAST_QUEUE_LIMIT queued) and
# plays at most FORECAST_MOMENTS moments, each an admission pass. Beyond either, eta is None
# (docs/scaling.md). Both are counts, never clock time, so a replay forecasts the same.
FORECAST_QUEUE_LIMIT = 2_000
FORECAST_MOMENTS = 100


def _forecastable(state: SingletonState) -> bool:
    return state.engine.queued_count <= FORECAST_QUEUE_LIMIT


def _etas(state: SingletonState, request_ids: list[str]) -> dict[str, datetime | None]:
    records = state.engine.records
    queued = [request_id for request_id in request_ids if (rec := records.get(request_id)) is not None and rec.state == "queued"]
    if not queued or not _forecastable(state):
        return {}
    return engine.forecast(state.engine, queued, FORECAST_MOMENTS)


def what_if(state: SingletonState, request: AdmissionRequest) -> WhatIf:
    """What submitting `request` now would do, and when it would start if it queued."""
    outcome, explanation = engine.what_if(state.engine, request)
    eta = engine.forecast_new(state.engine, request, FORECAST_MOMENTS) if outcome == "queued" and _forecastable(state) else None
    return WhatIf(outcome=outcome, explanation=explanation, eta=eta)


def take_inbox(state: SingletonState) -> list[InboxItem]:
    """The inbox items of one pass: up to `max_requests_per_pass` requests or leases they name
    (a submit batch that does not fit is split; any other signal is taken whole)."""
    # Requester renewals always go, all of them: each must be applied before a pass's clock
    # can expire what it renews, and they cost a pass next to nothing.
    taken = [item for item in state.inbox if _renews_everything(item)]
    if taken:
        state.inbox = [item for item in state.inbox if not _renews_everything(item)]
    budget = state.max_requests_per_pass
    others = 0
    inbox = state.inbox
    while inbox and budget > 0:
        item = inbox[0]
        if item.submit is not None and len(item.submit.requests) > budget and not others:
            requests = item.submit.requests
            inbox[0] = item.model_copy(update={"submit": item.submit.model_copy(update={"requests": requests[budget:]})})
            taken.append(item.model_copy(update={"submit": item.submit.model_copy(update={"requests": requests[:budget]})}))
            break
        size = _weight(item)
        if others and size > budget:
            break
        taken.append(inbox.pop(0))
        others += 1
        budget -= size
    return taken


def _renews_everything(item: InboxItem) -> bool:
    return item.renew is not None and item.renew.everything


def _weight(item: InboxItem) -> int:
    """What an inbox item costs a decision pass, in requests or leases."""
    if item.submit is not None:
        return len(item.submit.requests)
    if item.renew is not None:
        return max(1, len(item.renew.leases))
    batch = item.release or item.cancel
    return max(1, len(batch.request_ids)) if batch is not None else 1


def _apply_item(state: SingletonState, item: InboxItem, apply, unconfirmed: set[str], refuse) -> None:
    """One inbox item through the engine. A renewal, release or cancellation names requests of
    its sender's only: any other is refused (`refuse`: its sender hears `unknown`), since any
    client can send these signals and a request id is no secret."""
    if item.submit is not None:
        requester = item.submit.requester
        for request in item.submit.requests:
            result = apply(Submit(request=request), requester, request.request_id)
            if result.ok and request.request_id not in state.requesters:
                state.requesters[request.request_id] = requester
                state.by_requester[requester].add(request.request_id)
    elif item.renew is not None:
        requester = item.renew.requester
        for lease in item.renew.leases:  # a requester renewal (`everything`) names none
            if state.requesters.get(lease.request_id) != requester:
                refuse(requester, lease.request_id)
                continue
            apply(Renew(request_id=lease.request_id, lease_revision=lease.lease_revision), requester, lease.request_id)
    elif item.release is not None or item.cancel is not None:
        batch = item.release or item.cancel
        assert batch is not None
        give_back = Release if item.release is not None else Cancel
        for request_id in batch.request_ids:
            if state.requesters.get(request_id) != batch.requester:
                refuse(batch.requester, request_id)
                continue
            apply(give_back(request_id=request_id), batch.requester if batch.confirm else None, request_id)
        if not batch.confirm:
            unconfirmed.update(batch.request_ids)
    elif item.set_policy is not None:  # the audit trail records the operator (SetPolicy)
        change = item.set_policy
        apply(SetPolicy(policy=change.policy, operator=change.operator, drain=change.drain), None, None)


def _extend(state: SingletonState, batches: list[RenewBatch], now: datetime, apply) -> None:
    """Every lease each requester holds, renewed as of when it sent the renewal (at most now)."""
    renewals: dict[str, datetime] = {}
    for batch in batches:
        renewed_at = now if batch.sent_at is None else min(batch.sent_at, now)
        for request_id in state.by_requester.get(batch.requester, ()):
            renewals[request_id] = max(renewed_at, renewals.get(request_id, renewed_at))
    if renewals:
        apply(Extend.model_construct(renewals=renewals), None, None)


def _forget_dropped(state: SingletonState) -> None:
    """Requester addresses live exactly as long as their records (terminal retention)."""
    records = state.engine.records
    if len(state.requesters) > 2 * max(1, len(records)):
        state.requesters = {rid: who for rid, who in state.requesters.items() if rid in records}
        state.index()


def requester_unreachable(state: SingletonState, requester: str) -> bool:
    """A decision could not be signalled to `requester`. True if it still holds or waits for
    anything, which the next pass then gives back (a late decision to a closed holder workflow
    is nothing to act on)."""
    if not state.live_requests_of(requester):
        return False
    state.gone.add(requester)
    return True


# --- what clients read ----------------------------------------------------------------------------


def decision(
    state: SingletonState, requester: str, request_id: str, its_events: list[AuditEvent] = (), error: OpResult | None = None,
    etas: dict[str, datetime | None] | None = None,
) -> AdmissionDecision:
    """Where `request_id` stands, as its requester may learn it."""
    rec = state.engine.records.get(request_id)
    error_code = error.error.code if error is not None and error.error is not None else None
    if rec is None or state.requesters.get(request_id) != requester:
        # Only the owner learns a record's state; anyone else (an identity
        # collision, say) must never mistake someone else's lease for its own.
        return AdmissionDecision(
            request_id=request_id, state="unknown", error_code=error_code,
            reason=error.error.message if error is not None and error.error is not None else "no such request",
        )
    model = rec.to_model()
    related = [event.related_request_id for event in its_events if event.related_request_id]
    answer = AdmissionDecision(
        request_id=request_id,
        state=model.state,
        revision=model.revision,
        happened=[event.type for event in its_events],
        reason=model.reason,
        lease_revision=model.lease_revision,
        lease_expires_at=model.lease_expires_at,
        lease_ttl_seconds=state.engine.policy.lease_ttl_seconds,
        related_request_id=related[-1] if related else model.preempted_by,
        error_code=error_code,
    )
    if rec.state == "queued":
        answer.position = engine.queue_position(state.engine, rec)
        answer.binding_constraint = engine.waiting_on(state.engine, rec)
        answer.eta = (etas or {}).get(request_id)
    return answer


def queue_rows(state: SingletonState, limit: int) -> list[QueueRow]:
    records, now_us = state.engine.records, state.engine.now_us
    return [
        QueueRow(
            request_id=entry.request_id,
            requester=state.requesters.get(entry.request_id),
            position=entry.position,
            priority=(rec := records[entry.request_id]).priority,
            effective_priority=entry.effective_priority,
            binding_constraint=entry.binding_constraint,
            waited_seconds=max(0, now_us - rec.submitted_us) / 1_000_000,
            eta=entry.eta,
        )
        for entry in engine.queue_view(state.engine, eta_moments=FORECAST_MOMENTS if _forecastable(state) else 0)[:limit]
    ]


def lease_rows(state: SingletonState) -> list[LeaseRow]:
    rows = []
    for rec in sorted(state.engine.admitted.values(), key=lambda rec: (rec.lease_expires_us, rec.request_id)):
        model = rec.to_model()
        rows.append(LeaseRow(
            request_id=rec.request_id,
            holder=state.requesters.get(rec.request_id),
            environment=model.environment,
            provider=model.provider,
            runtime_kind=model.runtime_kind,
            lane=model.lane,
            lease_revision=model.lease_revision,
            admitted_at=model.admitted_at,  # type: ignore[arg-type]
            lease_expires_at=model.lease_expires_at,  # type: ignore[arg-type]
            preemptible=model.preemptible,
        ))
    return rows


def live_requesters(state: SingletonState) -> list[str]:
    """The requester workflows that hold or wait for a lease here (what a sweep checks)."""
    return sorted(who for who in state.by_requester if state.live_requests_of(who))


def _held(policy) -> str:
    if not policy.hold:
        return ""
    return f"; HELD: nothing new is admitted{' (' + policy.hold_reason + ')' if policy.hold_reason else ''}"


@dataclass(frozen=True)
class Report:
    """What the UI's current details and the metrics show after a pass."""

    details: str
    queued: int
    usage: list[tuple[str, int, int | None]]
    admitted_after: list[float]  # seconds each admission of the pass waited
    expired: int
    preempted: int


def report(state: SingletonState, events: list[AuditEvent]) -> Report:
    usage = engine.usage_view(state.engine)
    queued = state.engine.queued_count
    records = state.engine.records
    limits = ", ".join(
        f"{label} {used}/{maximum}" if maximum is not None else f"{label} {used} (no limit)"
        for label, used, maximum in usage if maximum is not None or used
    )
    return Report(
        details=(
            f"admission for host group {state.host_group}: {queued} queued, {len(state.engine.admitted)} leases held"
            f"{'; ' + limits if limits else ''}{_held(state.engine.policy)}"
        ),
        queued=queued,
        usage=usage,
        admitted_after=[
            (engine.to_micros(event.at) - records[event.request_id].submitted_us) / 1_000_000
            for event in events if event.type == "admitted" and event.request_id in records
        ],
        expired=sum(1 for event in events if event.from_state == "admitted" and event.type in ("timed-out", "requeued")),
        preempted=sum(1 for event in events if event.type in ("preempted", "displaced")),
    )
