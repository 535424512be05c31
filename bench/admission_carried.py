"""The continue-as-new input of a singleton holding N leases, in the carried format of before and now.

Run: `.venv/bin/python -m bench.admission_carried [--leases 20000,50000,100000,200000] [--shape all] [--amounts]`.
Not part of the test-suite (tests/engine/test_admission_carried_state.py asserts a bound at 100,000 leases).

Bytes are those of the JSON payload the pydantic data converter produces for the real
`AdmissionWorkflowInput` (what the server stores and limits to 2 MB; the Python SDK warns from
512 KB), built by `workflows.admission.singleton.SingletonState.carry` (now) and, as the baseline, by the
same state in format 2 with the requester map packed beside it and the last 200 audit events as
plain JSON (what runs carried before). Both
from one engine state in this process, so the ratio is exact: sizes, not timings, are not noisy.

The state is what a busy singleton holds: every request admitted, ten per requester, each
requester's batch submitted at one moment, submissions spread over a minute, and every lease
renewed once by its requester (requester renewals, a third of the TTL after admission), so lease
expiries differ between requesters as they do in a running singleton. Two id shapes:
  sustained: requesters `sustained-requester-<hex6>-holder-<k>`, request ids `<requester>/w<i>`,
             orchestrator = requester (bench/admission_sustained.py's holders);
  mission:   requesters `mission:<mission id>` with mission ids `mission-<uuid>`, request ids
             `<mission id>:child-<i>` (workflows.ids), one orchestrator id for all, placement from a
             few environments and priorities (workflows/mission/workflow.py's requests);
  mixed:     bench/admission_throughput.py's ids (`mission:<uuid>/w<i>`, orchestrator = requester),
             environment and priority drawn for every request: the most entropy per lease.
With --amounts every request also names resources (1, 2 or 4 GPUs and 8 or 16 GiB, or nothing)
and an expected duration of 5 to 60 minutes in whole minutes, as issue 37's requests do: what the
two columns they add cost a lease. Without it they are constant (none) and cost a few bytes in all.
"""

from __future__ import annotations

import sys


import argparse
import json
import random
import uuid
from collections import deque
from datetime import datetime, timedelta, timezone
from typing import NamedTuple

from pydantic import BaseModel

from workflows.admission import codec, engine
from workflows.admission.messages import AdmissionWorkflowInput, CarriedState
from workflows.admission.model import AdmissionPolicy, AdmissionRequest, AuditEvent, Extend, Submit

PER_REQUESTER = 10
SHAPES = ("sustained", "mission", "mixed")
BASE = datetime(2026, 12, 1, tzinfo=timezone.utc)
HOST_GROUP = "gpu-pool-eu-west-1"


class CarriedSize(BaseModel):
    leases: int
    shape: str
    before: int  # bytes of the input in format 2 (+ requesters_packed)
    now: int  # bytes of the input as SingletonState.carry builds it

    @property
    def ratio(self) -> float:
        return self.now / self.before


class Held(NamedTuple):
    state: engine.EngineState
    requesters: dict[str, str]  # request id -> requester workflow id, as the singleton keeps it
    recent: list[AuditEvent]  # the last audit events, as many as a run keeps by default


def _amounts(rng: random.Random) -> dict:
    resources = rng.choice(({}, {"gpu": 1}, {"gpu": 2}, {"gpu": 4, "memory_gib": 16}, {"memory_gib": 8}))
    return {"resources": resources, "expected_duration_seconds": 60 * rng.randrange(5, 61)}


