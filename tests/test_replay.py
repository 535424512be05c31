"""Every recorded history replays against the current workflow code (determinism guard)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tests.decision_sink import DecisionSinkWorkflow
from tests.substrate_support import EXECUTOR_TOKEN, FLEET_TOKEN
from worker.worker import WORKFLOWS

HISTORIES = sorted((Path(__file__).resolve().parent / "histories").glob("*.json"))
WORKFLOW_TYPES = {"AdmissionWorkflow", "AdmissionProbeWorkflow", "MissionWorkflow", "WorkloadWorkflow"}


def workflow_type(path: Path) -> str:
    events = json.loads(path.read_text())["events"]
    return events[0]["workflowExecutionStartedEventAttributes"]["workflowType"]["name"]


def test_every_workflow_type_has_recorded_histories() -> None:
    assert WORKFLOW_TYPES <= {workflow_type(path) for path in HISTORIES}


@pytest.mark.parametrize("path", HISTORIES, ids=[path.stem for path in HISTORIES])
async def test_history_replays(path: Path) -> None:
    replayer = Replayer(workflows=[*WORKFLOWS, DecisionSinkWorkflow], data_converter=pydantic_data_converter)
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    await replayer.replay_workflow(history)


@pytest.mark.parametrize("path", HISTORIES, ids=[path.stem for path in HISTORIES])
def test_history_carries_no_bearer_token(path: Path) -> None:
    text = path.read_text()
    for token in (str(FLEET_TOKEN), str(EXECUTOR_TOKEN)):
        assert token not in text
