"""Workload processes outlive a substrate restart and are re-adopted (issue 10, row 10).

Over real HTTP against `python -m substrate serve` processes on one data directory: the
substrate is stopped (SIGKILL, a crash; then SIGTERM, keeping its workloads) while its tasks
run, and started again. A task whose process still runs stays `working`, reconciliation says
`re-adopted`, and it completes when its process exits. A process that ended meanwhile is
reported by the exit status its wrapper recorded; one killed with its wrapper is `unknown`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from activities.agentic_sandbox_api import RuntimeIdentity
from activities.sandbox_client import ExecutorClient, FleetClient
from substrate import procs
from substrate.config import SubstrateConfig
from substrate.server import serve_in_thread, spawn
from tests.support.substrate_fixtures import substrate_config
from tests.support.processes import process_dead, read_pid, wait_until
from tests.support.substrate_support import (
    EXECUTOR_TOKEN,
    FLEET_TOKEN,
    make_record,
)
from workflows.workload.messages import TaskDispatch

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(autouse=True)
def no_workload_outlives_the_test(tmp_path: Path) -> Iterator[None]:
    """The workloads here outlive their substrate on purpose; whatever a failed test left, goes."""
    yield
    for pidfile in tmp_path.glob("*.pid"):
        with contextlib.suppress(OSError, ValueError):
            pid = int(pidfile.read_text())
            # Only a process of this test (its command line names the test's directory): a pid
            # may have been handed to someone else's process since.
            if str(tmp_path) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                os.killpg(os.getpgid(pid), signal.SIGKILL)


def dispatch(child_id: str, prompt: str, **options: object) -> TaskDispatch:
    return TaskDispatch(message_id=f"msg-{child_id}", child_id=child_id, kind="one-shot-command", prompt=prompt,
                    **options)  # type: ignore[arg-type]  # fmt: skip


def waiting_command(tmp: Path, name: str, then: str = "echo done") -> str:
    """Writes its shell's pid, then waits for a release file the test creates."""
    return f"echo $$ > {tmp / (name + '.pid')}; while [ ! -e {tmp / (name + '.go')} ]; do sleep 0.05; done; {then}"


async def admit_and_dispatch(fleet: FleetClient, executor: ExecutorClient, child_id: str, prompt: str,
                             **options: object) -> str:  # fmt: skip
    await fleet.admit(make_record(child_id))
    task = await executor.send_message("local-1", dispatch(child_id, prompt, **options))
    record = await fleet.get(child_id)
    if record.lineage.task_id is None:  # the orchestrator binds the task, as on the real server
        status = record.status.model_copy(update={"revision": record.status.revision + 1})
        await fleet.observe(child_id, record.status.revision, status, RuntimeIdentity(task_id=task.id))
    return task.id


async def task_state(http: httpx.AsyncClient, task_id: str) -> dict[str, object]:
    answer = await http.get(f"/agents/local-1/v1/tasks/{task_id}")
    assert answer.status_code == 200, answer.text
    status = answer.json()["status"]
    assert isinstance(status, dict)
    return status


async def wait_state(http: httpx.AsyncClient, task_id: str, states: set[str], timeout: float = 15) -> dict[str, object]:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        status = await task_state(http, task_id)
        if status["state"] in states:
            return status
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"task {task_id} never reached {states}; last status {status}")
        await asyncio.sleep(0.05)


def executor_http(base_url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=base_url, headers={"Authorization": f"Bearer {EXECUTOR_TOKEN}"}, timeout=10)


async def reconcile(fleet: FleetClient, child_ids: list[str]) -> dict[str, str]:
    """Classifications after a read of each record: reads project the task into it, reconciliation
    classifies the stored records (`fleet.rs`: `get_workload` refreshes, `reconcile` does not)."""
    for child_id in child_ids:
        await fleet.get(child_id)
    return {row.child_id: row.classification for row in (await fleet.reconcile(0, child_ids)).rows}


