"""Holding an admission lease from Python code that is not a workflow: `async with hold(...)`.

    request = HeldRequest(request_id="nightly-build-1", orchestrator_id="ci", runtime_kind="host")
    async with hold(client, "default", request, holder="ci@build-7") as lease:
        ...                      # runs only once admitted; the lease is renewed meanwhile
        if lease.lost.is_set():  # preempted, displaced, expired or revoked: stop
            ...

The request's requester is an `AdmissionHolder` workflow (workflows.admission.holders): `acquire`
starts it, sends the singleton its `hold` signal, and follows the holder workflow's history for the
decisions the singleton signals to it (a long poll on the server: no call waits in the singleton,
and none is an update). Renewals (at a third of the TTL) and the give-back are the singleton's
`renew` and `release` signals. A request that is never admitted (denied, timed out in the queue,
withdrawn) raises `NotAdmitted`; one lost while held sets `lease.lost` and `lease.lost_reason` (the
block decides what to stop). `conductor admission run -- COMMAND` is this around a process.

A process with many holders on one host group (a Cockpit, a pool of agent loops) passes them one
`HostGroupWatch`: it reads every decision from the singleton's own history as the singleton writes
it, which is sooner than the server delivers it to each holder workflow (that delivery is a task of
the server's transfer queue, tens of milliseconds on a stock server: bench/admission_storm.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.service import RPCError, RPCStatusCode

from worker.connection import Backoff, no_such_namespace, resend, retryable
from workflows.admission.holder_workflow import LIVE_STATES
from workflows.admission.holders import HOLDER_WORKFLOW, HeldRequest, HolderInput, HolderSubmit, holder_workflow_id
from workflows.admission.messages import (
    DECISION_SIGNAL,
    AdmissionDecision,
    CancelBatch,
    DecisionBatch,
    ReleaseBatch,
    RenewBatch,
    admission_workflow_id,
)

log = logging.getLogger(__name__)

RELEASE_SECONDS = 10.0  # how long giving a lease back may take when the block ends
_CLOSED = frozenset({
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW,
})


class NotAdmitted(RuntimeError):
    """The request ended without a lease (denied, timed out in the queue, withdrawn), or nothing
    more can be heard of it (its holder workflow ended or cannot be read). `decision` is the last
    one the singleton gave, never one made up here."""

    def __init__(self, decision: AdmissionDecision, why: str | None = None) -> None:
        super().__init__(why or f"request {decision.request_id} was {decision.state}: {decision.reason}")
        self.decision = decision


class HostGroupWatch:
    """Every decision the host group's singleton sends, read from its history (run after run) and
    handed to the holders of this process that listen. Start it with `async with`."""

    def __init__(self, client: Client, host_group: str) -> None:
        self._client = client
        self._workflow_id = admission_workflow_id(host_group)
        self._listeners: dict[str, Callable[[AdmissionDecision], None]] = {}
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> HostGroupWatch:
        self._task = asyncio.ensure_future(self._follow())
        self._task.add_done_callback(self._died)
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Stops the watch; raises what stopped it, if it stopped before (and nothing else is raised)."""
        task, self._task = self._task, None
        if task is None:
            return
        failed = task.done() and not task.cancelled() and task.exception() is not None
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if failed and exc[0] is None:
            raise task.exception()  # type: ignore[misc]

    def _died(self, task: asyncio.Task[None]) -> None:
        """A watch that stops on an error says so at once: its holders still hear their decisions
        from their own holder workflows, a transfer-queue hop later."""
        if not task.cancelled() and task.exception() is not None:
            log.error("the decisions watch of %s stopped: %s", self._workflow_id, task.exception(), exc_info=task.exception())

    def listen(self, requester: str, hear: Callable[[AdmissionDecision], None]) -> Callable[[], None]:
        """Hand `requester`'s decisions to `hear`; returns what stops it."""
        self._listeners[requester] = hear
        return lambda: self._listeners.pop(requester, None)

    async def _follow(self) -> None:
        run_id: str | None = None  # None: the run that is current when the follow starts
        seen = 0
        backoff = Backoff()
        while True:
            try:
                async for event in self._client.get_workflow_handle(self._workflow_id, run_id=run_id).fetch_history_events(
                    wait_new_event=True,
                ):
                    if event.event_id <= seen:
                        continue
                    seen = event.event_id
                    backoff.reset()
                    if event.event_type == EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED:
                        signal = event.signal_external_workflow_execution_initiated_event_attributes
                        hear = self._listeners.get(signal.workflow_execution.workflow_id)
                        if hear is not None and signal.signal_name == DECISION_SIGNAL:
                            [batch] = await self._client.data_converter.decode(signal.input.payloads, [DecisionBatch])
                            for decision in batch.decisions:
                                hear(decision)
                    elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
                        run_id, seen = event.workflow_execution_continued_as_new_event_attributes.new_execution_run_id, 0
                        break
                else:
                    await asyncio.sleep(backoff.next())  # the chain ended: a host group made again starts anew
                    run_id, seen = None, 0
            except RPCError as error:  # unreachable for a while, or no such host group (yet): ask again
                if error.status == RPCStatusCode.NOT_FOUND and not no_such_namespace(error):
                    run_id, seen = None, 0
                elif retryable(error) is None:
                    raise
                await asyncio.sleep(backoff.next())


