"""What clients read of the state without changing it: the queue in order, a request's position and
what it waits on, usage, the next wake-up, a snapshot, and what would happen to a request.
"""

from __future__ import annotations


from workflows.admission.engine.capacity import (
    binding_constraint,
    fits_now,
    gang_blocker,
    waiting_on,
)
from workflows.admission.engine.forecast import MAX_STEPS, forecast
from workflows.admission.engine.order import effective_priority, order_key
from workflows.admission.engine.preemption import (
    lane_override_victim,
    preemption_victims,
)
from workflows.admission.engine.refusals import gang_refusal, never_runs
from workflows.admission.engine.state import (
    FAR_FUTURE_US,
    EngineState,
    OrderKey,
    QueueClass,
    Rec,
    gang_members,
    held_share,
)
from workflows.admission.messages import queue_place
from workflows.admission.model import (
    LANE_OVERRIDE_POLICY,
    AdmissionRequest,
    QueueEntry,
    Snapshot,
    amount_value,
)


def _all_queued(state: EngineState) -> list[Rec]:
    queued = [state.records[request_id] for queue_class in state.all_classes() for request_id in queue_class.members()]
    queued.extend(state.parked.values())
    return queued


def queued_in_order(state: EngineState) -> list[Rec]:
    queued = _all_queued(state)
    queued.sort(key=lambda rec: order_key(state, rec))
    return queued


def queue_view(state: EngineState, eta_moments: int = MAX_STEPS) -> list[QueueEntry]:
    """The queue in order, each entry with what it waits on and its predicted start (a forecast of
    the whole queue, of at most `eta_moments` moments; 0: none)."""
    constraints: dict[tuple, str] = {}
    etas = forecast(state, moments=eta_moments) if eta_moments else {}

    def constraint(rec: Rec) -> str:
        key = rec.gang if rec.gang is not None else rec.class_key
        text = constraints.get(key)  # type: ignore[arg-type]
        if text is None:
            text = constraints[key] = waiting_on(state, rec)  # type: ignore[index]
        return text

    return [
        QueueEntry(
            request_id=rec.request_id,
            position=position,
            effective_priority=effective_priority(state, rec),
            binding_constraint=constraint(rec),
            eta=etas.get(rec.request_id),
        )
        for position, rec in enumerate(queued_in_order(state), start=1)
    ]


def snapshot(state: EngineState) -> Snapshot:
    queue = queue_view(state)
    records = {request_id: rec.to_model() for request_id, rec in state.records.items()}
    for entry in queue:
        if entry.eta is not None:
            records[entry.request_id] = records[entry.request_id].model_copy(update={"eta": entry.eta})
    return Snapshot(revision=state.revision, records=records, queue=queue)


def queue_position(state: EngineState, rec: Rec) -> int:
    """1-based position of a queued request without sorting the queue.

    Inside a bucket the order key is monotone in bucket order (earlier submission
    never ages less), so a binary search per bucket counts who is ahead. With fair
    share, who is ahead at the same effective priority is counted per lease-holding
    orchestrator (see `_fair_ahead`).
    """
    target = order_key(state, rec)
    ahead = sum(1 for other in state.parked.values() if order_key(state, other) < target)
    for queue_class in state.all_classes():
        for priority, bucket in queue_class.buckets.items():
            if state.fair:
                ahead += _fair_ahead(state, queue_class, priority, target)
                continue
            low, high = 0, len(bucket)
            while low < high:
                middle = (low + high) // 2
                submitted_us, request_id = bucket[middle]
                effective = priority + max(0, state.now_us - submitted_us) // state.aging_us
                if (-effective, submitted_us, request_id) < target:
                    low = middle + 1
                else:
                    high = middle
            ahead += low
    return ahead + 1


