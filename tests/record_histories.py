"""Record the workflow histories that tests/workflows/test_replay.py replays on every run.

    .venv/bin/python -m tests.record_histories [--only PREFIX]...

Runs real scenarios on a fresh dev server with the local substrate and writes one JSON history
per workflow run into tests/histories/ (continue-as-new chains get `-runN` suffixes). Between
them the scenarios reach every command-issuing branch of the workflow code; which history
reaches which branch is in tests/histories/README.md (`python -m tests.command_sites` prints
that table). While the version is 0.x a workflow change re-records them all; see
CONTRIBUTING.md for the rule after the first release. `--only PREFIX` (repeatable) writes only
the histories whose names start with one of them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from temporalio.client import Client, WorkflowFailureError
from temporalio.testing import WorkflowEnvironment

from activities.admission import set_policy_with_start, signal_with_start_admission
from activities.fleet import FleetActivities
from activities.sandbox_client import FleetClient, NotFound
from substrate.server import RunningSubstrate, serve_in_thread
from tests.support.decision_sink import DecisionSinkWorkflow
from tests.support.processes import eventually
from worker.ports import free_port
from tests.support.substrate_fixtures import substrate_config
from tests.support.substrate_support import EXECUTOR_TOKEN, FLEET_TOKEN
from worker.binaries import temporal_cli
from worker.config import WorkerConfig
from worker.lease import NotAdmitted, acquire, hold, kept
from worker.mission_control import MissionControl, parse_spec
from worker.payloads import DATA_CONVERTER
from worker.worker import build_worker
from workflows.admission.holders import DECISION_QUERY, HOLDER_WORKFLOW, HeldRequest, HolderInput, holder_workflow_id
from workflows.admission.messages import AdmissionDecision, PolicyChange, ReleaseBatch, SubmitBatch, admission_workflow_id
from workflows.admission.model import AdmissionPolicy, AdmissionRequest
from workflows.admission.probe import AdmissionProbeWorkflow, ProbeInput, ProbeRequest
from workflows.mission.questions import AnswerRequest
from workflows.mission.search import SEARCH_ATTRIBUTES
from workflows.mission.spec import ChildSpec
from workflows.workload.client import workload_workflow_id
from workflows.workload.messages import WorkloadInput, WorkloadResult
from workflows.workload.record import fleet_child_id

HISTORIES = Path(__file__).resolve().parent / "histories"
TASK_QUEUE = "record"
NO_EXECUTOR_QUEUE = "record-no-executor"  # a worker whose executor plane is unreachable
FLEETLESS_QUEUE = "record-fleetless"  # a worker whose executor has no fleet API
FLEETLESS_DOWN_QUEUE = "record-fleetless-down"  # ... and one whose fleet-less executor does not answer
POLICY = AdmissionPolicy(max_concurrent=4, runtime_quotas={"host": 4}, lease_ttl_seconds=6, allow_preemption=True)
ONE_AT_A_TIME = POLICY.model_copy(update={"max_concurrent": 1, "runtime_quotas": {"host": 1}})

ONLY: tuple[str, ...] = ("",)


async def save_chain(client: Client, workflow_id: str, name: str, *, last_runs: int = 2) -> None:
    """Write the last `last_runs` runs of a workflow id (continue-as-new chains have several)."""
    if not name.startswith(ONLY):  # a tuple of prefixes
        return
    runs = [execution async for execution in client.list_workflows(f"WorkflowId = '{workflow_id}'")]
    runs.sort(key=lambda execution: execution.start_time)
    for index, execution in enumerate(runs[-last_runs:]):
        history = await client.get_workflow_handle(workflow_id, run_id=execution.run_id).fetch_history()
        suffix = "" if len(runs) == 1 else f"-run{len(runs) - min(last_runs, len(runs)) + index + 1}"
        (HISTORIES / f"{name}{suffix}.json").write_text(json.dumps(without_stack_traces(json.loads(history.to_json())), indent=1) + "\n")
        print("recorded", name + suffix, len(history.events), "events")


def without_stack_traces(value: object) -> object:
    """The history with every failure's stack trace emptied: a trace names the recording
    machine's files and plays no part in replay."""
    if isinstance(value, dict):
        return {key: "" if key == "stackTrace" else without_stack_traces(item) for key, item in value.items()}
    if isinstance(value, list):
        return [without_stack_traces(item) for item in value]
    return value