class HeldLease:
    """One holder request and what the singleton said of it; `decision` is the newest."""

    def __init__(
        self, client: Client, host_group: str, holder: str, request_id: str, *,
        on_decision: Callable[[AdmissionDecision], None] | None = None,
        watch: HostGroupWatch | None = None,
    ) -> None:
        self.holder = holder
        self.requester = holder_workflow_id(host_group, holder, request_id)
        self.decision = AdmissionDecision(request_id=request_id, state="queued")
        self.lost = asyncio.Event()
        self.lost_reason: str | None = None
        self._client = client
        self._singleton = client.get_workflow_handle(admission_workflow_id(host_group))
        self._on_decision = on_decision
        # Decisions as they arrive, from the holder workflow's history and the watch (a decision may
        # come twice: `_next` keeps the newer ones). None: the holder workflow closed, nothing follows;
        # `unheard` then says why, if it closed other than with its last decision.
        self._inbox: asyncio.Queue[AdmissionDecision | None] = asyncio.Queue()
        self.unheard: str | None = None
        self._newest = 0  # the newest revision `_next` handed out
        self._follower: asyncio.Task[None] | None = None
        self._unlisten = watch.listen(self.requester, self._arrived) if watch is not None else None

    @property
    def request_id(self) -> str:
        return self.decision.request_id

    def _arrived(self, decision: AdmissionDecision) -> None:
        if decision.request_id == self.request_id:
            self._inbox.put_nowait(decision)

    def _follow(self) -> None:
        if self._follower is None:
            self._follower = asyncio.ensure_future(self._follow_mine())

    async def _follow_mine(self) -> None:
        """The holder workflow's history, as it grows, into the inbox; a broken connection follows
        again from the start, past the events already read."""
        seen = 0
        handle = self._client.get_workflow_handle(self.requester)
        backoff = Backoff()
        while True:
            try:
                async for event in handle.fetch_history_events(wait_new_event=True):
                    if event.event_id <= seen:
                        continue
                    seen = event.event_id
                    backoff.reset()
                    signaled = event.workflow_execution_signaled_event_attributes
                    if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED and signaled.signal_name == DECISION_SIGNAL:
                        [batch] = await self._client.data_converter.decode(signaled.input.payloads, [DecisionBatch])
                        for decision in batch.decisions:
                            self._arrived(decision)
                    elif event.event_type in _CLOSED:
                        if event.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
                            failure = event.workflow_execution_failed_event_attributes.failure.message
                            self._end(failure or f"its holder workflow {self.requester} ended ({EventType.Name(event.event_type)})")
                        else:
                            self._end(None)
                        return
            except RPCError as error:
                if retryable(error) is None:
                    self._end(f"its holder workflow {self.requester} cannot be read: {error}")
                    return
            await asyncio.sleep(backoff.next())

    def _end(self, unheard: str | None) -> None:
        self.unheard = unheard
        self._inbox.put_nowait(None)

    async def _next(self) -> AdmissionDecision | None:
        """The next decision newer than any so far (None: no more will come)."""
        while True:
            decision = await self._inbox.get()
            if decision is None:
                self._inbox.put_nowait(None)  # for whoever asks next
                return None
            if decision.revision > self._newest or (decision.state == "unknown" and self._newest == 0):
                self._newest = decision.revision
                if self._on_decision is not None:
                    self._on_decision(decision)
                return decision

    def _learn(self, decision: AdmissionDecision) -> None:
        self.decision = decision
        if decision.state != "admitted" and not self.lost.is_set():
            self._lose(_lost_because(decision))

    def _lose(self, reason: str) -> None:
        self.lost_reason = reason
        self.lost.set()

    async def _signal_singleton(self, name: str, message: object, *, until: float | None = None) -> None:
        """A signal to the singleton, sent again while the server cannot be reached (until `until`):
        each of the singleton's signals changes nothing the second time."""
        await resend(lambda: self._singleton.signal(name, message), until=until)

    async def _keep_renewed(self) -> None:
        """A requester renewal (every lease this holder workflow holds) at a third of the TTL. It has
        no answer: the lease counts as renewed until the TTL after the last renewal the server took."""
        loop = asyncio.get_running_loop()
        ttl = self.decision.lease_ttl_seconds or 30.0
        renewed_at = loop.time()
        while not self.lost.is_set():
            await asyncio.sleep(ttl / 3)
            try:
                await self._signal_singleton("renew", RenewBatch(requester=self.requester, everything=True),
                                             until=renewed_at + ttl)
                renewed_at = loop.time()
            except RPCError as error:
                self._lose(f"the lease expired while the server could not be reached ({error})")
                return

    async def _watch(self) -> None:
        while not self.lost.is_set():
            decision = await self._next()
            if decision is None:
                if self.unheard is not None:
                    self._lose(self.unheard)
                return
            self._learn(decision)

    async def give_back(self) -> None:
        """Release the lease (or withdraw the request still queued), and wait, at most
        RELEASE_SECONDS, for the singleton to confirm it; quietly."""
        try:
            if self.decision.state not in LIVE_STATES:
                return
            ids = [self.request_id]
            name, batch = ("release", ReleaseBatch(requester=self.requester, request_ids=ids)) if self.decision.state == "admitted" \
                else ("cancel", CancelBatch(requester=self.requester, request_ids=ids))
            loop = asyncio.get_running_loop()
            with contextlib.suppress(RPCError, asyncio.TimeoutError):
                await self._signal_singleton(name, batch, until=loop.time() + RELEASE_SECONDS)
                if self._follower is not None:  # else nothing would hear the confirmation
                    await asyncio.wait_for(self._confirmed(), RELEASE_SECONDS)
        finally:
            self._close()

    async def _confirmed(self) -> None:
        while (decision := await self._next()) is not None:
            self.decision = decision
            if decision.state not in LIVE_STATES:
                return

    def _close(self) -> None:
        if self._unlisten is not None:
            self._unlisten()
        if self._follower is not None:
            self._follower.cancel()


