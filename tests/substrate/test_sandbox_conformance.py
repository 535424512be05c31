"""The client against the real Agentic Sandbox server's response shapes (commit e901dc2).

The fake server here is built only from the golden bodies in `tests/fixtures/agentic_sandbox/`
(each names the server function it follows), so these tests hold the client to the real
server's wire, not to our local substrate's (which `tests/substrate/test_substrate_api.py` covers).
One test per known difference between the two; the real server cannot run here, so it is faked
with `httpx.MockTransport`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.agentic_sandbox_api import (
    RUNTIME_EXTENSION,
    ReconcileRequest,
    RuntimeIdentity,
    Task,
    TaskArtifacts,
    reset_unknown_field_warnings,
)
from activities.fleet import FleetActivities, task_view
from activities.sandbox_client import (
    ExecutorClient,
    FleetClient,
    FleetRejected,
    IdempotencyCollision,
    TaskNotCancelable,
    TaskNotFound,
    error_from_response,
)
from workflows.contract import WorkloadStatus
from workflows.workload.messages import DispatchAndRead, Dispatched, DispatchTask, RunVerifier, TaskDispatch, Target

FIXTURES = Path(__file__).parents[1] / "fixtures" / "agentic_sandbox"
BASE = "http://sandbox.test"
HOST_ID = "0193a1c2-0000-7000-8000-000000000001"


def fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_text())


class RealServer:
    """Routes requests to golden responses, and refuses a POST under /agents without the
    runtime extension as the real executor's middleware does."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.overrides: dict[tuple[str, str], dict[str, Any]] = {}

    def route(self, method: str, path: str) -> str:
        agents = f"/agents/{HOST_ID}/v1"
        routes = {
            ("GET", "/api/v2/admin/instances"): "instances",
            ("GET", "/api/v2/fleet/workloads"): "inventory-empty",
            ("POST", "/api/v2/fleet/workloads/c-1/observations"): "observation",
            ("POST", f"{agents}/messages:send"): "task-submitted",
            ("GET", f"{agents}/tasks/task-8"): "task-failed",
            ("POST", f"{agents}/tasks/task-working/cancel"): "task-canceled",
            ("POST", f"{agents}/tasks/task-done/cancel"): "problem-task-not-cancelable",
            ("GET", f"{agents}/tasks/task-missing"): "problem-task-not-found",
        }
        return routes[(method, path)]

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        path = request.url.path
        if request.method == "POST" and path.startswith("/agents/"):
            activated = {u.strip() for v in request.headers.get_list("A2A-Extensions") for u in v.split(",")}
            if RUNTIME_EXTENSION not in activated:
                return self.respond(fixture("problem-extension-required"))
            if path.endswith("/messages:send") and json.loads(request.content)["message"]["messageId"] == "reused":
                return self.respond(fixture("problem-idempotency-key-reused"))
        golden = self.overrides.get((request.method, path)) or fixture(self.route(request.method, path))
        return self.respond(golden)

    @staticmethod
    def respond(golden: dict[str, Any]) -> httpx.Response:
        headers = {"Content-Type": "application/json", **golden.get("headers", {})}
        return httpx.Response(golden["status"], headers=headers, content=json.dumps(golden["body"]))


@pytest.fixture
def server() -> RealServer:
    reset_unknown_field_warnings()
    return RealServer()


@pytest.fixture
async def fleet(server: RealServer) -> AsyncIterator[FleetClient]:
    async with FleetClient(BASE, "admin-token", transport=httpx.MockTransport(server)) as client:
        yield client


@pytest.fixture
async def executor(server: RealServer) -> AsyncIterator[ExecutorClient]:
    async with ExecutorClient(BASE, "operator-token", transport=httpx.MockTransport(server)) as client:
        yield client


def dispatch(message_id: str = "m-1:c-1") -> TaskDispatch:
    return TaskDispatch(message_id=message_id, child_id="c-1", kind="one-shot-command", prompt="true")


# --- row 1: the instance list is {"items": [...]} of runtime instances -----------------------


