"""Admission engine cost per operation at 1,000 / 10,000 / 100,000 queued requests.

    .venv/bin/python -m bench.admission_engine [--ops 2000] [--features-only] [--gang-placement shared|random]

The same mixed workload (submit, renew, release, cancel, reconcile) runs on the
engine and, at 1,000 queued, on the reference implementation of the tests
(a full sort of the queue on every decision: obviously correct, O(n log n) per
operation). Both run in this process, so the printed ratios are what matters on a
noisy machine: engine vs reference at the same size, and the engine's growth
from 1,000 to 100,000 queued. Targets: under 100 µs per operation at 100,000
queued, and the cost at 100,000 at most 3x the cost at 1,000.

A second configuration runs the same workload with every later rule on: fair share
between orchestrators (weights for a few, a default for the rest), ADR-004 bounded
requeue with a lease short enough to expire during the run (and a startup p95 below
it), and one request in seven a member of a gang of three whose leases run out together
mid-run, so gangs are admitted in the measured window. Its target is the same: under 100 µs
per operation at 100,000 queued.

A third configuration puts amounts on (issue 37): the host group offers 16 GPUs and 256 GiB of
memory, a third of the requests ask 1, 2 or 4 GPUs and a third 4 to 32 GiB, each with an expected
duration, so big requests hold reservations and small ones backfill past them. Same target. Gang members share their mission's placement by default;
`--gang-placement random` gives every member its own, so every gang has a shape of its own
(the engine's worst case: a decision after a burst of freed places looks at every gang that
fits).
"""

from __future__ import annotations

import argparse
import random
from collections import Counter
import time
from datetime import datetime, timedelta, timezone


from tests.support import admission_reference as reference
from workflows.admission import engine
from workflows.admission.model import (
    AdmissionPolicy,
    AdmissionRequest,
    Cancel,
    FairShare,
    Reconcile,
    Release,
    Renew,
    Submit,
)

BASE = datetime(2026, 11, 1, tzinfo=timezone.utc)
ENVIRONMENTS = ("prod", "staging", "dev", "ci")
LANES = (None, None, "review", "build")
POLICY = AdmissionPolicy(
    max_concurrent=64,
    environment_quotas={"prod": 8, "staging": 16},
    runtime_quotas={"host": 16},
    lane_wip_limits={"review": 4, "build": 8},
    lease_ttl_seconds=3600,
    aging_interval_seconds=60,
)
FEATURES_POLICY = POLICY.model_copy(update={
    "lease_ttl_seconds": 1,  # the measured run spans ~10 s: leases expire and are requeued
    "startup_p95_seconds": 0.5,
    "max_requeue_attempts": 2,
    "fair_share": FairShare(weights={"mission-0": 4, "mission-1": 2, "mission-2": 2}, default_weight=1),
})


# How gang members are placed with every feature on: "shared" (a mission's children go where the
# first one goes, as missions do) or "random" (each member its own environment, provider, runtime
# and lane: every gang a shape of its own, the engine's worst case). Set by --gang-placement.
GANG_PLACEMENT = {"mode": "shared"}
_PLACEMENTS: dict[int, tuple] = {}


AMOUNTS_POLICY = POLICY.model_copy(update={"resource_capacity": {"gpu": 16, "memory_gib": 256}})


def _amounts(index: int, rng: random.Random) -> dict:
    kind = index % 3
    if kind == 0:
        return {"resources": {"gpu": rng.choice((1, 2, 4))}, "expected_duration_seconds": rng.randrange(60, 3600)}
    if kind == 1:
        return {"resources": {"memory_gib": rng.choice((4, 8, 16, 32))}, "expected_duration_seconds": rng.randrange(60, 3600)}
    return {}


