"""Many workers (issue 13): missions run across three `conductor worker` processes that share one
Temporal server, one PostgreSQL database and one substrate, while workers are SIGKILLed and replaced.

Each worker is configured only through the environment, as a deployment would configure it
(docs/deploy.md), and each has a data directory of its own: nothing may depend on a worker's disk.
What must hold once every mission has closed:

- every ledger snapshot the missions wrote is in the one PostgreSQL store, each re-hashes to its
  recorded hash, and the last one is the mission's final ledger (the workflow's result);
- no child was dispatched twice: one substrate task per child, its command run once, and one
  `admitted` per admission request in the audit (plus one per `requeued`, should a lease expire);
- no audit event is missing: per (host_group, chain) the stored seqs are 1..N without a hole, N
  being the admission workflow's latest revision.

A write of the mission's ledger takes the latest ledger when the previous write returns
(workflows/mission/workflow.py, `_snapshot`), so snapshot numbers may skip by design; the test
compares the store with the writes the workflow histories asked for, not with 0..N.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.contrib.pydantic import pydantic_data_converter

from activities.ledger_store import snapshot_ref
from activities.postgres_stores import PostgresDatabase, PostgresLedgerStore
from substrate.server import RunningSubstrate
from tests.support.substrate_fixtures import substrate  # noqa: F401  (fixture)
from tests.support.mission_harness import events_of_every_run
from tests.support.substrate_support import EXECUTOR_TOKEN, FLEET_TOKEN
from worker.mission_control import MissionControl, parse_spec
from workflows.admission.messages import admission_workflow_id
from workflows.admission.model import AdmissionPolicy, AuditEvent
from workflows.mission.ledger import WRITE_LEDGER_SNAPSHOT_ACTIVITY, MissionLedger
from workflows.mission.messages import admission_request_id, mission_workflow_id
from workflows.workload.client import workload_workflow_id
from workflows.workload.record import fleet_child_id

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(120)]  # real processes killed on purpose, as the chaos tests

CLI = "from worker.cli import main; main()"  # as the console script does (exits without finalising Temporal core)
READY = "conductor worker: polling task queue"
WORKERS = 3
MISSIONS = 6
CHILDREN = 3
# The substrate fixture has four targets; eight leases at a time keep every worker busy. A mission
# whose worker dies twice can wait two workflow-task timeouts (10 s each) before it renews again: a
# 30 s lease (renewed at 10 s) mostly outlives that, and a requeue when it does not is allowed below.
POLICY = AdmissionPolicy(max_concurrent=8, runtime_quotas={"host": 8}, lease_ttl_seconds=30)



@dataclass
class WorkerProcess:
    """One `conductor worker`, leading a process group of its own so a SIGKILL takes it all, as a crash would."""

    name: str
    env: dict[str, str]
    log: Path
    process: subprocess.Popen[bytes] | None = None
    offset: int = 0

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.offset = out.tell()
            self.process = subprocess.Popen(
                [sys.executable, "-c", CLI, "worker"], env=self.env, stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    async def ready(self, within: float = 30) -> None:
        deadline = time.monotonic() + within
        while True:
            text = self.log.read_bytes()[self.offset :].decode(errors="replace")
            if READY in text:
                return
            assert self.process is not None
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{self.name} did not start (exit {self.process.poll()}):\n{text[-2000:]}")
            await asyncio.sleep(0.1)

    def kill(self) -> None:
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(10)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class Fleet:
    """The workers of this test, started and killed by name; every one is SIGKILLed on the way out."""

    base_env: dict[str, str]
    root: Path
    workers: list[WorkerProcess] = field(default_factory=list)

    async def start(self, name: str) -> WorkerProcess:
        data_dir = self.root / name
        data_dir.mkdir()
        worker = WorkerProcess(name, {**self.base_env, "CONDUCTOR_DATA_DIR": str(data_dir)}, self.root / f"{name}.log")
        self.workers.append(worker)
        worker.start()
        await worker.ready()
        return worker

    def kill_all(self) -> None:
        for worker in self.workers:
            worker.kill()

    def logs(self) -> str:
        return "\n".join(f"--- {w.name}\n{w.log.read_text(errors='replace')[-3000:]}" for w in self.workers)


def _worker_env(tmp_path: Path, temporal: str, substrate_url: str, database_url: str, task_queue: str) -> dict[str, str]:
    secrets = tmp_path / "secrets"
    secrets.mkdir(mode=0o700)
    for name, token in (("fleet.token", FLEET_TOKEN), ("executor.token", EXECUTOR_TOKEN)):
        (secrets / name).write_text(token)
        (secrets / name).chmod(0o600)
    (tmp_path / "policy.json").write_text(POLICY.model_dump_json())
    (tmp_path / "temporal.toml").write_text("")  # no profile of whoever runs the tests
    env = {key: value for key, value in os.environ.items() if not key.startswith(("CONDUCTOR_", "TEMPORAL_"))}
    repo = str(Path(__file__).resolve().parents[2])
    return {
        **env,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")])),
        "TEMPORAL_ADDRESS": temporal,
        "TEMPORAL_NAMESPACE": "default",
        "TEMPORAL_CONFIG_FILE": str(tmp_path / "temporal.toml"),
        "CONDUCTOR_SUBSTRATE_URL": substrate_url,
        "CONDUCTOR_FLEET_TOKEN_FILE": str(secrets / "fleet.token"),
        "CONDUCTOR_EXECUTOR_TOKEN_FILE": str(secrets / "executor.token"),
        "CONDUCTOR_TASK_QUEUE": task_queue,
        "CONDUCTOR_DATABASE_URL": database_url,
        "CONDUCTOR_ADMISSION_POLICY": str(tmp_path / "policy.json"),
    }


def _spec(mission_id: str, host_group: str, runs: Path, seconds: float) -> dict:
    return {
        "mission_id": mission_id,
        "orchestrator_id": "tests",
        "goal": "many workers",
        "host_group": host_group,
        "require_distinct_targets": False,
        "children": [
            {
                "child_id": f"c{n}",
                "kind": "one-shot-command",
                # The shell's pid goes to a file of the child's own: a second run shows there.
                "prompt": f"echo $$ >> {runs / f'{mission_id}.c{n}'}; sleep {seconds:g}; echo done c{n}",
            }
            for n in range(CHILDREN)
        ],
    }


async def _requested_writes(events: list) -> dict[int, str]:
    """seq -> content hash of every ledger snapshot the mission asked an activity to write."""
    wanted: dict[int, str] = {}
    for event in events:
        if event.event_type != EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            continue
        scheduled = event.activity_task_scheduled_event_attributes
        if scheduled.activity_type.name != WRITE_LEDGER_SNAPSHOT_ACTIVITY:
            continue
        (ledger,) = await pydantic_data_converter.decode(scheduled.input.payloads, [MissionLedger])
        ref, _ = snapshot_ref(ledger)
        wanted[ref.seq] = ref.content_hash
    return wanted


def _task_pids(events: list) -> list[int]:
    """The pid of the worker that took each workflow task, in order (the SDK's identity is PID@HOST)."""
    return [
        int(event.workflow_task_started_event_attributes.identity.split("@", 1)[0])
        for event in events
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED
    ]


async def _audit_rows(database_url: str, host_groups: list[str]) -> list[tuple[str, str, int, str, str | None]]:
    async with await psycopg.AsyncConnection.connect(database_url) as db:
        cursor = await db.execute(
            "SELECT host_group, chain, seq, type, request_id FROM admission_audit WHERE host_group = ANY(%s) "
            "ORDER BY host_group, chain, seq",
            (host_groups,),
        )
        return await cursor.fetchall()


async def _wait_audit_caught_up(client: Client, database_url: str, host_groups: list[str], within: float = 20) -> list:
    """The audit rows once the store holds each host group's latest revision (exports run behind the workflow)."""
    deadline = time.monotonic() + within
    while True:
        latest = {}
        for group in host_groups:
            recent = await client.get_workflow_handle(admission_workflow_id(group)).query(
                "audit", 1, result_type=list[AuditEvent]
            )
            latest[group] = recent[-1].seq if recent else 0
        rows = await _audit_rows(database_url, host_groups)
        stored = defaultdict(int)
        for group, _chain, seq, _type, _request in rows:
            stored[group] = max(stored[group], seq)
        if all(stored[group] >= latest[group] for group in host_groups):
            return rows
        if time.monotonic() > deadline:
            raise AssertionError(f"audit store behind the admission workflows: stored {dict(stored)}, latest {latest}")
        await asyncio.sleep(0.3)


async def test_missions_across_three_workers_survive_kills_with_one_store(
    dev_client: Client, substrate: RunningSubstrate, postgres_url: str, tmp_path: Path,  # noqa: F811
):
    suffix = uuid.uuid4().hex[:8]
    task_queue = f"many-{suffix}"
    host_groups = [f"hg-many-{suffix}-{n}" for n in range(2)]
    runs = tmp_path / "runs"
    runs.mkdir()
    env = _worker_env(
        tmp_path, dev_client.service_client.config.target_host, substrate.base_url, postgres_url, task_queue
    )
    fleet = Fleet(env, tmp_path)
    control = MissionControl(dev_client, task_queue)
    missions = [f"many-{suffix}-{n}" for n in range(MISSIONS)]
    started_at = time.monotonic()
    try:
        # Three workers start at once on a new database, each migrating it before it polls.
        workers = await asyncio.gather(*(fleet.start(f"worker-{n}") for n in range(WORKERS)))
        for n, mission_id in enumerate(missions):
            await control.start(parse_spec(_spec(mission_id, host_groups[n % 2], runs, 1 + (n % 3) * 0.5)))

        # Kill two workers while children are in flight, starting a replacement for each.
        killed = []
        for victim, after in ((workers[0], 2.0), (workers[1], 2.5)):
            await asyncio.sleep(after)
            victim.kill()
            killed.append(victim.name)
            await fleet.start(f"{victim.name}-replacement")

        results: dict[str, MissionLedger] = {}
        for mission_id in missions:
            handle = dev_client.get_workflow_handle(mission_workflow_id(mission_id), result_type=MissionLedger)
            try:
                results[mission_id] = await asyncio.wait_for(handle.result(), max(5.0, 50 - (time.monotonic() - started_at)))
            except TimeoutError:
                raise AssertionError(f"mission {mission_id} did not close in time\n{fleet.logs()}") from None
        for mission_id, final in results.items():
            description = await dev_client.get_workflow_handle(mission_workflow_id(mission_id)).describe()
            assert description.status == WorkflowExecutionStatus.COMPLETED
            assert final.parent_state == "completed", (mission_id, final.aggregation.reason)
        audit = await _wait_audit_caught_up(dev_client, postgres_url, host_groups)
    finally:
        fleet.kill_all()
    assert sum(not w.alive() for w in fleet.workers) == len(fleet.workers)

    # Ledgers: every snapshot asked for is stored with that content, each verifies, the last is the result.
    database = PostgresDatabase(postgres_url, max_size=2)
    await database.open()
    try:
        store = PostgresLedgerStore(database)
        takers: dict[str, list[int]] = {}
        gaps = 0
        for mission_id, final in results.items():
            refs = await store.history(mission_id)
            seqs = [ref.seq for ref in refs]
            assert seqs == sorted(set(seqs)) and seqs[0] == 0, (mission_id, seqs)
            stored = {ref.seq: ref.content_hash for ref in refs}
            events = await events_of_every_run(dev_client, mission_workflow_id(mission_id))
            wanted = await _requested_writes(events)
            takers[mission_id] = _task_pids(events)
            gaps += sum(b - a - 1 for a, b in zip(seqs, seqs[1:]))
            assert wanted, mission_id
            missing = {seq: digest for seq, digest in wanted.items() if stored.get(seq) != digest}
            assert not missing, f"{mission_id}: snapshots written by the workflow but not stored (or stored otherwise): {missing}"
            for ref in refs:  # `get` re-hashes the stored text against the recorded hash
                snapshot = await store.get(mission_id, ref.seq)
                assert snapshot is not None and snapshot.snapshot_seq == ref.seq
            latest = await store.latest(mission_id)
            assert latest == final and seqs[-1] == final.snapshot_seq
            assert snapshot_ref(latest)[0].content_hash == stored[final.snapshot_seq]
    finally:
        await database.close()

    # The kills hit work in flight: some workflow's tasks went from a killed worker to another one.
    for mission_id in missions:
        for n in range(CHILDREN):
            workload_id = workload_workflow_id(mission_id, f"c{n}")
            takers[workload_id] = _task_pids(await events_of_every_run(dev_client, workload_id))
    killed_pids = {w.process.pid for w in fleet.workers if w.name in killed and w.process is not None}
    moved = [
        workflow_id for workflow_id, pids in takers.items()
        if any(a in killed_pids and b != a for a, b in zip(pids, pids[1:]))
    ]  # fmt: skip
    assert moved, f"no workflow moved off a killed worker: {takers}, killed pids {killed_pids}"

    # No double dispatch: one substrate task and one command run per child.
    with_tasks: Counter[str] = Counter()
    db = sqlite3.connect(f"file:{substrate.config.database}?mode=ro", uri=True)
    try:
        for (child,) in db.execute("SELECT child_id FROM tasks"):
            with_tasks[child] += 1
    finally:
        db.close()
    for mission_id in missions:
        for n in range(CHILDREN):
            child = f"c{n}"
            assert with_tasks[fleet_child_id(mission_id, child)] == 1, f"{mission_id}/{child}: {with_tasks[fleet_child_id(mission_id, child)]} substrate tasks"
            shells = (runs / f"{mission_id}.{child}").read_text().split()
            assert len(shells) == 1, f"{mission_id}/{child} ran {len(shells)} times"

    # Admission audit: contiguous per chain, one `admitted` per request (plus one per `requeued`).
    chains: dict[tuple[str, str], list[int]] = defaultdict(list)
    for group, chain, seq, _type, _request in audit:
        chains[(group, chain)].append(seq)
    assert {group for group, _ in chains} == set(host_groups)
    for key, seqs in chains.items():
        assert seqs == list(range(1, len(seqs) + 1)), f"audit chain {key} has holes: {seqs}"
    admitted = Counter(request for _, _, _, kind, request in audit if kind == "admitted")
    requeued = Counter(request for _, _, _, kind, request in audit if kind == "requeued")
    requests = {admission_request_id(m, f"c{n}") for m in missions for n in range(CHILDREN)}
    assert set(admitted) == requests
    for request in requests:
        assert admitted[request] == 1 + requeued[request], (request, admitted[request], requeued[request])

    print(
        f"many workers: {MISSIONS} missions x {CHILDREN} children on {WORKERS} workers, killed {killed}; "
        f"{sum(len(v) for v in chains.values())} audit events in {len(chains)} chains; "
        f"requeued {sum(requeued.values())}; {len(moved)} workflows moved off a killed worker; "
        f"{gaps} snapshot numbers skipped by coalesced writes; {time.monotonic() - started_at:.1f} s"
    )