async def runs_of(client: Client, workflow_id: str) -> int:
    return len([run async for run in client.list_workflows(f"WorkflowId = '{workflow_id}'")])


async def ended(handle) -> None:
    """Wait for a workflow to close, whichever way it closes."""
    try:
        await handle.result()
    except WorkflowFailureError:
        pass


async def main() -> None:
    HISTORIES.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        scratch_path = Path(scratch)
        env = await WorkflowEnvironment.start_local(
            data_converter=DATA_CONVERTER,
            dev_server_existing_path=temporal_cli(),
            dev_server_extra_args=["--dynamic-config-value", "limit.historyCount.suggestContinueAsNew=100"],
            search_attributes=SEARCH_ATTRIBUTES,
            ui=False,
        )
        try:
            with serve_in_thread(substrate_config(scratch_path / "substrate", instances=6)) as substrate, \
                    serve_in_thread(substrate_config(scratch_path / "fleetless", instances=3, fleet_api=False)) as fleetless:
                await record(env.client, substrate, scratch_path, fleetless.base_url)
        finally:
            await env.shutdown()


async def record(client: Client, substrate: RunningSubstrate, scratch: Path, fleetless_url: str) -> None:
    url = substrate.base_url
    config = WorkerConfig(data_dir=scratch, task_queue=TASK_QUEUE, admission_policy=POLICY, fleet_url=url, executor_url=url)
    fleet = FleetActivities(url, url, FLEET_TOKEN, EXECUTOR_TOKEN)
    dead = f"http://127.0.0.1:{free_port('127.0.0.1')}"
    broken = WorkerConfig(data_dir=scratch, task_queue=NO_EXECUTOR_QUEUE, admission_policy=POLICY, fleet_url=url, executor_url=dead)
    no_executor = FleetActivities(url, dead, FLEET_TOKEN, EXECUTOR_TOKEN)
    bare = WorkerConfig(data_dir=scratch, task_queue=FLEETLESS_QUEUE, admission_policy=POLICY, fleet_url=fleetless_url,
                        executor_url=fleetless_url)  # fmt: skip
    no_fleet = FleetActivities(fleetless_url, fleetless_url, FLEET_TOKEN, EXECUTOR_TOKEN)
    down = WorkerConfig(data_dir=scratch, task_queue=FLEETLESS_DOWN_QUEUE, admission_policy=POLICY, fleet_url=fleetless_url,
                        executor_url=dead)  # fmt: skip
    no_fleet_down = FleetActivities(fleetless_url, dead, FLEET_TOKEN, EXECUTOR_TOKEN)
    try:
        async with build_worker(client, config, fleet=fleet, extra_workflows=[AdmissionProbeWorkflow, DecisionSinkWorkflow]), \
                build_worker(client, broken, fleet=no_executor), build_worker(client, bare, fleet=no_fleet), \
                build_worker(client, down, fleet=no_fleet_down):
            control = MissionControl(client, TASK_QUEUE)
            await asyncio.gather(
                admission_probes(client),
                admission_requester_renewal(client),
                admission_burst(client),
                admission_requester_sweep(client),
                mixed_mission(client, control),
                cancelled_mission(client, control),
                refused_mission(client),
                holder_leases(client),
                contended_missions(client, control),
                orphaned_workload(client, control),
                workloads_refused(client, url),
                workloads_verified(client),
                questioned_mission(client, control),
                fleetless_mission(client),
                fleetless_executor_down(client),
            )
    finally:
        for activities in (fleet, no_executor, no_fleet, no_fleet_down):
            await activities.aclose()


