"""The operator's line to a host group's live AdmissionWorkflow: queries and policy changes.

Everything that can go wrong between a terminal and the workflow (no server,
no workflow, no worker answering, a workflow that has stopped) becomes one
`LiveError` whose message says what is wrong and what to do, so the CLI can
print a single line instead of a traceback. A server that goes away mid-command
(a restart, a network break) is waited for, with backoff, for
CONDUCTOR_RECONNECT_SECONDS (see `worker.connection.Reconnect`); only then is it an error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
)
from temporalio.common import QueryRejectCondition
from temporalio.service import RPCError, RPCStatusCode

from activities.admission import set_policy_with_start
from worker.connection import CLI_RETRY_CONFIG, Reconnect, TemporalUnreachable, connect
from worker.stuck import stuck
from workflows.admission.messages import RESTORING, PolicyChange, admission_workflow_id
from workflows.admission.model import AdmissionPolicy

T = TypeVar("T")

# A query needs a worker to answer it; without one the server holds the call open, so bound it.
QUERY_TIMEOUT = timedelta(seconds=15)
RESTORE_POLL_SECONDS = 0.2
RPC_TIMEOUT = timedelta(seconds=30)  # calls only the server answers (describe)
QUEUE_ROWS = 1000  # the admission workflow's own default for the queue query


class LiveError(Exception):
    """A problem the operator can act on, worded as one line."""


class Unreachable(LiveError):
    """The server went away and did not come back within the reconnect bound."""


def missing_workflow(host_group: str) -> LiveError:
    return LiveError(f"no admission workflow for host group {host_group} yet: nothing has asked for admission there")


async def open_client() -> Client:
    try:
        return await connect(retry_config=CLI_RETRY_CONFIG)
    except ConnectionError as error:
        raise LiveError(str(error)) from None
    except Exception as error:  # a broken profile file or TLS setting, say: still one line, never a traceback
        raise LiveError(f"cannot set up the Temporal connection: {error}") from None


class LiveAdmission:
    """Queries and signals for one host group's admission workflow."""

    def __init__(
        self,
        client: Client,
        host_group: str,
        *,
        reconnect_seconds: float | None = None,
        announce: Callable[[str], None] | None = None,
    ) -> None:
        self.client = client
        self.host_group = host_group
        self._reconnect = Reconnect(client, reconnect_seconds, announce=announce)

    async def _call(self, operation: Callable[[], Awaitable[T]], doing: str) -> T:
        """`operation()`, repeated through a lost server (queries, describe and signal-with-start are
        safe to repeat: a repeated policy change applies the same policy again)."""
        try:
            return await self._reconnect.call(operation, doing)
        except TemporalUnreachable as error:
            raise Unreachable(str(error)) from None

    @property
    def handle(self) -> WorkflowHandle[Any, Any]:
        return self.client.get_workflow_handle(admission_workflow_id(self.host_group))

    async def query(self, name: str, *args: object, result_type: type[T], timeout: timedelta | None = None) -> T:
        try:
            return await self._call(
                lambda: self._query_once_restored(name, list(args), result_type, timeout or QUERY_TIMEOUT),
                f"querying {name} for host group {self.host_group}",
            )
        except WorkflowQueryRejectedError as error:
            status = error.status.name if error.status is not None else "CLOSED"
            raise LiveError(
                f"the admission workflow for host group {self.host_group} is not running ({status}); "
                "the next request for admission there starts a new one"
            ) from None
        except WorkflowQueryFailedError as error:
            raise await self._stuck_or(
                LiveError(f"the admission workflow for host group {self.host_group} could not answer {name}: {error}")) from None
        except RPCError as error:
            raise await self._stuck_or(self._explain(error, f"the {name} query", needs_worker=timeout or QUERY_TIMEOUT)) from None

    async def _stuck_or(self, error: LiveError) -> LiveError:
        """A query that fails on a stuck singleton says that it is stuck, and why (worker/stuck.py)."""
        try:
            found = await stuck(self.client, admission_workflow_id(self.host_group))
        except Exception:  # the look is a courtesy: the query's own error still says what failed
            return error
        return error if found is None else LiveError(found.line(f"the admission workflow for host group {self.host_group}"))

    async def _query_once_restored(self, name: str, args: list[object], result_type: type[T], timeout: timedelta) -> T:
        """The query, asked again while a continued run restores its carried state (about a
        second per hundred thousand leases), for up to `timeout`."""
        deadline = asyncio.get_running_loop().time() + timeout.total_seconds()
        while True:
            try:
                return await self.handle.query(
                    name, args=args, result_type=result_type,
                    # A stopped workflow still answers from its last state; saying so beats showing stale leases.
                    reject_condition=QueryRejectCondition.NOT_OPEN, rpc_timeout=timeout,
                )
            except WorkflowQueryFailedError as error:
                if RESTORING not in str(error) or asyncio.get_running_loop().time() >= deadline:
                    raise
            await asyncio.sleep(RESTORE_POLL_SECONDS)

    async def is_running(self) -> bool:
        try:
            description = await self._call(
                lambda: self.handle.describe(rpc_timeout=RPC_TIMEOUT), "describing the admission workflow",
            )
        except RPCError as error:
            if error.status == RPCStatusCode.NOT_FOUND:
                return False
            raise self._explain(error, "describing the admission workflow") from None
        return description.status == WorkflowExecutionStatus.RUNNING

    async def set_policy(self, task_queue: str, change: PolicyChange, *, within: float = 30.0) -> bool:
        """Send `change`, starting the workflow with that policy if none runs; True if it was started.
        Whether it was applied within `within` seconds: see `change_policy`."""
        started, _ = await self.change_policy(task_queue, change, within=within)
        return started

    async def change_policy(self, task_queue: str, change: PolicyChange, *, within: float) -> tuple[bool, bool]:
        """(started, applied): the change goes as the workflow's `set_policy` signal, with start if
        no run is current, so it lands exactly once in whichever run is current. `applied`: the
        `policy` query showed it within `within` seconds (it needs a worker: without one the server
        holds the change until one runs the workflow)."""
        started = not await self.is_running()
        try:
            await self._call(
                lambda: set_policy_with_start(self.client, task_queue, self.host_group, change), "sending the policy change",
            )
        except RPCError as error:
            raise self._explain(error, "sending the policy change") from None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(within, 0.1)
        while (left := deadline - loop.time()) > 0:
            try:
                shown = await self.handle.query("policy", result_type=AdmissionPolicy, rpc_timeout=timedelta(seconds=min(left, 2)))
                if shown == change.policy:
                    return started, True
            except (RPCError, WorkflowQueryFailedError):
                pass  # no worker yet, or the run is still restoring its state
            await asyncio.sleep(0.2)
        return started, False

    def _explain(self, error: RPCError, doing: str, *, needs_worker: timedelta | None = None) -> LiveError:
        """`needs_worker`: the call waited this long for a worker to answer (a query)."""
        if error.status == RPCStatusCode.NOT_FOUND:
            return missing_workflow(self.host_group)
        if error.status in (RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED):
            if needs_worker is not None:
                return LiveError(
                    f"the admission workflow for host group {self.host_group} did not answer {doing} "
                    f"within {needs_worker.total_seconds():g}s: is a conductor worker running on its task queue?"
                )
            return LiveError(f"Temporal did not answer {doing} in time: {error.message}")
        if error.status == RPCStatusCode.UNAVAILABLE:
            return LiveError(f"lost the connection to Temporal while {doing}: {error.message}")
        return LiveError(f"Temporal refused {doing} for host group {self.host_group}: {error.message}")