async def test_instances_are_items_mapped_to_targets_by_runtime_and_state(fleet: FleetClient) -> None:
    targets = await fleet.instances()
    assert targets == [
        Target(id=HOST_ID, executor_id=HOST_ID, runtime_id="host:host-runner-1",
               workload_kinds=["one-shot-command", "daemon", "persistent-agent", "scheduled-collector"],
               isolation_kinds=["host"], status="ready", active_tasks=0),
        Target(id="0193a1c2-0000-7000-8000-000000000002", executor_id="0193a1c2-0000-7000-8000-000000000002",
               runtime_id="docker:agent-docker-2",
               workload_kinds=["one-shot-command", "daemon", "persistent-agent", "scheduled-collector"],
               isolation_kinds=["container"], status="ready", active_tasks=0),
        Target(id="0193a1c2-0000-7000-8000-000000000003", executor_id="0193a1c2-0000-7000-8000-000000000003",
               runtime_id="qemu:agent-vm-3",
               workload_kinds=["one-shot-command", "daemon", "persistent-agent", "scheduled-collector"],
               isolation_kinds=["vm"], status="offline", active_tasks=0),
    ]  # fmt: skip


async def test_unknown_response_fields_are_ignored_and_logged_once(
    fleet: FleetClient, server: RealServer, caplog: pytest.LogCaptureFixture
) -> None:
    golden = fixture("instances")
    for item in golden["body"]["items"]:
        item["placement_zone"] = "rack-4"  # a field a later server adds
    server.overrides[("GET", "/api/v2/admin/instances")] = golden
    with caplog.at_level(logging.WARNING, logger="activities.agentic_sandbox_api"):
        assert len(await fleet.instances()) == 3
        assert len(await fleet.instances()) == 3
    mentions = [r for r in caplog.records if "placement_zone" in r.getMessage()]
    assert len(mentions) == 1 and mentions[0].levelno == logging.WARNING
    assert "Instance" in mentions[0].getMessage()


# --- row 2: an observation answers the bare record -------------------------------------------


async def test_observation_answers_the_bare_record(fleet: FleetClient) -> None:
    status = WorkloadStatus.model_validate(fixture("observation")["body"]["status"])
    record = await fleet.observe("c-1", 1, status)
    assert (record.lineage.child_id, record.lineage.task_id, record.status.revision) == ("c-1", "task-7", 2)


# --- row 3: a task has contextId only if the message carried one; status has more fields -----


async def test_task_without_context_id_and_with_extra_status_fields(executor: ExecutorClient) -> None:
    submitted = await executor.send_message(HOST_ID, dispatch())
    assert (submitted.id, submitted.status.state, submitted.context_id) == ("task-7", "submitted", None)
    failed = await executor.get_task(HOST_ID, "task-8")
    assert failed.terminal and failed.context_id is None
    assert (failed.status.fail_kind, failed.status.terminal_at) == ("application", "2026-12-01T12:00:03.000000+00:00")
    assert failed.status.summary == "command cmd-42 exited 2" and failed.status_text() == "command cmd-42 exited 2"


# --- row 4: every POST under /agents carries the runtime extension ---------------------------


async def test_every_agents_post_carries_the_runtime_extension_cancel_too(
    executor: ExecutorClient, server: RealServer
) -> None:
    await executor.send_message(HOST_ID, dispatch())
    canceled = await executor.cancel_task(HOST_ID, "task-working")
    assert canceled.status.state == "canceled"
    posts = [r for r in server.requests if r.method == "POST"]
    assert len(posts) == 2
    for request in posts:
        assert RUNTIME_EXTENSION in request.headers["A2A-Extensions"].split(", ")


# --- row 5: errors are problem documents typed by `code` -------------------------------------


async def test_problem_documents_are_typed_by_code(executor: ExecutorClient, server: RealServer) -> None:
    with pytest.raises(TaskNotCancelable) as ended:
        await executor.cancel_task(HOST_ID, "task-done")
    assert (ended.value.status, ended.value.code) == (409, "task.not_cancelable")
    assert ended.value.message == "Task 'task-done' is in terminal state 'completed'"
    with pytest.raises(TaskNotFound) as missing:
        await executor.get_task(HOST_ID, "task-missing")
    assert (missing.value.status, missing.value.code) == (404, "task.not_found")
    with pytest.raises(IdempotencyCollision) as reused:
        await executor.send_message(HOST_ID, dispatch("reused"))
    assert (reused.value.status, reused.value.code) == (422, "idempotency.key_reused")
    refused = RealServer.respond(fixture("problem-extension-required"))
    error = error_from_response(refused)
    assert isinstance(error, FleetRejected) and error.code == "extension.required_not_activated"