# --- admission ------------------------------------------------------------------------------


async def admission_probes(client: Client) -> None:
    """Probes that wait, renew and get preempted."""
    probes = [
        await client.start_workflow(
            "AdmissionProbeWorkflow",
            ProbeInput(host_group="probes", requests=[ProbeRequest(request_id=name, preemptible=True, priority=prio)],
                       hold_seconds=hold),
            id=f"probe-{name}", task_queue=TASK_QUEUE,
        )
        for name, prio, hold in (("steady", 0, 8), ("waiting", 1, 2), ("urgent", 9, 2))
    ]
    for probe in probes:
        await probe.result()
    await save_chain(client, "probe-steady", "admission-probe-steady")
    await save_chain(client, "probe-urgent", "admission-probe-urgent")
    await save_chain(client, admission_workflow_id("probes"), "admission-probes")


async def admission_requester_renewal(client: Client) -> None:
    """Two probes that renew as requesters (one signal for everything they hold, no answer), on a
    singleton that decides one request per pass (each two-request submit takes two passes); the
    first gives back without asking for an answer."""
    await signal_with_start_admission(
        client, TASK_QUEUE, "requester-renewal", POLICY, "set_policy", PolicyChange(operator="recorder", policy=POLICY),
        max_requests_per_pass=1,
    )
    probes = [
        await client.start_workflow(
            "AdmissionProbeWorkflow",
            ProbeInput(host_group="requester-renewal", requests=[ProbeRequest(request_id=f"{name}-{i}") for i in range(2)],
                       hold_seconds=8, renewal="requester", confirm_give_back=confirm),
            id=f"probe-{name}", task_queue=TASK_QUEUE,
        )
        for name, confirm in (("renewing-a", False), ("renewing-b", True))
    ]
    for probe in probes:
        await probe.result()
    await save_chain(client, "probe-renewing-a", "admission-probe-requester-renewal")
    await save_chain(client, admission_workflow_id("requester-renewal"), "admission-requester-renewal")


async def admission_requester_sweep(client: Client) -> None:
    """A probe terminated while it holds the only lease, under a ten-minute TTL: the singleton's
    sweep (every second here) finds it closed and gives its lease to the probe waiting for it."""
    policy = AdmissionPolicy(max_concurrent=1, lease_ttl_seconds=600, requester_sweep_seconds=1)
    await signal_with_start_admission(
        client, TASK_QUEUE, "swept", policy, "set_policy", PolicyChange(operator="recorder", policy=policy),
    )
    singleton = client.get_workflow_handle(admission_workflow_id("swept"))

    def probe(name: str, hold: float):
        return client.start_workflow(
            "AdmissionProbeWorkflow",
            ProbeInput(host_group="swept", requests=[ProbeRequest(request_id=name)], hold_seconds=hold),
            id=f"probe-{name}", task_queue=TASK_QUEUE,
        )

    gone = await probe("swept-gone", 600)
    while not await singleton.query("leases"):
        await asyncio.sleep(0.2)
    waiting = await probe("swept-waiting", 1)
    await gone.terminate(reason="recorder: ended without giving its lease back")
    await waiting.result()
    await save_chain(client, admission_workflow_id("swept"), "admission-requester-sweep")


async def admission_burst(client: Client) -> None:
    """150 requests that never renew, signalled one by one: the singleton continues as new."""
    sink = await client.start_workflow(DecisionSinkWorkflow.run, id="sink", task_queue=TASK_QUEUE)
    for index in range(150):
        request = AdmissionRequest(
            request_id=f"burst-{index:03d}", orchestrator_id="recorder", environment="default", provider="local",
            runtime_kind="container", priority=index % 3, submitted_at=datetime.now(timezone.utc), queue_timeout_seconds=600,
        )
        await signal_with_start_admission(client, TASK_QUEUE, "burst", POLICY, "submit",
                                          SubmitBatch(requester=sink.id, requests=[request]), max_history_events=100,
                                          restore_records_per_task=20)
    await asyncio.sleep(3)
    await save_chain(client, admission_workflow_id("burst"), "admission-burst")
    await sink.signal("done")


