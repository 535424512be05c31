"""Everyday mistakes with `conductor mission ...` are one line on stderr, never a traceback.

An unknown mission id, a mission that has closed already, a mission id in use, Ctrl-C while
waiting and the id as Temporal shows it (`mission:ID`): each ends in one `conductor: ...` line
saying what happened and what to do, with an exit code a script can act on (2: input the
command cannot use; 1: the server says no; 0: a stop of a mission already closed, since that
is what a stop asks for; 130: Ctrl-C). Real dev server; a real worker and substrate where a
mission must run.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.service import RPCError, RPCStatusCode

from tests.support.substrate_fixtures import substrate  # noqa: F401  (fixture)
from tests.support.mission_harness import mission_harness
from tests.support.cli_support import conductor, without_profiles
from worker.mission_control import MissionClosed, MissionControl, MissionNotFound, parse_spec
from worker.config import DEFAULT_POLICY
from workflows.admission.messages import AdmissionWorkflowInput, admission_workflow_id
from workflows.mission.messages import mission_workflow_id

REVIEW = ["--approve", "--operator", "alice", "--reason", "looked at it"]


@pytest.fixture
def cli_env(dev_client: Client, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """Point the CLI at the session's dev server and nothing else (no profile of whoever runs the tests)."""
    without_profiles(monkeypatch, tmp_path)
    address = dev_client.service_client.config.target_host
    monkeypatch.setenv("TEMPORAL_ADDRESS", address)
    monkeypatch.setenv("TEMPORAL_NAMESPACE", "default")
    monkeypatch.setenv("CONDUCTOR_TASK_QUEUE", f"tq-nobody-{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv("CONDUCTOR_RECONNECT_SECONDS", "5")
    return address


def one_shot(child_id: str, prompt: str) -> dict:
    return {"child_id": child_id, "kind": "one-shot-command", "prompt": prompt}


async def start_host_group(client: Client, host_group: str) -> None:
    """A host group for a mission no worker runs: its admission workflow started, never run
    (`mission run/start` refuse a host group that has none)."""
    await client.start_workflow(
        "AdmissionWorkflow", AdmissionWorkflowInput(host_group=host_group, policy=DEFAULT_POLICY),
        id=admission_workflow_id(host_group), task_queue=f"tq-nobody-{uuid.uuid4().hex[:8]}",
    )


def spec_for(mission_id: str, children: list[dict] | None = None) -> dict:
    return {
        "mission_id": mission_id, "orchestrator_id": "tests", "goal": "test a mistake",
        "host_group": f"hg-{mission_id}", "children": children or [one_shot("only", "echo hi")],
    }


# --- an id no mission has ------------------------------------------------------------------------

COMMANDS = {
    "show": [], "watch": [], "stop": [], "cancel": [], "review": REVIEW,
}


@pytest.mark.parametrize("form", ["bare", "workflow-id"])
@pytest.mark.parametrize("command", list(COMMANDS))
async def test_an_unknown_mission_id_is_one_line_naming_server_and_namespace(cli_env, capsys, command, form):
    mission_id = f"nobody-{uuid.uuid4().hex[:8]}"
    given = mission_id if form == "bare" else mission_workflow_id(mission_id)
    result = await conductor(capsys, "mission", command, given, *COMMANDS[command])
    assert result.code == 1, result
    assert result.line == (
        f"conductor: no mission {mission_id} on the Temporal server at {cli_env}, namespace default "
        f"(no workflow mission:{mission_id} there); check the id, and TEMPORAL_ADDRESS / TEMPORAL_NAMESPACE "
        "(or the profile) if the mission runs on another server or namespace"
    )
    assert result.out == ""


async def test_mission_control_says_the_same_and_it_is_still_the_servers_not_found(dev_client: Client):
    control = MissionControl(dev_client, "nowhere")
    mission_id = f"nobody-{uuid.uuid4().hex[:8]}"
    for call in (control.show, control.stop, control.cancel, control.wait_for_verdict):
        with pytest.raises(MissionNotFound, match=f"^no mission {mission_id} on the Temporal server") as raised:
            await call(mission_id)
        assert raised.value.mission_id == mission_id and raised.value.workflow_id == f"mission:{mission_id}"
    assert isinstance(raised.value, RPCError) and raised.value.status == RPCStatusCode.NOT_FOUND


@pytest.mark.parametrize("given", ["mission:", "mission:bad id"])
async def test_a_prefixed_id_is_still_checked_as_an_id(cli_env, capsys, given):
    result = await conductor(capsys, "mission", "show", given)
    assert result.code == 2, result
    assert result.line.startswith("conductor: mission id ")
    assert "names no mission" in result.line or "is not usable" in result.line


# --- missions that have closed ---------------------------------------------------------------------


async def test_stop_twice_cancel_and_review_of_a_closed_mission(dev_client: Client, substrate, tmp_path, monkeypatch, capsys):
    """A second stop says the mission has closed, and how, exit 0 (a stop is idempotent in intent);
    a cancel or a review of a closed mission says the same and fails (exit 1): nothing was done."""
    async with mission_harness(dev_client, substrate, tmp_path) as h:
        for key, value in h.cli_env().items():
            monkeypatch.setenv(key, value)
        spec = parse_spec(h.spec("closing", [one_shot("report", "echo done"),
                                            {"child_id": "api", "kind": "daemon", "prompt": "sleep 300"}]))
        verdict = await h.control.run(spec)
        assert verdict.parent_state == "completed", verdict.aggregation.reason
        mission_id = spec.mission_id

        first = await conductor(capsys, "mission", "stop", mission_id)
        assert (first.code, first.out, first.err) == (0, f"stop requested for mission {mission_id}\n", "")
        await asyncio.wait_for(h.control.handle(mission_id).result(), timeout=45)

        for given in (mission_id, f"mission:{mission_id}"):
            again = await conductor(capsys, "mission", "stop", given)
            assert again.code == 0 and again.out == ""
            assert again.line == f"conductor: mission {mission_id} has already closed (completed); nothing to stop"

        cancel = await conductor(capsys, "mission", "cancel", mission_id)
        assert cancel.code == 1 and cancel.out == ""
        assert cancel.line == (
            f"conductor: mission {mission_id} has already closed (completed); it can no longer be cancelled"
        )
        assert (await h.control.handle(mission_id).describe()).status == WorkflowExecutionStatus.COMPLETED

        review = await conductor(capsys, "mission", "review", f"mission:{mission_id}", *REVIEW)
        assert review.code == 1 and review.out == ""
        assert review.line == f"conductor: mission {mission_id} has already closed (completed); it takes no review any more"

        # The workflow id as the Temporal UI shows it names the mission for reading, too.
        shown = await conductor(capsys, "mission", "show", f"mission:{mission_id}", "--json")
        assert shown.code == 0 and shown.err == "" and json.loads(shown.out)["mission_id"] == mission_id
        watched = await conductor(capsys, "mission", "watch", f"mission:{mission_id}")
        assert watched.code == 0 and watched.err == "" and mission_id in watched.out


async def test_a_cancelled_mission_says_cancelled(dev_client: Client, substrate, tmp_path, monkeypatch, capsys):
    async with mission_harness(dev_client, substrate, tmp_path) as h:
        for key, value in h.cli_env().items():
            monkeypatch.setenv(key, value)
        spec = parse_spec(h.spec("cancelled", [one_shot("long", "sleep 120")]))
        await h.control.start(spec)
        mission_id = spec.mission_id

        first = await conductor(capsys, "mission", "cancel", mission_id)
        assert (first.code, first.out, first.err) == (0, f"cancel requested for mission {mission_id}\n", "")
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(h.control.handle(mission_id).result(), timeout=45)

        again = await conductor(capsys, "mission", "cancel", mission_id)
        assert again.code == 1 and again.out == ""
        assert again.line == f"conductor: mission {mission_id} has already closed (cancelled); it can no longer be cancelled"
        stop = await conductor(capsys, "mission", "stop", mission_id)
        assert stop.code == 0 and stop.line == f"conductor: mission {mission_id} has already closed (cancelled); nothing to stop"
        with pytest.raises(MissionClosed) as raised:
            await h.control.stop(mission_id)
        assert (raised.value.operation, raised.value.closed_as) == ("stop", "cancelled")


# --- a mission id in use ----------------------------------------------------------------------------


async def test_starting_a_mission_id_that_is_running_names_the_running_workflow(dev_client: Client, cli_env, capsys, tmp_path):
    mission_id = f"running-{uuid.uuid4().hex[:8]}"
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec_for(mission_id)))
    await start_host_group(dev_client, f"hg-{mission_id}")
    first = await conductor(capsys, "mission", "start", str(path))
    assert (first.code, first.out, first.err) == (0, f"{mission_id}\n", "")
    try:
        for command in ("start", "run"):
            again = await conductor(capsys, "mission", command, str(path))
            assert again.code == 2 and again.out == ""
            assert again.line.startswith(
                f"conductor: mission {mission_id} is already running (workflow mission:{mission_id}, started "
            )
            assert again.line.endswith(
                "a mission id names one mission: give the spec a new mission_id, or follow the running one "
                f"with `conductor mission watch {mission_id}`"
            )
    finally:
        await dev_client.get_workflow_handle(mission_workflow_id(mission_id)).terminate("test over")
        await dev_client.get_workflow_handle(admission_workflow_id(f"hg-{mission_id}")).terminate("test over")


