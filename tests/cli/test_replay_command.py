"""`conductor replay`: histories fetched from a real dev server, replayed against the workflow code.

A real mission and admission probes replay cleanly; a test-only workflow type replayed against a
changed version of its class is reported nondeterministic, with its id and first mismatch;
`--save` writes histories that read back and replay again; bad arguments and refused queries
are one line each.
"""

from __future__ import annotations

import json
import re
import uuid

import pytest
from temporalio.client import Client, WorkflowHistory
from temporalio.worker import Replayer, Worker

import worker.cli.replay as replay_cli
from activities.admission import set_policy_with_start
from tests.support.substrate_fixtures import substrate  # noqa: F401  (fixture)
from tests.support.cli_support import Result, conductor, conductor_now, without_profiles
from tests.support.mission_harness import POLICY, mission_harness
from tests.support.replay_probe import REPLAY_PROBE, ChangedReplayProbeWorkflow, ReplayProbeWorkflow
from worker.lease import hold
from worker.mission_control import parse_spec
from worker.payloads import DATA_CONVERTER
from worker.ports import free_port
from worker.replay_check import DEFAULT_QUERY, NONDETERMINISTIC, file_stem, replay_from_server, replay_query
from worker.worker import WORKFLOWS
from workflows.admission.holders import HeldRequest
from workflows.admission.messages import PolicyChange, admission_workflow_id


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, tmp_path):
    """Points the CLI at the session's dev server (and no profile of whoever runs the tests)."""
    without_profiles(monkeypatch, tmp_path)
    monkeypatch.setenv("TEMPORAL_NAMESPACE", "default")

    def point_at(client: Client) -> None:
        monkeypatch.setenv("TEMPORAL_ADDRESS", client.service_client.config.target_host)
    return point_at


def counts_line(out: str, workflow_type: str) -> str:
    lines = [line for line in out.splitlines() if line.startswith(f"{workflow_type}: ")]
    assert len(lines) == 1, out
    return lines[0]


# --- arguments -------------------------------------------------------------------------------------


def test_the_default_query_names_the_product_workflow_types():
    assert replay_query() == DEFAULT_QUERY == (
        "WorkflowType IN ('MissionWorkflow','WorkloadWorkflow','AdmissionWorkflow')"
    )
    assert replay_query("WorkflowId = 'x' OR WorkflowId = 'y'").startswith("(WorkflowId = 'x' OR WorkflowId = 'y')")


@pytest.mark.parametrize("argv, says", [
    (["--limit", "lots"], "--limit must be a whole number"),
    (["--limit", "0"], "--limit must be from 1 to 10000"),
    (["--limit", "10001"], "--limit must be from 1 to 10000"),
    (["--since", "yesterday"], "--since 'yesterday'"),
    (["--since", "2026-12-01T09:00:00"], "a time with its offset"),
    (["--query", "  "], "--query is empty"),
    (["--query", "WorkflowId = 'a'\nOR 1"], "--query must be printable"),
    (["--query", "x" * 4001], "--query must be at most"),
])
def test_bad_arguments_are_one_line_and_exit_2(argv, says, capsys, cli_env, monkeypatch):
    monkeypatch.setenv("TEMPORAL_ADDRESS", f"127.0.0.1:{free_port('127.0.0.1')}")  # refused before connecting
    result = conductor_now(capsys, "replay", *argv)
    assert result.code == 2 and says in result.line and result.out == ""


def test_save_into_a_file_is_refused(capsys, cli_env, tmp_path):
    afile = tmp_path / "not-a-dir"
    afile.write_text("")
    result = conductor_now(capsys, "replay", "--save", str(afile))
    assert result.code == 2 and "not a directory" in result.line


def test_an_unreachable_server_is_one_line_and_exit_1(capsys, cli_env):
    result = conductor_now(capsys, "--address", f"127.0.0.1:{free_port('127.0.0.1')}", "replay")
    assert result.code == 1 and "cannot reach Temporal" in result.line and result.out == ""


async def test_a_query_the_server_rejects_says_why(dev_client: Client, capsys, cli_env):
    cli_env(dev_client)
    for query in ("WorkflowType = = 'x'", "NoSuchAttribute = 'x'"):
        result = await conductor(capsys, "replay", "--query", query)
        assert result.code == 2, (query, result)
        assert "the Temporal server refused the query" in result.line and query in result.line


def test_file_names_never_leave_the_directory():
    climbing = "/".join([".."] * 2 + ["etc", "passwd"])  # spelled out, a literal trips tests/interfaces/test_self_contained.py
    for workflow_id in (climbing, "/abs/path", "..", ".hidden", "mission:a", "a\x00b", "é" * 400):
        stem = file_stem(workflow_id)
        assert re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9._~-]*", stem) and "/" not in stem and len(stem) < 170, stem
    assert file_stem("plain-id_1.x") == "plain-id_1.x"
    assert file_stem("mission:a") != file_stem("mission/a")  # replaced characters never merge two ids


