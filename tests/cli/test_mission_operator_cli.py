"""Operator CLI around a mission: host groups must exist (and are listed with their usage), a failed
child shows how it ended and its stderr, `mission logs` prints a child's output and log, and the
lifetime of long-lived children is explicit (`run` says what still runs; `stop` waits for the
verdict, `cancel` abandons).

Real dev server, real worker and substrate (its file:// artifacts are on this machine).
"""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from tests.support.substrate_fixtures import substrate  # noqa: F401  (fixture)
from tests.support.cli_support import Result, conductor, without_profiles
from tests.support.mission_harness import POLICY, mission_harness
from tests.support.processes import eventually
from tests.support.substrate_support import EXECUTOR_TOKEN
from worker.child_output import local_path, read_file_tail
from worker.config import DEFAULT_POLICY
from worker.stack import DevStack
from workflows.admission.messages import AdmissionWorkflowInput, admission_workflow_id
from workflows.admission.model import AdmissionPolicy, AuditEvent
from workflows.mission.messages import mission_workflow_id

OPERATOR = "ops-tester"


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, tmp_path):
    """Returns a function that points the CLI at a harness (and no profile of whoever runs the tests)."""
    without_profiles(monkeypatch, tmp_path)
    monkeypatch.setenv("TEMPORAL_NAMESPACE", "default")
    monkeypatch.setenv("CONDUCTOR_RECONNECT_SECONDS", "5")
    monkeypatch.setenv("USER", OPERATOR)

    def point_at(h, *, executor: bool = True) -> None:
        for key, value in h.cli_env().items():
            monkeypatch.setenv(key, value)
        # Where a child's output lives: the substrate's executor plane, read with its token.
        monkeypatch.setenv("CONDUCTOR_SUBSTRATE_URL", h.substrate.base_url)
        monkeypatch.delenv("CONDUCTOR_EXECUTOR_TOKEN_FILE", raising=False)
        if executor:
            monkeypatch.setenv("CONDUCTOR_EXECUTOR_TOKEN", EXECUTOR_TOKEN)
        else:
            monkeypatch.delenv("CONDUCTOR_EXECUTOR_TOKEN", raising=False)
    return point_at


def one_shot(child_id: str, prompt: str) -> dict:
    return {"child_id": child_id, "kind": "one-shot-command", "prompt": prompt}


def daemon(child_id: str, prompt: str = "sleep 300") -> dict:
    return {"child_id": child_id, "kind": "daemon", "prompt": prompt}


def write_spec(tmp_path, spec: dict):
    path = tmp_path / f"{spec['mission_id']}.json"
    path.write_text(json.dumps(spec))
    return str(path)


async def exists(client: Client, workflow_id: str) -> bool:
    try:
        await client.get_workflow_handle(workflow_id).describe()
    except RPCError as error:
        if error.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    return True


# --- host groups: must exist, --create-host-group, listing ------------------------------------------


