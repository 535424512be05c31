"""Missions end to end: dev server, worker, real HTTP to the local substrate running real processes."""

from __future__ import annotations

from temporalio.client import Client

from activities.ledger_store import SqliteLedgerStore
from tests.mission_harness import mission_harness
from tests.substrate_fixtures import substrate, substrate_tasks  # noqa: F401  (fixture)
from worker.mission_control import parse_spec
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
        assert ledger.aggregation.successful == ("a", "b", "c") or list(ledger.aggregation.successful) == ["a", "b", "c"]
        targets = {child.lineage.target_id for child in ledger.children}
        assert len(targets) == 3
        outputs = {child.child_id: child.output for child in ledger.children}
        assert outputs["a"].strip() == "alpha" and outputs["c"] == "charlie"
        assert all(child.admission.state in ("admitted", "released") for child in ledger.children)
        final = await h.control.handle(spec.mission_id).result()
        assert final.parent_state == "completed"
        assert all(child.admission.state == "released" for child in final.children)
        history = SqliteLedgerStore(h.config.ledger_db).history(spec.mission_id)
        assert len(history) >= 3 and [ref.seq for ref in history] == sorted(ref.seq for ref in history)


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