def held_state(leases: int, shape: str, seed: int = 20_261_201, amounts: bool = False) -> Held:
    """An engine state with `leases` admitted requests, and what the singleton keeps beside it."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; expected one of {', '.join(SHAPES)}")
    rng = random.Random(seed)
    capacity = {"gpu": 4 * leases, "memory_gib": 16 * leases} if amounts else {}
    policy = AdmissionPolicy(max_concurrent=leases, lease_ttl_seconds=300, resource_capacity=capacity)
    state = engine.new_state(policy)
    requesters: dict[str, str] = {}
    recent: deque[AuditEvent] = deque(maxlen=AdmissionWorkflowInput.model_fields["recent_audit_events"].default)
    batches = -(-leases // PER_REQUESTER)
    admitted_at: dict[str, datetime] = {}
    for batch in range(batches):
        at = BASE + timedelta(microseconds=batch * 60_000_000 // batches + rng.randrange(1000))
        if shape == "sustained":
            requester = f"sustained-requester-{rng.getrandbits(24):06x}-holder-{batch:05d}"
            ids = [f"{requester}/w{i}" for i in range(PER_REQUESTER)]
            orchestrator, environment, priority = requester, "bench", 0
        elif shape == "mixed":
            requester = f"mission:{uuid.UUID(int=rng.getrandbits(128), version=4)}"
            ids = [f"{requester}/w{i}" for i in range(PER_REQUESTER)]
            orchestrator, environment, priority = requester, None, None
        else:
            mission = f"mission-{uuid.UUID(int=rng.getrandbits(128), version=4)}"
            requester = f"mission:{mission}"
            ids = [f"{mission}:child-{i:02d}" for i in range(PER_REQUESTER)]
            orchestrator, environment, priority = "mission-control", rng.choice(("prod", "staging", "dev")), rng.randrange(5)
        for request_id in ids[:leases - batch * PER_REQUESTER]:
            request = AdmissionRequest(
                request_id=request_id, orchestrator_id=orchestrator, provider="local", runtime_kind="container",
                environment=environment or rng.choice(("prod", "staging", "dev")),
                priority=rng.randrange(5) if priority is None else priority,
                submitted_at=at, queue_timeout_seconds=3600, **(_amounts(rng) if amounts else {}),
            )
            state, result, events = engine.apply(state, Submit(request=request), at)
            recent.extend(events)
            assert result.ok and result.record is not None and result.record.state == "admitted", result
            requesters[request_id] = requester
            admitted_at[request_id] = at
    # Every requester renews all it holds about a third of the TTL after its admission (its timer
    # fires on its own clock: up to a second late).
    now = BASE + timedelta(seconds=160)
    late = {requester: timedelta(microseconds=rng.randrange(1_000_000)) for requester in sorted(set(requesters.values()))}
    state, result, _ = engine.apply(state, Extend(renewals={
        rid: at + timedelta(seconds=100) + late[requesters[rid]] for rid, at in admitted_at.items()
    }), now)
    assert result.ok and len(state.admitted) == leases, (result, len(state.admitted))
    return Held(state, requesters, list(recent))


def input_bytes(carried: CarriedState, policy: AdmissionPolicy) -> int:
    from temporalio.contrib.pydantic import pydantic_data_converter

    shell = AdmissionWorkflowInput(host_group=HOST_GROUP, policy=policy, carried=carried)
    return len(pydantic_data_converter.payload_converter.to_payloads([shell])[0].data)


# Format 2's rows (the codec reads only format 3 now): the baseline, written here alone.
_ROW_REQUEST = ("request_id", "orchestrator_id", "environment", "provider", "runtime_kind", "priority",
                "queue_timeout_seconds", "preemptible", "lane", "priority_class")
_ROW_STATE = ("submitted_us", "state", "revision", "reason", "queue_deadline_us", "admitted_us",
              "lease_expires_us", "lease_revision", "finished_us", "preempted_by")


def format_2(state: engine.EngineState) -> str:
    rows = [
        [getattr(rec.request, name) for name in _ROW_REQUEST] + [getattr(rec, name) for name in _ROW_STATE]
        + [rec.request.gang_id, rec.request.gang_size, rec.requeue_attempts]
        for rec in state.records.values()
    ]
    return codec.pack_json({
        "format": 2, "policy": state.policy.model_dump(mode="json"), "now_us": state.now_us,
        "revision": state.revision, "rows": rows,
    })


def before_bytes(held: Held) -> int:
    """The input the carry built before format 3: format-2 rows, the requester map packed
    beside, the recent audit events as plain JSON (in the fields runs carried them in then)."""
    records = held.state.records
    now = AdmissionWorkflowInput(host_group=HOST_GROUP, policy=held.state.policy, carried=CarriedState(
        engine=format_2(held.state), audit_chain="run-1",
    )).model_dump(mode="json")
    now["carried"] |= {
        "requesters_packed": codec.pack_json({rid: who for rid, who in held.requesters.items() if rid in records}),
        "recent_audit": [event.model_dump(mode="json") for event in held.recent],
        "requesters": {}, "inbox": [],
    }
    return len(json.dumps(now, separators=(",", ":")).encode())


def now_carried(held: Held) -> CarriedState:
    from collections import deque

    from workflows.admission.singleton import SingletonState

    return SingletonState(
        host_group="bench", engine=held.state, requesters=held.requesters, audit_chain="run-1", recent=deque(held.recent),
    ).carry()


def measure(leases: int, shape: str, amounts: bool = False) -> CarriedSize:
    held = held_state(leases, shape, amounts=amounts)
    return CarriedSize(
        leases=leases, shape=shape,
        before=before_bytes(held),
        now=input_bytes(now_carried(held), held.state.policy),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--leases", default="20000,50000,100000,200000", help="held leases, comma-separated")
    parser.add_argument("--shape", default="all", choices=(*SHAPES, "all"))
    parser.add_argument("--amounts", action="store_true", help="every request names resources and a duration")
    args = parser.parse_args(argv)
    try:
        counts = [int(part) for part in args.leases.split(",")]
        if any(count < 1 for count in counts):
            raise ValueError
    except ValueError:
        print(f"admission_carried: --leases must be positive whole numbers, comma-separated (got {args.leases!r})",
              file=sys.stderr)
        return 2
    shapes = SHAPES if args.shape == "all" else (args.shape,)
    print(f"{'shape':<10} {'leases':>8} {'before B':>10} {'B/lease':>8} {'now B':>10} {'B/lease':>8} {'now/before':>10}")
    for shape in shapes:
        for count in counts:
            size = measure(count, shape, args.amounts)
            print(f"{shape:<10} {count:>8} {size.before:>10} {size.before / count:>8.2f} {size.now:>10} "
                  f"{size.now / count:>8.2f} {size.ratio:>10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
