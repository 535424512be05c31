"""Missions end to end: dev server, worker, real HTTP to the local substrate running real processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import pytest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.exceptions import is_cancelled_exception
from temporalio.service import RPCError

from activities.ledger_store import SqliteLedgerStore
from tests.support.mission_harness import POLICY, events_of_every_run, mission_harness
from tests.support.processes import process_alive
from tests.support.substrate_fixtures import substrate, substrate_tasks  # noqa: F401  (fixture)
from worker.cli import run as run_cli
from worker.mission_control import parse_spec
from workflows.ids import mission_workflow_id
from workflows.mission.snapshots import SNAPSHOT_INTERVAL
from workflows.workload.client import workload_workflow_id
from workflows.workload.record import fleet_child_id


def one_shot(child_id: str, prompt: str, **fields: object) -> dict:
    return {"child_id": child_id, "kind": "one-shot-command", "prompt": prompt, **fields}


async def test_all_pass_mission_on_distinct_targets(dev_client: Client, substrate, tmp_path):
    async with mission_harness(dev_client, substrate, tmp_path) as h:
        spec = parse_spec(h.spec("all-pass", [
            one_shot("a", "echo alpha", required_evidence=["result"]),
            one_shot("b", "echo bravo-bravo"),
            one_shot("c", "printf charlie"),
        ]))
        ledger = await h.control.run(spec)
        assert ledger.parent_state == "completed", ledger.aggregation.reason
        assert list(ledger.aggregation.successful) == ["a", "b", "c"]
        targets = {child.lineage.target_id for child in ledger.children}
        assert len(targets) == 3
        outputs = {child.child_id: child.output for child in ledger.children}
        assert outputs["a"].strip() == "alpha" and outputs["c"] == "charlie"
        assert all(child.admission.state in ("admitted", "released") for child in ledger.children)
        final = await h.control.handle(spec.mission_id).result()
        assert final.parent_state == "completed"
        assert all(child.admission.state == "released" for child in final.children)
        history = SqliteLedgerStore(h.config.ledger_db).history(spec.mission_id)
        # The plan's snapshot, then the closing one: the children's words came within the interval.
        assert [ref.seq for ref in history] == sorted(ref.seq for ref in history) and len(history) >= 2
        assert history[-1].seq == final.snapshot_seq  # the closing snapshot is the final ledger


async def test_background_snapshots_are_coalesced_and_closing_writes_the_last(dev_client: Client, substrate, tmp_path):
    """Children ending over about three seconds change the ledger five times; the background
    writer writes one at a time and starts them SNAPSHOT_INTERVAL apart, so the store holds fewer
    snapshots than there were changes, each one whole, the closing one the final ledger."""
    async with mission_harness(dev_client, substrate, tmp_path) as h:
        spec = parse_spec(h.spec("coalesced", [
            one_shot(f"s{i}", f"sleep {delay}; echo {i}") for i, delay in enumerate((0.4, 0.8, 1.2, 2.6, 3.0))
        ], require_distinct_targets=False))
        final = await h.control.run(spec)
        assert final.parent_state == "completed", final.aggregation.reason
        final = await h.control.handle(spec.mission_id).result()
        store = SqliteLedgerStore(h.config.ledger_db)
        seqs = [ref.seq for ref in store.history(spec.mission_id)]
        assert seqs[-1] == final.snapshot_seq and len(seqs) < final.snapshot_seq, seqs
        assert store.get(spec.mission_id, seqs[-1]) == final
        runs: list[list[float]] = []  # per run: when each snapshot write was scheduled
        in_flight: set[int] = set()
        for event in await events_of_every_run(dev_client, mission_workflow_id(spec.mission_id)):
            if event.HasField("workflow_execution_started_event_attributes"):
                runs.append([])
            elif event.HasField("activity_task_scheduled_event_attributes"):
                if event.activity_task_scheduled_event_attributes.activity_type.name == "write_ledger_snapshot":
                    in_flight.add(event.event_id)
                    assert len(in_flight) == 1, "two ledger snapshot writes in flight"
                    runs[-1].append(event.event_time.ToDatetime().timestamp())
            elif event.HasField("activity_task_completed_event_attributes"):
                in_flight.discard(event.activity_task_completed_event_attributes.scheduled_event_id)
        assert sum(map(len, runs)) >= 3, "the plan's snapshot, at least one child's word in the background, the closing one"
        # A run's last write is a flush (closing, or before continuing as new): it cuts the interval short.
        gaps = [later - earlier for starts in runs for earlier, later in zip(starts[:-1], starts[1:-1])]
        assert gaps, runs
        assert min(gaps) >= SNAPSHOT_INTERVAL.total_seconds() - 0.3, gaps  # back to back, they were 0.4 s apart


async def test_quorum_met_despite_failures(dev_client: Client, substrate, tmp_path):
    async with mission_harness(dev_client, substrate, tmp_path) as h:
        spec = parse_spec(h.spec("quorum", [
            one_shot("ok-1", "echo one"), one_shot("ok-2", "echo two"), one_shot("bad", "exit 3"),
        ], aggregation={"mode": "quorum", "minimum_successes": 2}))
        ledger = await h.control.run(spec)
        assert ledger.parent_state == "completed", ledger.aggregation.reason
        final = await h.control.handle(spec.mission_id).result()
        bad = final.child("bad")
        assert bad.observed_state == "failed" and bad.exit_classification == "failure"
        assert set(final.aggregation.successful) == {"ok-1", "ok-2"} and list(final.aggregation.failed) == ["bad"]


async def test_fail_fast_cancels_running_siblings_and_their_processes(dev_client: Client, substrate, tmp_path):
    async with mission_harness(dev_client, substrate, tmp_path) as h:
        spec = parse_spec(h.spec("fail-fast", [
            one_shot("slow-1", "sleep 60"), one_shot("slow-2", "sleep 60"), one_shot("broken", "sleep 1; exit 1"),
        ], aggregation={"mode": "fail-fast"}))
        ledger = await h.control.run(spec)
        assert ledger.parent_state == "failed"
        final = await h.control.handle(spec.mission_id).result()  # closes only once the siblings are stopped
        assert final.child("slow-1").observed_state == "cancelled"
        assert final.child("slow-2").observed_state == "cancelled"
        for child_id in ("slow-1", "slow-2"):
            tasks = substrate_tasks(substrate, fleet_child_id(spec.mission_id, child_id))
            assert len(tasks) == 1 and tasks[0]["state"] in ("canceled", "cancelled")


async def test_unroutable_child_fails_closed(dev_client: Client, substrate, tmp_path):
    async with mission_harness(dev_client, substrate, tmp_path) as h:
        spec = parse_spec(h.spec("unroutable", [
            one_shot("fine", "true"), one_shot("in-a-vm", "true", runtime_kind="vm"),
        ]))
        ledger = await h.control.run(spec)
        assert ledger.parent_state == "operator-review-required"
        child = ledger.child("in-a-vm")
        assert child.observed_state == "operator-review-required" and "unroutable" in (child.note or "")


async def _children_running(h, mission_id: str, *child_ids: str):
    """Every child dispatched (its task bound in the lineage) and not finished yet."""
    ledger = await h.control.show(mission_id)
    return all(
        (child := ledger.child(cid)).lineage is not None and child.lineage.task_id is not None
        and child.observed_state not in ("succeeded", "failed", "cancelled")
        for cid in child_ids
    )


async def test_manual_review_approved_and_rejected_through_the_cli(dev_client: Client, substrate, tmp_path, monkeypatch, capsys):
    async with mission_harness(dev_client, substrate, tmp_path) as h:
        for key, value in h.cli_env().items():
            monkeypatch.setenv(key, value)
        specs = {
            decision: parse_spec(h.spec(f"review-{decision}", [one_shot("only", "echo please review")],
                                        aggregation={"mode": "manual-review"}))
            for decision in ("approve", "reject")
        }
        for spec in specs.values():
            await h.control.start(spec)
        for decision, spec in specs.items():
            await h.until(lambda: _awaiting(h, spec.mission_id), "awaiting-review")
            code = await asyncio.to_thread(run_cli, [
                "mission", "review", spec.mission_id, f"--{decision}", "--operator", "alice", "--reason", f"{decision} it",
            ])
            assert code == 0
        capsys.readouterr()
        approved = await h.control.handle(specs["approve"].mission_id).result()
        rejected = await h.control.handle(specs["reject"].mission_id).result()
        assert approved.parent_state == "completed" and rejected.parent_state == "failed"
        assert approved.review.operator == "alice" and approved.review.decision == "approve"
        assert rejected.review.reason == "reject it" and rejected.review.decided_at is not None
        # A second decision is refused with a reason, through the CLI too.
        code = await asyncio.to_thread(run_cli, [
            "mission", "review", specs["approve"].mission_id, "--reject", "--operator", "bob", "--reason", "late",
        ])
        assert code == 1 and "conductor:" in capsys.readouterr().err


async def _leases_if(h, host_group: str, count: int) -> list[str] | None:
    leases = await h.admission_leases(host_group)
    return leases if len(leases) == count else None


async def _awaiting(h, mission_id: str) -> bool:
    return (await h.control.show(mission_id)).parent_state == "awaiting-review"


async def test_cancelled_mission_leaves_no_process_and_no_lease(dev_client: Client, substrate, tmp_path):
    async with mission_harness(dev_client, substrate, tmp_path) as h:
        spec = parse_spec(h.spec("cancel", [one_shot("long-1", "sleep 120"), one_shot("long-2", "sleep 120")]))
        await h.control.start(spec)
        await h.until(lambda: _children_running(h, spec.mission_id, "long-1", "long-2"), "children running")
        pids = [task["pid"] for cid in ("long-1", "long-2")
                for task in substrate_tasks(substrate, fleet_child_id(spec.mission_id, cid))]
        assert all(process_alive(pid) for pid in pids)
        await h.control.cancel(spec.mission_id)
        with pytest.raises(WorkflowFailureError):
            await h.control.handle(spec.mission_id).result()
        ledger = await h.control.show(spec.mission_id)
        assert ledger.parent_state == "cancelled"
        assert {ledger.child(cid).observed_state for cid in ("long-1", "long-2")} == {"cancelled"}
        assert not any(process_alive(pid) for pid in pids)
        assert await h.admission_leases(spec.host_group) == []


async def test_worker_restart_mid_mission_dispatches_nothing_twice(dev_client: Client, substrate, tmp_path):
    children = [one_shot(f"c{i}", f"sleep 4; echo done-{i}") for i in range(3)]
    async with mission_harness(dev_client, substrate, tmp_path) as h:
        spec = parse_spec(h.spec("restart", children))
        suffix = h.suffix
        await h.control.start(spec)
        await h.until(lambda: _children_running(h, spec.mission_id, "c0", "c1", "c2"), "children running")
    # The worker is gone while the children run; a new one picks the mission up.
    async with mission_harness(dev_client, substrate, tmp_path, suffix=suffix) as h:
        final = await h.control.handle(spec.mission_id).result()
        assert final.parent_state == "completed", final.aggregation.reason
        for i in range(3):
            assert final.child(f"c{i}").output.strip() == f"done-{i}"
            assert len(substrate_tasks(substrate, fleet_child_id(spec.mission_id, f"c{i}"))) == 1


async def test_long_lived_children_stay_supervised_after_the_verdict_until_stop(dev_client: Client, substrate, tmp_path):
    async with mission_harness(dev_client, substrate, tmp_path) as h:
        spec = parse_spec(h.spec("mixed", [
            one_shot("report", "echo report ready"),
            {"child_id": "api", "kind": "daemon", "prompt": "sleep 300"},
            {"child_id": "agent", "kind": "persistent-agent", "prompt": "sleep 300"},
            {"child_id": "collector", "kind": "scheduled-collector", "prompt": "echo sample", "schedule": "0 0 1 1 *"},
        ], aggregation={"mode": "all-pass"}))
        verdict = await h.control.run(spec)
        assert verdict.parent_state == "completed", verdict.aggregation.reason
        assert verdict.child("api").health == "healthy"
        handle = h.control.handle(spec.mission_id)
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
        # The one-shot gives its lease back; the long-lived keep theirs.
        held = await h.until(lambda: _leases_if(h, spec.host_group, 3), "the one-shot's lease released")
        assert sorted(held) == sorted(fleet_child_id(spec.mission_id, cid) for cid in ("agent", "api", "collector"))
        await h.control.stop(spec.mission_id)
        final = await handle.result()
        assert final.parent_state == "completed"
        for cid in ("api", "agent"):
            tasks = substrate_tasks(substrate, fleet_child_id(spec.mission_id, cid))
            assert len(tasks) == 1 and not process_alive(tasks[0]["pid"])
        assert await h.admission_leases(spec.host_group) == []


def daemon(child_id: str, prompt: str = "sleep 300", **fields: object) -> dict:
    return {"child_id": child_id, "kind": "daemon", "prompt": prompt, **fields}


async def _admission_state(h, mission_id: str, child_id: str) -> str | None:
    return (await h.control.show(mission_id)).child(child_id).admission.state


@pytest.mark.parametrize("how", ["stop", "cancel"])
async def test_missions_stopped_while_a_child_waits_for_capacity_all_close(dev_client: Client, substrate, tmp_path, how):
    """Issue: fill the host group, queue a third mission's child, then stop (or cancel) the first
    mission and the third. The freed slot admits the queued child just as its mission stops: it
    must be stopped, never left running with its mission waiting on it."""
    policy = POLICY.model_copy(update={"max_concurrent": 2, "runtime_quotas": {"host": 2}})
    async with mission_harness(dev_client, substrate, tmp_path, policy=policy) as h:
        holders = [parse_spec(h.spec(f"holder-{i}", [daemon("api")])) for i in (1, 2)]
        for spec in holders:
            await h.control.run(spec)
        waiter = parse_spec(h.spec("waiter", [one_shot("later", "sleep 300")]))
        await h.control.start(waiter)
        await h.until(lambda: _is_queued(h, waiter.mission_id), "the third mission's child queued")

        await getattr(h.control, how)(holders[0].mission_id)
        # The freed slot admits the waiting child; stop its mission the moment its workload
        # starts, while the workload's first call (admit and dispatch, reading on for up to a
        # second) is still in flight.
        later_workflow = dev_client.get_workflow_handle(workload_workflow_id(waiter.mission_id, "later"))
        await h.until(lambda: _exists(later_workflow), "the admitted child's workload started")
        await getattr(h.control, how)(waiter.mission_id)
        for spec in (holders[0], waiter):
            try:
                await asyncio.wait_for(h.control.handle(spec.mission_id).result(), timeout=45)
            except WorkflowFailureError as error:
                assert how == "cancel" and is_cancelled_exception(error.cause)
        later = (await h.control.show(waiter.mission_id)).child("later")
        assert later.observed_state == "cancelled", later
        for spec, child_id in ((holders[0], "api"), (waiter, "later")):
            for task in substrate_tasks(substrate, fleet_child_id(spec.mission_id, child_id)):
                assert not process_alive(task["pid"]), f"{spec.mission_id}/{child_id} outlived its mission"
        assert await h.admission_leases(waiter.host_group) == [fleet_child_id(holders[1].mission_id, "api")]
        await h.control.stop(holders[1].mission_id)
        await asyncio.wait_for(h.control.handle(holders[1].mission_id).result(), timeout=45)


async def _exists(handle) -> bool:
    try:
        await handle.describe()
    except RPCError:
        return False
    return True


async def _is_queued(h, mission_id: str) -> bool:
    return await _admission_state(h, mission_id, "later") == "queued"


async def test_a_child_workflow_that_ends_without_a_last_observation_is_unknown_and_the_mission_closes(
    dev_client: Client, substrate, tmp_path
):
    """Issue: a child workflow that fails (here: an operator terminates it) without reporting its
    end must not leave its mission waiting: the ledger records it `unknown`, failing closed."""
    async with mission_harness(dev_client, substrate, tmp_path) as h:
        spec = parse_spec(h.spec("terminated-child", [one_shot("stuck", "sleep 300"), one_shot("fine", "echo fine")]))
        await h.control.start(spec)
        await h.until(lambda: _children_running(h, spec.mission_id, "stuck"), "the stuck child running")
        await dev_client.get_workflow_handle(workload_workflow_id(spec.mission_id, "stuck")).terminate("operator")
        final = await asyncio.wait_for(h.control.handle(spec.mission_id).result(), timeout=45)
        stuck = final.child("stuck")
        assert stuck.observed_state == "unknown" and "without a last observation" in (stuck.note or "")
        assert "terminated" in (stuck.note or "").lower()
        assert final.parent_state == "operator-review-required"
        assert await h.admission_leases(spec.host_group) == []
        for task in substrate_tasks(substrate, fleet_child_id(spec.mission_id, "stuck")):  # nobody supervised it any more
            if process_alive(task["pid"]):
                os.kill(task["pid"], signal.SIGKILL)


async def test_a_mission_id_that_ran_before_is_refused_in_one_line(dev_client: Client, substrate, tmp_path, monkeypatch, capsys):
    """Issue: a spec run again under a used mission id left its children pending for good (the
    admission workflow answered with the first run's decisions). A mission id names one mission."""
    async with mission_harness(dev_client, substrate, tmp_path) as h:
        for key, value in h.cli_env().items():
            monkeypatch.setenv(key, value)
        spec = h.spec("once", [one_shot("only", "echo once")])
        ledger = await h.control.run(parse_spec(spec))
        await h.control.handle(spec["mission_id"]).result()
        path = tmp_path / "spec.json"
        path.write_text(json.dumps(spec))
        capsys.readouterr()
        code = await asyncio.to_thread(run_cli, ["mission", "run", str(path)])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and f"mission {spec['mission_id']} was run before" in err
        assert "completed" in err and "new mission_id" in err
        final = await h.control.handle(spec["mission_id"]).result()  # the first mission, untouched
        assert final.parent_state == ledger.parent_state == "completed"
