"""`conductor mission ...`: list, start, run, watch, show, review, approve, stop and cancel missions.

Every mistake ends in one line on stderr (`conductor: ...`), never a traceback; `_run` maps them
to exit codes in one place: 2 for input the command cannot use (a spec, an id, a setting), 1 for
an answer from the server that the operation cannot go ahead (`MissionRefused`: no such mission,
closed already, review refused, no open question) or a server out of reach, 130 for Ctrl-C; an
answer the mission refuses (`approve`) is 2, with its reasons. A mission id argument
may be given as Temporal names its workflow (`mission:ID`): the prefix is taken off once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
import os
import sys
from collections.abc import Awaitable, Coroutine
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError
from temporalio.service import RPCError

from worker.config import WorkerConfig
from worker.connection import CLI_RETRY_CONFIG, ReconnectSettingError, connect, refusal
from worker import schemas
from worker.inputs import InputError, check_argument, label, one_line, read_json
from worker.ledger_view import ProgressLines, progress_record, render_ledger, render_progress
from worker.mission_list import MAX_LIMIT, MISSION_STATES, list_missions, mission_query, missions_table, since_time
from worker.admission_live import LiveError
from worker.cli.arguments import whole_number
from worker.child_output import LOG_TAIL_BYTES, STDERR_TAIL_BYTES, ExecutorReader, LogPrinter, failure_lines, read_streams
from worker.host_groups import create_host_group, require_host_group
from worker.mission_waits import admission_waits
from worker.mission_control import (
    AnswerRefused,
    MissionClosed,
    MissionControl,
    MissionIdUsed,
    MissionRefused,
    MissionSpecError,
    NoOpenQuestion,
    parse_spec,
)
from workflows.admission.model import OperatorName
from workflows.mission.aggregation import is_final, live_children
from workflows.mission.ledger import MissionLedger
from workflows.inbound import describe
from workflows.mission.messages import ReviewRequest, mission_workflow_id
from workflows.mission.questions import AnswerRequest, Question
from workflows.mission.spec import LONG_LIVED_KINDS, MissionSpec, SpecId


def register(subparsers: argparse._SubParsersAction) -> None:
    mission = subparsers.add_parser("mission", help="start and operate missions")
    commands = mission.add_subparsers(dest="mission_command", required=True, metavar="COMMAND")

    start = commands.add_parser(
        "start", help="start a mission from a spec file; prints its id", epilog=SPEC_EPILOG,
    )
    start.add_argument("spec", type=Path, help="mission spec (JSON); - reads standard input")
    _host_group_option(start)
    start.set_defaults(func=lambda args: _run(_start(args)))

    run = commands.add_parser(
        "run", help="start a mission and wait for its verdict; exit 0 only if it completed", epilog=SPEC_EPILOG,
    )
    run.add_argument("spec", type=Path, help="mission spec (JSON); - reads standard input")
    run.add_argument("--json", action="store_true", help="print the final ledger as JSON")
    _host_group_option(run)
    run.set_defaults(func=lambda args: _run(_run_mission(args)))

    schema = commands.add_parser(
        "schema", help="print a published JSON Schema (default: the mission spec's; --list names them all)",
        description="The JSON Schemas (draft 2020-12) of every workflow's interface, for editors, validators and "
        "clients in any language: the mission spec (the default; every field is explained in docs/mission-spec.md), "
        "the workflows' inputs and results, and each signal, update and query argument and answer "
        "(docs/mission-control-api.md says which is which).",
    )
    schema.add_argument("name", nargs="?", default="mission-spec", choices=sorted(schemas.BY_NAME), metavar="NAME",
                        help="which schema (default mission-spec): " + ", ".join(sorted(schemas.BY_NAME)))
    schema.add_argument("--list", action="store_true", help="list the schemas and what each describes")
    schema.set_defaults(func=_schema)

    watch = commands.add_parser(
        "watch", help="follow a mission until its workflow closes, a line per change",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=WATCH_DESCRIPTION,
    )
    watch.add_argument("mission_id")
    watch.add_argument("--json", action="store_true", help="JSON Lines: one object per change, the last the final ledger")
    watch.add_argument(
        "--until-verdict", action="store_true",
        help="stop once the verdict settles, not when the mission closes (long-lived children run on)",
    )
    watch.set_defaults(func=lambda args: _run(_watch(args)))

    listing = commands.add_parser(
        "list", help="missions from Temporal visibility, newest first",
        description="One row per mission (its current run, if it continued as new): id, MissionState (its "
        "outcome once closed), aggregation, host group, Temporal status, started, closed and duration.",
    )
    listing.add_argument("--state", metavar="STATE", help=f"only missions in this state ({', '.join(MISSION_STATES)})")
    listing.add_argument("--host-group", metavar="G", help="only missions on this host group")
    listing.add_argument("--orchestrator", metavar="O", help="only missions of this orchestrator")
    status = listing.add_mutually_exclusive_group()
    status.add_argument("--running", action="store_true", help="only missions whose workflow runs")
    status.add_argument("--closed", action="store_true", help="only missions whose workflow has closed")
    listing.add_argument("--awaiting-answer", action="store_true",
                         help="only running missions with a child waiting on an answer (`conductor mission approve`)")
    listing.add_argument("--since", metavar="T", help="only missions started since T: 30m, 6h, 7d, or 2026-12-01T09:00:00Z")
    listing.add_argument("--limit", type=whole_number(1, MAX_LIMIT), default=50, metavar="N", help="at most N missions (default 50)")
    listing.add_argument("--json", action="store_true", help="print a JSON array for scripts")
    listing.set_defaults(func=lambda args: _run(_list(args)))

    show = commands.add_parser("show", help="print a mission's ledger, and why queued children wait")
    show.add_argument("mission_id")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=lambda args: _run(_show(args)))

    logs = commands.add_parser(
        "logs", help="print a child's output and log (stdout and stderr on the local substrate)",
        description="From the child's ledger entry: its output and the artifacts its executor reported (a "
        "file:// artifact is read when the file is on this machine; otherwise a line says where it is). "
        "The executor reports them when a run ends, so a long-lived child shows them once it stops or, for "
        "a collector, after each run.",
    )
    logs.add_argument("mission_id")
    logs.add_argument("child_id", metavar="CHILD")
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing what is new until the child ends")
    logs.set_defaults(func=lambda args: _run(_logs(args)))

    review = commands.add_parser("review", help="approve or reject a manual-review mission (audited)")
    review.add_argument("mission_id")
    decision = review.add_mutually_exclusive_group(required=True)
    decision.add_argument("--approve", action="store_true")
    decision.add_argument("--reject", action="store_true")
    review.add_argument("--operator", default=None, help="who decides (default: the current user)")
    review.add_argument("--reason", required=True)
    review.set_defaults(func=lambda args: _run(_review(args)))

    approve = commands.add_parser(
        "approve", help="answer a child's open question: approve (default) or reject it, or send any payload",
        description="Answers the question a child waits on: its task's (hitl-prompt/v1) or, for a child with "
        "approval.required, \"dispatch CHILD?\" before it is dispatched. Approving sends {\"approved\": true}, "
        "--reject {\"approved\": false} (for a question whose schema has an `approved` boolean); --comment fills its "
        "`comment`; --payload sends any JSON object. The mission checks the payload against the question's "
        "response_schema and who may answer, records the answer in the ledger and forwards it once. Exit 0: "
        "accepted; 2: refused, with the reasons; 1: the child asks nothing now.",
    )
    approve.add_argument("mission_id")
    approve.add_argument("child_id", metavar="CHILD")
    approve.add_argument("--reject", action="store_true", help='send {"approved": false}')
    approve.add_argument("--comment", metavar="TEXT", help="a comment, in the payload's `comment`")
    approve.add_argument("--payload", metavar="JSON", help="the answer as a JSON object (its schema: `conductor mission show`)")
    approve.add_argument("--operator", default=None, help="who answers (default: the current user)")
    approve.set_defaults(func=lambda args: _run(_approve(args)))

    stop = commands.add_parser(
        "stop", help="once the verdict has settled: stop a mission's long-lived children and close it",
        description="Stops the daemons, agents and collectors that run on after the verdict, releases their "
        "leases and closes the mission. Refused (exit 1) before the verdict settles: to abandon a mission, "
        "`conductor mission cancel ID`.",
    )
    stop.add_argument("mission_id")
    stop.set_defaults(func=lambda args: _run(_signal(args, "stop")))

    cancel = commands.add_parser("cancel", help="cancel a mission: children, runtime tasks and admission")
    cancel.add_argument("mission_id")
    cancel.set_defaults(func=lambda args: _run(_signal(args, "cancel")))


SPEC_EPILOG = (
    "The spec format: `conductor mission schema` prints its JSON Schema; docs/mission-spec.md explains every "
    "field, with an example per aggregation mode and workload kind."
)


def _host_group_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--create-host-group", action="store_true",
        help="if the spec's host_group has no admission workflow yet, create it with the default policy "
        "($CONDUCTOR_ADMISSION_POLICY, else the built-in one), as `conductor admission policy set` would, audited "
        "under your user name; without it such a spec is refused",
    )


def _schema(args: argparse.Namespace) -> int:
    if args.list:
        width = max(len(name) for name in schemas.BY_NAME)
        for schema in schemas.SCHEMAS:
            print(f"{schema.name:<{width}}  {schema.used_as}")
    else:
        sys.stdout.write(schemas.shipped(args.name))
    return 0


WATCH_DESCRIPTION = """\
Follow a mission: a line each time what it says changes (a new ledger snapshot that
changes nothing a person reads, e.g. a lease renewal, prints nothing):

  HH:MM:SS snapshot N MISSION: STATE | K ok, K failed, K pending, K review | CHILD=STATE, ...

