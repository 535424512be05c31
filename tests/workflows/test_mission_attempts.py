"""Attempts end to end (issue 14): dev server, workers, real HTTP to the local substrate.

A displaced child is stopped, waits queued and succeeds as attempt 2; a child whose lease
expired while its mission's worker was down is requeued by the engine and completes as its
next attempt; two gang missions share one host group without deadlock; two orchestrators
flooding one host group share it by their fair-share weights.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

import pytest
from temporalio.client import Client
from temporalio.service import RPCError

from activities.admission import set_policy_with_start
from activities.sandbox_client import FleetClient, StaleRevision
from tests.support.mission_harness import POLICY, mission_harness
from tests.support.processes import process_alive
from tests.support.substrate_fixtures import substrate, substrate_tasks  # noqa: F401  (fixture)
from tests.support.substrate_support import FLEET_TOKEN
from worker.mission_control import parse_spec
from workflows.admission.messages import LeaseRow, PolicyChange, QueueRow, admission_workflow_id
from workflows.admission.model import LANE_OVERRIDE_POLICY, AuditEvent, FairShare, PriorityAdmission
from workflows.contract import Backpressure
from workflows.ids import admission_request_id, fleet_child_id, workload_workflow_id


def one_shot(child_id: str, prompt: str, **fields: object) -> dict:
    return {"child_id": child_id, "kind": "one-shot-command", "prompt": prompt, **fields}


def gated(gate, then: str) -> str:
    """A command that ends only once the test opens `gate` (a file), whatever the machine's speed."""
    return f"while [ ! -e {gate} ]; do sleep 0.1; done; {then}"


async def child_has_task(h, mission_id: str, child_id: str = "job") -> bool:
    child = (await h.control.show(mission_id)).child(child_id)
    return child.lineage is not None and child.lineage.task_id is not None


async def _audit(client: Client, host_group: str) -> list[AuditEvent]:
    handle = client.get_workflow_handle(admission_workflow_id(host_group))
    return await handle.query("audit", 1000, result_type=list[AuditEvent])


async def _leases(client: Client, host_group: str) -> list[LeaseRow]:
    handle = client.get_workflow_handle(admission_workflow_id(host_group))
    try:
        return await handle.query("leases", result_type=list[LeaseRow])
    except RPCError:  # not started yet: the first submission starts it
        return []


async def test_a_displaced_child_is_stopped_waits_queued_and_succeeds_as_attempt_2(dev_client: Client, substrate, tmp_path):
    policy = POLICY.model_copy(update={
        "lane_wip_limits": {"deploy": 1}, "priority_admission": PriorityAdmission(enabled=True),
    })
    async with mission_harness(dev_client, substrate, tmp_path, policy=policy) as h:
        gate = tmp_path / "gate"  # the job ends only once displaced and back: no race with a slow machine
        low = parse_spec(h.spec("low", [one_shot("job", gated(gate, "echo low-done"), lane="deploy", priority_class="P3")]))
        await h.control.start(low)

        async def running() -> bool:
            child = (await h.control.show(low.mission_id)).child("job")
            return child.lineage is not None and child.lineage.task_id is not None and child.observed_state == "running"

        await h.until(running, "the low-priority child running")
        first_task = substrate_tasks(substrate, fleet_child_id(low.mission_id, "job"))[0]
        urgent = parse_spec(h.spec("urgent", [one_shot("fix", "sleep 2; echo urgent-done", lane="deploy", priority_class="P0")]))
        await h.control.start(urgent)

        async def displaced_and_queued():
            ledger = await h.control.show(low.mission_id)
            child = ledger.child("job")
            return child if child.attempt == 2 and child.admission.state == "queued" else None

        waiting = await h.until(displaced_and_queued, "the displaced child back in the queue as attempt 2")
        assert waiting.observed_state == "blocked" and waiting.outcome == "pending"  # never a failure
        assert not process_alive(first_task["pid"]), "a displaced attempt kept running without a lease"
        gate.touch()
        urgent_ledger = await h.control.handle(urgent.mission_id).result()
        assert urgent_ledger.parent_state == "completed"

        final = await asyncio.wait_for(h.control.handle(low.mission_id).result(), timeout=60)
        assert final.parent_state == "completed", final.aggregation.reason
        job = final.child("job")
        assert job.attempt == 2 and job.output.strip() == "low-done"
        first, second = job.attempts
        assert first.attempt == 1 and first.retried and not first.counts_against_budget
        assert first.interrupted_by == admission_request_id(urgent.mission_id, "fix")
        assert first.policy == LANE_OVERRIDE_POLICY and "displaced by" in first.ended
        assert first.fleet_child_id == fleet_child_id(low.mission_id, "job")
        assert second.fleet_child_id == fleet_child_id(low.mission_id, "job", 2) == job.lineage.child_id
        assert second.observed_state == "succeeded" and not second.retried
        assert second.request_id == first.request_id  # the same request, admitted again
        # Each attempt had a task of its own: the first stopped, the second completed.
        assert [t["state"] for t in substrate_tasks(substrate, first.fleet_child_id)] in (["canceled"], ["cancelled"])
        assert [t["state"] for t in substrate_tasks(substrate, second.fleet_child_id)] == ["completed"]
        assert second.task_id not in (None, first.task_id)
        described = await dev_client.get_workflow_handle(workload_workflow_id(low.mission_id, "job", 2)).describe()
        assert described.id.endswith(":job:attempt-2")