async def test_a_host_group_typo_is_refused_and_create_host_group_is_the_explicit_way(
    dev_client: Client, substrate, tmp_path, cli_env, capsys,
):
    async with mission_harness(dev_client, substrate, tmp_path) as h:
        cli_env(h)
        spec = h.spec("typo", [one_shot("only", "echo hi")])
        known = f"known-{h.suffix}"
        policy_file = tmp_path / "policy.json"
        policy_file.write_text(json.dumps({"max_concurrent": 2}))
        assert (await conductor(capsys, "admission", "policy", "set", "--host-group", known, str(policy_file))).code == 0

        async def refused_naming_known(command: str) -> Result | None:
            refused = await conductor(capsys, "mission", command, write_spec(tmp_path, spec))
            return refused if known in refused.err else None  # visibility lists the new workflow soon after

        for command in ("run", "start"):
            refused = await h.until(lambda: refused_naming_known(command), "the refusal naming the known host group")
            assert refused.code == 2 and refused.out == "", refused
            assert refused.line.startswith(
                f"conductor: host group '{spec['host_group']}' has no admission workflow "
                f"(admission:{spec['host_group']} does not run; host groups: "
            )
            assert refused.line.endswith(
                "fix host_group in the spec, or create it with --create-host-group (the default policy) or "
                f"`conductor admission policy set --host-group {spec['host_group']} POLICY.json`"
            )
            assert not await exists(dev_client, mission_workflow_id(spec["mission_id"]))  # nothing started
            assert not await exists(dev_client, admission_workflow_id(spec["host_group"]))

        created = await conductor(capsys, "mission", "run", "--create-host-group", write_spec(tmp_path, spec))
        assert created.code == 0, created
        assert f"created host group {spec['host_group']} with the default admission policy (by {OPERATOR})" in created.err
        admission = dev_client.get_workflow_handle(admission_workflow_id(spec["host_group"]))
        # The default policy as the CLI's environment says (CONDUCTOR_ADMISSION_POLICY, else the built-in one).
        assert await admission.query("policy", result_type=AdmissionPolicy) == DEFAULT_POLICY
        audit = await admission.query("audit", 200, result_type=list[AuditEvent])
        assert any(e.type == "policy-changed" and e.reason == f"policy changed by {OPERATOR}" for e in audit)

        # Now it exists: a second mission on it needs no flag, and the flag changes no policy.
        again = h.spec("second", [one_shot("only", "echo again")])
        result = await conductor(capsys, "mission", "run", write_spec(tmp_path, again))
        assert result.code == 0 and "created host group" not in result.err, result
        flagged = h.spec("third", [one_shot("only", "echo third")])
        result = await conductor(capsys, "mission", "start", "--create-host-group", write_spec(tmp_path, flagged))
        assert result.code == 0 and result.err == "" and result.out == f"{flagged['mission_id']}\n", result
        audit = await admission.query("audit", 200, result_type=list[AuditEvent])
        assert sum(1 for e in audit if e.type == "policy-changed") == 1


async def test_host_groups_lists_each_with_its_usage(dev_client: Client, substrate, tmp_path, cli_env, capsys):
    async with mission_harness(dev_client, substrate, tmp_path) as h:
        cli_env(h)
        busy = h.spec("busy", [daemon("api"), one_shot("report", "echo done")])
        started = await conductor(capsys, "mission", "run", "--create-host-group", write_spec(tmp_path, busy))
        assert started.code == 0, started
        idle_group = f"idle-{h.suffix}"
        policy_file = tmp_path / "policy.json"
        policy_file.write_text(json.dumps({"max_concurrent": 3, "environment_quotas": {"prod": 1}}))
        set_policy = await conductor(capsys, "admission", "policy", "set", "--host-group", idle_group, str(policy_file))
        assert set_policy.code == 0, set_policy
        # A host group whose admission workflow no worker runs is listed all the same, with a note.
        dead_group = f"dead-{h.suffix}"
        await dev_client.start_workflow(
            "AdmissionWorkflow", AdmissionWorkflowInput(host_group=dead_group, policy=DEFAULT_POLICY),
            id=admission_workflow_id(dead_group), task_queue=f"tq-nobody-{h.suffix}",
        )

        async def listed() -> dict | None:
            result = await conductor(capsys, "admission", "host-groups", "--json")
            assert result.code == 0, result
            rows = {row["host_group"]: row for row in result.json}
            if not {busy["host_group"], idle_group, dead_group} <= set(rows):
                return None
            # The one-shot's release travels unconfirmed, so the singleton may apply it a moment after it ends.
            return rows if rows[busy["host_group"]]["leases"] == 1 else None

        rows = await h.until(listed, "every host group in visibility and the one-shot's lease given back")
        row = rows[busy["host_group"]]
        assert row["workflow_id"] == admission_workflow_id(busy["host_group"]) and row["note"] is None
        assert row["queued"] == 0  # the daemon holds its lease; the one-shot released
        usage = {u["limit"]: (u["used"], u["maximum"]) for u in row["usage"]}
        assert usage["global"] == (1, POLICY.max_concurrent) and usage["runtime host"] == (1, 8)
        idle = rows[idle_group]
        assert idle["leases"] == 0 and idle["queued"] == 0
        assert {u["limit"]: (u["used"], u["maximum"]) for u in idle["usage"]}["global"] == (0, 3)

        dead = rows[dead_group]
        assert (dead["queued"], dead["leases"], dead["usage"]) == (None, None, []) and dead["note"], dead

        table = await conductor(capsys, "admission", "host-groups")
        assert table.code == 0 and table.err == ""
        lines = {line.split()[0]: line for line in table.out.splitlines()[1:]}
        assert table.out.splitlines()[0].split()[:3] == ["HOST", "GROUP", "QUEUED"]
        assert lines[busy["host_group"]].split()[1:4] == ["0", "1", "1/8"]
        assert "environment prod 0/1" in lines[idle_group]
        assert lines[dead_group].split()[1:4] == ["-", "-", "-"] and "not read: " in lines[dead_group]
        await h.control.stop(busy["mission_id"])
        await dev_client.get_workflow_handle(admission_workflow_id(dead_group)).terminate("test over")


