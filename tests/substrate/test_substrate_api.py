"""The local substrate over real HTTP on loopback, driven through the fleet and executor clients."""

from __future__ import annotations

import contextlib

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import jsonschema
import pytest

from activities.agentic_sandbox_api import IDEMPOTENCY_EXTENSION as IDEMPOTENCY
from activities.agentic_sandbox_api import RUNTIME_EXTENSION, RuntimeIdentity, build_message
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
from tests.support.substrate_fixtures import substrate_config
from tests.support.processes import process_dead, process_gone, read_pid, wait_until
from tests.support.substrate_support import (
    EXECUTOR_TOKEN,
    FLEET_TOKEN,
    Wiretap,
    clients,
    make_record,
    raw_json,
    record_dict,
    wait_record,
)
from workflows.contract import WorkloadStatus, parse_document
from workflows.workload.messages import TaskDispatch

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


@contextlib.asynccontextmanager
async def _tapped(client_class, server: RunningSubstrate, token: str, tap: Wiretap):
    """A client whose every request the wiretap reads; no token may show in what it saw."""
    client = client_class(server.base_url, token, event_hooks=tap.hooks())
    yield client
    await client.aclose()
    tap.assert_no_secrets(FLEET_TOKEN, EXECUTOR_TOKEN)


@pytest.fixture
async def fleet(server: RunningSubstrate, tap: Wiretap) -> AsyncIterator[FleetClient]:
    async with _tapped(FleetClient, server, FLEET_TOKEN, tap) as client:
        yield client


@pytest.fixture
async def executor(server: RunningSubstrate, tap: Wiretap) -> AsyncIterator[ExecutorClient]:
    async with _tapped(ExecutorClient, server, EXECUTOR_TOKEN, tap) as client:
        yield client


@pytest.fixture
async def raw(server: RunningSubstrate) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.base_url) as client:
        yield client


def fleet_auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {FLEET_TOKEN}"}


def executor_auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {EXECUTOR_TOKEN}", "A2A-Extensions": RUNTIME_EXTENSION}


def dispatch(child_id: str, prompt: str, kind: str = "one-shot-command", **options: object) -> TaskDispatch:
    return TaskDispatch(message_id=f"msg-{child_id}", child_id=child_id, kind=kind, prompt=prompt, **options)  # type: ignore[arg-type]


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


async def bind(fleet: FleetClient, child_id: str, task_id: str, session_id: str | None = None) -> None:
    """What an orchestrator does after `messages:send`: bind the task with an observation."""
    record = await fleet.get(child_id)
    assert record.lineage.task_id is None  # the executor bound nothing
    state = record.status.observed_state
    extra = {"health": record.status.health} if record.kind == "daemon" else {}
    await fleet.observe(child_id, record.status.revision, status("starting" if state == "admitted" else state,
                        record.status.revision + 1, **extra),
                        RuntimeIdentity(task_id=task_id, session_id=session_id))  # fmt: skip


async def started(fleet: FleetClient, executor: ExecutorClient, message: TaskDispatch, instance: str = "local-1"):
    task = await executor.send_message(instance, message)
    await bind(fleet, message.child_id, task.id, message.context_id)
    return task


