"""AdmissionWorkflow: the durable singleton that admits work onto one host group.

A thin shell around `workflows.admission.engine`. The workflow task is the
serialisation boundary (the policy's "store transaction") and the history is
the durable store. Everything comes in by signal (missions, workloads, holders'
AdmissionHolder workflows, operators' policy changes; it takes no update: see
docs/admission-api.md, "Why no updates"). Signals only append to an inbox; the
main loop drains the inbox through the engine in one pass, so a burst of signals becomes one batch
of decisions, one `admission_decided` signal per requester and one audit export.
A pass takes at most `max_requests_per_pass` requests (a larger burst is decided
in several passes, each in a workflow task of its own), and requester renewals
(`RenewBatch.everything`) all go first, before the pass's clock can expire what
they renew (docs/scaling.md).

Time enters the engine only through `workflow.now()`, and the loop sleeps on a
single timer until the engine's next wake-up (earliest lease expiry, queue
deadline, or aging step that could enable preemption) or the next requester sweep,
which asks visibility for requesters that closed without giving their leases back;
any signal wakes it early.

Every command costs history events, and events are what a busy singleton spends
its time on. So the timer stands across passes and is only
replaced when the wake-up moves earlier (a timer that fires early just runs an
empty pass), and at most one audit export is in flight: events wait up to a
second and leave together.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict, deque
from datetime import datetime, timedelta
from typing import Annotated, Any

from pydantic import Field, TypeAdapter
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from workflows.admission import codec, engine
    from workflows.admission.holders import HolderDecisionQuery, HolderSubmit, holder_workflow_id, is_holder
    from workflows.admission.messages import (
        ADMISSION_WORKFLOW,
        BETWEEN_RESTORE_SLICES,
        DECISION_SIGNAL,
        FIND_GONE_REQUESTERS,
        REQUESTERS_QUERY,
        RESTORING,
        AdmissionDecision,
        AdmissionWorkflowInput,
        CancelBatch,
        CarriedState,
        DecisionBatch,
        InboxItem,
        LeaseRow,
        PolicyChange,
        QueueRow,
        ReleaseBatch,
        RenewBatch,
        RequesterSweep,
        SubmitBatch,
        SweepResult,
        UsageRow,
        WhatIf,
    )
    from workflows.admission.model import (
        AdmissionPolicy,
        AdmissionRequest,
        AuditEvent,
        Cancel,
        Extend,
        OpResult,
        Reconcile,
        Release,
        Renew,
        SetPolicy,
        Submit,
    )
    from workflows.audit import AuditExport
    from workflows.inbound import (
        MAX_REFUSALS_KEPT,
        Refusal,
        Refused,
        argument,
        no_argument,
        optional_argument,
        refused_start,
        signal_argument,
    )
    from workflows.metrics import AdmissionMetrics

EXPORT_AUDIT_ACTIVITY = "export_audit_events"
MAX_EVENTS_PER_EXPORT = 500  # keeps one export's input far below the server's payload limit
AUDIT_EXPORT_DELAY = timedelta(seconds=1)  # how long an audit event may wait for others to leave with
SCHEMA_HINT = "see `conductor mission schema --list` and docs/mission-control-api.md"
_LIMIT = TypeAdapter(Annotated[int, Field(ge=0, le=100_000)])
CARRY_AT_MOST = 100  # inbox items a continue-as-new carries without one more decision pass first
HOLDER_EXPIRED = "the holder's lease expired unrenewed; a holder is not requeued (it has stopped what the lease was for)"


@workflow.defn(name=ADMISSION_WORKFLOW)
class AdmissionWorkflow:
    @workflow.init
    def __init__(self, *args: Any) -> None:
        # Operators and the `temporal` CLI start host groups too (docs/admission-engine.md): a bad
        # input fails the run at once instead of its first workflow task for ever.
        try:
            input = argument(args, AdmissionWorkflowInput, "AdmissionWorkflow's input", hint=SCHEMA_HINT)
        except Refused as refused:
            raise refused_start(refused, ADMISSION_WORKFLOW) from None
        self._input = input
        self._refused: deque[Refusal] = deque(maxlen=MAX_REFUSALS_KEPT)
        carried = input.carried
        self._restore: codec.Restore | None = None
        if carried is None:
            self._state = engine.new_state(input.policy)
            self._requesters: dict[str, str] = {}
            self._inbox: list[InboxItem] = []
            self._recent: deque[AuditEvent] = deque(maxlen=input.recent_audit_events)
            self._audit_chain = workflow.info().run_id
        else:
            # The engine blob carries the requester map too. The records are decoded a slice per
            # activation (`_finish_restore`); until then the state is incomplete, and the queries
            # that read it say so.
            restore = codec.Restore(carried.engine)
            if not restore.step(input.restore_records_per_task):
                self._restore = restore
            self._state, self._requesters = restore.state, restore.requesters
            self._inbox = []
            if carried.inbox_packed is not None:
                self._inbox.extend(InboxItem.model_validate(item) for item in codec.unpack_json(carried.inbox_packed))  # type: ignore[union-attr]
            self._recent = deque(maxlen=input.recent_audit_events)
            if carried.recent_audit_packed is not None:
                self._recent.extend(AuditEvent.model_validate(event) for event in codec.unpack_json(carried.recent_audit_packed))  # type: ignore[union-attr]
            self._audit_chain = carried.audit_chain
        # requester -> its request ids, for renewals that name none (rebuilt, never carried)
        self._by_requester: dict[str, set[str]] = defaultdict(set)
        if self._restore is None:
            self._index_requesters()
        self._signalling: set[asyncio.Task[None]] = set()  # decisions on their way to requesters
        self._background: set[asyncio.Task[None]] = set()  # an audit export, a requester sweep
        self._timer: asyncio.Task[None] | None = None
        self._timer_at: datetime | None = None
        self._timer_fired = False
        # Audit events not known stored yet: those an earlier run left (carried) and, later, those of
        # the passes; the batch of the export in flight is kept until it is stored.
        self._audit_outbox: list[AuditEvent] = []
        if carried is not None and carried.audit_outbox_packed is not None:
            self._audit_outbox.extend(AuditEvent.model_validate(e) for e in codec.unpack_json(carried.audit_outbox_packed))  # type: ignore[union-attr]
        self._audit_due: datetime | None = workflow.now() if self._audit_outbox else None  # when the oldest must leave
        self._exporting: list[AuditEvent] = []
        self._handing_over = False  # continue-as-new is due and its one extra pass has begun
        self._gone_requesters: set[str] = set(carried.gone_requesters) if carried else set()
        # The requester sweep: where it reads visibility from, and when the next one is due.
        self._swept_from = (carried.swept_from if carried is not None else None) or workflow.info().start_time
        self._next_sweep_at: datetime | None = None
        self._sweeps_unsupported = False
        self._sweeping = False
        self._metrics = AdmissionMetrics(workflow.metric_meter(), input.host_group)

    # --- signals: append only; the main loop decides ---------------------------------------

    @workflow.signal(description=(
        "For requester workflows (missions, workloads) only, through workflows.admission.client; not an operator action. "
        "Queues a requester's batch of admission requests; the decisions come back as admission_decided signals."
    ))
    def submit(self, *args: Any) -> None:
        batch = signal_argument(args, SubmitBatch, "submit", self._refuse, hint=SCHEMA_HINT)
        if batch is None:
            return
        self._inbox.append(InboxItem(kind="submit", submit=batch))

    @workflow.signal(description=(
        "For holders (docs/admission-api.md): submit a holder's request under its AdmissionHolder workflow, stamped with "
        "this workflow's time; the decisions go to that workflow. Sent by the holder and by its holder workflow: a repeat "
        "changes nothing."
    ))
    def hold(self, *args: Any) -> None:
        call = signal_argument(args, HolderSubmit, "hold", self._refuse, hint=SCHEMA_HINT)
        if call is None:
            return
        if not is_holder(call.requester):  # a holder's lease ends at its expiry; only a holder workflow may ask so
            self._refuse("hold", Refused(f"requester {call.requester!r} is no holder workflow: its id must be "
                                         "holder:<host_group>/<holder>/<request_id> (docs/admission-api.md)"))
            return
        self._inbox.append(InboxItem(kind="submit", submit=SubmitBatch(
            requester=call.requester, requests=[call.request.submitted(workflow.now())],
        )))

    @workflow.signal(description=(
        "For requester workflows (missions, workloads) only, through workflows.admission.client; not an operator action. "
        "Renews held leases (sent on a durable timer at a third of the TTL): named ones, or everything the requester holds."
    ))
    def renew(self, *args: Any) -> None:
        batch = signal_argument(args, RenewBatch, "renew", self._refuse, hint=SCHEMA_HINT)
        if batch is None:
            return
        self._inbox.append(InboxItem(kind="renew", renew=batch))

    @workflow.signal(description=(
        "For requester workflows (missions, workloads) only, through workflows.admission.client; not an operator action. "
        "Gives back held leases when the work ended."
    ))
    def release(self, *args: Any) -> None:
        batch = signal_argument(args, ReleaseBatch, "release", self._refuse, hint=SCHEMA_HINT)
        if batch is None:
            return
        self._inbox.append(InboxItem(kind="release", release=batch))

    @workflow.signal(description=(
        "For requester workflows (missions, workloads) only, through workflows.admission.client; not an operator action. "
        "Withdraws queued or held requests. Operators abandon work with `conductor mission cancel`."
    ))
    def cancel(self, *args: Any) -> None:
        batch = signal_argument(args, CancelBatch, "cancel", self._refuse, hint=SCHEMA_HINT)
        if batch is None:
            return
        self._inbox.append(InboxItem(kind="cancel", cancel=batch))

    @workflow.signal(description=(
        "Operators: replace this host group's admission policy (`conductor admission policy set`). "
        "Requires the operator's name, which the audit trail records; the change applies on the next decision pass "
        "(the `policy` query shows it then). A change that cannot be read is refused and kept for the `refusals` query."
    ))
    def set_policy(self, *args: Any) -> None:
        # A signal, like everything this singleton takes: it accepts no update, so no replay of it
        # depends on the order in which a worker meets an update and other news (docs/admission-api.md).
        change = signal_argument(args, PolicyChange, "set_policy", self._refuse, hint=SCHEMA_HINT)
        if change is None:
            return
        self._inbox.append(InboxItem(kind="set_policy", set_policy=change))

    @workflow.query(description=(
        "Any client: where a holder's request stands (AdmissionDecision), by the holder's name and the "
        "request id; argument {holder, request_id}. The holder's own AdmissionHolder workflow has it too."
    ))
    def holder_decision(self, *args: Any) -> AdmissionDecision:
        call = argument(args, HolderDecisionQuery, "the holder_decision query's argument", hint=SCHEMA_HINT)
        self._require_restored()
        decision = self._decision(holder_workflow_id(self._input.host_group, call.holder, call.request_id), call.request_id)
        if decision.state == "unknown":
            raise ApplicationError(f"request {call.request_id}: {decision.reason}", type="UnknownRequest", non_retryable=True)
        return decision

    def _refuse(self, signal: str, refused: Refused) -> None:
        """A signal refused (workflows.inbound): logged, and kept for the `refusals` query."""
        workflow.logger.warning("signal %s refused: %s", signal, refused)
        self._refused.append(Refusal(at=workflow.now(), signal=signal, reason=str(refused)))

    # --- queries ----------------------------------------------------------------------------

    @workflow.query(description="The admission queue in decision order: position, effective priority, binding limit, wait.")
    def queue(self, *args: Any) -> list[QueueRow]:
        limit = optional_argument(args, _LIMIT, 1000, "the queue query's limit")
        self._require_restored()
        state = self._state
        rows = []
        for entry in engine.queue_view(state)[:limit]:
            rec = state.records[entry.request_id]
            rows.append(QueueRow(
                request_id=entry.request_id,
                requester=self._requesters.get(entry.request_id),
                position=entry.position,
                priority=rec.priority,
                effective_priority=entry.effective_priority,
                binding_constraint=entry.binding_constraint,
                waited_seconds=max(0, state.now_us - rec.submitted_us) / 1_000_000,
            ))
        return rows

    @workflow.query(description="Every held lease: holder, placement, revision and expiry.")
    def leases(self, *args: Any) -> list[LeaseRow]:
        no_argument(args, "the leases query")
        self._require_restored()
        rows = []
        for rec in sorted(self._state.admitted.values(), key=lambda rec: (rec.lease_expires_us, rec.request_id)):
            model = rec.to_model()
            rows.append(LeaseRow(
                request_id=rec.request_id,
                holder=self._requesters.get(rec.request_id),
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

    @workflow.query(name=REQUESTERS_QUERY, description=(
        "The requester workflows that hold or wait for a lease here: what the requester sweep checks against visibility."
    ))
    def requesters(self, *args: Any) -> list[str]:
        no_argument(args, "the requesters query")
        self._require_restored()
        return sorted(who for who in self._by_requester if self._live_requests_of(who))

    @workflow.query(description="Leases held against each limit of the policy (global, environment, provider, lane, runtime).")
    def usage(self, *args: Any) -> list[UsageRow]:
        no_argument(args, "the usage query")
        self._require_restored()
        return [UsageRow(limit=label, used=used, maximum=maximum) for label, used, maximum in engine.usage_view(self._state)]

    @workflow.query(description="The most recent audit events (the full trail is in the audit store: `conductor admission audit`).")
    def audit(self, *args: Any) -> list[AuditEvent]:
        limit = optional_argument(args, _LIMIT, 50, "the audit query's limit")
        return list(self._recent)[-limit:] if limit > 0 else []

    @workflow.query(description="The admission policy in force.")
    def policy(self, *args: Any) -> AdmissionPolicy:
        no_argument(args, "the policy query")
        return self._state.policy

    @workflow.query(description="What would happen to this request if it were submitted now, without submitting it.")
    def what_if(self, *args: Any) -> WhatIf:
        request = argument(args, AdmissionRequest, "the what_if query's argument", hint=SCHEMA_HINT)
        self._require_restored()
        outcome, explanation = engine.what_if(self._state, request)
        return WhatIf(outcome=outcome, explanation=explanation)

    @workflow.query(description="Signals this singleton received and did not act on, and why (the newest ones).")
    def refusals(self, *args: Any) -> list[Refusal]:
        no_argument(args, "the refusals query")
        return list(self._refused)

    def _require_restored(self) -> None:
        restore = self._restore
        if restore is not None:
            raise RuntimeError(
                f"host group {self._input.host_group}: {RESTORING} "
                f"({restore.position} of {restore.count} records); ask again in a moment"
            )

    # --- the loop ---------------------------------------------------------------------------

    @workflow.run
    async def run(self, *args: Any) -> None:
        await self._finish_restore()
        self._report([])
        while True:
            await self._wait_for_work()
            self._decide()
            if self._inbox and not self._should_continue_as_new() and not self._handing_over:
                # The pass was full: end this workflow task (its decisions go out) before the next.
                await workflow.sleep(timedelta(milliseconds=1), summary="next decision pass of a burst")
                continue
            if self._should_continue_as_new():
                # Outbound signals and audit exports must finish in this run; whatever arrives
                # meanwhile (signals, requesters found gone) is carried, not decided here, so a
                # steady burst cannot postpone continue-as-new forever.
                await self._settle_outbound()
                if len(self._inbox) > CARRY_AT_MOST and not self._handing_over:
                    # A burst arrived while the outbound work settled: one more pass decides it
                    # rather than carry it all; what arrives after that is carried.
                    self._handing_over = True
                    continue
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(self._carry())

    def _index_requesters(self) -> None:
        for request_id, requester in self._requesters.items():
            self._by_requester[requester].add(request_id)

    async def _finish_restore(self) -> None:
        """Decode the rest of the carried records, a slice per activation (codec.Restore), with a
        local activity that does nothing between slices: it ends the activation, which the SDK's
        deadlock detector times, and not the workflow task. Signals meanwhile only join the
        inbox; the first pass decides them on the whole state."""
        restore = self._restore
        if restore is None:
            return
        while not restore.done:
            await workflow.execute_local_activity(
                BETWEEN_RESTORE_SLICES, start_to_close_timeout=timedelta(seconds=10),
                summary=f"restored {restore.position} of {restore.count} carried records",
            )
            restore.step(self._input.restore_records_per_task)
        self._restore = None
        self._index_requesters()

    async def _wait_for_work(self) -> None:
        self._sweep_if_due()
        self._export_if_due()
        if self._inbox or self._gone_requesters:
            return
        wake = engine.next_wakeup(self._state)
        if wake is not None and wake <= workflow.now():
            return
        if self._next_sweep_at is not None and self._holds_anything() and (wake is None or self._next_sweep_at < wake):
            wake = self._next_sweep_at
        if self._audit_due is not None and not self._exporting and (wake is None or self._audit_due < wake):
            wake = self._audit_due
        self._timer_fired = False
        self._arm_timer(wake)
        await workflow.wait_condition(lambda: bool(self._inbox) or bool(self._gone_requesters) or self._timer_fired)

    def _arm_timer(self, wake: datetime | None) -> None:
        """Make sure a timer fires no later than `wake`, replacing the standing one only if it is later."""
        if wake is None or (self._timer_at is not None and self._timer_at <= wake):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = wake
        self._timer = asyncio.ensure_future(self._sleep_until(wake))

    async def _sleep_until(self, wake: datetime) -> None:
        try:
            await workflow.sleep(wake - workflow.now(), summary="next lease expiry, queue deadline or aging step")
        except asyncio.CancelledError:
            return  # replaced by an earlier timer, which now owns _timer/_timer_at
        self._timer, self._timer_at, self._timer_fired = None, None, True

    def _holds_anything(self) -> bool:
        return bool(self._state.admitted) or self._state.queued_count > 0

    def _sweep_if_due(self) -> None:
        """Start a requester sweep if one is due and there is anything a gone requester could hold.

        A requester that closes without giving its leases back (terminated by an operator, timed
        out) would otherwise keep its capacity until the lease TTL runs out, or until a decision to
        it fails. The sweep bounds that by its interval instead, so the TTL can be long and
        renewals rare (docs/scaling.md)."""
        every = self._state.policy.requester_sweep_seconds
        if every is None or self._sweeps_unsupported:
            self._next_sweep_at = None
            return
        now = workflow.now()
        if self._next_sweep_at is None:  # the first, or sweeps were just turned on
            self._next_sweep_at = now + timedelta(seconds=every)
        if self._sweeping or now < self._next_sweep_at or not self._holds_anything():
            return
        self._next_sweep_at = now + timedelta(seconds=every)
        self._sweeping = True
        self._in_background(self._sweep(timedelta(seconds=every)))

    async def _sweep(self, every: timedelta) -> None:
        try:
            result: SweepResult = await workflow.execute_activity(
                FIND_GONE_REQUESTERS,
                RequesterSweep(host_group=self._input.host_group, closed_since=self._swept_from),
                result_type=SweepResult,
                start_to_close_timeout=max(timedelta(seconds=30), every),
                retry_policy=RetryPolicy(maximum_attempts=2),
                summary="which requesters closed without giving their leases back",
            )
        except ActivityError as error:  # the next sweep tries again; leases still expire meanwhile
            workflow.logger.warning("requester sweep failed (%s); the next one retries", error.cause or error)
            return
        finally:
            self._sweeping = False
        if not result.supported:
            workflow.logger.warning("this server cannot list workflows; requester sweeps are off for this run")
            self._sweeps_unsupported = True
            return
        self._swept_from = result.next_closed_since
        self._gone_requesters.update(result.gone)

    def _decide(self) -> None:
        """One pass: every inbox item through the engine, then one signal per requester."""
        now = workflow.now()
        items = self._take_inbox()
        touched: dict[str, dict[str, AdmissionDecision | None]] = defaultdict(dict)
        errors: dict[tuple[str, str], OpResult] = {}
        events: list[AuditEvent] = []
        unconfirmed: set[str] = set()  # released or cancelled with confirm=False: nobody to tell

        def apply(op, requester: str | None, request_id: str | None) -> OpResult:
            self._state, result, new_events = engine.apply(self._state, op, now)
            events.extend(new_events)
            if requester is not None and request_id is not None:
                touched[requester][request_id] = None
                if not result.ok:
                    errors[(requester, request_id)] = result
            return result

        def refuse(requester: str, request_id: str) -> None:
            workflow.logger.warning("%s named request %s, which is not its own; refused", requester, request_id)
            touched[requester][request_id] = None  # its decision says `unknown`: "no such request"

        # Requester renewals first: each took effect when it was sent, before this pass's clock
        # could expire what it renews. They touch no one (no event, no decision back).
        self._extend([item.renew for item in items if item.renew is not None and item.renew.everything], now, apply)
        for requester in sorted(self._gone_requesters):
            self._abandon(requester, apply, "requester closed without giving it back")
        self._gone_requesters.clear()
        for item in items:
            self._apply_item(item, apply, unconfirmed, refuse)
        if not items:
            apply(Reconcile(), None, None)
        # A holder whose lease expired has stopped its work (or is gone): requeued, its request would
        # take the capacity again until a second expiry. It ends instead, and the holder hears it.
        for event in [event for event in events if event.type == "requeued"]:
            requester = self._requesters.get(event.request_id or "")
            if requester is not None and is_holder(requester):
                apply(Cancel(request_id=event.request_id, reason=HOLDER_EXPIRED), requester, event.request_id)

        happened: dict[str, list[AuditEvent]] = defaultdict(list)
        for event in events:
            if event.request_id is None:
                continue
            happened[event.request_id].append(event)
            requester = self._requesters.get(event.request_id)
            if requester is not None and event.request_id not in unconfirmed:
                touched[requester].setdefault(event.request_id, None)
        self._recent.extend(events)
        self._forget_dropped()
        self._send_decisions(touched, happened, errors)
        if events:
            self._export_audit(events)
        self._report(events)

    def _take_inbox(self) -> list[InboxItem]:
        """The inbox items of one pass: up to `max_requests_per_pass` requests or leases they name
        (a submit batch that does not fit is split; any other signal is taken whole)."""
        # Requester renewals always go, all of them: each must be applied before a pass's clock
        # can expire what it renews, and they cost a pass next to nothing.
        taken = [item for item in self._inbox if item.renew is not None and item.renew.everything]
        if taken:
            self._inbox = [item for item in self._inbox if not (item.renew is not None and item.renew.everything)]
        budget = self._input.max_requests_per_pass
        others = 0
        while self._inbox and budget > 0:
            item = self._inbox[0]
            if item.submit is not None and len(item.submit.requests) > budget and not others:
                requests = item.submit.requests
                self._inbox[0] = item.model_copy(update={"submit": item.submit.model_copy(update={"requests": requests[budget:]})})
                taken.append(item.model_copy(update={"submit": item.submit.model_copy(update={"requests": requests[:budget]})}))
                break
            size = _weight(item)
            if others and size > budget:
                break
            taken.append(self._inbox.pop(0))
            others += 1
            budget -= size
        return taken

    def _report(self, events: list[AuditEvent]) -> None:
        """What the UI's current details and the metrics show: queue depth and usage per limit."""
        state = self._state
        usage = engine.usage_view(state)
        queued = state.queued_count
        records = state.records
        waits = [
            (engine.to_micros(event.at) - records[event.request_id].submitted_us) / 1_000_000
            for event in events
            if event.type == "admitted" and event.request_id in records
        ]
        self._metrics.decided(
            queued=queued,
            usage=usage,
            admitted_after=waits,
            expired=sum(1 for event in events if event.from_state == "admitted" and event.type in ("timed-out", "requeued")),
            preempted=sum(1 for event in events if event.type in ("preempted", "displaced")),
        )
        limits = ", ".join(
            f"{label} {used}/{maximum}" if maximum is not None else f"{label} {used} (no limit)"
            for label, used, maximum in usage if maximum is not None or used
        )
        workflow.set_current_details(
            f"admission for host group {self._input.host_group}: {queued} queued, {len(state.admitted)} leases held"
            f"{'; ' + limits if limits else ''}"
        )

    def _apply_item(self, item: InboxItem, apply, unconfirmed: set[str], refuse) -> None:
        """One inbox item through the engine. A renewal, release or cancellation names requests of
        its sender's only: any other is refused (`refuse`: its sender hears `unknown`), since any
        client can send these signals and a request id is no secret."""
        if item.submit is not None:
            requester = item.submit.requester
            for request in item.submit.requests:
                result = apply(Submit(request=request), requester, request.request_id)
                if result.ok and request.request_id not in self._requesters:
                    self._requesters[request.request_id] = requester
                    self._by_requester[requester].add(request.request_id)
        elif item.renew is not None:
            requester = item.renew.requester
            for lease in item.renew.leases:  # a requester renewal (`everything`) names none
                if self._requesters.get(lease.request_id) != requester:
                    refuse(requester, lease.request_id)
                    continue
                apply(Renew(request_id=lease.request_id, lease_revision=lease.lease_revision), requester, lease.request_id)
        elif item.release is not None or item.cancel is not None:
            batch = item.release or item.cancel
            assert batch is not None
            give_back = Release if item.release is not None else Cancel
            for request_id in batch.request_ids:
                if self._requesters.get(request_id) != batch.requester:
                    refuse(batch.requester, request_id)
                    continue
                apply(give_back(request_id=request_id), batch.requester if batch.confirm else None, request_id)
            if not batch.confirm:
                unconfirmed.update(batch.request_ids)
        elif item.set_policy is not None:
            workflow.logger.info("policy changed by %s", item.set_policy.operator)
            apply(SetPolicy(policy=item.set_policy.policy, operator=item.set_policy.operator), None, None)

    def _extend(self, batches: list[RenewBatch], now: datetime, apply) -> None:
        """Every lease each requester holds, renewed as of when it sent the renewal (at most now)."""
        renewals: dict[str, datetime] = {}
        for batch in batches:
            renewed_at = now if batch.sent_at is None else min(batch.sent_at, now)
            for request_id in self._by_requester.get(batch.requester, ()):
                renewals[request_id] = max(renewed_at, renewals.get(request_id, renewed_at))
        if renewals:
            apply(Extend.model_construct(renewals=renewals), None, None)

    def _live_requests_of(self, requester: str) -> list[str]:
        """The requester's requests that hold a lease or wait for one."""
        records = self._state.records
        return sorted(
            request_id for request_id in self._by_requester.get(requester, ())
            if (rec := records.get(request_id)) is not None and rec.state in ("queued", "admitted")
        )

    def _abandon(self, requester: str, apply, why: str) -> None:
        """A requester that no longer exists gives back everything it holds or waits for."""
        live = self._live_requests_of(requester)
        if live:
            workflow.logger.warning("requester %s is gone; releasing %s", requester, ", ".join(live))
        for request_id in live:
            rec = self._state.records[request_id]
            apply(Release(request_id=request_id, reason=why) if rec.state == "admitted" else Cancel(request_id=request_id, reason=why), None, None)

    def _forget_dropped(self) -> None:
        """Requester addresses live exactly as long as their records (terminal retention)."""
        if len(self._requesters) > 2 * max(1, len(self._state.records)):
            records = self._state.records
            self._requesters = {rid: who for rid, who in self._requesters.items() if rid in records}
            self._by_requester = defaultdict(set)
            for rid, who in self._requesters.items():
                self._by_requester[who].add(rid)

    def _send_decisions(self, touched, happened, errors) -> None:
        for requester in sorted(touched):
            decisions = []
            for request_id in sorted(touched[requester]):
                error = errors.get((requester, request_id))
                decisions.append(self._decision(requester, request_id, happened.get(request_id, []), error))
            batch = DecisionBatch(host_group=self._input.host_group, revision=self._state.revision, decisions=decisions)
            self._send(self._signal_requester(requester, batch))

    def _decision(
        self, requester: str, request_id: str, its_events: list[AuditEvent] = (), error: OpResult | None = None,
    ) -> AdmissionDecision:
        """Where `request_id` stands, as its requester may learn it."""
        state = self._state
        rec = state.records.get(request_id)
        error_code = error.error.code if error is not None and error.error is not None else None
        if rec is None or self._requesters.get(request_id) != requester:
            # Only the owner learns a record's state; anyone else (an identity
            # collision, say) must never mistake someone else's lease for its own.
            return AdmissionDecision(
                request_id=request_id, state="unknown", error_code=error_code,
                reason=error.error.message if error is not None and error.error is not None else "no such request",
            )
        model = rec.to_model()
        related = [event.related_request_id for event in its_events if event.related_request_id]
        decision = AdmissionDecision(
            request_id=request_id,
            state=model.state,
            revision=model.revision,
            happened=[event.type for event in its_events],
            reason=model.reason,
            lease_revision=model.lease_revision,
            lease_expires_at=model.lease_expires_at,
            lease_ttl_seconds=state.policy.lease_ttl_seconds,
            related_request_id=related[-1] if related else model.preempted_by,
            error_code=error_code,
        )
        if rec.state == "queued":
            decision.position = engine.queue_position(state, rec)
            decision.binding_constraint = engine.waiting_on(state, rec)
        return decision

    async def _signal_requester(self, requester: str, batch: DecisionBatch) -> None:
        try:
            await workflow.get_external_workflow_handle(requester).signal(DECISION_SIGNAL, batch)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # the requester no longer exists: never a failure of the singleton
            if self._live_requests_of(requester):  # else a late decision to a closed holder workflow: nothing to do
                workflow.logger.warning("cannot reach requester %s (%s); releasing what it holds", requester, error)
                self._gone_requesters.add(requester)

    def _export_audit(self, events: list[AuditEvent]) -> None:
        """Audit events leave together, at most AUDIT_EXPORT_DELAY after the oldest of them."""
        self._audit_outbox.extend(events)
        if self._audit_outbox and self._audit_due is None:
            self._audit_due = workflow.now() + AUDIT_EXPORT_DELAY
        self._export_if_due()

    def _export_if_due(self, *, now: bool = False) -> None:
        """One export in flight at most, started when a full batch waits or the oldest event is due
        (or `now`, before continue-as-new). An export is three events and a workflow task of the
        singleton's: started for every pass of a busy host group, they were a quarter of its history."""
        if self._exporting or not self._audit_outbox:
            return
        if now or len(self._audit_outbox) >= MAX_EVENTS_PER_EXPORT or workflow.now() >= self._audit_due:  # type: ignore[operator]
            self._audit_due = None
            self._exporting = self._audit_outbox[:MAX_EVENTS_PER_EXPORT]
            del self._audit_outbox[:MAX_EVENTS_PER_EXPORT]
            self._in_background(self._export_batch())

    async def _export_batch(self) -> None:
        await self._export(self._exporting)
        self._exporting = []
        if not self._audit_outbox:
            return
        # What arrived meanwhile leaves when it is due, whether or not other news wakes the loop by then.
        if self._audit_due is None:
            self._audit_due = workflow.now() + AUDIT_EXPORT_DELAY
        self._arm_timer(max(self._audit_due, workflow.now() + timedelta(milliseconds=1)))

    async def _export(self, events: list[AuditEvent]) -> None:
        await workflow.execute_activity(
            EXPORT_AUDIT_ACTIVITY,
            AuditExport(host_group=self._input.host_group, chain=self._audit_chain, events=events),
            start_to_close_timeout=timedelta(seconds=10),  # a store write: milliseconds, unless its worker died
            retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(minutes=1)),
            summary=f"export {len(events)} audit events",
        )

    def _send(self, signal) -> None:
        self._in_background(signal, self._signalling)

    def _in_background(self, work, tasks: set[asyncio.Task[None]] | None = None) -> None:
        tasks = self._background if tasks is None else tasks
        task = asyncio.ensure_future(work)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _settle_outbound(self) -> None:
        """Every decision delivered before this run hands over (the server does that, with no
        worker: milliseconds). An audit export or a requester sweep in flight is not waited for: a
        worker killed while running one would hold the host group still for the activity's timeout.
        Their work goes to the next run (the unstored audit events carried, stored again harmlessly
        if the export did land; the sweep from where the last one read)."""
        while self._signalling:
            await asyncio.gather(*list(self._signalling))

    def _should_continue_as_new(self) -> bool:
        info = workflow.info()
        return (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() >= self._input.max_history_events
            or info.get_current_history_size() >= self._input.max_history_bytes
        )

    def _carry(self) -> AdmissionWorkflowInput:
        carried = carried_state(
            self._state, self._requesters, self._inbox, self._gone_requesters, list(self._recent), self._audit_chain,
        )
        carried.swept_from = self._swept_from
        unstored = self._exporting + self._audit_outbox
        if unstored:
            carried.audit_outbox_packed = codec.pack_json([event.model_dump(mode="json") for event in unstored])
        return self._input.model_copy(update={"policy": self._state.policy, "carried": carried})


def _weight(item: InboxItem) -> int:
    """What an inbox item costs a decision pass, in requests or leases."""
    if item.submit is not None:
        return len(item.submit.requests)
    if item.renew is not None:
        return max(1, len(item.renew.leases))
    if item.release is not None:
        return max(1, len(item.release.request_ids))
    if item.cancel is not None:
        return max(1, len(item.cancel.request_ids))
    return 1


def carried_state(
    state: engine.EngineState,
    requesters: dict[str, str],
    inbox: list[InboxItem],
    gone_requesters: set[str],
    recent_audit: list[AuditEvent],
    audit_chain: str,
) -> CarriedState:
    """The compact form a continued run starts from (also what the benchmark sizes)."""
    return CarriedState(
        engine=codec.encode(state, requesters),  # the requester map of the records travels inside
        inbox_packed=codec.pack_json([item.model_dump(mode="json") for item in inbox]) if inbox else None,
        gone_requesters=sorted(gone_requesters),
        recent_audit_packed=codec.pack_json([event.model_dump(mode="json") for event in recent_audit]) if recent_audit else None,
        audit_chain=audit_chain,
    )
