"""AdmissionWorkflow + independent requester workflows on the time-skipping server.

Each test has a time-skipping server of its own. Time only skips while a test awaits a
result or sleeps, so the tests order
events explicitly: holders hold "forever" (HOLD) until the test signals `finish`,
and the test waits (in real time, through queries) for the state it needs.
"""

from __future__ import annotations

from temporalio.testing import WorkflowEnvironment

from activities.admission import signal_with_start_admission
from activities.audit_store import AuditStore
from tests.support.admission_harness import admission_harness
from workflows.admission.messages import LeaseRow, QueueRow, SubmitBatch
from workflows.admission.model import AdmissionPolicy, AdmissionRequest, AuditEvent
from workflows.admission.probe import ProbeRequest, ProbeResult

HOLD = 10 * 3600


def stored_audit(h, request_id: str | None = None):
    return AuditStore(h.config.audit_db).events(h.host_group, request_id)


async def audit_of(h, request_id: str | None = None):
    """The audit store once the export has caught up with the singleton: exports run in the
    background (one at a time), so an outcome a requester saw may not be stored yet."""

    async def caught_up() -> bool:
        latest = await h.query("audit", 1, result_type=list[AuditEvent])
        stored = stored_audit(h)
        return not latest or (bool(stored) and stored[-1].seq >= latest[-1].seq)

    await h.eventually(caught_up, "the audit export to catch up")
    return stored_audit(h, request_id)


async def silent_lease_expires_with_a_waiter(h) -> ProbeResult:
    """"silent" takes the only place and never renews; "waiter" queues behind it. Returns what
    "silent" saw once its lease expired and both requesters finished."""
    silent = await h.start_probe("silent", ProbeRequest(request_id="silent"), hold_seconds=HOLD, renew=False)
    await h.until_leased("silent")
    waiter = await h.start_probe("waiter", ProbeRequest(request_id="waiter"), hold_seconds=10)
    await h.until_queued("waiter")
    silent_result: ProbeResult = await silent.result()
    await waiter.result()
    return silent_result


async def admitted_order(h) -> list[str]:
    return [e.request_id for e in await audit_of(h) if e.type == "admitted"]


async def test_requesters_share_one_admission_workflow_serialised(fresh_time_skipping_env: WorkflowEnvironment, tmp_path):
    policy = AdmissionPolicy(max_concurrent=1, lease_ttl_seconds=60)
    async with admission_harness(fresh_time_skipping_env.client, tmp_path, policy) as h:
        first = await h.start_probe("a", ProbeRequest(request_id="a"), hold_seconds=HOLD)
        await h.until_leased("a")
        second = await h.start_probe("b", ProbeRequest(request_id="b"), hold_seconds=600)
        await h.until_queued("b")
        await fresh_time_skipping_env.sleep(600)  # a holds across ten TTLs by renewing
        assert await h.leased() == ["a"]
        await first.signal("finish")
        a: ProbeResult = await first.result()
        b: ProbeResult = await second.result()
        assert a.ever_admitted == ["a"] and b.ever_admitted == ["b"]
        assert a.final["a"].state == "released" and b.final["b"].state == "released"
        assert a.final["a"].lease_revision > 5
        queued = [d for d in b.history if d.state == "queued"]
        assert queued[0].binding_constraint == "global 1/1" and queued[0].position == 1
        events = await audit_of(h)
        assert [e.type for e in events if e.request_id == "b"][:2] == ["queued", "admitted"]
        assert [e.seq for e in events] == list(range(1, len(events) + 1))


async def test_environment_quota_serialises_prod_but_not_dev(fresh_time_skipping_env, tmp_path):
    policy = AdmissionPolicy(max_concurrent=5, environment_quotas={"prod": 1})
    async with admission_harness(fresh_time_skipping_env.client, tmp_path, policy) as h:
        p1 = await h.start_probe("p1", ProbeRequest(request_id="p1", environment="prod"), hold_seconds=HOLD)
        await h.until_leased("p1")
        p2 = await h.start_probe("p2", ProbeRequest(request_id="p2", environment="prod"), hold_seconds=10)
        await h.start_probe("d1", ProbeRequest(request_id="d1", environment="dev"), hold_seconds=HOLD)
        await h.until_queued("p2")
        await h.until_leased("p1", "d1")
        await p1.signal("finish")
        p2_result: ProbeResult = await p2.result()
        wait = [d for d in p2_result.history if d.state == "queued"][0]
        assert wait.binding_constraint == "environment prod 1/1"
        assert wait.backpressure is not None and wait.backpressure.reason == "capacity" and wait.backpressure.retryable
        assert await admitted_order(h) == ["p1", "d1", "p2"]


