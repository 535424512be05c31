"""Missions end to end: dev server, worker, real HTTP to the local substrate running real processes."""

from __future__ import annotations

from temporalio.client import Client

from activities.ledger_store import SqliteLedgerStore
from tests.mission_harness import mission_harness
from tests.substrate_fixtures import substrate, substrate_tasks  # noqa: F401  (fixture)
from worker.mission_control import parse_spec


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
