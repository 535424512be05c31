"""Folding a batch into a mission ledger: one aggregation per batch vs. one per change.

    .venv/bin/python -m bench.ledger_fold [--children 100 1000] [--rounds 5]

What a mission does in the workflow task that starts its children: fold one admission decision
per child, then list one attempt per child, then (as they end) one observation per child. The
baseline folds every change with a call of its own (`apply_admission`, `start_attempt`,
`apply_observation`), each re-aggregating the whole ledger: O(n) a change, O(n^2) a batch, as the
workflow did before it folded batches. The batch is one call of `apply_admissions`,
`start_attempts` and `apply_observations`. Both give the same ledger (checked here, and by
`tests/engine/test_mission_aggregation.py`). Figures are medians over
rounds, printed as ratios against the baseline run in the same process.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timezone


from workflows.mission import aggregation
from workflows.mission.aggregation import AttemptStart
from workflows.mission.ledger import ChildAdmission, MissionLedger
from workflows.mission.observation import ChildObservation
from workflows.mission.spec import MissionSpec

AT = datetime(2026, 12, 3, tzinfo=timezone.utc)


def spec_of(children: int) -> MissionSpec:
    return MissionSpec(
        mission_id="fold", orchestrator_id="bench", goal="fold benchmark",
        aggregation={"mode": "quorum", "minimum_successes": children},
        children=[{"child_id": f"c{i:04d}", "kind": "one-shot-command", "prompt": "date"} for i in range(children)],
    )  # fmt: skip


Fold = Callable[[MissionLedger], MissionLedger]


def phases(spec: MissionSpec) -> list[tuple[str, Fold, Fold]]:
    """(phase, one call per change, one call for the batch), in the order the workflow folds them."""
    ids = [child.child_id for child in spec.children]
    decisions = [(c, ChildAdmission(request_id=f"r-{c}", state="admitted", lease_revision=1, revision=1), None) for c in ids]
    starts = [AttemptStart(c, 1, f"r-{c}", 1) for c in ids]
    ended = [
        ChildObservation(child_id=c, kind="one-shot-command", revision=4, observed_state="succeeded", observed_at=AT, output="1")
        for c in ids
    ]

    def each(apply: Callable[[MissionLedger, object], MissionLedger], items: list) -> Fold:
        def fold(ledger: MissionLedger) -> MissionLedger:
            for item in items:
                ledger = apply(ledger, item)
            return ledger

        return fold

    return [
        ("admissions", each(lambda ledger, d: aggregation.apply_admission(ledger, *d), decisions),
         lambda ledger: aggregation.apply_admissions(ledger, decisions)),
        ("starts", each(lambda ledger, s: aggregation.start_attempt(
            ledger, s.child_id, attempt=s.attempt, request_id=s.request_id, lease_revision=s.lease_revision), starts),
         lambda ledger: aggregation.start_attempts(ledger, starts)),
        ("observations", each(lambda ledger, o: aggregation.apply_observation(ledger, spec, o), ended),
         lambda ledger: aggregation.apply_observations(ledger, spec, ended)),
    ]  # fmt: skip


def timed(spec: MissionSpec, batched: bool) -> tuple[dict[str, float], MissionLedger]:
    ledger = aggregation.initial_ledger(spec)
    seconds: dict[str, float] = {}
    for phase, one_by_one, batch in phases(spec):
        started = time.perf_counter()
        ledger = (batch if batched else one_by_one)(ledger)
        seconds[phase] = time.perf_counter() - started
    return seconds, ledger


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--children", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    for children in args.children:
        spec = spec_of(children)
        base: dict[str, list[float]] = {}
        batch: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            base_times, base_ledger = timed(spec, batched=False)
            batch_times, batch_ledger = timed(spec, batched=True)
            assert batch_ledger == base_ledger, "the batch fold gave another ledger"
            for phase in base_times:
                base.setdefault(phase, []).append(base_times[phase])
                batch.setdefault(phase, []).append(batch_times[phase])
        print(f"{children} children (median of {args.rounds})    one by one      batch    batch / one by one")
        for phase in base:
            b, n = statistics.median(base[phase]), statistics.median(batch[phase])
            print(f"  {phase:<26} {b * 1e3:9.1f} ms {n * 1e3:8.1f} ms    {n / b:.3f}x")
        total_base = sum(statistics.median(v) for v in base.values())
        total_batch = sum(statistics.median(v) for v in batch.values())
        print(f"  {'all three':<26} {total_base * 1e3:9.1f} ms {total_batch * 1e3:8.1f} ms    {total_batch / total_base:.3f}x")
        print(f"RESULT children={children} one_by_one_ms={total_base * 1e3:.1f} batch_ms={total_batch * 1e3:.1f} "
              f"ratio={total_batch / total_base:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
