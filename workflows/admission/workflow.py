"""AdmissionWorkflow: the durable singleton that admits work onto one host group.

A thin shell around a pure core (`workflows.admission.singleton`, over the engine in
`workflows.admission.engine`), as `MissionWorkflow` is around the mission's supervisor. The workflow
task is the serialisation boundary (the policy's "store transaction") and the history is the
durable store. Everything comes in by signal (missions, workloads, holders' AdmissionHolder
workflows, operators' policy changes; it takes no update: see docs/admission-api.md, "Why no
updates"). Signals only join the inbox (`singleton.hear`); the loop asks the core for a pass
(`singleton.decide`), so a burst of signals becomes one batch of decisions, one
`admission_decided` signal per requester and at most one audit export. A pass takes at most
`max_requests_per_pass` requests, and requester renewals all go first (docs/scaling.md).

What stays here is what the core cannot do: the signals out, the audit export and requester
sweep activities, one durable timer until the core's next wake-up (kept across passes and
replaced only when the wake-up moves earlier: a timer that fires early runs an empty pass), the
UI's current details and metrics, and continue-as-new with the core's state carried whole.
Time enters the core only through `workflow.now()`.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import Field, TypeAdapter
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

from workflows.timers import KeptTimer

with workflow.unsafe.imports_passed_through():
    from workflows.admission import engine, singleton
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
    from workflows.admission.model import AdmissionPolicy, AdmissionRequest, AuditEvent
    from workflows.audit import AuditExport
    from workflows.failures import RefusedSignals, refused_start
    from workflows.inbound import (
        Refusal,
        Refused,
        argument,
        no_argument,
        optional_argument,
        signal_argument,
    )
    from workflows.metrics import AdmissionMetrics

EXPORT_AUDIT_ACTIVITY = "export_audit_events"
SCHEMA_HINT = "see `conductor mission schema --list` and docs/mission-control-api.md"
_LIMIT = TypeAdapter(Annotated[int, Field(ge=0, le=100_000)])


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
        self._refuse = RefusedSignals()
        # The carried records are decoded a slice per activation (`_finish_restore`); until then the
        # state is incomplete, and the queries that read it say so.
        info = workflow.info()
        self._core, self._restore = singleton.SingletonState.restoring(input, info.run_id, info.start_time, workflow.now())
        self._signalling: set[asyncio.Task[None]] = set()  # decisions on their way to requesters
        self._background: set[asyncio.Task[None]] = set()  # an audit export, a requester sweep
        self._timer = KeptTimer("next lease expiry, queue deadline or aging step", replace_only_earlier=True)
        self._handing_over = False  # continue-as-new is due and its one extra pass has begun
        self._metrics = AdmissionMetrics(workflow.metric_meter(), input.host_group)

    # --- signals: append only; the main loop decides ---------------------------------------

    def _hear(self, kind: str, model: type, args: Sequence[Any]) -> None:
        """A signal's batch into the inbox, as an `InboxItem` of its kind; one that cannot be read is refused."""
        batch = signal_argument(args, model, kind, self._refuse, hint=SCHEMA_HINT)
        if batch is not None:
            singleton.hear(self._core, InboxItem(kind=kind, **{kind: batch}))

    @workflow.signal(description=(
        "For requester workflows (missions, workloads) only, through workflows.admission.client; not an operator action. "
        "Queues a requester's batch of admission requests; the decisions come back as admission_decided signals."
    ))
    def submit(self, *args: Any) -> None:
        self._hear("submit", SubmitBatch, args)

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
        singleton.hear(self._core, InboxItem(kind="submit", submit=SubmitBatch(
            requester=call.requester, requests=[call.request.submitted(workflow.now())],
        )))

    @workflow.signal(description=(
        "For requester workflows (missions, workloads) only, through workflows.admission.client; not an operator action. "
        "Renews held leases (sent on a durable timer at a third of the TTL): named ones, or everything the requester holds."
    ))
    def renew(self, *args: Any) -> None:
        self._hear("renew", RenewBatch, args)

    @workflow.signal(description=(
        "For requester workflows (missions, workloads) only, through workflows.admission.client; not an operator action. "
        "Gives back held leases when the work ended."
    ))
    def release(self, *args: Any) -> None:
        self._hear("release", ReleaseBatch, args)

    @workflow.signal(description=(
        "For requester workflows (missions, workloads) only, through workflows.admission.client; not an operator action. "
        "Withdraws queued or held requests. Operators abandon work with `conductor mission cancel`."
    ))
    def cancel(self, *args: Any) -> None:
        self._hear("cancel", CancelBatch, args)

    @workflow.signal(description=(
        "Operators: replace this host group's admission policy (`conductor admission policy set`). "
        "Requires the operator's name, which the audit trail records; the change applies on the next decision pass "
        "(the `policy` query shows it then). A change that cannot be read is refused and kept for the `refusals` query."
    ))
    def set_policy(self, *args: Any) -> None:
        # A signal, like everything this singleton takes: it accepts no update, so no replay of it
        # depends on the order in which a worker meets an update and other news (docs/admission-api.md).
        self._hear("set_policy", PolicyChange, args)

    @workflow.query(description=(
        "Any client: where a holder's request stands (AdmissionDecision), by the holder's name and the "
        "request id; argument {holder, request_id}. The holder's own AdmissionHolder workflow has it too."
    ))
    def holder_decision(self, *args: Any) -> AdmissionDecision:
        call = argument(args, HolderDecisionQuery, "the holder_decision query's argument", hint=SCHEMA_HINT)
        self._require_restored()
        decision = singleton.decision(self._core, holder_workflow_id(self._input.host_group, call.holder, call.request_id), call.request_id)
        if decision.state == "unknown":
            raise ApplicationError(f"request {call.request_id}: {decision.reason}", type="UnknownRequest", non_retryable=True)
        return decision

    # --- queries ----------------------------------------------------------------------------

    @workflow.query(description="The admission queue in decision order: position, effective priority, binding limit, wait.")
    def queue(self, *args: Any) -> list[QueueRow]:
        limit = optional_argument(args, _LIMIT, 1000, "the queue query's limit")
        self._require_restored()
        return singleton.queue_rows(self._core, limit)

    @workflow.query(description="Every held lease: holder, placement, revision and expiry.")
    def leases(self, *args: Any) -> list[LeaseRow]:
        no_argument(args, "the leases query")
        self._require_restored()
        return singleton.lease_rows(self._core)

    @workflow.query(name=REQUESTERS_QUERY, description=(
        "The requester workflows that hold or wait for a lease here: what the requester sweep checks against visibility."
    ))
    def requesters(self, *args: Any) -> list[str]:
        no_argument(args, "the requesters query")
        self._require_restored()
        return singleton.live_requesters(self._core)

    @workflow.query(description="Leases held against each limit of the policy (global, environment, provider, lane, runtime).")
    def usage(self, *args: Any) -> list[UsageRow]:
        no_argument(args, "the usage query")
        self._require_restored()
        return [UsageRow(limit=label, used=used, maximum=maximum) for label, used, maximum in engine.usage_view(self._core.engine)]

    @workflow.query(description="The most recent audit events (the full trail is in the audit store: `conductor admission audit`).")
    def audit(self, *args: Any) -> list[AuditEvent]:
        limit = optional_argument(args, _LIMIT, 50, "the audit query's limit")
        return list(self._core.recent)[-limit:] if limit > 0 else []

    @workflow.query(description="The admission policy in force.")
    def policy(self, *args: Any) -> AdmissionPolicy:
        no_argument(args, "the policy query")
        return self._core.engine.policy

    @workflow.query(description="What would happen to this request if it were submitted now, without submitting it.")
    def what_if(self, *args: Any) -> WhatIf:
        request = argument(args, AdmissionRequest, "the what_if query's argument", hint=SCHEMA_HINT)
        self._require_restored()
        return singleton.what_if(self._core, request)

    @workflow.query(description="Signals this singleton received and did not act on, and why (the newest ones).")
    def refusals(self, *args: Any) -> list[Refusal]:
        no_argument(args, "the refusals query")
        return self._refuse.kept()

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
            if self._core.inbox and not self._should_continue_as_new() and not self._handing_over:
                # The pass was full: end this workflow task (its decisions go out) before the next.
                await workflow.sleep(timedelta(milliseconds=1), summary="next decision pass of a burst")
                continue
            if self._should_continue_as_new():
                # Outbound signals must arrive in this run; whatever arrives meanwhile (signals,
                # requesters found gone) is carried, not decided here, so a steady burst cannot
                # postpone continue-as-new forever. An audit export or a requester sweep in flight
                # is not waited for: a worker killed while running one would hold the host group
                # still for the activity's timeout. The next run takes their work over (the unstored
                # audit events, stored again harmlessly if the export did land; the sweep from where
                # the last one read).
                while self._signalling:
                    await asyncio.gather(*list(self._signalling))
                if singleton.hand_over_after_one_more_pass(self._core) and not self._handing_over:
                    self._handing_over = True
                    continue
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(self._input.model_copy(update={
                    "policy": self._core.engine.policy, "carried": self._core.carry(),
                }))

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
        self._core.index()

    async def _wait_for_work(self) -> None:
        now = workflow.now()
        every = self._core.sweep.start(now, self._core.engine.policy.requester_sweep_seconds, self._core.holds_anything())
        if every is not None:
            self._in_background(self._sweep(every))
        self._export_if_due()
        if singleton.has_work(self._core, now):
            return
        self._timer.at(singleton.next_wake(self._core))
        await workflow.wait_condition(lambda: bool(self._core.inbox) or bool(self._core.gone) or self._timer.fired)

    async def _sweep(self, every: timedelta) -> None:
        result: SweepResult | None = None
        try:
            result = await workflow.execute_activity(
                FIND_GONE_REQUESTERS,
                RequesterSweep(host_group=self._input.host_group, closed_since=self._core.sweep.swept_from),
                result_type=SweepResult,
                start_to_close_timeout=max(timedelta(seconds=30), every),
                retry_policy=RetryPolicy(maximum_attempts=2),
                summary="which requesters closed without giving their leases back",
            )
        except ActivityError as error:  # the next sweep tries again; leases still expire meanwhile
            workflow.logger.warning("requester sweep failed (%s); the next one retries", error.cause or error)
        self._core.gone.update(self._core.sweep.ended(result))
        if result is not None and not result.supported:
            workflow.logger.warning("this server cannot list workflows; requester sweeps are off for this run")

    def _decide(self) -> None:
        """One pass of the core; its decisions go out, its events to the audit store."""
        decided = singleton.decide(self._core, workflow.now(), workflow.logger.warning)
        for requester, batch in decided.signals:
            self._in_background(self._signal_requester(requester, batch), self._signalling)
        if decided.events:
            self._export_if_due()
        self._report(decided.events)

    def _report(self, events: list[AuditEvent]) -> None:
        """What the UI's current details and the metrics show: queue depth and usage per limit."""
        report = singleton.report(self._core, events)
        self._metrics.decided(
            queued=report.queued, usage=report.usage, admitted_after=report.admitted_after,
            expired=report.expired, preempted=report.preempted,
        )
        workflow.set_current_details(report.details)

    async def _signal_requester(self, requester: str, batch: DecisionBatch) -> None:
        try:
            await workflow.get_external_workflow_handle(requester).signal(DECISION_SIGNAL, batch)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # the requester no longer exists: never a failure of the singleton
            if singleton.requester_unreachable(self._core, requester):
                workflow.logger.warning("cannot reach requester %s (%s); releasing what it holds", requester, error)

    def _export_if_due(self) -> None:
        batch = self._core.outbox.take(workflow.now())
        if batch is not None:
            self._in_background(self._export(batch))

    async def _export(self, events: list[AuditEvent]) -> None:
        await workflow.execute_activity(
            EXPORT_AUDIT_ACTIVITY,
            AuditExport(host_group=self._input.host_group, chain=self._core.audit_chain, events=events),
            start_to_close_timeout=timedelta(seconds=10),  # a store write: milliseconds, unless its worker died
            retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(minutes=1)),
            summary=f"export {len(events)} audit events",
        )
        # What arrived meanwhile leaves when it is due, whether or not other news wakes the loop by then.
        self._timer.at(self._core.outbox.stored(workflow.now()))

    def _in_background(self, work, tasks: set[asyncio.Task[None]] | None = None) -> None:
        tasks = self._background if tasks is None else tasks
        task = asyncio.ensure_future(work)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def _should_continue_as_new(self) -> bool:
        info = workflow.info()
        return (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() >= self._input.max_history_events
            or info.get_current_history_size() >= self._input.max_history_bytes
        )
