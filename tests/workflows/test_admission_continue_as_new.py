"""Continue-as-new under a burst of signals, on the real dev server (suggestion threshold lowered)."""

from __future__ import annotations

import random
from collections import Counter
from datetime import datetime, timedelta, timezone

from temporalio.client import Client, WorkflowQueryFailedError

from activities.admission import signal_with_start_admission
from activities.audit_store import AuditStore
from tests.support.admission_harness import admission_harness
from tests.support.decision_sink import DecisionSinkWorkflow
from workflows.admission import engine
from workflows.admission.messages import RESTORING, AdmissionDecision, CancelBatch, LeaseRow, QueueRow, SubmitBatch
from workflows.admission.model import AdmissionPolicy, AdmissionRequest, Cancel, Submit


async def test_burst_across_several_continue_as_new_rounds_loses_and_repeats_nothing(dev_client: Client, tmp_path):
    # Long TTL and aging so that workflow time cannot change any decision: the outcome is a
    # pure function of the order of operations, which the engine can recompute offline.
    policy = AdmissionPolicy(
        max_concurrent=40, environment_quotas={"prod": 10}, lease_ttl_seconds=86_400, aging_interval_seconds=86_400,
    )
    rng = random.Random(7)
    base = datetime.now(timezone.utc)  # workflow time on the dev server is real time
    requests = [
        AdmissionRequest(
            request_id=f"req-{i:04d}", orchestrator_id="burst", environment=rng.choice(["prod", "dev", "dev"]),
            provider="local", runtime_kind="container", priority=rng.randrange(5),
            submitted_at=base + timedelta(seconds=i), queue_timeout_seconds=86_400,
        )
        for i in range(300)
    ]
    cancelled = {f"req-{index - 16:04d}" for index in range(300) if index % 17 == 16}

    async with admission_harness(dev_client, tmp_path, policy, workflows_extra=[DecisionSinkWorkflow]) as h:
        sink = await dev_client.start_workflow(
            DecisionSinkWorkflow.run, id=f"sink-{h.host_group}", task_queue=h.config.task_queue,
        )
        h.started.append(sink)
        operations = []
        for index, request in enumerate(requests):
            await signal_with_start_admission(
                dev_client, h.config.task_queue, h.host_group, policy, "submit",
                SubmitBatch(requester=sink.id, requests=[request]), max_history_events=400,
                restore_records_per_task=RESTORE_SLICE,
            )
            operations.append(Submit(request=request))
            if index % 17 == 16:  # cancel an earlier one mid-burst
                victim = f"req-{index - 16:04d}"
                assert victim in cancelled
                await h.admission.signal("cancel", CancelBatch(requester=sink.id, request_ids=[victim]))
                operations.append(Cancel(request_id=victim))

        async def settled() -> dict[str, AdmissionDecision] | None:
            decisions = await sink.query(DecisionSinkWorkflow.decisions)
            return decisions if len(decisions) == len(requests) and not any(
                d.request_id in cancelled and d.state != "cancelled" for d in decisions.values()
            ) else None

        decisions = await h.eventually(settled, "every request decided", within=120)

        # Several runs happened: the chain continued-as-new while signals kept arriving.
        runs = 0
        async for execution in dev_client.list_workflows(f"WorkflowId = '{h.admission.id}'"):
            runs += 1
        assert runs >= 3, f"expected several continue-as-new rounds, saw {runs} runs"
        # Each continued run decoded what it carried a slice per workflow task, before any pass.
        restores = [await _restore_breaks(dev_client, h.admission.id, execution.run_id)
                    async for execution in dev_client.list_workflows(f"WorkflowId = '{h.admission.id}'")]
        assert sorted(restores)[-1] >= 3, f"no run restored its carried records in slices of {RESTORE_SLICE}: {restores}"

        # The same operations through the engine offline give the same leases and queue.
        state = engine.new_state(policy)
        for operation in operations:
            state, _, _ = engine.apply(state, operation, base + timedelta(hours=1))
        expected_leases = sorted(state.admitted)
        expected_queue = [rec.request_id for rec in engine.queued_in_order(state)]
        leases = await h.eventually(lambda: _answered(h, "leases", list[LeaseRow]), "the leases query, once restored")
        queue = await _answered(h, "queue", list[QueueRow])
        assert sorted(row.request_id for row in leases) == expected_leases
        assert [row.request_id for row in queue] == expected_queue
        assert {rid for rid, d in decisions.items() if d.state == "admitted"} == set(expected_leases)

        # Every request was queued exactly once, admitted at most once, and no audit event repeats.
        events = await h.eventually(lambda: _full_audit(h, len(requests)), "audit export", within=60)
        queued = Counter(e.request_id for e in events if e.type == "queued")
        admitted = Counter(e.request_id for e in events if e.type == "admitted")
        assert set(queued.values()) == {1} and len(queued) == len(requests)
        assert set(admitted.values()) <= {1}
        assert [e.seq for e in events] == list(range(1, len(events) + 1))