# --- missions -------------------------------------------------------------------------------


async def mixed_mission(client: Client, control: MissionControl) -> None:
    """One child of each outcome under a quorum; supervising its daemon and agent the mission
    continues as new; the agent's workload vanishes (terminated); then an operator stops it."""
    mixed = parse_spec({
        "mission_id": "recorded-mixed", "orchestrator_id": "recorder", "goal": "record histories",
        "host_group": "missions", "aggregation": {"mode": "quorum", "minimum_successes": 3},
        "children": [
            {"child_id": "report", "kind": "one-shot-command", "prompt": "echo report", "required_evidence": ["result"]},
            {"child_id": "slow", "kind": "one-shot-command", "prompt": "sleep 2; echo slow"},
            {"child_id": "failing", "kind": "one-shot-command", "prompt": "echo giving up; exit 2"},
            {"child_id": "api", "kind": "daemon", "prompt": "sleep 300"},
            {"child_id": "agent", "kind": "persistent-agent", "prompt": "sleep 300"},
        ],
    })
    await control.run(mixed, alive_every_seconds=1)
    mission_id = "mission:recorded-mixed"
    api = workload_workflow_id(mixed.mission_id, "api")

    async def continued() -> bool:  # the mission, and its daemon's workload, each in a second run
        return await runs_of(client, mission_id) >= 2 and await runs_of(client, api) >= 2

    await eventually(continued, "the mixed mission and its daemon to continue as new", within=120, interval=0.2)
    await client.get_workflow_handle(workload_workflow_id(mixed.mission_id, "agent")).terminate("recorded: vanished")
    await control.stop(mixed.mission_id)
    await control.handle(mixed.mission_id).result()
    await save_chain(client, mission_id, "mission-mixed", last_runs=10)
    await save_chain(client, workload_workflow_id(mixed.mission_id, "report"), "workload-one-shot")
    await save_chain(client, workload_workflow_id(mixed.mission_id, "slow"), "workload-one-shot-slow")
    await save_chain(client, api, "workload-daemon")


async def cancelled_mission(client: Client, control: MissionControl) -> None:
    cancelled = parse_spec({
        "mission_id": "recorded-cancel", "orchestrator_id": "recorder", "goal": "record a cancellation",
        "host_group": "missions", "aggregation": {"mode": "fail-fast"},
        "children": [{"child_id": "sleeper", "kind": "one-shot-command", "prompt": "sleep 60"}],
    })
    await control.start(cancelled)

    async def running() -> bool:
        child = (await control.show(cancelled.mission_id)).child("sleeper")
        return child.lineage is not None and child.lineage.task_id is not None

    await eventually(running, "the sleeper running", within=30, interval=0.1)
    # A client's mistake on the way: a stop with an argument is refused and recorded, nothing else.
    await control.handle(cancelled.mission_id).signal("stop", {"now": True})

    async def refused() -> bool:
        return bool((await control.show(cancelled.mission_id)).refused)

    await eventually(refused, "the bad stop recorded as refused", within=30, interval=0.1)
    await control.cancel(cancelled.mission_id)
    await ended(control.handle(cancelled.mission_id))
    await save_chain(client, "mission:recorded-cancel", "mission-cancelled")
    await save_chain(client, workload_workflow_id(cancelled.mission_id, "sleeper"), "workload-cancelled")