# --- row 8: an empty fleet is 200 with records: [] -------------------------------------------


async def test_empty_inventory_is_200_with_no_records(fleet: FleetClient, server: RealServer) -> None:
    assert await fleet.inventory() is None
    assert [r.url.path for r in server.requests] == ["/api/v2/fleet/workloads"]


async def test_requests_stay_strict() -> None:
    with pytest.raises(ValidationError):
        RuntimeIdentity.model_validate({"task_id": "t-1", "tusk_id": "typo"})
    with pytest.raises(ValidationError):
        ReconcileRequest.model_validate({"before_revision": 0, "child_ids": []})


# --- row 7 (client side): the orchestrator binds the task with an observation ----------------


class BindingServer(RealServer):
    """The real server over one workload `c-1`: unbound after dispatch, bound once an observation
    lands, then projected from its completed task (fleet.rs `get_workload` + `project_task_observation`)."""

    def __init__(self, *, observe_answer: str = "observation", landed: bool = True, unavailable: int = 0) -> None:
        super().__init__()
        self.bound = False
        self.unavailable = unavailable  # how many observations fail (the server briefly unreachable)
        self.observe_answer = observe_answer
        self.landed = landed  # does the observation land (also when its answer says otherwise)?

    def route(self, method: str, path: str) -> str:
        agents = f"/agents/{HOST_ID}/v1"
        if (method, path) == ("GET", "/api/v2/fleet/workloads/c-1"):
            return "workload-bound-succeeded" if self.bound else "workload-unbound"
        if (method, path) == ("POST", "/api/v2/fleet/workloads/c-1/observations"):
            if self.unavailable:
                self.unavailable -= 1
                return "fleet-unavailable"
            self.bound = self.bound or self.landed
            return self.observe_answer
        if (method, path) == ("GET", f"{agents}/tasks/task-7"):
            return "task-completed"
        if (method, path) == ("GET", f"{agents}/tasks/task-7/artifacts"):
            return "task-artifacts"
        return super().route(method, path)

    def observations(self) -> list[dict[str, Any]]:
        return [json.loads(r.content) for r in self.requests if r.url.path.endswith("/observations")]


def dispatch_and_read_request(wait: float = 1.0) -> DispatchAndRead:
    return DispatchAndRead(
        dispatch=DispatchTask(instance_id=HOST_ID, dispatch=TaskDispatch(
            message_id="m-1:c-1", child_id="c-1", kind="one-shot-command", prompt="echo hello world")),
        child_id="c-1", wait_for_end_seconds=wait,
    )  # fmt: skip


async def run_dispatch_and_read(server: BindingServer, request: DispatchAndRead) -> Dispatched:
    activities = FleetActivities(BASE, BASE, "admin-token", "operator-token", transport=httpx.MockTransport(server))
    try:
        return await ActivityEnvironment().run(activities.dispatch_and_read, request)
    finally:
        await activities.aclose()


async def test_dispatch_binds_the_task_by_observation_and_reads_its_output_from_the_artifacts() -> None:
    server = BindingServer()
    dispatched = await run_dispatch_and_read(server, dispatch_and_read_request())
    [observation] = server.observations()
    assert observation["runtime_identity"] == {"task_id": "task-7"}
    assert (observation["expected_revision"], observation["status"]["revision"]) == (1, 2)
    assert observation["status"]["observed_state"] == "starting"
    assert dispatched.record.lineage.task_id == "task-7" and dispatched.record.status.observed_state == "succeeded"
    # row 6: the output is the stdout chunks of the artifacts route, in seq order (stderr left out)
    assert dispatched.output is not None and dispatched.output.output == "hello world\n"
    paths = [r.url.path for r in server.requests]
    assert paths[-1] == f"/agents/{HOST_ID}/v1/tasks/task-7/artifacts"