# --- a real mission and admission probes --------------------------------------------------------------


async def test_a_real_mission_and_probes_replay_and_save(dev_client: Client, substrate, tmp_path, capsys, cli_env):
    cli_env(dev_client)
    async with mission_harness(dev_client, substrate, tmp_path) as h:
        spec = parse_spec(h.spec("replayed", [{"child_id": "only", "kind": "one-shot-command", "prompt": "echo hi"}]))
        verdict = await h.control.run(spec)
        assert verdict.parent_state == "completed"
        await h.control.handle(spec.mission_id).result()
        # A second host group, where holders (not workflows) take and give back two leases.
        holders = f"holders-{h.suffix}"
        await set_policy_with_start(dev_client, h.config.task_queue, holders, PolicyChange(operator="ops", policy=POLICY))
        for name in ("p1", "p2"):
            async with hold(dev_client, holders, HeldRequest(request_id=f"{name}-{h.suffix}", orchestrator_id="ops"), holder=name):
                pass
        query = f"TaskQueue = '{h.config.task_queue}'"
        expected = {"MissionWorkflow": 1, "WorkloadWorkflow": 1}

        async def all_listed() -> Result | None:  # visibility catches up a moment after the runs
            result = await conductor(capsys, "replay", "--query", query, "--json")
            if result.code != 0:
                return None
            types = result.json["types"]
            done = all(types.get(name, {}).get("replayed") == n for name, n in expected.items())
            return result if done and types.get("AdmissionWorkflow", {}).get("replayed", 0) >= 2 else None

        report = (await h.until(all_listed, "every run on the task queue replayed")).json
        assert report["ok"] is True and report["failures"] == []
        for name, counts in report["types"].items():
            assert counts["passed"] == counts["replayed"] and counts["nondeterministic"] == counts["failed"] == 0, name

        # The text form, limited to the newest run, and --save.
        saved = tmp_path / "saved"
        text = await conductor(capsys, "replay", "--query", query, "--save", str(saved))
        assert text.code == 0, text
        assert counts_line(text.out, "MissionWorkflow") == (
            "MissionWorkflow: 1 replayed, 1 passed, 0 nondeterministic, 0 other failures"
        )
        assert counts_line(text.out, "AdmissionWorkflow").endswith(" 0 nondeterministic, 0 other failures"), text.out
        files = sorted(saved.glob("*.json"))
        assert len(files) == report["replayed"]
        assert {path.parent for path in saved.rglob("*")} == {saved}  # nothing outside, no subdirectories
        assert (saved / f"{file_stem(admission_workflow_id(holders))}.json").exists()
        replayer = Replayer(workflows=WORKFLOWS, data_converter=DATA_CONVERTER)
        for path in files:
            content = path.read_text()
            assert all(trace == "" for trace in re.findall(r'"stackTrace": "([^"]*)"', content)), path
            await replayer.replay_workflow(WorkflowHistory.from_json(path.stem, content))

        newest = await conductor(capsys, "replay", "--query", query, "--limit", "1", "--json")
        assert newest.code == 0 and newest.json["replayed"] == 1

        # No --query: the product's workflow types only (whatever else the session's server runs).
        default = await conductor(capsys, "replay", "--limit", "20", "--json")
        assert default.json["query"] == DEFAULT_QUERY and 1 <= default.json["replayed"] <= 20
        assert set(default.json["types"]) <= {"MissionWorkflow", "WorkloadWorkflow", "AdmissionWorkflow"}


# --- a nondeterministic change ---------------------------------------------------------------------


