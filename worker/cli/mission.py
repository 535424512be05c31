"""`conductor mission ...`: list, start, run, watch, show, review, stop and cancel missions.

Every mistake ends in one line on stderr (`conductor: ...`), never a traceback; `_run` maps them
to exit codes in one place: 2 for input the command cannot use (a spec, an id, a setting), 1 for
an answer from the server that the operation cannot go ahead (`MissionRefused`: no such mission,
closed already, review refused) or a server out of reach, 130 for Ctrl-C. A mission id argument
may be given as Temporal names its workflow (`mission:ID`): the prefix is taken off once.
"""

from __future__ import annotations

import argparse
import asyncio
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
from worker.connection import CLI_RETRY_CONFIG, ReconnectSettingError, connect
from worker.inputs import InputError, check_argument, label, one_line, read_json
from worker.ledger_view import ProgressLines, progress_record, render_ledger, render_progress
from worker.mission_list import MAX_LIMIT, MISSION_STATES, list_missions, mission_query, missions_table
from worker.mission_waits import admission_waits
from worker.mission_control import (
    MissionClosed,
    MissionControl,
    MissionIdUsed,
    MissionRefused,
    MissionSpecError,
    parse_spec,
)
from workflows.mission.ledger import MissionLedger
from workflows.mission.messages import ReviewRequest, mission_workflow_id
from workflows.mission.spec import MissionSpec, SpecId


def register(subparsers: argparse._SubParsersAction) -> None:
    mission = subparsers.add_parser("mission", help="start and operate missions")
    commands = mission.add_subparsers(dest="mission_command", required=True, metavar="COMMAND")

    start = commands.add_parser("start", help="start a mission from a spec file; prints its id")
    start.add_argument("spec", type=Path, help="mission spec (JSON); - reads standard input")
    start.set_defaults(func=lambda args: _run(_start(args)))

    run = commands.add_parser("run", help="start a mission and wait for its verdict; exit 0 only if it completed")
    run.add_argument("spec", type=Path, help="mission spec (JSON); - reads standard input")
    run.add_argument("--json", action="store_true", help="print the final ledger as JSON")
    run.set_defaults(func=lambda args: _run(_run_mission(args)))

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
    listing.add_argument("--limit", type=_positive_int, default=50, metavar="N", help="at most N missions (default 50)")
    listing.add_argument("--json", action="store_true", help="print a JSON array for scripts")
    listing.set_defaults(func=lambda args: _run(_list(args)))

    show = commands.add_parser("show", help="print a mission's ledger, and why queued children wait")
    show.add_argument("mission_id")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=lambda args: _run(_show(args)))

    review = commands.add_parser("review", help="approve or reject a manual-review mission (audited)")
    review.add_argument("mission_id")
    decision = review.add_mutually_exclusive_group(required=True)
    decision.add_argument("--approve", action="store_true")
    decision.add_argument("--reject", action="store_true")
    review.add_argument("--operator", default=None, help="who decides (default: the current user)")
    review.add_argument("--reason", required=True)
    review.set_defaults(func=lambda args: _run(_review(args)))

    stop = commands.add_parser("stop", help="stop a mission's long-lived children and close it")
    stop.add_argument("mission_id")
    stop.set_defaults(func=lambda args: _run(_signal(args, "stop")))

    cancel = commands.add_parser("cancel", help="cancel a mission: children, runtime tasks and admission")
    cancel.add_argument("mission_id")
    cancel.set_defaults(func=lambda args: _run(_signal(args, "cancel")))


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


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"must be 1 to {MAX_LIMIT}, got {value}")
    return value


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
    except MissionRefused as error:  # no such mission, a review refused: the server says no
        code, message = 1, str(error)
    except BrokenPipeError:  # the reader of our output left: worker.cli.main answers that
        raise
    except ConnectionError as error:  # and TemporalUnreachable: the server stayed away past the reconnect bound
        code, message = 1, str(error)
    except RPCError as error:  # any other answer the server gives: still one line
        code, message = 1, f"the Temporal server refused: {error.message} ({error.status.name if error.status else 'no status'})"
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
        try:
            operator = os.environ.get("USER") or getpass.getuser()
        except Exception:  # no USER and no passwd entry (some containers)
            raise InputError("cannot tell who you are: say who decides with --operator NAME") from None
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


async def _start(args: argparse.Namespace) -> int:
    spec = _load_spec(args.spec)
    control = await _control()
    print(await control.start(spec))
    return 0


async def _run_mission(args: argparse.Namespace) -> int:
    spec = _load_spec(args.spec)
    control = await _control()
    await control.start(spec)
    if not args.json:
        print(f"mission {spec.mission_id} started; waiting for its verdict", file=sys.stderr)
    ledger = await _waiting(spec.mission_id, control.wait_for_verdict(spec.mission_id), "waiting for the verdict")
    _print_ledger(ledger, args.json)
    return 0 if ledger.parent_state == "completed" else 1


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
        running=args.running, closed=args.closed,
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
    print(render_ledger(ledger, waits=waits, notes=notes))
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


async def _signal(args: argparse.Namespace, what: str) -> int:
    mission_id = _mission_id(args)
    control = await _control()
    await (control.stop if what == "stop" else control.cancel)(mission_id)
    print(f"{what} requested for mission {mission_id}")
    return 0


def _print_ledger(ledger: MissionLedger, as_json: bool) -> None:
    if as_json:
        print(ledger.model_dump_json(indent=2))
    else:
        print(render_ledger(ledger))
