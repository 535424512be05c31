"""Clients ride out a Temporal server restart: real dev server on SQLite, stopped and started again.

The CLI (`conductor mission run`) waits through a restart and prints the verdict, saying once
that it is reconnecting; past CONDUCTOR_RECONNECT_SECONDS it gives up in one line. The worker
in the test process loses the server too and carries the mission on by itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.client import (
    Client,
    Interceptor,
    OutboundInterceptor,
    StartWorkflowUpdateInput,
    WorkflowHandle,
    WorkflowUpdateHandle,
)
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.service import RPCError, RPCStatusCode

from tests.support.substrate_fixtures import substrate  # noqa: F401  (fixture)
from tests.support.cli_support import without_profiles
from tests.support.mission_harness import mission_harness
from worker.admission_live import LiveAdmission, Unreachable
from worker.cli import run as run_cli
from worker.connection import (
    CLI_RETRY_CONFIG,
    Reconnect,
    ReconnectSettingError,
    TemporalUnreachable,
    connect_patiently,
    reconnect_seconds,
    server_busy,
    transport_failure,
)
from worker.devserver import DevServer, start_dev_server
from worker.mission_control import MissionControl, ReviewRefused, parse_spec
from worker.payloads import DATA_CONVERTER
from worker.ports import free_port
from workflows.admission.messages import QueueRow
from workflows.mission.ledger import MissionLedger
from workflows.mission.messages import mission_workflow_id
from workflows.mission.search import SEARCH_ATTRIBUTES

HOST = "127.0.0.1"
RECONNECTING = "reconnecting for up to"


class RestartableServer:
    """`temporal server start-dev` on fixed loopback ports and one SQLite file, so a restart keeps its state."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port = free_port(HOST)
        self.ui_port = free_port(HOST)
        self.server: DevServer | None = None
        self.client: Client | None = None  # the first client; it (and the worker on it) must reconnect by itself

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    async def start(self) -> None:
        server, client = await start_dev_server(
            self.data_dir, host=HOST, port=self.port, ui_port=self.ui_port, namespace="default",
            search_attributes=SEARCH_ATTRIBUTES,
        )
        self.server = server
        self.client = self.client or client

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    async def restart(self, down_for: float) -> None:
        await asyncio.to_thread(self.stop)
        await asyncio.sleep(down_for)
        await self.start()


@pytest.fixture
async def temporal(tmp_path: Path) -> AsyncIterator[RestartableServer]:
    server = RestartableServer(tmp_path / "temporal")
    await server.start()
    try:
        yield server
    finally:
        server.stop()


def one_shot(child_id: str, prompt: str) -> dict:
    return {"child_id": child_id, "kind": "one-shot-command", "prompt": prompt}


async def accepted_updates(handle: WorkflowHandle, name: str) -> int:
    """How many `name` updates the workflow has accepted (each is an event in its history)."""
    history = await handle.fetch_history()
    return sum(
        1 for event in history.events
        if event.HasField("workflow_execution_update_accepted_event_attributes")
        and event.workflow_execution_update_accepted_event_attributes.accepted_request.input.name == name
    )


def cli_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, address: str, bound: str, task_queue: str = "") -> None:
    """Only these settings decide where the CLI connects and how long it waits (no profile of whoever runs the tests)."""
    without_profiles(monkeypatch, tmp_path)
    monkeypatch.setenv("TEMPORAL_ADDRESS", address)
    monkeypatch.setenv("TEMPORAL_NAMESPACE", "default")
    if task_queue:
        monkeypatch.setenv("CONDUCTOR_TASK_QUEUE", task_queue)
    monkeypatch.setenv("CONDUCTOR_RECONNECT_SECONDS", bound)


async def start_run_in_thread(h, tmp_path: Path, spec: dict) -> asyncio.Task[int]:
    """`conductor mission run SPEC` in a thread, returned once it waits on the mission's verdict."""
    path = tmp_path / f"{spec['mission_id']}.json"
    path.write_text(json.dumps(spec))
    cli = asyncio.ensure_future(asyncio.to_thread(run_cli, ["mission", "run", "--create-host-group", str(path)]))
    handle = h.client.get_workflow_handle(mission_workflow_id(spec["mission_id"]))

    async def waiting() -> bool:
        if cli.done():
            raise AssertionError(f"the CLI ended before waiting (exit {cli.result()})")
        try:
            return await accepted_updates(handle, "wait_for_verdict") > 0
        except RPCError:
            return False  # not started yet

    await h.until(waiting, "the CLI waiting on wait_for_verdict")
    return cli