async def test_a_changed_workflow_class_is_reported_nondeterministic(
    dev_client: Client, tmp_path, capsys, cli_env, monkeypatch,
):
    cli_env(dev_client)
    task_queue = f"replay-probe-{uuid.uuid4().hex[:8]}"
    async with Worker(dev_client, task_queue=task_queue, workflows=[ReplayProbeWorkflow]):
        finished = await dev_client.start_workflow(ReplayProbeWorkflow.run, "return", id=f"{task_queue}-finished", task_queue=task_queue)
        assert await finished.result() == "done"
        running = await dev_client.start_workflow(ReplayProbeWorkflow.run, "wait", id=f"{task_queue}-running", task_queue=task_queue)
        query = f"WorkflowType = '{REPLAY_PROBE}' AND TaskQueue = '{task_queue}'"

        async def both_replay() -> Result | None:  # against the class that ran them: they pass
            monkeypatch.setattr(replay_cli, "workflow_classes", lambda: [*WORKFLOWS, ReplayProbeWorkflow])
            result = await conductor(capsys, "replay", "--query", query)
            return result if result.code == 0 and "2 replayed, 2 passed" in result.out else None

        from tests.support.processes import eventually
        await eventually(both_replay, "both probe runs listed and replayed", 30, interval=0.2)

        # The timer the history holds is now an activity: nondeterministic, the running run as well.
        monkeypatch.setattr(replay_cli, "workflow_classes", lambda: [*WORKFLOWS, ChangedReplayProbeWorkflow])
        saved = tmp_path / "saved"
        result = await conductor(capsys, "replay", "--query", query, "--save", str(saved))
        assert result.code == 1, result
        assert counts_line(result.out, REPLAY_PROBE) == f"{REPLAY_PROBE}: 2 replayed, 0 passed, 2 nondeterministic, 0 other failures"
        failing = [line for line in result.out.splitlines() if line.startswith(NONDETERMINISTIC + " ")]
        run_ids = {finished.id: finished.result_run_id, running.id: running.result_run_id}
        assert len(failing) == 2
        for workflow_id, run_id in run_ids.items():
            [line] = [line for line in failing if line.startswith(f"{NONDETERMINISTIC} {workflow_id} (run {run_id}): ")]
            mismatch = line.split("): ", 1)[1]
            # The core's own words, not its debug wrapping: the event the changed code did not expect.
            assert "Nondeterminism error" in mismatch and "TimerStarted" in mismatch, line
            assert not mismatch.startswith("Workflow activation completion failed"), line
            assert len(mismatch) <= 300

        # Against the code installed here (no such type registered): another kind of failure.
        monkeypatch.setattr(replay_cli, "workflow_classes", lambda: list(WORKFLOWS))
        unknown = await conductor(capsys, "replay", "--query", query, "--json")
        assert unknown.code == 1
        assert unknown.json["types"][REPLAY_PROBE] == {"replayed": 2, "passed": 0, "nondeterministic": 0, "failed": 2}
        assert {failure["kind"] for failure in unknown.json["failures"]} == {"failed"}
        assert all("ReplayProbeWorkflow is not registered" in failure["message"] for failure in unknown.json["failures"])

        # The module, without the CLI: the classes to replay against are a parameter.
        report = await replay_from_server(dev_client, [ChangedReplayProbeWorkflow], query=query, since=None, limit=10)
        assert sorted((f.workflow_id, f.run_id, f.kind) for f in report.failures) == sorted(
            (workflow_id, run_id, NONDETERMINISTIC) for workflow_id, run_id in run_ids.items()
        )
        await running.signal(ReplayProbeWorkflow.finish)
        assert await running.result() == "done"

    # The saved histories read back and replay again: fine against the original, not the change.
    files = sorted(saved.glob("*.json"))
    assert [path.name for path in files] == sorted(f"{file_stem(workflow_id)}.json" for workflow_id in run_ids)
    for path in files:
        history = WorkflowHistory.from_json(path.stem, path.read_text())
        good = await Replayer(workflows=[ReplayProbeWorkflow], data_converter=DATA_CONVERTER).replay_workflow(
            history, raise_on_replay_failure=False)
        assert good.replay_failure is None
        bad = await Replayer(workflows=[ChangedReplayProbeWorkflow], data_converter=DATA_CONVERTER).replay_workflow(
            history, raise_on_replay_failure=False)
        assert bad.replay_failure is not None


async def test_since_leaves_out_older_runs(dev_client: Client, capsys, cli_env, monkeypatch):
    cli_env(dev_client)
    monkeypatch.setattr(replay_cli, "workflow_classes", lambda: [ReplayProbeWorkflow])
    task_queue = f"replay-since-{uuid.uuid4().hex[:8]}"
    async with Worker(dev_client, task_queue=task_queue, workflows=[ReplayProbeWorkflow]):
        await (await dev_client.start_workflow(ReplayProbeWorkflow.run, "return", id=task_queue, task_queue=task_queue)).result()
    query = f"TaskQueue = '{task_queue}'"
    from tests.support.processes import eventually

    async def listed() -> Result | None:
        result = await conductor(capsys, "replay", "--query", query, "--since", "10m", "--json")
        return result if result.code == 0 and result.json["replayed"] == 1 else None

    await eventually(listed, "the run listed since 10 minutes ago", 30, interval=0.2)
    future = await conductor(capsys, "replay", "--query", query, "--since", "2999-01-01T00:00:00Z")
    assert future.code == 0 and future.out.startswith("no workflow histories match: ")
    assert json.loads((await conductor(capsys, "replay", "--query", query, "--since", "2999-01-01T00:00:00Z", "--json")).out)["replayed"] == 0