async def test_a_retry_after_the_binding_landed_binds_nothing_again() -> None:
    server = BindingServer()
    await run_dispatch_and_read(server, dispatch_and_read_request())
    again = await run_dispatch_and_read(server, dispatch_and_read_request())  # the answer was lost: retried
    sends = [json.loads(r.content)["message"]["messageId"] for r in server.requests if r.url.path.endswith(":send")]
    assert sends == ["m-1:c-1", "m-1:c-1"]  # the same idempotency key, so the same task
    assert len(server.observations()) == 1  # the record already named task-7: nothing written twice
    assert again.record.lineage.task_id == "task-7"


async def test_a_retry_after_the_send_but_before_the_binding_sends_again_and_binds() -> None:
    server = BindingServer(unavailable=1)
    with pytest.raises(ApplicationError) as failed:  # the attempt dies between send and observe
        await run_dispatch_and_read(server, dispatch_and_read_request())
    assert not failed.value.non_retryable and server.bound is False
    dispatched = await run_dispatch_and_read(server, dispatch_and_read_request())  # Temporal's retry
    sends = [json.loads(r.content)["message"]["messageId"] for r in server.requests if r.url.path.endswith(":send")]
    assert sends == ["m-1:c-1", "m-1:c-1"] and dispatched.record.lineage.task_id == "task-7"
    assert [o["runtime_identity"] for o in server.observations()] == [{"task_id": "task-7"}] * 2


async def test_a_stale_answer_to_a_binding_that_landed_is_recognised_as_landed() -> None:
    # The observation landed but its answer was a 409 (e.g. the write raced a projection).
    server = BindingServer(observe_answer="stale-revision", landed=True)
    dispatched = await run_dispatch_and_read(server, dispatch_and_read_request())
    assert len(server.observations()) == 1 and dispatched.record.lineage.task_id == "task-7"


async def test_the_artifacts_output_is_cut_to_the_callers_limit() -> None:
    artifacts = TaskArtifacts.model_validate(fixture("task-artifacts")["body"])
    view = task_view(HOST_ID, Task.model_validate(fixture("task-completed")["body"]), 5, artifacts)
    assert (view.output, view.output_truncated, view.status_text) == ("hello", True, "command cmd-41 exited 0")


# --- verifier evidence: the real server has no verifier, so the conductor runs one --------------


async def run_verifier(server: RealServer, command: str = "test -s answer.txt") -> Any:
    activities = FleetActivities(BASE, BASE, "admin-token", "operator-token", transport=httpx.MockTransport(server))
    request = RunVerifier(instance_id=HOST_ID, message_id="m-1:c-1:verify", context_id="m-1:c-1:context",
                          command=command, timeout_seconds=60, poll_interval_seconds=0.01)  # fmt: skip
    try:
        return await ActivityEnvironment().run(activities.run_verifier, request)
    finally:
        await activities.aclose()


@pytest.mark.parametrize("ending, passed", [("task-completed", True), ("task-failed", False)])
async def test_the_verifier_is_a_message_of_its_own_in_the_childs_context(ending: str, passed: bool) -> None:
    """The real executor runs whatever message it is sent and reads nothing from its metadata
    (`handlers/send_message.rs`); the verifier names no workload record, only the child's context."""
    server = RealServer()
    agents = f"/agents/{HOST_ID}/v1"
    ended = fixture(ending)
    ended["body"]["id"] = "task-7"
    server.overrides[("GET", f"{agents}/tasks/task-7")] = ended
    run = await run_verifier(server)
    send = next(r for r in server.requests if r.url.path.endswith("/messages:send"))
    message = json.loads(send.content)["message"]
    assert RUNTIME_EXTENSION in send.headers["A2A-Extensions"]
    assert (message["messageId"], message["contextId"]) == ("m-1:c-1:verify", "m-1:c-1:context")
    assert message["parts"] == [{"kind": "text", "text": "test -s answer.txt"}]
    assert message["metadata"][RUNTIME_EXTENSION] == {"kind": "one-shot-command", "timeout_seconds": 60}  # no child_id
    assert (run.task_id, run.passed, run.state) == ("task-7", passed, ended["body"]["status"]["state"])
    assert run.status_text == ended["body"]["status"]["summary"]
    again = await run_verifier(server)
    assert again.status_sha256 == run.status_sha256  # the evidence's hash is the status's, stably
    # Nothing is written to a record by the activity: the workflow records the outcome itself.
    assert not any(r.url.path.startswith("/api/v2/fleet") for r in server.requests)
