"""Sustained admission: held leases renewed at a short TTL while new requests keep arriving.

Run: `.venv/bin/python -m bench.admission_sustained [--quick] [--steps 1000,2000,5000] [--ttl 15]`.
Not part of the test-suite (tests/e2e/test_bench_admission_sustained.py runs `--quick` for its shape).

Lease holders are requester workflows that use the real `AdmissionClient`: each submits one batch
of `--batch` requests, holds what it is given and keeps it alive with the client's renewal loop
(a third of the TTL into each lease), as a mission does, until the bench stops it. The number of
held leases grows in steps; at each step, after every lease is held, the bench measures for a
window (`--window`, default two TTLs: six renewal rounds) while probe workflows submit one new
request each at a steady rate (`--rate` per second) and time its decision. A step at 0 leases
gives the probes' baseline.

Each design runs on a host group (a singleton) of its own, one after the other in this process:
  per-lease: the renewal names every lease and its revision; each is decided with a new lease
             revision, an audit event and a decision signal back (the design before docs/scaling.md);
  requester: the renewal names no lease ("everything I hold", as of when it was sent), and
             nothing comes back.
  swept:     requester renewals at a TTL --ttl-factor (10) times longer, with a requester sweep
             every --ttl seconds giving back what closed holders held (docs/scaling.md).
At the start of each step --kill holders are terminated (they never give their leases back), and
"dead max" is how long until every lease they held had ended, from the audit store.
For each step it prints, from the singleton's histories (every run of its continue-as-new chain)
over the window: workflow tasks, signals in and out, and history events per second, and
continue-as-new per minute; renewal lag, from when a renewal was due (the client puts it in the
signal) to the start of the singleton's workflow task that decided it (p50, p99); the p99 of a
probe's decision latency (its submit to the decision in hand, workflow time) and its ratio to the
baseline; leases lost (left `admitted`, or no longer current in the holder's view, while the
holder was alive: must be 0); CPU of the singleton's worker (this process), of the holders' worker
(a process of its own, so that the singleton's figures are its own) and of the dev server.

A step breaks when a lease is lost, when renewal lag p99 passes a third of the TTL (half of the
margin a lease has left when its renewal is due), or when the leases cannot all be held within
`--ramp-timeout`; a design's later steps are then not run. One worker and the dev server share this
machine with whatever else runs on it: figures are noisy, compare the designs within one run.
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
    from workflows.admission.client import AdmissionClient, Renewal
    from workflows.admission.messages import AdmissionDecision
    from workflows.admission.model import AdmissionRequest

ENVIRONMENT = "bench"
DESIGNS: dict[str, str] = {
    "per-lease": "renewal names each lease; a new lease revision, an audit event and a decision back per lease",
    "requester": "renewal names no lease (everything the requester holds, as of when it was sent); no answer",
    "swept": "requester renewals at a TTL --ttl-factor times longer; a requester sweep every --ttl seconds "
             "gives back what closed holders held",
}


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HolderInput(_Message):
    host_group: str
    requests: int
    renewal: Renewal
    decision_timeout_seconds: float = 300  # a singleton that stopped deciding must not hang the bench


class HolderResult(_Message):
    admitted: int
    lost: list[float]  # workflow time (epoch seconds) at which each lost lease was found lost


def holder_request_id(holder_id: str, index: int) -> str:
    return f"{holder_id}/w{index}"


@workflow.defn(name="BenchLeaseHolderWorkflow")
class LeaseHolderWorkflow:
    """A mission's admission life without the children: one batch, held and renewed until told to stop."""

    def __init__(self) -> None:
        self._stop = False

    @workflow.signal
    def stop(self) -> None:
        self._stop = True

    @workflow.run
    async def run(self, input: HolderInput) -> HolderResult:
        heard: list[AdmissionDecision] = []  # every decision, as it arrives
        admission = AdmissionClient(input.host_group, renewal=input.renewal, on_decision=heard.append)
        me = workflow.info().workflow_id
        now = workflow.now()
        requests = [
            AdmissionRequest(
                request_id=holder_request_id(me, i), orchestrator_id=me, environment=ENVIRONMENT, provider="local",
                runtime_kind="container", priority=0, submitted_at=now, queue_timeout_seconds=3600,
            )
            for i in range(input.requests)
        ]
        ids = [request.request_id for request in requests]
        await admission.submit(requests)
        await admission.wait_until_decided(ids, timeout=timedelta(seconds=input.decision_timeout_seconds))
        held = [rid for rid in ids if admission.state_of(rid) == "admitted"]
        renewing = asyncio.ensure_future(admission.keep_leases_alive())
        lost: dict[str, float] = {}
        watched = 0

        def scan() -> None:
            nonlocal watched
            for decision in heard[watched:]:
                if decision.request_id in held and decision.state != "admitted":
                    lost.setdefault(decision.request_id, workflow.now().timestamp())
            watched = len(heard)

        while not self._stop:
            seen = admission.version
            await workflow.wait_condition(lambda: self._stop or admission.version != seen)
            scan()
        scan()
        for rid in held:  # current in the holder's view right up to the end, or it counts as lost
            if not admission.is_current(rid):
                lost.setdefault(rid, workflow.now().timestamp())
        await admission.give_back_everything(confirm_within=None)
        await renewing
        return HolderResult(admitted=len(held), lost=sorted(lost.values()))