HH:MM:SS is the time in UTC; N is the ledger's snapshot sequence (it grows with every
recorded change, as the last line of `conductor mission show` says). Once the verdict
settles, long-lived children (daemons, agents, collectors) stay supervised: watch says
so once and keeps following until the mission closes (`conductor mission stop`), then
prints the final ledger. Exit 0 iff the verdict is completed.

--json prints JSON Lines instead, one object per change:
  {"event": "progress", "time": ISO-8601 UTC, "mission_id", "snapshot_seq",
   "parent_state", "aggregation": {"mode", "reason"}, "counts": {...},
   "children": {CHILD_ID: STATE, ...}}
one with "event": "verdict" when the verdict settles, and last "event": "final" with
the same fields, "closed", and "ledger" (the whole final ledger).
"""


INTERRUPTED = 130  # as a shell reports a command ended by SIGINT


class Interrupted(Exception):
    """Ctrl-C ended the command; the message says what carries on without it."""


def _run(coroutine: Coroutine[Any, Any, int]) -> int:
    """Run one command; every mistake and refusal is one `conductor: ...` line and an exit code."""
    try:
        return asyncio.run(_interruptible(coroutine))
    except (MissionSpecError, MissionIdUsed, ReconnectSettingError) as error:
        code, message = 2, str(error)
    except MissionClosed as error:
        # Stopping a closed mission leaves it as a stop would (closed, long-lived children ended):
        # idempotent, so it succeeds; a cancel or review of one did not happen, so it fails.
        code, message = (0 if error.operation == "stop" else 1), str(error)
    except AnswerRefused as error:  # the answer is wrong or not allowed: the reasons are the message
        code, message = 2, str(error)
    except MissionRefused as error:  # no such mission, a review refused, no open question: the server says no
        code, message = 1, str(error)
    except LiveError as error:  # creating a host group: the admission workflow or the server said no
        code, message = 1, str(error)
    except BrokenPipeError:  # the reader of our output left: worker.cli.main answers that
        raise
    except ConnectionError as error:  # and TemporalUnreachable: the server stayed away past the reconnect bound
        code, message = 1, str(error)
    except RPCError as error:  # any other answer the server gives: still one line
        code, message = 1, refusal(error)
    except Interrupted as error:
        code, message = INTERRUPTED, str(error)
    except KeyboardInterrupt:  # Ctrl-C outside the command's own code (asyncio setting up or cleaning up)
        code, message = INTERRUPTED, "interrupted"
    print(f"conductor: {one_line(message)}", file=sys.stderr)
    return code


def _was_interrupted(error: BaseException) -> bool:
    """Ctrl-C: a KeyboardInterrupt, or whatever ended the task after asyncio cancelled it for SIGINT
    (asyncio.run cancels the main task; temporalio turns a cancelled update into its own error)."""
    task = asyncio.current_task()
    return isinstance(error, KeyboardInterrupt) or (task is not None and task.cancelling() > 0)


async def _interruptible(coroutine: Coroutine[Any, Any, int]) -> int:
    try:
        return await coroutine
    except Interrupted:
        raise
    except BaseException as error:
        if _was_interrupted(error):
            raise Interrupted("interrupted") from None
        raise


T = TypeVar("T")


async def _waiting(mission_id: str, awaitable: Awaitable[T], what: str) -> T:
    """`await awaitable`; Ctrl-C stops only the waiting: the line says the mission goes on, and how to follow it."""
    try:
        return await awaitable
    except BaseException as error:
        if _was_interrupted(error):
            raise Interrupted(
                f"stopped {what}; mission {mission_id} carries on in Temporal: "
                f"`conductor mission watch {mission_id}` follows it again"
            ) from None
        raise


def _load_spec(path: Path) -> MissionSpec:
    """Through the front door (worker.inputs: size, UTF-8, JSON limits), then the spec's own rules."""
    return parse_spec(read_json(path, "mission spec"), source=label(path))


