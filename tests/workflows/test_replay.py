"""Every recorded history replays against the current workflow code (determinism guard), and
between them they reach every command-issuing branch of that code (tests/command_sites.py)."""

from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path

import pytest
from temporalio.worker import Replayer

from tests.command_sites import INDEX, command_sites, index_rows, index_table, reached_by_histories, recorded_history
from tests.support.decision_sink import DecisionSinkWorkflow
from tests.support.substrate_support import EXECUTOR_TOKEN, FLEET_TOKEN
from worker.payloads import DATA_CONVERTER
from worker.worker import WORKFLOWS
from workflows.admission.probe import AdmissionProbeWorkflow

HISTORIES = sorted((Path(__file__).resolve().parents[1] / "histories").glob("**/*.json"))
WORKFLOW_TYPES = {"AdmissionWorkflow", "AdmissionHolder", "AdmissionProbeWorkflow", "MissionWorkflow", "WorkloadWorkflow"}


def workflow_type(path: Path) -> str:
    events = json.loads(path.read_text())["events"]
    return events[0]["workflowExecutionStartedEventAttributes"]["workflowType"]["name"]


def test_every_workflow_type_has_recorded_histories() -> None:
    assert WORKFLOW_TYPES <= {workflow_type(path) for path in HISTORIES}


@pytest.mark.parametrize("path", HISTORIES, ids=[path.stem for path in HISTORIES])
async def test_history_replays(path: Path) -> None:
    replayer = Replayer(workflows=[*WORKFLOWS, AdmissionProbeWorkflow, DecisionSinkWorkflow], data_converter=DATA_CONVERTER)
    await replayer.replay_workflow(recorded_history(path))


@pytest.mark.parametrize("path", HISTORIES, ids=[path.stem for path in HISTORIES])
def test_history_carries_no_bearer_token(path: Path) -> None:
    text = path.read_text()
    for token in (str(FLEET_TOKEN), str(EXECUTOR_TOKEN)):
        assert token not in text


def test_no_workflow_code_is_patched_before_the_first_release() -> None:
    """While nothing is released, a workflow change re-records the histories (CONTRIBUTING.md)."""
    if not version("mission-conductor").startswith("0."):
        pytest.skip("released: from now on a workflow change that alters commands ships behind a patch")
    patched = [site for site in command_sites() if ": patched" in site.name or ": deprecate_patch" in site.name]
    assert patched == [], f"pre-release workflow code carries patches: {patched}; fold them and re-record"


@pytest.fixture(scope="module")
def reached():
    # Replayed in a thread of its own: the replay needs an event loop of its own, and the
    # tracer must see the threads the replayer starts.
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(reached_by_histories, HISTORIES).result()


def test_recorded_histories_reach_every_command_site(reached) -> None:
    missed = [f"{site.path}:{site.line} {site.name}" for site, histories in sorted(reached.items()) if not histories]
    assert not missed, (
        "no recorded history reaches these command-issuing calls, so no replay checks them: "
        "add a scenario to tests/record_histories.py and re-record:\n  " + "\n  ".join(missed)
    )


def test_the_history_index_names_a_reaching_history_for_every_command_site(reached) -> None:
    rows = index_rows(INDEX.read_text())
    names = {site.name: histories for site, histories in reached.items()}
    wrong = {
        name: rows.get(name) for name, histories in names.items()
        if not rows.get(name) or not set(rows[name]) <= set(histories)
    }
    stale = sorted(set(rows) - set(names))
    assert not wrong and not stale, (
        f"{INDEX.name} is out of date (sites without a reaching history named: {sorted(wrong)}; rows for sites "
        f"that no longer exist: {stale}); replace its table with the output of `python -m tests.command_sites`:\n"
        + index_table(reached)
    )
