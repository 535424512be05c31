"""WorkloadWorkflow on the real Temporal dev server against a real local substrate.

Real time throughout: the substrate runs real processes, and the watch activity's heartbeat
timeout must mean what it says.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.exceptions import ApplicationError, is_cancelled_exception
from temporalio.worker import Replayer, Worker

from activities.fleet import FleetActivities
from activities.sandbox_client import ExecutorClient
from substrate.server import RunningSubstrate, serve_in_thread
from worker.ports import free_port
from tests.support.substrate_fixtures import (  # noqa: F401
    TOKENS,
    fleet_activities,
    substrate,
    substrate_config,
    substrate_tasks,
)
from tests.support.processes import eventually, process_dead, process_gone, read_pid
from tests.support.substrate_support import EXECUTOR_TOKEN, FLEET_TOKEN
from tests.support.workload_parent import ParentInput, ParentOutcome, WorkloadParentProbe
from worker.config import WorkerConfig
from worker.payloads import DATA_CONVERTER
from worker.worker import build_worker
from workflows.mission.spec import ChildSpec
from workflows.workload.record import fleet_child_id
from workflows.workload.messages import (
    ADMIT_AND_DISPATCH,
    AdmitAndDispatch,
    AdmittedAndDispatched,
    WorkloadInput,
    WorkloadRef,
    WorkloadResult,
)
from workflows.workload.workflow import WorkloadWorkflow

pytestmark = pytest.mark.timeout(90)


def workload(child: ChildSpec, *, mission: str | None = None, target: str = "local-1", **options: object) -> WorkloadInput:
    return WorkloadInput(
        mission_id=mission or f"mission-{uuid.uuid4().hex[:8]}",
        orchestrator_id="conductor-test",
        child=child,
        target_id=target,
        executor_id=f"local-executor-{target.rsplit('-', 1)[-1]}",
        poll_interval_seconds=0.1,
        **options,  # type: ignore[arg-type]
    )


def child(prompt: str, kind: str = "one-shot-command", **options: object) -> ChildSpec:
    return ChildSpec(child_id=f"child-{uuid.uuid4().hex[:10]}", kind=kind, prompt=prompt, **options)  # type: ignore[arg-type]


@asynccontextmanager
async def workload_worker(client: Client, fleet: FleetActivities) -> AsyncIterator[str]:
    task_queue = f"workload-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[WorkloadWorkflow, WorkloadParentProbe],
        activities=fleet.activities(),
        # A bug in workflow code fails the test at once instead of retrying the task forever.
        workflow_failure_exception_types=[Exception],
    ):
        yield task_queue


async def failed_result(handle: WorkflowHandle) -> WorkloadResult:
    """A workload whose verdict is not success fails its workflow (the Temporal UI shows it
    failed): an ApplicationError `workload.<verdict>` carrying its WorkloadResult."""
    with pytest.raises(WorkflowFailureError) as raised:
        await handle.result()
    cause = raised.value.cause
    assert isinstance(cause, ApplicationError) and cause.non_retryable, cause
    result = WorkloadResult.model_validate(cause.details[0])
    assert cause.type == f"workload.{result.verdict}" and result.child_id in cause.message
    return result


async def start(client: Client, task_queue: str, input: WorkloadInput, workflow_id: str | None = None) -> WorkflowHandle:
    return await client.start_workflow(
        "WorkloadWorkflow",
        input,
        id=workflow_id or f"workload:{input.mission_id}:{input.child.child_id}",
        task_queue=task_queue,
        result_type=WorkloadResult,
    )


async def start_parent(client: Client, task_queue: str, input: WorkloadInput) -> tuple[WorkflowHandle, str]:
    child_id = f"workload:{input.mission_id}:{input.child.child_id}"
    handle = await client.start_workflow(
        WorkloadParentProbe.run,
        ParentInput(child_workflow_id=child_id, workload=input),
        id=f"parent:{input.mission_id}",
        task_queue=task_queue,
    )
    return handle, child_id


async def history_text(handle: WorkflowHandle) -> str:
    """The history as JSON plus every payload decoded (payloads are base64 in the JSON)."""
    text = (await handle.fetch_history()).to_json()
    decoded = [base64.b64decode(data).decode("utf-8", "replace") for data in re.findall(r'"data":\s*"([A-Za-z0-9+/=]+)"', text)]
    return "\n".join([text, *decoded])


async def scheduled_activities(handle: WorkflowHandle):
    history = await handle.fetch_history()
    return [
        event.activity_task_scheduled_event_attributes
        for event in history.events
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]


async def activity_calls(handle: WorkflowHandle) -> list[tuple[str, Any]]:
    """Every activity the run called, regular or local, with a local one's result (a local
    activity is a marker in the history, its result inside; a regular one's result is None here)."""
    history = await handle.fetch_history()
    calls: list[tuple[str, Any]] = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            calls.append((event.activity_task_scheduled_event_attributes.activity_type.name, None))
        elif event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            marker = event.marker_recorded_event_attributes
            if marker.marker_name == "core_local_activity":
                result = marker.details["result"].payloads
                calls.append((
                    json.loads(marker.details["data"].payloads[0].data)["activity_type"],
                    json.loads(result[0].data) if result else None,
                ))
    return calls