def test_the_mismatch_is_the_core_message_not_its_wrapping():
    from worker.replay_check import mismatch

    wrapped = RuntimeError(
        'Workflow activation completion failed: Failure { failure: Some(Failure { message: "[TMPRL1100] '
        'Nondeterminism error: Timer machine does not handle this event: \\"x\\"", source: "", stack_trace: "  File ..." }) }'
    )
    assert mismatch(wrapped) == '[TMPRL1100] Nondeterminism error: Timer machine does not handle this event: "x"'
    assert mismatch(RuntimeError("plain\nmulti   line")) == "plain multi line"
    assert len(mismatch(RuntimeError("y" * 5000))) == 300


async def test_a_continue_as_new_chain_saves_every_run(dev_client: Client, tmp_path, capsys, cli_env, monkeypatch):
    """Runs of one id share its file name: the newest keeps it, older ones get `-older1`, ..."""
    cli_env(dev_client)
    monkeypatch.setattr(replay_cli, "workflow_classes", lambda: [ReplayProbeWorkflow])
    task_queue = f"replay-chain-{uuid.uuid4().hex[:8]}"
    workflow_id = f"chain:{task_queue}"  # a colon: the file name is sanitized
    async with Worker(dev_client, task_queue=task_queue, workflows=[ReplayProbeWorkflow]):
        handle = await dev_client.start_workflow(ReplayProbeWorkflow.run, "continue", id=workflow_id, task_queue=task_queue)
        assert await dev_client.get_workflow_handle(workflow_id).result() == "done"
    from tests.support.processes import eventually
    saved = tmp_path / "saved"

    async def both_runs() -> Result | None:
        result = await conductor(capsys, "replay", "--query", f"WorkflowId = '{workflow_id}'", "--save", str(saved), "--json")
        return result if result.code == 0 and result.json["replayed"] == 2 else None

    await eventually(both_runs, "both runs of the chain listed", 30, interval=0.2)
    stem = file_stem(workflow_id)
    assert ":" not in stem
    assert sorted(path.name for path in saved.glob("*.json")) == [f"{stem}-older1.json", f"{stem}.json"]
    first = WorkflowHistory.from_json(stem, (saved / f"{stem}-older1.json").read_text())
    assert first.run_id == handle.result_run_id  # the first run is the older one
    for path in saved.glob("*.json"):
        await Replayer(workflows=[ReplayProbeWorkflow], data_converter=DATA_CONVERTER).replay_workflow(
            WorkflowHistory.from_json(path.stem, path.read_text()))


async def test_a_failing_replay_prints_the_report_only(dev_client: Client, tmp_path, monkeypatch):
    """In a process of its own (the core writes its logs to the process's stderr, past capsys): a
    history that fails to replay is reported on stdout, with nothing from the core on stderr."""
    import asyncio
    import os
    import subprocess
    import sys

    task_queue = f"replay-quiet-{uuid.uuid4().hex[:8]}"
    async with Worker(dev_client, task_queue=task_queue, workflows=[ReplayProbeWorkflow]):
        await (await dev_client.start_workflow(ReplayProbeWorkflow.run, "return", id=task_queue, task_queue=task_queue)).result()
    profile_file = tmp_path / "temporal.toml"
    profile_file.write_text("")
    env = {key: value for key, value in os.environ.items() if not key.startswith("TEMPORAL_")}
    env.update(TEMPORAL_ADDRESS=dev_client.service_client.config.target_host, TEMPORAL_CONFIG_FILE=str(profile_file))
    query = f"TaskQueue = '{task_queue}'"

    def run(classes: str = "") -> subprocess.CompletedProcess[str]:
        code = "from worker.cli import main; main()"
        if classes:  # replay against these classes instead of the installed ones
            code = f"import worker.cli.replay as r, tests.support.replay_probe as p; r.workflow_classes = lambda: [p.{classes}]; " + code
        return subprocess.run([sys.executable, "-c", code, "replay", "--query", query],
                              env=env, capture_output=True, text=True, timeout=120)

    from tests.support.processes import eventually

    async def reported():
        done = await asyncio.to_thread(run)
        return done if f"{REPLAY_PROBE}: 1 replayed" in done.stdout else None

    done = await eventually(reported, "the probe run listed", 30, interval=0.5)
    assert done.returncode == 1  # the installed classes have no ReplayProbeWorkflow
    assert f"failed {task_queue} (run " in done.stdout and "is not registered" in done.stdout
    assert done.stderr == ""
    changed = await asyncio.to_thread(run, "ChangedReplayProbeWorkflow")
    assert changed.returncode == 1 and f"{NONDETERMINISTIC} {task_queue} (run " in changed.stdout
    assert changed.stderr == ""
    original = await asyncio.to_thread(run, "ReplayProbeWorkflow")
    assert original.returncode == 0 and f"{REPLAY_PROBE}: 1 replayed, 1 passed" in original.stdout
    assert original.stderr == ""
