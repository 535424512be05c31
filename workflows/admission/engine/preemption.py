"""Choosing preemption and lane-override targets, purely over the state: who would have to go
for a candidate to fit. Carrying it out (`transitions.displace`) is the caller's.
"""

from __future__ import annotations

from workflows.admission.engine.capacity import blocking_limits, fits_now
from workflows.admission.engine.order import effective_priority
from workflows.admission.engine.state import EngineState, GangKey, Rec, gang_members


def lane_override_victim(state: EngineState, candidate: Rec) -> Rec | None:
    policy = state.policy
    key = candidate.class_key
    lane = candidate.lane
    if lane is None or lane not in policy.lane_wip_limits:
        return None
    if key[4] not in policy.priority_admission.override_priorities:
        return None
    blocked = blocking_limits(state, key)
    if [kind for kind, *_ in blocked] != ["lane"]:
        return None
    rank = candidate.priority_class_rank
    # A gang is spared whole: displacing one member would hold the rest while it waits.
    claims = [
        rec for rec in state.admitted.values()
        if rec.lane == lane and rec.priority_class_rank > rank and rec.gang is None
    ]
    if not claims:
        return None
    victim = max(claims, key=lambda rec: (rec.priority_class_rank, rec.admitted_us, rec.request_id))
    return victim if fits_now(state, key, without=(victim,)) else None


def _preemption_units(state: EngineState) -> list[list[Rec]]:
    """What preemption may take: single preemptible holders, and gangs whose every admitted
    member is preemptible (taken whole, members in request_id order)."""
    units: list[list[Rec]] = []
    seen: set[GangKey] = set()
    for request_id in state.preemptible_admitted:
        rec = state.records[request_id]
        if rec.gang is None:
            units.append([rec])
        elif rec.gang not in seen:
            seen.add(rec.gang)
            members = [member for member in gang_members(state, state.gangs[rec.gang]) if member.state == "admitted"]
            if all(member.preemptible for member in members):
                units.append(members)
    return units


def preemption_victims(state: EngineState, candidate: Rec) -> list[Rec]:
    margin = state.policy.preemption_margin
    candidate_effective = effective_priority(state, candidate)
    best: list[Rec] = []
    best_order: tuple | None = None
    for unit in _preemption_units(state):
        # A unit is as strong as its strongest member; the latest submission and highest id speak for it.
        unit_effective = max(effective_priority(state, member) for member in unit)
        if unit_effective + margin >= candidate_effective:
            continue
        if not fits_now(state, candidate.class_key, without=unit):
            continue
        # Victim order: lowest effective priority, then latest submitted, then highest id.
        order = (unit_effective, -max(member.submitted_us for member in unit))
        unit_id = max(member.request_id for member in unit)
        if best_order is None or order < best_order or (order == best_order and unit_id > max(m.request_id for m in best)):
            best, best_order = unit, order
    return best