async def test_a_running_task_is_re_adopted_after_a_crash_and_a_clean_stop(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ids: dict[str, str] = {}
    with spawn(data, FLEET_TOKEN, EXECUTOR_TOKEN, keep_workloads_on_stop=True) as first:
        async with FleetClient(first.base_url, FLEET_TOKEN) as fleet, ExecutorClient(first.base_url, EXECUTOR_TOKEN) as executor:
            for name, then in (("keeps", "echo done"), ("exits", "echo bye; exit 3"), ("shot", "echo never"),
                               ("group", "echo never")):  # fmt: skip
                ids[name] = await admit_and_dispatch(fleet, executor, f"re-{name}", waiting_command(tmp_path, name, then))
            pids = {name: await read_pid(tmp_path / f"{name}.pid") for name in ids}
            async with executor_http(first.base_url) as http:
                for task_id in ids.values():
                    await wait_state(http, task_id, {"working"})
        first.kill()  # SIGKILL to the substrate alone, a crash: no shutdown code runs, its workloads live on

    assert all(not process_dead(pid) for pid in pids.values())
    # While it is down: one command exits by itself, one is killed (its wrapper survives and records
    # the signal's status), one is killed with its whole group (nothing is left to record a status).
    (tmp_path / "exits.go").touch()
    os.kill(pids["shot"], signal.SIGKILL)
    os.killpg(os.getpgid(pids["group"]), signal.SIGKILL)
    await wait_until(lambda: process_dead(pids["exits"]) and process_dead(pids["shot"]) and process_dead(pids["group"]))

    with spawn(data, FLEET_TOKEN, EXECUTOR_TOKEN, keep_workloads_on_stop=True) as second:
        async with FleetClient(second.base_url, FLEET_TOKEN) as fleet, executor_http(second.base_url) as http:
            assert (await task_state(http, ids["keeps"]))["state"] == "working"
            exits = await wait_state(http, ids["exits"], {"failed"})
            assert exits.get("exit_code", 3) == 3
            shot = await wait_state(http, ids["shot"], {"failed"})
            assert shot.get("exit_code", 137) == 137  # 128 + SIGKILL, as the wrapper's shell saw it
            assert (await task_state(http, ids["group"]))["state"] == "unknown"
            children = ["re-keeps", "re-exits", "re-shot", "re-group"]
            assert await reconcile(fleet, children) == {
                "re-keeps": "re-adopted",
                "re-exits": "failed-or-aborted",
                "re-shot": "failed-or-aborted",
                "re-group": "operator-review-required",
            }
            assert (await fleet.get("re-keeps")).status.observed_state == "running"
        assert second.stop() in (0, -signal.SIGTERM)  # a clean stop this time: it keeps what it re-adopted
    assert not process_dead(pids["keeps"])

    with spawn(data, FLEET_TOKEN, EXECUTOR_TOKEN) as third:
        async with FleetClient(third.base_url, FLEET_TOKEN) as fleet, executor_http(third.base_url) as http:
            assert (await task_state(http, ids["keeps"]))["state"] == "working"
            assert (await reconcile(fleet, ["re-keeps"]))["re-keeps"] == "re-adopted"
            (tmp_path / "keeps.go").touch()
            done = await wait_state(http, ids["keeps"], {"completed"})
            assert done.get("exit_code", 0) == 0
            record = await fleet.get("re-keeps")
            assert (record.status.observed_state, record.status.exit_classification) == ("succeeded", "success")
            assert (await reconcile(fleet, ["re-keeps"]))["re-keeps"] == "terminal"
    await wait_until(lambda: process_dead(pids["keeps"]))


async def test_a_re_adopted_task_can_be_cancelled_and_keeps_its_time_budget(tmp_path: Path) -> None:
    data = tmp_path / "data"

    def config() -> SubstrateConfig:
        return substrate_config(data, keep_workloads_on_stop=True)

    with serve_in_thread(config()) as running:
        async with FleetClient(running.base_url, FLEET_TOKEN) as fleet, ExecutorClient(running.base_url, EXECUTOR_TOKEN) as executor:
            cancel_id = await admit_and_dispatch(fleet, executor, "ra-cancel", waiting_command(tmp_path, "cancel"))
            budget_id = await admit_and_dispatch(fleet, executor, "ra-budget", waiting_command(tmp_path, "budget"),
                                                 timeout_seconds=3)  # fmt: skip
            cancel_pid = await read_pid(tmp_path / "cancel.pid")
            budget_pid = await read_pid(tmp_path / "budget.pid")

    with serve_in_thread(config()) as running:
        async with ExecutorClient(running.base_url, EXECUTOR_TOKEN) as executor, executor_http(running.base_url) as http:
            assert (await task_state(http, cancel_id))["state"] == "working"
            await executor.cancel_task("local-1", cancel_id)
            assert (await task_state(http, cancel_id))["state"] == "canceled"
            await wait_until(lambda: process_dead(cancel_pid))
            # Dispatched with 3 s: killed about 3 s after it started, not 3 s after the restart.
            await wait_state(http, budget_id, {"failed"}, timeout=10)
            await wait_until(lambda: process_dead(budget_pid))


def test_a_recycled_pid_is_not_taken_for_the_recorded_process() -> None:
    own = os.getpid()
    ticks = procs.start_ticks(own)
    assert ticks is not None and procs.is_running(own, ticks)
    assert not procs.is_running(own, ticks + 1)  # same pid, another start time: another process
    assert not procs.is_running(own, None)


async def test_a_re_adopted_command_ends_with_its_output_and_a_daemon_stays_up(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with serve_in_thread(substrate_config(data, keep_workloads_on_stop=True)) as running:
        async with FleetClient(running.base_url, FLEET_TOKEN) as fleet, ExecutorClient(running.base_url, EXECUTOR_TOKEN) as executor:
            verified_id = await admit_and_dispatch(fleet, executor, "ra-verified", waiting_command(tmp_path, "verified"))
            await fleet.admit(make_record("ra-daemon", "daemon"))
            daemon = await executor.send_message("local-1", TaskDispatch(message_id="msg-ra-daemon", child_id="ra-daemon",
                                                 kind="daemon", prompt=waiting_command(tmp_path, "daemon")))  # fmt: skip
            verified_pid = await read_pid(tmp_path / "verified.pid")
            daemon_pid = await read_pid(tmp_path / "daemon.pid")

    with serve_in_thread(substrate_config(data)) as running:  # this one kills its workloads when it stops
        async with executor_http(running.base_url) as http:
            assert (await task_state(http, verified_id))["state"] == "working"
            assert (await task_state(http, daemon.id))["state"] == "working"
            (tmp_path / "verified.go").touch()
            await wait_state(http, verified_id, {"completed"})
            # The re-adopted command's output becomes its artifacts, as a fresh run's would.
            answer = await http.get(f"/agents/local-1/v1/tasks/{verified_id}/artifacts")
            assert [row["artifact"]["data"] for row in answer.json()["artifacts"]] == ["done\n"]
            assert not process_dead(daemon_pid)
    await wait_until(lambda: process_dead(daemon_pid) and process_dead(verified_pid))