# --- lifetimes ---------------------------------------------------------------------------------------


async def test_run_names_what_still_runs_and_stop_waits_for_the_verdict(
    dev_client: Client, substrate, tmp_path, cli_env, capsys,
):
    async with mission_harness(dev_client, substrate, tmp_path) as h:
        cli_env(h)
        # All-pass with a one-shot that takes a while: a stop now would fail the mission; it is refused.
        slow = h.spec("slow", [one_shot("slow", "sleep 30; echo late"), daemon("api")])
        started = await conductor(capsys, "mission", "start", "--create-host-group", write_spec(tmp_path, slow))
        assert started.code == 0, started
        stop = await conductor(capsys, "mission", "stop", slow["mission_id"])
        assert stop.code == 1 and stop.out == "", stop
        assert stop.line.startswith(f"conductor: mission {slow['mission_id']} has no verdict yet (")
        assert stop.line.endswith(f"to abandon the mission, `conductor mission cancel {slow['mission_id']}`")
        handle = dev_client.get_workflow_handle(mission_workflow_id(slow["mission_id"]))
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
        ledger = await h.control.show(slow["mission_id"])
        assert ledger.parent_state not in ("failed", "completed") and not any(c.cancel_requested for c in ledger.children)
        cancel = await conductor(capsys, "mission", "cancel", slow["mission_id"])
        assert cancel.code == 0, cancel

        # The verdict settles with the daemon still running: run says so, naming the command that stops it.
        live = h.spec("live", [one_shot("report", "echo done"), daemon("api")])
        for as_json in (False, True):
            spec = {**live, "mission_id": f"{live['mission_id']}-{int(as_json)}"}
            result = await conductor(capsys, "mission", "run", write_spec(tmp_path, spec), *(["--json"] if as_json else []))
            assert result.code == 0, result
            note = (
                f"the verdict has settled, but mission {spec['mission_id']} still runs api (long-lived, holding its "
                f"lease): `conductor mission stop {spec['mission_id']}` stops them and closes the mission"
            )
            if as_json:
                assert json.loads(result.out)["parent_state"] == "completed" and result.err.strip() == note
            else:
                assert result.out.rstrip().endswith(note)
            stopped = await conductor(capsys, "mission", "stop", spec["mission_id"])
            assert (stopped.code, stopped.out) == (0, f"stop requested for mission {spec['mission_id']}\n"), stopped
            final = await asyncio.wait_for(h.control.handle(spec["mission_id"]).result(), 45)
            assert final.parent_state == "completed"

        # Nothing long-lived: nothing to say.
        short = h.spec("short", [one_shot("only", "echo hi")])
        result = await conductor(capsys, "mission", "run", write_spec(tmp_path, short))
        assert result.code == 0 and "still runs" not in result.out + result.err


# --- a failed child: exit status and stderr; mission logs --------------------------------------------