@pytest.mark.parametrize("budget", [2, 1])
async def test_a_lease_that_expired_while_the_worker_was_down_is_requeued_and_the_child_completes(
    dev_client: Client, substrate, tmp_path, budget
):
    """The admission workflow runs on a worker of its own; the mission's worker is down past the
    lease TTL. The engine requeues the request (ADR-004) and admits it again; the mission, back,
    stops the attempt that ran without its lease and runs the child again as attempt 2. With a
    budget of one attempt it withdraws the request instead, and the child ends timed-out."""
    policy = POLICY.model_copy(update={"lease_ttl_seconds": 3, "max_requeue_attempts": 20})
    suffix = uuid.uuid4().hex[:8]
    gate = tmp_path / "gate"
    host_group = f"hg-{suffix}"
    async with mission_harness(dev_client, substrate, tmp_path / "admission", policy=policy) as admission_side:
        await set_policy_with_start(
            dev_client, admission_side.config.task_queue, host_group, PolicyChange(operator="tests", policy=policy),
            search_attributes=False,
        )
        async with mission_harness(dev_client, substrate, tmp_path / "mission", policy=policy, suffix=suffix) as h:
            # It ends only once the test opens the gate: its lease expires while it runs, however
            # slow the machine, and only an attempt started after the requeue may finish.
            spec = parse_spec(h.spec("requeue", [one_shot(
                "job", gated(gate, "echo finished"),
                budgets={"max_attempts": budget, "timeout_seconds": 60},
            )]))
            await h.control.start(spec)

            await h.until(lambda: child_has_task(h, spec.mission_id), "the child running")
        first_task = substrate_tasks(substrate, fleet_child_id(spec.mission_id, "job"))[0]

        async def requeued() -> bool:
            return any(e.type == "requeued" for e in await _audit(dev_client, host_group))

        await admission_side.until(requeued, "the engine requeueing the expired lease", within=30)
        async with mission_harness(dev_client, substrate, tmp_path / "mission", policy=policy, suffix=suffix) as h:
            if budget > 1:
                async def attempt_2_running() -> bool:
                    second = substrate_tasks(substrate, fleet_child_id(spec.mission_id, "job", 2))
                    return not process_alive(first_task["pid"]) and bool(second)

                await h.until(attempt_2_running, "attempt 1 stopped and attempt 2 started", within=60)
                gate.touch()
            final = await asyncio.wait_for(h.control.handle(spec.mission_id).result(), timeout=90)
        assert not process_alive(first_task["pid"])
        if budget == 1:
            job = final.child("job")
            assert final.parent_state == "failed" and job.attempt == 1
            assert (job.observed_state, job.error_code) == ("timed-out", "admission.lease_expired")
            (only,) = job.attempts
            assert not only.retried and "retry budget exhausted (1/1 attempts)" in only.ended
            assert await _leases(dev_client, host_group) == []
            assert len(substrate_tasks(substrate, fleet_child_id(spec.mission_id, "job", 2))) == 0
            return
        assert final.parent_state == "completed", final.aggregation.reason
        job = final.child("job")
        assert job.attempt == 2 and job.output.strip() == "finished"
        first, second = job.attempts
        assert first.retried and first.counts_against_budget and "lease expired" in first.ended
        assert second.observed_state == "succeeded"
        assert not process_alive(first_task["pid"])
        assert [t["state"] for t in substrate_tasks(substrate, fleet_child_id(spec.mission_id, "job", 2))] == ["completed"]
        events = await _audit(dev_client, host_group)
        assert any(e.type == "requeued" and "lease expired; requeued (attempt 1/20)" in e.reason for e in events)


