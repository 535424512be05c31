"""Chaos: missions through the whole stack, every part a separate process, while the suite breaks them.

    .venv/bin/python -m bench.chaos [--scenario NAME[,NAME...]] [--missions N] [--children K] [--seed S]
                                    [--quick] [--scratch DIR] [--keep]

Each scenario gets a stack of its own on loopback, all of it separate processes: the Temporal dev
server (`temporal server start-dev`, SQLite file, so it survives a restart), the substrate
(`python -m substrate serve`), two workers (`python -m worker.cli worker`, configured only through
the environment, as `conductor worker` is) and, for `fault-proxy`, two fault-injecting proxies
(bench/faultproxy.py). Missions are started with MissionControl, as the CLI starts them.

Scenarios (all by default, in this order):
  worker-kill      SIGKILL a random worker (sometimes both) again and again during missions, restart it
  temporal-kill    SIGKILL the Temporal server mid-mission, restart it on its database
  substrate-kill   SIGKILL the substrate mid-mission, restart it on its database; tasks that were
                   running come back `unknown` (expected for now): those missions may fail closed
  fault-proxy      workers reach the substrate through an HTTP proxy that answers some requests 503
                   and cuts some connections (before or after forwarding), and Temporal through a TCP
                   proxy that resets some connections and adds latency
  lease-expiry     every worker down for longer than the lease TTL (a 6 s policy) while children run;
                   then the workers come back: the leases must be found expired, the runtime tasks
                   stopped and the children ended
  holder-chaos     holders that are not workflows (bench/admission_storm.py's, 40 of them; --quick
                   10) share a host group of 4 slots with a mission, reaching Temporal through a TCP
                   proxy that resets connections and adds latency, while a worker is SIGKILLed every
                   15 s and the Temporal server once; checked from what every holder saw and from
                   the server: the quota, revisions, nothing admitted after a give-back, every
                   request ended, no lease left, no failed workflow task of the singleton or a holder

Every child is a one-shot command that first appends its shell's pid to a file of its own in the
scratch directory, so a second run of the command shows even where the substrate's rows would not.
Per scenario the suite prints: missions started; missions settled with the expected verdict (and
those that failed closed where the scenario allows it); double dispatches (command runs and
substrate task rows per child); leases still held in the admission workflow after the missions
closed; child processes still alive after everything settled; missions or workloads still running
after a bounded wait (hangs). It exits 1 if any invariant is violated, 0 otherwise. Every loop is
bounded in count and time; every process it started is killed on the way out (also on Ctrl-C).
The scratch directory (logs, databases) is removed unless `--keep` or a violation was found.
`--quick` is the small form that tests/e2e/test_chaos.py runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import shlex
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from temporalio.client import Client, WorkflowExecutionStatus
from worker.payloads import DATA_CONVERTER
from temporalio.service import RPCError, RPCStatusCode

from bench.procstat import cmdline
from substrate.procs import alive, stat_fields
from worker.devserver import dev_server_command
from worker.search_attributes import registered as registered_search_attributes
from worker.mission_control import MissionControl, MissionIdUsed, parse_spec
from worker.ports import free_port
from worker.process import exit_now
from workflows.admission.messages import LeaseRow, admission_workflow_id
from workflows.admission.model import AdmissionPolicy, AuditEvent
from workflows.mission.ledger import MissionLedger
from workflows.mission.messages import admission_request_id, mission_workflow_id
from workflows.mission.search import SEARCH_ATTRIBUTES
from workflows.workload.client import workload_workflow_id
from workflows.workload.record import fleet_child_id

REPO = Path(__file__).resolve().parents[1]

HOST = "127.0.0.1"
NAMESPACE = "default"
TASK_QUEUE = "chaos"
INSTANCES = 4
FAULTPROXY = Path(__file__).resolve().with_name("faultproxy.py")
SCENARIOS = ("worker-kill", "temporal-kill", "substrate-kill", "fault-proxy", "lease-expiry", "holder-chaos")
# What the substrate's tasks table calls a task that still runs.
ACTIVE_TASK_STATES = ("submitted", "working", "input-required", "auth-required")
RUNNING = WorkflowExecutionStatus.RUNNING
QUERY_ATTEMPT = timedelta(seconds=3)
# `conductor` as installed beside this interpreter (the console script), else the same entry point.
_SCRIPT = Path(sys.executable).with_name("conductor")
CONDUCTOR = [str(_SCRIPT)] if _SCRIPT.is_file() else [sys.executable, "-c", "from worker.cli import main; main()"]


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


# --- processes ------------------------------------------------------------------------------------


class Managed:
    """One process the suite runs, leading a session of its own so its group can be killed at once."""

    registry: list["Managed"] = []

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path, ready_text: str) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log_path = log_path
        self.ready_text = ready_text
        self.process: subprocess.Popen[bytes] | None = None
        self.expected_down = True  # False while it should be running: an exit then is unexpected
        self.starts = 0
        self._offset = 0
        Managed.registry.append(self)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        if self.alive():
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            out.write(f"\n--- {time.strftime('%H:%M:%S')} start {self.name}\n".encode())
            out.flush()
            self._offset = out.tell()
            self.process = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                cwd=REPO, start_new_session=True,
            )
        self.starts += 1
        self.expected_down = False

    async def ready(self, timeout: float) -> str:
        """The line announcing readiness (after the latest start)."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.new_output()
            for line in text.splitlines():
                if self.ready_text in line:
                    return line
            if not self.alive():
                raise RuntimeError(f"{self.name} exited with {self.returncode()} while starting; see {self.log_path}\n{text[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} was not ready within {timeout:.0f} s; see {self.log_path}\n{text[-2000:]}")
            await asyncio.sleep(0.1)

    def new_output(self) -> str:
        try:
            with open(self.log_path, "rb") as handle:
                handle.seek(self._offset)
                return handle.read().decode(errors="replace")
        except OSError:
            return ""

    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def kill(self) -> None:
        """SIGKILL the whole group, as a crash (or the OOM killer) would."""
        self.expected_down = True
        if self.process is None:
            return
        _killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def terminate(self, timeout: float = 15.0) -> None:
        """SIGTERM (a clean stop), SIGKILL the group if it hangs."""
        self.expected_down = True
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        _killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    @classmethod
    def kill_all(cls) -> None:
        for managed in cls.registry:
            if managed.process is not None:
                _killpg(managed.process.pid, signal.SIGKILL)
                try:
                    managed.process.wait(5)
                except subprocess.TimeoutExpired:
                    pass


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def workload_processes(marker: str | None, groups: Iterable[int] = ()) -> dict[int, str]:
    """Live processes that are workloads of ours: the command line names `marker` (each child's
    command writes into the scenario's runs directory), or the process group is one the substrate
    recorded for a task (a command's `sleep` has neither the marker nor its shell once orphaned)."""
    groups = set(groups)
    found = {}
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        fields = stat_fields(pid)
        if fields is None or fields[0] == "Z":
            continue
        line = cmdline(pid)
        if (marker is not None and marker in line) or int(fields[2]) in groups:
            found[pid] = line
    return found