async def assert_replays(*handles: WorkflowHandle) -> None:
    """The workflow code still produces exactly these histories (determinism)."""
    replayer = Replayer(workflows=[WorkloadWorkflow, WorkloadParentProbe], data_converter=DATA_CONVERTER)
    for handle in handles:
        await replayer.replay_workflow(await handle.fetch_history())


async def test_one_shot_echo_succeeds_and_the_parent_sees_its_revisions_in_order(
    dev_env: WorkflowEnvironment, fleet_activities: FleetActivities
):
    client = dev_env.client
    async with workload_worker(client, fleet_activities) as task_queue:
        input = workload(child("echo hello", required_evidence=["result"]))
        parent, child_workflow_id = await start_parent(client, task_queue, input)
        outcome: ParentOutcome = await parent.result()

    result = outcome.result
    assert result is not None and result.verdict == "satisfied" and result.missing_evidence == []
    final = result.observation
    assert final.observed_state == "succeeded" and final.exit_classification == "success"
    assert final.output == "hello\n"
    assert "result" in {artifact.kind for artifact in final.artifacts}
    assert final.lineage is not None and final.lineage.task_id == result.task_id
    assert final.lineage.dispatch_id == f"{input.mission_id}:{input.child.child_id}:dispatch"
    revisions = [o.revision for o in outcome.observations]
    assert revisions == sorted(set(revisions))
    # Every report names the bound task (the admitted record is not reported on its own, the bound
    # one follows at once), and the last one is the result's.
    assert all(o.lineage is not None and o.lineage.task_id == result.task_id for o in outcome.observations)
    assert outcome.observations[-1] == final
    child_history = await client.get_workflow_handle(child_workflow_id).fetch_history()
    signals = [e for e in child_history.events if e.event_type == EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED]
    assert len(signals) == len(outcome.observations) - 1

    await assert_replays(parent, client.get_workflow_handle(child_workflow_id))
    # Tokens never reach a history; the decoded payloads are searched (the prompt proves they are).
    for handle in (parent, client.get_workflow_handle(child_workflow_id)):
        text = await history_text(handle)
        assert "echo hello" in text
        for token in TOKENS:
            assert token not in text