async def test_documents_on_the_wire_are_valid_against_the_contract_schema(
    fleet: FleetClient, executor: ExecutorClient, raw: httpx.AsyncClient, contract_dir: Path
) -> None:
    schema = json.loads((contract_dir / "fleet-workload-v1.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    await admitted(fleet, "wire-daemon", "daemon")
    await started(fleet, executor, dispatch("wire-daemon", "echo out; exit 2", "daemon"))
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


async def test_instances_are_items_of_the_real_shape(fleet: FleetClient, raw: httpx.AsyncClient) -> None:
    """Row 1: `{"items": [{id, name, runtime, provider, capabilities, state, agent_card_url, ...}]}`."""
    body = raw_json(await raw.get("/api/v2/admin/instances", headers=fleet_auth()))
    assert set(body) == {"items"}
    assert [(i["id"], i["runtime"], i["state"]) for i in body["items"]] == [("local-1", "host", "running"),
                                                                            ("local-2", "host", "running")]
    assert body["items"][0]["agent_card_url"] == "/agents/local-1/.well-known/agent-card.json"
    instances = await fleet.instances()
    assert [i.id for i in instances] == ["local-1", "local-2"]
    assert all(i.status == "ready" and i.isolation_kinds == ["host"] for i in instances)
    assert set(instances[0].workload_kinds) == {"one-shot-command", "daemon", "persistent-agent", "scheduled-collector"}


# --- authentication ------------------------------------------------------------------------


# Bearer tokens and their roles: tests/substrate/test_substrate_auth.py.


async def test_tokens_never_appear_in_bodies_nor_in_workload_processes(
    fleet: FleetClient, executor: ExecutorClient, tap: Wiretap, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As when the CLI reads them from its environment; and a copy under an unrelated name.
    monkeypatch.setenv("CONDUCTOR_FLEET_TOKEN", FLEET_TOKEN)
    monkeypatch.setenv("SOME_TOOL_SETTING", EXECUTOR_TOKEN)
    await admitted(fleet, "tok-1")
    task = await started(fleet, executor, dispatch("tok-1", "env; echo $CONDUCTOR_CHILD_ID"))
    record = await wait_record(fleet, "tok-1", terminal)
    assert record.status.observed_state == "succeeded"
    output = (await executor.artifacts("local-1", task.id)).output("stdout") or ""
    assert "tok-1" in output
    assert FLEET_TOKEN not in output and EXECUTOR_TOKEN not in output
    assert len(tap.bodies) >= 3
    tap.assert_no_secrets(FLEET_TOKEN, EXECUTOR_TOKEN)


# --- executor plane and the projection into records (rows 3, 6, 7) --------------------------


async def test_send_binds_nothing_and_the_bound_task_projects_into_the_record(
    fleet: FleetClient, executor: ExecutorClient, tap: Wiretap, raw: httpx.AsyncClient
) -> None:
    await admitted(fleet, "run-echo")
    task = await executor.send_message("local-1", dispatch("run-echo", "echo hi"))
    assert tap.last_status() == 202
    assert (task.kind, task.status.state, task.context_id) == ("task", "working", None)  # no contextId sent
    assert task.metadata is not None and task.metadata["runtime.instance_id"] == "local-1"
    await asyncio.sleep(0.3)  # long enough for `echo` to end: the record still knows nothing of it
    unbound = await fleet.get("run-echo")
    assert (unbound.status.observed_state, unbound.status.revision, unbound.lineage.task_id) == ("admitted", 1, None)

    await bind(fleet, "run-echo", task.id)
    record = await wait_record(fleet, "run-echo", terminal)
    assert (record.status.observed_state, record.status.exit_classification) == ("succeeded", "success")
    assert record.lineage.task_id == task.id and record.lineage.command_id == f"cmd-{task.id.removeprefix('task-')}"
    kinds = [(a.kind, a.uri) for a in record.status.artifacts]
    assert kinds == [("log", f"sandbox://tasks/{task.id}/artifacts/{task.id}-stdout-0001"),
                     ("result", f"sandbox://tasks/{task.id}/status")]  # fmt: skip
    assert await fleet.get("run-echo") == record  # an unchanged projection writes no revision

    finished = raw_json(await raw.get(f"/agents/local-1/v1/tasks/{task.id}", headers=executor_auth()))
    assert set(finished) == {"id", "kind", "status"}  # no contextId, no artifacts inline
    status_ = finished["status"]
    assert (status_["state"], status_["exit_code"]) == ("completed", 0)
    assert {"timestamp", "terminal_at", "summary"} <= set(status_) and "fail_kind" not in status_
    result = next(a for a in record.status.artifacts if a.kind == "result")
    digest = {k: v for k, v in status_.items() if k not in ("terminal_at",)}
    assert result.sha256 == hashlib.sha256(json.dumps(digest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


async def test_artifacts_route_serves_the_output_chunks(fleet: FleetClient, executor: ExecutorClient,
                                                        raw: httpx.AsyncClient) -> None:
    """Row 6: `GET /agents/{id}/v1/tasks/{tid}/artifacts` as handlers/artifacts.rs `list` answers."""
    await admitted(fleet, "run-art")
    task = await started(fleet, executor, dispatch("run-art", "echo out; echo err >&2"))
    await wait_record(fleet, "run-art", terminal)
    for prefix in ("/agents/local-1/v1", "/agents/local-1"):  # both route forms of the real executor
        body = raw_json(await raw.get(f"{prefix}/tasks/{task.id}/artifacts", headers=executor_auth()))
        assert body["task_id"] == task.id
        rows = body["artifacts"]
        assert [row["artifact_id"] for row in rows] == [f"{task.id}-stdout-0001", f"{task.id}-stderr-0002"]
        assert all(set(row) == {"artifact_id", "task_id", "created_at", "artifact"} for row in rows)
        assert [(r["artifact"]["kind"], r["artifact"]["stream"], r["artifact"]["data"]) for r in rows] == [
            ("output_chunk", "stdout", "out\n"), ("output_chunk", "stderr", "err\n")]  # fmt: skip
    artifacts = await executor.artifacts("local-1", task.id)
    assert (artifacts.output("stdout"), artifacts.output("stderr")) == ("out\n", "err\n")
    record = await fleet.get("run-art")
    assert [a.kind for a in record.status.artifacts] == ["log", "log", "result"]
    with pytest.raises(TaskNotFound):
        await executor.artifacts("local-2", task.id)  # another instance's task is not visible


async def test_output_is_bounded(fleet: FleetClient, executor: ExecutorClient) -> None:
    """Each output chunk keeps at most the runner's `artifact_text_limit` (256 KiB) of text."""
    await admitted(fleet, "run-big")
    task = await started(fleet, executor, dispatch("run-big", "head -c 300000 /dev/zero | tr '\\0' x"))
    await wait_record(fleet, "run-big", terminal)
    chunk = (await executor.artifacts("local-1", task.id)).artifacts[0].artifact
    assert len(chunk["data"]) == 256 * 1024 and chunk["truncated"] is True


async def test_failing_command_is_failed_with_its_stderr_in_the_artifacts(
    fleet: FleetClient, executor: ExecutorClient
) -> None:
    await admitted(fleet, "run-fail")
    task = await started(fleet, executor, dispatch("run-fail", "echo oops >&2; exit 3"))
    record = await wait_record(fleet, "run-fail", terminal)
    assert (record.status.observed_state, record.status.exit_classification) == ("failed", "failure")
    assert record.status.error_code == "fleet.task_failed"
    assert (await executor.artifacts("local-1", task.id)).output("stderr") == "oops\n"
    finished = await executor.get_task("local-1", task.id)
    assert (finished.status.state, finished.status.fail_kind) == ("failed", "application")
    assert finished.status_text() is not None and "exited 3" in finished.status_text()  # type: ignore[operator]


async def test_command_over_its_time_budget_is_killed_and_failed(fleet: FleetClient, executor: ExecutorClient) -> None:
    await admitted(fleet, "run-timeout", timeout_seconds=30)
    clock = asyncio.get_running_loop().time
    began = clock()
    task = await started(fleet, executor, dispatch("run-timeout", "sleep 30", timeout_seconds=1))
    record = await wait_record(fleet, "run-timeout", terminal)
    assert clock() - began < 5
    # The real projection has no timed-out: a killed command is a failed task.
    assert (record.status.observed_state, record.status.error_code) == ("failed", "fleet.task_failed")
    ended = await executor.get_task("local-1", task.id)
    assert ended.status.state == "failed" and "time budget" in (ended.status_text() or "")


async def ended_task(executor: ExecutorClient, task_id: str):
    for _ in range(200):
        task = await executor.get_task("local-1", task_id)
        if task.terminal:
            return task
        await asyncio.sleep(0.05)
    raise AssertionError(f"task {task_id} did not end")


async def test_a_command_for_no_record_runs_in_the_context_where_a_childs_task_left_its_files(
    fleet: FleetClient, executor: ExecutorClient
) -> None:
    """How the conductor runs a verifier: the real executor runs any message (it reads nothing from
    the metadata), and tasks sent to one agent share its machine. Here: one context, one workspace."""
    await admitted(fleet, "run-in-context")
    await started(fleet, executor, dispatch("run-in-context", "echo data > out.txt", context_id="ctx-verify"))
    record = await wait_record(fleet, "run-in-context", terminal)
    assert record.status.observed_state == "succeeded"

    def plain(message_id: str, prompt: str, context_id: str | None) -> TaskDispatch:
        return TaskDispatch(message_id=message_id, kind="one-shot-command", prompt=prompt, context_id=context_id)

    seen = await ended_task(executor, (await executor.send_message("local-1", plain("v-1", "test -s out.txt && cat out.txt", "ctx-verify"))).id)
    assert seen.status.state == "completed" and seen.context_id == "ctx-verify"
    assert (await executor.artifacts("local-1", seen.id)).output("stdout") == "data\n"
    elsewhere = await ended_task(executor, (await executor.send_message("local-1", plain("v-2", "test -s out.txt", "ctx-other"))).id)
    nowhere = await ended_task(executor, (await executor.send_message("local-1", plain("v-3", "test -s out.txt", None))).id)
    assert (elsewhere.status.state, nowhere.status.state) == ("failed", "failed")  # other contexts, other files
    again = await executor.send_message("local-1", plain("v-1", "test -s out.txt && cat out.txt", "ctx-verify"))
    assert again.id == seen.id  # the same messageId finds the same task: a retried verifier runs once
    # No record is touched by them: the child's record is as its own task left it.
    assert (await fleet.get("run-in-context")).status.revision == record.status.revision


async def test_a_long_lived_kind_or_schedule_without_a_record_is_400(raw: httpx.AsyncClient) -> None:
    for runtime, words in (({"kind": "daemon"}, "child_id"), ({"kind": "one-shot-command", "schedule": "* * * * *"}, "child_id")):
        body = {"message": {"kind": "message", "role": "user", "messageId": f"plain-{len(runtime)}",
                            "parts": [{"kind": "text", "text": "true"}], "metadata": {RUNTIME_EXTENSION: runtime}}}  # fmt: skip
        answer = await raw.post("/agents/local-1/v1/messages:send", json=body, headers=executor_auth())
        assert answer.status_code == 400, answer.text
        assert answer.json()["code"] == "executor.invalid_message" and words in answer.json()["detail"]


async def test_daemon_is_healthy_until_cancelled_and_its_process_is_gone(
    fleet: FleetClient, executor: ExecutorClient, tmp_path: Path, raw: httpx.AsyncClient
) -> None:
    await admitted(fleet, "run-daemon", "daemon")
    pidfile = tmp_path / "daemon.pid"
    task = await started(fleet, executor, dispatch("run-daemon", f"echo $$ > {pidfile}; exec sleep 30", "daemon"))
    pid = await read_pid(pidfile)
    record = await wait_record(fleet, "run-daemon", lambda r: r.status.observed_state == "healthy")
    assert record.status.health == "healthy"
    assert (await executor.get_task("local-1", task.id)).status.state == "working"

    # Cancel is a POST under /agents: without the runtime extension it is refused, as the real one is.
    refused = await raw.post(f"/agents/local-1/v1/tasks/{task.id}/cancel",
                             headers={"Authorization": f"Bearer {EXECUTOR_TOKEN}"})  # fmt: skip
    assert (refused.status_code, raw_json(refused)["code"]) == (400, "extension.required_not_activated")
    cancelled = await executor.cancel_task("local-1", task.id)
    assert cancelled.status.state == "canceled"
    record = await fleet.get("run-daemon")
    assert (record.status.observed_state, record.status.exit_classification) == ("cancelled", "cancelled")
    assert record.status.health == "unknown"
    await wait_until(lambda: process_gone(pid))  # killed and reaped: no zombie left behind
    with pytest.raises(TaskNotCancelable):  # cancelled is ended too: 409 task.not_cancelable
        await executor.cancel_task("local-1", task.id)


@pytest.mark.parametrize(("exit_status", "state", "health", "code"), [
    (1, "failed", "unhealthy", "fleet.task_failed"),
    (0, "operator-review-required", "unknown", "fleet.daemon_task_exited"),
])  # fmt: skip
async def test_a_daemon_that_exits_fails_or_needs_review(
    fleet: FleetClient, executor: ExecutorClient, exit_status: int, state: str, health: str, code: str
) -> None:
    child = f"run-daemon-exit-{exit_status}"
    await admitted(fleet, child, "daemon")
    await started(fleet, executor, dispatch(child, f"sleep 0.4; exit {exit_status}", "daemon"))
    record = await wait_record(fleet, child, lambda r: r.status.observed_state not in ("starting", "healthy"))
    assert (record.status.observed_state, record.status.health, record.status.error_code) == (state, health, code)


async def test_persistent_agent_runs_with_its_session_and_is_retained_when_it_ends(
    fleet: FleetClient, executor: ExecutorClient
) -> None:
    await admitted(fleet, "run-agent", "persistent-agent")
    task = await started(fleet, executor, dispatch("run-agent", "exec sleep 30", "persistent-agent",
                                                   context_id="session-7"))  # fmt: skip
    assert task.context_id == "session-7"  # the message carried one, so the task has it
    record = await wait_record(fleet, "run-agent", lambda r: r.status.observed_state == "running")
    assert (record.lineage.task_id, record.lineage.session_id) == (task.id, "session-7")
    await executor.cancel_task("local-1", task.id)
    assert (await fleet.get("run-agent")).status.observed_state == "cancelled"

    await admitted(fleet, "run-agent-done", "persistent-agent")
    await started(fleet, executor, dispatch("run-agent-done", "true", "persistent-agent"))
    done = await wait_record(fleet, "run-agent-done", lambda r: r.status.observed_state == "retained")
    assert done.status.exit_classification == "success"


async def test_scheduled_collector_catches_up_then_rests_scheduled(
    fleet: FleetClient, executor: ExecutorClient
) -> None:
    await admitted(fleet, "col-1", "scheduled-collector", schedule="0 0 1 1 *")
    task = await started(fleet, executor, dispatch("col-1", "sleep 0.5; echo collected", "scheduled-collector"))
    running = await fleet.get("col-1")
    assert running.status.observed_state == "catching-up"
    record = await wait_record(fleet, "col-1", lambda r: r.status.observed_state == "scheduled")
    assert record.status.exit_classification == "success"
    assert (await executor.artifacts("local-1", task.id)).output("stdout") == "collected\n"
    with pytest.raises(TaskNotCancelable):  # its run ended: nothing left to cancel
        await executor.cancel_task("local-1", task.id)
    assert (await fleet.get("col-1")).status.observed_state == "scheduled"


async def test_finished_task_cannot_be_cancelled(fleet: FleetClient, executor: ExecutorClient, raw: httpx.AsyncClient) -> None:
    await admitted(fleet, "run-done")
    task = await started(fleet, executor, dispatch("run-done", "true"))
    await wait_record(fleet, "run-done", terminal)
    with pytest.raises(TaskNotCancelable) as caught:
        await executor.cancel_task("local-1", task.id)
    assert caught.value.status == 409
    response = await raw.post(f"/agents/local-1/v1/tasks/{task.id}/cancel", headers=executor_auth())
    assert response.headers["content-type"] == "application/problem+json"
    body = raw_json(response)
    assert {k: body[k] for k in ("status", "code", "title")} == {
        "status": 409, "code": "task.not_cancelable", "title": "Task not cancelable"}  # fmt: skip
    assert body["type"].startswith("https://agentic-sandbox.aiwg.io/errors/") and "completed" in body["detail"]
    assert (await fleet.get("run-done")).status.observed_state == "succeeded"


async def test_same_message_id_returns_the_same_task_and_runs_once(
    fleet: FleetClient, executor: ExecutorClient, raw: httpx.AsyncClient, tmp_path: Path
) -> None:
    await admitted(fleet, "run-idem")
    counter = tmp_path / "runs"
    message = dispatch("run-idem", f"echo run >> {counter}")
    first = await started(fleet, executor, message)
    replay = await raw.post("/agents/local-1/v1/messages:send", json=build_message(message).wire(),
                            headers={**executor_auth(), "A2A-Extensions": f"{RUNTIME_EXTENSION}, {IDEMPOTENCY}"})  # fmt: skip
    assert (replay.status_code, replay.headers["idempotent-replayed"], raw_json(replay)["id"]) == (202, "true", first.id)
    await wait_record(fleet, "run-idem", terminal)
    third = await executor.send_message("local-1", message)
    assert (third.id, third.status.state) == (first.id, "completed")
    assert counter.read_text() == "run\n"

    with pytest.raises(IdempotencyCollision) as caught:
        await executor.send_message("local-1", dispatch("run-idem", "echo something else"))
    assert caught.value.code == "idempotency.key_reused"


async def test_second_dispatch_for_a_bound_workload_is_rejected(fleet: FleetClient, executor: ExecutorClient) -> None:
    await admitted(fleet, "run-twice")
    first = await started(fleet, executor, dispatch("run-twice", "true"))
    await wait_record(fleet, "run-twice", terminal)
    before = await fleet.get("run-twice")
    second = await executor.send_message(
        "local-1", TaskDispatch(message_id="msg-run-twice-again", child_id="run-twice", kind="one-shot-command", prompt="true")
    )
    assert second.id != first.id
    assert second.status.state == "rejected" and "already bound" in (second.status_text() or "")
    assert await fleet.get("run-twice") == before


async def test_dispatch_refusals_are_problem_documents(
    fleet: FleetClient, executor: ExecutorClient, raw: httpx.AsyncClient
) -> None:
    await admitted(fleet, "bad-1")
    await admitted(fleet, "bad-container", isolation="container")
    body = build_message(dispatch("bad-1", "true")).wire()
    response = await raw.post(
        "/agents/local-1/v1/messages:send", json=body, headers={"Authorization": f"Bearer {EXECUTOR_TOKEN}"}
    )
    assert response.headers["content-type"] == "application/problem+json"
    problem = raw_json(response)
    assert {"type", "title", "status", "detail", "code"} <= set(problem)
    assert (response.status_code, problem["code"], problem["status"]) == (400, "extension.required_not_activated", 400)
    response = await raw.post("/agents/local-1/v1/messages:send", json={"message": {"role": "user"}},
                              headers=executor_auth())  # fmt: skip
    assert (response.status_code, raw_json(response)["code"]) == (400, "request.invalid_params")

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
    with pytest.raises(TaskNotFound) as missing:
        await executor.get_task("local-1", "task-none")
    assert missing.value.code == "task.not_found"
    assert (await fleet.get("bad-1")).status.observed_state == "admitted"  # nothing started


async def test_observation_answers_the_bare_record(raw: httpx.AsyncClient, fleet: FleetClient) -> None:
    """Row 2: fleet.rs `observe` answers 200 with the stored record itself, no envelope."""
    await admitted(fleet, "obs-bare")
    response = await raw.post("/api/v2/fleet/workloads/obs-bare/observations", headers=fleet_auth(),
                              json={"expected_revision": 1, "status": status("running", 2).to_wire(),
                                    "runtime_identity": {"task_id": "task-bare"}})  # fmt: skip
    body = raw_json(response)
    assert response.status_code == 200 and body["document_type"] == "workload" and "workload" not in body
    assert (body["status"]["revision"], body["lineage"]["task_id"]) == (2, "task-bare")
    empty = await raw.post("/api/v2/fleet/workloads/obs-bare/observations", headers=fleet_auth(),
                           json={"expected_revision": 2, "status": status("running", 3).to_wire(),
                                 "runtime_identity": {}})  # fmt: skip
    assert (empty.status_code, raw_json(empty)["error"]) == (400, "fleet.invalid_runtime_identity")


async def test_unreachable_substrate_is_retryable() -> None:
    async with FleetClient("http://127.0.0.1:9", FLEET_TOKEN, timeout=2) as client:
        with pytest.raises(SubstrateUnavailable) as caught:
            await client.instances()
    assert caught.value.retryable


async def test_an_empty_fleet_has_an_inventory_with_no_records(tmp_path: Path) -> None:
    """Row 8: fleet.rs `inventory` answers 200 with `records: []` for an empty fleet."""
    tap = Wiretap()
    with serve_in_thread(config(tmp_path)) as running:
        fleet, _ = clients(running.base_url, tap)
        async with fleet, httpx.AsyncClient(base_url=running.base_url) as raw:
            assert await fleet.inventory() is None
            assert tap.last_status() == 200
            body = raw_json(await raw.get("/api/v2/fleet/workloads", headers=fleet_auth()))
            assert (body["document_type"], body["records"], body["inventory_revision"]) == ("inventory", [], 0)


# --- durability and restarts ---------------------------------------------------------------


async def test_records_survive_a_restart_and_in_flight_tasks_become_unknown(tmp_path: Path) -> None:
    tap = Wiretap()
    pidfile = tmp_path / "inflight.pid"
    with serve_in_thread(config(tmp_path / "data")) as running:
        fleet, executor = clients(running.base_url, tap)
        async with fleet, executor:
            await admitted(fleet, "dur-done")
            await started(fleet, executor, dispatch("dur-done", "echo kept"))
            done = await wait_record(fleet, "dur-done", terminal)
            await admitted(fleet, "dur-inflight")
            # A grandchild: only killing the whole process group at shutdown stops it.
            inflight = dispatch("dur-inflight", f"sleep 30 & echo $! > {pidfile}; wait")
            task = await started(fleet, executor, inflight)
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


# A substrate killed mid-task and started again re-adopts what still runs: tests/substrate/test_substrate_restart.py.
