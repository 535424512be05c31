"""AdmissionHolder, the requester workflow of a holder that is not a workflow (workflows/admission/holder_workflow.py).

On the time-skipping server: a holder workflow started alone submits its request and closes with its
last decision; one whose holder promised to submit (and died first) submits itself after
SUBMIT_GRACE; a host group that does not exist fails it at once, typed; a release or cancellation
naming another holder's request changes nothing and tells its sender `unknown`.
"""

from __future__ import annotations

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.testing import WorkflowEnvironment

from activities.admission import set_policy_with_start
from tests.support.admission_harness import admission_harness
from workflows.admission.holder_workflow import NO_SUCH_HOST_GROUP, SUBMIT_GRACE
from workflows.admission.holders import HOLDER_WORKFLOW, HeldRequest, HolderInput, holder_workflow_id
from workflows.admission.messages import DECISION_SIGNAL, AdmissionDecision, DecisionBatch, LeaseRow, PolicyChange, ReleaseBatch
from workflows.admission.model import AdmissionPolicy, AuditEvent
from workflows.inbound import Refusal

POLICY = AdmissionPolicy(max_concurrent=1, runtime_quotas={"host": 1}, lease_ttl_seconds=3600)


async def _holder(h, holder: str, request_id: str, **options: object):
    return await h.client.start_workflow(
        HOLDER_WORKFLOW, HolderInput(host_group=h.host_group, holder=holder,
                                     request=HeldRequest(request_id=request_id, orchestrator_id="tests"), **options),
        id=holder_workflow_id(h.host_group, holder, request_id), task_queue=h.config.task_queue, result_type=AdmissionDecision,
    )


async def _decision(handle) -> AdmissionDecision:
    return await handle.query("decision", result_type=AdmissionDecision)


async def test_a_holder_workflow_submits_hears_and_closes_with_its_last_decision(fresh_time_skipping_env: WorkflowEnvironment, tmp_path):
    env = fresh_time_skipping_env
    async with admission_harness(env.client, tmp_path, POLICY) as h:
        await set_policy_with_start(env.client, h.config.task_queue, h.host_group, PolicyChange(operator="ops", policy=POLICY),
                                    search_attributes=False)
        first = await _holder(h, "cockpit", "first")
        await h.until_leased("first")
        second = await _holder(h, "cockpit", "second")
        await h.until_queued("second")

        async def queued_at_one() -> bool:
            decision = await _decision(second)
            return decision.state == "queued" and decision.position == 1

        await h.eventually(queued_at_one, "the second holder hearing it waits at position 1")
        [lease] = await h.admission.query("leases", result_type=list[LeaseRow])
        assert lease.holder == first.id

        # Someone else releasing the first holder's lease: refused (its sender hears `unknown`), the lease stays.
        await h.admission.signal("release", ReleaseBatch(requester=second.id, request_ids=["first"]))

        async def told_unknown() -> bool:
            async for event in second.fetch_history_events():
                signaled = event.workflow_execution_signaled_event_attributes
                if signaled.signal_name == DECISION_SIGNAL:
                    [batch] = await env.client.data_converter.decode(signaled.input.payloads, [DecisionBatch])
                    if any(d.request_id == "first" and d.state == "unknown" for d in batch.decisions):
                        return True
            return False

        await h.eventually(told_unknown, "the second holder told its release of another's lease is refused")
        assert await h.leased() == ["first"]
        await h.admission.signal("release", ReleaseBatch(requester=first.id, request_ids=["first"]))
        assert (await first.result()).state == "released"
        await h.until_leased("second")
        # A client's bad decision batch is refused and kept; the holder workflow goes on.
        await second.signal(DECISION_SIGNAL, {"host_group": h.host_group, "decisionz": []})

        async def refused() -> list[Refusal] | None:
            return await second.query("refusals", result_type=list[Refusal]) or None

        [refusal] = await h.eventually(refused, "the bad decision batch refused")
        assert refusal.signal == DECISION_SIGNAL and "decisionz" in refusal.reason, refusal
        await h.admission.signal("release", ReleaseBatch(requester=second.id, request_ids=["second"]))
        assert (await second.result()).state == "released"
        audit = await h.query("audit", 50, result_type=list[AuditEvent])
        assert [(e.request_id, e.type) for e in audit if e.type in ("admitted", "released")] == [
            ("first", "admitted"), ("first", "released"), ("second", "admitted"), ("second", "released"),
        ]


async def test_a_holder_that_promised_to_submit_and_died_is_submitted_by_its_workflow(
    fresh_time_skipping_env: WorkflowEnvironment, tmp_path,
):
    env = fresh_time_skipping_env
    async with admission_harness(env.client, tmp_path, POLICY) as h:
        await set_policy_with_start(env.client, h.config.task_queue, h.host_group, PolicyChange(operator="ops", policy=POLICY),
                                    search_attributes=False)
        orphan = await _holder(h, "gone", "orphan", submitted_by_holder=True)
        await env.sleep(SUBMIT_GRACE.total_seconds() + 1)  # nobody sent `hold`: the workflow does
        await h.until_leased("orphan")
        assert (await _decision(orphan)).state == "admitted"


async def test_a_holder_workflow_for_a_host_group_that_does_not_exist_fails_at_once_typed(
    fresh_time_skipping_env: WorkflowEnvironment, tmp_path,
):
    env = fresh_time_skipping_env
    async with admission_harness(env.client, tmp_path, POLICY) as h:
        nowhere = await _holder(h, "cockpit", "lost")
        with pytest.raises(WorkflowFailureError) as failed:
            await nowhere.result()
        assert failed.value.cause.type == NO_SUCH_HOST_GROUP, failed.value.cause
        assert "conductor admission policy set" in str(failed.value.cause)
