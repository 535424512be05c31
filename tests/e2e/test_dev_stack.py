"""The embedded dev stack (worker/stack.py), `conductor dev` and `conductor worker`, for real.

Real Temporal dev server, real substrate process, real worker, on free loopback ports,
with the state in tmp_path; every test leaves no process behind and checks it.
"""

from __future__ import annotations

import asyncio
import base64
import os
import queue
import re
import shlex
import signal
import socket
import stat
import subprocess
import threading
import uuid
from pathlib import Path

import httpx
import pytest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle

from activities.admission import set_policy_with_start
from tests.support.cli_support import conductor_command
from tests.support.processes import descendants, session_members, until_gone, ensure_stopped
from worker.binaries import temporal_cli
from worker.lease import hold
from worker.ports import PortInUse
from worker.search_attributes import registered as registered_search_attributes
from worker.stack import DevStack, StackError
from workflows.admission.holders import HeldRequest
from workflows.admission.messages import LeaseRow, PolicyChange, admission_workflow_id
from workflows.admission.model import AdmissionPolicy
from workflows.mission.search import SEARCH_ATTRIBUTES
from workflows.mission.spec import ChildSpec
from workflows.workload.messages import WorkloadInput, WorkloadResult
from workflows.workload.record import fleet_child_id

pytestmark = pytest.mark.timeout(120)

FREE_PORTS = {"temporal_port": 0, "ui_port": 0, "substrate_port": 0}
# A bug in workflow code fails the test's workflow at once instead of retrying the task forever.
STRICT_WORKER = {"workflow_failure_exception_types": [Exception]}


# --- workflows and histories --------------------------------------------------------------------


async def history_text(handle: WorkflowHandle) -> str:
    """The history as JSON plus every payload decoded (payloads are base64 in the JSON)."""
    text = (await handle.fetch_history()).to_json()
    decoded = [base64.b64decode(d).decode("utf-8", "replace") for d in re.findall(r'"data":\s*"([A-Za-z0-9+/=]+)"', text)]
    return "\n".join([text, *decoded])


async def take_a_lease(client: Client, task_queue: str, name: str) -> None:
    """A holder takes a lease on the stack's host group and gives it back: the stack's worker runs
    the singleton (started by the operator's policy, as `conductor admission policy set` does)."""
    await set_policy_with_start(client, task_queue, "dev-stack", PolicyChange(operator="dev-test", policy=AdmissionPolicy(max_concurrent=4)))
    request = HeldRequest(request_id=name, orchestrator_id="dev-test")
    async with hold(client, "dev-stack", request, holder="dev-test") as lease:
        assert lease.decision.state == "admitted", lease.decision
    singleton = client.get_workflow_handle(admission_workflow_id("dev-stack"))
    assert await singleton.query("leases", result_type=list[LeaseRow]) == []


async def run_echo(client: Client, task_queue: str, text: str) -> tuple[WorkflowHandle, WorkloadResult, str]:
    """Run `echo text` through WorkloadWorkflow; also returns the workload's id on the substrate."""
    child = ChildSpec(child_id=f"child-{uuid.uuid4().hex[:10]}", kind="one-shot-command", prompt=f"echo {text}")
    input = WorkloadInput(
        mission_id=f"mission-{uuid.uuid4().hex[:8]}",
        orchestrator_id="conductor-dev-test",
        child=child,
        target_id="local-2",
        executor_id="local-executor-2",
        poll_interval_seconds=0.1,
    )
    handle = await client.start_workflow(
        "WorkloadWorkflow",
        input,
        id=f"workload:{input.mission_id}:{child.child_id}",
        task_queue=task_queue,
        result_type=WorkloadResult,
    )
    return handle, await asyncio.wait_for(handle.result(), 30), fleet_child_id(input.mission_id, child.child_id)


def read_tokens(stack: DevStack) -> tuple[str, str]:
    fleet, executor = stack.token_files.read()
    return fleet.reveal(), executor.reveal()


# --- the stack ----------------------------------------------------------------------------------


