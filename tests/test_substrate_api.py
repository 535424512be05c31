"""The local substrate over real HTTP on loopback, driven through the fleet and executor clients."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlparse

import httpx
import jsonschema
import pytest

from activities.a2a import RUNTIME_EXTENSION, Dispatch, build_message
from activities.sandbox_api import RuntimeIdentity
from activities.sandbox_client import (
    ExecutorClient,
    FleetClient,
    FleetRejected,
    IdempotencyCollision,
    IdentityImmutable,
    InstanceNotFound,
    StaleRevision,
    SubstrateUnavailable,
    TaskNotCancelable,
    TaskNotFound,
    WorkloadNotFound,
)
from substrate.config import SubstrateConfig
from substrate.server import RunningSubstrate, serve_in_thread, spawn
from tests.substrate_fixtures import substrate_config
from tests.substrate_support import (
    EXECUTOR_TOKEN,
    FLEET_TOKEN,
    Wiretap,
    clients,
    make_record,
    process_dead,
    process_gone,
    raw_json,
    read_pid,
    record_dict,
    wait_record,
    wait_until,
)
from workflows.contract import WorkloadStatus, parse_document

pytestmark = pytest.mark.timeout(60)


def config(data_dir: Path, **overrides: object) -> SubstrateConfig:
    """The shared fast test settings, with two targets."""
    return substrate_config(data_dir, **{"instances": 2, **overrides})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningSubstrate]:
    with serve_in_thread(config(tmp_path_factory.mktemp("substrate"))) as running:
        yield running


@pytest.fixture
async def tap() -> Wiretap:
    return Wiretap()


@pytest.fixture
async def fleet(server: RunningSubstrate, tap: Wiretap) -> AsyncIterator[FleetClient]:
    client = FleetClient(server.base_url, FLEET_TOKEN, event_hooks=tap.hooks())
    yield client
    await client.aclose()
    tap.assert_no_secrets(FLEET_TOKEN, EXECUTOR_TOKEN)


@pytest.fixture
async def executor(server: RunningSubstrate, tap: Wiretap) -> AsyncIterator[ExecutorClient]:
    client = ExecutorClient(server.base_url, EXECUTOR_TOKEN, event_hooks=tap.hooks())
    yield client
    await client.aclose()
    tap.assert_no_secrets(FLEET_TOKEN, EXECUTOR_TOKEN)


@pytest.fixture
async def raw(server: RunningSubstrate) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.base_url) as client:
        yield client


def fleet_auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {FLEET_TOKEN}"}


def executor_auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {EXECUTOR_TOKEN}", "A2A-Extensions": RUNTIME_EXTENSION}


def dispatch(child_id: str, prompt: str, kind: str = "one-shot-command", **options: object) -> Dispatch:
    return Dispatch(message_id=f"msg-{child_id}", child_id=child_id, kind=kind, prompt=prompt, **options)  # type: ignore[arg-type]


def terminal(record: object) -> bool:
    return record.status.observed_state in ("succeeded", "failed", "timed-out", "cancelled", "unknown")  # type: ignore[attr-defined]


async def admitted(fleet: FleetClient, child_id: str, kind: str = "one-shot-command", **options: object) -> None:
    await fleet.admit(make_record(child_id, kind, **options))


# --- management plane: admission -----------------------------------------------------------


async def test_admit_is_202_then_an_identical_replay_is_200_with_the_current_record(
    fleet: FleetClient, tap: Wiretap
) -> None:
    first = await fleet.admit(make_record("adm-1"))
    assert tap.last_status() == 202
    assert first.replayed is False
    assert (first.workload.status.observed_state, first.workload.status.revision) == ("admitted", 1)

    # Only last_seen differs: still the same submission.
    resubmitted = parse_document({**record_dict("adm-1"), "status": {**record_dict("adm-1")["status"],
                                  "last_seen": "2027-01-01T00:00:00Z"}})  # fmt: skip
    replay = await fleet.admit(resubmitted)  # type: ignore[arg-type]
    assert tap.last_status() == 200
    assert replay.replayed is True
    assert replay.workload == await fleet.get("adm-1") == first.workload


async def test_same_child_or_idempotency_key_with_other_content_is_a_422_collision(fleet: FleetClient) -> None:
    await fleet.admit(make_record("adm-2"))
    with pytest.raises(IdempotencyCollision) as caught:
        await fleet.admit(make_record("adm-2", timeout_seconds=61))
    assert (caught.value.status, caught.value.code) == (422, "fleet.idempotency_collision")
    assert not caught.value.retryable

    other_child = record_dict("adm-2-other")
    other_child["lineage"]["idempotency_key"] = "idem-adm-2"
    with pytest.raises(IdempotencyCollision):
        await fleet.admit(parse_document(other_child))  # type: ignore[arg-type]
    with pytest.raises(WorkloadNotFound):
        await fleet.get("adm-2-other")


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda r: r["spec"].update(credential_material="must-not-cross"), "$.spec.credential_material"),
        (lambda r: r["spec"].update(orchestrator_metadata={"db": {"nested": [{"apiKey": "x"}]}}), "apiKey"),
        (lambda r: r["lineage"].update(surprise="field"), "surprise"),
        (lambda r: r["status"].update(observed_state="running"), "pending"),
        (lambda r: r["spec"]["budgets"].update(timeout_seconds="60"), "timeout_seconds"),
    ],
    ids=["secret-key", "nested-secret-key", "unknown-key", "not-pending", "schema-violation"],
)
async def test_invalid_records_are_400_fleet_invalid_record(
    raw: httpx.AsyncClient, mutate: object, needle: str
) -> None:
    document = record_dict("adm-invalid")
    mutate(document)  # type: ignore[operator]
    response = await raw.post("/api/v2/fleet/workloads", json=document, headers=fleet_auth())
    assert response.status_code == 400
    body = raw_json(response)
    assert body["error"] == "fleet.invalid_record"
    assert needle in body["message"]
    assert "must-not-cross" not in response.text


async def test_credential_fixture_is_refused_and_kind_requirements_hold(
    raw: httpx.AsyncClient, contract_dir: Path
) -> None:
    fixture = json.loads((contract_dir / "fixtures" / "invalid-credential-material.json").read_text())
    response = await raw.post("/api/v2/fleet/workloads", json=fixture, headers=fleet_auth())
    assert (response.status_code, raw_json(response)["error"]) == (400, "fleet.invalid_record")

    no_schedule = record_dict("adm-collector", "scheduled-collector")
    no_health = record_dict("adm-daemon", "daemon")
    del no_health["status"]["health"]
    for document, field in ((no_schedule, "schedule"), (no_health, "health")):
        response = await raw.post("/api/v2/fleet/workloads", json=document, headers=fleet_auth())
        assert response.status_code == 400
        assert field in raw_json(response)["message"]


async def test_unknown_workload_is_404(fleet: FleetClient, raw: httpx.AsyncClient) -> None:
    with pytest.raises(WorkloadNotFound) as caught:
        await fleet.get("no-such-child")
    assert caught.value.status == 404
    response = await raw.get("/api/v2/fleet/workloads/no-such-child", headers=fleet_auth())
    assert raw_json(response) == {
        "error": "fleet.workload_not_found",
        "message": "no workload record with child_id 'no-such-child'",
    }


# --- management plane: observations, inventory, reconciliation -----------------------------


def status(state: str, revision: int, **extra: object) -> WorkloadStatus:
    return WorkloadStatus.model_validate(
        {"observed_state": state, "revision": revision, "last_seen": "2026-08-02T15:00:00Z", "artifacts": [], **extra}
    )


async def test_observation_compare_and_swap(fleet: FleetClient) -> None:
    await admitted(fleet, "obs-1")
    record = await fleet.observe("obs-1", 1, status("running", 2), RuntimeIdentity(task_id="task-x"))
    assert (record.status.revision, record.lineage.task_id) == (2, "task-x")

    with pytest.raises(StaleRevision) as caught:
        await fleet.observe("obs-1", 1, status("succeeded", 2))
    assert (caught.value.status, caught.value.current_revision) == (409, 2)

    with pytest.raises(FleetRejected) as rejected:  # status.revision must be expected + 1
        await fleet.observe("obs-1", 2, status("succeeded", 4))
    assert (rejected.value.status, rejected.value.code) == (400, "fleet.invalid_observation")
    assert (await fleet.get("obs-1")).status.revision == 2


async def test_runtime_identity_is_immutable_once_set(fleet: FleetClient) -> None:
    await admitted(fleet, "obs-2")
    await fleet.observe("obs-2", 1, status("running", 2), RuntimeIdentity(task_id="task-a", session_id="s-1"))
    # Repeating the same identity is not a change; adding a missing field is allowed.
    record = await fleet.observe("obs-2", 2, status("running", 3), RuntimeIdentity(task_id="task-a", command_id="c-1"))
    assert (record.lineage.task_id, record.lineage.session_id, record.lineage.command_id) == ("task-a", "s-1", "c-1")
    with pytest.raises(IdentityImmutable) as caught:
        await fleet.observe("obs-2", 3, status("running", 4), RuntimeIdentity(task_id="task-b"))
    assert (caught.value.status, caught.value.code) == (409, "fleet.runtime_identity_immutable")
    assert (await fleet.get("obs-2")).status.revision == 3


async def test_observation_that_breaks_the_contract_is_400(fleet: FleetClient, raw: httpx.AsyncClient) -> None:
    await admitted(fleet, "obs-3", "daemon")
    with pytest.raises(FleetRejected) as caught:  # a daemon's status needs health
        await fleet.observe("obs-3", 1, status("healthy", 2))
    assert "health" in caught.value.message
    response = await raw.post(
        "/api/v2/fleet/workloads/obs-3/observations",
        json={"expected_revision": 1, "status": {**status("healthy", 2, health="healthy").to_wire(), "token": "x"}},
        headers=fleet_auth(),
    )
    assert (response.status_code, raw_json(response)["error"]) == (400, "fleet.invalid_observation")


async def test_reconcile_classifies_from_stored_state_and_inventory_counts_revisions(fleet: FleetClient) -> None:
    expected = {
        "rec-succeeded": ("succeeded", "terminal"),
        "rec-failed": ("failed", "failed-or-aborted"),
        "rec-cancelled": ("cancelled", "failed-or-aborted"),
        "rec-timed-out": ("timed-out", "failed-or-aborted"),
        "rec-unknown": ("unknown", "operator-review-required"),
        "rec-review": ("operator-review-required", "operator-review-required"),
        "rec-running": ("running", "re-adopted"),
    }
    for child_id, (state, _) in expected.items():
        await admitted(fleet, child_id)
        await fleet.observe(child_id, 1, status(state, 2))
    report = await fleet.reconcile(5, [*expected, "rec-absent"])
    rows = {row.child_id: row for row in report.rows}
    for child_id, (state, classification) in expected.items():
        assert (rows[child_id].classification, rows[child_id].observed_state, rows[child_id].revision) == (
            classification, state, 2,
        )  # fmt: skip
    absent = rows["rec-absent"]
    assert (absent.classification, absent.observed_state, absent.revision) == ("unknown", "unknown", 0)

    inventory = await fleet.inventory()
    assert inventory is not None
    assert inventory.inventory_revision == len(inventory.records) + sum(r.status.revision for r in inventory.records)
    assert report.before_revision == 5
    assert report.after_revision <= inventory.inventory_revision
    assert {"rec-succeeded", "rec-running"} <= {r.lineage.child_id for r in inventory.records}


async def test_documents_on_the_wire_are_valid_against_the_contract_schema(
    fleet: FleetClient, executor: ExecutorClient, raw: httpx.AsyncClient, contract_dir: Path
) -> None:
    schema = json.loads((contract_dir / "fleet-workload-v1.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    await admitted(fleet, "wire-daemon", "daemon")
    await executor.send_message("local-1", dispatch("wire-daemon", "exit 2", "daemon"))
    await wait_record(fleet, "wire-daemon", terminal)
    documents = [
        raw_json(await raw.get("/api/v2/fleet/workloads/wire-daemon", headers=fleet_auth())),
        raw_json(await raw.get("/api/v2/fleet/workloads", headers=fleet_auth())),
        raw_json(await raw.post("/api/v2/fleet/reconcile", json={"before_revision": 0,
                 "child_ids": ["wire-daemon", "wire-absent"]}, headers=fleet_auth())),  # fmt: skip
    ]
    for document in documents:
        errors = [error.message for error in validator.iter_errors(document)]
        assert errors == [], (document.get("document_type"), errors)


async def test_instances_list_the_configured_targets(fleet: FleetClient) -> None:
    instances = await fleet.instances()
    assert [i.id for i in instances] == ["local-1", "local-2"]
    assert all(i.status == "ready" and "host" in i.isolation_kinds for i in instances)
    assert set(instances[0].workload_kinds) == {"one-shot-command", "daemon", "persistent-agent", "scheduled-collector"}


# --- authentication ------------------------------------------------------------------------


# Bearer tokens and their roles: tests/test_substrate_auth.py.


async def test_tokens_never_appear_in_bodies_nor_in_workload_processes(
    fleet: FleetClient, executor: ExecutorClient, tap: Wiretap, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As when the CLI reads them from its environment; and a copy under an unrelated name.
    monkeypatch.setenv("CONDUCTOR_FLEET_TOKEN", FLEET_TOKEN)
    monkeypatch.setenv("SOME_TOOL_SETTING", EXECUTOR_TOKEN)
    await admitted(fleet, "tok-1")
    await executor.send_message("local-1", dispatch("tok-1", "env; echo $CONDUCTOR_CHILD_ID"))
    record = await wait_record(fleet, "tok-1", terminal)
    assert record.status.observed_state == "succeeded"
    output = Path(urlparse(record.status.artifacts[0].uri).path).read_text()
    assert "tok-1" in output
    assert FLEET_TOKEN not in output and EXECUTOR_TOKEN not in output
    assert len(tap.bodies) >= 3
    tap.assert_no_secrets(FLEET_TOKEN, EXECUTOR_TOKEN)


# --- executor plane ------------------------------------------------------------------------


async def test_one_shot_echo_succeeds_with_result_artifact_and_a2a_output(
    fleet: FleetClient, executor: ExecutorClient, tap: Wiretap
) -> None:
    await admitted(fleet, "run-echo")
    task = await executor.send_message("local-1", dispatch("run-echo", "echo hi"))
    assert tap.last_status() == 202
    assert (task.kind, task.status.state) == ("task", "working")

    record = await wait_record(fleet, "run-echo", terminal)
    assert (record.status.observed_state, record.status.exit_classification) == ("succeeded", "success")
    assert record.lineage.task_id == task.id
    artifacts = {a.kind: a for a in record.status.artifacts}
    assert artifacts["result"].sha256 == hashlib.sha256(b"hi\n").hexdigest()
    assert Path(urlparse(artifacts["result"].uri).path).read_bytes() == b"hi\n"
    assert artifacts["log"].sha256 == hashlib.sha256(b"").hexdigest()

    finished = await executor.get_task("local-1", task.id)
    assert finished.status.state == "completed"
    assert finished.artifact_text("result") == "hi\n"
    # starting -> running -> succeeded, each a revision of its own after admission.
    assert record.status.revision == 4


async def test_failing_command_is_failed_with_its_stderr_as_log(fleet: FleetClient, executor: ExecutorClient) -> None:
    await admitted(fleet, "run-fail")
    task = await executor.send_message("local-1", dispatch("run-fail", "echo oops >&2; exit 3"))
    record = await wait_record(fleet, "run-fail", terminal)
    assert (record.status.observed_state, record.status.exit_classification) == ("failed", "failure")
    assert record.status.error_code == "process.exit_status_3"
    log = next(a for a in record.status.artifacts if a.kind == "log")
    assert Path(urlparse(log.uri).path).read_text() == "oops\n"
    finished = await executor.get_task("local-1", task.id)
    assert finished.status.state == "failed"
    assert finished.status.message is not None and "status 3" in finished.status.message.parts[0].text  # type: ignore[union-attr]


async def test_command_over_its_time_budget_is_timed_out(fleet: FleetClient, executor: ExecutorClient) -> None:
    await admitted(fleet, "run-timeout", timeout_seconds=30)
    started = asyncio.get_running_loop().time()
    task = await executor.send_message("local-1", dispatch("run-timeout", "sleep 30", timeout_seconds=1))
    record = await wait_record(fleet, "run-timeout", terminal)
    assert asyncio.get_running_loop().time() - started < 5
    assert (record.status.observed_state, record.status.exit_classification) == ("timed-out", "timeout")
    assert (await executor.get_task("local-1", task.id)).status.state == "failed"


async def test_verifier_adds_evidence_or_fails_the_run(fleet: FleetClient, executor: ExecutorClient) -> None:
    await admitted(fleet, "run-verified")
    await admitted(fleet, "run-unverified")
    await executor.send_message(
        "local-1", dispatch("run-verified", "echo data > out.txt", verifier="test -s out.txt && echo verified")
    )
    await executor.send_message("local-1", dispatch("run-unverified", "true", verifier="test -s out.txt"))
    good = await wait_record(fleet, "run-verified", terminal)
    assert good.status.observed_state == "succeeded"
    verifier = next(a for a in good.status.artifacts if a.kind == "verifier")
    assert verifier.sha256 == hashlib.sha256(b"verified\n").hexdigest()
    bad = await wait_record(fleet, "run-unverified", terminal)
    assert (bad.status.observed_state, bad.status.error_code) == ("failed", "substrate.verifier_failed")
    assert "verifier" not in {a.kind for a in bad.status.artifacts}


async def test_daemon_is_healthy_until_cancelled_and_its_process_is_gone(
    fleet: FleetClient, executor: ExecutorClient, tmp_path: Path
) -> None:
    await admitted(fleet, "run-daemon", "daemon")
    pidfile = tmp_path / "daemon.pid"
    task = await executor.send_message("local-1", dispatch("run-daemon", f"echo $$ > {pidfile}; exec sleep 30", "daemon"))
    pid = await read_pid(pidfile)
    record = await wait_record(fleet, "run-daemon", lambda r: r.status.observed_state == "healthy")
    assert record.status.health == "healthy"
    assert (await executor.get_task("local-1", task.id)).status.state == "working"

    cancelled = await executor.cancel_task("local-1", task.id)
    assert cancelled.status.state == "canceled"
    record = await fleet.get("run-daemon")
    assert (record.status.observed_state, record.status.exit_classification) == ("cancelled", "cancelled")
    assert record.status.health == "unhealthy"
    await wait_until(lambda: process_gone(pid))  # killed and reaped: no zombie left behind
    again = await executor.cancel_task("local-1", task.id)  # idempotent
    assert again.status.state == "canceled"


async def test_daemon_that_exits_is_failed_and_unhealthy(fleet: FleetClient, executor: ExecutorClient) -> None:
    await admitted(fleet, "run-daemon-exit", "daemon")
    await executor.send_message("local-1", dispatch("run-daemon-exit", "sleep 0.4; exit 1", "daemon"))
    record = await wait_record(fleet, "run-daemon-exit", terminal)
    assert (record.status.observed_state, record.status.health) == ("failed", "unhealthy")


async def test_persistent_agent_runs_with_its_session_bound(fleet: FleetClient, executor: ExecutorClient) -> None:
    await admitted(fleet, "run-agent", "persistent-agent")
    task = await executor.send_message(
        "local-1", dispatch("run-agent", "exec sleep 30", "persistent-agent", context_id="session-7")
    )
    record = await wait_record(fleet, "run-agent", lambda r: r.status.observed_state == "running")
    assert (record.lineage.task_id, record.lineage.session_id) == (task.id, "session-7")
    await executor.cancel_task("local-1", task.id)
    assert (await fleet.get("run-agent")).status.observed_state == "cancelled"


async def test_finished_task_cannot_be_cancelled(fleet: FleetClient, executor: ExecutorClient) -> None:
    await admitted(fleet, "run-done")
    task = await executor.send_message("local-1", dispatch("run-done", "true"))
    await wait_record(fleet, "run-done", terminal)
    with pytest.raises(TaskNotCancelable) as caught:
        await executor.cancel_task("local-1", task.id)
    assert caught.value.status == 409
    assert (await fleet.get("run-done")).status.observed_state == "succeeded"


async def test_same_message_id_returns_the_same_task_and_runs_once(
    fleet: FleetClient, executor: ExecutorClient, tap: Wiretap, tmp_path: Path
) -> None:
    await admitted(fleet, "run-idem")
    counter = tmp_path / "runs"
    message = dispatch("run-idem", f"echo run >> {counter}")
    first = await executor.send_message("local-1", message)
    second = await executor.send_message("local-1", message)
    assert tap.last_status() == 200
    assert second.id == first.id
    await wait_record(fleet, "run-idem", terminal)
    third = await executor.send_message("local-1", message)
    assert (third.id, third.status.state) == (first.id, "completed")
    assert counter.read_text() == "run\n"

    with pytest.raises(IdempotencyCollision) as caught:
        await executor.send_message("local-1", dispatch("run-idem", "echo something else"))
    assert caught.value.code == "executor.idempotency_collision"


async def test_second_dispatch_for_a_bound_workload_is_rejected(fleet: FleetClient, executor: ExecutorClient) -> None:
    await admitted(fleet, "run-twice")
    first = await executor.send_message("local-1", dispatch("run-twice", "true"))
    await wait_record(fleet, "run-twice", terminal)
    before = await fleet.get("run-twice")
    second = await executor.send_message(
        "local-1", Dispatch(message_id="msg-run-twice-again", child_id="run-twice", kind="one-shot-command", prompt="true")
    )
    assert second.id != first.id
    assert second.status.state == "rejected"
    assert await fleet.get("run-twice") == before


async def test_dispatch_refusals(fleet: FleetClient, executor: ExecutorClient, raw: httpx.AsyncClient) -> None:
    await admitted(fleet, "bad-1")
    await admitted(fleet, "bad-container", isolation="container")
    body = build_message(dispatch("bad-1", "true")).wire()
    response = await raw.post(
        "/agents/local-1/v1/messages:send", json=body, headers={"Authorization": f"Bearer {EXECUTOR_TOKEN}"}
    )
    assert (response.status_code, raw_json(response)["error"]) == (400, "executor.extension_required")
    response = await raw.post("/agents/local-1/v1/messages:send", json={"message": {"role": "user"}},
                              headers=executor_auth())  # fmt: skip
    assert (response.status_code, raw_json(response)["error"]) == (400, "executor.invalid_message")

    cases = [
        ("local-1", dispatch("bad-1", "true", "daemon"), "executor.kind_mismatch"),
        ("local-2", dispatch("bad-1", "true"), "executor.target_mismatch"),
        ("local-1", dispatch("bad-1", "true", timeout_seconds=61), "executor.budget_exceeded"),
        ("local-1", dispatch("bad-container", "true"), "executor.isolation_unsupported"),
    ]
    for instance, message, code in cases:
        with pytest.raises(FleetRejected) as caught:
            await executor.send_message(instance, message)
        assert (caught.value.status, caught.value.code) == (422, code)
    with pytest.raises(WorkloadNotFound):
        await executor.send_message("local-1", dispatch("bad-missing", "true"))
    with pytest.raises(InstanceNotFound):
        await executor.send_message("local-9", dispatch("bad-1", "true"))
    with pytest.raises(TaskNotFound):
        await executor.get_task("local-1", "task-none")
    assert (await fleet.get("bad-1")).status.observed_state == "admitted"  # nothing started


async def test_unreachable_substrate_is_retryable() -> None:
    async with FleetClient("http://127.0.0.1:9", FLEET_TOKEN, timeout=2) as client:
        with pytest.raises(SubstrateUnavailable) as caught:
            await client.instances()
    assert caught.value.retryable


# --- scheduled collectors (own server: a shifted clock reaches the next tick quickly) --------


async def test_scheduled_collector_runs_on_its_tick_and_stays_scheduled(tmp_path: Path) -> None:
    shift = [timedelta(0)]

    def clock() -> datetime:
        return datetime.now(UTC) + shift[0]

    tap = Wiretap()
    with serve_in_thread(config(tmp_path, clock=clock)) as running:
        fleet, executor = clients(running.base_url, tap)
        async with fleet, executor:
            assert await fleet.inventory() is None  # an empty fleet has no inventory document (204)
            assert tap.last_status() == 204
            await admitted(fleet, "col-1", "scheduled-collector", schedule="* * * * *")
            real = datetime.now(UTC)
            tick = real.replace(second=0, microsecond=0) + timedelta(minutes=1)
            shift[0] = tick - timedelta(seconds=1) - real  # the collector's clock: one second before a tick
            task = await executor.send_message("local-1", dispatch("col-1", "echo collected", "scheduled-collector"))
            record = await fleet.get("col-1")
            assert (record.status.observed_state, record.status.artifacts) == ("scheduled", [])
            assert task.status.state == "working"
            record = await wait_record(fleet, "col-1", lambda r: bool(r.status.artifacts), timeout=10)
            assert (record.status.observed_state, record.status.exit_classification) == ("scheduled", "success")
            result = next(a for a in record.status.artifacts if a.kind == "result")
            assert result.sha256 == hashlib.sha256(b"collected\n").hexdigest()
            await executor.cancel_task("local-1", task.id)
            assert (await fleet.get("col-1")).status.observed_state == "cancelled"


# --- durability and restarts ---------------------------------------------------------------


async def test_records_survive_a_restart_and_in_flight_tasks_become_unknown(tmp_path: Path) -> None:
    tap = Wiretap()
    pidfile = tmp_path / "inflight.pid"
    with serve_in_thread(config(tmp_path / "data")) as running:
        fleet, executor = clients(running.base_url, tap)
        async with fleet, executor:
            await admitted(fleet, "dur-done")
            await executor.send_message("local-1", dispatch("dur-done", "echo kept"))
            done = await wait_record(fleet, "dur-done", terminal)
            await admitted(fleet, "dur-inflight")
            # A grandchild: only killing the whole process group at shutdown stops it.
            inflight = dispatch("dur-inflight", f"sleep 30 & echo $! > {pidfile}; wait")
            task = await executor.send_message("local-1", inflight)
            pid = await read_pid(pidfile)
            await wait_record(fleet, "dur-inflight", lambda r: r.status.observed_state == "running")
            before = await fleet.inventory()
    await wait_until(lambda: process_dead(pid))  # stopping the server stopped its workloads

    with serve_in_thread(config(tmp_path / "data")) as running:
        fleet, executor = clients(running.base_url, tap)
        async with fleet, executor:
            assert await fleet.get("dur-done") == done
            record = await fleet.get("dur-inflight")
            assert (record.status.observed_state, record.status.exit_classification) == ("unknown", "unknown")
            assert record.status.error_code == "substrate.restarted"
            assert (await executor.get_task("local-1", task.id)).status.state == "unknown"
            rows = {r.child_id: r for r in (await fleet.reconcile(0, ["dur-done", "dur-inflight"])).rows}
            assert rows["dur-done"].classification == "terminal"
            assert rows["dur-inflight"].classification == "operator-review-required"
            after = await fleet.inventory()
            assert before is not None and after is not None
            assert after.inventory_revision == before.inventory_revision + 1
            # The same messageId after the restart still finds the task instead of starting another.
            assert (await executor.send_message("local-1", inflight)).id == task.id
    tap.assert_no_secrets(FLEET_TOKEN, EXECUTOR_TOKEN)


async def test_crashed_substrate_leaves_no_workload_running_and_reports_unknown(tmp_path: Path) -> None:
    tap = Wiretap()
    data = tmp_path / "data"
    pidfile = tmp_path / "orphan.pid"
    with spawn(data, FLEET_TOKEN, EXECUTOR_TOKEN) as process:
        fleet, executor = clients(process.base_url, tap)
        async with fleet, executor:
            await admitted(fleet, "crash-1")
            # A background grandchild in the task's process group: it outlives its shell on a crash.
            await executor.send_message("local-1", dispatch("crash-1", f"sleep 30 & echo $! > {pidfile}; wait"))
            orphan = await read_pid(pidfile)
            await wait_record(fleet, "crash-1", lambda r: r.status.observed_state == "running")
        process.kill()  # SIGKILL: no shutdown code runs
    await asyncio.sleep(0.2)
    assert not process_dead(orphan)  # the shell died with its parent, its grandchild did not...

    with serve_in_thread(config(data)) as running:
        await wait_until(lambda: process_dead(orphan))  # ...until the restart found and killed it
        fleet, executor = clients(running.base_url, tap)
        async with fleet, executor:
            record = await fleet.get("crash-1")
            assert (record.status.observed_state, record.status.error_code) == ("unknown", "substrate.restarted")
    tap.assert_no_secrets(FLEET_TOKEN, EXECUTOR_TOKEN)