async def refused_mission(client: Client) -> None:
    """A mission whose input a client got wrong (a misspelt field): the run fails at once, typed."""
    spec = {"mission_id": "recorded-refused", "orchestrator_id": "recorder", "goal": "record a refused input",
            "host_group": "missions", "aggregation": {"mode": "quorum", "quorum": 1},
            "children": [{"child_id": "c", "kind": "one-shot-command", "prompt": "true"}]}
    handle = await client.start_workflow("MissionWorkflow", {"spec": spec}, id="mission:recorded-refused", task_queue=TASK_QUEUE)
    try:
        await handle.result()
    except WorkflowFailureError:
        pass
    await save_chain(client, "mission:recorded-refused", "mission-refused-input")


async def holder_leases(client: Client) -> None:
    """Holders that are not workflows (workflows.admission.holders) on a host group of one slot.
    Through worker.lease: one holds and renews while another waits; a third is withdrawn while
    queued; the first gives back and the second is admitted, then gives back. Then holder workflows
    started as the `temporal` CLI or TypeScript start them: one submits itself at once, and one
    whose holder promised to submit (and never did) submits itself after SUBMIT_GRACE."""
    change = PolicyChange(operator="recorder", policy=ONE_AT_A_TIME.model_copy(update={"lease_ttl_seconds": 3}))
    await set_policy_with_start(client, TASK_QUEUE, "holders", change)
    request = lambda name: HeldRequest(request_id=name, orchestrator_id="recorder")  # noqa: E731
    async with hold(client, "holders", request("held-first"), holder="alice@recorder"):
        waiting = asyncio.ensure_future(acquire(client, "holders", request("held-second"), holder="bob@recorder"))
        withdraw = asyncio.Event()
        withdrawn = asyncio.ensure_future(
            acquire(client, "holders", request("held-withdrawn"), holder="carol@recorder", withdraw=withdraw)
        )
        await asyncio.sleep(2.5)  # renewals at a third of the TTL, the others queued
        withdraw.set()
        try:
            await withdrawn
        except NotAdmitted:
            pass
    second = await waiting
    async with kept(second):
        pass
    singleton = client.get_workflow_handle(admission_workflow_id("holders"))
    for holder, name, on_its_own in (("dave@recorder", "held-alone", False), ("erin@recorder", "held-orphaned", True)):
        workflow_id = holder_workflow_id("holders", holder, name)
        handle = await client.start_workflow(
            HOLDER_WORKFLOW, HolderInput(host_group="holders", holder=holder, request=request(name), submitted_by_holder=on_its_own),
            id=workflow_id, task_queue=TASK_QUEUE, result_type=AdmissionDecision,
        )

        async def admitted() -> bool:
            return (await handle.query(DECISION_QUERY, result_type=AdmissionDecision)).state == "admitted"

        await eventually(admitted, f"{name} admitted", within=30)
        await singleton.signal("release", ReleaseBatch(requester=workflow_id, request_ids=[name]))
        assert (await handle.result()).state == "released"
    await save_chain(client, holder_workflow_id("holders", "alice@recorder", "held-first"), "holder-submitted-by-its-holder")
    await save_chain(client, holder_workflow_id("holders", "carol@recorder", "held-withdrawn"), "holder-withdrawn")
    await save_chain(client, holder_workflow_id("holders", "dave@recorder", "held-alone"), "holder-alone")
    await save_chain(client, holder_workflow_id("holders", "erin@recorder", "held-orphaned"), "holder-orphaned")
    await save_chain(client, admission_workflow_id("holders"), "admission-holders")