class ProbeInput(_Message):
    host_group: str
    decision_timeout_seconds: float = 120  # a singleton that stopped deciding must not hang the bench


class ProbeResult(_Message):
    state: str
    latency: float  # seconds of workflow time from the submit to the decision in hand
    decided_at: float  # epoch seconds, workflow time


@workflow.defn(name="BenchAdmissionProbeWorkflow")
class ProbeWorkflow:
    """A new request arriving while the leases are held: submit one, time the decision, give it back."""

    @workflow.run
    async def run(self, input: ProbeInput) -> ProbeResult:
        admission = AdmissionClient(input.host_group)
        me = workflow.info().workflow_id
        started = workflow.now()
        request = AdmissionRequest(
            request_id=f"{me}/p", orchestrator_id=me, environment=ENVIRONMENT, provider="local",
            runtime_kind="container", priority=0, submitted_at=started, queue_timeout_seconds=3600,
        )
        await admission.submit([request])
        await admission.wait_until_decided([request.request_id], timeout=timedelta(seconds=input.decision_timeout_seconds))
        decided = workflow.now()
        await admission.give_back_everything(confirm_within=None)
        return ProbeResult(
            state=admission.state_of(request.request_id) or "unknown",
            latency=(decided - started).total_seconds(), decided_at=decided.timestamp(),
        )


BENCH_WORKFLOWS = [LeaseHolderWorkflow, ProbeWorkflow]


# --- the driver (never imported by workflow code) ----------------------------------------------------


