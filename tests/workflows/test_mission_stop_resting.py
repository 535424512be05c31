"""Stopping a mission whose long-lived children rest: each ends `cancelled`, none `unknown`.

Under the real server's projection (fleet.rs, `project_task_observation`) a scheduled collector
whose run completed is `scheduled` and a persistent agent whose task completed is `retained`:
satisfied, not ended, and their tasks can no longer be cancelled (409 `task.not_cancelable`).
`conductor mission stop` must still end them for good, with a last word each, instead of the
mission recording them `unknown` ("ended without a last observation"), as the demo once showed.
"""

from __future__ import annotations

import asyncio

from temporalio.client import Client

from tests.support.substrate_fixtures import substrate  # noqa: F401  (fixture)
from tests.support.mission_harness import mission_harness
from worker.mission_control import parse_spec


async def test_stop_ends_a_scheduled_collector_and_a_retained_agent_cancelled(dev_client: Client, substrate, tmp_path):
    async with mission_harness(dev_client, substrate, tmp_path) as h:
        spec = parse_spec(h.spec("resting", [
            {"child_id": "collector", "kind": "scheduled-collector", "prompt": "echo collected", "schedule": "* * * * *"},
            {"child_id": "agent", "kind": "persistent-agent", "prompt": "echo thought"},
        ], aggregation={"mode": "all-pass"}))
        verdict = await h.control.run(spec)
        assert verdict.parent_state == "completed", verdict.aggregation.reason

        async def resting() -> bool:
            ledger = await h.control.show(spec.mission_id)
            return (ledger.child("collector").observed_state, ledger.child("agent").observed_state) == ("scheduled", "retained")

        await h.until(resting, "the collector scheduled and the agent retained")
        await h.control.stop(spec.mission_id)
        final = await asyncio.wait_for(h.control.handle(spec.mission_id).result(), 45)
    assert final.parent_state == "completed"
    for child_id in ("collector", "agent"):
        child = final.child(child_id)
        assert (child.observed_state, child.exit_classification) == ("cancelled", "cancelled"), child
        assert child.note is None or "without a last observation" not in child.note
