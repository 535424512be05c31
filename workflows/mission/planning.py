"""Assigning children to executor targets: a pure function of the spec and the target list.

By default every child gets its own target (`require_distinct_targets`), so one
executor's failure cannot take down two children of the same mission. A child
with no eligible target is *unroutable*: it is never dispatched and the mission
reports it as operator-review-required rather than guessing.

A daemon or scheduled collector needs an executor with the fleet API (Fleet Workload Contract v1:
an adapter without it claims no daemon or schedule support). One whose only eligible targets
lack it is *unsupported*: it fails before admission, with capability status `unsupported`.
"""

from __future__ import annotations

from collections import Counter

from pydantic import BaseModel, ConfigDict

from workflows.mission.spec import ChildSpec, MissionSpec
from workflows.workload.messages import Target


FLEET_ONLY_KINDS = frozenset({"daemon", "scheduled-collector"})


class Assignment(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    target_id: str
    executor_id: str
    runtime_id: str
    fleet_api: bool = True  # False: the conductor keeps the child's record (workflows.workload.kept)


def eligibility_problem(target: Target, child: ChildSpec, *, fleet: bool = True) -> str | None:
    """Why `child` cannot run on `target` (None: it can); `fleet=False` leaves out the fleet API."""
    if target.status != "ready":
        return f"target {target.id} is {target.status}"
    if child.kind not in target.workload_kinds:
        return f"target {target.id} does not run {child.kind} workloads"
    if child.runtime_kind not in target.isolation_kinds:
        return f"target {target.id} offers isolation {', '.join(target.isolation_kinds)}, not {child.runtime_kind}"
    if fleet and not target.fleet_api and child.kind in FLEET_ONLY_KINDS:
        return f"target {target.id}'s executor has no fleet API, which a {child.kind} needs"
    return None


def unsupported(spec: MissionSpec, targets: list[Target], unroutable: dict[str, str]) -> dict[str, str]:
    """The unroutable children that only the fleet API kept off a target: why, for their ledger."""
    found = {}
    for child in spec.children:
        if child.child_id in unroutable and child.kind in FLEET_ONLY_KINDS:
            candidates = [t for t in targets if child.target_id in (None, t.id)]
            if any(eligibility_problem(t, child, fleet=False) is None for t in candidates):
                found[child.child_id] = (
                    f"capability {child.kind} unsupported: its executor has no fleet API (404 or an unavailable store "
                    "on /api/v2/fleet), and without it a daemon or a scheduled collector cannot be kept; run it on an "
                    "Agentic Sandbox with the fleet router"
                )
    return found


def plan_targets(spec: MissionSpec, targets: list[Target]) -> tuple[dict[str, Assignment], dict[str, str]]:
    """(assignments by child id, unroutable child id -> why), in spec order, pinned children first."""
    by_id = {target.id: target for target in targets}
    ordered = sorted(targets, key=lambda target: target.id)
    load: Counter[str] = Counter()
    assignments: dict[str, Assignment] = {}
    unroutable: dict[str, str] = {}

    def assign(child: ChildSpec, target: Target) -> None:
        load[target.id] += 1
        assignments[child.child_id] = Assignment(
            target_id=target.id, executor_id=target.executor_id, runtime_id=f"{target.runtime_id}:{child.child_id}",
            fleet_api=target.fleet_api,
        )

    pinned = [child for child in spec.children if child.target_id is not None]
    free = [child for child in spec.children if child.target_id is None]
    for child in pinned:
        target = by_id.get(child.target_id)  # type: ignore[arg-type]
        problem = "no such target" if target is None else eligibility_problem(target, child)
        if problem is None and spec.require_distinct_targets and load[target.id]:  # type: ignore[union-attr]
            problem = f"target {child.target_id} is already pinned by another child and targets must be distinct"
        if problem is not None:
            unroutable[child.child_id] = f"pinned target {child.target_id}: {problem}"
        else:
            assign(child, target)  # type: ignore[arg-type]
    for child in free:
        eligible = [target for target in ordered if eligibility_problem(target, child) is None]
        if spec.require_distinct_targets:
            eligible = [target for target in eligible if not load[target.id]]
        if not eligible:
            reasons = "; ".join(filter(None, (eligibility_problem(t, child) for t in ordered))) or "no targets listed"
            taken = " (every eligible target is already used by a sibling)" if spec.require_distinct_targets else ""
            unroutable[child.child_id] = f"no eligible executor target{taken}: {reasons}"
            continue
        assign(child, min(eligible, key=lambda target: (load[target.id], target.active_tasks, target.id)))
    return assignments, {cid: unroutable[cid] for cid in (c.child_id for c in spec.children) if cid in unroutable}


def plan(spec: MissionSpec, targets: list[Target]) -> tuple[dict[str, Assignment], dict[str, str], dict[str, str]]:
    """`plan_targets`, with the unroutable children that are `unsupported` told apart:
    (assignments, unroutable -> why, unsupported -> why)."""
    assignments, unroutable = plan_targets(spec, targets)
    refused = unsupported(spec, targets, unroutable)
    return assignments, {cid: why for cid, why in unroutable.items() if cid not in refused}, refused
