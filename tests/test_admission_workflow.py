"""AdmissionWorkflow + requesters on the time-skipping server: leases live on durable timers."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio.testing import WorkflowEnvironment

from activities.audit_store import AuditStore
from tests.admission_harness import admission_harness
from workflows.admission.messages import LeaseRow, QueueRow
from workflows.admission.model import AdmissionPolicy
from workflows.admission.probe import ProbeRequest, ProbeResult


async def test_requesters_share_one_admission_workflow_serialised(time_skipping_env: WorkflowEnvironment, tmp_path):
    policy = AdmissionPolicy(max_concurrent=1, lease_ttl_seconds=60)
    async with admission_harness(time_skipping_env.client, tmp_path, policy) as h:
        first = await h.start_probe("a", ProbeRequest(request_id="a"), hold_seconds=600)
        second = await h.start_probe("b", ProbeRequest(request_id="b"), hold_seconds=600)
        a: ProbeResult = await first.result()
        b: ProbeResult = await second.result()
        assert a.ever_admitted == ["a"] and b.ever_admitted == ["b"]
        assert a.final["a"].state == "released" and b.final["b"].state == "released"
        # b waited behind a: it was told it was queued on the global limit first.
        queued = [d for d in b.history if d.state == "queued"]
        assert queued and queued[0].binding_constraint == "global 1/1" and queued[0].position == 1
        # a held its lease for 600 s of workflow time on a 60 s TTL: renewals kept it alive.
        assert a.final["a"].lease_revision > 5
        events = AuditStore(h.config.audit_db).events(h.host_group)
        assert [e.type for e in events if e.request_id == "b"][:2] == ["queued", "admitted"]
        assert [e.seq for e in events] == sorted({e.seq for e in events})