async def test_run_rides_out_a_temporal_restart(temporal, substrate, tmp_path, monkeypatch, capsys):
    async with mission_harness(temporal.client, substrate, tmp_path) as h:
        cli_env(monkeypatch, tmp_path, temporal.address, "60", h.config.task_queue)
        spec = h.spec("restart", [one_shot("slow", "sleep 4; echo done")])
        cli = await start_run_in_thread(h, tmp_path, spec)
        # Down for longer than the client's own quick retries, so the CLI must notice and reconnect.
        await temporal.restart(down_for=1.5)
        code = await asyncio.wait_for(cli, 60)
        final = await h.control.handle(spec["mission_id"]).result()
    out, err = capsys.readouterr()
    assert code == 0, err
    assert f"mission {spec['mission_id']}: completed" in out
    assert final.parent_state == "completed" and final.child("slow").output.strip() == "done"
    reconnecting = [line for line in err.splitlines() if RECONNECTING in line]
    assert len(reconnecting) == 1, err
    assert reconnecting[0].startswith(f"conductor: lost the Temporal server at {temporal.address} (")
    assert reconnecting[0].endswith("); reconnecting for up to 60 s ...")
    assert "Traceback" not in err and "gave up" not in err


async def test_run_gives_up_past_the_bound_in_one_line(temporal, substrate, tmp_path, monkeypatch, capsys):
    async with mission_harness(temporal.client, substrate, tmp_path) as h:
        cli_env(monkeypatch, tmp_path, temporal.address, "2", h.config.task_queue)
        spec = h.spec("give-up", [one_shot("slow", "sleep 3; echo done")])
        cli = await start_run_in_thread(h, tmp_path, spec)
        # A live view connected before the server went away gives up the same way.
        live = LiveAdmission(
            await Client.connect(temporal.address, data_converter=DATA_CONVERTER, retry_config=CLI_RETRY_CONFIG),
            spec["host_group"], reconnect_seconds=1, announce=(announced := []).append,
        )
        await asyncio.to_thread(temporal.stop)
        code = await asyncio.wait_for(cli, 30)  # well short of the 60 s default: the bound was read
        with pytest.raises(Unreachable, match=r"^gave up querying queue for host group .* within 1 s"):
            await live.query("queue", 10, result_type=list[QueueRow])
        out, err = capsys.readouterr()
        # The mission carries on in Temporal: once the server is back, the worker finishes it.
        await temporal.start()
        final = await h.control.handle(spec["mission_id"]).result()
    assert code == 1 and out == ""
    lines = [line for line in err.splitlines() if line.startswith("conductor:")]
    assert len(lines) == 2 and RECONNECTING in lines[0] and "up to 2 s" in lines[0], err
    assert lines[1].startswith(f"conductor: gave up waiting for the verdict of mission {spec['mission_id']}")
    assert "within 2 s" in lines[1] and "CONDUCTOR_RECONNECT_SECONDS" in lines[1]
    assert "Traceback" not in err
    assert len(announced) == 1 and RECONNECTING in announced[0]
    assert final.parent_state == "completed"


class LoseReviewAnswer(Interceptor):
    """The first review update lands, but its answer is lost as a broken connection would lose it.

    `remembers=False` also sends the repeat under a new update id, as if the server no longer had
    the first attempt's outcome; the workflow's validator then refuses a second review.
    """

    def __init__(self, remembers: bool) -> None:
        self.remembers = remembers
        self.sent: list[str] = []

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        return _LoseReviewAnswer(next, self)