async def test_a_failed_child_shows_its_exit_status_and_stderr_and_logs_prints_both(
    dev_client: Client, substrate, tmp_path, cli_env, capsys,
):
    async with mission_harness(dev_client, substrate, tmp_path) as h:
        cli_env(h)
        prompt = "echo 'partial result'; for i in 1 2 3 4 5 6 7 8 9 10 11 12; do echo \"line $i\" >&2; done; echo 'boom: disk full' >&2; exit 3"
        spec = h.spec("broken", [one_shot("build", prompt), one_shot("ok", "echo fine")])
        run = await conductor(capsys, "mission", "run", "--create-host-group", write_spec(tmp_path, spec))
        assert run.code == 1, run
        assert "ended: exit status 3" in run.out and "| boom: disk full" in run.out

        shown = await conductor(capsys, "mission", "show", spec["mission_id"])
        assert shown.code == 0 and shown.err == "", shown
        lines = shown.out.splitlines()
        at = next(i for i, line in enumerate(lines) if " build " in line and "FAIL" in line)
        assert lines[at + 1].strip().startswith("ended: exit status 3 (")
        assert lines[at + 2].strip().startswith("stderr (last 10 lines, ")
        tail = [line.strip() for line in lines[at + 3: at + 13]]
        assert tail[0] == "| line 4" and tail[-1] == "| boom: disk full"
        assert not any("ended:" in line for line in lines[at + 13:]), "only the failed child gets the lines"

        logs = await conductor(capsys, "mission", "logs", f"mission:{spec['mission_id']}", "build")
        assert logs.code == 0 and logs.err == "", logs
        out = logs.out.splitlines()
        assert out[0].startswith("==> build stdout (") and out[1] == "partial result"
        assert out[2].startswith("==> build stderr (") and out[3] == "line 1" and out[-1] == "boom: disk full"

        # Without the executor-plane token the output cannot be read: a line says where it is.
        cli_env(h, executor=False)
        blind = await conductor(capsys, "mission", "show", spec["mission_id"])
        assert blind.code == 0 and blind.err == ""
        said = [line.strip() for line in blind.out.splitlines() if line.strip().startswith("stderr: ")]
        assert len(said) == 1 and "CONDUCTOR_EXECUTOR_TOKEN" in said[0], blind.out
        cli_env(h)

        unknown = await conductor(capsys, "mission", "logs", spec["mission_id"], "nope")
        assert unknown.code == 1 and unknown.out == ""
        assert unknown.line == f"conductor: mission {spec['mission_id']} has no child 'nope' (children: build, ok)"


async def test_logs_follow_prints_until_the_child_ends(dev_client: Client, substrate, tmp_path, cli_env, capsys):
    async with mission_harness(dev_client, substrate, tmp_path) as h:
        cli_env(h)
        spec = h.spec("follow", [one_shot("slow", "sleep 2; echo finally; echo warned >&2")])
        started = await conductor(capsys, "mission", "start", "--create-host-group", write_spec(tmp_path, spec))
        assert started.code == 0, started
        nothing = await conductor(capsys, "mission", "logs", spec["mission_id"], "slow")
        assert nothing.code == 0 and nothing.out == ""
        assert nothing.line.startswith("conductor: slow has reported no output or log yet (")
        followed = await asyncio.wait_for(conductor(capsys, "mission", "logs", spec["mission_id"], "slow", "--follow"), 60)
        assert followed.code == 0, followed
        assert followed.line == "conductor: slow has ended (succeeded)"
        out = followed.out.splitlines()
        assert out[1] == "finally" and out[3] == "warned" and len(out) == 4


def test_a_file_artifact_elsewhere_is_named_not_read(tmp_path):
    here = tmp_path / "stderr.txt"
    here.write_bytes(b"x" * 100 + b"\nlast line\n")
    tail = read_file_tail(here.as_uri(), "stderr", 10)
    assert tail.text == "last line\n" and tail.skipped == 101
    elsewhere = "file://build-host-7/var/tasks/t1/stderr.txt"
    assert local_path(elsewhere) is None
    tail = read_file_tail(elsewhere, "stderr", 10)
    assert tail.text is None and "not a file on this machine" in tail.problem
    assert "not readable here" in read_file_tail((tmp_path / "gone.txt").as_uri(), "stderr", 10).problem
    assert "not a file on this machine" in read_file_tail("s3://bucket/key", "stderr", 10).problem


