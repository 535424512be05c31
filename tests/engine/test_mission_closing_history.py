"""What a finished mission does after its last child ended, read from a recorded history.

`mission-fail-fast-queued` (tests/histories/README.md) ends on its own: a child fails, the
fail-fast verdict is final, and the mission closes. Its tail is what every finished mission's
tail costs: the ended child's lease goes back without confirmation, the request still queued is
cancelled with it, and the ledger is written once. It used to be written by the last pass, by
the background writer chasing each change closing made, and by closing itself.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

HISTORY = Path(__file__).resolve().parents[1] / "histories" / "mission-fail-fast-queued.json"
CHILD_ENDS = {
    "EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED",
    "EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_FAILED",
    "EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_CANCELED",
}


def _payload(payloads: dict[str, Any]) -> Any:
    return json.loads(base64.b64decode(payloads["payloads"][0]["data"]))


def _ledger_writes(events: list[dict[str, Any]]) -> int:
    writes = 0
    for event in events:
        if event["eventType"] == "EVENT_TYPE_ACTIVITY_TASK_SCHEDULED":
            writes += event["activityTaskScheduledEventAttributes"]["activityType"]["name"] == "write_ledger_snapshot"
        elif event["eventType"] == "EVENT_TYPE_MARKER_RECORDED":
            marker = _payload(event["markerRecordedEventAttributes"]["details"]["data"])
            writes += marker["activity_type"] == "write_ledger_snapshot"
    return writes


def _signals(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [
        _payload(attributes["input"])
        for event in events
        if (attributes := event.get("signalExternalWorkflowExecutionInitiatedEventAttributes"))
        and attributes["signalName"] == name
    ]


def test_a_finished_mission_writes_its_last_ledger_once_after_its_last_child_ended() -> None:
    events = json.loads(HISTORY.read_text())["events"]
    assert events[-1]["eventType"] == "EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED"
    last_child = max(i for i, event in enumerate(events) if event["eventType"] in CHILD_ENDS)
    tail = events[last_child + 1 :]
    assert _ledger_writes(tail) == 1
    assert _ledger_writes(events[:last_child]) >= 1  # the running mission was written along the way


def test_the_ended_childs_lease_goes_back_unconfirmed_and_the_queued_request_with_confirmation() -> None:
    events = json.loads(HISTORY.read_text())["events"]
    releases = _signals(events, "release")
    assert [release["confirm"] for release in releases] == [False]
    assert releases[0]["request_ids"] == ["recorded-urgent:broken"]
    assert [cancel["confirm"] for cancel in _signals(events, "cancel")] == [True]


def test_every_ledger_write_of_every_recorded_mission_is_a_scheduled_activity() -> None:
    """Never a local activity: one runs before its marker is recorded, so a workflow task lost
    after the write ran it again with what the retried task had folded meanwhile, under the same
    snapshot seq, and the store refused the changed content (a mission failed that way in CI,
    tests/workflows/test_mission_attempts.py, its worker stopped mid-task). A scheduled write's input is in
    the history before it runs."""
    histories = sorted(HISTORY.parent.glob("mission-*.json"))
    assert histories
    for path in histories:
        events = json.loads(path.read_text())["events"]
        local = [
            event["eventId"] for event in events if event["eventType"] == "EVENT_TYPE_MARKER_RECORDED"
            and _payload(event["markerRecordedEventAttributes"]["details"]["data"])["activity_type"] == "write_ledger_snapshot"
        ]
        assert not local, f"{path.name}: ledger written by a local activity (events {local})"
        # A run whose input was refused never had a ledger; every other run writes one.
        refused = events[-1]["eventType"] == "EVENT_TYPE_WORKFLOW_EXECUTION_FAILED" and len(events) <= 5
        assert (_ledger_writes(events) == 0) if refused else (_ledger_writes(events) >= 1), path.name


def test_with_only_unconfirmed_releases_left_the_last_ledger_is_written_while_they_travel() -> None:
    """`mission-cancelled` and `mission-preempted` (whichever run started its child) close with nothing left to confirm: the final
    snapshot is scheduled before the last release is delivered (its record was made as it was
    sent), and written once. Written after the delivery, it cost a round trip more."""
    preempted = sorted(HISTORY.parent.glob("mission-preempted*.json"))[-1]  # the run that closed
    for path in (HISTORY.parent / "mission-cancelled.json", preempted):
        events = json.loads(path.read_text())["events"]
        # A child this run started ends with its handle; one an earlier run started (the chain
        # continued as new) with its last observation, by signal.
        ended = [i for i, event in enumerate(events) if event["eventType"] in CHILD_ENDS] or [
            i for i, event in enumerate(events) if event["eventType"] == "EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED"
            and event["workflowExecutionSignaledEventAttributes"]["signalName"] == "workload_observed"
        ]
        assert ended, path.name
        tail = events[max(ended) + 1 :]
        assert [release["confirm"] for release in _signals(tail, "release")] == [False], path.name
        assert not _signals(tail, "cancel"), path.name
        assert _ledger_writes(tail) == 1, path.name
        write = next(i for i, event in enumerate(tail) if event["eventType"] == "EVENT_TYPE_ACTIVITY_TASK_SCHEDULED"
                     and event["activityTaskScheduledEventAttributes"]["activityType"]["name"] == "write_ledger_snapshot")
        delivered = max(i for i, event in enumerate(tail) if event["eventType"] == "EVENT_TYPE_EXTERNAL_WORKFLOW_EXECUTION_SIGNALED")
        assert write < delivered, path.name