async def contended_missions(client: Client, control: MissionControl) -> None:
    """A host group that runs one child at a time (set by an operator): a daemon holds it while
    a request times out in the queue; an urgent mission preempts the daemon, whose mission stops
    it (lease lost); the urgent mission's first child fails, and fail-fast withdraws its
    sibling, still queued; the daemon is admitted again under a new request and runs as its
    attempt 2 until an operator stops its mission."""
    change = PolicyChange(operator="recorder", policy=ONE_AT_A_TIME)
    await set_policy_with_start(client, TASK_QUEUE, "contended", change)
    victim = parse_spec({
        "mission_id": "recorded-preempted", "orchestrator_id": "recorder", "goal": "be preempted",
        "host_group": "contended",
        "children": [{"child_id": "api", "kind": "daemon", "prompt": "sleep 300", "preemptible": True}],
    })
    await control.run(victim)
    # A request that cannot wait long arrives: its deadline comes before the lease's expiry, so
    # the singleton's standing timer is replaced by an earlier one; then it times out queued.
    impatient = await client.start_workflow(
        "AdmissionProbeWorkflow",
        ProbeInput(host_group="contended", requests=[ProbeRequest(request_id="impatient", queue_timeout_seconds=1)]),
        id="probe-impatient", task_queue=TASK_QUEUE,
    )
    await impatient.result()
    urgent = parse_spec({
        "mission_id": "recorded-urgent", "orchestrator_id": "recorder", "goal": "preempt, fail fast",
        "host_group": "contended", "aggregation": {"mode": "fail-fast"},
        "children": [
            {"child_id": "broken", "kind": "one-shot-command", "prompt": "sleep 1; exit 1", "priority": 9},
            {"child_id": "queued", "kind": "one-shot-command", "prompt": "echo never", "priority": 9},
        ],
    })
    await control.start(urgent)
    await ended(control.handle(urgent.mission_id))

    async def back_as_attempt_2() -> bool:  # preempted, it is admitted again under a new request
        api = (await control.show(victim.mission_id)).child("api")
        return api.attempt == 2 and api.lineage is not None and api.lineage.task_id is not None

    await eventually(back_as_attempt_2, "the preempted daemon running again as attempt 2", within=60, interval=0.2)
    await control.stop(victim.mission_id)
    await ended(control.handle(victim.mission_id))
    await save_chain(client, "mission:recorded-preempted", "mission-preempted")
    await save_chain(client, "mission:recorded-urgent", "mission-fail-fast-queued")
    await save_chain(client, workload_workflow_id(victim.mission_id, "api"), "workload-preempted")
    await save_chain(client, admission_workflow_id("contended"), "admission-contended")


# --- workloads ------------------------------------------------------------------------------


async def orphaned_workload(client: Client, control: MissionControl) -> None:
    """A daemon's mission is terminated: the workload finds it gone and stops its task."""
    spec = parse_spec({
        "mission_id": "recorded-orphan", "orchestrator_id": "recorder", "goal": "be terminated",
        "host_group": "missions", "children": [{"child_id": "api", "kind": "daemon", "prompt": "sleep 300"}],
    })
    await control.run(spec, alive_every_seconds=1)
    await control.handle(spec.mission_id).terminate("recorded: terminated by an operator")
    await ended(client.get_workflow_handle(workload_workflow_id(spec.mission_id, "api")))
    await save_chain(client, workload_workflow_id(spec.mission_id, "api"), "workload-orphaned")


def direct(child_id: str, prompt: str, *, mission: str = "recorded-direct", **child: object) -> WorkloadInput:
    return WorkloadInput(
        mission_id=mission, orchestrator_id="recorder", target_id="local-1", executor_id="local-executor-1",
        child=ChildSpec(child_id=child_id, kind="one-shot-command", prompt=prompt, **child),  # type: ignore[arg-type]
        poll_interval_seconds=0.2,
    )