WORKFLOW_PREFIX = mission_workflow_id("")  # "mission:", as the Temporal UI shows a mission's workflow


def _mission_id(args: argparse.Namespace) -> str:
    """The mission id argument, bare or as its workflow's id (`mission:ID`, taken off once: a mission
    whose own id starts with `mission:` is named by its workflow id). It holds to the rule a spec's
    mission_id does, so it can name a workflow."""
    given: str = args.mission_id
    mission_id = given.removeprefix(WORKFLOW_PREFIX)
    if not mission_id:
        raise InputError(f"mission id {given!r} names no mission: give the id, alone or after {WORKFLOW_PREFIX}")
    return check_argument(SpecId, mission_id, "mission id")


def _review_request(args: argparse.Namespace) -> ReviewRequest:
    """The review as the workflow will take it (operator: a login name; reason: what the ledger keeps)."""
    operator = args.operator
    if operator is None:
        operator = _user_name("cannot tell who you are: say who decides with --operator NAME")
    try:
        return ReviewRequest(operator=operator, decision="approve" if args.approve else "reject", reason=args.reason)
    except ValidationError as error:
        problems = []
        for item in error.errors():
            option = f"--{item['loc'][0]}" if item["loc"] else "the review"
            if option == "--operator" and args.operator is None:
                option = "--operator (default: your user name)"
            problems.append(f"{option}: {item['msg'].removeprefix('Value error, ')}")
        raise InputError(f"cannot send this review: {'; '.join(problems)}") from None


