"""`conductor mission list`: missions as Temporal visibility knows them, one row each.

The query is built here, from validated values only: a state must be one of the ledger's parent
states, a host group or orchestrator must hold to the rule a spec's ids do (worker.inputs), and
every value is quoted as a visibility string literal (a quote doubled; a value with a backslash or
a double quote is matched on the rows instead of in the query), so no value can change the
query's meaning. A mission that continued as new has one run per stretch of its
history; only its current run is listed (runs closed as ContinuedAsNew are left out), with the
start of its first run.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, get_args

from temporalio.client import Client, WorkflowExecution, WorkflowExecutionStatus
from temporalio.common import SearchAttributeKey

from activities.visibility import literal, quotable, runs_of
from worker.inputs import InputError, check_argument
from worker.tables import human_duration, render_table
from workflows.mission.ledger import ParentState
from workflows.mission.messages import MISSION_WORKFLOW, mission_workflow_id
from workflows.mission.search import (
    MISSION_AWAITING_ANSWER,
    MISSION_AGGREGATION,
    MISSION_CHILDREN_FAILED,
    MISSION_CHILDREN_OK,
    MISSION_CHILDREN_PENDING,
    MISSION_HOST_GROUP,
    MISSION_ORCHESTRATOR,
    MISSION_STATE,
)
from workflows.mission.spec import HostGroup, SpecId

MISSION_STATES: tuple[str, ...] = get_args(ParentState)
WORKFLOW_PREFIX = mission_workflow_id("")
MAX_LIMIT = 10_000

# How Temporal's visibility spells each status (the ExecutionStatus search attribute).
_STATUS_NAMES = {
    WorkflowExecutionStatus.RUNNING: "Running",
    WorkflowExecutionStatus.COMPLETED: "Completed",
    WorkflowExecutionStatus.FAILED: "Failed",
    WorkflowExecutionStatus.CANCELED: "Canceled",
    WorkflowExecutionStatus.TERMINATED: "Terminated",
    WorkflowExecutionStatus.CONTINUED_AS_NEW: "ContinuedAsNew",
    WorkflowExecutionStatus.TIMED_OUT: "TimedOut",
}


@dataclass(frozen=True)
class MissionQuery:
    """The visibility query, and the values it could not carry, matched on each row instead."""

    text: str
    exact: tuple[tuple[SearchAttributeKey[str], str], ...] = ()

    def matches(self, execution: WorkflowExecution) -> bool:
        attributes = execution.typed_search_attributes
        return all(attributes.get(key) == value for key, value in self.exact)


SINCE = re.compile(r"^(\d{1,6})([smhd])$")
SINCE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def since_time(value: str, now: datetime) -> datetime:
    """`--since`: a duration back from now (`90s`, `30m`, `6h`, `7d`) or a time with its offset
    (`2026-12-01T09:00:00Z`); InputError otherwise."""
    match = SINCE.match(value.strip())
    if match:
        return now - timedelta(seconds=int(match[1]) * SINCE_UNITS[match[2]])
    try:
        moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise InputError(
            f"--since {value!r}: give a duration back from now (90s, 30m, 6h, 7d) "
            "or a time with its offset (2026-12-01T09:00:00Z)"
        )
    return moment.astimezone(timezone.utc)


def started_since(since: datetime) -> str:
    """The visibility clause for runs started at or after `since` (a mission or replay `--since`)."""
    return f"StartTime >= {literal(since.astimezone(timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ'))}"


def mission_query(
    *, state: str | None = None, host_group: str | None = None, orchestrator: str | None = None,
    running: bool = False, closed: bool = False, since: datetime | None = None, awaiting_answer: bool = False,
) -> MissionQuery:
    """The visibility query for these filters; InputError for a value no mission can have."""
    if running and closed:
        raise InputError("--running and --closed exclude each other: give one, or neither for both")
    clauses = [f"WorkflowType = {literal(MISSION_WORKFLOW)}", "ExecutionStatus != 'ContinuedAsNew'"]
    exact: list[tuple[SearchAttributeKey[str], str]] = []
    if state is not None and state not in MISSION_STATES:
        raise InputError(f"--state {state!r} is not a mission state: one of {', '.join(MISSION_STATES)}")
    if host_group is not None:
        host_group = check_argument(HostGroup, host_group, "--host-group")
    if orchestrator is not None:
        orchestrator = check_argument(SpecId, orchestrator, "--orchestrator")
    for key, value in ((MISSION_STATE, state), (MISSION_HOST_GROUP, host_group), (MISSION_ORCHESTRATOR, orchestrator)):
        if value is None:
            continue
        if quotable(value):
            clauses.append(f"{key.name} = {literal(value)}")
        else:
            exact.append((key, value))
    if since is not None:
        # A mission that continued as new is matched by its current run's start.
        clauses.append(started_since(since))
    if awaiting_answer:  # a child asks a question (workflows.mission.search.MISSION_AWAITING_ANSWER)
        clauses.append(f"{MISSION_AWAITING_ANSWER.name} = true AND ExecutionStatus = 'Running'")
    if running:
        clauses.append("ExecutionStatus = 'Running'")
    elif closed:
        clauses.append("ExecutionStatus != 'Running'")
    return MissionQuery(" AND ".join(clauses), tuple(exact))


@dataclass(frozen=True)
class MissionRow:
    mission_id: str
    workflow_id: str
    run_id: str
    state: str | None  # MissionState: the ledger's parent state as last upserted (the outcome once closed)
    aggregation: str | None
    host_group: str | None
    orchestrator: str | None
    status: str  # Temporal's execution status: Running, Completed, Canceled, ...
    started: datetime  # the first run's start (a mission that continued as new keeps its start)
    closed: datetime | None
    continued_as_new: bool  # its current run is not its first
    children: tuple[int, int, int] | None = None  # ok, failed, pending (see workflows/mission/search.py)

    def duration_seconds(self, now: datetime) -> float:
        return ((self.closed or now) - self.started).total_seconds()

    def as_json(self, now: datetime) -> dict[str, Any]:
        return {
            "mission_id": self.mission_id, "workflow_id": self.workflow_id, "run_id": self.run_id,
            "state": self.state, "aggregation": self.aggregation, "host_group": self.host_group,
            "orchestrator": self.orchestrator, "status": self.status,
            "started": self.started.isoformat(), "closed": self.closed.isoformat() if self.closed else None,
            "duration_seconds": round(self.duration_seconds(now), 3), "continued_as_new": self.continued_as_new,
            "children": dict(zip(("ok", "failed", "pending"), self.children)) if self.children else None,
        }


async def list_missions(client: Client, query: MissionQuery, limit: int) -> list[MissionRow]:
    """Missions matching `query` (see `mission_query`), newest first, at most `limit`, one per mission."""
    latest: dict[str, WorkflowExecution] = {}
    # Rows matched here as well as by the server may take reading further than `limit` rows.
    async for execution in client.list_workflows(
        query.text, limit=None if query.exact else limit, page_size=min(limit, 1000),
    ):
        if not query.matches(execution):
            continue
        known = latest.get(execution.id)
        if known is None or execution.start_time > known.start_time:
            latest[execution.id] = execution
        if len(latest) >= limit:
            break
    # Continued as new: the current run started at its last continue; the earliest run's start is the
    # mission's (visibility keeps the runs that continued, closed as ContinuedAsNew).
    started: dict[str, datetime] = {}
    async for earlier in runs_of(
        client, latest, f"WorkflowType = {literal(MISSION_WORKFLOW)} AND ExecutionStatus = 'ContinuedAsNew'",
    ):
        if earlier.id not in started or earlier.start_time < started[earlier.id]:
            started[earlier.id] = earlier.start_time
    rows = [_row(execution, started.get(execution.id, execution.start_time), execution.id in started)
            for execution in latest.values()]
    rows.sort(key=lambda row: row.started, reverse=True)
    return rows[:limit]


def _row(execution: WorkflowExecution, started: datetime, continued_as_new: bool) -> MissionRow:
    attributes = execution.typed_search_attributes
    status = execution.status
    return MissionRow(
        mission_id=execution.id.removeprefix(WORKFLOW_PREFIX),
        workflow_id=execution.id,
        run_id=execution.run_id,
        state=attributes.get(MISSION_STATE),
        aggregation=attributes.get(MISSION_AGGREGATION),
        host_group=attributes.get(MISSION_HOST_GROUP),
        orchestrator=attributes.get(MISSION_ORCHESTRATOR),
        status=_STATUS_NAMES.get(status, status.name if status else "Unknown") if status else "Unknown",
        started=started,
        closed=execution.close_time,
        continued_as_new=continued_as_new,
        children=_children(attributes),
    )


def _children(attributes) -> tuple[int, int, int] | None:
    counts = tuple(attributes.get(key) for key in (MISSION_CHILDREN_OK, MISSION_CHILDREN_FAILED, MISSION_CHILDREN_PENDING))
    return None if None in counts else counts  # type: ignore[return-value]


HEADERS = ["MISSION", "STATE", "AGGREGATION", "HOST GROUP", "STATUS", "OK/FAILED/PENDING", "STARTED (UTC)", "CLOSED (UTC)",
           "DURATION"]


def _when(moment: datetime | None) -> str | None:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S") if moment else None


def missions_table(rows: Sequence[MissionRow], now: datetime) -> str:
    if not rows:
        return render_table(HEADERS, []) + "\n(no missions)"
    return render_table(
        HEADERS,
        [
            [row.mission_id, row.state, row.aggregation, row.host_group,
             row.status + (" (continued as new)" if row.continued_as_new else ""),
             "/".join(map(str, row.children)) if row.children else "-",
             _when(row.started), _when(row.closed),
             human_duration(row.duration_seconds(now)) + ("" if row.closed else " so far")]
            for row in rows
        ],
        right=(5, 8),
    )
