"""`conductor admission queue|leases|usage|audit|what-if|policy`: the operator's live views, on the dev server.

Each test starts a worker on its own task queue, puts holders and waiters in
place with probe workflows, then runs the real CLI (`worker.cli.run`) in a
thread (it calls `asyncio.run`, which cannot nest in the test's loop) with
TEMPORAL_ADDRESS and CONDUCTOR_TASK_QUEUE pointing at that server and worker.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from tests.support.admission_harness import Harness, admission_harness
from tests.support.cli_support import Result, without_profiles
from tests.support.cli_support import conductor as run_conductor
from worker import admission_live
from worker.ports import free_port
from worker.tables import human_duration
from workflows.admission.messages import admission_workflow_id
from workflows.admission.model import AdmissionPolicy
from workflows.admission.probe import ProbeRequest

HOLD = 3600


class Conductor:
    """Runs `conductor ...` against the dev server and returns exit code, stdout and stderr."""

    def __init__(self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
        self.capsys = capsys
        self.monkeypatch = monkeypatch

    def use_task_queue(self, task_queue: str) -> None:
        self.monkeypatch.setenv("CONDUCTOR_TASK_QUEUE", task_queue)

    async def __call__(self, *argv: str) -> Result:
        return await run_conductor(self.capsys, "admission", *argv)


@pytest.fixture
def conductor(dev_env: WorkflowEnvironment, capsys, monkeypatch, tmp_path) -> Conductor:
    without_profiles(monkeypatch, tmp_path, "CONDUCTOR_ADMISSION_POLICY")
    monkeypatch.setenv("TEMPORAL_ADDRESS", dev_env.client.service_client.config.target_host)
    monkeypatch.setenv("TEMPORAL_NAMESPACE", dev_env.client.namespace)
    return Conductor(capsys, monkeypatch)


def column_of(table: str, header: str, row_starting: str) -> str:
    """The cell under `header` in the row whose first cell is `row_starting` (tables are space-aligned)."""
    lines = table.splitlines()
    start = lines[0].index(header)
    following = re.search(r"\S", lines[0][start + len(header):])
    end = start + len(header) + following.start() if following else None
    [row] = [line for line in lines[1:] if line.split()[0] == row_starting]
    return row[start:end].strip()


def write_json(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data))
    return path


async def holder_and_waiters(h: Harness) -> None:
    await h.start_probe("p1", ProbeRequest(request_id="p1", environment="prod"), hold_seconds=HOLD)
    await h.start_probe("d1", ProbeRequest(request_id="d1", environment="dev", lane="ci"), hold_seconds=HOLD)
    await h.until_leased("p1", "d1")
    await h.start_probe("p2", ProbeRequest(request_id="p2", environment="prod", priority=2), hold_seconds=HOLD)
    await h.until_queued("p2")
    await h.start_probe("p3", ProbeRequest(request_id="p3", environment="prod", priority=0), hold_seconds=HOLD)
    await h.until_queued("p3")


async def test_queue_leases_usage_audit_what_if_and_policy_show(conductor, dev_client, tmp_path):
    # Aging and renewals (every TTL/3) far away, so priorities and the audit hold still while the test looks.
    policy = AdmissionPolicy(max_concurrent=3, environment_quotas={"prod": 1}, lease_ttl_seconds=900,
                             aging_interval_seconds=3600)
    async with admission_harness(dev_client, tmp_path, policy) as h:
        await holder_and_waiters(h)
        group = ["--host-group", h.host_group]

        queue = await conductor("queue", *group)
        assert queue.code == 0 and queue.err == ""
        lines = queue.out.splitlines()
        assert lines[0].split()[:6] == ["POS", "REQUEST", "REQUESTER", "PRIORITY", "EFFECTIVE", "WAITED"]
        assert [line.split()[:2] for line in lines[1:]] == [["1", "p2"], ["2", "p3"]]
        assert column_of(queue.out, "REQUESTER", "1") == f"probe:{h.host_group}:p2"
        assert column_of(queue.out, "BINDING CONSTRAINT", "1") == "waiting on environment prod 1/1"
        assert re.fullmatch(r"\d+s|\d+m\d\ds", column_of(queue.out, "WAITED", "2"))
        # Aligned: every row's request starts under the REQUEST header.
        assert {line.index(" p", 1) + 1 for line in lines[1:]} == {lines[0].index("REQUEST")}

        queue_json = (await conductor("queue", *group, "--json")).json
        assert [(r["position"], r["request_id"], r["requester"], r["priority"], r["effective_priority"],
                 r["binding_constraint"]) for r in queue_json] == [
            (1, "p2", f"probe:{h.host_group}:p2", 2, 2, "environment prod 1/1"),
            (2, "p3", f"probe:{h.host_group}:p3", 0, 0, "environment prod 1/1"),
        ]
        assert set(queue_json[0]) == {"request_id", "requester", "position", "priority", "effective_priority",
                                      "binding_constraint", "waited_seconds", "eta"}
        # Both wait on leases that declared no expected duration: when they start cannot be known.
        assert [r["eta"] for r in queue_json] == [None, None] and column_of(queue.out, "ETA (UTC)", "1") == "unknown"
        limited = await conductor("queue", *group, "--limit", "1")
        assert limited.out.splitlines()[1].split()[:2] == ["1", "p2"] and "first 1 shown" in limited.out
        assert [r["request_id"] for r in (await conductor("queue", *group, "--limit", "1", "--json")).json] == ["p2"]

        leases = await conductor("leases", *group)
        assert leases.code == 0
        assert column_of(leases.out, "HOLDER", "p1") == f"probe:{h.host_group}:p1"
        assert [column_of(leases.out, header, "d1") for header in ("ENVIRONMENT", "PROVIDER", "RUNTIME", "LANE")] == [
            "dev", "local", "container", "ci"]
        assert column_of(leases.out, "LANE", "p1") == "-"
        expires = re.fullmatch(r"(\d+)m(\d\d)s", column_of(leases.out, "EXPIRES IN", "p1"))
        assert expires and 840 <= int(expires[1]) * 60 + int(expires[2]) <= 900
        leases_json = (await conductor("leases", *group, "--json")).json
        by_id = {row["request_id"]: row for row in leases_json}
        assert set(by_id) == {"p1", "d1"}
        assert by_id["d1"]["holder"] == f"probe:{h.host_group}:d1" and by_id["d1"]["lane"] == "ci"
        assert by_id["p1"]["lease_revision"] >= 1 and column_of(leases.out, "LEASE REV", "p1").isdigit()

        usage = await conductor("usage", *group)
        assert column_of(usage.out, "USED", "global") == "2" and column_of(usage.out, "OF", "global") == "3"
        usage_rows = {row["limit"]: (row["used"], row["maximum"]) for row in (await conductor("usage", *group, "--json")).json}
        assert usage_rows["global"] == (2, 3)
        assert usage_rows["environment prod"] == (1, 1)
        assert usage_rows["environment dev"] == (1, None)
        assert usage_rows["lane ci"] == (1, None)
        dev_line = next(line for line in usage.out.splitlines() if line.startswith("environment dev"))
        assert dev_line.split()[-2:] == ["1", "unlimited"]

        audit = await conductor("audit", *group)
        assert audit.code == 0 and audit.out.splitlines()[0].split()[:3] == ["SEQ", "TIME", "(UTC)"]
        audit_json = (await conductor("audit", *group, "--json")).json
        assert [e["seq"] for e in audit_json] == sorted(e["seq"] for e in audit_json)
        p1_events = [e for e in audit_json if e["request_id"] == "p1" and e["type"] != "renewed"]
        assert [(e["type"], e["from_state"], e["to_state"]) for e in p1_events] == [
            ("queued", None, "queued"), ("admitted", "queued", "admitted")]
        admitted_line = next(line for line in audit.out.splitlines() if " admitted " in line and " p1 " in line)
        assert "queued->admitted" in admitted_line
        last_two = (await conductor("audit", *group, "--limit", "2", "--json")).json
        assert last_two == audit_json[-2:]

        prod = write_json(tmp_path / "prod.json", {"request_id": "new", "environment": "prod", "provider": "local",
                                                   "runtime_kind": "container", "priority": 0})
        dev = write_json(tmp_path / "dev.json", {"request_id": "new", "environment": "dev", "provider": "local",
                                                 "runtime_kind": "container", "priority": 0})
        queued = await conductor("what-if", *group, str(prod))
        assert queued.code == 0 and queued.out.strip() == "queued: position 3, waiting on environment prod 1/1"
        assert (await conductor("what-if", *group, str(dev), "--json")).json == {
            "outcome": "admitted", "explanation": "fits every limit now", "eta": None}

        shown = await conductor("policy", "show", *group)
        assert column_of(shown.out, "VALUE", "max_concurrent") == "3"
        assert column_of(shown.out, "VALUE", "environment_quotas") == "prod=1 (others unlimited)"
        assert (await conductor("policy", "show", *group, "--json")).json == policy.model_dump(mode="json")
        assert await h.queued() == ["p2", "p3"]  # looking changed nothing


async def test_policy_set_changes_the_live_policy_and_a_bad_file_sends_nothing(conductor, dev_client, tmp_path):
    policy = AdmissionPolicy(max_concurrent=1, lease_ttl_seconds=60)
    async with admission_harness(dev_client, tmp_path, policy) as h:
        conductor.use_task_queue(h.config.task_queue)
        group = ["--host-group", h.host_group]
        await h.start_probe("a", ProbeRequest(request_id="a"), hold_seconds=HOLD)
        await h.until_leased("a")
        await h.start_probe("b", ProbeRequest(request_id="b"), hold_seconds=HOLD)
        await h.until_queued("b")
        assert column_of((await conductor("queue", *group)).out, "BINDING CONSTRAINT", "1") == "waiting on global 1/1"

        bad = write_json(tmp_path / "bad.json", {"max_concurrent": -1, "lease_ttl_seconds": 0, "surprise": True})
        refused = await conductor("policy", "set", *group, str(bad), "--operator", "alice")
        assert refused.code == 2 and refused.out == ""
        assert refused.err.count("\n") == 1 and refused.err.startswith(f"conductor: invalid policy {bad}: ")
        for field in ("max_concurrent", "lease_ttl_seconds", "surprise"):
            assert f"{field}: " in refused.err
        not_json = tmp_path / "not.json"
        not_json.write_text("{max_concurrent: 2")
        garbled = await conductor("policy", "set", *group, str(not_json))
        assert garbled.code == 2 and "is not JSON" in garbled.err
        assert (await conductor("policy", "show", *group, "--json")).json == policy.model_dump(mode="json")
        assert "policy-changed" not in [e["type"] for e in (await conductor("audit", *group, "--json")).json]

        raised = write_json(tmp_path / "raised.json", {"max_concurrent": 3, "lease_ttl_seconds": 60})
        accepted = await conductor("policy", "set", *group, str(raised), "--operator", "alice")
        assert accepted.code == 0, accepted.err
        assert accepted.out.strip() == f"policy change for host group {h.host_group} sent and applied (by alice)"
        await h.until_leased("a", "b")
        assert (await conductor("policy", "show", *group, "--json")).json["max_concurrent"] == 3
        events = (await conductor("audit", *group, "--json")).json
        [change] = [e for e in events if e["type"] == "policy-changed"]
        assert change["policy"] == "set_policy"
        [b_admitted] = [e for e in events if e["type"] == "admitted" and e["request_id"] == "b"]
        assert b_admitted["seq"] > change["seq"]
        audit_table = (await conductor("audit", *group)).out
        assert any("policy-changed" in line and "set_policy" in line for line in audit_table.splitlines())
        empty = await conductor("queue", *group)
        assert empty.code == 0 and empty.out.strip() == f"queue is empty: nothing is waiting on host group {h.host_group}"
        assert (await conductor("queue", *group, "--json")).json == []

        # Hold: nothing new is admitted, the leases run on, every view says so; resume lets it in.
        held = await conductor("hold", *group, "--reason", "kernel upgrade", "--operator", "alice")
        assert held.code == 0 and held.out.strip() == f"host group {h.host_group} held and applied (by alice)", held.err
        await h.start_probe("c", ProbeRequest(request_id="c"), hold_seconds=HOLD)
        await h.until_queued("c")
        assert column_of((await conductor("queue", *group)).out, "BINDING CONSTRAINT", "1") == "waiting on hold: kernel upgrade"
        usage_text = (await conductor("usage", *group)).out
        assert usage_text.splitlines()[0].startswith(f"host group {h.host_group} is HELD (kernel upgrade): nothing new")
        assert set(await h.leased()) == {"a", "b"}
        no_reason = await conductor("hold", *group, "--reason", " ")
        assert no_reason.code == 2 and "--reason" in no_reason.err
        resumed = await conductor("resume", *group, "--operator", "alice")
        assert resumed.code == 0 and resumed.out.strip() == f"host group {h.host_group} resumed and applied (by alice)"
        await h.until_leased("c")
        reasons = [(e["reason"], e["policy"]) for e in (await conductor("audit", *group, "--json")).json
                   if e["type"] == "policy-changed"]
        assert reasons[-2:] == [("admission held by alice: kernel upgrade", "hold"), ("admission resumed by alice", "hold")]


async def test_policy_set_starts_the_admission_workflow_when_none_runs(conductor, dev_client, monkeypatch, tmp_path):
    async with admission_harness(dev_client, tmp_path, AdmissionPolicy(max_concurrent=1)) as h:
        conductor.use_task_queue(h.config.task_queue)
        monkeypatch.setenv("USER", "night-operator")
        group = ["--host-group", h.host_group]
        assert (await conductor("usage", *group)).code == 1  # nothing there yet
        wanted = {"max_concurrent": 4, "environment_quotas": {"prod": 2}}
        started = await conductor("policy", "set", *group, str(write_json(tmp_path / "p.json", wanted)))
        assert started.code == 0, started.err
        assert started.out.strip() == (
            f"started the admission workflow for host group {h.host_group} with this policy and applied (by night-operator)")
        assert (await conductor("policy", "show", *group, "--json")).json == AdmissionPolicy(**wanted).model_dump(mode="json")
        assert [e["type"] for e in (await conductor("audit", *group, "--json")).json] == ["policy-changed"]
        usage = {row["limit"]: (row["used"], row["maximum"]) for row in (await conductor("usage", *group, "--json")).json}
        assert usage["global"] == (0, 4) and usage["environment prod"] == (0, 2)
        empty = await conductor("leases", *group)
        assert empty.code == 0 and empty.out.strip() == f"no leases held on host group {h.host_group}"


async def test_missing_workflow_is_one_line_and_exit_1(conductor, dev_client, tmp_path):
    group = ["--host-group", "hg-nobody-asked"]
    expected = "conductor: no admission workflow for host group hg-nobody-asked yet: nothing has asked for admission there\n"
    request = write_json(tmp_path / "r.json", {"request_id": "x", "environment": "prod", "provider": "local",
                                               "runtime_kind": "container", "priority": 0})
    for argv in (["queue"], ["leases"], ["usage", "--json"], ["audit"], ["policy", "show"], ["what-if", str(request)]):
        result = await conductor(*argv, *group)
        assert (result.code, result.out, result.err) == (1, "", expected), argv


async def test_a_stopped_workflow_or_one_without_a_worker_is_one_line_and_exit_1(conductor, dev_client, monkeypatch,
                                                                                 tmp_path):
    async with admission_harness(dev_client, tmp_path, AdmissionPolicy(max_concurrent=1)) as h:
        await h.start_probe("a", ProbeRequest(request_id="a"), hold_seconds=HOLD)
        await h.until_leased("a")
        group = ["--host-group", h.host_group]
        # The harness stops the worker and terminates the admission workflow on the way out.
    stopped = await conductor("leases", *group)
    assert (stopped.code, stopped.out) == (1, "")
    assert stopped.err == (f"conductor: the admission workflow for host group {h.host_group} is not running "
                           "(TERMINATED); the next request for admission there starts a new one\n")

    monkeypatch.setattr(admission_live, "QUERY_TIMEOUT", timedelta(seconds=1))
    orphan = "hg-no-worker-" + h.host_group
    conductor.use_task_queue("tq-no-worker-here")
    started = await conductor("policy", "set", "--host-group", orphan, "--wait", "0.5",
                              str(write_json(tmp_path / "p.json", {"max_concurrent": 1})))
    assert started.code == 0 and started.out.strip().endswith(
        "not applied within 2s: the server holds it until a conductor worker on task queue tq-no-worker-here "
        "runs the admission workflow")
    try:
        silent = await conductor("usage", "--host-group", orphan)
        assert (silent.code, silent.out) == (1, "")
        assert silent.err == (f"conductor: the admission workflow for host group {orphan} did not answer the usage "
                              "query within 1s: is a conductor worker running on its task queue?\n")
    finally:
        await dev_client.get_workflow_handle(admission_workflow_id(orphan)).terminate(reason="test finished")


async def test_bad_files_are_refused_before_anything_is_sent(conductor, dev_client, tmp_path):
    group = ["--host-group", "hg-bad-files"]
    bad_request = write_json(tmp_path / "r.json", {"request_id": "has space", "runtime_kind": "kubernetes",
                                                   "priority": "high", "environment": "prod", "provider": "local"})
    refused = await conductor("what-if", *group, str(bad_request))
    assert refused.code == 2 and refused.err.count("\n") == 1
    for field in ("request_id", "runtime_kind", "priority"):
        assert f"{field}: " in refused.err
    missing = await conductor("policy", "set", *group, str(tmp_path / "absent.json"))
    assert missing.code == 2 and "cannot read policy" in missing.err
    bad_policy = write_json(tmp_path / "p.json", {"max_concurrent": "lots"})
    assert (await conductor("policy", "set", *group, str(bad_policy))).code == 2
    with pytest.raises(RPCError) as error:  # nothing was started either
        await dev_client.get_workflow_handle(admission_workflow_id("hg-bad-files")).describe()
    assert error.value.status == RPCStatusCode.NOT_FOUND


async def test_unreachable_server_is_one_line_and_exit_1(conductor, monkeypatch, tmp_path):
    address = f"127.0.0.1:{free_port('127.0.0.1')}"
    monkeypatch.setenv("TEMPORAL_ADDRESS", address)
    policy = write_json(tmp_path / "p.json", {"max_concurrent": 1})
    for argv in (["queue"], ["audit", "--json"], ["policy", "set", str(policy)]):
        result = await conductor(*argv, "--host-group", "hg-any")
        assert result.code == 1 and result.out == "", argv
        assert result.err.startswith(f"conductor: cannot reach Temporal at {address}")
        assert result.err.count("\n") == 1 and "Traceback" not in result.err


def test_durations_read_like_a_person_writes_them():
    assert [human_duration(s) for s in (0, 45.9, 80, 3600 + 180, 3 * 86400 + 4 * 3600 + 59)] == [
        "0s", "45s", "1m20s", "1h03m", "3d04h"]