# --- Ctrl-C while waiting ---------------------------------------------------------------------------


async def _keyboard_interrupt(*args: object, **kwargs: object):
    raise KeyboardInterrupt


async def _cancelled_as_by_sigint(*args: object, **kwargs: object):
    """What a real Ctrl-C does to the wait: asyncio.run cancels the main task, and temporalio turns
    the cancelled update into WorkflowUpdateRPCTimeoutOrCancelledError."""
    asyncio.current_task().cancel()
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError as error:
        raise WorkflowUpdateRPCTimeoutOrCancelledError() from error


@pytest.mark.parametrize("interrupt", [_keyboard_interrupt, _cancelled_as_by_sigint], ids=["KeyboardInterrupt", "task-cancelled"])
async def test_ctrl_c_on_watch_says_the_mission_carries_on(cli_env, capsys, monkeypatch, interrupt):
    monkeypatch.setattr(MissionControl, "watch", interrupt)
    result = await conductor(capsys, "mission", "watch", "mission:m-watched")
    assert result.code == 130, result
    assert result.line == (
        "conductor: stopped watching; mission m-watched carries on in Temporal: "
        "`conductor mission watch m-watched` follows it again"
    )


@pytest.mark.parametrize("as_json", [True, False], ids=["json", "text"])
@pytest.mark.parametrize("interrupt", [_keyboard_interrupt, _cancelled_as_by_sigint], ids=["KeyboardInterrupt", "task-cancelled"])
async def test_ctrl_c_on_run_while_waiting_leaves_the_mission_running(
    dev_client: Client, cli_env, capsys, monkeypatch, tmp_path, interrupt, as_json
):
    mission_id = f"interrupted-{uuid.uuid4().hex[:8]}"
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec_for(mission_id)))
    monkeypatch.setattr(MissionControl, "wait_for_verdict", interrupt)
    handle = dev_client.get_workflow_handle(mission_workflow_id(mission_id))
    await start_host_group(dev_client, f"hg-{mission_id}")
    try:
        result = await conductor(capsys, "mission", "run", str(path), *(["--json"] if as_json else []))
        assert result.code == 130 and result.out == ""
        expected = (
            f"conductor: stopped waiting for the verdict; mission {mission_id} carries on in Temporal: "
            f"`conductor mission watch {mission_id}` follows it again\n"
        )
        if as_json:
            assert result.line + "\n" == expected
        else:
            assert result.err == f"mission {mission_id} started; waiting for its verdict\n" + expected
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
    finally:
        await handle.terminate("test over")
        await dev_client.get_workflow_handle(admission_workflow_id(f"hg-{mission_id}")).terminate("test over")
