"""`conductor admission ...`: the admission engine's simulator and, with a server, its live views.

The live commands (queue, leases, usage, audit, what-if, policy show/set) talk
to the host group's AdmissionWorkflow through `worker.admission_live`; they
print aligned tables for people and `--json` for scripts, and every failure is
one line on stderr: exit 2 for a bad input file or option (nothing is sent), exit 1
when the server or the workflow cannot be reached. Files come in through
`worker.inputs` (size, UTF-8 and JSON limits); `--host-group` holds to the rule a
mission spec's host_group does, `--operator` to the one the PolicyChange carries.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import math
import os
import secrets
import socket
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from temporalio.service import RPCError

from worker import admission_views as views
from worker.admission_live import LiveAdmission, LiveError, open_client
from worker.config import WorkerConfig
from worker.admission_run import run_command
from worker.host_groups import host_groups_table, list_host_groups, require_host_group
from worker.inputs import InputError, check_argument, read_json, read_lines
from worker.connection import ReconnectSettingError, refusal
from worker.simulator import TraceError, check_moment, describe_validation_error, load_policy, simulate
from worker.cli.arguments import whole_number
from workflows.admission.messages import LeaseRow, PolicyChange, QueueRow, UsageRow, WhatIf
from workflows.admission.holders import HeldRequest
from workflows.admission.model import AdmissionPolicy, AdmissionRequest, AuditEvent, Identifier, OperatorName
from workflows.inbound import describe
from workflows.limits import MAX_REVIEW_REASON_CHARS
from workflows.mission.spec import HostGroup

# What a what-if request may leave out: it is never submitted, so these only need plausible values.
WHAT_IF_DEFAULTS = {"orchestrator_id": "conductor-what-if", "queue_timeout_seconds": 3600}
MAX_POLICY_WAIT_SECONDS = 3600
POLICY_SEND_SECONDS = 2.0  # at least this long for the change to reach a worker, even with --wait 0


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

    queue = _live_parser(commands, "queue", "requests waiting for admission, in admission order",
                         "Position, request, requester, priority, effective (aged) priority, how long it had "
                         "waited at the workflow's last decision, and the limit it waits on.")
    queue.add_argument("--limit", type=whole_number(1), default=100, metavar="N", help="show at most N requests (default 100)")
    queue.set_defaults(func=_live(run_queue))

    leases = _live_parser(commands, "leases", "admitted requests and their leases",
                          "Request, holder (the requester workflow, or holder:<name> for a client that is not a "
                          "workflow: docs/admission-api.md), placement, lease revision and time until the lease "
                          "expires unless renewed.")
    leases.set_defaults(func=_live(run_leases))

    usage = _live_parser(commands, "usage", "every limit: used / maximum",
                         "Global, environment, provider, lane and runtime limits with current use.")
    usage.set_defaults(func=_live(run_usage))

    audit = _live_parser(commands, "audit", "recent admission events, oldest first",
                         "The most recent audit events the workflow keeps in memory; with --stored, the whole "
                         "trail from the audit store the workers write (CONDUCTOR_DATABASE_URL, else the SQLite "
                         "file in CONDUCTOR_DATA_DIR), which needs no Temporal server.")
    audit.add_argument("--limit", type=whole_number(1), default=20, metavar="N", help="show the last N events (default 20)")
    audit.add_argument("--stored", action="store_true", help="read the audit store instead of the live workflow")
    audit.add_argument("--request-id", metavar="R", help="with --stored: only the events of request R")
    audit.set_defaults(func=run_audit_command)

    what_if = _live_parser(commands, "what-if", "what a request would get now, without submitting it",
                           "REQUEST.json is an admission request: request_id, environment, provider, runtime_kind, "
                           "priority, and optionally lane, preemptible, priority_class; orchestrator_id, "
                           "submitted_at (now) and queue_timeout_seconds may be left out.")
    what_if.add_argument("request", type=Path, metavar="REQUEST.json", help="request JSON file")
    what_if.set_defaults(func=run_what_if)

    run = commands.add_parser(
        "run",
        help="run COMMAND only under an admitted lease of the host group (for agent loops and scripts)",
        description="Like flock(1) or srun: ask the host group's admission for a lease (saying on stderr where the "
        "request waits), run COMMAND once admitted, renew while it runs, give the lease back when it ends, and exit "
        "with its status. SIGINT, SIGTERM and SIGHUP are passed on to it. A lease lost while it runs (preempted, "
        "displaced, expired, revoked) stops it (SIGTERM, then SIGKILL after --grace) and exits 75; a request never "
        "admitted (denied, timed out in the queue) exits 69 and COMMAND never runs. Needs no worker of its own: the "
        "host group's workers answer. docs/admission-api.md.",
    )
    run.add_argument("--host-group", required=True, metavar="G", help="host group name")
    run.add_argument("--request-id", metavar="ID", help="the request's id (default: run-<host>-<pid>-<random>); "
                     "a repeat with the same id and placement is the same request")
    run.add_argument("--orchestrator", default="conductor-run", metavar="ID", help="orchestrator id (default conductor-run)")
    run.add_argument("--environment", default="default", help="environment (default default)")
    run.add_argument("--provider", default="local", help="provider (default local)")
    run.add_argument("--runtime-kind", default="host", choices=["host", "container", "vm", "microvm", "custom"],
                     help="runtime tier (default host)")
    run.add_argument("--priority", type=int, default=0, help="priority, higher first (default 0)")
    run.add_argument("--priority-class", default="P2", choices=["P0", "P1", "P2", "P3"], help="priority class (default P2)")
    run.add_argument("--lane", help="lane (default none)")
    run.add_argument("--preemptible", action="store_true", help="may be preempted by more urgent work (then exits 75)")
    run.add_argument("--queue-timeout", type=float, default=3600.0, metavar="SECONDS",
                     help="give up if not admitted within this long (default 3600; exit 69)")
    run.add_argument("--resource", action="append", default=[], metavar="NAME=AMOUNT",
                     help="an amount of one of the host group's resources it takes while it runs (repeatable: "
                     "--resource gpu=1 --resource memory_gib=8)")
    run.add_argument("--expected-duration", type=float, metavar="SECONDS",
                     help="how long it is expected to run: lets it start ahead of a reservation it ends before "
                     "(backfill) and gives the queue its predicted starts")
    run.add_argument("--grace", type=float, default=10.0, metavar="SECONDS",
                     help="after SIGTERM on a lost lease, SIGKILL this much later (default 10)")
    run.add_argument("--holder", metavar="NAME", help="who holds the lease, as queues and leases show it (default user@host)")
    run.add_argument("wrapped", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS]", help="what to run")
    run.set_defaults(func=run_wrapped)

    groups = commands.add_parser(
        "host-groups", help="every host group (a running admission workflow) with its usage",
        description="Every host group whose admission workflow runs, from Temporal visibility, with what its "
        "workflow answers (read-only queries): requests queued, leases held, and used/maximum of every limit. A "
        "host group whose workflow does not answer (no worker) is listed with a note instead of numbers.",
    )
    groups.add_argument("--json", action="store_true", help="print a JSON array for scripts instead of a table")
    groups.set_defaults(func=run_host_groups)

    policy = commands.add_parser("policy", help="show or change a host group's live admission policy")
    policy_commands = policy.add_subparsers(dest="policy_command", required=True, metavar="COMMAND")
    show = _live_parser(policy_commands, "show", "the policy the admission workflow applies now", "")
    show.set_defaults(func=_live(run_policy_show))
    change = policy_commands.add_parser(
        "set",
        help="replace the live policy (starting the admission workflow with it if none runs)",
        description="Validate POLICY.json, then send it to the host group's admission workflow, which applies "
        "it at its next decision (queued requests that now fit are admitted; requests that can never run are "
        "denied). If no admission workflow runs there yet, one is started with this policy. Nothing is sent "
        "if the file is invalid (exit 2).",
    )
    change.add_argument("policy", type=Path, metavar="POLICY.json", help="policy JSON file")
    change.set_defaults(func=run_policy_set)

    hold = commands.add_parser(
        "hold", help="stop admitting on a host group (maintenance): queued requests wait, leases run on",
        description="Kueue's stopPolicy Hold: the host group's live policy gets `hold` (with --reason), so nothing "
        "new is admitted; queued requests stay queued (their queue deadlines still run) and admitted leases run on. "
        "--drain also preempts every preemptible lease (HoldAndDrain). Audited; shown by host-groups, usage, queue "
        "and the Temporal UI. `conductor admission resume` ends it.",
    )
    hold.add_argument("--reason", required=True, metavar="TEXT", help="why: the audit trail and every view show it")
    hold.add_argument("--drain", action="store_true", help="also preempt every preemptible lease")
    resume = commands.add_parser("resume", help="end a hold: admission goes on where it stopped",
                                 description="Clear the host group's `hold`; queued requests are admitted as they fit.")
    for parser in (change, hold, resume):  # each sends a PolicyChange
        parser.add_argument("--host-group", required=True, metavar="G", help="host group name")
        parser.add_argument("--operator", help="who does it, recorded in the audit trail (default: $USER)")
        parser.add_argument("--wait", type=float, default=10.0, metavar="SECONDS",
                            help="wait this long for a worker to apply it (default 10; at least 2)")
    hold.set_defaults(func=run_hold)
    resume.set_defaults(func=run_resume)


def _live_parser(commands: argparse._SubParsersAction, name: str, help: str, description: str) -> argparse.ArgumentParser:
    parser = commands.add_parser(name, help=help, description=f"{help[0].upper()}{help[1:]}. {description}".strip())
    parser.add_argument("--host-group", required=True, metavar="G", help="host group name")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts instead of a table")
    return parser


# --- running: every live command is one asyncio.run, every failure one line ------------------------


LiveCommand = Callable[[argparse.Namespace, LiveAdmission], Awaitable[int]]


def _live(command: LiveCommand) -> Callable[[argparse.Namespace], int]:
    def func(args: argparse.Namespace) -> int:
        return _run_live(args.host_group, lambda live: command(args, live))
    return func


def _host_group(value: str) -> str:
    """Only a host group a mission can name: anything else would start an admission workflow no one uses."""
    return check_argument(HostGroup, value, "--host-group")


def _run_live(host_group: str, body: Callable[[LiveAdmission], Awaitable[int]]) -> int:
    _host_group(host_group)

    async def main() -> int:
        return await body(LiveAdmission(await open_client(), host_group))

    return _run_main(main)


def _run_main(main: Callable[[], Awaitable[int]]) -> int:
    """`asyncio.run(main())`; every failure one line on stderr: exit 2 before anything is sent, else 1."""
    try:
        return asyncio.run(main())
    except ReconnectSettingError as error:  # a bad CONDUCTOR_RECONNECT_SECONDS: nothing was sent
        print(f"conductor: {error}", file=sys.stderr)
        return 2
    except (LiveError, ConnectionError) as error:  # includes giving up on a server that went away (Unreachable)
        print(f"conductor: {error}", file=sys.stderr)
        return 1


def _emit(args: argparse.Namespace, data: Any, table: str) -> None:
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(table)


def _emit_limited(args: argparse.Namespace, shown: list, table_of, *, more: bool, which: str) -> int:
    """At most `--limit` rows (the first or the last ones); the table says when there were more."""
    table = table_of(args.host_group, shown)
    if more:
        table += f"\n({which} {args.limit} shown; --limit N for more)"
    _emit(args, views.as_json(shown), table)
    return 0


async def run_queue(args: argparse.Namespace, live: LiveAdmission) -> int:
    rows = await live.query("queue", args.limit + 1, result_type=list[QueueRow])
    return _emit_limited(args, rows[: args.limit], views.queue_table, more=len(rows) > args.limit, which="first")


async def run_leases(args: argparse.Namespace, live: LiveAdmission) -> int:
    rows = await live.query("leases", result_type=list[LeaseRow])
    _emit(args, views.as_json(rows), views.leases_table(args.host_group, rows, datetime.now(timezone.utc)))
    return 0


async def run_usage(args: argparse.Namespace, live: LiveAdmission) -> int:
    rows = await live.query("usage", result_type=list[UsageRow])
    held = views.held_line(args.host_group, await live.query("policy", result_type=AdmissionPolicy))
    _emit(args, views.as_json(rows), views.usage_table(rows) if held is None else f"{held}\n{views.usage_table(rows)}")
    return 0


def run_audit_command(args: argparse.Namespace) -> int:
    if not args.stored:
        if args.request_id is not None:
            raise InputError("--request-id needs --stored (the live workflow's recent events are not filtered)")
        return _live(run_audit)(args)
    from worker.cli.ledger import run_with_stores

    host_group = _host_group(args.host_group)

    async def stored(stores) -> int:
        events = await stores.audit.events(host_group, args.request_id)
        shown = events[-args.limit:]
        table = views.audit_table(host_group, shown)
        if len(events) > args.limit:
            table += f"\n(last {args.limit} of {len(events)} stored events shown; --limit N for more)"
        _emit(args, views.as_json(shown), table)
        return 0

    return run_with_stores(stored)


async def run_audit(args: argparse.Namespace, live: LiveAdmission) -> int:
    events = await live.query("audit", args.limit + 1, result_type=list[AuditEvent])
    return _emit_limited(args, events[-args.limit:], views.audit_table, more=len(events) > args.limit, which="last")


async def run_policy_show(args: argparse.Namespace, live: LiveAdmission) -> int:
    policy = await live.query("policy", result_type=AdmissionPolicy)
    _emit(args, views.as_json(policy), views.policy_table(policy))
    return 0


def run_host_groups(args: argparse.Namespace) -> int:
    async def main() -> int:
        client = await open_client()
        try:
            rows = await list_host_groups(client)
        except RPCError as error:
            raise LiveError(f"Temporal refused to list the admission workflows: {error.message}") from None
        now = datetime.now(timezone.utc)
        _emit(args, [row.as_json(now) for row in rows], host_groups_table(rows, now))
        return 0

    return _run_main(main)


def run_what_if(args: argparse.Namespace) -> int:
    _host_group(args.host_group)
    data = read_json(args.request, "request")
    if not isinstance(data, dict):
        raise InputError(f"invalid request {args.request}: (document): must be a JSON object")
    try:
        request = AdmissionRequest.model_validate(
            {**WHAT_IF_DEFAULTS, "submitted_at": datetime.now(timezone.utc), **data}
        )
        check_moment(request.submitted_at, "submitted_at")
    except ValidationError as error:
        raise InputError(f"invalid request {args.request}: {describe_validation_error(error)}") from None
    except TraceError as error:
        raise InputError(f"invalid request {args.request}: {error}") from None

    async def body(live: LiveAdmission) -> int:
        result = await live.query("what_if", request, result_type=WhatIf)
        _emit(args, views.as_json(result), views.what_if_text(result))
        return 0

    return _run_live(args.host_group, body)


def _operator(args: argparse.Namespace, what: str) -> str:
    operator = (args.operator if args.operator is not None else _current_user()).strip()
    if not operator:
        raise InputError(f"--operator is empty: say who is {what}")
    check_argument(OperatorName, operator, "--operator" if args.operator is not None else "--operator (default: $USER)")
    if not (math.isfinite(args.wait) and 0 <= args.wait <= MAX_POLICY_WAIT_SECONDS):
        raise InputError(f"--wait {args.wait:g}: give the seconds to wait, 0 to {MAX_POLICY_WAIT_SECONDS}")
    return operator


def _task_queue() -> str:
    try:
        return WorkerConfig.from_env().task_queue
    except InputError:
        raise
    except Exception as error:  # anything else in the environment: one line, not a traceback
        raise InputError(f"cannot read the worker configuration from the environment: {error}") from None


async def _send_policy(live: LiveAdmission, args: argparse.Namespace, change: PolicyChange, what: str) -> int:
    """Send a policy change and say whether a worker applied it within --wait."""
    task_queue = _task_queue()
    within = max(args.wait, POLICY_SEND_SECONDS)
    started, applied = await live.change_policy(task_queue, change, within=within)
    if started:
        what = f"started the admission workflow for host group {args.host_group} with this policy"
    if applied:
        print(f"{what} and applied (by {change.operator})")
    else:
        print(f"{what} (by {change.operator}); not applied within {within:g}s: the server holds it "
              f"until a conductor worker on task queue {task_queue} runs the admission workflow")
    return 0


def run_policy_set(args: argparse.Namespace) -> int:
    _host_group(args.host_group)
    operator = _operator(args, "changing the policy")
    data = read_json(args.policy, "policy")
    try:
        policy = load_policy(data)
    except TraceError as error:
        raise InputError(f"invalid policy {args.policy}: {error}") from None
    _task_queue()
    change = PolicyChange(operator=operator, policy=policy)
    return _run_live(args.host_group, lambda live: _send_policy(
        live, args, change, f"policy change for host group {args.host_group} sent"))


def run_hold(args: argparse.Namespace) -> int:
    """`conductor admission hold`: the live policy with `hold` on (and the reason), sent as a change."""
    _host_group(args.host_group)
    operator = _operator(args, "holding the host group")
    reason = args.reason.strip()
    if not reason or len(reason) > MAX_REVIEW_REASON_CHARS or not reason.isprintable():
        raise InputError(f"--reason: say in one printable line of at most {MAX_REVIEW_REASON_CHARS} characters why "
                         "the host group is held (the audit trail and every view show it)")
    return _change_hold(args, operator, hold=True, reason=reason, drain=args.drain)


def run_resume(args: argparse.Namespace) -> int:
    _host_group(args.host_group)
    return _change_hold(args, _operator(args, "resuming the host group"), hold=False, reason=None, drain=False)


def _change_hold(args: argparse.Namespace, operator: str, *, hold: bool, reason: str | None, drain: bool) -> int:
    _task_queue()

    async def body(live: LiveAdmission) -> int:
        if not await live.is_running():
            raise LiveError(f"no admission workflow runs for host group {args.host_group}: nothing to "
                            f"{'hold' if hold else 'resume'} (conductor admission host-groups lists them)")
        current = await live.query("policy", result_type=AdmissionPolicy)
        if current.hold == hold and not drain:
            print(f"host group {args.host_group} is already {'held' if hold else 'not held'}: nothing sent")
            return 0
        policy = current.model_copy(update={"hold": hold, "hold_reason": reason})
        what = (f"host group {args.host_group} held{' and drained' if drain else ''}" if hold
                else f"host group {args.host_group} resumed")
        return await _send_policy(live, args, PolicyChange(operator=operator, policy=policy, drain=drain), what)

    return _run_live(args.host_group, body)


def _current_user() -> str:
    user = os.environ.get("USER")
    if user:
        return user
    try:
        return getpass.getuser()
    except Exception:  # no USER and no passwd entry (some containers)
        return "unknown"


def run_simulate(args: argparse.Namespace) -> int:
    try:
        policy = load_policy(read_json(args.policy, "policy"))
    except TraceError as error:
        raise InputError(f"invalid policy {args.policy}: {error}") from None
    try:
        # Bytes: each line is decoded (and size-checked) on its own, so one bad line is one error line.
        stream = sys.stdin if args.trace == "-" else open(args.trace, "rb")
    except OSError as error:
        raise InputError(f"cannot read trace {args.trace}: {error.strerror or error}") from None
    with stream:
        for output in simulate(policy, read_lines(stream), audit=args.audit):
            sys.stdout.write(json.dumps(output, separators=(",", ":")) + "\n")
    return 0


def _resources(pairs: list[str]) -> dict[str, str]:
    """--resource NAME=AMOUNT, repeated, as the request's `resources` (the model checks the values)."""
    resources: dict[str, str] = {}
    for pair in pairs:
        name, equals, amount = pair.partition("=")
        if not equals or not name or not amount:
            raise InputError(f"--resource {pair!r}: write NAME=AMOUNT, e.g. --resource gpu=1")
        if name in resources:
            raise InputError(f"--resource {name} is given twice: give each resource once")
        resources[name] = amount
    return resources