async def test_a_failing_command_ends_failed_through_the_worker_built_from_the_environment(
    dev_env: WorkflowEnvironment, substrate: RunningSubstrate, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("CONDUCTOR_SUBSTRATE_URL", substrate.base_url)
    monkeypatch.setenv("CONDUCTOR_FLEET_TOKEN", FLEET_TOKEN)
    monkeypatch.setenv("CONDUCTOR_EXECUTOR_TOKEN", EXECUTOR_TOKEN)
    monkeypatch.setenv("CONDUCTOR_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CONDUCTOR_TASK_QUEUE", f"built-{uuid.uuid4().hex[:8]}")
    config = WorkerConfig.from_env()
    assert config.fleet_url == config.executor_url == substrate.base_url
    input = workload(child("echo partial; echo oops >&2; exit 3"))
    async with build_worker(dev_env.client, config, workflow_failure_exception_types=[Exception]):
        handle = await start(dev_env.client, config.task_queue, input)
        result = await failed_result(handle)
    assert result.verdict == "failed"
    final = result.observation
    assert final.observed_state == "failed" and final.exit_classification == "failure"
    # As the real server projects a failed task (fleet.rs, project_task_observation): the code is
    # the fleet's, the exit status is in the task's status and its stderr in a `log` artifact.
    assert final.error_code == "fleet.task_failed"
    assert "log" in {artifact.kind for artifact in final.artifacts}
    assert final.output == "partial\n"  # what it wrote before failing reaches the ledger, from its logs


async def test_a_daemon_is_followed_until_cancelled_then_its_process_is_gone(
    dev_env: WorkflowEnvironment, fleet_activities: FleetActivities, substrate: RunningSubstrate, tmp_path: Path
):
    client = dev_env.client
    pid_file = tmp_path / "daemon.pid"
    # Small history limit and short watches: the daemon is carried across continue-as-new.
    input = workload(
        child(f"echo $$ > {pid_file}; exec sleep 120", kind="daemon"), max_history_events=40, watch_max_seconds=0.3
    )
    async with workload_worker(client, fleet_activities) as task_queue:
        parent, child_workflow_id = await start_parent(client, task_queue, input)
        child_handle = client.get_workflow_handle(child_workflow_id)

        async def healthy():
            seen = await parent.query(WorkloadParentProbe.observations)
            return [o for o in seen if o.observed_state == "healthy" and o.health == "healthy"]

        await eventually(healthy, "the daemon reported healthy", within=20)
        pid = await read_pid(pid_file)

        async def continued_as_new():
            description = await child_handle.describe()
            return description.run_id != description.raw_description.workflow_execution_info.first_run_id

        await eventually(continued_as_new, "the workload continued as new", within=20)
        assert (await child_handle.describe()).status == WorkflowExecutionStatus.RUNNING
        assert not process_gone(pid)
        first_run_id = (await child_handle.describe()).raw_description.workflow_execution_info.first_run_id
        first_run = client.get_workflow_handle(child_workflow_id, run_id=first_run_id)
        watches = [a for a in await scheduled_activities(first_run) if a.activity_type.name == "watch_workload"]
        assert watches and all(a.heartbeat_timeout.ToTimedelta().total_seconds() > 0 for a in watches)

        await parent.signal(WorkloadParentProbe.cancel_child)
        outcome: ParentOutcome = await parent.result()

    assert outcome.child_cancelled and outcome.result is None
    assert (await child_handle.describe()).status == WorkflowExecutionStatus.CANCELED
    last = outcome.observations[-1]
    assert last.observed_state == "cancelled" and last.exit_classification == "cancelled"
    revisions = [o.revision for o in outcome.observations]
    assert revisions == sorted(set(revisions))
    # The command runs in a session of its own under the substrate's wrapper (it outlives a
    # substrate restart), so it may linger as a zombie until init reaps it: dead is what counts.
    await eventually(lambda: asyncio.to_thread(process_dead, pid), "the daemon's process dead", within=10)
    tasks = substrate_tasks(substrate, fleet_child_id(input.mission_id, input.child.child_id))
    assert [t["state"] for t in tasks] == ["canceled"]
    await assert_replays(parent, first_run, child_handle)


async def test_a_second_run_of_the_same_workload_re_adopts_the_bound_task(
    dev_env: WorkflowEnvironment, fleet_activities: FleetActivities, substrate: RunningSubstrate
):
    client = dev_env.client
    input = workload(child("sleep 1.5; echo again"))
    async with workload_worker(client, fleet_activities) as task_queue:
        first = await start(client, task_queue, input, workflow_id=f"first:{input.child.child_id}")

        async def bound():
            return substrate_tasks(substrate, fleet_child_id(input.mission_id, input.child.child_id))

        await eventually(bound, "the first run's task on the substrate", within=20)
        # The first run disappears without cleaning up, as after a lost worker or an operator's terminate.
        await first.terminate("simulated loss of the first run")
        second = await start(client, task_queue, input, workflow_id=f"second:{input.child.child_id}")
        result: WorkloadResult = await second.result()

    assert result.verdict == "satisfied" and result.observation.output == "again\n"
    tasks = substrate_tasks(substrate, fleet_child_id(input.mission_id, input.child.child_id))
    assert len(tasks) == 1 and result.task_id == tasks[0]["task_id"]
    # The first run dispatched (the substrate has its task; as local activities its calls may never
    # reach its history if it dies mid-task); the second found the task bound and only followed it.
    second_calls = await activity_calls(second)
    # It admitted (an identical replay) and found the task bound: the one call that starts a
    # workload dispatched nothing, and nothing else dispatched either.
    assert second_calls[0][0] == "admit_and_dispatch" and second_calls[0][1]["task"] is None
    assert second_calls[0][1]["replayed"] and second_calls[0][1]["record"]["lineage"]["task_id"] == tasks[0]["task_id"]
    assert not {"dispatch_task", "dispatch_and_read"} & {name for name, _ in second_calls}
    await assert_replays(second)


async def test_a_persistent_agent_is_satisfied_while_running_and_binds_its_session(
    dev_env: WorkflowEnvironment, fleet_activities: FleetActivities
):
    client = dev_env.client
    input = workload(child("sleep 1; echo done", kind="persistent-agent"))
    async with workload_worker(client, fleet_activities) as task_queue:
        parent, _ = await start_parent(client, task_queue, input)

        async def retained():
            seen = await parent.query(WorkloadParentProbe.observations)
            return seen and seen[-1].observed_state == "retained"

        # An agent whose task completed is `retained` (fleet.rs, project_task_observation): its
        # session is kept, it stays satisfied, and it is followed until its mission lets it go.
        await eventually(retained, "the agent retained", within=20)
        seen = await parent.query(WorkloadParentProbe.observations)
        await parent.signal(WorkloadParentProbe.cancel_child)
        outcome: ParentOutcome = await parent.result()
    states = [o.observed_state for o in seen]
    assert "running" in states and states[-1] == "retained"
    final = seen[-1]
    assert final.output == "done\n" and final.lineage is not None and final.lineage.session_id is not None
    assert outcome.child_cancelled


async def test_the_conductor_runs_the_verifier_in_the_childs_context_and_records_its_evidence(
    dev_env: WorkflowEnvironment, fleet_activities: FleetActivities, substrate: RunningSubstrate
):
    """The real server produces only `log` and `result` evidence (fleet.rs,
    `project_task_observation`), so the conductor runs a verifier as a task of its own, in the
    context the child ran in, and writes its outcome onto the record with an observation."""
    client = dev_env.client
    passing = workload(child("echo 42 > answer.txt; echo wrote", verifier="grep -q 42 answer.txt && echo checked",
                             required_evidence=["result", "verifier"]))  # fmt: skip
    failing = workload(child("echo 41 > answer.txt", verifier="grep -q 42 answer.txt", required_evidence=["verifier"]))
    async with workload_worker(client, fleet_activities) as task_queue:
        good = await start(client, task_queue, passing)
        bad = await start(client, task_queue, failing)
        result = await good.result()
        failed = await failed_result(bad)

    assert result.verdict == "satisfied" and result.missing_evidence == []
    final = result.observation
    assert final.observed_state == "succeeded" and final.output == "wrote\n"
    verifier = [a for a in final.artifacts if a.kind == "verifier"]
    assert len(verifier) == 1
    verifier_task = verifier[0].uri.removeprefix("sandbox://tasks/").removesuffix("/status")
    assert verifier_task != result.task_id  # a task of its own, not the child's
    assert final.note is not None and "passed" in final.note and verifier_task in final.note
    async with ExecutorClient(substrate.base_url, EXECUTOR_TOKEN) as executor:
        ran = await executor.get_task("local-1", verifier_task)
        assert ran.status.state == "completed" and ran.context_id == f"{passing.mission_id}:{passing.child.child_id}:context"
    # The evidence is on the substrate's record too: an observation the real server keeps, since
    # it projects nothing over a record that has ended.
    record = await fleet_activities.get_workload(WorkloadRef(child_id=fleet_child_id(passing.mission_id, passing.child.child_id)))
    assert [a.uri for a in record.status.artifacts if a.kind == "verifier"] == [verifier[0].uri]

    assert failed.verdict == "failed"
    ended = failed.observation
    assert (ended.observed_state, ended.error_code) == ("failed", "conductor.verifier_failed")
    assert "verifier" in {a.kind for a in ended.artifacts}  # the failed check is evidence too
    assert ended.note is not None and "did not pass" in ended.note
    calls = [name for name, _ in await activity_calls(good)]
    assert calls.count("run_verifier") == 1
    await assert_replays(good, bad)


async def test_a_refused_dispatch_ends_the_workload_failed_with_the_server_code(
    dev_env: WorkflowEnvironment, fleet_activities: FleetActivities
):
    client = dev_env.client
    input = workload(child("echo never", runtime_kind="vm"))  # the local substrate offers host isolation only
    async with workload_worker(client, fleet_activities) as task_queue:
        result = await failed_result(await start(client, task_queue, input))
    assert result.verdict == "failed" and result.task_id is None
    final = result.observation
    assert final.observed_state == "failed" and final.error_code == "executor.isolation_unsupported"
    assert final.note is not None and "vm" in final.note and final.revision == 2


async def test_a_refused_admission_is_reported_as_failed_at_revision_zero(
    dev_env: WorkflowEnvironment, fleet_activities: FleetActivities
):
    client = dev_env.client
    taken = child("echo first")
    async with workload_worker(client, fleet_activities) as task_queue:
        first = workload(taken)
        ok: WorkloadResult = await (await start(client, task_queue, first)).result()
        # The same mission's child asked for again with a different record: the fleet refuses it.
        # (The prompt travels in the dispatch, not the record: change what the record holds.)
        other_budget = taken.budgets.model_copy(update={"timeout_seconds": taken.budgets.timeout_seconds + 1})
        clash = workload(taken.model_copy(update={"budgets": other_budget}), mission=first.mission_id)
        parent, _ = await start_parent(client, task_queue, clash)
        outcome: ParentOutcome = await parent.result()
    assert ok.verdict == "satisfied"
    assert outcome.result is not None and outcome.result.verdict == "failed"
    [observation] = outcome.observations
    assert observation.revision == 0 and observation.error_code == "fleet.idempotency_collision"
    assert observation.note is not None and "admission refused" in observation.note


async def test_an_unavailable_substrate_is_retried_until_it_answers(
    dev_env: WorkflowEnvironment, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    client = dev_env.client
    port = free_port("127.0.0.1")
    url = f"http://127.0.0.1:{port}"
    fleet = FleetActivities(url, url, FLEET_TOKEN, EXECUTOR_TOKEN)
    input = workload(child("echo late"))
    try:
        async with workload_worker(client, fleet) as task_queue:
            handle = await start(client, task_queue, input)

            # The calls are local activities: their retries show in the worker's log, not in
            # the server's pending activities.
            async def failed_again():
                return [
                    details for record in caplog.records
                    if (details := getattr(record, "temporal_activity", None)) is not None
                    and details["workflow_id"] == handle.id and details["attempt"] >= 2
                    and record.exc_info and "http.unreachable" in str(record.exc_info[1])
                ]

            retried = await eventually(failed_again, "a retried admit_and_dispatch call", within=20)
            assert retried[0]["activity_type"] == "admit_and_dispatch"
            with serve_in_thread(substrate_config(tmp_path / "late", port=port)):
                result: WorkloadResult = await handle.result()
    finally:
        await fleet.aclose()
    assert result.verdict == "satisfied" and result.observation.output == "late\n"


def admit_and_dispatch_that_finishes_despite_cancellation(
    fleet: FleetActivities, reached: asyncio.Event
) -> Callable[[AdmitAndDispatch], Awaitable[AdmittedAndDispatched]]:
    """`admit_and_dispatch` as a call whose work is already under way when the workflow is
    cancelled: it takes the cancellation, then completes all the same (the real call), so the
    workflow's await returns a result and the cancellation is spent."""

    @activity.defn(name=ADMIT_AND_DISPATCH)
    async def admit_and_dispatch(request: AdmitAndDispatch) -> AdmittedAndDispatched:
        reached.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return await fleet.admit_and_dispatch(request)
        raise ApplicationError("the workflow's cancellation never reached the call", non_retryable=True)

    return admit_and_dispatch


async def test_a_cancellation_that_a_completed_call_swallowed_still_stops_the_task(
    dev_env: WorkflowEnvironment, fleet_activities: FleetActivities, substrate: RunningSubstrate
):
    """Cancelled while its first call is in flight, and the call completes anyway: the workload
    must not go on to watch its `sleep 60` to the end (as it did under fail-fast), but cancel it."""
    client = dev_env.client
    reached = asyncio.Event()
    activities = [
        admit_and_dispatch_that_finishes_despite_cancellation(fleet_activities, reached) if a == fleet_activities.admit_and_dispatch else a
        for a in fleet_activities.activities()
    ]
    input = workload(child("sleep 60"))
    task_queue = f"workload-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=task_queue, workflows=[WorkloadWorkflow], activities=activities,
                      workflow_failure_exception_types=[Exception]):
        handle = await start(client, task_queue, input)
        await asyncio.wait_for(reached.wait(), timeout=20)
        await handle.cancel()
        with pytest.raises(WorkflowFailureError) as failure:
            await asyncio.wait_for(handle.result(), timeout=20)
    assert is_cancelled_exception(failure.value.cause)
    [task] = substrate_tasks(substrate, fleet_child_id(input.mission_id, input.child.child_id))
    assert task["state"] == "canceled"
    assert not {"watch_workload"} & {name for name, _ in await activity_calls(handle)}