# --- the stack ------------------------------------------------------------------------------------


class Stack:
    """Temporal dev server, substrate and two workers for one scenario, under `root`."""

    def __init__(self, root: Path, policy: AdmissionPolicy, *, workers: int = 2, durable: bool = True) -> None:
        self.root = root
        self.runs = root / "runs"
        self.logs = root / "logs"
        for folder in (self.runs, self.logs, root / "secrets", root / "worker-data", root / "substrate", root / "temporal"):
            folder.mkdir(parents=True, exist_ok=True)
        os.chmod(root / "secrets", 0o700)
        self.fleet_token_file = root / "secrets" / "fleet.token"
        self.executor_token_file = root / "secrets" / "executor.token"
        for path in (self.fleet_token_file, self.executor_token_file):
            path.write_text(secrets.token_urlsafe(24))
            os.chmod(path, 0o600)
        self.policy_file = root / "policy.json"
        self.policy_file.write_text(policy.model_dump_json(indent=2))
        self.substrate_db = root / "substrate" / "substrate.sqlite3"
        self.temporal_port = free_port(HOST)
        self.substrate_port = free_port(HOST)
        self.temporal_address = f"{HOST}:{self.temporal_port}"
        self.substrate_url = f"http://{HOST}:{self.substrate_port}"
        base = {key: value for key, value in os.environ.items()
                if not key.startswith(("CONDUCTOR_", "TEMPORAL_"))}
        base["PYTHONUNBUFFERED"] = "1"
        # The code beside this file, also for the `conductor` script (an editable install may point elsewhere).
        base["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
        command = dev_server_command(
            root / "temporal" / "temporal.sqlite" if durable else None, host=HOST, port=self.temporal_port, ui_port=free_port(HOST),
            namespace=NAMESPACE, search_attributes=SEARCH_ATTRIBUTES,
        ) + ["--headless"]
        self.temporal = Managed("temporal", command, base, self.logs / "temporal.log", "")
        self.substrate = Managed(
            "substrate",
            [sys.executable, "-m", "substrate", "serve", "--host", HOST, "--port", str(self.substrate_port),
             "--data-dir", str(root / "substrate"), "--instances", str(INSTANCES),
             "--fleet-token-file", str(self.fleet_token_file), "--executor-token-file", str(self.executor_token_file),
             "--stop-workloads-on-exit"],
            base, self.logs / "substrate.log", "substrate listening on ",
        )
        self.base_env = base
        self.workers = [self._worker(f"worker-{n}") for n in range(1, workers + 1)]
        self.proxies: list[Managed] = []
        self.client: Client | None = None
        self.unexpected_exits: list[str] = []
        self.refused_starts: list[str] = []  # workers that exited at start-up: Temporal unreachable
        self._watchdog: asyncio.Task[None] | None = None

    def _worker(self, name: str) -> Managed:
        return Managed(name, [*CONDUCTOR, "worker"], {}, self.logs / f"{name}.log", "conductor worker: polling task queue")

    def worker_env(self, temporal_address: str | None = None, substrate_url: str | None = None) -> dict[str, str]:
        return {
            **self.base_env,
            "TEMPORAL_ADDRESS": temporal_address or self.temporal_address,
            "TEMPORAL_NAMESPACE": NAMESPACE,
            # No profile file of the person running this may redirect the workers.
            "TEMPORAL_CONFIG_FILE": str(self.root / "no-temporal-profile.toml"),
            "CONDUCTOR_SUBSTRATE_URL": substrate_url or self.substrate_url,
            "CONDUCTOR_FLEET_TOKEN_FILE": str(self.fleet_token_file),
            "CONDUCTOR_EXECUTOR_TOKEN_FILE": str(self.executor_token_file),
            "CONDUCTOR_TASK_QUEUE": TASK_QUEUE,
            "CONDUCTOR_DATA_DIR": str(self.root / "worker-data"),
            "CONDUCTOR_ADMISSION_POLICY": str(self.policy_file),
        }

    async def start(self, *, workers: bool = True) -> None:
        await self.start_temporal()
        self.client = await Client.connect(self.temporal_address, namespace=NAMESPACE, data_converter=DATA_CONVERTER)
        if workers:  # a worker needs no substrate to start: the first one starts beside it
            await asyncio.gather(self.start_substrate(), self.start_worker(self.workers[0]))
            for worker in self.workers[1:]:  # one after the other: see start_workers
                await self.start_worker(worker)
        else:
            await self.start_substrate()
        self._watchdog = asyncio.ensure_future(self._watch())

    async def start_temporal(self) -> None:
        self.temporal.start()
        deadline = time.monotonic() + 60
        wanted = {key.name for key in SEARCH_ATTRIBUTES}
        while True:
            if not self.temporal.alive():
                raise RuntimeError(f"the Temporal server exited with {self.temporal.returncode()}; see {self.temporal.log_path}")
            try:
                client = await asyncio.wait_for(Client.connect(self.temporal_address, namespace=NAMESPACE), 5)
                if wanted <= set(await registered_search_attributes(client, NAMESPACE)):
                    return
            except (RuntimeError, RPCError, TimeoutError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Temporal server was not ready within 60 s; see {self.temporal.log_path}")
            await asyncio.sleep(0.2)

    async def start_substrate(self) -> None:
        self.substrate.start()
        await self.substrate.ready(30)

    async def start_worker(self, worker: Managed, env: dict[str, str] | None = None) -> None:
        if env is not None or not worker.env:
            worker.env = env or self.worker_env()
        for attempt in range(1, 6):
            worker.start()
            try:
                await worker.ready(60)
                return
            except RuntimeError as error:
                # `conductor worker` exits 1 when its first connection to Temporal fails; through the
                # fault proxy that happens by design. Start it again, as a process supervisor would.
                if "cannot reach Temporal" not in str(error) or attempt == 5:
                    raise
                worker.expected_down = True
                self.refused_starts.append(f"{worker.name}: {str(error).splitlines()[-1][:200]}")
                log(f"{worker.name} gave up on its first connection to Temporal; starting it again")

    async def start_workers(self, env: dict[str, str] | None = None) -> None:
        # One after the other: two workers opening a new audit store at the same moment race on
        # `PRAGMA journal_mode=WAL`, and one exits with "database is locked" (activities/audit_store.py).
        for worker in self.workers:
            await self.start_worker(worker, env)

    async def start_proxy(self, name: str, target: str, *args: str, max_seconds: float) -> str:
        proxy = Managed(
            name, [sys.executable, str(FAULTPROXY), "--target", target, "--max-seconds", str(int(max_seconds)), *args],
            self.base_env, self.logs / f"{name}.log", "faultproxy listening on ",
        )
        self.proxies.append(proxy)
        proxy.start()
        line = await proxy.ready(15)
        return line.split("faultproxy listening on ", 1)[1].split()[0]

    def proxy_stats(self, proxy: Managed) -> dict[str, int]:
        for line in reversed(proxy.log_path.read_text(errors="replace").splitlines()):
            if line.startswith("faultproxy stats "):
                return json.loads(line[len("faultproxy stats "):])
        return {}

    async def _watch(self) -> None:
        """Record (and undo, for workers) any process that ends while it should be running."""
        while True:
            await asyncio.sleep(0.5)
            for managed in [self.temporal, self.substrate, *self.workers, *self.proxies]:
                if not managed.expected_down and not managed.alive():
                    code = managed.returncode()
                    tail = managed.new_output()[-600:].strip().replace("\n", " | ")
                    self.unexpected_exits.append(f"{managed.name} exited on its own with status {code} (log {managed.log_path}): {tail}")
                    log(f"!! {managed.name} exited on its own with status {code}; see {managed.log_path}")
                    managed.expected_down = True
                    if managed in self.workers:
                        try:
                            await self.start_worker(managed)
                        except RuntimeError as error:
                            self.unexpected_exits.append(f"{managed.name} could not be restarted: {error}")

    async def stop(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            await asyncio.gather(self._watchdog, return_exceptions=True)
        await asyncio.gather(*(asyncio.to_thread(managed.terminate, 15) for managed in [*self.workers, *self.proxies]))
        await asyncio.to_thread(self.substrate.terminate, 20)
        # The server drains for about six seconds after SIGTERM; its state is thrown away anyway.
        await asyncio.to_thread(self.temporal.terminate, 2)

    # --- what the substrate recorded ------------------------------------------------------------

    def substrate_tasks(self) -> list[dict[str, object]]:
        if not self.substrate_db.exists():
            return []
        db = sqlite3.connect(f"file:{self.substrate_db}?mode=ro", uri=True, timeout=10)
        try:
            db.row_factory = sqlite3.Row
            return [dict(row) for row in db.execute("SELECT task_id, child_id, state, pid, pid_start_ticks FROM tasks ORDER BY rowid")]
        finally:
            db.close()


# --- missions -------------------------------------------------------------------------------------


@dataclass
class Mission:
    mission_id: str
    host_group: str
    children: list[str]
    seconds: float
    started: bool = False
    start_error: str | None = None
    status: str | None = None  # the workflow's status once closed; None while running (a hang)
    ledger: MissionLedger | None = None
    ledger_error: str | None = None
    expect: Expectation | None = None  # this mission's own, instead of its scenario's

    @property
    def workflow_id(self) -> str:
        return mission_workflow_id(self.mission_id)

    def runs_file(self, runs: Path, child_id: str) -> Path:
        return runs / f"{self.mission_id}.{child_id}"

    def spec(self, runs: Path) -> dict:
        return {
            "mission_id": self.mission_id,
            "orchestrator_id": "chaos",
            "goal": f"chaos {self.host_group}",
            "host_group": self.host_group,
            "require_distinct_targets": False,
            "children": [
                {
                    "child_id": child_id,
                    "kind": "one-shot-command",
                    "prompt": f"echo $$ >> {shlex.quote(str(self.runs_file(runs, child_id)))}; sleep {self.seconds:g}; echo ok",
                }
                for child_id in self.children
            ],
        }


async def retrying(call: Callable[[], Awaitable[object]], within: float, what: str) -> object:
    """`call()` until it answers: the server may be restarting, or a proxy cutting connections."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await call()
        except (RPCError, RuntimeError, TimeoutError) as error:
            if isinstance(error, RPCError) and error.status == RPCStatusCode.NOT_FOUND:
                raise
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: no answer within {within:.0f} s ({error})") from None
            await asyncio.sleep(0.5)


async def start_mission(control: MissionControl, stack: Stack, mission: Mission, within: float = 60) -> None:
    spec = parse_spec(mission.spec(stack.runs))
    deadline = time.monotonic() + within
    while True:
        try:
            await control.start(spec)
            break
        except MissionIdUsed:
            break  # an earlier attempt started it; only its answer was lost
        except (RPCError, RuntimeError) as error:
            if time.monotonic() > deadline:
                mission.start_error = str(error)
                log(f"!! mission {mission.mission_id} could not be started: {error}")
                return
            await asyncio.sleep(0.5)
    mission.started = True
    log(f"started mission {mission.mission_id} ({len(mission.children)} children, sleep {mission.seconds:g})")


async def start_spread(control: MissionControl, stack: Stack, missions: list[Mission], over: float) -> None:
    """Start the missions one after another, spread over `over` seconds."""
    gap = over / max(1, len(missions))
    for index, mission in enumerate(missions):
        if index:
            await asyncio.sleep(gap)
        await start_mission(control, stack, mission)


async def wait_closed(client: Client, missions: list[Mission], within: float) -> None:
    """Poll until every started mission's workflow has closed, or `within` seconds have passed."""
    deadline = time.monotonic() + within
    open_ = [m for m in missions if m.started]
    while open_ and time.monotonic() < deadline:
        for mission in list(open_):
            try:
                description = await client.get_workflow_handle(mission.workflow_id).describe(rpc_timeout=timedelta(seconds=5))
            except RPCError:
                continue
            if description.status != RUNNING:
                mission.status = description.status.name if description.status else "UNKNOWN"
                open_.remove(mission)
        if open_:
            await asyncio.sleep(1)
    for mission in missions:
        if not mission.started:
            continue
        try:
            if mission.status == "COMPLETED":
                mission.ledger = await retrying(
                    lambda: client.get_workflow_handle(mission.workflow_id, result_type=MissionLedger).result(rpc_timeout=timedelta(seconds=10)),
                    30, f"result of {mission.workflow_id}",
                )  # type: ignore[assignment]
            else:  # still running, or closed some other way: its last ledger says where it stands
                mission.ledger = await retrying(
                    lambda: client.get_workflow_handle(mission.workflow_id).query(
                        "ledger", result_type=MissionLedger, rpc_timeout=QUERY_ATTEMPT),
                    30, f"ledger of {mission.workflow_id}",
                )  # type: ignore[assignment]
        except Exception as error:  # noqa: BLE001  (reported as a figure)
            mission.ledger_error = f"{type(error).__name__}: {error}"


# --- checks ---------------------------------------------------------------------------------------


@dataclass
class Report:
    scenario: str
    title: str
    missions: list[Mission] = field(default_factory=list)
    chaos: list[str] = field(default_factory=list)  # what was done to the stack
    figures: dict[str, object] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0
    after_check: Callable[[], None] | None = None

    def violate(self, text: str) -> None:
        self.violations.append(text)
        log(f"!! {self.scenario}: {text}")


@dataclass(frozen=True)
class Expectation:
    """The verdict a mission must reach, and the fail-closed verdicts a scenario tolerates."""

    verdicts: frozenset[str]
    fail_closed: frozenset[str] = frozenset()
    # Child states a fail-closed mission may show for its unsatisfied children.
    fail_closed_child_states: frozenset[str] = frozenset({"unknown"})


async def check(report: Report, stack: Stack, expectation: Expectation, *, settle: float) -> None:
    """Wait (bounded) for every mission to close, then check every invariant; figures into `report`."""
    assert stack.client is not None
    client = stack.client
    missions = report.missions
    started = [m for m in missions if m.started]
    for mission in missions:
        if not mission.started:
            report.violate(f"mission {mission.mission_id} could not be started: {mission.start_error}")
    began = time.monotonic()
    await wait_closed(client, missions, settle)
    log(f"{report.scenario}: missions closed (or the wait ended) after {time.monotonic() - began:.1f} s")

    # Verdicts.
    verdicts: Counter[str] = Counter()
    right = fail_closed = 0
    child_states: Counter[str] = Counter()
    for mission in started:
        ledger = mission.ledger
        verdict = ledger.parent_state if ledger is not None else f"no ledger ({mission.ledger_error})"
        verdicts[verdict] += 1
        if ledger is not None:
            for child in ledger.children:
                child_states[child.observed_state] += 1
        if mission.status is None:
            report.violate(f"hang: mission {mission.workflow_id} still running {settle:.0f} s after the chaos ended ({verdict})")
            continue
        if mission.status != "COMPLETED":
            report.violate(f"mission {mission.workflow_id} closed {mission.status}, not COMPLETED ({verdict})")
            continue
        if ledger is None:
            report.violate(f"mission {mission.workflow_id}: no final ledger ({mission.ledger_error})")
            continue
        unsatisfied = {c.child_id: c.observed_state for c in ledger.children if c.outcome != "satisfied"}
        want = mission.expect or expectation
        if verdict in want.verdicts:
            right += 1
        elif verdict in want.fail_closed and set(unsatisfied.values()) <= want.fail_closed_child_states:
            fail_closed += 1
        else:
            report.violate(
                f"mission {mission.workflow_id} settled {verdict} (expected {'/'.join(sorted(want.verdicts))}"
                f"{' or fail closed ' + '/'.join(sorted(want.fail_closed)) if want.fail_closed else ''}): "
                f"{ledger.verdict_reason or ledger.aggregation.reason}; unsatisfied children {unsatisfied}"
            )
        for child in ledger.children:  # a child counted satisfied must really have run its command
            if child.outcome == "satisfied" and not mission.runs_file(stack.runs, child.child_id).exists():
                report.violate(f"{mission.mission_id}/{child.child_id} is satisfied but its command never ran")

    # Workload workflows still running after their mission closed (or while it hangs).
    running_children = []
    for mission in started:
        for child_id in mission.children:
            workflow_id = workload_workflow_id(mission.mission_id, child_id)
            try:
                description = await retrying(
                    lambda: client.get_workflow_handle(workflow_id).describe(rpc_timeout=timedelta(seconds=5)), 20, workflow_id)
            except RPCError:
                continue  # never started (cancelled while queued)
            if description.status == RUNNING:  # type: ignore[union-attr]
                running_children.append(workflow_id)
    for workflow_id in running_children:
        report.violate(f"hang: workload {workflow_id} still running after the mission settled")

    # Double dispatches: command runs (the runs file) and substrate task rows, per child.
    tasks = stack.substrate_tasks()
    rows_by_child = Counter(str(row["child_id"]) for row in tasks)
    runs_twice = rows_twice = 0
    for mission in started:
        for child_id in mission.children:
            path = mission.runs_file(stack.runs, child_id)
            runs = path.read_text().split() if path.exists() else []
            rows = rows_by_child[fleet_child_id(mission.mission_id, child_id)]
            if len(runs) > 1:
                runs_twice += 1
                report.violate(f"double dispatch: {mission.mission_id}/{child_id} ran its command {len(runs)} times (shell pids {runs})")
            if rows > 1:
                rows_twice += 1
                report.violate(f"double dispatch: {mission.mission_id}/{child_id} has {rows} substrate tasks")

    # Leases still held for these missions once they closed (the release may still be on its way).
    leases = await held_leases(client, started, within=15)
    for row in leases:
        report.violate(f"lease left held: {row.request_id} (holder {row.holder}, expires {row.lease_expires_at:%H:%M:%S})")

    # Child processes still alive after everything settled (a cancel may still be on its way).
    mine = {fleet_child_id(m.mission_id, c) for m in started for c in m.children}
    groups = [int(row["pid"]) for row in tasks if row["pid"] is not None and row["child_id"] in mine]
    left = await leftover_processes(stack, groups, within=10)
    for pid, line in left.items():
        report.violate(f"process left behind: pid {pid}: {line[:160]}")

    active = [row for row in tasks if row["child_id"] in mine and row["state"] in ACTIVE_TASK_STATES]
    for row in active:
        report.violate(f"substrate task {row['task_id']} of {row['child_id']} still {row['state']} after its mission closed")
    for text in stack.unexpected_exits:
        report.violate(f"unexpected exit: {text}")

    report.figures.update({
        "missions started": f"{len(started)} of {len(missions)}",
        "settled with the right verdict": (
            f"{right + fail_closed} of {len(started)} (expected {'/'.join(sorted(expectation.verdicts))}"
            + (f", fail closed allowed: {'/'.join(sorted(expectation.fail_closed))}" if expectation.fail_closed else "")
            + f"; got {', '.join(f'{v} {n}' for v, n in sorted(verdicts.items()))})"
        ),
        "of them failed closed": fail_closed,
        "child end states": ", ".join(f"{state} {n}" for state, n in sorted(child_states.items())) or "-",
        "double dispatches": f"{runs_twice + rows_twice} (commands run twice {runs_twice}, children with >1 substrate task {rows_twice})",
        "leases left held": len(leases),
        "processes left behind": len(left),
        "hangs (still running)": sum(1 for m in started if m.status is None) + len(running_children),
        "substrate tasks recorded unknown": sum(1 for row in tasks if row["child_id"] in mine and row["state"] == "unknown"),
        "unexpected process exits": len(stack.unexpected_exits),
    })
    if stack.refused_starts:
        report.figures["worker start-ups that exited: Temporal unreachable"] = (
            f"{len(stack.refused_starts)} (started again; `conductor worker` does not retry its first connect)")


async def held_leases(client: Client, missions: list[Mission], within: float) -> list[LeaseRow]:
    prefixes = tuple(admission_request_id(m.mission_id, "") for m in missions)
    groups = sorted({m.host_group for m in missions})
    deadline = time.monotonic() + within
    while True:
        held: list[LeaseRow] = []
        for group in groups:
            handle = client.get_workflow_handle(admission_workflow_id(group))
            try:
                # Short attempts: for about 10 s after a worker died the server still routes a query to
                # the dead worker's sticky queue, and the attempt waits out its whole timeout.
                rows = await retrying(lambda: handle.query("leases", result_type=list[LeaseRow], rpc_timeout=QUERY_ATTEMPT),
                                      30, f"leases of {group}")
            except RPCError:
                continue  # nothing ever asked for admission there
            held += [row for row in rows if row.request_id.startswith(prefixes)]  # type: ignore[union-attr]
        if not held or time.monotonic() > deadline:
            return held
        await asyncio.sleep(1)


async def leftover_processes(stack: Stack, groups: list[int], within: float, *, by_marker: bool = True) -> dict[int, str]:
    """Workload processes still alive after up to `within` seconds: of `groups`, and (`by_marker`)
    any command of this scenario."""
    deadline = time.monotonic() + within
    while True:
        left = workload_processes(str(stack.runs) + os.sep if by_marker else None, groups)
        if not left or time.monotonic() > deadline:
            return left
        await asyncio.sleep(0.5)


# --- scenarios ------------------------------------------------------------------------------------


@dataclass
class Settings:
    quick: bool
    missions: int | None
    children: int | None
    rng: random.Random
    scratch: Path

    def count(self, full: int, quick: int) -> int:
        return self.missions if self.missions is not None else (quick if self.quick else full)

    def width(self, full: int, quick: int) -> int:
        return self.children if self.children is not None else (quick if self.quick else full)

    def pick(self, full: float, quick: float) -> float:
        return quick if self.quick else full


def plan(name: str, count: int, children: int, seconds: float) -> list[Mission]:
    tag = secrets.token_hex(3)
    group = f"chaos-{name}-{tag}"
    return [Mission(f"{name}-{tag}-m{i}", group, [f"c{j}" for j in range(children)], seconds) for i in range(count)]


DEFAULT_POLICY = AdmissionPolicy(max_concurrent=16, runtime_quotas={"host": 16}, lease_ttl_seconds=60)
COMPLETE = Expectation(frozenset({"completed"}))


async def worker_kill(stack: Stack, control: MissionControl, s: Settings, report: Report) -> Expectation:
    report.missions = plan("worker-kill", s.count(10, 2), s.width(4, 2), 1)
    window = s.pick(60, 6)
    starts = asyncio.ensure_future(start_spread(control, stack, report.missions, window * 0.6))
    kills = both = 0
    deadline = time.monotonic() + window
    while time.monotonic() < deadline and kills < 30:
        await asyncio.sleep(s.rng.uniform(2, 5) if not s.quick else s.rng.uniform(1.5, 3))
        victims = list(stack.workers) if s.rng.random() < 0.25 else [s.rng.choice(stack.workers)]
        for victim in victims:
            victim.kill()
        kills += len(victims)
        both += len(victims) == 2
        log(f"SIGKILLed {', '.join(v.name for v in victims)}")
        await asyncio.sleep(s.rng.uniform(0.5, 3))
        for victim in victims:
            await stack.start_worker(victim)
    await starts
    report.chaos.append(f"{kills} worker SIGKILLs ({both} times both at once), each restarted after 0.5-3 s, over {window:.0f} s")
    return COMPLETE


async def temporal_kill(stack: Stack, control: MissionControl, s: Settings, report: Report) -> Expectation:
    report.missions = plan("temporal-kill", s.count(8, 2), s.width(4, 2), 2)
    restarts = int(s.pick(4, 1))
    half = len(report.missions) // 2 or 1
    first, rest = report.missions[:half], report.missions[half:]
    await start_spread(control, stack, first, s.pick(4, 1))
    for n in range(restarts):
        await asyncio.sleep(s.rng.uniform(1, 3))
        stack.temporal.kill()
        down = s.rng.uniform(1, 4)
        log(f"SIGKILLed the Temporal server; down for {down:.1f} s")
        await asyncio.sleep(down)
        began = time.monotonic()
        await stack.start_temporal()
        report.chaos.append(f"Temporal SIGKILL {n + 1}: down {down:.1f} s, ready again {time.monotonic() - began:.1f} s after restart")
        if n == 0 and rest:
            await start_spread(control, stack, rest, s.pick(4, 1))
    return COMPLETE


async def substrate_kill(stack: Stack, control: MissionControl, s: Settings, report: Report) -> Expectation:
    # Commands long enough to outlive the substrate's absence: what the crash leaves is still there
    # when it comes back, and its recovery must either take it over (re-adopt a task whose process
    # still runs, and follow it to its end: substrate/adoption.py) or stop it. Anything else left
    # running is an orphan.
    report.missions = plan("substrate-kill", s.count(8, 2), s.width(4, 2), 8)
    restarts = int(s.pick(3, 1))
    starts = asyncio.ensure_future(start_spread(control, stack, report.missions, s.pick(20, 2)))
    orphaned = readopted_total = 0
    for n in range(restarts):
        await asyncio.sleep(s.rng.uniform(3, 7) if not s.quick else 3)
        active = [row for row in stack.substrate_tasks() if row["state"] in ACTIVE_TASK_STATES]
        groups = [int(row["pid"]) for row in active if row["pid"] is not None]
        stack.substrate.kill()
        down = s.rng.uniform(1, 3)
        log(f"SIGKILLed the substrate ({len(active)} tasks running); down for {down:.1f} s")
        await asyncio.sleep(down)
        orphans = workload_processes(None, groups)  # the commands' children, reparented by the crash
        orphaned += len(orphans)
        await stack.start_substrate()  # ready only after its recovery ran
        readopted = {int(row["pid"]) for row in stack.substrate_tasks()
                     if row["state"] in ACTIVE_TASK_STATES and row["pid"] is not None}
        readopted_total += len(readopted & set(groups))
        survivors = await leftover_processes(stack, [group for group in groups if group not in readopted],
                                             within=2, by_marker=False)
        for pid, line in survivors.items():
            report.violate(f"orphan still running after the substrate's restart {n + 1}: pid {pid}: {line[:120]}")
        report.chaos.append(f"substrate SIGKILL {n + 1} with {len(active)} tasks running, down {down:.1f} s; "
                            f"{len(orphans)} orphaned processes meanwhile, {len(readopted & set(groups))} tasks "
                            f"re-adopted, {len(survivors)} other processes left after the restart")
    await starts
    # Missions that start once the substrate is back must complete: nothing of theirs ran across a crash.
    after = plan("substrate-kill-after", int(s.pick(2, 1)), s.width(4, 2), 1)
    for mission in after:
        mission.expect = COMPLETE
        await start_mission(control, stack, mission)
    report.missions += after
    report.chaos.append(f"{len(after)} more missions started after the last restart: they must complete")
    report.figures["crash orphans left after a substrate restart"] = f"0 of {orphaned}" if not any(
        "orphan still running" in v for v in report.violations) else "see violations"
    report.figures["tasks re-adopted across a restart"] = str(readopted_total)
    # A task that ran across the restart is re-adopted and ends as it would have; one whose process
    # was gone comes back `unknown`, and its mission fails closed.
    return Expectation(frozenset({"completed"}), fail_closed=frozenset({"operator-review-required"}))


async def fault_proxy(stack: Stack, control: MissionControl, s: Settings, report: Report) -> Expectation:
    report.missions = plan("fault-proxy", s.count(10, 2), s.width(4, 2), 1)
    budget = s.pick(300, 120)
    http = ["--mode", "http", "--http-503", "0.1", "--drop", "0.05", "--seed", str(s.rng.randrange(1 << 30))]
    # A connection reset while a worker completes a workflow task costs that task its 10 s timeout:
    # the quick form keeps to resets at accept, so that it stays short.
    reset = s.pick(0.7, 0.0)
    tcp = ["--mode", "tcp", "--drop", "0.1", "--reset", str(reset), "--reset-after", "5", "--latency-ms", "0:15",
           "--seed", str(s.rng.randrange(1 << 30))]
    substrate_proxy = await stack.start_proxy("substrate-proxy", f"{HOST}:{stack.substrate_port}", *http, max_seconds=budget)
    temporal_proxy = await stack.start_proxy("temporal-proxy", stack.temporal_address, *tcp, max_seconds=budget)
    env = stack.worker_env(temporal_address=temporal_proxy, substrate_url=f"http://{substrate_proxy}")
    await stack.start_workers(env)
    report.chaos.append(
        "workers -> substrate through an HTTP proxy (10% of requests 503, 5% cut: half before, half after forwarding); "
        f"-> Temporal through a TCP proxy (10% of connections reset at accept, {reset:.0%} reset after 1-5 s, 0-15 ms per chunk)"
    )
    await start_spread(control, stack, report.missions, s.pick(30, 2))
    return COMPLETE


async def lease_expiry(stack: Stack, control: MissionControl, s: Settings, report: Report) -> Expectation:
    ttl = stack_ttl(s)
    report.missions = plan("lease-expiry", s.count(3, 1), s.width(3, 2), 90)
    await start_spread(control, stack, report.missions, 1)
    # Every child's command running (its shell pid in its runs file), bounded.
    pids = await wait_until_running(stack, report.missions, within=60)
    if pids is None:
        report.violate("the children did not all start within 60 s; cannot take the workers away while they run")
        return Expectation(frozenset({"failed"}), fail_closed=frozenset({"operator-review-required"}))
    for worker in stack.workers:
        worker.kill()
    down = ttl + 3  # the last grant or renewal was before the kill: every lease is past its expiry by then
    log(f"SIGKILLed both workers with {len(pids)} children running; down for {down:.0f} s (lease TTL {ttl:g} s)")
    await asyncio.sleep(down)
    back, back_wall = time.monotonic(), time.time()
    await stack.start_workers()
    ready = time.monotonic() - back
    # How long each child's process runs on once the workers are back.
    stopped_at: dict[str, float] = {}  # wall clock
    bound = s.pick(45, 30)
    while len(stopped_at) < len(pids) and time.monotonic() - back < bound:
        for name, pid in pids.items():
            if name not in stopped_at and not alive(pid):
                stopped_at[name] = time.time()
        await asyncio.sleep(0.1)
    still = sorted(set(pids) - set(stopped_at))
    report.chaos.append(f"both workers SIGKILLed with {len(pids)} children running, down {down:.0f} s (> lease TTL {ttl:g} s); "
                        f"restarted, ready after {ready:.1f} s")
    if stopped_at:
        report.figures["runtime tasks stopped once the workers were back"] = (
            f"{len(stopped_at)} of {len(pids)}, the last {max(stopped_at.values()) - back_wall:.1f} s after their restart began")
    for name in still:
        report.violate(f"{name} still runs its command {bound:.0f} s after the workers came back, its lease expired")
    # The expired leases must have been noticed by the admission workflow.
    assert stack.client is not None
    events = await retrying(
        lambda: stack.client.get_workflow_handle(admission_workflow_id(report.missions[0].host_group)).query(  # type: ignore[union-attr]
            "audit", 1000, result_type=list[AuditEvent], rpc_timeout=QUERY_ATTEMPT),
        30, "admission audit",
    )
    # An expired lease is requeued while the policy's max_requeue_attempts allows (ADR-004), else timed out.
    expired = {e.request_id for e in events if e.type in ("timed-out", "requeued")}  # type: ignore[union-attr]
    wanted = {admission_request_id(m.mission_id, c) for m in report.missions for c in m.children}
    report.figures["leases found expired (audit: requeued or timed-out)"] = f"{len(wanted & expired)} of {len(wanted)}"
    for request_id in sorted(wanted - expired):
        report.violate(f"lease {request_id} outlived the workers' absence: no requeued or timed-out event in the admission audit")
    # When each lease really expired: its last grant or renewal plus the TTL.
    granted: dict[str, float] = {}
    for event in events:  # type: ignore[union-attr]
        if event.request_id in wanted and event.type in ("admitted", "renewed"):
            granted[event.request_id] = max(granted.get(event.request_id, 0.0), event.at.timestamp())
    overrun = [
        stopped_at[f"{m.mission_id}/{c}"] - (granted[admission_request_id(m.mission_id, c)] + ttl)
        for m in report.missions for c in m.children
        if f"{m.mission_id}/{c}" in stopped_at and admission_request_id(m.mission_id, c) in granted
    ]
    if overrun:
        report.figures["commands ran on past their lease's expiry"] = (
            f"up to {max(overrun):.1f} s (the workers were down {down:.0f} s: nothing could stop them meanwhile)")
    report.after_check = lambda: _lease_expiry_states(report)
    return Expectation(frozenset({"failed"}), fail_closed=frozenset({"operator-review-required"}),
                       fail_closed_child_states=frozenset({"unknown", "cancelled", "timed-out"}))


HOLDER_SLOTS = 4
HOLDER_POLICY = AdmissionPolicy(max_concurrent=HOLDER_SLOTS, runtime_quotas={"host": HOLDER_SLOTS}, lease_ttl_seconds=30)


async def holder_chaos(stack: Stack, control: MissionControl, s: Settings, report: Report) -> Expectation:
    from bench.admission_storm import Storm, audited_quota  # the holders' storm and its checks

    report.missions = plan("holder-chaos", s.count(2, 1), s.width(2, 2), 1)
    host_group = report.missions[0].host_group
    window = s.pick(90, 16)
    assert stack.client is not None
    await retrying(lambda: set_policy(stack.client, host_group), 30, "the host group's policy")  # type: ignore[arg-type]
    tcp = ["--mode", "tcp", "--drop", "0.05", "--reset", str(s.pick(0.3, 0.1)), "--reset-after", "5", "--latency-ms", "0:10",
           "--seed", str(s.rng.randrange(1 << 30))]
    proxy = await stack.start_proxy("holder-proxy", stack.temporal_address, *tcp, max_seconds=window + 120)
    holders = await retrying(lambda: Client.connect(proxy, namespace=NAMESPACE, data_converter=DATA_CONVERTER), 30, "the proxy")
    storm = Storm(holders, host_group, holders=int(s.pick(40, 10)), slots=HOLDER_SLOTS, hold=(0.05, 0.4), seconds=window,  # type: ignore[arg-type]
                  rng=random.Random(s.rng.randrange(1 << 30)), tag="hc")
    storming = asyncio.ensure_future(storm.run())
    await start_spread(control, stack, report.missions, window * 0.3)
    kills = 0
    restarted = False
    deadline = time.monotonic() + window
    while time.monotonic() < deadline - s.pick(15, 4):
        await asyncio.sleep(s.pick(15, 4))
        if not restarted and time.monotonic() > deadline - window / 2:
            stack.temporal.kill()
            down = s.rng.uniform(1, 3)
            log(f"SIGKILLed the Temporal server under the holders; down for {down:.1f} s")
            await asyncio.sleep(down)
            await stack.start_temporal()
            report.chaos.append(f"the Temporal server SIGKILLed once mid-storm, down {down:.1f} s")
            restarted = True
            continue
        victim = stack.workers[kills % len(stack.workers)]
        victim.kill()
        kills += 1
        log(f"SIGKILLed {victim.name} under the holders")
        await stack.start_worker(victim)
    await storming
    report.chaos.append(f"{storm.holders} holders on {HOLDER_SLOTS} slots for {window:.0f} s through a TCP proxy "
                        f"(5% of connections reset at accept, some after 1-5 s, 0-10 ms latency); {kills} worker SIGKILLs")
    for violation in storm.violations():
        report.violate(violation)
    problems, kept = await storm.server_violations(within=s.pick(90, 30))
    for violation in problems + audited_quota(stack, host_group, HOLDER_SLOTS, kept):
        report.violate(violation)
    report.figures.update({key: value for key, value in storm.figures([]).items() if "outside restarts" not in key})
    report.figures.update(kept)
    return COMPLETE


async def set_policy(client: Client, host_group: str) -> None:
    from activities.admission import set_policy_with_start
    from workflows.admission.messages import PolicyChange

    await set_policy_with_start(client, TASK_QUEUE, host_group, PolicyChange(operator="chaos", policy=HOLDER_POLICY))


def stack_ttl(s: Settings) -> float:
    return 6.0


def _lease_expiry_states(report: Report) -> None:
    """What the children and their admissions ended as (the requirement says `timed-out`)."""
    ends: Counter[str] = Counter()
    admissions: Counter[str] = Counter()
    for mission in report.missions:
        for child in mission.ledger.children if mission.ledger is not None else ():
            ends[child.observed_state] += 1
            admissions[child.admission.state] += 1
    report.figures["children's admission in the ledger"] = ", ".join(f"{k} {v}" for k, v in sorted(admissions.items())) or "-"
    if set(ends) - {"timed-out"}:
        why = (" (their mission cancels a child whose lease is no longer current; the admission side says timed-out)"
               if "cancelled" in ends else "")
        report.notes.append(
            "the requirement says children whose lease expired end `timed-out`; they ended "
            + ", ".join(f"{k} {v}" for k, v in sorted(ends.items())) + why
        )


async def wait_until_running(stack: Stack, missions: list[Mission], within: float) -> dict[str, int] | None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        pids = {}
        for mission in missions:
            for child_id in mission.children:
                path = mission.runs_file(stack.runs, child_id)
                if path.exists() and path.read_text().split():
                    pids[f"{mission.mission_id}/{child_id}"] = int(path.read_text().split()[0])
        if len(pids) == sum(len(m.children) for m in missions):
            return pids
        await asyncio.sleep(0.2)
    return None


SCENARIO_FUNCS = {
    "worker-kill": (worker_kill, "workers SIGKILLed at random during missions, restarted"),
    "temporal-kill": (temporal_kill, "the Temporal server SIGKILLed mid-mission, restarted on its database"),
    "substrate-kill": (substrate_kill, "the substrate SIGKILLed mid-mission, restarted on its database"),
    "fault-proxy": (fault_proxy, "503s and cut connections to the substrate, resets and latency to Temporal"),
    "lease-expiry": (lease_expiry, "every worker down for longer than the lease TTL while children run"),
    "holder-chaos": (holder_chaos, "holders and a mission on 4 slots: workers and Temporal killed, a faulty proxy"),
}


async def run_scenario(name: str, s: Settings) -> Report:
    func, title = SCENARIO_FUNCS[name]
    report = Report(name, title)
    began = time.monotonic()
    policy = DEFAULT_POLICY
    if name == "lease-expiry":
        policy = AdmissionPolicy(max_concurrent=16, runtime_quotas={"host": 16}, lease_ttl_seconds=stack_ttl(s))
    stack = Stack(s.scratch / name, policy)
    log(f"== {name}: {title}")
    try:
        await stack.start(workers=name != "fault-proxy")
        assert stack.client is not None
        control = MissionControl(stack.client, TASK_QUEUE)
        expectation = await func(stack, control, s, report)
        for worker in stack.workers:  # whatever the chaos did, both workers run while missions settle
            if not worker.alive():
                await stack.start_worker(worker)
        log(f"{name}: chaos over; waiting for the missions to settle")
        await check(report, stack, expectation, settle=s.pick(120, 60))
        if report.after_check is not None:
            report.after_check()
        for proxy in stack.proxies:
            await asyncio.to_thread(proxy.terminate, 10)
            report.figures[f"{proxy.name} faults"] = ", ".join(
                f"{k} {v}" for k, v in stack.proxy_stats(proxy).items()
                if k not in ("bytes_up", "bytes_down", "seconds")) or "no stats"
    except Exception as error:  # noqa: BLE001  (a scenario that breaks is a violation, not a crash of the suite)
        report.violate(f"the scenario itself failed: {type(error).__name__}: {error}")
    finally:
        stopping = time.monotonic()
        await stack.stop()
        log(f"{name}: stack stopped in {time.monotonic() - stopping:.1f} s")
        # Whatever is left of the workloads once the substrate stopped cleanly.
        left = workload_processes(str(stack.runs) + os.sep)
        for pid in left:
            _killpg(pid, signal.SIGKILL)
            _killpg(int((stat_fields(pid) or ["", "", str(pid)])[2]), signal.SIGKILL)
        if left:
            report.notes.append(f"{len(left)} workload processes were still alive after the stack stopped; killed")
    report.seconds = time.monotonic() - began
    print_report(report)
    return report


def print_report(report: Report) -> None:
    print(f"\n== {report.scenario}: {report.title} ({report.seconds:.0f} s)", flush=True)
    for line in report.chaos:
        print(f"   chaos: {line}")
    for key, value in report.figures.items():
        print(f"   {key:<50}{value}")
    for note in report.notes:
        print(f"   note: {note}")
    for violation in report.violations:
        print(f"   VIOLATION: {violation}")
    status = "ok" if not report.violations else f"FAIL ({len(report.violations)} violations)"
    print(f"RESULT scenario={report.scenario} {status}\n", flush=True)


async def main(options: argparse.Namespace) -> int:
    names = [name.strip() for name in options.scenario.split(",")] if options.scenario else list(SCENARIOS)
    unknown = [name for name in names if name not in SCENARIOS]
    if unknown:
        print(f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    seed = options.seed if options.seed is not None else random.randrange(1 << 30)
    made_scratch = options.scratch is None
    scratch = Path(tempfile.mkdtemp(prefix="conductor-chaos-")) if made_scratch else Path(options.scratch).resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    settings = Settings(options.quick, options.missions, options.children, random.Random(seed), scratch)
    log(f"chaos: scenarios {', '.join(names)}; seed {seed}; scratch {scratch}")
    reports: list[Report] = []
    main_task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    if main_task is not None:
        loop.add_signal_handler(signal.SIGTERM, main_task.cancel)
    try:
        for name in names:
            reports.append(await run_scenario(name, settings))
    finally:
        Managed.kill_all()
    print("== summary")
    for report in reports:
        print(f"   {report.scenario:<16}{'ok' if not report.violations else 'FAIL'}  "
              f"right verdict {str(report.figures.get('settled with the right verdict', '-')).split(' (')[0]}; "
              f"{len(report.violations)} violations; "
              f"{report.seconds:.0f} s")
    failed = any(report.violations for report in reports)
    if failed or options.keep:
        print(f"logs and databases kept in {scratch}")
    elif made_scratch:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
    print(f"RESULT chaos {'FAIL' if failed else 'ok'} seed={seed}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", help=f"comma-separated, from {', '.join(SCENARIOS)} (default: all)")
    parser.add_argument("--missions", type=int, help="missions per scenario (default: 10/8/8/10/3, --quick 2/2/2/2/1)")
    parser.add_argument("--children", type=int, help="children per mission (default 4, lease-expiry 3; --quick 2)")
    parser.add_argument("--seed", type=int, help="random seed (printed, to repeat a run)")
    parser.add_argument("--quick", action="store_true", help="the small form CI runs (tests/e2e/test_chaos.py)")
    parser.add_argument("--scratch", help="directory for logs and databases (default: a new temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    code = 130
    try:
        code = asyncio.run(main(parser.parse_args()))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("chaos: interrupted; every process it started has been killed", file=sys.stderr)
    finally:
        Managed.kill_all()
    exit_now(code)
