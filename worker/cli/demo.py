"""`conductor demo`: the embedded stack and a sample mission, watched live.

What a new user sees first, so it must work on a fresh machine with nothing but
the package installed: it starts the Temporal dev server (with its Web UI), the
local substrate and a worker, runs the bundled mission (one child of each
workload kind, and one that asks a question before it publishes, which the demo
answers as an operator would with `conductor mission approve`; quorum of three),
shows its progress, prints the verdict and the ledger, then stops the mission's
long-lived children and the stack, unless `--keep` asks it to stay up for
exploring the UI.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path

from worker.inputs import InputError, label, read_json
from worker.ledger_view import ProgressLines, render_ledger, render_progress
from worker.mission_control import MissionControl, MissionRefused, MissionSpecError, parse_spec
from workflows.mission.questions import AnswerRequest
from worker.stack import DEFAULT_DATA_DIR, DEFAULT_INSTANCES, DevStack, StackError
from worker.cli.arguments import whole_number


PORT = whole_number(0, 65535)  # 0: a free one


def register(subparsers: argparse._SubParsersAction) -> None:
    demo = subparsers.add_parser(
        "demo", help="start the embedded stack and run a sample mission, watched live",
        description="Starts a Temporal dev server (with its Web UI), the local substrate and a worker, runs a "
        "mission (the bundled one: one child of each workload kind and one that asks a question, which the demo "
        "answers as an operator would; a quorum of three), prints its progress, "
        "verdict and ledger, then stops it and the stack. Ports are free ones unless given, so a demo never "
        "collides with a `conductor dev` or another demo. Through make: make demo DEMO_ARGS='--keep --ui-port 8233'.",
        allow_abbrev=False,
    )
    demo.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR, help=f"state directory (default {DEFAULT_DATA_DIR})")
    demo.add_argument("--keep", action="store_true", help="stay up after the verdict (Ctrl-C to stop)")
    demo.add_argument("--spec", type=Path, default=None, help="run this mission spec instead of the bundled one")
    demo.add_argument("--temporal-port", "--port", dest="temporal_port", type=PORT, default=0, metavar="PORT",
                      help="Temporal gRPC port (default: a free one)")
    demo.add_argument("--ui-port", type=PORT, default=0, metavar="PORT", help="Temporal Web UI port (default: a free one)")
    demo.add_argument("--substrate-port", type=PORT, default=0, metavar="PORT",
                      help="local substrate port (default: a free one)")
    demo.add_argument("--instances", type=whole_number(1), default=DEFAULT_INSTANCES, metavar="N",
                      help=f"substrate executor instances (default {DEFAULT_INSTANCES}; the bundled mission needs 5)")
    demo.set_defaults(func=run_demo)


def _bundled_spec() -> dict:
    return json.loads(resources.files("worker.examples").joinpath("mission.json").read_text())


def _quiet_core_logs() -> None:
    """The SDK core's warnings (e.g. a heartbeat landing after a cancel) are noise in a demo."""
    from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter

    Runtime.set_default(
        Runtime(telemetry=TelemetryConfig(logging=LoggingConfig(filter=TelemetryFilter(core_level="ERROR", other_level="ERROR")))),
        error_if_already_set=False,
    )


def run_demo(args: argparse.Namespace) -> int:
    _quiet_core_logs()
    data = read_json(args.spec, "mission spec") if args.spec else _bundled_spec()
    # A fresh id per run, so the demo can be run again on the same data directory.
    if isinstance(data, dict) and isinstance(data.get("mission_id"), str):
        data["mission_id"] = f"{data['mission_id']}-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        spec = parse_spec(data, source=label(args.spec) if args.spec else None)
    except MissionSpecError as error:
        raise InputError(str(error)) from None
    try:
        return asyncio.run(_demo(args, spec))
    except StackError as error:
        print(f"conductor: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


async def _demo(args: argparse.Namespace, spec) -> int:
    say = lambda text="": print(text, flush=True)  # noqa: E731
    say("starting the embedded stack: Temporal dev server + Web UI, local substrate, worker ...")
    async with DevStack(
        args.data_dir, temporal_port=args.temporal_port, ui_port=args.ui_port, substrate_port=args.substrate_port,
        instances=args.instances,
    ) as stack:
        control = MissionControl(stack.client, stack.task_queue)
        say(f"  Temporal       {stack.temporal_address}")
        say(f"  Web UI         {stack.ui_url}")
        say(f"  substrate      {stack.substrate_url}")
        say(f"  data           {stack.data_dir}")
        say()
        say(f"mission {spec.mission_id}: {spec.goal}")
        await control.start(spec)
        lines = ProgressLines()

        asked: set[str] = set()  # the prompts being answered
        answering: list[asyncio.Future] = []

        def progress(ledger) -> None:
            if lines.changed(ledger):  # a snapshot that only renews a lease says nothing new
                say(render_progress(ledger, datetime.now(timezone.utc)))
            for child in ledger.children:  # a question: answered as an operator would
                if child.question is not None and child.question.prompt_id not in asked:
                    asked.add(child.question.prompt_id)
                    answering.append(asyncio.ensure_future(_answer(control, spec.mission_id, child, say)))

        try:
            ledger = await control.watch(spec.mission_id, progress)
            verdict = ledger.parent_state
            # The verdict can settle before every one-shot child has finished: let them finish
            # (they are not stopped by a verdict), so the ledger shows their outputs.
            ledger = await _one_shots_finished(control, spec.mission_id, progress, shown=ledger.snapshot_seq)
        finally:
            for answer in answering:
                answer.cancel()
        say()
        say(render_ledger(ledger))
        say()
        say(f"See it in the UI: {stack.ui_url}/namespaces/{stack.namespace}/workflows/mission:{spec.mission_id}")
        if args.keep:
            say("staying up (--keep); long-lived children stay supervised. Ctrl-C stops everything.")
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                pass
        say(f"stopping mission {spec.mission_id} (its daemon, agent and collector) and the stack ...")
        await control.stop(spec.mission_id)
        final = await control.handle(spec.mission_id).result()
        say(f"mission closed: {final.parent_state}; {len(final.children)} children stopped, leases released")
        return 0 if verdict == "completed" else 1


async def _answer(control: MissionControl, mission_id: str, child, say) -> None:
    """Answer a child's question as an operator would (`conductor mission approve`)."""
    question = child.question
    say(f"  {child.child_id} asks: {question.prompt!r} (prompt {question.prompt_id})")
    say(f"  answering as an operator would: conductor mission approve {mission_id} {child.child_id} --comment 'looks right'")
    started = time.monotonic()
    try:
        result = await control.answer(mission_id, AnswerRequest(
            child_id=child.child_id, operator="demo-operator", prompt_id=question.prompt_id,
            payload={"approved": True, "comment": "looks right"},
        ))
        say(f"  -> {result.outcome} in {time.monotonic() - started:.2f} s: {result.detail}")
    except MissionRefused as error:
        say(f"  -> refused: {error}")


async def _one_shots_finished(control: MissionControl, mission_id: str, progress, *, shown: int, within: float = 60.0):
    deadline = asyncio.get_running_loop().time() + within
    last_seq = shown
    while True:
        ledger = await control.show(mission_id)
        if ledger.snapshot_seq != last_seq:
            last_seq = ledger.snapshot_seq
            progress(ledger)
        running = [c for c in ledger.children if c.kind == "one-shot-command" and c.outcome == "pending"]
        if not running or asyncio.get_running_loop().time() > deadline:
            return ledger
        await asyncio.sleep(0.5)
