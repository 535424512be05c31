"""Replay before you deploy: the histories a server holds, replayed against the workflow code here.

`tests/histories/` proves that the scenarios we recorded still replay; the workflows running in
staging or production have histories no scenario recorded (another policy, an operator's
signal at an odd moment, a continue-as-new at another length). Replaying those against the
code about to be rolled out, before the rollout, finds a nondeterministic change while it is
still only a failed check, rather than a stuck workflow task in production.

The workflow classes to replay against are a parameter, so a test can replay a history against
a changed class. Histories stream from the server to the replayer one at a time (a listing of
10,000 runs is never held in memory); each can be saved, as `tests/record_histories.py` saves
them, for a recorded-history test.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from temporalio.client import Client, WorkflowHistory
from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from activities.visibility import literal
from worker.inputs import InputError
from worker.mission_list import started_since
from worker.payloads import DATA_CONVERTER

PRODUCT_TYPES = ("MissionWorkflow", "WorkloadWorkflow", "AdmissionWorkflow")
DEFAULT_QUERY = "WorkflowType IN (" + ",".join(literal(name) for name in PRODUCT_TYPES) + ")"
DEFAULT_LIMIT = 100
MAX_LIMIT = 10_000
MAX_QUERY_CHARS = 4_000
MESSAGE_CHARS = 300  # a replay failure's message in the report: the first mismatch, not a whole dump

NONDETERMINISTIC = "nondeterministic"
FAILED = "failed"  # any other replay failure: an unregistered type, a workflow task that raised, ...


class QueryRefused(Exception):
    """The server would not run the visibility query (bad syntax, an unknown attribute); the
    message is the server's reason, one line."""


def replay_query(query: str | None = None, since: datetime | None = None) -> str:
    """The visibility query: `query` (default: the product's workflow types), started since `since`."""
    if query is not None:
        if not query.strip():
            raise InputError("--query is empty: give a visibility query, e.g. \"WorkflowType = 'MissionWorkflow'\"")
        if not query.isprintable():
            raise InputError("--query must be printable characters on one line")
        if len(query) > MAX_QUERY_CHARS:
            raise InputError(f"--query must be at most {MAX_QUERY_CHARS} characters, got {len(query)}")
    text = f"({query.strip()})" if query is not None else DEFAULT_QUERY
    if since is not None:
        text += f" AND {started_since(since)}"
    return text


def check_limit(value: str | int) -> int:
    try:
        limit = int(value)
    except (TypeError, ValueError):
        raise InputError(f"--limit must be a whole number from 1 to {MAX_LIMIT}, got {value!r}") from None
    if not 1 <= limit <= MAX_LIMIT:
        raise InputError(f"--limit must be from 1 to {MAX_LIMIT}, got {limit}")
    return limit


@dataclass(frozen=True)
class Failure:
    workflow_type: str
    workflow_id: str
    run_id: str
    kind: str  # NONDETERMINISTIC or FAILED
    message: str  # the replay failure's message, one line, at most MESSAGE_CHARS

    def as_json(self) -> dict[str, str]:
        return {"workflow_type": self.workflow_type, "workflow_id": self.workflow_id, "run_id": self.run_id,
                "kind": self.kind, "message": self.message}


@dataclass
class TypeCounts:
    replayed: int = 0
    passed: int = 0
    nondeterministic: int = 0
    failed: int = 0


@dataclass
class ReplayReport:
    query: str
    counts: dict[str, TypeCounts] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    saved: list[Path] = field(default_factory=list)

    @property
    def replayed(self) -> int:
        return sum(counts.replayed for counts in self.counts.values())

    @property
    def ok(self) -> bool:
        return not self.failures

    def lines(self) -> list[str]:
        if not self.counts:
            return [f"no workflow histories match: {self.query}"]
        lines = [
            f"{name}: {c.replayed} replayed, {c.passed} passed, {c.nondeterministic} nondeterministic, "
            f"{c.failed} other failures"
            for name, c in sorted(self.counts.items())
        ]
        lines += [f"{f.kind} {f.workflow_id} (run {f.run_id}): {f.message}" for f in self.failures]
        if self.saved:
            lines.append(f"saved {len(self.saved)} histories")
        return lines

    def as_json(self) -> dict[str, object]:
        return {
            "query": self.query,
            "replayed": self.replayed,
            "ok": self.ok,
            "types": {name: vars(c) for name, c in sorted(self.counts.items())},
            "failures": [failure.as_json() for failure in self.failures],
            "saved": [str(path) for path in self.saved],
        }


