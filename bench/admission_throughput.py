"""Admission throughput on the embedded dev server, against a signal round-trip ceiling.

Run: `.venv/bin/python -m bench.admission_throughput [--n 200] [--repeats 3] [--experiments]`.
Not part of the test-suite: it prints figures and ratios, it does not pass or fail.

Every scenario starts the same N requester workflows at once from the client; each is run
`--repeats` times, interleaved with the others after one warm-up round, and the median is reported.

(a) ceiling: each requester signals a trivial echo workflow (signals append to an inbox, its loop
    drains the inbox and signals every requester back: the admission workflow's shape without
    the engine) and waits for the signal back; timed until the last requester completed;
(b) the same requesters through the real AdmissionWorkflow, quotas on (global and environment)
    but large enough that all are admitted at once: `AdmissionClient.submit` of one request (a
    signal to the running singleton) and `wait_until_decided`; timed until the last requester
    has its admission in hand, which is what admission throughput means. Then, as real work would,
    each requester holds its lease (10 s of workflow time, past the window) and gives it back with
    `release(confirm=False)`; the bench checks that every lease comes back;
(c) missions-shaped requesters: the same, but each submits ONE batch of 10 requests.

`--experiments` adds a bench-only variant that splits (b)'s cost without touching workflows/:
(a2) the echo with (b)'s message shape (a round trip, then a one-way signal before closing),
     i.e. (b) minus the engine and the payloads.

It also prints the size of the continue-as-new input carrying 10,000 queued requests, measured as
the JSON payload the pydantic data converter produces for the real `AdmissionWorkflowInput`, and
where the time went: CPU of this process (worker + client) and of the dev server per requester,
requests per CPU second (the ratio least disturbed by other load on a shared machine) and, unless
--no-profile, workflow-task counts, latencies and events per requester read back from the
histories of the last timed run.

This module is passed through the workflow sandbox by default: otherwise the sandbox re-imports
(and, under PYTHONDONTWRITEBYTECODE, recompiles) it for every requester run, and the figures
would measure that instead of the admission path (`--reimport` shows the difference).
Tuning experiments: `--unsandboxed`, `--workflow-polls N`, `--scenarios a,b`.
"""

from __future__ import annotations

import os
import sys

from temporalio import workflow


import asyncio
import time
from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict

with workflow.unsafe.imports_passed_through():
    from workflows.admission.client import AdmissionClient
    from workflows.admission.messages import admission_workflow_id
    from workflows.admission.model import AdmissionRequest

ENVIRONMENT = "bench"
MISSION_BATCH = 10
HOLD_SECONDS = 10  # admission requesters hold their leases this long (workflow time) before releasing


# --- bench-only workflows and activity -----------------------------------------------------------


class EchoPlan(BaseModel):
    model_config = ConfigDict(extra="forbid")

    echo_id: str
    farewell: bool = False  # like a release(confirm=False): one more signal out, none back


@workflow.defn(name="BenchEchoWorkflow")
class EchoWorkflow:
    """The ceiling's singleton: the admission workflow's shape (inbox, drain loop, one signal out
    per requester, outbound signals as tasks) with no engine, no audit activity and no state."""

    def __init__(self) -> None:
        self._inbox: list[str] = []
        self._stop = False
        self._answered = 0
        self._farewells = 0
        self._pending: set[asyncio.Task[None]] = set()

    @workflow.signal
    def ping(self, requester: str) -> None:
        self._inbox.append(requester)

    @workflow.signal
    def farewell(self) -> None:
        self._farewells += 1

    @workflow.signal
    def stop(self) -> None:
        self._stop = True

    @workflow.query
    def answered(self) -> int:
        return self._answered

    @workflow.query
    def farewells(self) -> int:
        return self._farewells

    @workflow.run
    async def run(self) -> int:
        while True:
            await workflow.wait_condition(lambda: bool(self._inbox) or self._stop)
            if not self._inbox:
                break
            batch, self._inbox = self._inbox, []
            for requester in batch:
                task = asyncio.ensure_future(self._pong(requester))
                self._pending.add(task)
                task.add_done_callback(self._pending.discard)
        while self._pending:
            await asyncio.gather(*list(self._pending))
        return self._answered

    async def _pong(self, requester: str) -> None:
        await workflow.get_external_workflow_handle(requester).signal("pong")
        self._answered += 1