async def _control() -> MissionControl:
    return MissionControl(await connect(retry_config=CLI_RETRY_CONFIG), WorkerConfig.from_env().task_queue)


def _operator() -> str:
    """Who creates a host group, as the admission audit will name them: the current user."""
    name = _user_name("cannot tell who you are for --create-host-group: set USER")
    return check_argument(OperatorName, name, "--create-host-group (your user name, $USER)")


def _user_name(unknown: str) -> str:
    """$USER, else the login name; `InputError(unknown)` if there is neither."""
    try:
        return os.environ.get("USER") or getpass.getuser()
    except Exception:  # no USER and no passwd entry (some containers)
        raise InputError(unknown) from None


async def _host_group_ready(control: MissionControl, spec: MissionSpec, create: bool) -> None:
    """The spec's host group must exist (a typo would otherwise create a new admission workflow with
    the default policy); `--create-host-group` creates it through the audited policy change."""
    if create:
        config = WorkerConfig.from_env()
        operator = _operator()
        created = await create_host_group(
            control.client, config.task_queue, spec.host_group, config.policy_for(spec.host_group), operator,
        )
        if created:
            print(f"created host group {spec.host_group} with the default admission policy (by {operator})", file=sys.stderr)
        return
    await require_host_group(control.client, spec.host_group)


async def _start(args: argparse.Namespace) -> int:
    spec = _load_spec(args.spec)
    control = await _control()
    await _host_group_ready(control, spec, args.create_host_group)
    print(await control.start(spec))
    return 0


async def _run_mission(args: argparse.Namespace) -> int:
    spec = _load_spec(args.spec)
    control = await _control()
    await _host_group_ready(control, spec, args.create_host_group)
    await control.start(spec)
    if not args.json:
        print(f"mission {spec.mission_id} started; waiting for its verdict", file=sys.stderr)
    ledger = await _waiting(spec.mission_id, control.wait_for_verdict(spec.mission_id), "waiting for the verdict")
    _print_ledger(ledger, args.json, None if args.json else await failure_details(ledger))
    running_on = still_running_note(ledger)
    if running_on:
        print(running_on, file=sys.stderr if args.json else sys.stdout)
    return 0 if ledger.parent_state == "completed" else 1


