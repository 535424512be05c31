"""Mission fan-out: 100 one-shot children through the whole stack vs. 100 no-op child workflows.

    .venv/bin/python -m bench.mission_fanout [--children 100] [--rounds 3]

One process, one dev server, one worker. The ceiling is one parent workflow that
starts N no-op child workflows and waits for them: the least a fan-out of N costs
on this server. The mission does everything for real: planning, one admission
batch, N WorkloadWorkflows each admitting a fleet record over HTTP, dispatching an
A2A task, a local process running, and the observations folded into the ledger.
Children run `date +%s.%N` (as trivial as `true`, and it says when its task ran),
so "mission start to task running" is measured from the children's own clocks.
Figures are medians over rounds (which of the two goes first alternates), printed as
ratios (these machines are noisy). Where each run's CPU went is read from /proc (Linux): the
worker (this process), the dev server, and the substrate with the commands it ran and reaped.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path


from worker.payloads import DATA_CONVERTER
from temporalio.testing import WorkflowEnvironment

from activities.fleet import FleetActivities
from substrate.server import spawn
from worker.binaries import temporal_cli
from worker.config import WorkerConfig
from worker.mission_control import MissionControl, parse_spec
from worker.process import exit_now
from worker.worker import build_worker
from workflows.admission.model import AdmissionPolicy
from workflows.mission.search import SEARCH_ATTRIBUTES

from bench.fanout_workflows import FanoutParent, NoopChild
from bench.procstat import cpu_seconds, dev_server_pid


class CpuMeter:
    """User + system CPU seconds of the three processes a run spends, from /proc/<pid>/stat."""

    NAMES = ("worker", "dev server", "substrate")

    def __init__(self, substrate_pid: int) -> None:
        # (pid, with the children it reaped): the substrate's commands count as its own.
        self._processes = ((os.getpid(), False), (dev_server_pid(), False), (substrate_pid, True))

    def read(self) -> tuple[float, ...]:
        return tuple(_or_nan(cpu_seconds(pid, reaped=reaped)) for pid, reaped in self._processes)


def _or_nan(seconds: float | None) -> float:
    return float("nan") if seconds is None else seconds


async def measured(meter: CpuMeter | None, run) -> tuple[object, tuple[float, ...] | None]:
    """`run()`'s result and the CPU each process spent on it, counting what the server still does
    for it in the next 0.2 s (closing histories, visibility)."""
    before = meter.read() if meter else None
    result = await run()
    if meter is None:
        return result, None
    await asyncio.sleep(0.2)
    return result, tuple(after - start for after, start in zip(meter.read(), before))


async def ceiling(client, task_queue: str, children: int, tag: str) -> float:
    started = time.perf_counter()
    await client.execute_workflow(FanoutParent.run, children, id=f"fanout-{tag}", task_queue=task_queue,
                                  execution_timeout=timedelta(minutes=10))
    return time.perf_counter() - started


async def mission(control: MissionControl, children: int, tag: str) -> tuple[float, list[float]]:
    spec = parse_spec({
        "mission_id": f"fanout-{tag}", "orchestrator_id": "bench", "goal": "fan-out benchmark",
        # One host group for every round: its admission singleton is long-lived, as in production.
        "host_group": "bench", "require_distinct_targets": False,
        "children": [
            {"child_id": f"c{i:03d}", "kind": "one-shot-command", "prompt": "date +%s.%N"} for i in range(children)
        ],
    })
    started_wall = time.time()
    started = time.perf_counter()
    await control.start(spec)
    ledger = await control.handle(spec.mission_id).result()
    elapsed = time.perf_counter() - started
    if ledger.parent_state != "completed":
        raise SystemExit(f"mission {spec.mission_id} ended {ledger.parent_state}: {ledger.aggregation.reason}")
    to_running = [float(child.output.strip()) - started_wall for child in ledger.children]
    return elapsed, to_running


async def main(children: int, rounds: int) -> None:
    fleet_token, executor_token = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory() as scratch:
        env = await WorkflowEnvironment.start_local(
            data_converter=DATA_CONVERTER, dev_server_existing_path=temporal_cli(),
            search_attributes=SEARCH_ATTRIBUTES, ui=False,
        )
        try:
            # Its own process, as in production: the worker should not share a GIL with the substrate.
            with spawn(Path(scratch) / "substrate", fleet_token, executor_token, instances=8) as substrate:
                fleet = FleetActivities(substrate.base_url, substrate.base_url, fleet_token, executor_token)
                config = WorkerConfig(
                    data_dir=Path(scratch), task_queue="bench",
                    admission_policy=AdmissionPolicy(max_concurrent=children, runtime_quotas={"host": children}),
                    fleet_url=substrate.base_url, executor_url=substrate.base_url,
                )
                async with build_worker(env.client, config, fleet=fleet, extra_workflows=[NoopChild, FanoutParent],
                                        max_concurrent_activities=200):
                    control = MissionControl(env.client, "bench")
                    meter = CpuMeter(substrate.process.pid) if Path("/proc/self/stat").exists() else None
                    await ceiling(env.client, "bench", 10, "warmup")
                    await mission(control, 10, "warmup")
                    ceilings, missions, to_running = [], [], []
                    cpu: dict[str, list[tuple[float, ...]]] = {"ceiling": [], "mission": []}

                    async def run_mission(tag: str) -> None:
                        (elapsed, running), used = await measured(meter, lambda: mission(control, children, tag))
                        missions.append(elapsed)
                        to_running.extend(running)
                        cpu["mission"].append(used)

                    for round_ in range(rounds):
                        # Alternate which goes first: whatever one run leaves the server doing
                        # (closing histories, visibility) then slows each side equally often.
                        if round_ % 2:
                            await run_mission(f"r{round_}")
                        elapsed, used = await measured(meter, lambda: ceiling(env.client, "bench", children, f"r{round_}"))
                        ceilings.append(elapsed)
                        cpu["ceiling"].append(used)
                        if not round_ % 2:
                            await run_mission(f"r{round_}")
                        print(f"round {round_ + 1}: ceiling {ceilings[-1]:.2f} s, mission {missions[-1]:.2f} s", flush=True)
                await fleet.aclose()
        finally:
            await env.shutdown()
    c, m = statistics.median(ceilings), statistics.median(missions)
    print()
    print(f"{'children':<34}{children}")
    print(f"{'ceiling: parent + no-op children':<34}{c:.2f} s (median of {rounds})")
    print(f"{'mission through the whole stack':<34}{m:.2f} s (median of {rounds})")
    print(f"{'ratio mission / ceiling':<34}{m / c:.2f}x (target <= 2x)")
    paired = sorted(mission_s / ceiling_s for ceiling_s, mission_s in zip(ceilings, missions))
    print(f"{'  per round (back to back)':<34}" + ", ".join(f"{r:.2f}x" for r in paired)
          + f"; median {statistics.median(paired):.2f}x")
    print(f"{'mission start -> task running':<34}median {statistics.median(to_running):.2f} s, "
          f"p90 {statistics.quantiles(to_running, n=10)[-1]:.2f} s")
    if meter is not None:
        print(f"{'CPU per run (median), seconds':<34}" + "".join(f"{name:>12}" for name in (*CpuMeter.NAMES, "total")))
        for side, runs in cpu.items():
            columns = [statistics.median(run[i] for run in runs) for i in range(len(CpuMeter.NAMES))]
            print(f"{'  ' + side:<34}" + "".join(f"{value:>12.2f}" for value in (*columns, sum(columns))))
    print(f"RESULT children={children} ceiling_s={c:.2f} mission_s={m:.2f} ratio={m / c:.2f} "
          f"start_to_running_median_s={statistics.median(to_running):.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--children", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    asyncio.run(main(options.children, options.rounds))
    exit_now(0)