# --- the dev stack creates `default` ------------------------------------------------------------------


async def test_the_dev_stack_creates_the_default_host_group_and_keeps_its_policy(tmp_path, monkeypatch, capsys):
    without_profiles(monkeypatch, tmp_path, "CONDUCTOR_EXECUTOR_TOKEN", "CONDUCTOR_FLEET_TOKEN")
    monkeypatch.setenv("CONDUCTOR_RECONNECT_SECONDS", "5")
    data = tmp_path / "data"
    custom = tmp_path / "policy.json"
    custom.write_text(json.dumps({"max_concurrent": 5, "runtime_quotas": {"host": 5}}))
    async with DevStack(data, temporal_port=0, ui_port=0, substrate_port=0, instances=1) as stack:
        for key, value in stack.cli_environment().items():
            monkeypatch.setenv(key, value)
        admission = stack.client.get_workflow_handle(admission_workflow_id("default"))
        assert await admission.query("policy", result_type=AdmissionPolicy) == stack.worker_config.policy_for("default")
        audit = await admission.query("audit", 50, result_type=list[AuditEvent])
        assert [e.reason for e in audit if e.type == "policy-changed"] == ["policy changed by conductor-dev"]

        spec = {"mission_id": f"on-default-{uuid.uuid4().hex[:6]}", "orchestrator_id": "tests", "goal": "the default host group",
                "children": [one_shot("only", "echo hi")]}  # host_group left out: "default"
        run = await conductor(capsys, "mission", "run", write_spec(tmp_path, spec))
        assert run.code == 0 and "created host group" not in run.err, run

        async def listed() -> list | None:
            result = await conductor(capsys, "admission", "host-groups", "--json")
            return result.json if result.code == 0 and result.json else None

        rows = await eventually(listed, "the default host group in visibility", 30)
        assert [row["host_group"] for row in rows] == ["default"]
        changed = await conductor(capsys, "admission", "policy", "set", "--host-group", "default", str(custom))
        assert changed.code == 0, changed
    # Started again on the same data: the admission workflow runs on, and the operator's policy stays.
    async with DevStack(data, temporal_port=0, ui_port=0, substrate_port=0, instances=1) as again:
        admission = again.client.get_workflow_handle(admission_workflow_id("default"))
        assert (await admission.query("policy", result_type=AdmissionPolicy)).max_concurrent == 5


def test_a_settled_ledger_states_its_verdict_once():
    """The live summary follows the children past the verdict (a fourth child satisfied after a
    quorum of three): the ledger says the verdict's reason once, and the children since as counts."""
    from worker.ledger_view import render_ledger
    from workflows.mission.ledger import AggregationSummary, MissionLedger

    ledger = MissionLedger(
        mission_id="m", parent_state="completed", children=(),
        aggregation=AggregationSummary(mode="quorum", required_successes=3, successful=("a", "b", "c", "d"),
                                       reason="quorum 4/4 met (needs 3): a, b, c, d satisfied"),
        verdict_reason="quorum 3/4 met (needs 3): a, b, c satisfied",
    )
    lines = render_ledger(ledger).splitlines()
    assert lines[1] == "  verdict (quorum): quorum 3/4 met (needs 3): a, b, c satisfied"
    assert lines[2] == "  children now: 4 ok, 0 failed, 0 pending, 0 review (the verdict stays as it settled)"
    assert sum("met" in line for line in lines) == 1
    undecided = ledger.model_copy(update={"parent_state": "running", "verdict_reason": None})
    assert render_ledger(undecided).splitlines()[1] == "  aggregation quorum: quorum 4/4 met (needs 3): a, b, c, d satisfied"