def still_running_note(ledger: MissionLedger) -> str | None:
    """What `mission run` adds when the verdict settled while long-lived children still run: they
    keep their leases until stopped, so say which, and the command that stops them."""
    live = set(live_children(ledger))
    long_lived = [c.child_id for c in ledger.children if c.child_id in live and c.kind in LONG_LIVED_KINDS]
    if not long_lived or not is_final(ledger) or ledger.parent_state == "cancelled":
        return None
    names = ", ".join(long_lived[:10]) + (f" and {len(long_lived) - 10} more" if len(long_lived) > 10 else "")
    return (
        f"the verdict has settled, but mission {ledger.mission_id} still runs {names} (long-lived, holding "
        f"{'its lease' if len(long_lived) == 1 else 'their leases'}): `conductor mission stop {ledger.mission_id}` "
        "stops them and closes the mission"
    )


async def _watch(args: argparse.Namespace) -> int:
    mission_id = _mission_id(args)
    control = await _control()
    lines = ProgressLines()

    def emit(record: dict) -> None:
        print(json.dumps(record), flush=True)

    def on_ledger(ledger: MissionLedger) -> None:
        if not lines.changed(ledger):
            return  # a new snapshot (a lease renewed, say) that says nothing new to a person
        now = datetime.now(timezone.utc)
        if args.json:
            emit(progress_record(ledger, now))
        else:
            print(render_progress(ledger, now), flush=True)

    def on_verdict(ledger: MissionLedger) -> None:
        now = datetime.now(timezone.utc)
        said = (
            f"verdict settled: {ledger.parent_state}; mission {mission_id} runs on (long-lived children stay "
            f"supervised) until `conductor mission stop {mission_id}`"
        )
        if args.json:
            emit({**progress_record(ledger, now, "verdict"), "message": said})
        else:
            print(f"{now:%H:%M:%S} {said}", flush=True)

    closed: list[str] = []  # how the workflow ended, if not by completing (cancelled, terminated ...)
    ledger = await _waiting(
        mission_id,
        control.watch(
            mission_id, on_ledger, until_closed=not args.until_verdict, on_verdict=on_verdict, on_closed=closed.append,
        ),
        "watching",
    )
    closed_as = closed[0] if closed else None
    now = datetime.now(timezone.utc)
    if args.json:
        record = {**progress_record(ledger, now, "final"), "closed": not args.until_verdict}
        if closed_as is not None:
            record["closed_as"] = closed_as
        record["ledger"] = ledger.model_dump(mode="json")
        emit(record)
    else:
        if closed_as is not None:
            print(f"{now:%H:%M:%S} mission {mission_id} closed: {closed_as}; its last ledger:", flush=True)
        print(render_ledger(ledger))
    return 0 if ledger.parent_state == "completed" and closed_as is None else 1


async def _list(args: argparse.Namespace) -> int:
    query = mission_query(
        state=args.state, host_group=args.host_group, orchestrator=args.orchestrator,
        running=args.running, closed=args.closed, awaiting_answer=args.awaiting_answer,
        since=since_time(args.since, datetime.now(timezone.utc)) if args.since is not None else None,
    )
    client = await connect(retry_config=CLI_RETRY_CONFIG)
    rows = await list_missions(client, query, args.limit)
    now = datetime.now(timezone.utc)
    if args.json:
        print(json.dumps([row.as_json(now) for row in rows], indent=2))
    else:
        print(missions_table(rows, now))
    return 0


async def _show(args: argparse.Namespace) -> int:
    mission_id = _mission_id(args)
    control = await _control()
    ledger = await control.show(mission_id)
    if args.json:
        _print_ledger(ledger, True)
        return 0
    waits, notes = await admission_waits(control, mission_id, ledger)
    print(render_ledger(ledger, waits=waits, notes=notes, details=await failure_details(ledger)))
    return 0


FAILED_PROCESS_STATES = ("failed", "timed-out")


@contextlib.asynccontextmanager
async def _executor_reader():
    """A reader of the executor plane (where a child's output lives), or why there is none."""
    reader, problem = ExecutorReader.from_env(WorkerConfig.from_env().executor_url)
    try:
        yield reader, problem
    finally:
        if reader is not None:
            await reader.aclose()


async def failure_details(ledger: MissionLedger) -> dict[str, list[str]]:
    """child_id -> how it ended and its stderr's tail, for each child whose process failed."""
    failed = [c for c in ledger.children if c.outcome == "failed" and c.observed_state in FAILED_PROCESS_STATES]
    if not failed:
        return {}
    async with _executor_reader() as (reader, problem):
        streams = await asyncio.gather(*(read_streams(c, reader, problem, STDERR_TAIL_BYTES) for c in failed))
    return {child.child_id: failure_lines(child, found) for child, found in zip(failed, streams)}