async def workloads_refused(client: Client, fleet_url: str) -> None:
    """Workloads without a mission: admission refused (the same child asked for with another
    record), dispatch refused (an isolation the instance lacks), and one cancelled while its
    dispatch cannot reach the executor."""

    async def run(input: WorkloadInput, workflow_id: str, task_queue: str = TASK_QUEUE):
        handle = await client.start_workflow(
            "WorkloadWorkflow", input, id=workflow_id, task_queue=task_queue, result_type=WorkloadResult,
        )
        return handle

    first = direct("clash", "echo first")
    await (await run(first, "workload:recorded-direct:clash")).result()
    budgets = first.child.budgets.model_copy(update={"timeout_seconds": first.child.budgets.timeout_seconds + 1})
    clash = first.model_copy(update={"child": first.child.model_copy(update={"budgets": budgets})})
    await ended(await run(clash, "workload:recorded-direct:clash-again"))  # fails: workload.failed
    await ended(await run(direct("in-a-vm", "echo never", runtime_kind="vm"), "workload:recorded-direct:in-a-vm"))

    stuck = await run(direct("stuck", "echo never"), "workload:recorded-direct:stuck", NO_EXECUTOR_QUEUE)
    fleet = FleetClient(fleet_url, FLEET_TOKEN)

    async def admitted() -> bool:  # admitted on the fleet, while its dispatch keeps failing
        try:
            return (await fleet.get(fleet_child_id("recorded-direct", "stuck"))).status.observed_state == "admitted"
        except NotFound:
            return False

    try:
        await eventually(admitted, "the stuck workload admitted", within=30, interval=0.2)
    finally:
        await fleet.aclose()
    await stuck.cancel()
    await ended(stuck)
    await save_chain(client, "workload:recorded-direct:clash-again", "workload-admission-refused")
    await save_chain(client, "workload:recorded-direct:in-a-vm", "workload-dispatch-refused")
    await save_chain(client, "workload:recorded-direct:stuck", "workload-cancelled-before-dispatch")


async def workloads_verified(client: Client) -> None:
    """The conductor's own verifier after a one-shot succeeds: one that passes, one that does not."""
    for name, verifier in (("verified", "grep -q 42 answer.txt"), ("unverified", "grep -q 41 answer.txt")):
        input = direct(name, "echo 42 > answer.txt", verifier=verifier, required_evidence=["verifier"])
        handle = await client.start_workflow(
            "WorkloadWorkflow", input, id=f"workload:recorded-direct:{name}", task_queue=TASK_QUEUE,
            result_type=WorkloadResult,
        )
        await ended(handle)
        await save_chain(client, f"workload:recorded-direct:{name}", f"workload-{name}")


# --- questions (hitl-prompt/v1) and gates -----------------------------------------------------


async def questioned_mission(client: Client, control: MissionControl) -> None:
    """Children that ask (answered; consensus:2; unanswered past the deadline) and gated ones
    (approved, rejected, not answered in time)."""
    spec = parse_spec({
        "mission_id": "recorded-questions", "orchestrator_id": "recorder", "goal": "ask people",
        "host_group": "questions", "aggregation": {"mode": "quorum", "minimum_successes": 1},
        "children": [
            {"child_id": "ask", "kind": "one-shot-command", "prompt": "$CONDUCTOR_ASK 'Go on?' && echo went on"},
            {"child_id": "vote", "kind": "one-shot-command", "prompt": "$CONDUCTOR_ASK 'Ship?' --responder consensus:2"},
            {"child_id": "late", "kind": "one-shot-command", "prompt": "$CONDUCTOR_ASK 'Anyone?' --deadline-seconds 2; sleep 60"},
            {"child_id": "gate-yes", "kind": "one-shot-command", "prompt": "echo dispatched", "approval": {"required": True}},
            {"child_id": "gate-no", "kind": "one-shot-command", "prompt": "echo never", "approval": {"required": True}},
            {"child_id": "gate-late", "kind": "one-shot-command", "prompt": "echo never",
             "approval": {"required": True, "timeout_seconds": 2}},
        ],
    })
    await control.start(spec)

    async def asked(child_id: str):
        async def found():
            child = (await control.show(spec.mission_id)).child(child_id)
            return child.question

        return await eventually(found, f"{child_id} asking", within=30, interval=0.2)

    for child_id, operator, payload in (
        ("ask", "alice", {"approved": True}), ("vote", "alice", {"approved": True}), ("vote", "bob", {"approved": True}),
        ("gate-yes", "alice", {"approved": True}), ("gate-no", "bob", {"approved": False, "comment": "not now"}),
    ):
        question = await asked(child_id)
        await control.answer(spec.mission_id, AnswerRequest(child_id=child_id, operator=operator, payload=payload,
                                                            prompt_id=question.prompt_id))  # fmt: skip
    await control.handle(spec.mission_id).result()
    await save_chain(client, f"mission:{spec.mission_id}", "mission-questions", last_runs=10)
    await save_chain(client, workload_workflow_id(spec.mission_id, "ask"), "workload-question-answered")
    await save_chain(client, workload_workflow_id(spec.mission_id, "late"), "workload-question-timed-out")


