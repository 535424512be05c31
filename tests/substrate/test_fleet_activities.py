"""The fleet activities against a real local substrate over loopback HTTP (no Temporal server needed)."""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.fleet import FleetActivities
from substrate.server import RunningSubstrate
from worker.ports import free_port
from tests.support.substrate_fixtures import TOKENS, fleet_activities, substrate, substrate_tasks  # noqa: F401
from tests.support.substrate_support import EXECUTOR_TOKEN, FLEET_TOKEN, make_record
from workflows.contract import WorkloadRecord
from workflows.workload.messages import (
    AdmitAndDispatch,
    AdmitWorkload,
    DispatchTask,
    DispatchAndRead,
    ObserveWorkload,
    RuntimeIdentityUpdate,
    TaskDispatch,
    TaskRef,
    WatchWorkload,
    WorkloadRef,
)
from workflows.workload.record import next_status

pytestmark = pytest.mark.timeout(60)


def new_child(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def run(fn, *args):
    return await ActivityEnvironment().run(fn, *args)


async def admitted(fleet: FleetActivities, child_id: str, kind: str = "one-shot-command", **options) -> WorkloadRecord:
    result = await run(fleet.admit_workload, AdmitWorkload(record=make_record(child_id, kind, **options)))
    return result.record


async def dispatch(fleet: FleetActivities, child_id: str, prompt: str, kind: str = "one-shot-command"):
    """Dispatch and bind (the executor binds nothing: `dispatch_and_read` binds by observation)."""
    request = DispatchTask(
        instance_id="local-1",
        dispatch=TaskDispatch(message_id=f"{child_id}:dispatch", child_id=child_id, kind=kind, prompt=prompt),
    )
    return (await run(fleet.dispatch_and_read, DispatchAndRead(dispatch=request, child_id=child_id))).task


async def wait_state(fleet: FleetActivities, child_id: str, state: str) -> WorkloadRecord:
    for _ in range(500):
        record = await run(fleet.get_workload, WorkloadRef(child_id=child_id))
        if record.status.observed_state == state:
            return record
        await asyncio.sleep(0.02)
    raise AssertionError(f"{child_id} never reached {state}; last: {record.status.observed_state}")


def assert_no_token(*texts: str) -> None:
    for text in texts:
        for token in TOKENS:
            assert token not in text


async def test_list_targets_shows_every_instance(fleet_activities: FleetActivities):
    targets = (await run(fleet_activities.list_targets)).targets
    assert [t.id for t in targets] == ["local-1", "local-2", "local-3", "local-4"]
    first = targets[0]
    # The real instance list names no executor apart from the instance (sandbox_client.target_for).
    assert first.executor_id == "local-1" and first.isolation_kinds == ["host"] and first.status == "ready"
    assert first.runtime_id == "host:local-shell-1"
    assert "daemon" in first.workload_kinds


async def test_admit_is_idempotent_for_an_identical_record(fleet_activities: FleetActivities):
    child = new_child("admit")
    record = make_record(child)
    first = await run(fleet_activities.admit_workload, AdmitWorkload(record=record))
    again = await run(fleet_activities.admit_workload, AdmitWorkload(record=record))
    assert (first.replayed, first.record.status.observed_state, first.record.status.revision) == (False, "admitted", 1)
    assert again.replayed is True and again.record == first.record


async def test_rejections_are_non_retryable_and_typed_with_the_server_code(fleet_activities: FleetActivities):
    child = new_child("bad")
    record = make_record(child)
    wrong = record.model_copy(update={"status": record.status.model_copy(update={"revision": 1})})
    with pytest.raises(ApplicationError) as invalid:
        await run(fleet_activities.admit_workload, AdmitWorkload(record=wrong))
    assert invalid.value.non_retryable and invalid.value.type == "fleet.invalid_record"
    assert "revision 0" in invalid.value.message

    with pytest.raises(ApplicationError) as missing:
        await run(fleet_activities.get_workload, WorkloadRef(child_id=child))
    assert missing.value.non_retryable and missing.value.type == "fleet.workload_not_found"
    assert child in missing.value.message

    await admitted(fleet_activities, child)
    other = make_record(child, timeout_seconds=5)  # same child id, different content
    with pytest.raises(ApplicationError) as collision:
        await run(fleet_activities.admit_workload, AdmitWorkload(record=other))
    assert collision.value.non_retryable and collision.value.type == "fleet.idempotency_collision"


async def test_wrong_token_says_which_variable_to_fix_without_showing_any_token(
    substrate: RunningSubstrate, caplog: pytest.LogCaptureFixture
):
    wrong = FleetActivities(substrate.base_url, substrate.base_url, "not-the-fleet-token", "not-the-executor-token")
    caplog.set_level(logging.DEBUG)
    try:
        with pytest.raises(ApplicationError) as refused:
            await run(wrong.get_workload, WorkloadRef(child_id="anything"))
        with pytest.raises(ApplicationError) as refused_task:
            await run(wrong.read_output, TaskRef(instance_id="local-1", task_id="task-x"))
    finally:
        await wrong.aclose()
    assert refused.value.type == "auth.unauthorized" and refused.value.non_retryable
    assert "CONDUCTOR_FLEET_TOKEN" in refused.value.message
    assert refused_task.value.type == "auth.unauthorized" and "CONDUCTOR_EXECUTOR_TOKEN" in refused_task.value.message
    for text in (refused.value.message, refused_task.value.message, caplog.text):
        assert "not-the-fleet-token" not in text and "not-the-executor-token" not in text
        assert_no_token(text)


async def failed_get(fleet: FleetActivities) -> ApplicationError:
    """How `get_workload` fails against a substrate that cannot answer (the fleet is closed after)."""
    try:
        with pytest.raises(ApplicationError) as failed:
            await run(fleet.get_workload, WorkloadRef(child_id="anything"))
    finally:
        await fleet.aclose()
    return failed.value


async def test_unavailable_substrate_is_a_retryable_error():
    down = FleetActivities(f"http://127.0.0.1:{free_port('127.0.0.1')}", f"http://127.0.0.1:{free_port('127.0.0.1')}", FLEET_TOKEN, EXECUTOR_TOKEN)
    unavailable = await failed_get(down)
    assert unavailable.non_retryable is False and unavailable.type == "http.unreachable"
    assert "unavailable" in unavailable.message
    assert_no_token(unavailable.message)


async def test_a_substrate_that_never_answers_is_a_retryable_timeout_named_as_one():
    with socket.socket() as listener:  # accepts connections (the kernel's backlog) and never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        timeout = await failed_get(FleetActivities(url, url, FLEET_TOKEN, EXECUTOR_TOKEN, http_timeout=0.3))
    assert timeout.non_retryable is False and timeout.type == "http.timeout"
    assert "GET /api/v2/fleet/workloads/anything timed out" in timeout.message


async def test_a_worker_without_tokens_fails_activities_with_the_fix():
    unconfigured = FleetActivities.from_environment("http://127.0.0.1:1", "http://127.0.0.1:1", environ={})
    assert not unconfigured.configured
    with pytest.raises(ApplicationError) as missing:
        await run(unconfigured.list_targets)
    assert missing.value.type == "credentials.missing" and missing.value.non_retryable
    assert "CONDUCTOR_FLEET_TOKEN" in missing.value.message


async def test_observe_is_compare_and_swap_and_returns_the_current_record_when_stale(fleet_activities: FleetActivities):
    child = new_child("cas")
    record = await admitted(fleet_activities, child)
    status = next_status(record, record.status.last_seen, observed_state="starting")
    applied = await run(
        fleet_activities.observe_workload,
        ObserveWorkload(child_id=child, expected_revision=1, status=status,
                        runtime_identity=RuntimeIdentityUpdate(task_id="task-cas")),
    )  # fmt: skip
    assert applied.applied and applied.record.status.revision == 2 and applied.record.lineage.task_id == "task-cas"

    stale = await run(
        fleet_activities.observe_workload, ObserveWorkload(child_id=child, expected_revision=1, status=status)
    )
    assert stale.applied is False and stale.record == applied.record

    rebind = next_status(applied.record, record.status.last_seen)
    with pytest.raises(ApplicationError) as immutable:
        await run(
            fleet_activities.observe_workload,
            ObserveWorkload(child_id=child, expected_revision=2, status=rebind,
                            runtime_identity=RuntimeIdentityUpdate(task_id="task-other")),
        )  # fmt: skip
    assert immutable.value.type == "fleet.runtime_identity_immutable" and immutable.value.non_retryable


async def test_dispatch_is_idempotent_and_the_task_carries_the_output(
    fleet_activities: FleetActivities, substrate: RunningSubstrate
):
    child = new_child("dispatch")
    await admitted(fleet_activities, child)
    first = await dispatch(fleet_activities, child, "echo hello")
    second = await dispatch(fleet_activities, child, "echo hello")
    assert first.task_id == second.task_id and first.state in ("submitted", "working", "completed")
    assert [t["task_id"] for t in substrate_tasks(substrate, child)] == [first.task_id]

    await wait_state(fleet_activities, child, "succeeded")
    task = await run(fleet_activities.read_output, TaskRef(instance_id="local-1", task_id=first.task_id))
    # The output is read from the artifacts route, as the real executor serves it.
    assert task.output == "hello\n" and not task.output_truncated
    short = await run(fleet_activities.read_output, TaskRef(instance_id="local-1", task_id=first.task_id, max_output_chars=2))
    assert short.output == "he" and short.output_truncated

    # Cancelling a task that already ended is not an error: it is returned as it ended.
    ended = await run(fleet_activities.cancel_task, TaskRef(instance_id="local-1", task_id=first.task_id))
    assert ended.state == "completed"
    assert_no_token(task.model_dump_json(), ended.model_dump_json())


async def test_dispatch_and_read_returns_the_bound_record_and_an_ended_tasks_text(
    fleet_activities: FleetActivities, substrate: RunningSubstrate
):
    child = new_child("dispatch-read")
    await admitted(fleet_activities, child)
    request = DispatchAndRead(
        dispatch=DispatchTask(
            instance_id="local-1",
            dispatch=TaskDispatch(message_id=f"{child}:dispatch", child_id=child, kind="one-shot-command", prompt="sleep 0.5; echo late"),
        ),
        child_id=child,
    )
    running = await run(fleet_activities.dispatch_and_read, request)
    # The activity bound the task by observation; the task has not ended, so no text.
    assert running.record is not None and running.record.lineage.task_id == running.task.task_id
    assert running.output is None
    await wait_state(fleet_activities, child, "succeeded")
    # Sent again (a retry): the same task, and now the record names a result, so its text comes too.
    ended = await run(fleet_activities.dispatch_and_read, request)
    assert ended.task.task_id == running.task.task_id
    assert ended.output is not None and ended.output.output == "late\n"
    assert [t["task_id"] for t in substrate_tasks(substrate, child)] == [running.task.task_id]


async def test_dispatch_and_read_can_wait_for_a_short_task_to_end(
    fleet_activities: FleetActivities, substrate: RunningSubstrate
):
    child = new_child("dispatch-wait")
    await admitted(fleet_activities, child)
    dispatch = DispatchTask(
        instance_id="local-1",
        dispatch=TaskDispatch(message_id=f"{child}:dispatch", child_id=child, kind="one-shot-command", prompt="sleep 0.3; echo soon"),
    )
    ended = await run(fleet_activities.dispatch_and_read, DispatchAndRead(dispatch=dispatch, child_id=child, wait_for_end_seconds=4))
    # One call: dispatched, read again until the task ended, and its text read too.
    assert ended.record is not None and ended.record.status.observed_state == "succeeded"
    assert ended.output is not None and ended.output.output == "soon\n"


def admit_and_dispatch_request(child: str, instance_id: str = "local-1", **record_options) -> AdmitAndDispatch:
    dispatch = DispatchTask(
        instance_id=instance_id,
        dispatch=TaskDispatch(message_id=f"{child}:dispatch", child_id=child, kind="one-shot-command", prompt="echo started"),
    )
    return AdmitAndDispatch(record=make_record(child, **record_options), dispatch=DispatchAndRead(dispatch=dispatch, child_id=child))


async def test_admit_and_dispatch_starts_a_workload_once_and_a_retry_re_adopts_it(
    fleet_activities: FleetActivities, substrate: RunningSubstrate
):
    child = new_child("start")
    request = admit_and_dispatch_request(child)
    first = await run(fleet_activities.admit_and_dispatch, request)
    assert first.replayed is False and first.dispatch_refused is None
    assert first.task is not None and first.record.lineage.task_id == first.task.task_id  # read back, bound
    # A retry (its answer lost): the admission replays, finds the record bound, dispatches nothing.
    again = await run(fleet_activities.admit_and_dispatch, request)
    assert again.replayed is True and again.task is None
    assert again.record.lineage.task_id == first.task.task_id
    assert [t["task_id"] for t in substrate_tasks(substrate, child)] == [first.task.task_id]


async def test_admit_and_dispatch_returns_a_refused_dispatch_and_raises_a_refused_admission(
    fleet_activities: FleetActivities, substrate: RunningSubstrate
):
    child = new_child("refused")
    refused = await run(fleet_activities.admit_and_dispatch, admit_and_dispatch_request(child, instance_id="nowhere"))
    # Admitted, so the workflow can write the refusal onto the record; nothing was dispatched.
    assert refused.record.status.observed_state == "admitted" and refused.task is None
    assert refused.dispatch_refused is not None and refused.dispatch_refused.type == "instance.not_found"
    assert "nowhere" in refused.dispatch_refused.message and substrate_tasks(substrate, child) == []

    collision = admit_and_dispatch_request(child, timeout_seconds=5)  # same child id, different content
    with pytest.raises(ApplicationError) as error:
        await run(fleet_activities.admit_and_dispatch, collision)
    assert error.value.non_retryable and error.value.type == "fleet.idempotency_collision"


async def test_cancel_task_stops_a_running_daemon(fleet_activities: FleetActivities, substrate: RunningSubstrate):
    child = new_child("daemon")
    await admitted(fleet_activities, child, "daemon")
    task = await dispatch(fleet_activities, child, "exec sleep 60", kind="daemon")
    await wait_state(fleet_activities, child, "healthy")
    cancelled = await run(fleet_activities.cancel_task, TaskRef(instance_id="local-1", task_id=task.task_id))
    assert cancelled.state == "canceled"
    record = await run(fleet_activities.get_workload, WorkloadRef(child_id=child))
    assert record.status.observed_state == "cancelled"


async def test_watch_returns_the_next_revision_and_heartbeats_meanwhile(fleet_activities: FleetActivities):
    child = new_child("watch")
    await admitted(fleet_activities, child)
    env = ActivityEnvironment()
    beats: list[object] = []
    env.on_heartbeat = lambda *details: beats.append(details)
    watch = asyncio.ensure_future(
        env.run(fleet_activities.watch_workload, WatchWorkload(child_id=child, after_revision=1, poll_interval_seconds=0.05))
    )
    await asyncio.sleep(0.3)
    assert not watch.done() and beats and beats[-1] == (1,)
    await dispatch(fleet_activities, child, "echo watched")
    record = await asyncio.wait_for(watch, 10)
    assert record.status.revision > 1


async def test_watch_gives_up_after_max_wait_and_honours_cancellation(fleet_activities: FleetActivities):
    child = new_child("idle")
    await admitted(fleet_activities, child)
    unchanged = await run(
        fleet_activities.watch_workload,
        WatchWorkload(child_id=child, after_revision=1, poll_interval_seconds=0.05, max_wait_seconds=0.2),
    )
    assert unchanged.status.revision == 1

    env = ActivityEnvironment()
    beats: list[object] = []
    env.on_heartbeat = lambda *details: beats.append(details)
    watch = asyncio.ensure_future(
        env.run(fleet_activities.watch_workload, WatchWorkload(child_id=child, after_revision=1, poll_interval_seconds=0.05))
    )
    while not beats:
        await asyncio.sleep(0.02)
    env.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(watch, 5)


async def test_admit_and_dispatch_returns_a_rejected_task_as_a_refusal(fleet_activities: FleetActivities, substrate: RunningSubstrate):
    child = new_child("stopped")
    request = admit_and_dispatch_request(child)
    stopped = request.record.model_copy(update={"spec": request.record.spec.model_copy(update={"desired_state": "stopped"})})
    result = await run(fleet_activities.admit_and_dispatch, request.model_copy(update={"record": stopped}))
    assert result.task is None and result.dispatch_refused is not None
    assert result.dispatch_refused.type == "executor.task_rejected"
    assert "desired_state 'stopped'" in result.dispatch_refused.message
    assert [t["state"] for t in substrate_tasks(substrate, child)] == ["rejected"]


async def test_a_dispatch_rejected_because_another_bound_the_record_reads_back_that_binding(
    fleet_activities: FleetActivities,
):
    child = new_child("bound")
    await admitted(fleet_activities, child)
    first = await dispatch(fleet_activities, child, "sleep 5")
    other = DispatchTask(
        instance_id="local-1",
        dispatch=TaskDispatch(message_id=f"{child}:other", child_id=child, kind="one-shot-command", prompt="echo other"),
    )
    second = await run(fleet_activities.dispatch_and_read, DispatchAndRead(dispatch=other, child_id=child))
    assert second.task.state == "rejected" and second.record.lineage.task_id == first.task_id
    await run(fleet_activities.cancel_task, TaskRef(instance_id="local-1", task_id=first.task_id))