def _barrier(directory, me: str, sibling: str) -> str:
    """A child that only works together with its sibling: it waits (10 s at most) to see it start."""
    return (
        f"touch {directory}/{me}; i=0; while [ ! -f {directory}/{sibling} ] && [ $i -lt 100 ]; do sleep 0.1; "
        f"i=$((i+1)); done; test -f {directory}/{sibling} && echo together"
    )


async def test_two_gang_missions_competing_for_one_host_group_both_complete(dev_client: Client, substrate, tmp_path):
    """Room for two children, one taken by a daemon; each mission is a gang of two children that
    only work together. Neither gang holds part of the room while the rest waits; once the daemon
    stops, one gang runs, then the other, and both complete."""
    policy = POLICY.model_copy(update={"max_concurrent": 2, "runtime_quotas": {"host": 2}})
    async with mission_harness(dev_client, substrate, tmp_path, policy=policy) as h:
        holder = parse_spec(h.spec("holder", [{"child_id": "api", "kind": "daemon", "prompt": "sleep 300"}]))
        await h.control.run(holder)
        specs = []
        for name in ("one", "two"):
            mission = f"gang-{name}-{h.suffix}"
            specs.append(parse_spec(h.spec(f"gang-{name}", [
                one_shot("a", _barrier(tmp_path, f"{mission}-a", f"{mission}-b")),
                one_shot("b", _barrier(tmp_path, f"{mission}-b", f"{mission}-a")),
            ], admission={"mode": "gang"}, require_distinct_targets=False)))
        for spec in specs:
            await h.control.start(spec)

        async def both_gangs_waiting():
            handle = dev_client.get_workflow_handle(admission_workflow_id(holder.host_group))
            rows = await handle.query("queue", 1000, result_type=list[QueueRow])
            return rows if len(rows) == 4 and all(row.binding_constraint.startswith("gang ") for row in rows) else None

        rows = await h.until(both_gangs_waiting, "both gangs queued, each waiting as a whole")
        assert {row.request_id for row in rows} == {f"{spec.mission_id}:{c}" for spec in specs for c in "ab"}
        assert await h.admission_leases(holder.host_group) == [fleet_child_id(holder.mission_id, "api")]
        await h.control.stop(holder.mission_id)
        finals = await asyncio.wait_for(
            asyncio.gather(*(h.control.handle(spec.mission_id).result() for spec in specs)), timeout=60,
        )
        assert [final.parent_state for final in finals] == ["completed", "completed"], [f.aggregation.reason for f in finals]
        assert all(child.output.strip() == "together" for final in finals for child in final.children)
        admitted = [e for e in await _audit(dev_client, holder.host_group) if e.type == "admitted"]
        # Each gang's members are admitted together, in one step, and one gang after the other.
        by_mission = [[e for e in admitted if e.request_id.startswith(f"{spec.mission_id}:")] for spec in specs]
        assert [len(events) for events in by_mission] == [2, 2]
        for events in by_mission:
            assert len({e.at for e in events}) == 1 and {e.policy for e in events} == {"gang"}
        first, second = sorted(by_mission, key=lambda events: events[0].seq)
        assert second[0].at > first[0].at