# --- executors without the fleet API ------------------------------------------------------------


async def fleetless_mission(client: Client) -> None:
    """On an executor without the fleet API: a one-shot, a command that asks (answered) and an
    agent with records the conductor keeps (the agent stopped with the mission), and a daemon
    refused as unsupported. The question comes and goes while the mission's state stays `running`."""
    control = MissionControl(client, FLEETLESS_QUEUE)
    spec = parse_spec({
        "mission_id": "recorded-fleetless", "orchestrator_id": "recorder", "goal": "run without the fleet API",
        "host_group": "fleetless", "aggregation": {"mode": "quorum", "minimum_successes": 3},
        "require_distinct_targets": False,
        "children": [
            {"child_id": "cmd", "kind": "one-shot-command", "prompt": "sleep 1.5; echo kept"},
            {"child_id": "ask", "kind": "one-shot-command", "prompt": "$CONDUCTOR_ASK 'Go on?' && sleep 1"},
            {"child_id": "agent", "kind": "persistent-agent", "prompt": "sleep 300"},
            {"child_id": "api", "kind": "daemon", "prompt": "sleep 300"},
        ],
    })
    await control.start(spec)

    async def asked():
        return (await control.show(spec.mission_id)).child("ask").question

    question = await eventually(asked, "the fleet-less child asking", within=30, interval=0.2)
    await control.answer(spec.mission_id, AnswerRequest(child_id="ask", operator="alice", payload={"approved": True},
                                                        prompt_id=question.prompt_id))  # fmt: skip
    await control.wait_for_verdict(spec.mission_id)
    await control.stop(spec.mission_id)
    await control.handle(spec.mission_id).result()
    await save_chain(client, f"mission:{spec.mission_id}", "mission-fleetless")
    await save_chain(client, workload_workflow_id(spec.mission_id, "cmd"), "workload-fleetless-one-shot")
    await save_chain(client, workload_workflow_id(spec.mission_id, "agent"), "workload-fleetless-agent")


async def fleetless_executor_down(client: Client) -> None:
    """A fleet-less executor that does not answer: the child shows capacity backpressure and
    waits a durable pause before dispatching again; then it is cancelled."""
    input = direct("down", "echo never", mission="recorded-fleetless-down").model_copy(update={"fleetless": True})
    handle = await client.start_workflow("WorkloadWorkflow", input, id="workload:recorded-fleetless-down:down",
                                         task_queue=FLEETLESS_DOWN_QUEUE, result_type=WorkloadResult)  # fmt: skip

    async def waiting() -> bool:
        history = await handle.fetch_history()
        return any(event.HasField("timer_started_event_attributes") for event in history.events)

    await eventually(waiting, "the dispatch paused for an unavailable executor", within=60, interval=0.5)
    await handle.cancel()
    await ended(handle)
    await save_chain(client, "workload:recorded-fleetless-down:down", "workload-fleetless-executor-down")


if __name__ == "__main__":
    from worker.process import exit_now

    parser = argparse.ArgumentParser(description="Record the histories that tests/workflows/test_replay.py replays.")
    parser.add_argument("--only", action="append", default=[], help="write only the histories whose names start with this (repeatable)")
    options = parser.parse_args()
    ONLY = tuple(options.only) or ("",)
    asyncio.run(main())
    exit_now(0)
