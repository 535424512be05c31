"""The requester side of admission, for use inside any workflow that needs it.

One `AdmissionClient` per requester workflow: it submits batches, receives `admission_decided` signals, keeps every held lease alive with ONE timer
loop that renews all of them at a third of the TTL, and releases or cancels.

Renewal comes in two forms (docs/scaling.md). `renewal="requester"`: one signal that names no
lease ("everything I hold", as of the moment it was sent) and gets no answer; once the signal is
delivered before the earliest of those leases would have expired, the singleton cannot expire
them before it has applied the renewal (it reads every delivered signal before it looks at its
clock), so the requester extends its own view to sent_at + TTL. It is the default: it costs the
singleton one history event per requester per round, and missions use it. `renewal="per-lease"`:
each lease named with its revision, renewed when decided, a new lease revision and a decision
back (the benchmark's baseline, and the admission probe's default).

A submit goes through an activity that signal-with-starts the singleton: it creates the
singleton when there is none (the first requester of a host group, or it was terminated), and
its signal is in the singleton's history as soon as the call returns. A signal command would be
delivered only when the server's transfer queue next reads it (up to 50 ms on a busy server,
`docs/workflow-costs.md`), and that wait lay on every mission's way to its first child. And
giving everything back never releases again what a confirmed release already has in flight:
the second answer would arrive after the requester decided to close, failing its closing
workflow task.

It fails closed: a lease counts as current only while the last decision said
`admitted` and its expiry is still ahead of workflow time. A requester whose
worker was down past the TTL therefore never dispatches on a stale lease.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any, Literal

from temporalio import workflow

from workflows.timers import KeptTimer

with workflow.unsafe.imports_passed_through():
    from workflows.admission.messages import (
        DECISION_SIGNAL,
        AdmissionDecision,
        CancelBatch,
        DecisionBatch,
        LeaseRef,
        ReleaseBatch,
        RenewBatch,
        RequesterCarry,
        SubmitAdmission,
        SubmitBatch,
        admission_workflow_id,
    )
    from workflows.admission.model import AdmissionRequest
    from workflows.inbound import Refused, signal_argument

SUBMIT_ACTIVITY = "submit_admission_batch"
# What the engine can do to a lease the requester holds without being asked: move it back to
# the queue (requeued after it expired; displaced by the lane override) or end it (preempted).
INTERRUPTIONS: frozenset[str] = frozenset({"requeued", "displaced", "preempted"})


Renewal = Literal["requester", "per-lease"]


class AdmissionClient:
    def __init__(
        self,
        host_group: str,
        *,
        search_attributes: bool = False,
        renewal: Renewal = "requester",
        on_refused: Callable[[str, Refused], None] | None = None,
        on_decision: Callable[[AdmissionDecision], None] | None = None,
    ) -> None:
        self.host_group = host_group
        self._on_decision = on_decision  # hears every decision taken in (the probe keeps them all)
        # A decision signal whose argument was refused: the requester records it (else it is logged).
        self._on_refused = on_refused or _log_refusal
        self.renewal = renewal
        self._search_attributes = search_attributes
        self.decisions: dict[str, AdmissionDecision] = {}
        self._mine: set[str] = set()
        self._renew_sent: dict[str, int] = {}  # request id -> lease revision a renewal was sent for
        self._giving_back: set[str] = set()  # released or cancelled with confirmation, not yet answered
        self._sending: set[asyncio.Future[None]] = set()  # unconfirmed releases whose delivery nobody awaits
        # Given back while no singleton could be reached: no confirmation will come (closing only,
        # so never carried across continue-as-new).
        self._unanswered: set[str] = set()
        self._version = 0  # bumped on every decision batch; waiters compare, never reset
        self._renewal_timer = KeptTimer("next lease renewal")
        # request id -> how many times its lease was taken away, and the decision that last did:
        # a requester compares the count with the one it started work under, since a lease taken
        # away can be granted again (a new lease) before the requester hears of it.
        self._interruptions: dict[str, int] = {}
        self.interrupted: dict[str, AdmissionDecision] = {}
        self._stopped = False
        workflow.set_signal_handler(DECISION_SIGNAL, self._on_decisions)

    def carry(self) -> RequesterCarry:
        """What the requester's next run needs (continue-as-new): its requests and their last
        decisions, and what it already asked about them."""
        return RequesterCarry(
            decisions=dict(self.decisions),
            mine=sorted(self._mine),
            renew_sent=dict(self._renew_sent),
            giving_back=sorted(self._giving_back),
            interruptions=dict(self._interruptions),
            interrupted=dict(self.interrupted),
        )

    def restore(self, carried: RequesterCarry) -> None:
        self.decisions = dict(carried.decisions)
        self._mine = set(carried.mine)
        self._renew_sent = dict(carried.renew_sent)
        self._giving_back = set(carried.giving_back)
        self._interruptions = dict(carried.interruptions)
        self.interrupted = dict(carried.interrupted)

    # --- inbound ----------------------------------------------------------------------------

    def _on_decisions(self, *args: Any) -> None:
        batch = signal_argument(args, DecisionBatch, DECISION_SIGNAL, self._on_refused)
        if batch is None:  # from no singleton of ours: nothing to act on
            return
        for decision in batch.decisions:
            known = self.decisions.get(decision.request_id)
            if known is not None and decision.state != "unknown" and decision.revision < known.revision:
                continue  # an older decision overtaken by a newer one
            self.decisions[decision.request_id] = decision
            if self._on_decision is not None:
                self._on_decision(decision)
            if INTERRUPTIONS.intersection(decision.happened):
                self._interruptions[decision.request_id] = self._interruptions.get(decision.request_id, 0) + 1
                self.interrupted[decision.request_id] = decision
            self._giving_back.discard(decision.request_id)  # answered (or overtaken: decide again)
        self._version += 1

    # --- what the requester asks ------------------------------------------------------------

    @property
    def version(self) -> int:
        """Changes whenever decisions arrive; a caller's wait condition can compare it."""
        return self._version

    def state_of(self, request_id: str) -> str | None:
        decision = self.decisions.get(request_id)
        return None if decision is None else decision.state

    def is_current(self, request_id: str) -> bool:
        """True only while the lease is provably alive: admitted, and not past its expiry."""
        decision = self.decisions.get(request_id)
        return (
            decision is not None
            and decision.state == "admitted"
            and decision.lease_expires_at is not None
            and workflow.now() < decision.lease_expires_at
        )

    def interruptions(self, request_id: str) -> int:
        """How many times the engine has taken this request's lease away (see INTERRUPTIONS)."""
        return self._interruptions.get(request_id, 0)

    def held(self) -> list[str]:
        return sorted(rid for rid in self._mine if self.state_of(rid) == "admitted")

    async def submit(self, requests: Iterable[AdmissionRequest]) -> None:
        requests = list(requests)
        self._mine.update(request.request_id for request in requests)
        batch = SubmitBatch(requester=workflow.info().workflow_id, requests=requests)
        await workflow.execute_activity(
            SUBMIT_ACTIVITY,
            SubmitAdmission(host_group=self.host_group, batch=batch, search_attributes=self._search_attributes),
            start_to_close_timeout=timedelta(seconds=30),
            summary=f"submit {len(requests)} admission requests to {admission_workflow_id(self.host_group)}",
        )

    async def wait_until_decided(self, request_ids: Iterable[str], timeout: timedelta | None = None) -> bool:
        """Wait until none of `request_ids` is still unanswered or queued; False on timeout."""
        ids = list(request_ids)

        def decided() -> bool:
            return all(self.state_of(rid) not in (None, "queued") for rid in ids)

        try:
            await workflow.wait_condition(decided, timeout=timeout, timeout_summary="admission decision deadline")
        except asyncio.TimeoutError:
            return False
        return True

    async def wait_for_change(self, timeout: timedelta | None = None, or_when: Callable[[], bool] | None = None) -> None:
        """Return when a decision arrives, `or_when` holds, or on timeout: lets callers react to preemption."""
        seen = self._version
        try:
            await workflow.wait_condition(lambda: self._version != seen or bool(or_when and or_when()), timeout=timeout)
        except asyncio.TimeoutError:
            pass

    async def release(self, request_ids: Iterable[str], *, confirm: bool = True) -> None:
        """Give leases back. `confirm=False` asks for no decision back, which saves a signal each
        way (and a requester about to close is never signalled after it has closed); the requester
        records the release itself (`decisions`) as it sends it."""
        await self._give_back("release", ReleaseBatch, request_ids, confirm)

    def release_in_background(self, request_ids: Iterable[str]) -> None:
        """`release(confirm=False)` without waiting for the signal's delivery: the release is
        recorded at once (bumping `version`) and the caller goes on. Giving everything back waits
        for these first, so it never sends again what one of them is delivering."""
        ids = sorted(set(request_ids))
        if not ids:
            return
        recorded = self._record_given_back(ids, "released")  # now, not when the task first runs
        sending = asyncio.ensure_future(self._send_unconfirmed("release", ReleaseBatch, ids, recorded))
        self._sending.add(sending)
        sending.add_done_callback(self._sending.discard)

    @property
    def sending(self) -> bool:
        """A background release is still on its way (continuing as new must wait for it: the new
        run could neither undo its record nor know whether it was delivered)."""
        return bool(self._sending)

    async def cancel(self, request_ids: Iterable[str], *, confirm: bool = True) -> None:
        """Withdraw requests (queued or admitted); `confirm` as for `release`."""
        await self._give_back("cancel", CancelBatch, request_ids, confirm)

    async def _give_back(
        self, signal: str, batch: type[ReleaseBatch] | type[CancelBatch], request_ids: Iterable[str], confirm: bool,
    ) -> None:
        ids = sorted(set(request_ids))
        if not ids:
            return
        if not confirm:
            recorded = self._record_given_back(ids, "released" if signal == "release" else "cancelled")
            await self._send_unconfirmed(signal, batch, ids, recorded)
            return
        self._giving_back.update(ids)
        if not await self._signal(signal, batch(requester=workflow.info().workflow_id, request_ids=ids, confirm=True)):
            # No singleton took it (none was ever started, or it is gone): no answer will come.
            # What it may still hold lapses at the TTL, as every lease of a silent holder does.
            self._unanswered.update(ids)

    async def _send_unconfirmed(
        self, signal: str, batch: type[ReleaseBatch] | type[CancelBatch], ids: list[str],
        recorded: dict[str, tuple[AdmissionDecision | None, AdmissionDecision]],
    ) -> None:
        if not await self._signal(signal, batch(requester=workflow.info().workflow_id, request_ids=ids, confirm=False)):
            self._undo_given_back(recorded)

    def _record_given_back(
        self, request_ids: list[str], state: Literal["released", "cancelled"],
    ) -> dict[str, tuple[AdmissionDecision | None, AdmissionDecision]]:
        """A give-back that asks for no answer is recorded as it is sent: once delivered it is as
        good as applied (the singleton reads every delivered signal before it decides anything
        else, and will send nothing back), and recording it at once lets the requester go on
        meanwhile; a closing mission writes its last snapshot while the signal is on its way.
        The outcome goes into the requester's own view at the revision it last heard; a decision
        the singleton made meanwhile (a preemption, say) carries a higher one and wins. What each
        record replaced comes back, for `_undo_given_back` if the signal finds no singleton."""
        recorded: dict[str, tuple[AdmissionDecision | None, AdmissionDecision]] = {}
        for rid in request_ids:
            known = self.decisions.get(rid)
            if known is not None and known.state not in ("admitted", "queued"):
                continue  # it ended otherwise meanwhile: that decision stands
            record = AdmissionDecision(
                request_id=rid, state=state, revision=known.revision if known else 0,
                lease_revision=known.lease_revision if known else 0,
                reason="given back by this requester, which asked for no confirmation",
            )
            self.decisions[rid] = record
            recorded[rid] = known, record
        self._version += 1
        return recorded

    def _undo_given_back(self, recorded: dict[str, tuple[AdmissionDecision | None, AdmissionDecision]]) -> None:
        """The give-back reached no singleton: put back what its record replaced, unless a decision
        arrived since (that one stands). A lease the requester still believes held lapses at its
        expiry, as every lease of a silent holder does."""
        for rid, (before, record) in recorded.items():
            if self.decisions.get(rid) is not record:
                continue
            if before is None:
                del self.decisions[rid]
            else:
                self.decisions[rid] = before
        self._version += 1

    def only_deliveries_left(self) -> bool:
        """Every request is given back or ended, nothing waits for an answer: giving everything back
        only waits for unconfirmed give-backs to be delivered, which changes no decision unless
        one finds no singleton."""
        return not self._giving_back and all(self.state_of(rid) not in ("admitted", "queued", None) for rid in self._mine)

    async def give_back_everything(self, confirm_within: timedelta | None = timedelta(minutes=1)) -> bool:
        """Release what is admitted, cancel what is still waiting, and wait for the confirmation
        (which then shows in `decisions`). `confirm_within=None` asks for no confirmation: for a
        requester that closes next and has no use for one."""
        await asyncio.gather(*self._sending)  # delivered (or undone) by now: not sent again below
        self._stopped = True
        live = ("admitted", "queued", None)
        confirm = confirm_within is not None
        mine = self._mine - self._giving_back  # a confirmed give-back in flight is not sent again
        await self.release((rid for rid in mine if self.state_of(rid) == "admitted"), confirm=confirm)
        await self.cancel((rid for rid in mine if self.state_of(rid) in (None, "queued")), confirm=confirm)
        if not confirm:
            return True
        try:
            await workflow.wait_condition(
                lambda: all(self.state_of(rid) not in live for rid in self._mine - self._unanswered),
                timeout=confirm_within,
                timeout_summary="release confirmation",
            )
        except asyncio.TimeoutError:
            return False
        return True

    # --- the single renewal loop ------------------------------------------------------------

    async def keep_leases_alive(self) -> None:
        """Renew every held lease at a third of its TTL with one timer; run it as a task."""
        try:
            if self.renewal == "requester":
                await self._renew_as_requester()
            else:
                await self._renew_by_name()
        finally:
            self._renewal_timer.cancel()

    async def _renew_by_name(self) -> None:
        while not self._stopped:
            due = self._renewals_due()
            if not await self._wait_until(due):
                continue  # something changed: recompute what is due
            assert due is not None
            leases = [
                LeaseRef(request_id=rid, lease_revision=self.decisions[rid].lease_revision)
                for rid in self.held()
                if self._renew_sent.get(rid) != self.decisions[rid].lease_revision
            ]
            if leases:
                for lease in leases:
                    self._renew_sent[lease.request_id] = lease.lease_revision
                await self._signal("renew", RenewBatch(requester=workflow.info().workflow_id, leases=leases, due_at=due))

    async def _renew_as_requester(self) -> None:
        """One `everything` renewal per round; no answer comes, so the held leases' expiry is moved
        here, and only when the signal is known to have arrived before they could have expired.
        Leases it may have arrived too late for are named in the next renewal (sent at once), which
        brings their decisions back."""
        late: dict[str, int] = {}  # request id -> lease revision, to be renewed by name
        retry_at: datetime | None = None  # the singleton was unreachable: not before then
        me = workflow.info().workflow_id
        while not self._stopped:
            held = {
                rid: self.decisions[rid] for rid in self.held()
                if self.is_current(rid) and self.decisions[rid].lease_ttl_seconds is not None
            }
            named = [
                LeaseRef(request_id=rid, lease_revision=revision) for rid, revision in sorted(late.items())
                if self.state_of(rid) == "admitted" and self.decisions[rid].lease_revision == revision
            ]
            due = min((self._due(decision) for decision in held.values()), default=None)
            if named:
                due = workflow.now()
            if due is not None and retry_at is not None:
                due = max(due, retry_at)
            if due is None or due > workflow.now():
                await self._wait_until(due)
                continue  # recompute: something changed, or time moved (a lease may have lapsed)
            sent_at = workflow.now()
            renewal = RenewBatch(requester=me, everything=bool(held), leases=named, sent_at=sent_at, due_at=due)
            if not await self._signal("renew", renewal):
                # Unreachable singleton: try again while the leases last (they fail closed meanwhile).
                ttl = min((decision.lease_ttl_seconds or 0 for decision in held.values()), default=0)
                retry_at = workflow.now() + timedelta(seconds=max(1.0, ttl / 10))
                continue
            retry_at = None
            late = {rid: held[rid].lease_revision for rid in self._extended(held, sent_at, arrived_by=workflow.now())}

    def _extended(self, sent: dict[str, AdmissionDecision], sent_at: datetime, arrived_by: datetime) -> list[str]:
        """Move the expiry of what the renewal covered; the ones it may have arrived too late for
        (still admitted, at the same lease revision) are returned."""
        late = []
        for rid, before in sent.items():
            decision = self.decisions.get(rid)
            if (
                decision is None or decision.state != "admitted" or decision.lease_revision != before.lease_revision
                or before.lease_expires_at is None or decision.lease_expires_at is None
                or decision.lease_ttl_seconds is None
            ):
                continue
            if arrived_by >= before.lease_expires_at:  # the singleton may have expired it first
                late.append(rid)
                continue
            until = sent_at + timedelta(seconds=decision.lease_ttl_seconds)
            if until > decision.lease_expires_at:
                self.decisions[rid] = decision.model_copy(update={"lease_expires_at": until})
        return sorted(late)

    @staticmethod
    def _due(decision: AdmissionDecision) -> datetime:
        assert decision.lease_expires_at is not None and decision.lease_ttl_seconds is not None
        return decision.lease_expires_at - timedelta(seconds=decision.lease_ttl_seconds * 2 / 3)

    def _renewals_due(self) -> datetime | None:
        """When the earliest held lease not already being renewed reaches a third of its TTL."""
        return min((
            self._due(decision)
            for decision in (self.decisions[rid] for rid in self.held())
            if self._renew_sent.get(decision.request_id) != decision.lease_revision
            and decision.lease_expires_at is not None and decision.lease_ttl_seconds is not None
        ), default=None)

    async def _wait_until(self, due: datetime | None) -> bool:
        """Wait until `due` (forever when None) or until a decision arrives or the loop stops:
        True once `due` has come, False when something changed first."""
        seen = self._version

        def changed() -> bool:
            return self._version != seen or self._stopped

        # Kept across the waits that end early (a decision arrived, a release was recorded).
        timer = self._renewal_timer.at(due)
        if due is not None and (timer is None or timer.done()):
            return True
        await workflow.wait_condition(lambda: changed() or (timer is not None and timer.done()))
        return timer is not None and timer.done()

    async def _signal(self, name: str, payload: object) -> bool:
        """Signal the singleton; False (logged) when it cannot be reached."""
        # Shielded: a cancellation of the requester must not cancel a signal in flight. Cancelling
        # one asks the server to cancel it, and when its outcome (say, failed: no singleton yet)
        # comes in the same workflow task as the cancellation, that request is an invalid
        # transition of the signal's state machine: a nondeterminism error on the next replay.
        sent = asyncio.ensure_future(
            workflow.get_external_workflow_handle(admission_workflow_id(self.host_group)).signal(name, payload)
        )
        sent.add_done_callback(_retrieve)
        try:
            await asyncio.shield(sent)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            # Fail closed: without the admission workflow our leases simply stop being current.
            workflow.logger.warning("admission workflow for %s unreachable: %s", self.host_group, error)
            return False
        return True


def _retrieve(task: asyncio.Future[None]) -> None:
    """Take a shielded signal's outcome, so a requester cancelled meanwhile leaves no unread error."""
    if not task.cancelled():
        task.exception()


def _log_refusal(signal: str, refused: Refused) -> None:
    workflow.logger.warning("signal %s refused: %s", signal, refused)
