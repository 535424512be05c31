"""What the Temporal UI (and `temporal workflow describe/list`) shows tells the truth.

Real dev server, real local substrate: a failed workload's workflow is Failed with a typed
error naming its verdict; a cancelled mission is Cancelled with MissionState `cancelled`;
workloads and admission singletons carry search attributes; the singleton's current details
show its queue and usage; every handler says what it is for, and the operator's policy change
is an update that is rejected without an operator.
"""

from __future__ import annotations


import pytest
from temporalio import workflow
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from tests.support.substrate_fixtures import substrate  # noqa: F401  (fixture)
from tests.support.admission_harness import admission_harness
from tests.support.mission_harness import mission_harness
from worker.mission_control import parse_spec
from worker.worker import WORKFLOWS
from workflows.admission.messages import admission_workflow_id
from workflows.admission.probe import ProbeRequest
from workflows.admission.model import AdmissionPolicy
from workflows.inbound import Refusal
from workflows.ids import workload_workflow_id
from workflows.mission.search import MISSION_HOST_GROUP, MISSION_ID, MISSION_STATE, WORKLOAD_KIND, WORKLOAD_STATE

HOLD = 60.0


@pytest.mark.parametrize("workflow_class", WORKFLOWS, ids=lambda cls: cls.__name__)
def test_every_handler_says_what_it_is_for(workflow_class):
    definition = workflow._Definition.must_from_class(workflow_class)
    handlers = [*definition.signals.values(), *definition.queries.values(), *definition.updates.values()]
    assert handlers, workflow_class
    for handler in handlers:
        assert handler.description and len(handler.description) > 20, (workflow_class.__name__, handler.name)


async def test_the_singleton_takes_no_update_and_a_policy_change_needs_an_operator(dev_client: Client, tmp_path):
    """Everything reaches the singleton by signal (docs/admission-api.md, "Why no updates"): a policy
    change without an operator's name is refused, recorded where operators look, and changes nothing."""
    async with admission_harness(dev_client, tmp_path, AdmissionPolicy(max_concurrent=1)) as h:
        await h.start_probe("a", ProbeRequest(request_id="a"), hold_seconds=HOLD)
        await h.until_leased("a")
        definition = workflow._Definition.must_from_class(WORKFLOWS[0])
        assert definition.updates == {} and "set_policy" in definition.signals
        await h.admission.signal("set_policy", {"operator": "", "policy": {"max_concurrent": 3}})

        async def refused() -> list[Refusal] | None:
            return await h.query("refusals", result_type=list[Refusal]) or None

        [refusal] = await h.eventually(refused, "the nameless policy change refused")
        assert refusal.signal == "set_policy" and "operator" in refusal.reason, refusal
        policy = await h.query("policy", result_type=AdmissionPolicy)
        assert policy.max_concurrent == 1  # nothing changed
        await h.admission.signal("set_policy", {"operator": "ops-alice", "policy": {"max_concurrent": 3}})

        async def applied() -> bool:
            return (await h.query("policy", result_type=AdmissionPolicy)).max_concurrent == 3

        await h.eventually(applied, "the policy change applied")
        metadata = await h.admission.query("__temporal_workflow_metadata")
        details = metadata.current_details
        assert f"admission for host group {h.host_group}: 0 queued, 1 leases held; global 1/3" in details, details
        assert "set_policy" in {s.name for s in metadata.definition.signal_definitions}


async def test_a_failed_workload_fails_and_a_cancelled_mission_is_cancelled(dev_client: Client, substrate, tmp_path):
    async with mission_harness(dev_client, substrate, tmp_path) as h:
        spec = parse_spec(h.spec("ui-truth", [
            {"child_id": "broken", "kind": "one-shot-command", "prompt": "echo no >&2; exit 5"},
            {"child_id": "sleeper", "kind": "one-shot-command", "prompt": "sleep 300"},
        ], aggregation={"mode": "quorum", "minimum_successes": 1}))
        await h.control.start(spec)
        broken = dev_client.get_workflow_handle(workload_workflow_id(spec.mission_id, "broken"))

        async def broken_closed() -> bool:
            try:
                return (await broken.describe()).status == WorkflowExecutionStatus.FAILED
            except RPCError:
                return False  # not started yet

        await h.until(broken_closed, "the failed workload's workflow to be Failed")
        failure = (await broken.fetch_history()).events[-1].workflow_execution_failed_event_attributes.failure
        assert failure.application_failure_info.type == "workload.failed" and failure.application_failure_info.non_retryable
        assert "workload broken: failed" in failure.message
        described = await broken.describe()
        attributes = described.typed_search_attributes
        assert attributes.get(MISSION_ID) == spec.mission_id and attributes.get(WORKLOAD_KIND) == "one-shot-command"
        assert attributes.get(MISSION_HOST_GROUP) == spec.host_group and attributes.get(WORKLOAD_STATE) == "failed"
        # The ledger still tells the child's story as before.
        ledger = await h.control.show(spec.mission_id)
        assert ledger.child("broken").observed_state == "failed" and ledger.child("broken").outcome == "failed"

        await h.control.cancel(spec.mission_id)
        mission = h.control.handle(spec.mission_id)

        async def cancelled_in_visibility() -> bool:
            described = await mission.describe()
            return (described.status == WorkflowExecutionStatus.CANCELED
                    and described.typed_search_attributes.get(MISSION_STATE) == "cancelled")

        await h.until(cancelled_in_visibility, "the mission Cancelled with MissionState cancelled")
        query = f"WorkflowType = 'WorkloadWorkflow' AND MissionId = '{spec.mission_id}' AND ExecutionStatus = 'Failed'"

        async def listed() -> list[str]:
            return [execution.id async for execution in dev_client.list_workflows(query)]

        await h.until(listed, "the UI's Failures filter to find the failed workload")
        assert await listed() == [broken.id]

        admission = await dev_client.get_workflow_handle(admission_workflow_id(spec.host_group)).describe()
        assert admission.typed_search_attributes.get(MISSION_HOST_GROUP) == spec.host_group
        # The ledger stays readable: its JSON reads back as the same ledger.
        assert type(ledger).model_validate_json(ledger.model_dump_json()) == ledger