async def acquire(
    client: Client,
    host_group: str,
    request: HeldRequest,
    *,
    holder: str,
    on_queued: Callable[[AdmissionDecision], None] | None = None,
    withdraw: asyncio.Event | None = None,
    on_decision: Callable[[AdmissionDecision], None] | None = None,
    watch: HostGroupWatch | None = None,
) -> HeldLease:
    """Submit `request` (start its holder workflow) and wait until it is admitted; NotAdmitted if it
    never is. Setting `withdraw` cancels the request (then NotAdmitted, its decision `cancelled`).
    Starting again with the same holder and request id joins the same request. `on_decision` hears
    every decision on the request as it arrives, for as long as the lease is followed; `watch` (one
    for all the holders of a process) hears them sooner."""
    lease = HeldLease(client, host_group, holder, request.request_id, on_decision=on_decision, watch=watch)
    withdraw = withdraw or asyncio.Event()
    try:
        singleton = await client.get_workflow_handle(admission_workflow_id(host_group)).describe()
        await client.start_workflow(
            HOLDER_WORKFLOW, HolderInput(host_group=host_group, holder=holder, request=request, submitted_by_holder=True),
            id=lease.requester, task_queue=singleton.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        )
        lease._follow()
        # The holder workflow submits too if this never arrives; sent here, it saves that task's round trip.
        await lease._signal_singleton("hold", HolderSubmit(requester=lease.requester, request=request))
        shown: tuple[int | None, str | None] | None = None
        withdrawn = False
        while lease.decision.state == "queued":
            news = asyncio.ensure_future(lease._next())
            if not withdrawn:
                stop = asyncio.ensure_future(withdraw.wait())
                await asyncio.wait({news, stop}, return_when=asyncio.FIRST_COMPLETED)
                stop.cancel()
                if withdraw.is_set():
                    withdrawn = True
                    await lease._signal_singleton("cancel", CancelBatch(requester=lease.requester, request_ids=[request.request_id]))
            decision = await news
            if decision is None:
                lease._close()
                raise NotAdmitted(lease.decision, f"request {request.request_id}: {lease.unheard or 'its holder workflow ended'}")
            lease.decision = decision
            if decision.state == "queued" and on_queued is not None and (decision.position, decision.binding_constraint, decision.eta) != shown:
                shown = (decision.position, decision.binding_constraint, decision.eta)
                on_queued(decision)
    except BaseException:
        await asyncio.shield(lease.give_back())
        raise
    if withdraw.is_set() and lease.decision.state == "admitted":  # admitted as it was withdrawn: give it back
        await asyncio.shield(lease.give_back())
        raise NotAdmitted(lease.decision, f"request {request.request_id} was withdrawn by its holder as it was admitted; "
                                          f"its lease was given back ({lease.decision.state})")
    if lease.decision.state != "admitted":
        lease._close()
        raise NotAdmitted(lease.decision)
    return lease