FOLLOW_INTERVAL = 1.0  # seconds between reads of the ledger with --follow


def _child_of(ledger: MissionLedger, child_id: str):
    """The child's ledger entry; `MissionRefused` (one line naming the children) if there is none."""
    try:
        return ledger.child(child_id)
    except ValueError as error:
        more = f" and {len(ledger.children) - 10} more" if len(ledger.children) > 10 else ""
        raise MissionRefused(f"{error}{more}") from None


async def _logs(args: argparse.Namespace) -> int:
    mission_id = _mission_id(args)
    child_id = check_argument(SpecId, args.child_id, "child id")
    control = await _control()
    ledger = await control.show(mission_id)
    child = _child_of(ledger, child_id)
    printer = LogPrinter(child_id, lambda text: print(text, end="", flush=True))
    async with _executor_reader() as (reader, problem):
        printed = printer.emit(await read_streams(child, reader, problem, LOG_TAIL_BYTES))
        if not args.follow:
            if not printed:
                print(f"conductor: {child_id} has reported no output or log yet ({child.observed_state})", file=sys.stderr)
            return 0

        async def follow() -> None:
            nonlocal ledger, child
            while child_id in live_children(ledger):
                await asyncio.sleep(FOLLOW_INTERVAL)
                try:
                    ledger = await control.show(mission_id)
                except MissionClosed:
                    return
                child = ledger.child(child_id)
                printer.emit(await read_streams(child, reader, problem, LOG_TAIL_BYTES))

        await _waiting(mission_id, follow(), f"following {child_id}")
    print(f"conductor: {child_id} has ended ({child.observed_state})", file=sys.stderr)
    return 0


async def _review(args: argparse.Namespace) -> int:
    mission_id = _mission_id(args)
    request = _review_request(args)
    control = await _control()
    ledger = await control.review(
        mission_id, approve=request.decision == "approve", operator=request.operator, reason=request.reason
    )
    print(render_ledger(ledger))
    return 0


def _answer_payload(args: argparse.Namespace, question: Question) -> dict[str, Any]:
    """What `approve` sends: --payload as given, else {"approved": ...} where the schema has that
    boolean; --comment goes into `comment`."""
    properties = question.response_schema.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    if args.payload is not None:
        if args.reject:
            raise InputError("--reject and --payload cannot go together: put the rejection in the payload")
        try:
            payload = json.loads(args.payload)
        except json.JSONDecodeError as error:
            raise InputError(f"--payload is not JSON: {error.msg} at character {error.pos}") from None
        if not isinstance(payload, dict):
            raise InputError(f"--payload must be a JSON object, not {label(payload)}")
    elif (properties.get("approved") or {}).get("type") == "boolean":
        payload = {"approved": not args.reject}
    else:
        raise InputError(
            f"this question takes no approve/reject (its schema has no `approved` boolean): answer with --payload JSON "
            f"matching its response_schema {json.dumps(question.response_schema)[:300]}"
        )
    if args.comment is not None:
        payload["comment"] = args.comment
    return payload


async def _approve(args: argparse.Namespace) -> int:
    mission_id = _mission_id(args)
    operator = args.operator or _user_name("cannot tell who you are: say who answers with --operator NAME")
    control = await _control()
    child = _child_of(await control.show(mission_id), check_argument(SpecId, args.child_id, "child id"))
    question = child.question
    if question is None:
        raise NoOpenQuestion(f"child {child.child_id} of mission {mission_id} has no open question (it is {child.observed_state})")
    payload = _answer_payload(args, question)
    try:
        request = AnswerRequest(child_id=child.child_id, operator=operator, payload=payload, prompt_id=question.prompt_id)
    except ValidationError as error:
        raise InputError(f"cannot send this answer: {describe(error)}") from None
    result = await control.answer(mission_id, request)
    print(f"{child.child_id}: {result.outcome} ({result.detail}); prompt {result.prompt_id} {question.prompt[:120]!r}")
    return 0


async def _signal(args: argparse.Namespace, what: str) -> int:
    mission_id = _mission_id(args)
    control = await _control()
    await (control.stop_after_verdict if what == "stop" else control.cancel)(mission_id)
    print(f"{what} requested for mission {mission_id}")
    return 0


def _print_ledger(ledger: MissionLedger, as_json: bool, details: dict[str, list[str]] | None = None) -> None:
    if as_json:
        print(ledger.model_dump_json(indent=2))
    else:
        print(render_ledger(ledger, details=details))