async def test_aging_lets_an_old_low_priority_request_beat_a_new_high_one(fresh_time_skipping_env, tmp_path):
    policy = AdmissionPolicy(max_concurrent=1, aging_interval_seconds=30)
    async with admission_harness(fresh_time_skipping_env.client, tmp_path, policy) as h:
        holder = await h.start_probe("holder", ProbeRequest(request_id="holder"), hold_seconds=HOLD)
        await h.until_leased("holder")
        old_low = await h.start_probe("old", ProbeRequest(request_id="old-low", priority=0), hold_seconds=10)
        await h.until_queued("old-low")
        await fresh_time_skipping_env.sleep(100)  # old-low ages to effective priority 3
        new_high = await h.start_probe("new", ProbeRequest(request_id="new-high", priority=2), hold_seconds=10)
        await h.until_queued("new-high")
        queue = await h.admission.query("queue", result_type=list[QueueRow])
        assert [(row.request_id, row.effective_priority) for row in queue] == [("old-low", 3), ("new-high", 2)]
        await holder.signal("finish")
        for handle in (holder, old_low, new_high):
            await handle.result()
        assert await admitted_order(h) == ["holder", "old-low", "new-high"]


async def test_fifo_among_equal_priorities(fresh_time_skipping_env, tmp_path):
    policy = AdmissionPolicy(max_concurrent=1)
    async with admission_harness(fresh_time_skipping_env.client, tmp_path, policy) as h:
        holder = await h.start_probe("holder", ProbeRequest(request_id="holder"), hold_seconds=HOLD)
        await h.until_leased("holder")
        waiters = []
        for name in ("w1", "w2", "w3"):
            waiters.append(await h.start_probe(name, ProbeRequest(request_id=name), hold_seconds=5))
            await h.until_queued(name)
        await holder.signal("finish")
        for handle in waiters:
            await handle.result()
        assert await admitted_order(h) == ["holder", "w1", "w2", "w3"]


async def test_preemption_is_delivered_to_the_victims_workflow(fresh_time_skipping_env, tmp_path):
    policy = AdmissionPolicy(max_concurrent=1, allow_preemption=True)
    async with admission_harness(fresh_time_skipping_env.client, tmp_path, policy) as h:
        victim = await h.start_probe("victim", ProbeRequest(request_id="batch", preemptible=True), hold_seconds=HOLD)
        await h.until_leased("batch")
        urgent = await h.start_probe("urgent", ProbeRequest(request_id="urgent", priority=10), hold_seconds=30)
        victim_result: ProbeResult = await victim.result()  # returns as soon as it learns it lost the lease
        await urgent.result()
        final = victim_result.final["batch"]
        assert final.state == "preempted" and final.related_request_id == "urgent"
        assert "preempted" in final.happened
        assert await admitted_order(h) == ["batch", "urgent"]


async def test_non_preemptible_work_is_never_preempted(fresh_time_skipping_env, tmp_path):
    policy = AdmissionPolicy(max_concurrent=1, allow_preemption=True)
    async with admission_harness(fresh_time_skipping_env.client, tmp_path, policy) as h:
        holder = await h.start_probe("holder", ProbeRequest(request_id="steady"), hold_seconds=HOLD)
        await h.until_leased("steady")
        urgent = await h.start_probe("urgent", ProbeRequest(request_id="urgent", priority=100), hold_seconds=5)
        await h.until_queued("urgent")
        await fresh_time_skipping_env.sleep(300)
        assert await h.leased() == ["steady"]
        await holder.signal("finish")
        await urgent.result()
        assert "preempted" not in [e.type for e in await audit_of(h)]


async def test_renewals_keep_a_lease_for_hours(fresh_time_skipping_env, tmp_path):
    policy = AdmissionPolicy(max_concurrent=1, lease_ttl_seconds=300)
    async with admission_harness(fresh_time_skipping_env.client, tmp_path, policy) as h:
        handle = await h.start_probe("long", ProbeRequest(request_id="long"), hold_seconds=3 * 3600)
        result: ProbeResult = await handle.result()
        assert result.final["long"].state == "released"
        # One renewal every TTL/3 = 100 s for three hours: the 5-minute lease lived 36 times its TTL.
        assert result.final["long"].lease_revision >= 3 * 3600 // 100
        assert "timed-out" not in [e.type for e in await audit_of(h)]


