"""What fits: the policy's limits a request's class counts against, what binds it, and whether a
class or a gang's shape fits now (optionally without some leases, for preemption).
"""

from __future__ import annotations

from collections import Counter

from workflows.admission.engine.order import order_key
from workflows.admission.engine.reservations import reserved_ahead
from workflows.admission.engine.state import (
    ClassKey,
    EngineState,
    Gang,
    Rec,
    Usage,
    gang_members,
    gang_ready,
)
from workflows.admission.model import AdmissionPolicy, amount_text


def class_limits_of(policy: AdmissionPolicy, key: ClassKey) -> list[tuple[str, str, int]]:
    """(kind, label, limit) for every quota (a count of leases) that applies to a class, in checking
    order. Amounts of named resources are checked after them (`_amount_blocker`)."""
    environment, provider, runtime_kind, lane = key[:4]
    limits = [("global", "global", policy.max_concurrent)]
    if environment in policy.environment_quotas:
        limits.append(("environment", f"environment {environment}", policy.environment_quotas[environment]))
    if provider in policy.provider_quotas:
        limits.append(("provider", f"provider {provider}", policy.provider_quotas[provider]))
    runtime_limit = policy.runtime_limit(runtime_kind)
    if runtime_limit is not None:
        limits.append(("runtime", f"runtime {runtime_kind}", runtime_limit))
    if lane is not None and lane in policy.lane_wip_limits:
        limits.append(("lane", f"lane {lane}", policy.lane_wip_limits[lane]))
    return limits


def _used(usage: Usage, kind: str, key: ClassKey) -> int:
    if kind == "global":
        return usage.total
    if kind == "environment":
        return usage.environment[key[0]]
    if kind == "provider":
        return usage.provider[key[1]]
    if kind == "runtime":
        return usage.runtime[key[2]]
    return usage.lane[key[3]]  # type: ignore[index]


def _shares(victim: Rec, kind: str, key: ClassKey) -> bool:
    """Whether removing `victim` frees a unit of the limit `kind` for class `key`."""
    if kind == "global":
        return True
    if kind == "environment":
        return victim.environment == key[0]
    if kind == "provider":
        return victim.provider == key[1]
    if kind == "runtime":
        return victim.runtime_kind == key[2]
    return victim.lane == key[3]


def _class_limits(state: EngineState, key: ClassKey) -> list[tuple[str, str, int]]:
    limits = state.limits_cache.get(key)
    if limits is None:
        limits = state.limits_cache[key] = class_limits_of(state.policy, key)
    return limits


def _amount_used(state: EngineState, name: str, without: tuple[Rec, ...] | list[Rec] = ()) -> int:
    used = state.usage.amounts[name]
    for victim in without:
        for victim_name, amount in victim.amounts:
            if victim_name == name:
                used -= amount
    return used


def _amount_blocker(
    state: EngineState, amounts: tuple, without: tuple[Rec, ...] | list[Rec] = (), placed: Counter[str] | None = None,
) -> tuple[str, str, str, str] | None:
    """("resource", "resource <name>", used, capacity) of the first resource, by name, that cannot
    take `amounts` now (amounts shown as written); None when all can."""
    capacity = state.capacity
    for name, asked in amounts:
        used = _amount_used(state, name, without) + (placed[name] if placed else 0)
        limit = capacity.get(name, 0)
        if used + asked > limit:
            return "resource", f"resource {name}", amount_text(used), amount_text(limit)
    return None


def _amounts_fit(
    state: EngineState, amounts: tuple, without: tuple[Rec, ...] | list[Rec] = (), placed: Counter[str] | None = None,
) -> bool:
    """`_amount_blocker(...) is None`, without building its text (the hot path of every decision)."""
    capacity = state.capacity
    for name, asked in amounts:
        used = _amount_used(state, name, without) if without else state.usage.amounts[name]
        if used + (placed[name] if placed else 0) + asked > capacity.get(name, 0):
            return False
    return True


def blocking_limits(state: EngineState, key: ClassKey, without: Rec | None = None) -> list[tuple[str, str, object, object]]:
    """Every limit a class would exceed now, as (kind, label, used, limit); empty if it fits.
    Quotas come first, then the first resource short of the amounts asked.

    `without` answers "would it fit if this admitted request were gone?"
    """
    blocked: list[tuple[str, str, object, object]] = []
    for kind, label, limit in _class_limits(state, key):
        used = _used(state.usage, kind, key)
        if without is not None and _shares(without, kind, key):
            used -= 1
        if used >= limit:
            blocked.append((kind, label, used, limit))
    if key[5]:
        short = _amount_blocker(state, key[5], () if without is None else (without,))
        if short is not None:
            blocked.append(short)
    return blocked