@workflow.defn(name="BenchEchoRequesterWorkflow")
class EchoRequesterWorkflow:
    def __init__(self) -> None:
        self._pongs = 0

    @workflow.signal
    def pong(self) -> None:
        self._pongs += 1

    @workflow.run
    async def run(self, plan: EchoPlan) -> None:
        echo = workflow.get_external_workflow_handle(plan.echo_id)
        await echo.signal("ping", workflow.info().workflow_id)
        await workflow.wait_condition(lambda: self._pongs > 0)
        if plan.farewell:
            await echo.signal("farewell")


class RequesterInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host_group: str
    requests: int
    hold_seconds: float


class RequesterResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    admitted: int
    decided_at: datetime  # workflow time (the dev server's clock) when every request was decided


@workflow.defn(name="BenchAdmissionRequesterWorkflow")
class AdmissionRequesterWorkflow:
    """A requester as a mission would be: one submit batch, wait for admission, hold the leases while
    "working" (past the timed window), then give everything back."""

    @workflow.run
    async def run(self, input: RequesterInput) -> RequesterResult:
        admission = AdmissionClient(input.host_group)
        me = workflow.info().workflow_id
        now = workflow.now()
        requests = [
            AdmissionRequest(
                request_id=f"{me}/w{i}", orchestrator_id=me, environment=ENVIRONMENT, provider="local",
                runtime_kind="container", priority=0, submitted_at=now, queue_timeout_seconds=3600,
            )
            for i in range(input.requests)
        ]
        ids = [request.request_id for request in requests]
        await admission.submit(requests)
        await admission.wait_until_decided(ids)
        decided_at = workflow.now()
        admitted = [rid for rid in ids if admission.state_of(rid) == "admitted"]
        await workflow.sleep(input.hold_seconds, summary="work while holding the leases")
        # Nothing follows, so no confirmation: the singleton sends none and never signals us closed.
        await admission.release(admitted, confirm=False)
        return RequesterResult(admitted=len(admitted), decided_at=decided_at)


BENCH_WORKFLOWS = [EchoWorkflow, EchoRequesterWorkflow, AdmissionRequesterWorkflow]


# --- scenarios ---------------------------------------------------------------------------------------


class Scenario(BaseModel):
    key: str
    label: str
    echo: bool = False
    farewell: bool = False
    per_requester: int = 1


SCENARIOS = {
    "a": Scenario(key="a", label="(a) ceiling: echo, 1 signal round trip", echo=True),
    "a2": Scenario(key="a2", label="(a2) echo, round trip + farewell", echo=True, farewell=True),
    "b": Scenario(key="b", label="(b) admission, 1 request each"),
    "c": Scenario(key="c", label=f"(c) admission, batch of {MISSION_BATCH} each", per_requester=MISSION_BATCH),
}


class Run(BaseModel):
    scenario: str
    requests: int
    wall: float
    worker_cpu: float  # CPU seconds of this process (worker, client, SDK core) during the run
    server_cpu: float | None  # CPU seconds of the dev server during the run
    singleton_id: str
    requester_ids: list[str]


# --- the driver (never imported by workflow code) ----------------------------------------------------


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="requester workflows per scenario (default 200)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per scenario; the median is reported")
    parser.add_argument("--experiments", action="store_true", help="also run the (a2) variant")
    parser.add_argument("--scenarios", help="comma-separated subset to run, e.g. a,b (ratios need a, b and c)")
    parser.add_argument(
        "--workflow-polls", type=int, default=None,
        help="worker tuning experiment: maximum concurrent workflow task polls (SDK default 5)",
    )
    parser.add_argument(
        "--unsandboxed", action="store_true",
        help="experiment: run every workflow (the admission workflow too) without the workflow sandbox",
    )
    parser.add_argument("--no-profile", dest="profile", action="store_false", help="skip the history analysis")
    parser.add_argument(
        "--reimport", action="store_true",
        help="let the workflow sandbox re-import this module for every requester run (by default it is passed "
             "through, so the figures measure the admission path rather than this module's import cost)",
    )
    parser.add_argument("--can-queued", type=int, default=10_000, help="queued requests in the continue-as-new payload")
    args = parser.parse_args()
    from worker.process import exit_now

    code = asyncio.run(_run(args))
    exit_now(code)  # the Temporal core's threads can crash interpreter finalisation