async def _answered(h, query: str, result_type):
    """The query's answer, or None while a continued run still restores (it says so)."""
    try:
        return await h.admission.query(query, result_type=result_type)
    except WorkflowQueryFailedError as error:
        assert RESTORING in str(error), error
        return None


LOCAL_ACTIVITY_MARKER = "core_local_activity"  # how the SDK records a local activity in history
RESTORE_SLICE = 7  # records per workflow task, so a continued run restores in several


async def _restore_breaks(client: Client, workflow_id: str, run_id: str) -> int:
    """The local activities a run ran between slices of its restore, all before it decided anything."""
    history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
    breaks, decided = 0, False
    for event in history.events:
        decided = decided or event.HasField("signal_external_workflow_execution_initiated_event_attributes")
        if event.marker_recorded_event_attributes.marker_name == LOCAL_ACTIVITY_MARKER:  # the singleton's only one
            assert not decided, "a restore slice after the run had begun to decide"
            breaks += 1
    return breaks


async def _full_audit(h, expected_requests: int):
    events = AuditStore(h.config.audit_db).events(h.host_group)
    queued = {e.request_id for e in events if e.type == "queued"}
    contiguous = [e.seq for e in events] == list(range(1, len(events) + 1))
    return events if len(queued) == expected_requests and contiguous else None


async def test_a_history_heavy_in_bytes_continues_as_new_before_its_event_count_says_so(dev_client: Client, tmp_path):
    """Five submits of a hundred requests with long ids: about fifty events, far below any event
    threshold, but over `max_history_bytes` (here its minimum, 100 kB). The singleton must hand
    over on size, and hand over everything."""
    policy = AdmissionPolicy(max_concurrent=1000, lease_ttl_seconds=86_400)
    async with admission_harness(dev_client, tmp_path, policy, workflows_extra=[DecisionSinkWorkflow]) as h:
        await _heavy_burst(dev_client, h, policy)
        runs = [run async for run in dev_client.list_workflows(f"WorkflowId = '{h.admission.id}'")]
        assert len(runs) == 1, "under the default limit (2 MB) this burst needs no hand-over"

    async with admission_harness(dev_client, tmp_path, policy, workflows_extra=[DecisionSinkWorkflow]) as h:
        ids = await _heavy_burst(dev_client, h, policy, max_history_bytes=100_000)

        async def handed_over():  # once its outbound work settled
            runs = [run async for run in dev_client.list_workflows(f"WorkflowId = '{h.admission.id}'")]
            return runs if len(runs) >= 2 else None

        runs = await h.eventually(handed_over, "a continue-as-new on size", within=30)
        histories = [await dev_client.get_workflow_handle(h.admission.id, run_id=run.run_id).fetch_history() for run in runs]
        assert all(len(history.events) < 100 for history in histories), "it must have been the size, not the count"
        leases = await h.admission.query("leases", result_type=list[LeaseRow])
        assert sorted(row.request_id for row in leases) == sorted(ids)


async def _heavy_burst(client: Client, h, policy: AdmissionPolicy, **limits: int) -> list[str]:
    """Five batches of a hundred requests with 200-character ids; returns once every one is admitted."""
    sink = await client.start_workflow(DecisionSinkWorkflow.run, id=f"sink-{h.host_group}", task_queue=h.config.task_queue)
    h.started.append(sink)
    base = datetime.now(timezone.utc)
    ids = []
    for batch in range(5):
        requests = [
            AdmissionRequest(
                request_id=f"{'x' * 200}-{batch}-{i:03d}", orchestrator_id="heavy", environment="dev", provider="local",
                runtime_kind="container", priority=0, submitted_at=base, queue_timeout_seconds=86_400,
            )
            for i in range(100)
        ]
        ids += [request.request_id for request in requests]
        await signal_with_start_admission(
            client, h.config.task_queue, h.host_group, policy, "submit", SubmitBatch(requester=sink.id, requests=requests),
            **limits,
        )
    await h.eventually(lambda: _all_decided(sink, ids), "every request decided", within=60)
    return ids


async def _all_decided(sink, ids: list[str]) -> bool:
    decisions = await sink.query(DecisionSinkWorkflow.decisions)
    return all(decisions.get(rid) is not None and decisions[rid].state == "admitted" for rid in ids)
