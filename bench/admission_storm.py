"""Holder storm: many holders on one host group of a few slots, at Temporal's default limits.

    .venv/bin/python -m bench.admission_storm [--holders 40] [--slots 4] [--seconds 90] [--hold-ms 50:400]
                                              [--kill-every 15] [--runs 1] [--seed S] [--scratch DIR] [--keep]

A stack of separate processes on loopback (bench/chaos.py's Stack): the Temporal dev server with
Temporal's own dynamic config (10 updates in flight per workflow, as on Temporal Cloud), the
substrate, and one `conductor worker`. One host group of `--slots` slots. `--holders` holders in
this process, each a loop of `worker.lease.acquire` (its AdmissionHolder workflow), a hold of
`--hold-ms`, and the give-back, for `--seconds`. With `--kill-every K` the worker is SIGKILLed every
K seconds and started again at once, as a supervisor would.

Each run prints what the holders saw and what the server kept:

- admissions per second, and how busy the slots were: the time holders held leases (from hearing
  the admission to sending the give-back) over slots x time, leaving out the seconds the worker was
  down (from its kill to its restart's first poll);
- call latency, p50 and p99, outside the worker's restarts: from starting a request to hearing its
  first decision, and from sending a give-back to hearing it confirmed;
- the invariants (any breach is a VIOLATION, and the exit code is 1): leases held at once by what
  the clients saw never exceed the slots; each request's revisions only grow; nothing is admitted
  after its holder gave it back; every request ends (its holder workflow closes); no lease is left
  held; no workflow task failed in the singleton's chain of runs or in any holder workflow (a task
  that timed out because its worker was killed is counted, and is no failure).

bench/chaos.py's `holder-chaos` scenario runs the same storm beside a mission, with the worker
killed, the Temporal server restarted and the holders behind a faulty TCP proxy (its quick form
is in the test suite). This file is a benchmark: it prints figures; nothing in the suite times it.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from activities.admission import set_policy_with_start
from worker.connection import retryable
from worker.lease import HostGroupWatch, NotAdmitted, acquire
from workflows.admission.holder_workflow import LIVE_STATES
from workflows.admission.holders import HeldRequest, holder_workflow_id
from workflows.admission.messages import AdmissionDecision, LeaseRow, PolicyChange, admission_workflow_id
from workflows.admission.model import AdmissionPolicy


BUSY = "slots busy (worker's downtime left out)"
SINGLETON_TASKS = "the singleton's workflow tasks"


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))] if ordered else float("nan")


def overlap(start: float, end: float, spans: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(end, b) - max(start, a)) for a, b in spans)


@dataclass
class Seen:
    """One request as its holder saw it (times on this process's monotonic clock)."""

    request_id: str
    holder: str
    began: float
    heard: list[tuple[float, AdmissionDecision]] = field(default_factory=list)
    admitted: float | None = None
    gave_back: float | None = None  # the release (or cancel) sent
    gave_back_revision: int = 0
    confirmed: float | None = None  # the give-back heard confirmed
    error: str | None = None

    def hear(self, decision: AdmissionDecision) -> None:
        self.heard.append((time.monotonic(), decision))

    @property
    def first_answer(self) -> float | None:
        return self.heard[0][0] if self.heard else None


class Storm:
    """The holders' loops and what they saw; the checks that need only that, and the server's side."""

    def __init__(self, client: Client, host_group: str, *, holders: int, slots: int, hold: tuple[float, float],
                 seconds: float, rng: random.Random, tag: str, watch: HostGroupWatch | None = None) -> None:
        self.client, self.host_group, self.slots, self.watch = client, host_group, slots, watch
        self.holders, self.hold, self.seconds, self.rng, self.tag = holders, hold, seconds, rng, tag
        self.seen: list[Seen] = []
        self.began = self.ended = 0.0

    async def run(self) -> None:
        self.began = time.monotonic()
        await asyncio.gather(*(self._holder(i) for i in range(self.holders)))
        self.ended = time.monotonic()

    async def _holder(self, index: int) -> None:
        deadline = self.began + self.seconds
        holder = f"storm-{index}"
        for k in range(1_000_000):
            if time.monotonic() >= deadline:
                return
            seen = Seen(f"{self.tag}-{index}-{k}", holder, time.monotonic())
            self.seen.append(seen)
            request = HeldRequest(request_id=seen.request_id, orchestrator_id="storm", runtime_kind="host",
                                  queue_timeout_seconds=600)
            lease = None
            while lease is None:  # the same request again after a lost connection: it joins itself
                try:
                    lease = await acquire(self.client, self.host_group, request, holder=holder, on_decision=seen.hear,
                                          watch=self.watch)
                except NotAdmitted as refused:
                    seen.error = str(refused)
                    break
                except RPCError as error:
                    if retryable(error) is None:
                        seen.error = f"{type(error).__name__}: {error}"
                        break
                    await asyncio.sleep(1)
            if lease is None:
                await asyncio.sleep(1)
                continue
            seen.admitted = time.monotonic()
            await asyncio.sleep(self.rng.uniform(*self.hold))
            seen.gave_back, seen.gave_back_revision = time.monotonic(), lease.decision.revision
            await lease.give_back()
            if lease.decision.state not in LIVE_STATES:
                seen.confirmed = time.monotonic()

    # --- what the clients saw -------------------------------------------------------------------

    def peak(self) -> int:
        """The most leases held at once by what the holders saw (from hearing an admission to
        sending the give-back: within what the singleton counted)."""
        changes = sorted([(s.admitted, 1) for s in self.seen if s.admitted is not None]
                         + [(s.gave_back, -1) for s in self.seen if s.gave_back is not None])
        held = most = 0
        for _, step in changes:
            held += step
            most = max(most, held)
        return most

    def violations(self) -> list[str]:
        found = []
        if (peak := self.peak()) > self.slots:
            found.append(f"{peak} leases held at once by what the holders saw, over the {self.slots} slots")
        for seen in self.seen:
            revisions = [d.revision for _, d in seen.heard]
            leases = [d.lease_revision for _, d in seen.heard]
            if revisions != sorted(revisions) or leases != sorted(leases):
                found.append(f"{seen.request_id}: revisions heard out of order {revisions} (lease revisions {leases})")
            if seen.gave_back is not None:
                late = [d for t, d in seen.heard if t > seen.gave_back and d.state == "admitted"
                        and d.revision > seen.gave_back_revision]
                if late:
                    found.append(f"{seen.request_id}: admitted again (revision {late[0].revision}) after its holder gave it back")
        return found

    def _busy(self, left_out: list[tuple[float, float]]) -> float:
        """Leases held over slots x time, leaving out the spans `left_out`."""
        held = sum((s.gave_back or self.ended) - s.admitted - overlap(s.admitted, s.gave_back or self.ended, left_out)  # type: ignore[operator]
                   for s in self.seen if s.admitted is not None)
        return held / (self.slots * max(1e-9, self.ended - self.began - overlap(self.began, self.ended, left_out)))

    def figures(self, down: list[tuple[float, float]]) -> dict[str, str]:
        """`down`: the spans the worker was down (from its kill to its restart's first poll)."""
        window = self.ended - self.began
        admitted = [s for s in self.seen if s.admitted is not None]
        # Each kill's whole outage: from the kill to the first admission after it (the restart, then
        # the dead worker's tasks timing out: worker.worker.STICKY_SCHEDULE_TO_START for one it had
        # not started, activities.admission.SINGLETON_TASK_TIMEOUT for one it had).
        admitted_at = sorted(s.admitted for s in admitted)  # type: ignore[type-var]
        outages = [(killed, next((t for t in admitted_at if t > killed), self.ended)) for killed, _ in down]
        clear = lambda a, b: overlap(a, b, down) == 0  # noqa: E731  (a call that no restart touched)
        answers = [s.first_answer - s.began for s in self.seen if s.first_answer is not None and clear(s.began, s.first_answer)]
        backs = [s.confirmed - s.gave_back for s in self.seen if s.confirmed is not None and clear(s.gave_back, s.confirmed)]  # type: ignore[operator]
        # How long a freed slot stayed idle: from a give-back to the next admission heard of a request
        # that was queued by then (a slot handed over), outside restarts.
        backs_at = sorted(s.gave_back for s in self.seen if s.gave_back is not None)
        gaps = []
        for s in admitted:
            if s.heard and s.heard[0][1].state == "queued":
                before = [t for t in backs_at if t < s.admitted]  # type: ignore[operator]
                if before and clear(before[-1], s.admitted):
                    gaps.append(s.admitted - before[-1])  # type: ignore[operator]
        ms = lambda xs: f"p50 {percentile(xs, 0.5) * 1000:6.0f} ms, p99 {percentile(xs, 0.99) * 1000:6.0f} ms, max {max(xs, default=float('nan')) * 1000:6.0f} ms"  # noqa: E731
        figures = {
            "requests / admitted / refused": f"{len(self.seen)} / {len(admitted)} / {sum(1 for s in self.seen if s.error)}",
            "admissions per second": f"{len(admitted) / window:.1f} over {window:.0f} s "
                                     f"({overlap(self.began, self.ended, down):.1f} s of it with the worker down)",
            BUSY: f"{self._busy(down):.0%}",
            "most leases held at once (holders' view)": f"{self.peak()} of {self.slots}",
            "start -> first decision (outside restarts)": ms(answers) + f"  ({len(answers)} calls)",
            "give-back -> confirmed (outside restarts)": ms(backs) + f"  ({len(backs)} calls)",
            "a freed slot idle until its next holder hears": ms(gaps) + f"  ({len(gaps)} hand-overs)",
            "requests never answered": str(sum(1 for s in self.seen if s.first_answer is None and s.error is None)),
        }
        if outages:
            figures["slots busy (each kill's outage left out)"] = f"{self._busy(outages):.0%}"
            figures["from a worker kill to the next admission"] = ", ".join(f"{b - a:.1f} s" for a, b in outages)
        return figures

    # --- what the server kept -------------------------------------------------------------------

    async def server_violations(self, within: float) -> tuple[list[str], dict[str, str]]:
        """Every request ended, no lease left held, no workflow task failed: read from the server."""
        found: list[str] = []
        deadline = time.monotonic() + within
        open_ = [s for s in self.seen]
        while open_ and time.monotonic() < deadline:
            still = []
            for seen in open_:
                handle = self.client.get_workflow_handle(holder_workflow_id(self.host_group, seen.holder, seen.request_id))
                try:
                    description = await handle.describe()
                except RPCError:
                    still.append(seen)
                    continue
                if description.status == WorkflowExecutionStatus.RUNNING:
                    still.append(seen)
                elif description.status != WorkflowExecutionStatus.COMPLETED:
                    found.append(f"holder workflow of {seen.request_id} closed {description.status.name}")  # type: ignore[union-attr]
            open_ = still
            if open_:
                await asyncio.sleep(1)
        for seen in open_:
            found.append(f"request {seen.request_id} never ended: its holder workflow still runs {within:.0f} s after the storm")
        singleton = self.client.get_workflow_handle(admission_workflow_id(self.host_group))
        leases = await singleton.query("leases", result_type=list[LeaseRow])
        mine = [row for row in leases if row.request_id.startswith(self.tag)]
        found += [f"lease left held: {row.request_id}" for row in mine]
        singleton_tasks = await task_trouble(self.client, f"WorkflowId = '{admission_workflow_id(self.host_group)}'")
        found += [f"the singleton's workflow task failed: {line}" for line in singleton_tasks.failed]
        holder_tasks = await task_trouble(
            self.client, f"WorkflowType = 'AdmissionHolder' AND WorkflowId STARTS_WITH 'holder:{self.host_group}/'")
        found += [f"a holder workflow's task failed: {line}" for line in holder_tasks.failed]
        return found, {
            "singleton runs (continue-as-new chain)": str(singleton_tasks.runs),
            SINGLETON_TASKS: singleton_tasks.line(),
            f"tasks of the {holder_tasks.runs} holder workflows": holder_tasks.line(),
            "leases left held": str(len(mine)),
        }


@dataclass
class TaskTrouble:
    """What went wrong with the workflow tasks of the workflows a visibility query lists."""

    runs: int = 0
    failed: list[str] = field(default_factory=list)  # the workflow's code failed its task (a wedge if it repeats)
    raced: int = 0  # the server refused a completion that ignored events arriving meanwhile: retried at once
    timed_out: int = 0  # the worker holding the task died

    def line(self) -> str:
        return (f"{len(self.failed)} failed, {self.raced} refused by the server as racing new signals "
                f"(UnhandledCommand, retried at once), {self.timed_out} timed out")


def most_held(events) -> int:  # noqa: ANN001  (AuditEvent, from the audit store)
    """The most leases held at once by the singleton's own record: its audit trail, in order."""
    held = peak = 0
    for event in events:
        held += (event.to_state == "admitted") - (event.from_state == "admitted")
        peak = max(peak, held)
    return peak


async def task_trouble(client: Client, query: str) -> TaskTrouble:
    trouble = TaskTrouble()
    async for execution in client.list_workflows(query):
        trouble.runs += 1
        handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
        async for event in handle.fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                attributes = event.workflow_task_failed_event_attributes
                if attributes.cause == WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND:
                    trouble.raced += 1
                    continue
                message = attributes.failure.message
                trouble.failed.append(f"{execution.id} run {execution.run_id[:8]} event {event.event_id}: "
                                      f"{message.splitlines()[0][:300] if message else WorkflowTaskFailedCause.Name(attributes.cause)}")
            elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
                trouble.timed_out += 1
    return trouble


def audited_quota(stack, host_group: str, slots: int, figures: dict[str, str]) -> list[str]:  # noqa: ANN001
    """The quota checked against the audit store the worker wrote (every event, across runs)."""
    from activities.audit_store import AuditStore
    from worker.config import WorkerConfig

    events = AuditStore(WorkerConfig(data_dir=stack.root / "worker-data").audit_db).events(host_group)
    peak = most_held(events)
    figures["most leases held at once (audit store)"] = f"{peak} of {slots} ({len(events)} audit events)"
    return [f"the audit trail shows {peak} leases held at once, over the {slots} slots"] if peak > slots else []


async def save_killed_runs(client: Client, host_group: str, folder: Path, *, most: int = 2) -> None:
    """The singleton's runs in which a worker died holding a task (a task timed out), the last
    `most` of them, as tests/histories keeps histories (stack traces emptied)."""
    import json

    from tests.record_histories import without_stack_traces

    killed = []
    async for execution in client.list_workflows(f"WorkflowId = '{admission_workflow_id(host_group)}'"):
        history = await client.get_workflow_handle(execution.id, run_id=execution.run_id).fetch_history()
        if any(event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT for event in history.events):
            killed.append((execution.start_time, history))
    for index, (_, history) in enumerate(sorted(killed, key=lambda pair: pair[0])[-most:], start=1):
        path = folder / f"admission-storm-killed-run{index}.json"
        path.write_text(json.dumps(without_stack_traces(json.loads(history.to_json())), indent=1) + "\n")
        print(f"saved {path} ({len(history.events)} events)")


async def kill_on_schedule(stack, every: float, until: float, down: list[tuple[float, float]], log) -> int:  # noqa: ANN001
    """SIGKILL the worker every `every` seconds until `until`, starting it again at once; the spans it
    was down go into `down`."""
    kills = 0
    while time.monotonic() + every < until:
        await asyncio.sleep(every)
        worker = stack.workers[0]
        killed = time.monotonic()
        worker.kill()
        kills += 1
        await stack.start_worker(worker)
        down.append((killed, time.monotonic()))
        log(f"worker SIGKILLed and back in {time.monotonic() - killed:.1f} s")
    return kills


async def one_run(args: argparse.Namespace, scratch: Path, seed: int) -> tuple[dict[str, str], list[str]]:
    from bench.chaos import Managed, Stack, log  # the stack of processes chaos.py runs

    policy = AdmissionPolicy(max_concurrent=args.slots, runtime_quotas={"host": args.slots}, lease_ttl_seconds=30)
    stack = Stack(scratch, policy, workers=1, durable=args.durable)
    host_group = "storm"
    try:
        await stack.start()
        assert stack.client is not None
        await set_policy_with_start(stack.client, "chaos", host_group, PolicyChange(operator="storm", policy=policy))
        low, high = (float(x) / 1000 for x in args.hold_ms.split(":"))
        down: list[tuple[float, float]] = []
        async with HostGroupWatch(stack.client, host_group) as watch:
            storm = Storm(stack.client, host_group, holders=args.holders, slots=args.slots, hold=(low, high),
                          seconds=args.seconds, rng=random.Random(seed), tag=f"s{seed}", watch=None if args.no_watch else watch)
            killer = (asyncio.ensure_future(kill_on_schedule(stack, args.kill_every, time.monotonic() + args.seconds, down, log))
                      if args.kill_every else None)
            await storm.run()
        kills = await killer if killer is not None else 0
        violations = storm.violations()
        figures = {"worker SIGKILLs": str(kills), **storm.figures(down)}
        server, kept = await storm.server_violations(within=60)
        server += audited_quota(stack, host_group, args.slots, kept)
        if args.save_histories:
            await save_killed_runs(stack.client, host_group, Path(args.save_histories))
        if args.pause:
            print(f"paused: the stack is at {stack.temporal_address}; press Enter to stop it", flush=True)
            await asyncio.to_thread(sys.stdin.readline)
        return {**figures, **kept}, violations + server
    finally:
        await stack.stop()
        Managed.kill_all()


async def main(args: argparse.Namespace) -> int:
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    root = Path(args.scratch) if args.scratch else Path(tempfile.mkdtemp(prefix="conductor-storm-"))
    failed = False
    rows = []
    for run in range(args.runs):
        figures, violations = await one_run(args, root / f"run-{run}", seed + run)
        print(f"\n== storm run {run + 1} of {args.runs}: {args.holders} holders, {args.slots} slots, holds {args.hold_ms} ms, "
              f"{args.seconds:.0f} s, worker SIGKILLed every {args.kill_every or 'never'} s (seed {seed + run})")
        for key, value in figures.items():
            print(f"   {key:<50}{value}")
        for violation in violations:
            print(f"   VIOLATION: {violation}")
        failed |= bool(violations)
        rows.append(figures)
    if args.runs > 1:
        print("\n== summary: " + "; ".join(f"run {i + 1} busy {r[BUSY]}, singleton tasks {r[SINGLETON_TASKS].split(',')[0]}"
                                         for i, r in enumerate(rows)))
    if not args.keep and not failed and not args.scratch:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    print(f"RESULT storm {'FAIL' if failed else 'ok'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--holders", type=int, default=40)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=90)
    parser.add_argument("--hold-ms", default="50:400", help="each hold, uniform between LOW:HIGH ms (default 50:400)")
    parser.add_argument("--kill-every", type=float, default=0, help="SIGKILL the worker every N seconds (default: never)")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--durable", action="store_true",
                        help="the dev server keeps its state in a SQLite file (each write synced) instead of in memory")
    parser.add_argument("--no-watch", action="store_true",
                        help="each holder hears its decisions from its own holder workflow only (no shared HostGroupWatch)")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--scratch", help="directory for logs and databases (default: a temporary one, removed)")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--save-histories", metavar="DIR",
                        help="write the singleton's runs in which a worker was killed to DIR (tests/histories records them)")
    parser.add_argument("--pause", action="store_true", help="keep the stack up after a run until Enter (to look at it)")
    sys.exit(asyncio.run(main(parser.parse_args())))
