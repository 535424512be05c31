"""`conductor mission ...`: start, run, watch, show, review, stop and cancel missions."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import os
import sys
from pathlib import Path

from pydantic import ValidationError

from worker.config import WorkerConfig
from worker.connection import CLI_RETRY_CONFIG, ReconnectSettingError, connect
from worker.inputs import InputError, check_argument, label, read_json
from worker.ledger_view import render_ledger, render_progress
from worker.mission_control import MissionControl, MissionIdUsed, MissionSpecError, ReviewRefused, parse_spec
from workflows.mission.ledger import MissionLedger
from workflows.mission.messages import ReviewRequest
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

    watch = commands.add_parser("watch", help="follow a mission's children until its verdict settles")
    watch.add_argument("mission_id")
    watch.set_defaults(func=lambda args: _run(_watch(args)))

    show = commands.add_parser("show", help="print a mission's ledger")
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


def _run(coroutine) -> int:
    try:
        return asyncio.run(coroutine)
    except (MissionSpecError, MissionIdUsed, ReviewRefused, ReconnectSettingError, ConnectionError) as error:
        # ConnectionError includes TemporalUnreachable: the server stayed away past the reconnect bound.
        print(f"conductor: {error}", file=sys.stderr)
        return 2 if isinstance(error, (MissionSpecError, MissionIdUsed, ReconnectSettingError)) else 1


def _load_spec(path: Path) -> MissionSpec:
    """Through the front door (worker.inputs: size, UTF-8, JSON limits), then the spec's own rules."""
    return parse_spec(read_json(path, "mission spec"), source=label(path))


def _mission_id(args: argparse.Namespace) -> str:
    """A mission id argument holds to the rule a spec's mission_id does, so it can name a workflow."""
    return check_argument(SpecId, args.mission_id, "mission id")


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
    ledger = await control.wait_for_verdict(spec.mission_id)
    _print_ledger(ledger, args.json)
    return 0 if ledger.parent_state == "completed" else 1


async def _watch(args: argparse.Namespace) -> int:
    _mission_id(args)
    control = await _control()
    ledger = await control.watch(args.mission_id, lambda ledger: print(render_progress(ledger), flush=True))
    print(render_ledger(ledger))
    return 0 if ledger.parent_state == "completed" else 1


async def _show(args: argparse.Namespace) -> int:
    _mission_id(args)
    control = await _control()
    _print_ledger(await control.show(args.mission_id), args.json)
    return 0


async def _review(args: argparse.Namespace) -> int:
    _mission_id(args)
    request = _review_request(args)
    control = await _control()
    ledger = await control.review(
        args.mission_id, approve=request.decision == "approve", operator=request.operator, reason=request.reason
    )
    print(render_ledger(ledger))
    return 0


async def _signal(args: argparse.Namespace, what: str) -> int:
    _mission_id(args)
    control = await _control()
    await (control.stop if what == "stop" else control.cancel)(args.mission_id)
    print(f"{what} requested for mission {args.mission_id}")
    return 0


def _print_ledger(ledger: MissionLedger, as_json: bool) -> None:
    if as_json:
        print(ledger.model_dump_json(indent=2))
    else:
        print(render_ledger(ledger))
