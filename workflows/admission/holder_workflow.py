"""AdmissionHolder: the requester workflow of one holder's request (workflows.admission.holders).

A holder that is not a workflow (a script, Cockpit, `conductor admission run`) starts one of these
per request. It submits the request to the host group's singleton (its `hold` signal), keeps every decision
the singleton signals back, and closes with the final one when the request ends (released,
cancelled, denied, timed out, preempted). The holder follows its history, reads its `decision`
query or awaits its result: none of that calls into the singleton.

It issues at most three commands in its life (a timer while it waits for the holder's own submit,
the submit signal, its completion) and it takes no update: its replay cannot depend on the order in
which a worker meets its signals and timer.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from workflows.admission.holders import DECISION_QUERY, HOLDER_WORKFLOW, HolderInput, HolderSubmit
    from workflows.admission.messages import DECISION_SIGNAL, AdmissionDecision, DecisionBatch, admission_workflow_id
    from workflows.failures import RefusedSignals, refused_start
    from workflows.inbound import (
        Refusal,
        Refused,
        argument,
        no_argument,
        signal_argument,
    )

SCHEMA_HINT = "see `conductor mission schema holder-input` and docs/admission-api.md"
NO_SUCH_HOST_GROUP = "NoSuchHostGroup"
# How long a holder workflow whose holder submits itself waits for the first decision before it
# submits too (a repeat changes nothing).
SUBMIT_GRACE = timedelta(seconds=10)
# A request in one of these states may still change; any other decision is its last.
LIVE_STATES = frozenset({"queued", "admitted"})


@workflow.defn(name=HOLDER_WORKFLOW)
class AdmissionHolderWorkflow:
    @workflow.init
    def __init__(self, *args: Any) -> None:
        try:
            self._input = argument(args, HolderInput, f"{HOLDER_WORKFLOW}'s input", hint=SCHEMA_HINT)
        except Refused as refused:
            raise refused_start(refused, HOLDER_WORKFLOW) from None
        # Revision 0 until the singleton's first decision: newer ones always replace it.
        self._decision = AdmissionDecision(request_id=self._input.request.request_id, state="queued")
        self._refuse = RefusedSignals()

    @workflow.signal(name=DECISION_SIGNAL, description=(
        "From the host group's admission singleton only: decisions on this holder's request."
    ))
    def admission_decided(self, *args: Any) -> None:
        batch = signal_argument(args, DecisionBatch, DECISION_SIGNAL, self._refuse, hint=SCHEMA_HINT)
        if batch is None:
            return
        for decision in batch.decisions:
            # The newest decision wins; an older one arriving late changes nothing.
            if decision.request_id == self._decision.request_id and decision.revision >= self._decision.revision:
                self._decision = decision

    @workflow.query(name=DECISION_QUERY, description="The newest decision on this holder's request (revision 0: none yet).")
    def decision(self, *args: Any) -> AdmissionDecision:
        no_argument(args, "the decision query")
        return self._decision

    @workflow.query(description="Signals this holder workflow received and did not act on, and why.")
    def refusals(self, *args: Any) -> list[Refusal]:
        no_argument(args, "the refusals query")
        return self._refuse.kept()

    @workflow.run
    async def run(self, *args: Any) -> AdmissionDecision:
        if self._input.submitted_by_holder:
            # The holder signalled the singleton itself (a round trip sooner than this task could);
            # should it have died before, the request still goes in, a little later.
            with contextlib.suppress(asyncio.TimeoutError):
                await workflow.wait_condition(self._decided, timeout=SUBMIT_GRACE, timeout_summary="the holder's own submit")
        if not self._decided():
            await self._submit()
        await workflow.wait_condition(self._ended)
        return self._decision

    async def _submit(self) -> None:
        host_group = self._input.host_group
        # Its own id, whatever it is: the singleton refuses one that is not a holder's (`holder:...`).
        submit = HolderSubmit(requester=workflow.info().workflow_id, request=self._input.request)
        try:
            await workflow.get_external_workflow_handle(admission_workflow_id(host_group)).signal("hold", submit)
        except Exception as error:  # the singleton does not exist (or has closed): nothing will ever decide
            raise ApplicationError(
                f"host group {host_group} has no admission workflow running ({error}); "
                "create it with `conductor admission policy set`",
                type=NO_SUCH_HOST_GROUP, non_retryable=True,
            ) from None

    def _decided(self) -> bool:
        return self._decision.revision > 0 or self._ended()

    def _ended(self) -> bool:
        decision = self._decision
        return decision.state == "unknown" or (decision.revision > 0 and decision.state not in LIVE_STATES)