class Step(_Message):
    design: str
    ttl: float  # the design's lease TTL
    held: int  # leases the step holds
    holders: int
    start: float = 0.0  # epoch seconds: the measurement window
    end: float = 0.0
    ramp_from: float = 0.0  # when this step's holders started (losses count from here)
    ramp_seconds: float = 0.0
    ramp_failed: str | None = None
    worker_cpu: float | None = None  # the singleton's worker process
    server_cpu: float | None = None
    holders_cpu: float | None = None  # the holders' and probes' worker process
    probes: list[ProbeResult] = []
    # from the singleton's histories
    tasks: int = 0
    signals_in: int = 0
    signals_out: int = 0
    events: int = 0
    runs_started: int = 0
    renew_signals: int = 0
    task_failures: int = 0  # workflow tasks of the singleton that failed or timed out
    lags: list[float] = []  # renewal due -> decided
    singleton_lags: list[float] = []  # renewal arrived -> decided
    lost: int = 0
    killed: list[tuple[str, float]] = []  # holders terminated at the window's start: (workflow id, when)
    recoveries: list[float] = []  # seconds from a kill until every lease that holder held had ended


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run (one small step, a 3 s TTL), for tests")
    parser.add_argument("--steps", help="held leases per step, comma-separated (default 500,1000,2000,5000)")
    parser.add_argument("--batch", type=int, default=10, help="leases per holder workflow (default 10)")
    parser.add_argument("--ttl", type=float, help="lease TTL in seconds (default 15; --quick 3)")
    parser.add_argument("--ttl-factor", type=float,
                        help="the swept design's TTL is this many times --ttl (default 10; --quick 3)")
    parser.add_argument("--kill", type=int, default=2,
                        help="holders terminated at each step's start, to time how soon their capacity returns")
    parser.add_argument("--window", type=float,
                        help="measured seconds per step (default two --ttl, and at least two of a design's renewal rounds)")
    parser.add_argument("--rate", type=float, default=2.0, help="new requests (probes) per second (default 2)")
    parser.add_argument("--designs", default=",".join(DESIGNS), help=f"comma-separated, of: {', '.join(DESIGNS)}")
    parser.add_argument("--ramp-timeout", type=float, default=120, help="seconds to get a step's leases held")
    parser.add_argument("--start-rate", type=float, default=100, help="holder workflows started per second")
    parser.add_argument("--worker-process", nargs=5, help=argparse.SUPPRESS,
                        metavar=("ROLE", "ADDRESS", "HOLDER_QUEUE", "ADMISSION_QUEUE", "DATA_DIR"))  # internal
    args = parser.parse_args()
    if args.worker_process:
        from worker.process import exit_now

        asyncio.run(_worker_process(*args.worker_process))
        exit_now(0)
    try:
        steps = [int(part) for part in (args.steps or ("100" if args.quick else "500,1000,2000,5000")).split(",")]
        designs = [name for name in args.designs.split(",") if name]
        unknown = [name for name in designs if name not in DESIGNS]
        if unknown or not designs:
            raise ValueError(f"unknown design {', '.join(unknown) or '(none)'}; choose from {', '.join(DESIGNS)}")
        if steps != sorted(steps) or any(step <= 0 for step in steps):
            raise ValueError("--steps must be increasing positive lease counts, e.g. 500,1000,2000")
        args.ttl_factor = args.ttl_factor or (3.0 if args.quick else 10.0)
        if args.batch <= 0 or args.rate <= 0 or args.ttl_factor < 1 or args.kill < 0:
            raise ValueError("--batch and --rate must be positive, --ttl-factor at least 1, --kill at least 0")
    except ValueError as error:
        print(f"admission_sustained: {error}", file=sys.stderr)
        return 2
    args.ttl = args.ttl or (3.0 if args.quick else 15.0)
    from worker.process import exit_now

    code = asyncio.run(_run(args, steps, designs))
    exit_now(code)  # the Temporal core's threads can crash interpreter finalisation
    return code


