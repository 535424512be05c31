"""A workflow for tests/stores/test_ledger_store.py, in its own module so the sandbox imports only what it needs.

It proves the aggregation core and the ledger models import and run inside the Temporal workflow
sandbox (imported normally, not passed through, so the sandbox's restrictions apply to them), and
that a ledger crosses the pydantic data converter into `write_ledger_snapshot` intact.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

from workflows.mission.aggregation import apply_observation, initial_ledger
from workflows.mission.ledger import WRITE_LEDGER_SNAPSHOT_ACTIVITY, MissionLedger, SnapshotRef
from workflows.mission.observation import ChildObservation
from workflows.mission.spec import MissionSpec


@workflow.defn(sandboxed=True)
class LedgerSnapshotWorkflow:
    @workflow.run
    async def run(self, spec: MissionSpec, observations: list[ChildObservation]) -> list[SnapshotRef]:
        ledgers: list[MissionLedger] = [initial_ledger(spec)]
        for obs in observations:
            ledgers.append(apply_observation(ledgers[-1], spec, obs))
        refs = []
        for ledger in ledgers:
            refs.append(
                await workflow.execute_activity(
                    WRITE_LEDGER_SNAPSHOT_ACTIVITY,
                    ledger,
                    result_type=SnapshotRef,
                    start_to_close_timeout=timedelta(seconds=30),
                )
            )
        return refs
