"""How good a queued request's ETA is: its first predicted start against when it actually started.

    .venv/bin/python -m bench.admission_eta [--requests 400] [--seed 7] [--depth 32]

A generated trace runs through the admission engine with a simulated clock: requests arrive
(Poisson, one priority, FIFO, about 75% of the GPUs offered) asking 1, 2, 4 or 8 of 8 GPUs and
4 or 8 GiB of 64 per GPU, each declaring an expected duration of 30 s to 10 min, and every admitted lease is released when its workload
ends. Each request's first ETA is the one it got when it was submitted (`engine.forecast` right
after the submit, what its requester hears in its first decision; the admission time itself when
admitted at once).

Twice: once with every workload lasting exactly what it declared (the ETA should then be exact:
the first ETA of every request equals its start), once with each lasting its declared duration
times a factor drawn uniformly from 0.8 to 1.2 (the median and p90 error of the first ETAs). As
the baseline, in the same runs, the estimate a scheduler without a forecast gives: now plus
the sum of the declared durations of everything ahead in the queue, spread over the GPUs
(position times mean work, as `squeue --start`-like estimates do); printed as the ratio of its
errors to the forecast's.
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
from datetime import datetime, timedelta, timezone

from workflows.admission import engine
from workflows.admission.model import AdmissionPolicy, AdmissionRequest, Release, Submit

BASE = datetime(2026, 12, 6, 9, 0, tzinfo=timezone.utc)
GPUS, MEMORY = 8, 64
LOAD = 0.75


def trace(count: int, seed: int) -> list[tuple[float, dict, float]]:
    """(arrival second, resources, declared duration): offered load about 75% of the GPUs, memory
    in proportion (8 GiB a GPU, sometimes half)."""
    rng = random.Random(seed)
    clock = 0.0
    out = []
    for _ in range(count):
        gpus = rng.choice((1, 1, 2, 2, 4, 8))
        duration = float(rng.randrange(30, 600))
        clock += rng.expovariate(1 / (gpus * duration / GPUS / LOAD))
        out.append((round(clock, 3), {"gpu": gpus, "memory_gib": gpus * rng.choice((4, 8))}, duration))
    return out


def run(requests: list[tuple[float, dict, float]], spread: float, seed: int, depth: int) -> dict[str, tuple]:
    """request id -> (first ETA error s or None, naive error s, waited s), every workload lasting
    its declared duration times U(1 - spread, 1 + spread)."""
    rng = random.Random(seed)
    # Leases as long as a day: the holders here do not renew (in a host group they do, every TTL/3).
    policy = AdmissionPolicy(max_concurrent=1000, runtime_quotas={"container": 1000}, reservation_depth=depth,
                             resource_capacity={"gpu": GPUS, "memory_gib": MEMORY}, lease_ttl_seconds=86_400)
    state = engine.new_state(policy)
    first: dict[str, datetime | None] = {}
    naive: dict[str, datetime] = {}
    submitted: dict[str, datetime] = {}
    started: dict[str, datetime] = {}
    actual = {f"r{i:04d}": duration * rng.uniform(1 - spread, 1 + spread) for i, (_, _, duration) in enumerate(requests)}
    arrivals = [(BASE + timedelta(seconds=second), f"r{i:04d}", resources, duration)
                for i, (second, resources, duration) in enumerate(requests)]
    arrivals.reverse()
    ends: list[tuple[datetime, str]] = []
    while arrivals or ends:
        if ends and (not arrivals or ends[0][0] <= arrivals[-1][0]):
            moment, request_id = heapq.heappop(ends)
            state, _, events = engine.apply(state, Release(request_id=request_id), moment)
        else:
            moment, request_id, resources, duration = arrivals.pop()
            ahead = sum(rec.request.expected_duration_seconds * rec.amounts[0][1] / 1000
                        for rec in engine.queued_in_order(state))
            naive[request_id] = moment + timedelta(seconds=ahead / GPUS)
            state, result, events = engine.apply(state, Submit(request=AdmissionRequest(
                request_id=request_id, orchestrator_id="bench", environment="e", provider="p",
                runtime_kind="container", priority=0, queue_timeout_seconds=86_400, submitted_at=moment,
                resources=resources, expected_duration_seconds=duration,
            )), moment)
            submitted[request_id] = moment
            first[request_id] = (moment if result.record.state == "admitted"
                                 else engine.forecast(state, [request_id])[request_id])
        for event in events:
            if event.type == "admitted":
                started[event.request_id] = moment
                heapq.heappush(ends, (moment + timedelta(seconds=actual[event.request_id]), event.request_id))
    return {
        rid: (None if first[rid] is None else abs((first[rid] - started[rid]).total_seconds()),
              abs((naive[rid] - started[rid]).total_seconds()), (started[rid] - submitted[rid]).total_seconds())
        for rid in started
    }


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(count: int, seed: int, depth: int) -> None:
    requests = trace(count, seed)
    print(f"{count} requests, 8 GPUs / 64 GiB, reservation_depth {depth}")
    exact = run(requests, 0.0, seed, depth)
    hits = sum(1 for error, _naive, _waited in exact.values() if error == 0)
    waited = [w for _e, _n, w in exact.values()]
    print(f"durations hold: first ETA == actual start for {hits}/{len(exact)} requests "
          f"(median wait {statistics.median(waited):.0f} s, max {max(waited):.0f} s)")
    varied = run(requests, 0.2, seed, depth)
    errors = [e for e, _n, _w in varied.values() if e is not None]
    naive = [n for _e, n, _w in varied.values()]
    unknown = sum(1 for e, _n, _w in varied.values() if e is None)
    median, p90 = statistics.median(errors), quantile(errors, 0.9)
    naive_median, naive_p90 = statistics.median(naive), quantile(naive, 0.9)
    print(f"durations vary ±20%: first-ETA error median {median:.1f} s, p90 {p90:.1f} s ({unknown} without an ETA)")
    print(f"  baseline (queue work / GPUs): median {naive_median:.1f} s, p90 {naive_p90:.1f} s; "
          f"baseline/forecast: median {naive_median / max(median, 1e-9):.1f}x, p90 {naive_p90 / max(p90, 1e-9):.1f}x")
    print(f"RESULT exact={hits}/{len(exact)} median_error_s={median:.1f} p90_error_s={p90:.1f} "
          f"baseline_median_s={naive_median:.1f} baseline_p90_s={naive_p90:.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--depth", type=int, default=AdmissionPolicy.model_fields["reservation_depth"].default)
    arguments = parser.parse_args()
    main(arguments.requests, arguments.seed, arguments.depth)