async def _run(args) -> int:
    import logging
    import statistics
    import tempfile
    import uuid
    from pathlib import Path

    from worker.payloads import DATA_CONVERTER
    from temporalio.testing import WorkflowEnvironment

    from worker.binaries import temporal_cli
    from worker.config import WorkerConfig
    from worker.worker import build_worker
    from workflows.admission.model import AdmissionPolicy

    logging.basicConfig(level=logging.ERROR)
    started = time.perf_counter()
    can = can_payload_size(args.can_queued)
    keys = ["a", "a2", "b", "c"] if args.experiments else ["a", "b", "c"]
    if args.scenarios:
        keys = [key for key in SCENARIOS if key in args.scenarios.split(",")]

    # Quotas on (global and the bench environment) but never binding: we measure the admission path.
    limit = MISSION_BATCH * args.n * 2
    policy = AdmissionPolicy(
        max_concurrent=limit, environment_quotas={ENVIRONMENT: limit},
        lease_ttl_seconds=600, aging_interval_seconds=3600,
    )
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli(), data_converter=DATA_CONVERTER, ui=False,
        dev_server_log_level="error",
    )
    runs: dict[str, list[Run]] = {key: [] for key in keys}
    profile = None
    try:
        with tempfile.TemporaryDirectory(prefix="admission-bench-") as data_dir:
            config = WorkerConfig(
                data_dir=Path(data_dir), task_queue=f"bench-{uuid.uuid4().hex[:8]}", admission_policy=policy,
            )
            options = {}
            if args.unsandboxed:
                from temporalio.worker import UnsandboxedWorkflowRunner

                options["workflow_runner"] = UnsandboxedWorkflowRunner()
            elif not args.reimport:
                from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

                options["workflow_runner"] = SandboxedWorkflowRunner(
                    restrictions=SandboxRestrictions.default.with_passthrough_modules(__name__),
                )
            if args.workflow_polls:
                from temporalio.worker import PollerBehaviorSimpleMaximum

                options["workflow_task_poller_behavior"] = PollerBehaviorSimpleMaximum(args.workflow_polls)
            bench = _Bench(env.client, config, policy, args.n)
            async with build_worker(env.client, config, extra_workflows=BENCH_WORKFLOWS, **options):
                for key in keys:  # warm-up: workflow cache, sandbox, server shards, SQLite, pydantic schemas
                    await bench.run(SCENARIOS[key], n=max(20, args.n // 4))
                for repeat in range(args.repeats):  # interleaved, so drift hits every scenario alike
                    last = repeat == args.repeats - 1
                    for key in keys:
                        runs[key].append(await bench.run(SCENARIOS[key], keep=last and args.profile))
                if args.profile:
                    profile = await bench.profile([runs[key][-1] for key in keys])
    finally:
        await env.shutdown()

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    print(f"\nadmission throughput: N={args.n} requester workflows per scenario, median of {args.repeats} runs after "
          f"a warm-up; embedded dev server and one worker on {cpus} CPUs\n")
    header = (f"{'scenario':<40} {'requests':>8} {'wall s':>7} {'req/s':>7} "
              f"{'wkr ms/rq':>9} {'srv ms/rq':>9} {'cpu busy':>8} {'req/cpu-s':>9}  runs req/s")
    print(header)
    print("-" * len(header))
    rates: dict[str, float] = {}
    per_cpu: dict[str, float] = {}
    for key in keys:
        series = runs[key]
        middle = sorted(series, key=lambda run: run.wall)[len(series) // 2]
        rates[key] = middle.requests / middle.wall
        requesters = args.n
        worker_ms = statistics.median(run.worker_cpu for run in series) / requesters * 1000
        server = [run.server_cpu for run in series if run.server_cpu is not None]
        server_ms = f"{statistics.median(server) / requesters * 1000:9.1f}" if server else f"{'?':>9}"
        busy = (middle.worker_cpu + (middle.server_cpu or 0)) / (middle.wall * cpus)
        per_cpu[key] = statistics.median(r.requests / (r.worker_cpu + (r.server_cpu or 0)) for r in series)
        print(f"{SCENARIOS[key].label:<40} {middle.requests:>8} {middle.wall:7.2f} {rates[key]:7.1f} "
              f"{worker_ms:9.1f} {server_ms} {busy:8.0%} {per_cpu[key]:9.1f}  "
              + ", ".join(f"{r.requests / r.wall:.0f}" for r in series))
    print("\ncolumns: 'wall s' = first start to the last reply (echo) or the last admission received (admission);")
    print("         'wkr/srv ms/rq' = CPU ms per requester workflow in that window: this process (worker+client) / dev server;")
    print("         'cpu busy' = both together over wall time x CPUs (the rest is idle or other processes');")
    print("         'req/cpu-s' = admitted requests per CPU second of both: the throughput a saturated, otherwise idle")
    print("         machine would approach, and the ratio least disturbed by other load on the machine")

    def ratio(top: str, bottom: str) -> str:
        return f"{rates[top] / rates[bottom]:.2f}" if top in rates and bottom in rates else "n/a"

    b_a, c_a = ratio("b", "a"), ratio("c", "a")
    extra = [f"{top}/{bottom} = {ratio(top, bottom)}" for top, bottom in (("a2", "a"), ("b", "a2"))
             if top in rates and bottom in rates]
    print(f"\nratios: b/a = {b_a} (target >= 0.8), c/a = {c_a} (target >= 5)" + "".join(f"; {e}" for e in extra))
    if "a" in per_cpu:
        print("ratios per CPU second: " + ", ".join(
            f"{key}/a = {per_cpu[key] / per_cpu['a']:.2f}" for key in keys if key != "a"))
    print(f"\ncontinue-as-new input with {can.queued:,} queued requests: {can.total:,} bytes "
          f"({'under' if can.total < 1_000_000 else 'OVER'} 1 MB; the server rejects payloads over 2 MB)")
    for part, size in can.parts.items():
        print(f"  {part:<44} {size:>10,} bytes")
    print(f"  (ids as production shapes them: requester {can.requester_len} chars, "
          f"request id {can.request_id_len} chars)")
    if profile:
        print("\n" + profile)
    print(f"\nbench wall time {time.perf_counter() - started:.0f} s")
    print(f"RESULT b/a={b_a} c/a={c_a} can_payload_bytes={can.total}")
    return 0


class _Bench:
    def __init__(self, client, config, policy, n: int) -> None:
        self.client = client
        self.config = config
        self.policy = policy
        self.n = n
        self._round = 0
        from bench.procstat import dev_server_pid

        self._server = dev_server_pid()

    async def run(self, scenario: Scenario, *, n: int | None = None, keep: bool = False) -> Run:
        """Start every requester at once; time until the last one has its reply or admission."""
        from activities.admission import signal_with_start_admission
        from workflows.admission.messages import PolicyChange

        n = self.n if n is None else n
        self._round += 1
        tag = f"{scenario.key}{self._round}"
        tq = self.config.task_queue
        if scenario.echo:
            singleton_id = f"{tag}-echo"
            singleton = await self.client.start_workflow("BenchEchoWorkflow", id=singleton_id, task_queue=tq)
            await _until_answering(singleton, "answered")  # running before the clock starts
            workflow_name = "BenchEchoRequesterWorkflow"
            arg: BaseModel = EchoPlan(echo_id=singleton_id, farewell=scenario.farewell)
        else:
            host_group = f"bench-{tag}"
            singleton_id = admission_workflow_id(host_group)
            # Start the singleton before the clock (a harmless set_policy), as it is in steady state.
            await signal_with_start_admission(
                self.client, tq, host_group, self.policy, "set_policy",
                PolicyChange(operator="bench", policy=self.policy),
            )
            singleton = self.client.get_workflow_handle(singleton_id)
            await _until_answering(singleton, "usage")
            workflow_name = "BenchAdmissionRequesterWorkflow"
            arg = RequesterInput(host_group=host_group, requests=scenario.per_requester, hold_seconds=HOLD_SECONDS)

        ids = [f"{tag}-req-{i:04d}" for i in range(n)]
        sampler = _CpuSampler(self._server)
        sampling = asyncio.ensure_future(sampler.run())
        t0_wall = time.time()
        handles = await asyncio.gather(*(
            self.client.start_workflow(workflow_name, arg, id=wid, task_queue=tq,
                                       result_type=None if scenario.echo else RequesterResult)
            for wid in ids
        ))
        results = await asyncio.gather(*(handle.result() for handle in handles))
        if scenario.echo:
            wall = time.time() - t0_wall
            farewells = await singleton.query("farewells")
            await singleton.signal("stop")
            answered = await singleton.result()
            assert answered == n, f"echo answered {answered} of {n}"
            assert farewells == (n if scenario.farewell else 0), f"echo got {farewells} farewells of {n}"
        else:
            # The clock stops when the last requester has its admission in hand (its workflow time:
            # the server's clock, on this machine), as the echo's stops when the last reply is in.
            wall = max(result.decided_at.timestamp() for result in results) - t0_wall
            admitted = sum(result.admitted for result in results)
            assert admitted == n * scenario.per_requester, f"admitted {admitted} of {n * scenario.per_requester}"
            if wall > HOLD_SECONDS:
                print(f"bench: {tag} took {wall:.1f} s > the {HOLD_SECONDS} s hold: releases overlapped the "
                      "timed window (the figure is pessimistic)", file=sys.stderr)
            await _until_leases_held(singleton, 0)  # every lease back, though nobody confirmed it
            if not keep:
                await singleton.terminate(reason="bench run finished")
        sampling.cancel()
        worker_cpu, server_cpu = sampler.at(t0_wall + wall)
        return Run(
            scenario=scenario.key, requests=n * scenario.per_requester, wall=wall, worker_cpu=worker_cpu,
            server_cpu=server_cpu, singleton_id=singleton_id, requester_ids=ids,
        )

    async def profile(self, runs: list[Run]) -> str:
        """Where the last timed run of each scenario spent its time, from its histories."""
        lines = ["profile of the last timed run (from history event timestamps; requesters: a sample of 25):"]
        for run in runs:
            singleton = await self.client.get_workflow_handle(run.singleton_id).fetch_history()
            sample = run.requester_ids[:: max(1, len(run.requester_ids) // 25)]
            requesters = [await self.client.get_workflow_handle(wid).fetch_history() for wid in sample]
            lines.append(_describe(run, singleton, requesters))
            if not SCENARIOS[run.scenario].echo:
                await self.client.get_workflow_handle(run.singleton_id).terminate(reason="bench profile finished")
        return "\n".join(lines)


async def _until_leases_held(singleton, expected: int) -> None:
    for _ in range(600):  # a minute
        usage = await singleton.query("usage")
        if next(row["used"] for row in usage if row["limit"] == "global") == expected:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{singleton.id} never reached {expected} leases held")


class _CpuSampler:
    """CPU seconds of this process and of the dev server, sampled every 20 ms from the start of a
    run, so the CPU spent inside a window that ends at a workflow-time instant can be read back."""

    def __init__(self, server_pid: int | None) -> None:
        self._server_pid = server_pid
        self._samples: list[tuple[float, float, float | None]] = []

    async def run(self) -> None:
        from bench.procstat import cpu_seconds

        while True:
            self._samples.append((time.time(), time.process_time(), cpu_seconds(self._server_pid)))
            await asyncio.sleep(0.02)

    def at(self, moment: float) -> tuple[float, float | None]:
        """(worker, server) CPU seconds from the first sample to the first one at or after `moment`."""
        first = self._samples[0]
        last = next((sample for sample in self._samples if sample[0] >= moment), self._samples[-1])
        server = None if first[2] is None or last[2] is None else last[2] - first[2]
        return last[1] - first[1], server


async def _until_answering(handle, query: str) -> None:
    """Wait until the singleton's first workflow task is done (it answers a query), retrying slow answers."""
    from temporalio.service import RPCError

    for attempt in range(12):
        try:
            await handle.query(query, rpc_timeout=timedelta(seconds=10))
            return
        except RPCError as error:
            print(f"bench: {handle.id} did not answer {query!r} yet ({error}); retrying", file=sys.stderr)
            await asyncio.sleep(1)
    raise RuntimeError(f"{handle.id} never answered the {query!r} query")


def _t(event) -> float:
    return event.event_time.ToDatetime().timestamp()


def _describe(run: Run, singleton, requesters) -> str:
    """Workflow-task counts and latencies of the singleton, and a requester's critical path."""
    import statistics

    from temporalio.api.enums.v1 import EventType as E

    events = list(singleton.events)
    scheduled: dict[int, float] = {}
    started: dict[int, float] = {}
    busy = queue_wait = 0.0
    tasks = signals_in = signals_out = activities = pending_signals = 0
    batch_sizes: list[int] = []
    for event in events:
        kind = event.event_type
        if kind == E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            signals_in += 1
            pending_signals += 1
        elif kind == E.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            scheduled[event.event_id] = _t(event)
        elif kind == E.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            started[event.event_id] = _t(event)
            scheduled_id = event.workflow_task_started_event_attributes.scheduled_event_id
            queue_wait += _t(event) - scheduled.get(scheduled_id, _t(event))
            if pending_signals:
                batch_sizes.append(pending_signals)
            pending_signals = 0
        elif kind == E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            tasks += 1
            started_id = event.workflow_task_completed_event_attributes.started_event_id
            busy += _t(event) - started.get(started_id, _t(event))
        elif kind == E.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED:
            signals_out += 1
        elif kind == E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            activities += 1
    span = _t(events[-1]) - _t(events[0])
    name = "echo" if SCENARIOS[run.scenario].echo else "admission"
    out = [
        f"  ({run.scenario}) {name} singleton: {len(events)} events = {len(events) / (len(run.requester_ids)):.1f} per "
        f"requester; {tasks} workflow tasks, {signals_in} signals in "
        f"({statistics.mean(batch_sizes) if batch_sizes else 0:.1f} per task that had any), {signals_out} out, "
        f"{activities} activities; started->completed {busy / max(1, tasks) * 1000:.0f} ms/task "
        f"(sum {busy:.1f} s), scheduled->started sum {queue_wait:.1f} s, over a span of {span:.1f} s",
    ]
    phases: dict[str, list[float]] = {}
    per_task: list[float] = []
    counts: list[int] = []
    for history in requesters:
        evs = list(history.events)
        counts.append(len(evs))
        marks: list[tuple[str, float]] = []
        wt_started: dict[int, float] = {}
        replies = 0
        for event in evs:
            kind = event.event_type
            if kind == E.EVENT_TYPE_WORKFLOW_TASK_STARTED:
                wt_started[event.event_id] = _t(event)
                if not marks:
                    marks.append(("1st task", _t(event)))
            elif kind == E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                started_id = event.workflow_task_completed_event_attributes.started_event_id
                per_task.append(_t(event) - wt_started.get(started_id, _t(event)))
            elif kind == E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                marks.append(("activity done", _t(event)))
            elif kind == E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
                replies += 1
                marks.append((f"reply {replies}", _t(event)))
        marks.append(("done", _t(evs[-1])))
        previous = _t(evs[0])
        for label, moment in marks:
            phases.setdefault(label, []).append(moment - previous)
            previous = moment
    path = " -> ".join(f"{label} +{statistics.median(values) * 1000:.0f}" for label, values in phases.items())
    tasks_each = len(per_task) / max(1, len(requesters))
    out.append(f"      requester: {statistics.median(counts):.0f} events, {tasks_each:.1f} "
               f"workflow tasks of {statistics.median(per_task) * 1000:.0f} ms (median); median ms from start: {path}")
    mine = _kinds([event for history in requesters for event in history.events], len(requesters))
    theirs = _kinds(events, len(run.requester_ids))
    mine_kb = sum(event.ByteSize() for history in requesters for event in history.events) / len(requesters) / 1024
    theirs_kb = sum(event.ByteSize() for event in events) / len(run.requester_ids) / 1024
    out.append(f"      events per requester by kind: requester {mine}; singleton {theirs}; "
               f"history bytes per requester: requester {mine_kb:.1f} KiB, singleton {theirs_kb:.1f} KiB")
    return "\n".join(out)


_KIND_NAMES = {
    "WORKFLOW_TASK": "wf-task", "ACTIVITY_TASK": "activity", "WORKFLOW_EXECUTION_SIGNALED": "signal-in",
    "SIGNAL_EXTERNAL": "signal-out", "EXTERNAL_WORKFLOW_EXECUTION_SIGNALED": "signal-out",
}


def _kinds(events, per: int) -> str:
    """Event counts grouped the way they cost: workflow tasks, activities, signals in and out."""
    from collections import Counter

    from temporalio.api.enums.v1 import EventType

    counts: Counter[str] = Counter()
    for event in events:
        name = EventType.Name(event.event_type).removeprefix("EVENT_TYPE_")
        group = next((short for prefix, short in _KIND_NAMES.items() if name.startswith(prefix)), "other")
        counts[group] += 1
    order = ["wf-task", "activity", "signal-in", "signal-out", "other"]
    return " ".join(f"{group} {counts[group] / per:.1f}" for group in order if counts[group])


# --- the continue-as-new payload ----------------------------------------------------------------------


class CanSize(BaseModel):
    queued: int
    total: int
    parts: dict[str, int]
    requester_len: int
    request_id_len: int


def can_payload_size(queued: int) -> CanSize:
    """Bytes of the JSON payload carrying `queued` queued requests (plus one holder) across continue-as-new.

    Ids are shaped like production ones: requesters are mission workflows (`mission:<uuid>`)
    submitting batches of MISSION_BATCH, request ids are `<mission id>/w<i>`; the requester map
    and the recent audit events ride along exactly as `AdmissionWorkflow._carry` builds them.
    """
    import json
    import random
    import uuid
    from collections import deque
    from datetime import timezone

    from worker.payloads import DATA_CONVERTER

    from workflows.admission import engine
    from workflows.admission.messages import AdmissionWorkflowInput
    from workflows.admission.model import AdmissionPolicy, Submit
    from workflows.admission.singleton import SingletonState

    rng = random.Random(20_260_101)
    policy = AdmissionPolicy(max_concurrent=1, lease_ttl_seconds=300)
    shell = AdmissionWorkflowInput(host_group="gpu-pool-eu-west-1", policy=policy)
    state = engine.new_state(policy)
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    requesters: dict[str, str] = {}
    recent: deque = deque(maxlen=shell.recent_audit_events)
    mission = ""
    for index in range(queued + 1):  # the first is admitted and holds the only slot
        if index % MISSION_BATCH == 0:
            mission = f"mission:{uuid.UUID(int=rng.getrandbits(128), version=4)}"
        at = now + timedelta(milliseconds=index)
        request = AdmissionRequest(
            request_id=f"{mission}/w{index % MISSION_BATCH}", orchestrator_id=mission,
            environment=rng.choice(["prod", "staging", "dev"]), provider="local", runtime_kind="container",
            priority=rng.randrange(5), submitted_at=at, queue_timeout_seconds=3600,
        )
        state, result, events = engine.apply(state, Submit(request=request), at)
        assert result.ok
        requesters[request.request_id] = mission
        recent.extend(events)
    assert state.queued_count == queued, state.queued_count
    carried = SingletonState(
        host_group=shell.host_group, engine=state, requesters=requesters, recent=recent,
        audit_chain=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
    ).carry()
    can_input = shell.model_copy(update={"carried": carried})
    payload = DATA_CONVERTER.payload_converter.to_payloads([can_input])[0]
    document = json.loads(payload.data)["carried"]

    def size(value) -> int:
        return len(json.dumps(value, separators=(",", ":")))

    parts = {
        "carried.engine (format 3: records and requester map, zlib + base64)": size(document["engine"]),
        f"carried.recent_audit_packed ({len(recent)} events, zlib + base64)": size(document["recent_audit_packed"]),
    }
    parts["everything else"] = len(payload.data) - sum(parts.values())
    return CanSize(
        queued=queued, total=len(payload.data), parts=parts, requester_len=len(mission),
        request_id_len=len(request.request_id),
    )


if __name__ == "__main__":
    # Re-import under the package name, so the worker can name this module to the workflow sandbox.
    from bench import admission_throughput

    admission_throughput.main()
