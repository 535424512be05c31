"""How one attempt of a child is started: its workload workflow's id, input, summary and search
attributes, read from the mission's state. Pure; the shell hands them to `start_child_workflow`."""

from __future__ import annotations

from dataclasses import dataclass

from temporalio.common import TypedSearchAttributes

from workflows.ids import workload_workflow_id
from workflows.mission.messages import MissionInput
from workflows.mission.search import workload_attributes
from workflows.mission.supervisor import MissionState
from workflows.workload.messages import WorkloadInput


@dataclass(frozen=True)
class ChildStart:
    workflow_id: str
    input: WorkloadInput
    # Long-lived children, and children that may wait on a person (`approval`), outlive the run that
    # starts them when it continues as new (ABANDON, not cancelled with it): they report by signal,
    # their end included, and stop themselves if the mission is ever gone (workflows.workload.workflow).
    outlives_run: bool
    summary: str
    search_attributes: TypedSearchAttributes | None


def child_start(state: MissionState, child_id: str, *, parent_id: str, mission: MissionInput) -> ChildStart:
    spec = state.spec
    child = state.child_spec(child_id)
    target = state.children[child_id].assignment
    attempt = state.ledger.child(child_id).attempt
    outlives_run = child.reports_by_signal
    signalled = {"report_to_mission_by_signal": True, "watch_max_seconds": mission.alive_every_seconds}
    return ChildStart(
        workflow_id=workload_workflow_id(spec.mission_id, child_id, attempt),
        input=WorkloadInput(
            mission_id=spec.mission_id,
            orchestrator_id=spec.orchestrator_id,
            child=child,
            target_id=target.target_id,
            executor_id=target.executor_id,
            runtime_id=target.runtime_id,
            parent_id=parent_id,
            attempt=attempt,
            fleetless=not target.fleet_api,
            poll_interval_seconds=mission.poll_interval_seconds,
            **(signalled if outlives_run else {}),
        ),
        outlives_run=outlives_run,
        summary=f"{child.kind} {child_id} on {target.target_id}" + (f" (attempt {attempt})" if attempt > 1 else ""),
        search_attributes=workload_attributes(spec, child) if mission.search_attributes else None,
    )