@contextlib.asynccontextmanager
async def hold(
    client: Client,
    host_group: str,
    request: HeldRequest,
    *,
    holder: str,
    on_queued: Callable[[AdmissionDecision], None] | None = None,
    watch: HostGroupWatch | None = None,
) -> AsyncIterator[HeldLease]:
    """Run the block under an admitted lease (see the module's docstring)."""
    lease = await acquire(client, host_group, request, holder=holder, on_queued=on_queued, watch=watch)
    async with kept(lease):
        yield lease


@contextlib.asynccontextmanager
async def kept(lease: HeldLease) -> AsyncIterator[HeldLease]:
    """An admitted lease renewed and watched while the block runs, and given back when it ends."""
    renewer, watcher = asyncio.ensure_future(lease._keep_renewed()), asyncio.ensure_future(lease._watch())
    try:
        yield lease
    finally:
        for task in (renewer, watcher):
            task.cancel()
        await asyncio.gather(renewer, watcher, return_exceptions=True)
        await asyncio.shield(lease.give_back())


def _lost_because(decision: AdmissionDecision) -> str:
    """Why a lease is gone, in words: how (preempted, displaced, expired, released) and by whom."""
    how = {"preempted": "preempted", "timed-out": "expired", "released": "released"}
    said = how.get(decision.state, decision.state)
    if "displaced" in decision.happened:
        said = "displaced"
    by = f" by {decision.related_request_id}" if decision.related_request_id else ""
    return f"{said}{by}: {decision.reason}" if decision.reason else f"{said}{by}"