async def test_two_orchestrators_flooding_one_host_group_share_it_by_weight_within_one_lease(
    dev_client: Client, substrate, tmp_path
):
    """Three places, weights 2 and 1. The heavy orchestrator floods first and takes all three;
    when they end, within the first lease, the places go two to one."""
    policy = POLICY.model_copy(update={
        "max_concurrent": 3, "runtime_quotas": {"host": 3},
        "fair_share": FairShare(weights={"heavy": 2, "light": 1}),
    })
    async with mission_harness(dev_client, substrate, tmp_path, policy=policy) as h:
        # Each child ends only once the gate opens (the light orchestrator queued, however slow the
        # machine), then one second after the one before it: places free up one at a time.
        gate = tmp_path / "gate"
        flood = [one_shot(f"c{i}", gated(gate, f"sleep {i}; echo done")) for i in range(6)]
        heavy = parse_spec(h.spec("heavy", flood, orchestrator_id="heavy", require_distinct_targets=False))
        light = parse_spec(h.spec("light", flood, orchestrator_id="light", require_distinct_targets=False))
        await h.control.start(heavy)

        async def heavy_holds_all():
            return len(await _leases(dev_client, heavy.host_group)) == 3

        await h.until(heavy_holds_all, "the first orchestrator holding every place")
        await h.control.start(light)

        async def light_queued() -> bool:
            handle = dev_client.get_workflow_handle(admission_workflow_id(heavy.host_group))
            rows = await handle.query("queue", 1000, result_type=list[QueueRow])
            return sum(row.request_id.startswith(f"{light.mission_id}:") for row in rows) == 6

        await h.until(light_queued, "the light orchestrator's requests queued")
        gate.touch()

        async def shares():
            held = Counter(row.request_id.split(":")[0].split("-")[0] for row in await _leases(dev_client, heavy.host_group))
            return held if held == Counter({"heavy": 2, "light": 1}) else None

        await h.until(shares, "the places shared two to one", within=policy.lease_ttl_seconds)
        finals = await asyncio.wait_for(
            asyncio.gather(h.control.handle(heavy.mission_id).result(), h.control.handle(light.mission_id).result()),
            timeout=90,
        )
        assert [final.parent_state for final in finals] == ["completed", "completed"]
        # The light orchestrator's requests were the younger ones, yet the first place to free up
        # went to it: it was furthest below its weighted share (FIFO would have served heavy first).
        admitted = [e.request_id for e in await _audit(dev_client, heavy.host_group) if e.type == "admitted"]
        assert admitted[3].startswith(f"{light.mission_id}:"), admitted