def one_line(text: str, limit: int = MESSAGE_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


# The core wraps a failed replay in its debug rendering (`Workflow activation completion failed:
# Failure { failure: Some(Failure { message: "...", stack_trace: ... }) }`); the first quoted
# message is the mismatch itself.
_CORE_MESSAGE = re.compile(r'message: "((?:[^"\\]|\\.)*)"')


def mismatch(failure: BaseException) -> str:
    text = str(failure) or type(failure).__name__
    found = _CORE_MESSAGE.search(text)
    if found:
        text = found.group(1).replace('\\"', '"').replace("\\n", " ")
    return one_line(text)


_quiet_runtime: Runtime | None = None


def quiet_runtime() -> Runtime:
    """A runtime whose core logs errors only: a failed replay is reported once, in the report,
    not also as a WARN line with a stack trace for every failing history."""
    global _quiet_runtime
    if _quiet_runtime is None:
        _quiet_runtime = Runtime(telemetry=TelemetryConfig(
            logging=LoggingConfig(filter=TelemetryFilter(core_level="ERROR", other_level="ERROR")),
        ))
    return _quiet_runtime


@contextmanager
def worker_logs_quiet() -> Iterator[None]:
    """The SDK's worker logger, errors and worse only: it logs every failed activation with a
    traceback (an unregistered type, a workflow that raised), which the report says in one line."""
    logger = logging.getLogger("temporalio.worker")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def workflow_type_of(history: WorkflowHistory) -> str:
    if not history.events:
        return "?"
    return history.events[0].workflow_execution_started_event_attributes.workflow_type.name or "?"


# --- saving ----------------------------------------------------------------------------------------

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
MAX_NAME_CHARS = 150


def file_stem(workflow_id: str) -> str:
    """A file name for a workflow id that cannot leave the directory: only [A-Za-z0-9._-], no
    leading dot, bounded length; an id that had to be changed gets a short hash of itself, so two
    ids that differ only in replaced characters (`mission:a`, `mission/a`) never share a file."""
    safe = _UNSAFE.sub("_", workflow_id).lstrip(".")[:MAX_NAME_CHARS] or "workflow"
    if safe != workflow_id:
        safe += "~" + hashlib.sha256(workflow_id.encode()).hexdigest()[:8]
    return safe


def without_stack_traces(value: object) -> object:
    """Every failure's stack trace emptied, as `tests/record_histories.py` saves histories: a trace
    names the files of the machine that ran the workflow and plays no part in replay."""
    if isinstance(value, dict):
        return {key: "" if key == "stackTrace" else without_stack_traces(item) for key, item in value.items()}
    if isinstance(value, list):
        return [without_stack_traces(item) for item in value]
    return value


def save_history(directory: Path, history: WorkflowHistory, name: str) -> Path:
    path = directory / f"{name}.json"
    if path.resolve().parent != directory.resolve():  # file_stem makes this impossible; never write elsewhere
        raise ValueError(f"refusing to write {path} outside {directory}")
    path.write_text(json.dumps(without_stack_traces(json.loads(history.to_json())), indent=1) + "\n")
    return path


# --- fetching and replaying -----------------------------------------------------------------------------


async def _histories(
    client: Client, query: str, limit: int, save_dir: Path | None, saved: list[Path],
) -> AsyncIterator[WorkflowHistory]:
    names: dict[str, int] = {}
    try:
        async for execution in client.list_workflows(query, limit=limit, page_size=min(limit, 1000)):
            try:
                history = await client.get_workflow_handle(execution.id, run_id=execution.run_id).fetch_history()
            except RPCError as error:
                if error.status == RPCStatusCode.NOT_FOUND:  # deleted by retention since it was listed
                    continue
                raise
            if save_dir is not None:
                stem = file_stem(execution.id)
                seen = names.get(stem, 0)
                names[stem] = seen + 1
                # Newest first: the latest run keeps the plain name, older runs of the id (a
                # continue-as-new chain) get `-older1`, `-older2`, ...
                saved.append(save_history(save_dir, history, stem if seen == 0 else f"{stem}-older{seen}"))
            yield history
    except RPCError as error:
        if error.status == RPCStatusCode.INVALID_ARGUMENT:
            raise QueryRefused(f"the Temporal server refused the query {query!r}: {one_line(error.message)}") from None
        raise


async def replay_histories(
    histories: AsyncIterator[WorkflowHistory], workflows: Sequence[type], report: ReplayReport,
) -> ReplayReport:
    """Replay each history against `workflows` with the production data converter; every history
    is counted under its workflow type, and every failure kept (one line) in `report`."""
    replayer = Replayer(workflows=list(workflows), data_converter=DATA_CONVERTER, runtime=quiet_runtime())
    with worker_logs_quiet():
        async with replayer.workflow_replay_iterator(histories) as results:
            async for result in results:
                name = workflow_type_of(result.history)
                counts = report.counts.setdefault(name, TypeCounts())
                counts.replayed += 1
                failure = result.replay_failure
                if failure is None:
                    counts.passed += 1
                else:
                    kind = NONDETERMINISTIC if isinstance(failure, NondeterminismError) else FAILED
                    if kind == NONDETERMINISTIC:
                        counts.nondeterministic += 1
                    else:
                        counts.failed += 1
                    report.failures.append(Failure(
                        name, result.history.workflow_id, result.history.run_id, kind,
                        mismatch(failure),
                    ))
    return report


async def replay_from_server(
    client: Client, workflows: Sequence[type], *, query: str | None = None, since: datetime | None = None,
    limit: int = DEFAULT_LIMIT, save_dir: Path | None = None,
) -> ReplayReport:
    """Fetch up to `limit` histories matching the query (newest first, as visibility lists them),
    running or closed, and replay them. `QueryRefused` if the server rejects the query."""
    text = replay_query(query, since)
    limit = check_limit(limit)
    if save_dir is not None:
        save_dir.mkdir(parents=True, exist_ok=True)
    report = ReplayReport(query=text)
    return await replay_histories(_histories(client, text, limit, save_dir, report.saved), workflows, report)
