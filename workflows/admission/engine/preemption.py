"""Choosing preemption and lane-override targets, purely over the state: who would have to go
for a candidate to fit. Carrying it out (`transitions.displace`) is the caller's.
"""

from __future__ import annotations

from workflows.admission.engine.capacity import blocking_limits, fits_now
from workflows.admission.engine.order import effective_priority
from workflows.admission.engine.reservations import may_start_now
from workflows.admission.engine.state import EngineState, GangKey, OrderKey, Rec, gang_members


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


def preemption_units(state: EngineState) -> list[list[Rec]]:
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


def preemption_victims(state: EngineState, candidate: Rec, key: OrderKey | None = None) -> list[Rec]:
    """The fewest preemptible leases whose going makes `candidate` fit (and, at order `key`, pass the
    reservations ahead of it), lowest effective priority first; [] when even all would not do.

    One unit is enough for quotas, which count leases: the first in victim order that alone makes
    room. A candidate asking amounts may need several: units are taken in victim order until it
    fits, then every one it can do without is given back, the strongest first.
    """
    margin = state.policy.preemption_margin
    candidate_effective = effective_priority(state, candidate)
    eligible: list[tuple[int, int, list[Rec]]] = []
    for unit in preemption_units(state):
        # A unit is as strong as its strongest member; the latest submission and highest id speak for it.
        unit_effective = max(effective_priority(state, member) for member in unit)
        if unit_effective + margin < candidate_effective:
            eligible.append((unit_effective, -max(member.submitted_us for member in unit), unit))
    # Victim order: lowest effective priority, then latest submitted, then highest id.
    eligible.sort(key=lambda entry: max(member.request_id for member in entry[2]), reverse=True)
    eligible.sort(key=lambda entry: entry[:2])
    units = [unit for _effective, _submitted, unit in eligible]

    def fits(victims: list[Rec]) -> bool:
        if not fits_now(state, candidate.class_key, without=victims):
            return False
        return key is None or may_start_now(state, key, candidate.amounts, candidate.duration_us, victims)[0]

    for unit in units:
        if fits(unit):
            return unit
    if not candidate.amounts:
        return []
    taken: list[list[Rec]] = []
    for unit in units:
        taken.append(unit)
        if fits(_flat(taken)):
            break
    else:
        return []
    for unit in reversed(taken[:-1]):
        trial = [other for other in taken if other is not unit]
        if fits(_flat(trial)):
            taken = trial
    return _flat(taken)


def _flat(units: list[list[Rec]]) -> list[Rec]:
    return [member for unit in units for member in unit]