def _fair_ahead(state: EngineState, queue_class: QueueClass, priority: int, target: OrderKey) -> int:
    """How many requests of one bucket come before `target` in fair-share order."""
    bucket = queue_class.buckets[priority]
    by = queue_class.by_orchestrator[priority]
    neg_effective, share, target_submitted, target_id = target
    steps = -neg_effective - priority  # the age steps a bucket member needs to tie with the target
    if steps < 0:
        return len(bucket)  # every member is at least `priority`, above the target
    now, aging = state.now_us, state.aging_us

    def submitted_at_most(moment: int) -> int:
        return bucket.bisect_left((moment + 1,))

    above = submitted_at_most(now - (steps + 1) * aging)  # strictly older steps: higher effective priority
    low_us = now - (steps + 1) * aging  # ties have submitted_us in (low_us, high_us]
    if steps == 0:
        high_us = FAR_FUTURE_US
        tied = len(bucket) - above
    else:
        high_us = now - steps * aging
        tied = submitted_at_most(high_us) - above
    if tied <= 0:
        return above
    before_target = min(max(bucket.bisect_left((target_submitted, target_id)) - above, 0), tied)
    holders_tied = holders_before = lower_share = 0
    for orchestrator in state.usage.orchestrator:
        first = by.bisect_left((orchestrator, low_us + 1))
        last = by.bisect_left((orchestrator, high_us + 1))
        if last <= first:
            continue
        count = last - first
        holders_tied += count
        earlier = min(max(by.bisect_left((orchestrator, target_submitted, target_id)) - first, 0), count)
        holders_before += earlier
        their_share = held_share(state, orchestrator)
        if their_share < share:
            lower_share += count
        elif their_share == share:
            lower_share += earlier
    if share == 0:
        return above + (before_target - holders_before)
    return above + (tied - holders_tied) + lower_share


def usage_view(state: EngineState) -> list[tuple[str, int | float, int | float | None]]:
    """(limit label, used, limit or None for unlimited) for every limit in the policy or in use,
    resources (amounts, as written) last."""
    policy, usage = state.policy, state.usage
    rows: list[tuple[str, int, int | None]] = [("global", usage.total, policy.max_concurrent)]
    for label, quotas, used in (
        ("environment", policy.environment_quotas, usage.environment),
        ("provider", policy.provider_quotas, usage.provider),
        ("lane", policy.lane_wip_limits, usage.lane),
    ):
        for name in sorted(set(quotas) | {key for key, count in used.items() if count}):
            rows.append((f"{label} {name}", used[name], quotas.get(name)))
    kinds = set(policy.runtime_quotas) | {"host"} | {key for key, count in usage.runtime.items() if count}
    for kind in sorted(kinds):
        rows.append((f"runtime {kind}", usage.runtime[kind], policy.runtime_limit(kind)))
    for name in sorted(set(state.capacity) | {name for name, used in usage.amounts.items() if used}):
        capacity = state.capacity.get(name)
        rows.append((f"resource {name}", amount_value(usage.amounts[name]), None if capacity is None else amount_value(capacity)))
    return rows


def what_if(state: EngineState, request: AdmissionRequest) -> tuple[str, str]:
    """(outcome, explanation) of submitting `request` now, without changing anything.

    After every operation no queued request fits, so a newcomer that fits would
    be admitted at once, and only the newcomer could preempt or displace.
    """
    existing = state.records.get(request.request_id)
    if existing is not None:
        if existing.request.placement_identity() != request.placement_identity():
            return "identity-collision", f"request {request.request_id} exists with another placement"
        return "replay", f"request {request.request_id} already exists: {existing.state}"
    rec = Rec(request)
    denial = never_runs(state.policy, rec.class_key)
    if rec.gang is not None:
        refusal = gang_refusal(state, request)
        if refusal is not None:
            return refusal.error.code, refusal.error.message  # type: ignore[union-attr]
        if denial is not None:
            return "denied", denial
        gang = state.gangs.get(rec.gang)
        members = ([] if gang is None else gang_members(state, gang)) + [rec]
        if len(members) < rec.gang_size:  # type: ignore[operator]
            return "queued", f"gang {rec.gang[1]} waiting for members {len(members)}/{rec.gang_size}"
        blocker = gang_blocker(state, sorted(members, key=lambda member: member.request_id))
        if blocker is None:
            return "admitted", f"completes gang {rec.gang[1]}, which fits every limit now"
        member, label, used, limit = blocker
        return "queued", f"gang {rec.gang[1]}: {member.request_id} needs {label} {used}/{limit}"
    if denial is not None:
        return "denied", denial
    if fits_now(state, rec.class_key):
        return "admitted", "fits every limit now"
    if state.policy.priority_admission.enabled:
        victim = lane_override_victim(state, rec)
        if victim is not None:
            return "admitted", f"would displace {victim.request_id} ({LANE_OVERRIDE_POLICY})"
    if state.policy.allow_preemption:
        victims = preemption_victims(state, rec)
        if victims:
            return "admitted", f"would preempt {', '.join(victim.request_id for victim in victims)}"
    ahead = queue_position(state, rec) if state.queued_count else 1
    return "queued", queue_place(ahead, binding_constraint(state, rec.class_key))