def request(index: int, rng: random.Random, at: datetime, config: str = "plain") -> AdmissionRequest:
    amounts = _amounts(index, rng) if config == "amounts" else {}
    features = config == "features"
    gang = {}
    if features and index % 21 < 3:  # three consecutive requests of one mission form a gang
        gang = {"gang_id": f"gang-{index // 21}", "gang_size": 3}
    priority = rng.randrange(10)
    placement = (rng.choice(ENVIRONMENTS), rng.choice(("local", "cloud")), rng.choice(("container", "vm", "host")),
                 rng.choice(LANES))
    if gang:
        # Gangs wait until all members fit at once; at the top priority they get in when
        # expiring leases free several places in one decision.
        priority = 9
        if GANG_PLACEMENT["mode"] == "shared":
            placement = _PLACEMENTS.setdefault(index // 21, placement)
    environment, provider, runtime_kind, lane = placement
    return AdmissionRequest(
        request_id=f"req-{index:07d}", orchestrator_id=f"mission-{index // 21 if gang else index // 10}",
        environment=environment, provider=provider, runtime_kind=runtime_kind,
        priority=priority, submitted_at=at, queue_timeout_seconds=7 * 86400, lane=lane,
        **gang, **amounts,
    )


def fill(module, queued: int, rng: random.Random, config: str = "plain"):
    """A state with the admitted set full and `queued` requests waiting (built with the module itself)."""
    policy = {"plain": POLICY, "features": FEATURES_POLICY, "amounts": AMOUNTS_POLICY}[config]
    state = module.new_state(policy)
    at = BASE
    for index in range(queued + policy.max_concurrent):
        # With short leases the fill must not outlast them: it is packed into a second.
        at = BASE + (timedelta(microseconds=index * 5) if config == "features" else timedelta(milliseconds=index))
        state, _, _ = module.apply(state, Submit(request=request(index, rng, at, config)), at)
    return state, queued + policy.max_concurrent, at


def workload(count: int, first_index: int, start: datetime, rng: random.Random, admitted_ids: list[str],
             config: str = "plain"):
    """Mixed operations: submits, renewals, releases (each frees a slot), cancels, reconciles."""
    operations = []
    at = start
    next_index = first_index
    for step in range(count):
        at += timedelta(milliseconds=5)
        roll = rng.random()
        if roll < 0.35:
            operations.append((Submit(request=request(next_index, rng, at, config)), at))
            next_index += 1
        elif roll < 0.6 and admitted_ids:
            # With every feature on, half the first holders never renew: their leases run out
            # together mid-run, and the places freed at once let waiting gangs in.
            renewing = admitted_ids[: max(1, len(admitted_ids) // 2)] if config == "features" else admitted_ids
            operations.append((Renew(request_id=rng.choice(renewing)), at))
        elif roll < 0.75 and admitted_ids:
            operations.append((Release(request_id=admitted_ids.pop(rng.randrange(len(admitted_ids)))), at))
        elif roll < 0.9:
            operations.append((Cancel(request_id=f"req-{rng.randrange(first_index):07d}"), at))
        else:
            operations.append((Reconcile(), at))
    return operations


def admitted_of(module, state) -> list[str]:
    if module is engine:
        return sorted(state.admitted)
    return sorted(rid for rid, rec in state.records.items() if rec.state == "admitted")


def measure(module, queued: int, ops: int, seed: int, config: str = "plain") -> float:
    rng = random.Random(seed)
    state, next_index, at = fill(module, queued, rng, config)
    operations = workload(ops, next_index, at, random.Random(seed + 1), admitted_of(module, state), config)
    started = time.perf_counter()
    events: Counter[str] = Counter()
    for operation, moment in operations:
        state, result, emitted = module.apply(state, operation, moment)
        events.update(event.type if event.policy is None else f"{event.type}/{event.policy}" for event in emitted)
    elapsed = (time.perf_counter() - started) / len(operations) * 1e6
    if config != "plain":  # the events show what the configuration exercised
        shown = ", ".join(f"{name} {count}" for name, count in sorted(events.items()))
        print(f"{'':>8} events in the measured run: {shown}", flush=True)
    return elapsed


def main(ops: int, features_only: bool = False) -> None:
    sizes = (1_000, 10_000, 100_000)
    results = []
    if not features_only:
        print(f"{'queued':>8} {'engine µs/op':>13} {'reference µs/op':>16} {'reference/engine':>17}")
        engine_cost = {}
        for size in sizes:
            engine_cost[size] = measure(engine, size, ops, seed=size)
            # The reference re-sorts everything on every decision, so even building its 10,000-request
            # state takes tens of minutes: it runs at 1,000 only.
            ref = measure(reference, size, max(50, ops // 20), seed=size) if size <= 1_000 else None
            ref_text = f"{ref:16.1f} {ref / engine_cost[size]:16.1f}x" if ref else f"{'(skipped)':>16} {'':>17}"
            print(f"{size:>8} {engine_cost[size]:13.1f} {ref_text}", flush=True)
        growth = engine_cost[100_000] / engine_cost[1_000]
        print()
        print(f"engine at 100,000 queued: {engine_cost[100_000]:.1f} µs/op (target < 100)")
        print(f"growth 1,000 -> 100,000 queued: {growth:.2f}x (target <= 3x)")
        results.append(f"us_per_op_1k={engine_cost[1_000]:.1f} us_per_op_10k={engine_cost[10_000]:.1f} "
                       f"us_per_op_100k={engine_cost[100_000]:.1f} growth={growth:.2f}")
        print()
    print(f"every feature on (fair share, requeue with expiring leases, gangs of three, "
          f"{GANG_PLACEMENT['mode']} gang placement):")
    print(f"{'queued':>8} {'engine µs/op':>13}")
    featured = {}
    for size in sizes:
        featured[size] = measure(engine, size, ops, seed=size, config="features")
        print(f"{size:>8} {featured[size]:13.1f}", flush=True)
    print(f"engine at 100,000 queued, every feature on: {featured[100_000]:.1f} µs/op (target < 100)")
    results.append(f"features_us_per_op_1k={featured[1_000]:.1f} features_us_per_op_100k={featured[100_000]:.1f}")
    print()
    print("amounts on (16 GPUs, 256 GiB; two thirds of the requests ask some, with expected durations):")
    print(f"{'queued':>8} {'engine µs/op':>13}")
    amounts = {}
    for size in sizes:
        amounts[size] = measure(engine, size, ops, seed=size, config="amounts")
        print(f"{size:>8} {amounts[size]:13.1f}", flush=True)
    amount_growth = amounts[100_000] / amounts[1_000]
    print(f"engine at 100,000 queued, amounts on: {amounts[100_000]:.1f} µs/op (target < 100); "
          f"growth 1,000 -> 100,000: {amount_growth:.2f}x (target <= 3x)")
    results.append(f"amounts_us_per_op_1k={amounts[1_000]:.1f} amounts_us_per_op_100k={amounts[100_000]:.1f} "
                   f"amounts_growth={amount_growth:.2f}")
    print(f"RESULT {' '.join(results)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--features-only", action="store_true", help="only the configuration with every feature on")
    parser.add_argument("--gang-placement", choices=("shared", "random"), default="shared",
                        help="gang members share one placement (default) or each draws its own (worst case)")
    arguments = parser.parse_args()
    GANG_PLACEMENT["mode"] = arguments.gang_placement
    main(arguments.ops, arguments.features_only)
