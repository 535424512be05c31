"""The replay fault that wedged a host group, and why it cannot happen again.

tests/fixtures/update-replay-hazard/ keeps the singleton's history from a holder storm with worker
kills, captured when holders spoke updates (its README says how it failed). Its failing task has
the shape that the SDK replays in another order than it ran: timers that fired while no worker was
there, and in the same task an update accepted after the long polls those timers ended. The checks
here pin that shape down, and that the workflows every client of a host group calls (the singleton
and the holder workflows) take no update at all, so no history of theirs can have it; the storm's
own recording with worker kills (tests/histories/admission-storm-killed-run*) replays like every
other history (test_replay.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from temporalio import workflow

from workflows.admission.holder_workflow import AdmissionHolderWorkflow
from workflows.admission.workflow import AdmissionWorkflow

ROOT = Path(__file__).resolve().parents[1]
CAPTURED = ROOT / "fixtures" / "update-replay-hazard" / "admission-storm-wedged.history.json"
STORM = sorted((ROOT / "histories").glob("admission-storm-killed-run*.json"))


def _events(path: Path) -> list[dict]:
    return json.loads(path.read_text())["events"]


def _kind(event: dict) -> str:
    return event["eventType"].removeprefix("EVENT_TYPE_")


def test_the_captured_task_accepts_an_update_after_what_the_timers_that_fired_before_it_ended() -> None:
    events = {int(event["eventId"]): event for event in _events(CAPTURED)}
    # No worker while the polls' timers fired: task 99 timed out, task 106 carried them all.
    assert [_kind(events[i]) for i in (98, 100, 101, 102, 103, 104)] == ["TIMER_FIRED"] * 6
    assert _kind(events[105]) == "WORKFLOW_TASK_TIMED_OUT" and _kind(events[108]) == "WORKFLOW_TASK_COMPLETED"
    # What task 106 did, in order: it completed the five long polls, then accepted a new update
    # that the server sequenced at event 106 (before any of those completions).
    completed = [events[i] for i in range(109, 114)]
    assert all(_kind(event) == "WORKFLOW_EXECUTION_UPDATE_COMPLETED" for event in completed)
    accepted = events[115]["workflowExecutionUpdateAcceptedEventAttributes"]
    assert _kind(events[115]) == "WORKFLOW_EXECUTION_UPDATE_ACCEPTED" and accepted["acceptedRequestSequencingEventId"] == "106"
    assert accepted["acceptedRequest"]["input"]["name"] == "await_decision"
    # Its last tasks are the failures that never end (the host group stopped deciding).
    assert [_kind(event) for event in _events(CAPTURED)[-2:]] == ["WORKFLOW_TASK_STARTED", "WORKFLOW_TASK_FAILED"]


def test_the_workflows_every_client_of_a_host_group_calls_take_no_update() -> None:
    for workflow_class in (AdmissionWorkflow, AdmissionHolderWorkflow):
        definition = workflow._Definition.must_from_class(workflow_class)
        assert definition.updates == {}, (workflow_class.__name__, sorted(definition.updates))


def test_a_storm_with_worker_kills_is_recorded_with_its_killed_tasks_and_no_update() -> None:
    assert STORM, "record it: .venv/bin/python -m bench.admission_storm --save-histories tests/histories (see its README row)"
    kinds = [_kind(event) for path in STORM for event in _events(path)]
    assert "WORKFLOW_TASK_TIMED_OUT" in kinds  # a worker died holding a task
    assert kinds.count("WORKFLOW_EXECUTION_SIGNALED") > 100 and "TIMER_FIRED" in kinds
    assert not any(kind.startswith("WORKFLOW_EXECUTION_UPDATE") for kind in kinds)
    # A task may fail only as the server's refusal of a completion that raced new signals (retried at once).
    causes = {event["workflowTaskFailedEventAttributes"].get("cause")
              for path in STORM for event in _events(path) if _kind(event) == "WORKFLOW_TASK_FAILED"}
    assert causes <= {"WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND"}, causes