class _LoseReviewAnswer(OutboundInterceptor):
    def __init__(self, next: OutboundInterceptor, owner: LoseReviewAnswer) -> None:
        super().__init__(next)
        self.owner = owner

    async def start_workflow_update(self, input: StartWorkflowUpdateInput) -> WorkflowUpdateHandle:
        if input.update != "review":
            return await super().start_workflow_update(input)
        if self.owner.sent and not self.owner.remembers:
            input = dataclasses.replace(input, update_id=f"forgotten-{uuid.uuid4()}")
        self.owner.sent.append(input.update_id or "")
        handle = await super().start_workflow_update(input)
        if len(self.owner.sent) == 1:
            raise RPCError("transport error", RPCStatusCode.UNKNOWN, b"")
        return handle


@pytest.mark.parametrize("remembers", [True, False], ids=["server-dedups", "ledger-recognised"])
async def test_review_repeated_after_a_lost_answer_is_recorded_once(dev_client: Client, substrate, tmp_path, remembers):
    lossy = LoseReviewAnswer(remembers)
    client = Client(
        dev_client.service_client, namespace=dev_client.namespace, data_converter=DATA_CONVERTER,
        interceptors=[lossy],
    )
    async with mission_harness(dev_client, substrate, tmp_path) as h:
        announced: list[str] = []
        control = MissionControl(client, h.config.task_queue, announce=announced.append)
        spec = h.spec("lost-review", [one_shot("only", "echo please review")], aggregation={"mode": "manual-review"})
        mission_id = await h.control.start(parse_spec(spec))
        await h.until(lambda: _awaiting(h.control, mission_id), "awaiting-review")
        ledger = await control.review(mission_id, approve=True, operator="alice", reason="looks right")
        final = await h.control.handle(mission_id).result()
        reviews = await accepted_updates(h.control.handle(mission_id), "review")
        # A different decision afterwards is still refused: only a repeat of this one is recognised.
        with pytest.raises(ReviewRefused, match="already reviewed|already completed|already closed"):
            await MissionControl(dev_client, h.config.task_queue).review(
                mission_id, approve=False, operator="bob", reason="late",
            )
    assert len(lossy.sent) == 2 and (lossy.sent[0] == lossy.sent[1]) == remembers
    assert ledger.review is not None and (ledger.review.operator, ledger.review.decision) == ("alice", "approve")
    assert final.parent_state == "completed" and final.review == ledger.review
    assert reviews == 1
    assert len(announced) == 1 and "(transport error)" in announced[0]


async def test_answers_are_not_retried(dev_client: Client):
    announced: list[str] = []
    control = MissionControl(dev_client, "nowhere", reconnect_seconds=30, announce=announced.append)
    with pytest.raises(RPCError) as raised:
        await control.show(f"no-such-mission-{uuid.uuid4().hex[:8]}")
    assert raised.value.status == RPCStatusCode.NOT_FOUND and announced == []


def test_what_counts_as_a_lost_connection():
    assert transport_failure(RPCError("tcp connect error", RPCStatusCode.UNAVAILABLE, b"")) == "tcp connect error"
    assert transport_failure(RPCError("transport error", RPCStatusCode.UNKNOWN, b"")) == "transport error"
    for answer in (
        RPCError("workflow not found for ID: mission:x", RPCStatusCode.NOT_FOUND, b""),
        RPCError("update refused", RPCStatusCode.FAILED_PRECONDITION, b""),
        RPCError("something odd", RPCStatusCode.UNKNOWN, b""),
        ValueError("not an RPC error"),
    ):
        assert transport_failure(answer) is None


BUSY = "consistent query buffer is full, this may be caused by too many queries and workflow not able to process query fast enough"


async def test_a_busy_server_is_asked_again_quietly_with_backoff(dev_client: Client):
    """RESOURCE_EXHAUSTED is back-pressure (seen in CI: three watchers querying one mission whose
    daemon renews its lease every second); the CLI waits it out instead of giving up."""
    announced: list[str] = []
    answers: list[float] = []
    reconnect = Reconnect(dev_client, 30, announce=announced.append)

    async def query() -> str:
        answers.append(asyncio.get_running_loop().time())
        if len(answers) < 4:
            raise RPCError(BUSY, RPCStatusCode.RESOURCE_EXHAUSTED, b"")
        return "ledger"

    assert await reconnect.call(query, "reading the ledger") == "ledger"
    gaps = [later - earlier for earlier, later in zip(answers, answers[1:])]
    assert len(answers) == 4 and gaps[0] >= 0.45 and gaps[2] > gaps[0] * 1.5, gaps
    assert announced == []


