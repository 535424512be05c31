"""Requester renewals (`AdmissionClient(renewal="requester")`): one signal naming no lease, no answer.

What they must keep from per-lease renewals: a lease held for as long as its holder renews,
across the singleton's continue-as-new. What they drop: the decision, the new lease revision
and the audit event per lease per round (docs/scaling.md).
"""

from __future__ import annotations

from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from activities.admission import signal_with_start_admission
from tests.support.admission_harness import admission_harness
from tests.workflows.test_admission_workflow import audit_of
from workflows.admission.messages import PolicyChange
from workflows.admission.model import AdmissionPolicy
from workflows.admission.probe import ProbeRequest, ProbeResult


async def test_requester_renewals_hold_leases_for_hours_without_an_answer_per_round(
    fresh_time_skipping_env: WorkflowEnvironment, tmp_path,
):
    policy = AdmissionPolicy(max_concurrent=3, lease_ttl_seconds=300)
    async with admission_harness(fresh_time_skipping_env.client, tmp_path, policy) as h:
        requests = [ProbeRequest(request_id=f"long-{i}") for i in range(3)]
        handle = await h.start_probe("long", *requests, hold_seconds=3 * 3600, renewal="requester")
        result: ProbeResult = await handle.result()
        for request in requests:
            final = result.final[request.request_id]
            assert final.state == "released"
            # Admitted once and never renewed by name: still the lease revision of the admission ...
            assert final.lease_revision == 1
            # ... yet the singleton moved its expiry on for three hours (36 TTLs), one round at a time.
            [admitted] = [d for d in result.history if d.request_id == request.request_id and d.state == "admitted"]
            assert (final.lease_expires_at - admitted.lease_expires_at).total_seconds() > 3 * 3600 - 2 * 300
        # No answer per round: the admission and the confirmed release are all this requester heard.
        assert len(result.history) <= 2 * len(requests)
        types = [event.type for event in await audit_of(h)]
        assert "renewed" not in types and "timed-out" not in types and "requeued" not in types
        assert types.count("admitted") == 3 and types.count("released") == 3


async def test_requester_renewals_survive_the_singletons_continue_as_new(dev_client: Client, tmp_path):
    # A 3 s lease renewed every second, and a singleton that continues as new every 100 events:
    # renewals arrive while runs hand over, are carried in the inbox, and still take effect
    # as of when they were sent.
    policy = AdmissionPolicy(max_concurrent=10, lease_ttl_seconds=3)
    async with admission_harness(dev_client, tmp_path, policy) as h:
        await signal_with_start_admission(
            dev_client, h.config.task_queue, h.host_group, policy, "set_policy",
            PolicyChange(operator="test", policy=policy), max_history_events=100,
        )
        probes = [
            await h.start_probe(
                f"holder-{n}", *(ProbeRequest(request_id=f"h{n}-{i}") for i in range(2)),
                hold_seconds=20, renewal="requester",
            )
            for n in range(3)
        ]
        results: list[ProbeResult] = [await probe.result() for probe in probes]
        for result in results:
            assert {d.state for d in result.history} == {"admitted", "released"}, result.history
            assert all(final.state == "released" for final in result.final.values())
        runs = [run async for run in dev_client.list_workflows(f"WorkflowId = '{h.admission.id}'")]
        assert len(runs) >= 3, f"the singleton continued as new only {len(runs) - 1} times"
        types = [event.type for event in await audit_of(h)]
        assert "requeued" not in types and "timed-out" not in types


async def test_a_burst_is_decided_in_passes_of_bounded_size(dev_client: Client, tmp_path):
    """A singleton deciding two requests per pass: five submitted at once are all admitted, in
    three passes, each answered in a workflow task of its own."""
    from temporalio.api.enums.v1 import EventType

    policy = AdmissionPolicy(max_concurrent=10)
    async with admission_harness(dev_client, tmp_path, policy) as h:
        await signal_with_start_admission(
            dev_client, h.config.task_queue, h.host_group, policy, "set_policy",
            PolicyChange(operator="test", policy=policy), max_requests_per_pass=2,
        )
        burst = await h.start_probe("burst", *(ProbeRequest(request_id=f"b{i}") for i in range(5)), hold_seconds=1)
        result: ProbeResult = await burst.result()
        assert result.ever_admitted == [f"b{i}" for i in range(5)]
        history = await h.admission.fetch_history()
        answers = [
            event for event in history.events
            if event.event_type == EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED
            and event.signal_external_workflow_execution_initiated_event_attributes.workflow_execution.workflow_id == burst.id
        ]
        assert len(answers) >= 3 + 1, "three passes of admissions, then the confirmed release"