async def _run(args, steps: list[int], designs: list[str]) -> int:
    import logging
    import subprocess
    import tempfile
    import uuid

    from worker.payloads import DATA_CONVERTER
    from temporalio.testing import WorkflowEnvironment

    from bench.procstat import dev_server_pid
    from worker.binaries import temporal_cli
    from workflows.admission.model import AdmissionPolicy

    logging.basicConfig(level=logging.ERROR)
    started = time.perf_counter()
    limit = 2 * steps[-1] + 1000
    policy = AdmissionPolicy(
        max_concurrent=limit, lease_ttl_seconds=args.ttl, aging_interval_seconds=3600, terminal_retention_seconds=60,
    )
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli(), data_converter=DATA_CONVERTER, ui=False,
        dev_server_log_level="error",
    )
    results: dict[str, list[Step]] = {}
    workers: dict[str, subprocess.Popen] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="admission-sustained-") as data_dir:
            admission_queue = f"sustained-{uuid.uuid4().hex[:8]}"
            holder_queue = f"{admission_queue}-holders"
            # Two worker processes: the singletons' and the requesters' (holders and probes). So
            # each one's CPU is its own, and this process's history reading never stalls a worker.
            for role in ("singleton", "holders"):
                workers[role] = subprocess.Popen(
                    [sys.executable, "-m", "bench.admission_sustained", "--worker-process", role,
                     env.client.service_client.config.target_host, holder_queue, admission_queue, data_dir],
                    cwd=_REPO_ROOT,
                    env={**os.environ, "PYTHONPATH": _REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")},
                )
            try:
                for design in designs:
                    bench = _Design(env.client, holder_queue, admission_queue, policy, args, design,
                                    {"server": dev_server_pid(), **{role: proc.pid for role, proc in workers.items()}},
                                    data_dir)
                    results[design] = await bench.run(steps)
                    print(_report({design: results[design]}, args, summary=False), flush=True)  # as soon as it is done
            finally:  # before the data directory goes: the singleton's worker writes its audit store there
                for process in workers.values():
                    process.terminate()
                    process.wait(timeout=30)
    finally:
        await env.shutdown()
    print("\n== all designs" + _report(results, args))
    print(f"\nbench wall time {time.perf_counter() - started:.0f} s")
    return 0


_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


async def _worker_process(role: str, address: str, holder_queue: str, admission_queue: str, data_dir: str) -> None:
    """A worker of its own: `singleton` runs the admission workflows (the production worker on the
    admission queue), `holders` the holder and probe workflows."""
    import logging
    from pathlib import Path

    from temporalio.client import Client
    from worker.payloads import DATA_CONVERTER
    from temporalio.worker import Worker
    from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

    from activities.admission import AdmissionActivities
    from worker.config import WorkerConfig
    from worker.worker import build_worker
    from workflows.admission.model import AdmissionPolicy

    logging.basicConfig(level=logging.ERROR)
    client = await Client.connect(address, data_converter=DATA_CONVERTER)
    policy = AdmissionPolicy(max_concurrent=1)  # only for a singleton a submit had to start: never here
    if role == "singleton":
        config = WorkerConfig(data_dir=Path(data_dir), task_queue=admission_queue, admission_policy=policy)
        await build_worker(client, config).run()
        return
    worker = Worker(
        client, task_queue=holder_queue, workflows=BENCH_WORKFLOWS,
        activities=[AdmissionActivities(client, admission_queue, lambda host_group: policy).submit_admission_batch],
        workflow_runner=SandboxedWorkflowRunner(
            restrictions=SandboxRestrictions.default.with_passthrough_modules(__name__, "workflows"),
        ),
        # Every holder stays cached: an evicted one would replay its whole history per renewal.
        max_cached_workflows=50_000,
    )
    await worker.run()


BASELINE_WINDOW = 60.0  # seconds measured at the step with no leases held (at most)


class _Design:
    def __init__(self, client, task_queue: str, admission_queue: str, policy, args, design: str,
                 pids: dict[str, int | None], data_dir: str) -> None:
        import uuid

        self.client = client
        self.data_dir = data_dir  # the singleton's worker writes its audit store there
        self.task_queue = task_queue  # the holders'
        self.admission_queue = admission_queue
        self.pids = pids
        self.args = args
        self.design = design
        self.host_group = f"sustained-{design}-{uuid.uuid4().hex[:6]}"
        # The swept design: what the short TTL bought (a closed holder's capacity back within about
        # --ttl) the sweep gives instead, so the TTL, and with it the renewal rate, can be longer.
        self.ttl = args.ttl * (args.ttl_factor if design == "swept" else 1)
        self.sweep = args.ttl if design == "swept" else None
        self.renewal = "per-lease" if design == "per-lease" else "requester"
        self.policy = policy.model_copy(update={"lease_ttl_seconds": self.ttl, "requester_sweep_seconds": self.sweep})
        self.window = args.window or max(4.0 if args.quick else 2 * args.ttl, 2 * self.ttl / 3)
        self.killed: set[str] = set()
        self.holders: list = []
        self.cache: dict[str, list] = {}  # run id -> events of the singleton's closed runs
        self.probes: list[tuple[int, object]] = []  # (step index, handle)

    async def run(self, held_steps: list[int]) -> list[Step]:
        from activities.admission import signal_with_start_admission
        from bench.admission_throughput import _until_answering
        from workflows.admission.messages import PolicyChange, admission_workflow_id

        singleton_id = admission_workflow_id(self.host_group)
        await signal_with_start_admission(
            self.client, self.admission_queue, self.host_group, self.policy, "set_policy",
            PolicyChange(operator="bench", policy=self.policy),
        )
        await _until_answering(self.client.get_workflow_handle(singleton_id), "usage")
        steps = [Step(design=self.design, ttl=self.ttl, held=0, holders=0)]
        broken = False
        for index, target in enumerate([0, *held_steps]):
            if index:
                steps.append(Step(design=self.design, ttl=self.ttl, held=target, holders=-(-target // self.args.batch)))
            step = steps[-1]
            step.ramp_from = time.time()
            if index:
                await self._ramp(step, singleton_id)
                if step.ramp_failed:
                    broken = True
            if not broken:
                await self._measure(index, step)
                # Look before going on: a step whose renewals fell behind makes the next one pointless.
                probe = step.model_copy(update={"lags": [], "singleton_lags": [], "renew_signals": 0, "task_failures": 0})
                await _read_histories(self.client, singleton_id, [probe], self.cache)
                if index and _verdict(probe) != "ok":
                    broken = True
            if step.end > step.start:
                print(f"bench: provisional (no losses or probes yet): {probe.held} leases, lag p50/p99 "
                      f"{_quantile(probe.lags, 0.5)}/{_quantile(probe.lags, 0.99)} s, singleton "
                      f"{probe.tasks} tasks, {probe.signals_in} signals in, {probe.signals_out} out, "
                      f"{probe.events} events, {probe.task_failures} task failures over {step.end - step.start:.0f} s",
                      file=sys.stderr)
            print(f"bench: {self.design} step {step.held} leases measured"
                  + (f" (ramp failed: {step.ramp_failed})" if step.ramp_failed else "")
                  + (" and broke; no further steps" if broken else ""), file=sys.stderr)
            if broken:
                break
        await self._finish(steps, singleton_id)
        return steps

    async def _ramp(self, step: Step, singleton_id: str) -> None:
        """Start the step's new holders at --start-rate and wait until every lease is held."""
        t0 = time.time()
        missing = step.holders - (len(self.holders) - len(self.killed))  # killed holders are replaced
        per = max(1, int(self.args.start_rate // 10))
        while missing > 0:
            chunk = min(per, missing)
            base = len(self.holders)
            handles = await asyncio.gather(*(
                self.client.start_workflow(
                    "BenchLeaseHolderWorkflow",
                    HolderInput(host_group=self.host_group, requests=self.args.batch, renewal=self.renewal,
                                decision_timeout_seconds=self.args.ramp_timeout + 60),
                    id=f"{self.host_group}-holder-{base + i:05d}", task_queue=self.task_queue, result_type=HolderResult,
                )
                for i in range(chunk)
            ))
            self.holders.extend(handles)
            missing -= chunk
            await asyncio.sleep(0.1)
        from temporalio.client import WorkflowQueryFailedError
        from temporalio.service import RPCError

        singleton = self.client.get_workflow_handle(singleton_id)
        used = 0
        while True:
            try:
                usage = await singleton.query("usage", rpc_timeout=timedelta(seconds=10))
                used = next(row["used"] for row in usage if row["limit"] == "global")
            except (RPCError, WorkflowQueryFailedError) as error:  # a singleton that cannot answer is not ready either
                print(f"bench: {singleton_id} did not answer the usage query ({error})", file=sys.stderr)
            if used >= step.held:
                break
            if time.time() - t0 > self.args.ramp_timeout:
                step.ramp_failed = f"{used} of {step.held} leases held after {self.args.ramp_timeout:.0f} s"
                break
            await asyncio.sleep(0.5)
        step.ramp_seconds = time.time() - t0

    async def _measure(self, index: int, step: Step) -> None:
        from bench.procstat import cpu_seconds

        if index:
            await self._kill(step)
        before = {role: cpu_seconds(pid) for role, pid in self.pids.items()}
        step.start = time.time()
        interval = 1 / self.args.rate
        count = 0
        # With nothing held there are no renewals to watch, only the new requests' baseline latency.
        window = self.window if index else min(self.window, BASELINE_WINDOW)
        while time.time() < step.start + window:
            handle = await self.client.start_workflow(
                "BenchAdmissionProbeWorkflow", ProbeInput(host_group=self.host_group),
                id=f"{self.host_group}-probe-{index}-{count:04d}", task_queue=self.task_queue, result_type=ProbeResult,
            )
            self.probes.append((index, handle))
            count += 1
            await asyncio.sleep(max(0.0, step.start + count * interval - time.time()))
        step.end = time.time()
        after = {role: cpu_seconds(pid) for role, pid in self.pids.items()}
        used = {role: None if before[role] is None or after[role] is None else after[role] - before[role] for role in after}
        step.worker_cpu, step.server_cpu, step.holders_cpu = used["singleton"], used["server"], used["holders"]

    async def _kill(self, step: Step) -> None:
        """Terminate a few of the newest holders, as an operator would: they never give back their
        leases. How soon those leases end is the capacity a dead holder keeps from others."""
        victims = [holder for holder in reversed(self.holders) if holder.id not in self.killed][:self.args.kill]
        for holder in victims:
            await holder.terminate(reason="bench: a holder that dies without giving its leases back")
            self.killed.add(holder.id)
            step.killed.append((holder.id, time.time()))

    def _recoveries(self, steps: list[Step]) -> None:
        """From the audit store: when every lease of each killed holder had ended for good."""
        from activities.audit_store import AuditStore

        ended: dict[str, float] = {}
        ending = {"released", "cancelled", "timed-out"}
        for event in AuditStore(os.path.join(self.data_dir, "audit.sqlite")).events(self.host_group):
            if event.request_id and event.type in ending:
                ended[event.request_id] = event.at.timestamp()
        for step in steps:
            for holder_id, when in step.killed:
                finished = [ended.get(holder_request_id(holder_id, i)) for i in range(self.args.batch)]
                if all(moment is not None for moment in finished):
                    step.recoveries.append(max(finished) - when)
                else:  # still held at the end of the run: as long as we know of
                    step.recoveries.append(float("inf"))

    async def _finish(self, steps: list[Step], singleton_id: str) -> None:
        """Collect the probes, stop the holders (each reports its losses), read the singleton's histories."""
        from temporalio.service import RPCError

        for index, handle in self.probes:
            steps[index].probes.append(await handle.result())
        living = [holder for holder in self.holders if holder.id not in self.killed]
        await _bounded(holder.signal("stop") for holder in living)
        outcomes = await _bounded(holder.result() for holder in living)
        for outcome in outcomes:
            for moment in outcome.lost:
                # charged to the step during which it happened (ramp included), or the last one
                owner = next((s for s in reversed(steps) if s.ramp_from <= moment), steps[-1])
                owner.lost += 1
        await _read_histories(self.client, singleton_id, steps, self.cache)
        await asyncio.sleep(2)  # the last audit export
        self._recoveries(steps)
        try:
            await self.client.get_workflow_handle(singleton_id).terminate(reason="bench finished")
        except RPCError as error:  # it may have ended on its own (the server fails a run it cannot persist)
            print(f"bench: {singleton_id} was no longer running: {error}", file=sys.stderr)


async def _bounded(calls, at_once: int = 50) -> list:
    """Thousands of calls, a few at a time: the server refuses more long polls per namespace than
    its poller limit (`namespace concurrent poller limit exceeded`)."""
    gate = asyncio.Semaphore(at_once)

    async def one(call):
        async with gate:
            return await call

    return await asyncio.gather(*(one(call) for call in calls))


async def _read_histories(client, singleton_id: str, steps: list[Step], cache: dict[str, list]) -> None:
    """Fill the steps' figures from every run of the singleton's chain, oldest first. A renewal
    is decided by the first workflow task that starts after it arrived, in its run or (carried
    across continue-as-new) the next; one still undecided counts with its lag so far."""
    import json

    from temporalio.api.enums.v1 import EventType as E
    from temporalio.client import WorkflowExecutionStatus

    runs = [execution async for execution in client.list_workflows(f"WorkflowId = '{singleton_id}'")]
    runs.sort(key=lambda execution: execution.start_time)
    windows = [step for step in steps if step.end > step.start]
    waiting: list[tuple[float, float, Step]] = []  # renewals not decided yet: (due, arrived, step)
    for execution in runs:
        events = cache.get(execution.run_id)
        if events is None:
            history = await client.get_workflow_handle(singleton_id, run_id=execution.run_id).fetch_history()
            events = list(history.events)
            if execution.status != WorkflowExecutionStatus.RUNNING:
                cache[execution.run_id] = events
        if not events:
            continue
        begun = events[0].event_time.ToMicroseconds() / 1e6
        for step in windows:
            if step.start <= begun < step.end:
                step.runs_started += 1
        for event in events:
            moment = event.event_time.ToMicroseconds() / 1e6
            kind = event.event_type
            if kind == E.EVENT_TYPE_WORKFLOW_TASK_STARTED:
                for due, arrived, owner in waiting:
                    owner.lags.append(moment - due)
                    owner.singleton_lags.append(moment - arrived)
                waiting = []
            step = next((s for s in windows if s.start <= moment < s.end), None)
            if step is None:
                continue
            step.events += 1
            if kind == E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                step.tasks += 1
            elif kind in (E.EVENT_TYPE_WORKFLOW_TASK_FAILED, E.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT):
                step.task_failures += 1
            elif kind == E.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED:
                step.signals_out += 1
            elif kind == E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
                step.signals_in += 1
                attributes = event.workflow_execution_signaled_event_attributes
                if attributes.signal_name == "renew":
                    step.renew_signals += 1
                if attributes.signal_name == "renew" and attributes.input.payloads:
                    due_at = json.loads(attributes.input.payloads[0].data).get("due_at")
                    if due_at:
                        waiting.append((datetime.fromisoformat(due_at).timestamp(), moment, step))
    now = time.time()
    for due, arrived, owner in waiting:
        owner.lags.append(now - due)
        owner.singleton_lags.append(now - arrived)


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _verdict(step: Step) -> str:
    ttl = step.ttl
    if step.ramp_failed:
        return f"BREAKS: {step.ramp_failed}"
    reasons = []
    if step.lost:
        reasons.append(f"{step.lost} leases lost")
    p99 = _quantile(step.lags, 0.99)
    if p99 is not None and p99 > ttl / 3:
        reasons.append(f"renewal lag p99 {p99:.1f} s > TTL/3")
    return "BREAKS: " + ", ".join(reasons) if reasons else "ok"


def _report(results: dict[str, list[Step]], args, *, summary: bool = True) -> str:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    lines = [
        f"\nsustained admission: {args.batch} leases per holder, {args.rate:g} new requests/s, {args.kill} holders "
        f"killed per step; dev server, the singleton's worker and the holders' worker on {cpus} CPUs (shared with "
        f"other work: noisy)",
    ]
    header = (f"{'held':>7} {'holders':>7} {'wft/s':>6} {'sig in/s':>8} {'sig out/s':>9} {'events/s':>8} "
              f"{'CAN/min':>7} {'lag p50':>7} {'lag p99':>7} {'sgl p99':>7} {'new p99':>7} {'x base':>6} {'lost':>5} "
              f"{'dead max':>8} {'wft err':>7} {'cpu sgl':>7} {'req':>5} {'srv':>5}  verdict")
    lines_out: list[str] = []
    for design, steps in results.items():
        ttl = steps[0].ttl
        window = max((step.end - step.start for step in steps), default=0)
        lines += ["", f"design {design}: {DESIGNS[design]}",
                  f"TTL {ttl:g} s (renewal due every {ttl / 3:g} s), {window:.0f} s measured per step", header, "-" * len(header)]
        base = _quantile([probe.latency for probe in steps[0].probes], 0.99)
        last_ok = None
        breaks = None
        for step in steps:
            measured = step.end > step.start
            span = max(1e-9, step.end - step.start)
            p50, p99 = _quantile(step.lags, 0.5), _quantile(step.lags, 0.99)
            singleton_p99 = _quantile(step.singleton_lags, 0.99)
            probe = _quantile([p.latency for p in step.probes], 0.99)
            verdict = _verdict(step)
            dead = max(step.recoveries) if step.recoveries else None

            def rate(count: int) -> str:
                return f"{count / span:.1f}" if measured else "-"

            def share(cpu: float | None) -> str:
                return f"{cpu / span:.0%}" if measured and cpu is not None else "-"

            def figure(value: float | None) -> str:
                return f"{value:.2f}" if value is not None else "-"

            lines.append(
                f"{step.held:>7} {step.holders:>7} {rate(step.tasks):>6} {rate(step.signals_in):>8} "
                f"{rate(step.signals_out):>9} {rate(step.events):>8} {rate(step.runs_started * 60):>7} "
                f"{figure(p50):>7} {figure(p99):>7} {figure(singleton_p99):>7} {figure(probe):>7} "
                f"{figure(probe / base) if probe is not None and base else '-':>6} {step.lost:>5} {figure(dead):>8} "
                f"{step.task_failures:>7} {share(step.worker_cpu):>7} {share(step.holders_cpu):>5} {share(step.server_cpu):>5}  {verdict}"
            )
            if step.held and verdict == "ok" and breaks is None:
                last_ok = step.held
            if verdict != "ok" and breaks is None:
                breaks = step.held
            lines_out.append(
                f"RESULT design={design} held={step.held} measured={int(measured)} lost={step.lost} "
                f"renewals={len(step.lags)} lag_p50={p50 if p50 is not None else 'none'} "
                f"lag_p99={p99 if p99 is not None else 'none'} new_p99={probe if probe is not None else 'none'} "
                f"probes={len(step.probes)} renew_signals={step.renew_signals} signals_out={step.signals_out} "
                f"dead_max={dead if dead is not None else 'none'} "
                f"verdict={verdict.split(':')[0]}"
            )
        lines.append(f"{design}: held {last_ok or 0} leases without breaking"
                     + (f"; breaks at {breaks}" if breaks is not None else "; did not break in the steps run"))
    lines.append(
        "\ncolumns: per second of the measured window, from the singleton's histories: workflow tasks completed, "
        "signals in and out, history events; CAN/min = runs of its continue-as-new chain begun; lag = a renewal's "
        "due time -> the start of the singleton's workflow task that decided it (s), sgl = its arrival -> that task "
        "(the singleton's own share); new p99 = a new request's submit -> its decision in hand (s), 'x base' against "
        "the step at 0 leases; lost = leases that stopped being held while their holder lived; dead max = seconds "
        "from terminating a holder (it never gives its leases back) until every lease it held had ended, the "
        "slowest of the step's (inf: still held when the run ended); wft err = the singleton's workflow tasks that failed or timed out (each costs a replay of its run); cpu = of one core: "
        "the singleton's worker process (sgl), the holders' worker process (req), the dev server (srv)"
    )
    return "\n".join(lines + ([""] + lines_out if summary else []))


if __name__ == "__main__":
    # Re-import under the package name, so the worker can name this module to the workflow sandbox.
    from bench import admission_sustained

    sys.exit(admission_sustained.main())