async def test_a_preempted_child_is_admitted_again_under_a_new_request_without_costing_its_budget(
    dev_client: Client, substrate, tmp_path
):
    policy = POLICY.model_copy(update={"max_concurrent": 1, "runtime_quotas": {"host": 1}, "allow_preemption": True})
    async with mission_harness(dev_client, substrate, tmp_path, policy=policy) as h:
        gate = tmp_path / "gate"  # the job ends only after it was preempted: no race with a slow machine
        victim = parse_spec(h.spec("victim", [one_shot("job", gated(gate, "echo victim-done"), preemptible=True)]))
        await h.control.start(victim)

        await h.until(lambda: child_has_task(h, victim.mission_id), "the preemptible child running")
        first_task = substrate_tasks(substrate, fleet_child_id(victim.mission_id, "job"))[0]
        urgent = parse_spec(h.spec("urgent", [one_shot("fix", "sleep 1; echo urgent-done", priority=9)]))
        await h.control.start(urgent)
        assert (await h.control.handle(urgent.mission_id).result()).parent_state == "completed"
        gate.touch()  # the urgent one ran, so the victim's first attempt was preempted
        final = await asyncio.wait_for(h.control.handle(victim.mission_id).result(), timeout=60)
        assert final.parent_state == "completed", final.aggregation.reason
        job = final.child("job")
        assert job.attempt == 2 and job.output.strip() == "victim-done"
        first, second = job.attempts
        assert first.request_id == admission_request_id(victim.mission_id, "job")
        assert second.request_id == admission_request_id(victim.mission_id, "job", 2) == job.admission.request_id
        assert first.retried and not first.counts_against_budget  # budget 1, and still tried again
        assert first.interrupted_by == admission_request_id(urgent.mission_id, "fix") and "preempted by" in first.ended
        assert not process_alive(first_task["pid"])
        assert await h.admission_leases(victim.host_group) == []


@pytest.mark.parametrize("restart", [False, True])
async def test_an_executor_refusal_that_says_it_is_retryable_is_tried_again_within_the_budget(
    dev_client: Client, substrate, tmp_path, restart
):
    """The executor reports the running attempt refused for now (its record `failed` with
    backpressure `retryable`, written through the fleet API as an executor would); the mission
    runs the child again as attempt 2, which costs the budget of 2. `restart`: the worker is
    replaced while attempt 2 runs, and the attempt is re-adopted, never started twice."""
    async with mission_harness(dev_client, substrate, tmp_path) as h:
        suffix = h.suffix
        gate = tmp_path / "gate"  # attempts end only once attempt 2 runs: no race with a slow machine
        spec = parse_spec(h.spec("refused", [one_shot(
            "job", gated(gate, "echo done"), budgets={"max_attempts": 2, "timeout_seconds": 60},
        )]))
        await h.control.start(spec)

        await h.until(lambda: child_has_task(h, spec.mission_id), "the child running")
        async with FleetClient(substrate.base_url, FLEET_TOKEN) as fleet:
            for _ in range(10):
                record = await fleet.get(fleet_child_id(spec.mission_id, "job"))
                status = record.status.model_copy(update={
                    "observed_state": "failed", "revision": record.status.revision + 1,
                    "exit_classification": "failure", "error_code": "executor.busy",
                    "backpressure": Backpressure(reason="capacity", retryable=True),
                })
                try:
                    await fleet.observe(record.lineage.child_id, record.status.revision, status)
                    break
                except StaleRevision:
                    continue

        async def attempt_2_running() -> bool:
            child = (await h.control.show(spec.mission_id)).child("job")
            return child.attempt == 2 and child.lineage is not None and child.lineage.task_id is not None

        await h.until(attempt_2_running, "attempt 2 running")
        if not restart:
            gate.touch()
            final = await asyncio.wait_for(h.control.handle(spec.mission_id).result(), timeout=60)
    if restart:
        async with mission_harness(dev_client, substrate, tmp_path, suffix=suffix) as h:
            gate.touch()  # attempt 2 ran on while no worker was up; it ends under the new one
            final = await asyncio.wait_for(h.control.handle(spec.mission_id).result(), timeout=60)
    assert final.parent_state == "completed", final.aggregation.reason
    assert len(substrate_tasks(substrate, fleet_child_id(spec.mission_id, "job", 2))) == 1
    job = final.child("job")
    assert job.attempt == 2 and job.output.strip() == "done"
    first, second = job.attempts
    assert first.retried and first.counts_against_budget and first.error_code == "executor.busy"
    assert "said a retry may succeed" in first.ended and "1/2 used" in first.ended
    assert second.observed_state == "succeeded"
