"""A requester workflow that only records the admission decisions it receives (for burst tests)."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows.admission.messages import DECISION_SIGNAL, AdmissionDecision, DecisionBatch


@workflow.defn(name="DecisionSinkWorkflow")
class DecisionSinkWorkflow:
    def __init__(self) -> None:
        self._decisions: dict[str, AdmissionDecision] = {}
        self._done = False

    @workflow.signal(name=DECISION_SIGNAL)
    def admission_decided(self, batch: DecisionBatch) -> None:
        for decision in batch.decisions:
            known = self._decisions.get(decision.request_id)
            if known is None or decision.revision >= known.revision:
                self._decisions[decision.request_id] = decision

    @workflow.signal
    def done(self) -> None:
        self._done = True

    @workflow.query
    def decisions(self) -> dict[str, AdmissionDecision]:
        return self._decisions

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: self._done)
