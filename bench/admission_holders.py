"""Holders on a host group (docs/admission-api.md): what `conductor admission run` adds before the
command runs, and how fast clients that are not workflows are admitted next to workflow requesters.

    .venv/bin/python -m bench.admission_holders [--runs 20] [--n 100] [--concurrency 20]

1. Wrapper latency on an idle host group: from spawning `conductor admission run -- sh -c ...` to
   the command running (it writes the time it started), median and p99, against the same `sh -c`
   spawned directly (the baseline, same process, same machine minute). The in-process half
   (`worker.lease.acquire`: start the holder workflow, hear the admission in its history) is
   printed too, to tell it from the CLI's own start (importing Python, the SDK, connecting).
2. Admissions per second: N holder requests (acquire + release, `--concurrency` at a time) against
   N workflow requesters (AdmissionProbeWorkflow: submit, hold nothing, give back), on one dev
   server with Temporal's default dynamic config and one host group whose quotas never bind,
   interleaved rounds. `--in-flight-updates N` raises the server's `history.maxInFlightUpdates`
   (0, the default, keeps Temporal's 10): holders use no updates, so it should change nothing.

Figures are ratios against the baseline measured in the same run (these machines are noisy).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path


from temporalio.testing import WorkflowEnvironment

from activities.admission import set_policy_with_start
from worker.binaries import temporal_cli
from worker.config import WorkerConfig
from worker.lease import acquire
from worker.payloads import DATA_CONVERTER
from worker.worker import build_worker
from workflows.admission.holders import HeldRequest
from workflows.admission.messages import PolicyChange
from workflows.admission.model import AdmissionPolicy
from workflows.admission.probe import AdmissionProbeWorkflow, ProbeInput, ProbeRequest, ProbeResult
from workflows.mission.search import SEARCH_ATTRIBUTES

CONDUCTOR = [sys.executable, "-c", "from worker.cli import main; main()"]
HOST_GROUP = "bench-holders"


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


async def started_after(command: list[str], env: dict[str, str], stamp: Path) -> float:
    """Seconds from spawning `command` to the time its `sh -c` wrote into `stamp`."""
    stamp.unlink(missing_ok=True)
    began = time.time()
    process = await asyncio.create_subprocess_exec(*command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if await process.wait() != 0:
        raise RuntimeError(f"{command[:4]} failed with {process.returncode}")
    return float(stamp.read_text()) - began


async def wrapper_latency(client, runs: int, scratch: Path) -> None:
    env = {**os.environ, "TEMPORAL_ADDRESS": client.service_client.config.target_host, "TEMPORAL_NAMESPACE": "default"}
    stamp = scratch / "started"
    inner = ["sh", "-c", f"date +%s.%N > {stamp}"]
    wrapped, direct, updates = [], [], []
    for i in range(runs):  # interleaved: both see the same moment of the machine
        direct.append(await started_after(inner, env, stamp))
        wrapped.append(await started_after([*CONDUCTOR, "admission", "run", "--host-group", HOST_GROUP, "--", *inner], env, stamp))
        began = time.perf_counter()
        lease = await acquire(client, HOST_GROUP, HeldRequest(request_id=f"lat-{i}", orchestrator_id="bench"), holder="bench")
        updates.append(time.perf_counter() - began)
        await lease.give_back()
    base = statistics.median(direct)
    print(f"wrapper latency over {runs} runs (spawn to the command running):")
    print(f"  direct sh -c (baseline):        median {base * 1000:7.1f} ms, p99 {percentile(direct, 0.99) * 1000:7.1f} ms")
    print(f"  conductor admission run:        median {statistics.median(wrapped) * 1000:7.1f} ms, "
          f"p99 {percentile(wrapped, 0.99) * 1000:7.1f} ms  ({statistics.median(wrapped) / base:.1f}x the baseline)")
    print(f"  of which worker.lease.acquire:  median {statistics.median(updates) * 1000:7.1f} ms, "
          f"p99 {percentile(updates, 0.99) * 1000:7.1f} ms")


async def holders_per_second(client, n: int, concurrency: int, tag: str) -> float:
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with gate:
            lease = await acquire(client, HOST_GROUP, HeldRequest(request_id=f"{tag}-{i}", orchestrator_id="bench"),
                                  holder=f"bench-{i % concurrency}")
            await lease.give_back()

    began = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return n / (time.perf_counter() - began)


async def workflows_per_second(client, task_queue: str, n: int, tag: str) -> float:
    began = time.perf_counter()
    handles = [
        await client.start_workflow(
            "AdmissionProbeWorkflow",
            ProbeInput(host_group=HOST_GROUP, requests=[ProbeRequest(request_id=f"{tag}-{i}", runtime_kind="host")], renew=False),
            id=f"bench-probe-{tag}-{i}", task_queue=task_queue, result_type=ProbeResult,
        )
        for i in range(n)
    ]
    results = await asyncio.gather(*(handle.result() for handle in handles))
    assert all(f"{tag}-{i}" in result.ever_admitted for i, result in enumerate(results))
    return n / (time.perf_counter() - began)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="wrapper latency samples (default 20)")
    parser.add_argument("--n", type=int, default=100, help="requests per admission-rate round (default 100)")
    parser.add_argument("--concurrency", type=int, default=20, help="holders in flight at once (default 20)")
    parser.add_argument("--in-flight-updates", type=int, default=0,
                        help="the server's history.maxInFlightUpdates (default 0: Temporal's own default of 10)")
    parser.add_argument("--rounds", type=int, default=3, help="admission-rate rounds, interleaved (default 3)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    limit = 100_000
    policy = AdmissionPolicy(max_concurrent=limit, runtime_quotas={"host": limit}, lease_ttl_seconds=600,
                             aging_interval_seconds=3600)
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli(), data_converter=DATA_CONVERTER, ui=False, dev_server_log_level="error",
        search_attributes=SEARCH_ATTRIBUTES,
        dev_server_extra_args=(
            ["--dynamic-config-value", f"history.maxInFlightUpdates={args.in_flight_updates}"] if args.in_flight_updates else []
        ),
    )
    try:
        with tempfile.TemporaryDirectory(prefix="holders-bench-") as scratch:
            config = WorkerConfig(data_dir=Path(scratch), task_queue=f"bench-{uuid.uuid4().hex[:8]}", admission_policy=policy)
            async with build_worker(env.client, config, extra_workflows=[AdmissionProbeWorkflow]):
                await set_policy_with_start(env.client, config.task_queue, HOST_GROUP, PolicyChange(operator="bench", policy=policy))
                await wrapper_latency(env.client, args.runs, Path(scratch))
                holders, workflows = [], []
                for round_ in range(args.rounds):
                    holders.append(await holders_per_second(env.client, args.n, args.concurrency, f"h{round_}"))
                    workflows.append(await workflows_per_second(env.client, config.task_queue, args.n, f"w{round_}"))
                h, w = statistics.median(holders), statistics.median(workflows)
                limit = args.in_flight_updates or "10 (Temporal's default)"
                print(f"admissions per second, {args.n} requests a round, median of {args.rounds} interleaved rounds, "
                      f"server's updates in flight per workflow {limit}:")
                print(f"  workflow requesters (baseline, AdmissionProbeWorkflow): {w:7.1f}/s  rounds {[round(x, 1) for x in workflows]}")
                print(f"  holders (acquire + release, {args.concurrency} in flight):  {h:7.1f}/s  rounds "
                      f"{[round(x, 1) for x in holders]}  ({h / w:.2f}x the baseline)")
    finally:
        await env.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
