"""Assigning children to executor targets: a pure function of the spec and the target list.

By default every child gets its own target (`require_distinct_targets`), so one
executor's failure cannot take down two children of the same mission. A child
with no eligible target is *unroutable*: it is never dispatched and the mission
reports it as operator-review-required rather than guessing.
"""

from __future__ import annotations

from collections import Counter

from pydantic import BaseModel, ConfigDict

from workflows.mission.spec import ChildSpec, MissionSpec
from workflows.workload.messages import Target


class Assignment(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    target_id: str
    executor_id: str
    runtime_id: str


def eligibility_problem(target: Target, child: ChildSpec) -> str | None:
    if target.status != "ready":
        return f"target {target.id} is {target.status}"
    if child.kind not in target.workload_kinds:
        return f"target {target.id} does not run {child.kind} workloads"
    if child.runtime_kind not in target.isolation_kinds:
        return f"target {target.id} offers isolation {', '.join(target.isolation_kinds)}, not {child.runtime_kind}"
    return None


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
