"""AdmissionProbeWorkflow: a minimal requester that exercises the whole admission path.

The test-suite uses it as an independent requester workflow and the benchmarks as
the unit of load (an operator checks a host group end to end with
`conductor admission run -- true`, a holder: docs/admission-api.md). It submits its requests in one batch,
waits for decisions, holds what it was given (renewing unless told not to),
reacts to preemption or displacement, then gives everything back.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows.admission.client import AdmissionClient, Renewal
    from workflows.admission.messages import AdmissionDecision
    from workflows.admission.model import AdmissionRequest, PriorityClass, RuntimeKind
    from workflows.failures import refused_start
    from workflows.inbound import Refused, argument, no_argument


class ProbeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    request_id: str
    environment: str = "default"
    provider: str = "local"
    runtime_kind: RuntimeKind = "container"
    priority: int = 0
    queue_timeout_seconds: float = 3600
    preemptible: bool = False
    lane: str | None = None
    priority_class: PriorityClass = "P2"


class ProbeInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host_group: str
    requests: list[ProbeRequest]
    hold_seconds: float = Field(default=0, ge=0)
    renew: bool = True
    renewal: Renewal = "per-lease"  # how it renews (workflows.admission.client)
    decision_timeout_seconds: float = Field(default=3600, gt=0)
    confirm_give_back: bool = True


class ProbeResult(BaseModel):
    final: dict[str, AdmissionDecision]
    history: list[AdmissionDecision]
    ever_admitted: list[str]


@workflow.defn(name="AdmissionProbeWorkflow")
class AdmissionProbeWorkflow:
    def __init__(self) -> None:
        self._finish = False

    @workflow.signal(description="Tests and benchmarks: stop holding now, give everything back and return.")
    def finish(self, *args: Any) -> None:
        """Stop holding now: give everything back and return."""
        try:
            no_argument(args, "the finish signal")
        except Refused as refused:
            workflow.logger.warning("signal finish refused: %s", refused)
            return
        self._finish = True

    @workflow.run
    async def run(self, *args: Any) -> ProbeResult:
        try:
            input = argument(args, ProbeInput, "AdmissionProbeWorkflow's input")
        except Refused as refused:
            raise refused_start(refused, "AdmissionProbeWorkflow") from None
        history: list[AdmissionDecision] = []
        admission = AdmissionClient(input.host_group, renewal=input.renewal, on_decision=history.append)
        me = workflow.info().workflow_id
        now = workflow.now()
        requests = [
            AdmissionRequest(orchestrator_id=me, submitted_at=now, **request.model_dump()) for request in input.requests
        ]
        ids = [request.request_id for request in requests]
        await admission.submit(requests)
        await admission.wait_until_decided(ids, timeout=timedelta(seconds=input.decision_timeout_seconds))

        renewals = asyncio.ensure_future(admission.keep_leases_alive()) if input.renew else None
        deadline = workflow.now() + timedelta(seconds=input.hold_seconds)
        while admission.held() and not self._finish and workflow.now() < deadline:
            await admission.wait_for_change(timeout=deadline - workflow.now(), or_when=lambda: self._finish)
        await admission.give_back_everything(timedelta(minutes=1) if input.confirm_give_back else None)
        if renewals is not None:
            await renewals

        ever = sorted({d.request_id for d in history if d.state == "admitted"})
        return ProbeResult(final=dict(admission.decisions), history=history, ever_admitted=ever)