async def test_stack_serves_runs_workflows_persists_and_leaves_no_process(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with DevStack(data, instances=2, worker_options=STRICT_WORKER, **FREE_PORTS) as stack:
        pids = stack.pids
        tree = descendants(*pids.values())
        assert set(pids.values()) <= tree and set(pids.values()) <= session_members(*pids.values())

        registered = await registered_search_attributes(stack.client, stack.namespace)
        for key in SEARCH_ATTRIBUTES:  # each with its own type (Keyword, or Int for the children counts)
            assert registered.get(key.name) == int(key.indexed_value_type), key.name

        tokens = read_tokens(stack)
        fleet_token, executor_token = tokens
        for path in (stack.token_files.fleet, stack.token_files.executor):
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(stack.token_files.fleet.parent.stat().st_mode) == 0o700

        async with httpx.AsyncClient(timeout=10) as http:
            assert (await http.get(stack.ui_url)).status_code == 200
            instances_url = f"{stack.substrate_url}/api/v2/admin/instances"
            answer = await http.get(instances_url, headers={"Authorization": f"Bearer {fleet_token}"})
            assert answer.status_code == 200 and len(answer.json()["items"]) == 2
            assert (await http.get(instances_url)).status_code == 401
            wrong_plane = await http.get(instances_url, headers={"Authorization": f"Bearer {executor_token}"})
            assert wrong_plane.status_code == 403  # the executor token has the operator role, not admin

        await asyncio.wait_for(take_a_lease(stack.client, stack.task_queue, "first"), 30)
        # The worker reached the substrate with the generated tokens, read from their files.
        workload, outcome, fleet_id = await run_echo(stack.client, stack.task_queue, "hello-from-dev")
        assert outcome.verdict == "satisfied" and outcome.observation.output == "hello-from-dev\n"

        admission = stack.client.get_workflow_handle(admission_workflow_id("dev-stack"))
        for handle in (admission, workload):
            text = await history_text(handle)
            assert all(token not in text for token in tokens)
        assert "hello-from-dev" in await history_text(workload)  # the search above does see payloads

        # One stack per data directory: a second one is refused before it starts anything.
        with pytest.raises(StackError, match="another dev stack"):
            await DevStack(data, **FREE_PORTS).start()
        tree = descendants(*pids.values())

    assert await until_gone(tree) == set()
    assert session_members(*pids.values()) == set()
    for log in (data / "temporal.log", data / "substrate" / "substrate.log"):
        assert all(token not in log.read_text(errors="replace") for token in tokens)

    # Second start: same tokens, Temporal still knows the missions, the substrate its records.
    async with DevStack(data, run_worker=False, **FREE_PORTS) as again:
        assert read_tokens(again) == tokens
        described = await again.client.get_workflow_handle(admission_workflow_id("dev-stack")).describe()
        assert described.status == WorkflowExecutionStatus.RUNNING  # a host group outlives the stack's restart
        assert (await again.client.get_workflow_handle(workload.id).describe()).status == WorkflowExecutionStatus.COMPLETED
        async with httpx.AsyncClient(timeout=10) as http:
            record = await http.get(
                f"{again.substrate_url}/api/v2/fleet/workloads/{fleet_id}",
                headers={"Authorization": f"Bearer {fleet_token}"},
            )
        assert record.status_code == 200 and record.json()["status"]["observed_state"] == "succeeded"

        # `conductor worker` in its own process, configured only by the printed exports.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CONDUCTOR_", "TEMPORAL_"))}
        env.update(again.cli_environment())
        worker = subprocess.Popen(
            [*conductor_command(), "worker"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            lines = LineReader(worker.stdout)
            lines.until("polling task queue", within=30, process=worker)
            await asyncio.wait_for(take_a_lease(again.client, again.task_queue, "second"), 30)
            _, echoed, _ = await run_echo(again.client, again.task_queue, "from-conductor-worker")
            assert echoed.observation.output == "from-conductor-worker\n"
            worker.send_signal(signal.SIGINT)
            assert worker.wait(30) == 0
            out, err = lines.rest(), worker.stderr.read()
        finally:
            ensure_stopped(worker)
        assert "stopped" in out and "warning" not in err
        assert all(token not in out + err for token in tokens)
        pids = again.pids
        tree = descendants(*pids.values())
        assert set(pids.values()) <= session_members(*pids.values())
    assert await until_gone(tree) == set()
    assert session_members(*pids.values()) == set()


@pytest.mark.parametrize(
    ("argument", "option", "what"),
    [("temporal_port", "--port", "Temporal gRPC"), ("ui_port", "--ui-port", "Web UI"), ("substrate_port", "--substrate-port", "substrate")],
)
async def test_a_taken_port_is_refused_naming_the_option_and_nothing_starts(
    tmp_path: Path, argument: str, option: str, what: str
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(StackError) as refused:
            await DevStack(tmp_path, **{**FREE_PORTS, argument: port}).start()
    assert isinstance(refused.value.__cause__, PortInUse)
    message = str(refused.value)
    assert f"127.0.0.1:{port}" in message and option in message and what in message
    assert not (tmp_path / "temporal.log").exists()  # refused before starting the server


# --- the commands -------------------------------------------------------------------------------


def _conductor_dev(data: Path) -> subprocess.Popen:
    """`conductor dev` on free ports with one substrate instance, its output piped."""
    command = [*conductor_command(), "dev", "--data-dir", str(data), "--port", "0", "--ui-port", "0",
               "--substrate-port", "0", "--instances", "1"]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


class LineReader:
    """A child's stdout read on a thread, so the test can wait for a line with a timeout."""

    def __init__(self, stream) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.put(line)
        self.lines.put(None)

    def until(self, text: str, *, within: float, process: subprocess.Popen) -> list[str]:
        while not any(text in line for line in self.seen):
            try:
                line = self.lines.get(timeout=within)
            except queue.Empty:
                raise AssertionError(f"no {text!r} within {within} s; output so far: {''.join(self.seen)}") from None
            if line is None:
                raise AssertionError(
                    f"the process ended (status {process.wait()}) before printing {text!r}: "
                    f"{''.join(self.seen)}{process.stderr.read() if process.stderr else ''}"
                )
            self.seen.append(line)
        return self.seen

    def rest(self) -> str:
        """Everything printed, once the stream has ended."""
        self._thread.join(10)
        while not self.lines.empty():
            line = self.lines.get_nowait()
            if line is not None:
                self.seen.append(line)
        return "".join(self.seen)


async def test_conductor_dev_prints_its_addresses_and_stops_cleanly_on_sigint(tmp_path: Path) -> None:
    data = tmp_path / "dev"
    process = _conductor_dev(data)
    tree: set[int] = set()
    try:
        lines = LineReader(process.stdout)
        printed = "".join(lines.until("Press Ctrl-C to stop.", within=60, process=process))
        address = re.search(r"Temporal gRPC: +(127\.0\.0\.1:\d+) \(namespace default\)", printed)
        ui = re.search(r"Temporal Web UI: +(http://127\.0\.0\.1:\d+)", printed)
        substrate = re.search(r"Substrate: +(http://127\.0\.0\.1:\d+) \(instances local-1\)", printed)
        assert address and ui and substrate, printed
        assert f"Data dir:         {data.resolve()}" in printed
        assert f"export TEMPORAL_ADDRESS={address[1]}" in printed
        assert f"export CONDUCTOR_SUBSTRATE_URL={substrate[1]}" in printed
        assert f"export CONDUCTOR_FLEET_TOKEN_FILE={data.resolve() / 'secrets' / 'fleet.token'}" in printed

        client = await Client.connect(address[1])
        assert {key.name for key in SEARCH_ATTRIBUTES} <= set(await registered_search_attributes(client, "default"))
        async with httpx.AsyncClient(timeout=10) as http:
            assert (await http.get(ui[1])).status_code == 200
            assert (await http.get(f"{substrate[1]}/api/v2/admin/instances")).status_code == 401
        tree = descendants(process.pid)
        assert len(tree) >= 3  # conductor, the Temporal dev server, the substrate

        # A second shell: `eval "$(conductor dev env)"` puts `conductor` and `temporal` on this stack.
        assert f'eval "$(conductor dev env --data-dir {data})"' in printed
        second_shell = (
            f'eval "$({shlex.join(conductor_command())} dev env --data-dir {shlex.quote(str(data))})" && '
            f'{shlex.quote(temporal_cli())} workflow list --query \'WorkflowId = "admission:default"\' -o json && '
            'echo "$CONDUCTOR_SUBSTRATE_URL $CONDUCTOR_FLEET_TOKEN_FILE"'
        )
        clean = {name: value for name, value in os.environ.items() if not name.startswith(("TEMPORAL_", "CONDUCTOR_"))}
        shell = subprocess.run(["bash", "-c", second_shell], env=clean, capture_output=True, text=True, timeout=60)
        assert shell.returncode == 0 and '"workflowId": "admission:default"' in shell.stdout, shell.stdout + shell.stderr
        assert f"{substrate[1]} {data.resolve() / 'secrets' / 'fleet.token'}" in shell.stdout
        profile = (data / "temporal.toml").read_text()
        assert f'address = "{address[1]}"' in profile

        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 0
        out, err = lines.rest(), process.stderr.read()
    finally:
        ensure_stopped(process, tree)
    assert "stopped; state kept in" in out, out + err
    gone = subprocess.run([*conductor_command(), "dev", "env", "--data-dir", str(data)], capture_output=True, text=True)
    assert gone.returncode == 1 and gone.stderr.startswith(f"conductor dev env: no dev stack is running in {data}"), gone.stderr
    assert not (data / "temporal.toml").exists()
    tokens = [(data / "secrets" / name).read_text().strip() for name in ("fleet.token", "executor.token")]
    assert all(token not in out + err for token in tokens)
    assert await until_gone(tree) == set()


async def test_conductor_dev_stops_everything_and_fails_when_a_server_dies_under_it(tmp_path: Path) -> None:
    process = _conductor_dev(tmp_path)
    tree: set[int] = set()
    try:
        lines = LineReader(process.stdout)
        lines.until("Press Ctrl-C to stop.", within=60, process=process)
        tree = descendants(process.pid)
        substrate = [pid for pid in tree if b"-m\x00substrate\x00serve" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert len(substrate) == 1
        os.kill(substrate[0], signal.SIGKILL)
        assert process.wait(30) == 1
        err = process.stderr.read()
    finally:
        ensure_stopped(process, tree)
    assert "the substrate exited with status -9" in err and str(tmp_path / "substrate" / "substrate.log") in err
    assert await until_gone(tree) == set()


def test_conductor_worker_says_how_to_reach_temporal_when_it_cannot(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from worker.cli import run
    from worker.ports import free_port

    monkeypatch.setenv("TEMPORAL_ADDRESS", f"127.0.0.1:{free_port('127.0.0.1')}")
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(tmp_path / "absent.toml"))
    monkeypatch.setenv("CONDUCTOR_RECONNECT_SECONDS", "1")  # it waits this long for a server still starting
    assert run(["worker", "--data-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "trying again for up to 1 s" in err
    assert err.splitlines()[-1].startswith("conductor worker: cannot reach Temporal at 127.0.0.1:") and "conductor dev" in err


# --- the demo -------------------------------------------------------------------------------------


def _hold(port: int) -> socket.socket | None:
    """Take a loopback port for the length of a test (None if something else has it already)."""
    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", port))
        holder.listen()
    except OSError:
        holder.close()
        return None
    return holder


def test_demo_takes_free_ports_and_says_its_verdict_once(tmp_path: Path) -> None:
    """Issue 12: `make demo` hard-coded its ports, and printed `quorum 4/4 met` above
    `verdict: quorum 3/4 met` (the live summary, once a fourth child was satisfied, above the
    verdict fixed at three). The usual ports are held here: the demo still runs, on free ones."""
    held = [sock for sock in (_hold(port) for port in (7233, 8233, 8787)) if sock is not None]
    try:
        done = subprocess.run(
            [*conductor_command(), "demo", "--data-dir", str(tmp_path / "data")],
            capture_output=True, text=True, timeout=180,
        )
    finally:
        for sock in held:
            sock.close()
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    addresses = re.findall(r"127\.0\.0\.1:(\d+)", out.split("mission demo-")[0])
    assert len(addresses) == 3 and not {"7233", "8233", "8787"} & set(addresses), out
    ledger = out[out.index("\nmission demo-", out.index("snapshot")):]
    verdicts = [line for line in ledger.splitlines() if line.startswith("  verdict")]
    assert len(verdicts) == 1 and verdicts[0].startswith("  verdict (quorum): quorum 3/5 met (needs 3)"), ledger
    assert sum(" met" in line for line in ledger.splitlines()) == 1, ledger
    assert "\nverdict: " not in out and "mission closed: completed" in out
    # The child that asks before it publishes: asked, answered as an operator would, and it went on.
    assert "publish-report asks: 'Publish the machine survey?'" in out and "-> delivered in" in out, out
    assert "published (" in ledger and "answered by demo-operator" in ledger, ledger


def test_make_demo_passes_demo_args_through() -> None:
    root = Path(__file__).resolve().parents[2]
    dry = subprocess.run(
        ["make", "-n", "--no-print-directory", "-C", str(root), "demo", "DEMO_ARGS=--keep --ui-port 8233"],
        capture_output=True, text=True, timeout=60,
    )
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.strip().splitlines()[-1].endswith("/conductor demo --keep --ui-port 8233"), dry.stdout


def test_demo_help_lists_its_options(capsys) -> None:
    from worker.cli import run

    with pytest.raises(SystemExit):
        run(["demo", "--help"])
    out = capsys.readouterr().out
    for option in ("--temporal-port", "--ui-port", "--substrate-port", "--keep", "--spec", "--data-dir", "DEMO_ARGS"):
        assert option in out
