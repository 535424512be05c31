"""Holding an admission lease from Python code that is not a workflow: `async with hold(...)`.

    request = HeldRequest(request_id="nightly-build-1", orchestrator_id="ci", runtime_kind="host")
    async with hold(client, "default", request, holder="ci@build-7") as lease:
        ...                      # runs only once admitted; the lease is renewed meanwhile
        if lease.lost.is_set():  # preempted, displaced, expired or revoked: stop
            ...

It speaks the singleton's holder updates (`workflows.admission.holders`): it waits in the queue
with long polls (`on_queued` hears each new place), renews on a timer at a third of the TTL
fenced by the lease revision, watches for the lease being taken away, and gives it back when the
block ends. A request that is never admitted (denied, timed out in the queue) raises `NotAdmitted`;
one lost while held sets `lease.lost` and `lease.lost_reason` (the block decides what to stop).
`conductor admission run -- COMMAND` is this around a process.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timezone

from temporalio.client import (
    Client,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.service import RPCError, RPCStatusCode

from workflows.admission.holders import (
    DEFAULT_WAIT_SECONDS,
    HANDING_OVER,
    POLL_LATER,
    Acquire,
    AwaitDecision,
    GiveBack,
    HeldRequest,
    RenewLease,
)
from workflows.admission.messages import AdmissionDecision, admission_workflow_id

RETRY_SECONDS = 2.0  # between attempts when the server cannot be reached
RELEASE_SECONDS = 10.0  # how long giving a lease back may take when the block ends
HANDOVER_RETRY_SECONDS = 0.2
POLL_SECONDS = 2.0  # between holder_decision queries then (jittered by half either way)
BUSY_RETRY_SECONDS = 60.0  # how long an update refused as busy (or unreachable) is sent again
# How long one holder update may go unanswered beyond its own wait before it is sent again. The
# server keeps an update's outcome in a registry it may lose (a dropped workflow task, a cache
# eviction); the SDK then waits for that outcome for ever. Seen once in CI: an update re-polled
# every 8 s for five minutes (the cause was not found).
UNANSWERED_SECONDS = 30.0


class NotAdmitted(RuntimeError):
    """The request ended without a lease (denied, timed out in the queue, cancelled)."""

    def __init__(self, decision: AdmissionDecision) -> None:
        super().__init__(f"request {decision.request_id} was {decision.state}: {decision.reason}")
        self.decision = decision


class HeldLease:
    """The lease a `hold` block runs under; `decision` is the newest the singleton gave."""

    def __init__(self, handle: WorkflowHandle, holder: str, decision: AdmissionDecision) -> None:
        self._handle = handle
        self.holder = holder
        self.decision = decision
        self.lost = asyncio.Event()
        self.lost_reason: str | None = None

    @property
    def request_id(self) -> str:
        return self.decision.request_id

    def _learn(self, decision: AdmissionDecision) -> None:
        if decision.revision < self.decision.revision:
            return  # an older answer overtaken by a newer one
        self.decision = decision
        if decision.state != "admitted" and not self.lost.is_set():
            self._lose(_lost_because(decision))

    def _lose(self, reason: str) -> None:
        self.lost_reason = reason
        self.lost.set()

    async def _update(self, name: str, message: object) -> AdmissionDecision:
        """One holder update; sent again while the singleton hands over to its next run, while the
        server refuses it as busy (for up to BUSY_RETRY_SECONDS), and (all but a renewal, which is
        fenced) when its call timed out or went unanswered for UNANSWERED_SECONDS beyond its own
        wait. A repeat of those is the same request: acquiring, polling, releasing or withdrawing
        twice changes nothing more."""
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + BUSY_RETRY_SECONDS
        unanswered = UNANSWERED_SECONDS + getattr(message, "wait_seconds", 0.0)
        while True:
            try:
                return await asyncio.wait_for(
                    self._handle.execute_update(name, message, result_type=AdmissionDecision), unanswered,
                )
            except asyncio.TimeoutError:  # never answered: a new update (a new id) asks again
                if name == "renew_lease":
                    raise
            except WorkflowUpdateFailedError as error:
                if getattr(error.cause, "type", None) != HANDING_OVER:
                    raise
            except WorkflowUpdateRPCTimeoutOrCancelledError:
                if name == "renew_lease" or asyncio.current_task().cancelling():  # type: ignore[union-attr]
                    raise
            except RPCError as error:
                # The SDK's own retries ran out on a busy host group: its updates in flight are all
                # taken (history.maxInFlightUpdates, 10 by default), or the server aborted updates it
                # had not handed to the workflow yet. Neither was applied; past a while, it is news.
                busy = error.status in (RPCStatusCode.RESOURCE_EXHAUSTED, RPCStatusCode.UNAVAILABLE)
                if not busy or loop.time() >= give_up_at:
                    raise
            await asyncio.sleep(HANDOVER_RETRY_SECONDS * random.uniform(1, 5))

    async def _current(self) -> AdmissionDecision:
        return await self._handle.query("holder_decision", GiveBack(holder=self.holder, request_id=self.request_id),
                                        result_type=AdmissionDecision)

    async def _news(self, after_revision: int) -> AdmissionDecision:
        """The request's next decision (newer than `after_revision`), or its current one after a
        long poll's wait. A long poll when the host group has one to spare; otherwise (PollLater)
        the `holder_decision` query every few seconds for as long: a query is no update in flight
        and writes no history."""
        try:
            return await self._update("await_decision", AwaitDecision(
                holder=self.holder, request_id=self.request_id, after_revision=after_revision,
            ))
        except WorkflowUpdateFailedError as error:
            if getattr(error.cause, "type", None) != POLL_LATER:
                raise
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEFAULT_WAIT_SECONDS
        while True:
            await asyncio.sleep(POLL_SECONDS * random.uniform(0.5, 1.5))
            try:
                decision = await self._current()
            except WorkflowQueryFailedError:  # restoring, or unknown: the next long poll says which, typed
                return self.decision
            if decision.revision > after_revision or loop.time() >= deadline:
                return decision

    async def _keep_renewed(self) -> None:
        while not self.lost.is_set():
            ttl = self.decision.lease_ttl_seconds or 30.0
            await asyncio.sleep(ttl / 3)
            if self.lost.is_set():
                return
            try:
                renewed = await self._update("renew_lease", RenewLease(
                    holder=self.holder, request_id=self.request_id, lease_revision=self.decision.lease_revision,
                ))
                if renewed.error_code is not None:  # fenced out: a renewal that did land, or the lease is gone
                    renewed = await self._current()
            except (WorkflowUpdateFailedError, WorkflowQueryFailedError) as error:
                self._lose(f"the renewal was refused: {_refusal(error)}")
                return
            except (RPCError, WorkflowUpdateRPCTimeoutOrCancelledError, asyncio.TimeoutError) as error:  # try again while the lease lasts
                if _expired(self.decision):
                    self._lose(f"the lease expired while the server could not be reached ({error})")
                    return
                continue
            self._learn(renewed)

    async def _watch(self) -> None:
        while not self.lost.is_set():
            try:
                self._learn(await self._news(self.decision.revision))
            except WorkflowUpdateFailedError as error:
                self._lose(f"the host group no longer knows the lease: {_refusal(error)}")
            except RPCError:
                await asyncio.sleep(RETRY_SECONDS)

    async def give_back(self) -> None:
        """Release the lease (or withdraw the request still queued); quietly, at most RELEASE_SECONDS."""
        if self.decision.state not in ("admitted", "queued"):
            return
        name = "release_lease" if self.decision.state == "admitted" else "cancel_request"
        with contextlib.suppress(RPCError, WorkflowUpdateFailedError, WorkflowUpdateRPCTimeoutOrCancelledError, asyncio.TimeoutError):
            await asyncio.wait_for(self._update(name, GiveBack(holder=self.holder, request_id=self.request_id)), RELEASE_SECONDS)


async def acquire(
    client: Client,
    host_group: str,
    request: HeldRequest,
    *,
    holder: str,
    on_queued: Callable[[AdmissionDecision], None] | None = None,
    withdraw: asyncio.Event | None = None,
) -> HeldLease:
    """Submit `request` and wait (long polls) until it is admitted; NotAdmitted if it never is.
    Setting `withdraw` cancels the request (then NotAdmitted, its decision `cancelled`): the long
    poll in flight is answered by that change rather than cut off, since a cancelled update call
    can cost the singleton a dropped workflow task (about ten seconds with nothing decided)."""
    handle = client.get_workflow_handle(admission_workflow_id(host_group))
    lease = HeldLease(handle, holder, AdmissionDecision(request_id=request.request_id, state="queued"))
    withdraw = withdraw or asyncio.Event()
    try:
        # Answered after the first decision pass: admitted at once, or queued with its place to show.
        decision = await lease._update("acquire", Acquire(holder=holder, request=request, wait_seconds=0))
        shown: tuple[int | None, str | None] | None = None
        withdrawn = False
        while decision.state == "queued":
            if on_queued is not None and (decision.position, decision.binding_constraint) != shown:
                shown = (decision.position, decision.binding_constraint)
                on_queued(decision)
            lease.decision = decision
            poll = asyncio.ensure_future(lease._news(decision.revision))
            if not withdrawn:
                stop = asyncio.ensure_future(withdraw.wait())
                await asyncio.wait({poll, stop}, return_when=asyncio.FIRST_COMPLETED)
                stop.cancel()
                if withdraw.is_set():
                    withdrawn = True
                    await lease.give_back()
            decision = await poll
    except BaseException:
        await asyncio.shield(lease.give_back())
        raise
    lease.decision = decision
    if withdraw.is_set() and decision.state == "admitted":  # admitted as it was withdrawn: give it back
        await asyncio.shield(lease.give_back())
        decision = decision.model_copy(update={"state": "cancelled", "reason": "withdrawn by its holder"})
    if decision.state != "admitted":
        raise NotAdmitted(decision)
    return lease


@contextlib.asynccontextmanager
async def hold(
    client: Client,
    host_group: str,
    request: HeldRequest,
    *,
    holder: str,
    on_queued: Callable[[AdmissionDecision], None] | None = None,
) -> AsyncIterator[HeldLease]:
    """Run the block under an admitted lease (see the module's docstring)."""
    lease = await acquire(client, host_group, request, holder=holder, on_queued=on_queued)
    async with kept(lease):
        yield lease


@contextlib.asynccontextmanager
async def kept(lease: HeldLease) -> AsyncIterator[HeldLease]:
    """An admitted lease renewed and watched while the block runs, and given back when it ends.
    The watch's long poll is answered by the release, not cut off (see `acquire`)."""
    renewer, watcher = asyncio.ensure_future(lease._keep_renewed()), asyncio.ensure_future(lease._watch())
    try:
        yield lease
    finally:
        renewer.cancel()
        await asyncio.gather(renewer, return_exceptions=True)
        await asyncio.shield(lease.give_back())
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(watcher), RELEASE_SECONDS)
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)


def _refusal(error: WorkflowUpdateFailedError | WorkflowQueryFailedError) -> str:
    """Why the singleton refused a call: an update's failure names it in its cause, a query's in itself."""
    cause = getattr(error, "cause", None)
    return str(getattr(cause, "message", cause)) if cause is not None else error.message


def _expired(decision: AdmissionDecision) -> bool:
    return decision.lease_expires_at is not None and decision.lease_expires_at <= datetime.now(timezone.utc)


def _lost_because(decision: AdmissionDecision) -> str:
    """Why a lease is gone, in words: how (preempted, displaced, expired, released) and by whom."""
    how = {"preempted": "preempted", "timed-out": "expired", "requeued": "expired (requeued)", "released": "released"}
    said = how.get(decision.state, decision.state)
    if "displaced" in decision.happened:
        said = "displaced"
    by = f" by {decision.related_request_id}" if decision.related_request_id else ""
    return f"{said}{by}: {decision.reason}" if decision.reason else f"{said}{by}"