async def test_a_lease_that_stops_being_renewed_expires_and_capacity_moves_on(fresh_time_skipping_env, tmp_path):
    policy = AdmissionPolicy(max_concurrent=1, lease_ttl_seconds=60, max_requeue_attempts=0)  # ends, not requeued
    async with admission_harness(fresh_time_skipping_env.client, tmp_path, policy) as h:
        silent_result = await silent_lease_expires_with_a_waiter(h)
        assert silent_result.final["silent"].state == "timed-out"
        assert silent_result.final["silent"].reason == "admission lease expired; capacity recovered"
        [expired] = [e for e in await audit_of(h, "silent") if e.type == "timed-out"]
        [admitted] = [e for e in await audit_of(h, "waiter") if e.type == "admitted"]
        assert admitted.seq == expired.seq + 1  # the freed capacity went to the waiter in the same decision


async def test_queue_timeout(fresh_time_skipping_env, tmp_path):
    policy = AdmissionPolicy(max_concurrent=1)
    async with admission_harness(fresh_time_skipping_env.client, tmp_path, policy) as h:
        await h.start_probe("holder", ProbeRequest(request_id="holder"), hold_seconds=HOLD)
        await h.until_leased("holder")
        impatient = await h.start_probe("impatient", ProbeRequest(request_id="impatient", queue_timeout_seconds=30))
        result: ProbeResult = await impatient.result()
        assert result.final["impatient"].state == "timed-out"
        assert result.final["impatient"].reason == "queue deadline elapsed"
        assert result.ever_admitted == []


async def test_identity_collision_never_hands_over_someone_elses_lease(fresh_time_skipping_env, tmp_path):
    policy = AdmissionPolicy(max_concurrent=2)
    async with admission_harness(fresh_time_skipping_env.client, tmp_path, policy) as h:
        owner = await h.start_probe("owner", ProbeRequest(request_id="shared-id"), hold_seconds=HOLD)
        await h.until_leased("shared-id")
        # Same request id, another orchestrator (each probe is its own orchestrator).
        intruder = await h.start_probe("intruder", ProbeRequest(request_id="shared-id"))
        intruder_result: ProbeResult = await intruder.result()
        decision = intruder_result.final["shared-id"]
        assert decision.state == "unknown" and decision.error_code == "identity-collision"
        assert intruder_result.ever_admitted == []
        assert await h.leased() == ["shared-id"]
        await owner.signal("finish")
        owner_result: ProbeResult = await owner.result()
        assert owner_result.final["shared-id"].state == "released"
        assert [e.type for e in await audit_of(h, "shared-id") if e.type != "renewed"] == ["queued", "admitted", "released"]


async def test_replayed_submit_changes_nothing(fresh_time_skipping_env, tmp_path):
    policy = AdmissionPolicy(max_concurrent=1)
    async with admission_harness(fresh_time_skipping_env.client, tmp_path, policy) as h:
        owner = await h.start_probe("owner", ProbeRequest(request_id="r1"), hold_seconds=HOLD)
        await h.until_leased("r1")
        [lease] = await h.admission.query("leases", result_type=list[LeaseRow])
        replay = AdmissionRequest(
            request_id="r1", orchestrator_id=owner.id, environment="default", provider="local",
            runtime_kind="container", priority=0, submitted_at=lease.admitted_at, queue_timeout_seconds=3600,
        )
        batch = SubmitBatch(requester=owner.id, requests=[replay])
        for _ in range(2):
            await signal_with_start_admission(h.client, h.config.task_queue, h.host_group, policy, "submit", batch)
        await h.eventually(lambda: _audit_count(h), "audit export")
        [after] = await h.admission.query("leases", result_type=list[LeaseRow])
        assert after.lease_revision == lease.lease_revision and after.admitted_at == lease.admitted_at
        assert [e.type for e in await audit_of(h, "r1")] == ["queued", "admitted"]


async def _audit_count(h) -> int:
    return len(stored_audit(h))


async def test_a_requester_that_disappears_gives_its_capacity_back(fresh_time_skipping_env, tmp_path):
    policy = AdmissionPolicy(max_concurrent=1)
    async with admission_harness(fresh_time_skipping_env.client, tmp_path, policy) as h:
        holder = await h.start_probe("holder", ProbeRequest(request_id="holder"), hold_seconds=HOLD)
        await h.until_leased("holder")
        ghost = await h.start_probe("ghost", ProbeRequest(request_id="ghost"), hold_seconds=HOLD)
        last = await h.start_probe("last", ProbeRequest(request_id="last"), hold_seconds=5)
        await h.until_queued("ghost", "last")
        await ghost.terminate(reason="requester crashed")
        await holder.signal("finish")
        last_result: ProbeResult = await last.result()
        assert last_result.ever_admitted == ["last"]
        assert [e.type for e in await audit_of(h, "ghost")] == ["queued", "admitted", "released"]
        # A vanished requester is never a failure of the singleton.
        assert (await h.admission.describe()).status.name == "RUNNING"
