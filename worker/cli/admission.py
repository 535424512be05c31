"""`conductor admission ...`: the admission engine's simulator (and, with a server, its live views)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from worker.simulator import TraceError, load_policy, simulate


def register(subparsers: argparse._SubParsersAction) -> None:
    admission = subparsers.add_parser("admission", help="shared-host admission: simulate, inspect, set policy")
    commands = admission.add_subparsers(dest="admission_command", required=True, metavar="COMMAND")

    sim = commands.add_parser(
        "simulate",
        help="run the admission engine over a JSON-lines trace, one output line per input line",
        description="Replay a trace of admission operations against a policy, e.g. to try a new quota "
        "policy on a day of real requests. Trace lines: "
        '{"at": RFC3339, "op": "submit", "request": {...}} | {"at", "op": "renew"|"release"|"cancel", '
        '"request_id"} | {"at", "op": "reconcile"|"snapshot"} | {"at", "op": "set_policy", "policy": {...}}.',
    )
    sim.add_argument("--policy", required=True, type=Path, help="policy JSON file")
    sim.add_argument("trace", help="trace file (JSON lines), or - for standard input")
    sim.add_argument("--audit", action="store_true", help="also print every audit event as {\"event\": ...}")
    sim.set_defaults(func=run_simulate)


def run_simulate(args: argparse.Namespace) -> int:
    try:
        policy = load_policy(json.loads(args.policy.read_text()))
    except OSError as error:
        print(f"conductor: cannot read policy {args.policy}: {error.strerror}", file=sys.stderr)
        return 2
    except json.JSONDecodeError as error:
        print(f"conductor: policy {args.policy} is not JSON: {error.msg} at line {error.lineno}", file=sys.stderr)
        return 2
    except TraceError as error:
        print(f"conductor: invalid policy {args.policy}: {error}", file=sys.stderr)
        return 2
    try:
        stream = sys.stdin if args.trace == "-" else open(args.trace, encoding="utf-8")
    except OSError as error:
        print(f"conductor: cannot read trace {args.trace}: {error.strerror}", file=sys.stderr)
        return 2
    with stream:
        for output in simulate(policy, stream, audit=args.audit):
            sys.stdout.write(json.dumps(output, separators=(",", ":")) + "\n")
    return 0
