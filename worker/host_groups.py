"""Host groups as operators see them: one admission workflow each, found in Temporal visibility.

A host group exists while its admission workflow (`admission:<host_group>`) runs: that workflow
holds the group's policy, queue and leases. Its usage comes from the workflow's own read-only
queries (`usage`, `queue`, `leases`: the same ones `conductor admission usage|queue|leases`
reads), each bounded in time, so a host group whose workflow no worker answers is still listed,
with a note instead of numbers.

`conductor mission run/start` use `require_host_group` so that a typo in a spec's `host_group`
is refused instead of quietly creating a new admission workflow with the default policy;
`create_host_group` is the explicit way, through the audited policy change
(`LiveAdmission.set_policy`, as `conductor admission policy set` does).
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from activities.visibility import literal
from worker.admission_live import QUEUE_ROWS, LiveAdmission, LiveError
from worker.inputs import InputError, one_line
from worker.stuck import Stuck, stuck
from worker.tables import human_duration, render_table
from workflows.admission.messages import ADMISSION_WORKFLOW, LeaseRow, PolicyChange, QueueRow, UsageRow, admission_workflow_id
from workflows.admission.model import AdmissionPolicy

PREFIX = admission_workflow_id("")
QUERY_TIMEOUT = timedelta(seconds=5)  # per query: a listing answers promptly even with no worker
MAX_HOST_GROUPS = 1000
NAMES_SHOWN = 10  # host groups named in a refusal before "and N more"


@dataclass
class HostGroupRow:
    host_group: str
    workflow_id: str
    started: datetime
    queued: int | None = None  # None: the workflow did not answer (see `note`)
    queued_more: bool = False  # the queue holds more than QUEUE_ROWS
    leases: int | None = None
    usage: list[UsageRow] = field(default_factory=list)
    note: str | None = None
    stuck: Stuck | None = None
    policy: AdmissionPolicy | None = None  # None: not read

    def global_usage(self) -> UsageRow | None:
        return next((row for row in self.usage if row.limit == "global"), None)

    def as_json(self, now: datetime) -> dict[str, Any]:
        return {
            "host_group": self.host_group, "workflow_id": self.workflow_id,
            "started": self.started.isoformat(), "age_seconds": round((now - self.started).total_seconds(), 3),
            "queued": self.queued, "queued_at_least": self.queued_more, "leases": self.leases,
            "usage": [row.model_dump(mode="json") for row in self.usage], "note": self.note,
            "held": None if self.policy is None else self.policy.hold,
            "hold_reason": None if self.policy is None else self.policy.hold_reason,
            "stuck": None if self.stuck is None else {
                "attempts": self.stuck.attempts, "failure": self.stuck.failure,
                "since": None if self.stuck.since is None else self.stuck.since.isoformat(),
            },
        }


def _query_text() -> str:
    return f"WorkflowType = {literal(ADMISSION_WORKFLOW)} AND ExecutionStatus = 'Running'"


async def host_group_names(client: Client, limit: int = MAX_HOST_GROUPS) -> list[tuple[str, datetime]]:
    """(host group, start of its current run) of every running admission workflow, sorted by name."""
    found: dict[str, datetime] = {}
    async for execution in client.list_workflows(_query_text(), limit=limit):
        if execution.id.startswith(PREFIX):
            found[execution.id.removeprefix(PREFIX)] = execution.start_time
    return sorted(found.items())


async def _row(client: Client, host_group: str, started: datetime) -> HostGroupRow:
    row = HostGroupRow(host_group=host_group, workflow_id=admission_workflow_id(host_group), started=started)
    live = LiveAdmission(client, host_group, reconnect_seconds=QUERY_TIMEOUT.total_seconds())
    with contextlib.suppress(RPCError):  # a failed look leaves the queries below to say what is wrong
        row.stuck = await stuck(client, row.workflow_id)
    if row.stuck is not None:  # its queries would wait on the failing task: say why instead
        row.note = row.stuck.line("its admission workflow")
        return row
    try:
        row.usage = await live.query("usage", result_type=list[UsageRow], timeout=QUERY_TIMEOUT)
        row.policy = await live.query("policy", result_type=AdmissionPolicy, timeout=QUERY_TIMEOUT)
        queue = await live.query("queue", QUEUE_ROWS + 1, result_type=list[QueueRow], timeout=QUERY_TIMEOUT)
        row.queued, row.queued_more = min(len(queue), QUEUE_ROWS), len(queue) > QUEUE_ROWS
        row.leases = len(await live.query("leases", result_type=list[LeaseRow], timeout=QUERY_TIMEOUT))
    except LiveError as error:  # no worker answering names QUERY_TIMEOUT
        row.note = one_line(str(error))
    except Exception as error:  # a lost connection, say: still a row, with a note
        row.note = one_line(f"{type(error).__name__}: {error}")
    return row


async def list_host_groups(client: Client) -> list[HostGroupRow]:
    """Every host group with a running admission workflow, with its usage, sorted by name."""
    names = await host_group_names(client)
    return list(await asyncio.gather(*(_row(client, name, started) for name, started in names)))


def _usage_text(rows: Sequence[UsageRow]) -> str:
    return ", ".join(f"{row.limit} {row.used}/{'-' if row.maximum is None else row.maximum}" for row in rows) or "-"


def _usage_column(row: HostGroupRow) -> str:
    if row.stuck is not None:
        return f"STUCK: {row.note}"
    if row.note is not None:
        return f"not read: {row.note}"
    held = ""
    if row.policy is not None and row.policy.hold:
        held = f"HELD ({row.policy.hold_reason}); " if row.policy.hold_reason else "HELD; "
    return held + _usage_text(row.usage)


HEADERS = ["HOST GROUP", "QUEUED", "LEASES", "GLOBAL", "AGE", "USAGE (used/max; - unlimited)"]


def host_groups_table(rows: Sequence[HostGroupRow], now: datetime | None = None) -> str:
    now = now or datetime.now(timezone.utc)
    if not rows:
        return (
            "no host groups: no admission workflow runs. Create one with `conductor admission policy set "
            "--host-group G POLICY.json` (or `conductor mission run --create-host-group SPEC`)"
        )
    table = render_table(
        HEADERS,
        [
            [
                row.host_group,
                None if row.queued is None else f"{row.queued}{'+' if row.queued_more else ''}",
                row.leases,
                None if (g := row.global_usage()) is None else f"{g.used}/{'-' if g.maximum is None else g.maximum}",
                human_duration((now - row.started).total_seconds()),
                _usage_column(row),
            ]
            for row in rows
        ],
        right=(1, 2, 3, 4),
    )
    return table


# --- a spec's host group must exist ----------------------------------------------------------------


class HostGroupMissing(InputError):
    """A spec names a host group that has no admission workflow (a typo, most likely)."""


async def host_group_running(client: Client, host_group: str) -> bool:
    """Whether `admission:<host_group>` runs now (describe: strongly consistent, unlike visibility)."""
    handle = client.get_workflow_handle(admission_workflow_id(host_group))
    try:
        description = await handle.describe(rpc_timeout=timedelta(seconds=30))
    except RPCError as error:
        if error.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    return description.status == WorkflowExecutionStatus.RUNNING


async def require_host_group(client: Client, host_group: str) -> None:
    """`HostGroupMissing` (one line naming the host groups there are) unless `host_group` exists."""
    if await host_group_running(client, host_group):
        return
    try:
        names = [name for name, _ in await host_group_names(client)]
    except RPCError:
        names = None
    if names is None:
        known = "the host groups there are could not be listed"
    elif not names:
        known = "there are no host groups yet"
    else:
        # A typo is the usual reason: the names closest to it first, then the rest by name.
        close = difflib.get_close_matches(host_group, names, n=NAMES_SHOWN, cutoff=0.5)
        names = close + [name for name in names if name not in close]
        shown = ", ".join(names[:NAMES_SHOWN]) + (f" and {len(names) - NAMES_SHOWN} more" if len(names) > NAMES_SHOWN else "")
        known = f"host groups: {shown}"
    raise HostGroupMissing(
        f"host group {host_group!r} has no admission workflow ({admission_workflow_id(host_group)} does not run; "
        f"{known}): fix host_group in the spec, or create it with --create-host-group (the default policy) "
        f"or `conductor admission policy set --host-group {host_group} POLICY.json`"
    )


async def create_host_group(
    client: Client, task_queue: str, host_group: str, policy: AdmissionPolicy, operator: str,
) -> bool:
    """Start `host_group`'s admission workflow with `policy`, set by `operator`, unless it runs
    already (its policy is then left as it is); True if it was created."""
    if await host_group_running(client, host_group):
        return False
    live = LiveAdmission(client, host_group)
    return await live.set_policy(task_queue, PolicyChange(operator=operator, policy=policy))