async def test_a_server_busy_past_the_bound_is_one_line(dev_client: Client):
    reconnect = Reconnect(dev_client, 1, announce=lambda line: None)

    async def query() -> str:
        raise RPCError(BUSY, RPCStatusCode.RESOURCE_EXHAUSTED, b"")

    with pytest.raises(TemporalUnreachable) as raised:
        await reconnect.call(query, "reading the ledger")
    assert "gave up reading the ledger" in str(raised.value) and "stayed too busy" in str(raised.value)
    assert "\n" not in str(raised.value)
    assert server_busy(RPCError("not found", RPCStatusCode.NOT_FOUND, b"")) is None


def test_reconnect_bound_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("CONDUCTOR_RECONNECT_SECONDS", raising=False)
    assert reconnect_seconds() == 60
    monkeypatch.setenv("CONDUCTOR_RECONNECT_SECONDS", "2.5")
    assert reconnect_seconds() == 2.5 and reconnect_seconds(7) == 7
    for bad in ("soon", "-1", "nan"):
        monkeypatch.setenv("CONDUCTOR_RECONNECT_SECONDS", bad)
        with pytest.raises(ReconnectSettingError, match="CONDUCTOR_RECONNECT_SECONDS must be a number of seconds"):
            reconnect_seconds()


@pytest.mark.parametrize("command", [["mission", "watch", "m-1"], ["admission", "queue", "--host-group", "g"]])
async def test_a_bad_bound_is_one_line_and_exit_2(dev_client: Client, tmp_path, monkeypatch, capsys, command):
    cli_env(monkeypatch, tmp_path, dev_client.service_client.config.target_host, "soon")
    assert await asyncio.to_thread(run_cli, command) == 2
    err = capsys.readouterr().err
    assert err == "conductor: CONDUCTOR_RECONNECT_SECONDS must be a number of seconds, got 'soon'\n"


async def _awaiting(control: MissionControl, mission_id: str) -> bool:
    ledger: MissionLedger = await control.show(mission_id)
    return ledger.parent_state == "awaiting-review"


# --- the worker's first connection ------------------------------------------------------------------


async def test_a_worker_started_before_its_server_connects_once_the_server_is_up(tmp_path, monkeypatch):
    """A worker started next to a server that is still starting (or behind a proxy that resets a
    connection as it is made, bench/chaos.py's fault-proxy) waits for it instead of exiting."""
    without_profiles(monkeypatch, tmp_path)
    server = RestartableServer(tmp_path / "temporal")
    monkeypatch.setenv("TEMPORAL_ADDRESS", server.address)
    said: list[str] = []
    connecting = asyncio.ensure_future(connect_patiently(seconds=60, announce=said.append))
    try:
        await asyncio.sleep(1.5)
        assert not connecting.done(), "connected to a server that is not there"
        await server.start()
        client = await asyncio.wait_for(connecting, 30)
        assert (await client.workflow_service.get_system_info(GetSystemInfoRequest())).server_version
    finally:
        connecting.cancel()
        server.stop()
    assert len(said) == 1 and f"cannot reach Temporal at {server.address}" in said[0] and "up to 60 s" in said[0]


async def test_a_worker_gives_up_on_an_absent_server_at_the_bound_and_at_once_on_a_bad_setting(tmp_path, monkeypatch):
    without_profiles(monkeypatch, tmp_path)
    monkeypatch.setenv("TEMPORAL_ADDRESS", f"{HOST}:{free_port(HOST)}")
    said: list[str] = []
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(ConnectionError, match="cannot reach Temporal"):
        await connect_patiently(seconds=2, announce=said.append)
    assert loop.time() - began >= 1.0 and len(said) == 1  # it did wait, within its bound
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(tmp_path / "not-toml.toml"))
    (tmp_path / "not-toml.toml").write_text("[profile.default\n")
    monkeypatch.setenv("TEMPORAL_PROFILE", "default")
    said.clear()
    with pytest.raises(ConnectionError, match="cannot load the Temporal environment configuration"):
        await connect_patiently(seconds=60, announce=said.append)
    assert said == []  # a setting that is wrong is not waited on