def run_wrapped(args: argparse.Namespace) -> int:
    """`conductor admission run`: see worker/admission_run.py."""
    command = args.wrapped[1:] if args.wrapped[:1] == ["--"] else args.wrapped
    if not command:
        raise InputError("conductor admission run needs a command after --: conductor admission run --host-group G -- COMMAND [ARGS]")
    host_group = _host_group(args.host_group)
    host = socket.gethostname()
    holder = args.holder or f"{getpass.getuser()}@{host}"
    try:
        request = HeldRequest(
            request_id=args.request_id or f"run-{host}-{os.getpid()}-{secrets.token_hex(3)}",
            orchestrator_id=args.orchestrator, environment=args.environment, provider=args.provider,
            runtime_kind=args.runtime_kind, priority=args.priority, priority_class=args.priority_class, lane=args.lane,
            preemptible=args.preemptible, queue_timeout_seconds=args.queue_timeout,
            resources=_resources(args.resource), expected_duration_seconds=args.expected_duration,
        )
        check_argument(Identifier, holder, "--holder")
    except ValidationError as error:
        raise InputError(f"conductor admission run: {describe(error)}") from None
    if not args.grace >= 0:
        raise InputError("--grace must be zero or more seconds")

    async def wrapped() -> int:
        client = await open_client()
        await require_host_group(client, host_group)
        return await run_command(client, host_group, request, command, holder=holder, grace_seconds=args.grace)

    try:
        return asyncio.run(wrapped())
    except LiveError as error:
        print(f"conductor admission run: {error}", file=sys.stderr)
        return 1
    except RPCError as error:
        print(f"conductor admission run: {refusal(error)}", file=sys.stderr)
        return 1