def fits_now(state: EngineState, key: ClassKey, without: tuple[Rec, ...] | list[Rec] = ()) -> bool:
    usage = state.usage
    for kind, _label, limit in _class_limits(state, key):
        used = _used(usage, kind, key)
        for victim in without:
            if _shares(victim, kind, key):
                used -= 1
        if used >= limit:
            return False
    return not key[5] or _amounts_fit(state, key[5], without)


def gang_blocker(
    state: EngineState, members: list[Rec], without: list[Rec] | tuple[Rec, ...] = (),
) -> tuple[Rec, str, object, object] | None:
    """(member, limit label, used, limit) of the first member, in request_id order, that does not
    fit once the members before it are placed; None when the whole gang fits at once."""
    placed: Counter[str] = Counter()
    amounts: Counter[str] = Counter()
    for member in members:
        key = member.class_key
        limits = _class_limits(state, key)
        for kind, label, limit in limits:
            used = _used(state.usage, kind, key) + placed[label]
            for victim in without:
                if _shares(victim, kind, key):
                    used -= 1
            if used >= limit:
                return member, label, used, limit
        short = _amount_blocker(state, member.amounts, without, amounts) if member.amounts else None
        if short is not None:
            return member, short[1], short[2], short[3]
        for _kind, label, _limit in limits:
            placed[label] += 1
        for name, amount in member.amounts:
            amounts[name] += amount
    return None


def shape_fits(state: EngineState, shape: tuple[ClassKey, ...]) -> bool:
    placed: Counter[str] = Counter()
    amounts: Counter[str] = Counter()
    for key in shape:
        limits = _class_limits(state, key)
        for kind, label, limit in limits:
            if _used(state.usage, kind, key) + placed[label] >= limit:
                return False
        if key[5] and not _amounts_fit(state, key[5], placed=amounts):
            return False
        for _kind, label, _limit in limits:
            placed[label] += 1
        for name, amount in key[5]:
            amounts[name] += amount
    return True


def fitting_gang_shapes(state: EngineState, free: int):
    """Every ready gang shape that fits at once. A gang fits only if each member fits alone and
    it has no more members than there are free places, so the walk down the shape trie stops at
    a member class that does not fit alone and below the depth of the free places: shapes with
    a member in a full class are never looked at."""
    alone: dict[ClassKey, bool] = {}
    stack = [(state.gang_trie, 0)]
    while stack:
        node, depth = stack.pop()
        if node.shape is not None and shape_fits(state, node.shape[1]):
            yield node.shape
        if depth >= free:
            continue
        for member_key, child in node.children.items():
            fits = alone.get(member_key)
            if fits is None:
                fits = alone[member_key] = fits_now(state, member_key)
            if fits:
                stack.append((child, depth + 1))


def binding_constraint(state: EngineState, key: ClassKey) -> str:
    blocked = blocking_limits(state, key)
    if not blocked:
        return "none"
    _kind, label, used, limit = blocked[0]
    return f"{label} {used}/{limit}"


def gang_constraint(state: EngineState, gang: Gang) -> str:
    members = gang_members(state, gang)
    if not gang_ready(gang, members):
        return f"gang {gang.gang_id} waiting for members {len(members)}/{gang.size}"
    blocker = gang_blocker(state, members)
    if blocker is None:
        return "none"
    member, label, used, limit = blocker
    return f"gang {gang.gang_id}: {member.request_id} needs {label} {used}/{limit}"


def waiting_on(state: EngineState, rec: Rec) -> str:
    """The binding constraint of one queued request, gang members included. One that fits every
    limit waits for a reservation ahead of it: `resource gpu reserved for big-1`. While the host
    group is held, everything waits on the hold: `hold: kernel upgrade`."""
    if state.policy.hold:
        return hold_text(state.policy)
    text = gang_constraint(state, state.gangs[rec.gang]) if rec.gang is not None else binding_constraint(state, rec.class_key)
    if text != "none" or not rec.amounts:
        return text
    reserved = reserved_ahead(state, order_key(state, rec), rec.amounts)
    return "none" if reserved is None else f"resource {reserved[0]} reserved for {reserved[1]}"


def hold_text(policy: AdmissionPolicy) -> str:
    return f"hold: {policy.hold_reason}" if policy.hold_reason else "hold"
