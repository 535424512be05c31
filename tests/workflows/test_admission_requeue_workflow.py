"""What a requester sees when its lease expires and ADR-004 requeues it, through the real workflow.

The admission workflow forwards every record an engine event touched to its requester, so a
requeue reaches the requester as an `admission_decided` decision with state `queued`,
`happened` naming `requeued` and the requeue reason: its lease is gone (it must stop running:
`AdmissionClient.is_current` is false) and it waits in the queue again.
"""

from __future__ import annotations

from tests.support.admission_harness import admission_harness
from tests.workflows.test_admission_workflow import audit_of, silent_lease_expires_with_a_waiter
from workflows.admission.model import AdmissionPolicy


async def test_an_expired_lease_is_requeued_and_the_requester_is_told_it_is_queued_again(
    fresh_time_skipping_env, tmp_path,
):
    policy = AdmissionPolicy(max_concurrent=1, lease_ttl_seconds=60)  # max_requeue_attempts: default 2
    async with admission_harness(fresh_time_skipping_env.client, tmp_path, policy) as h:
        silent_result = await silent_lease_expires_with_a_waiter(h)

        told = [decision for decision in silent_result.history if "requeued" in decision.happened]
        assert told, silent_result.history
        assert told[0].state == "queued"
        assert told[0].reason == "lease expired; requeued (attempt 1/2)"
        assert told[0].position == 1
        assert told[0].binding_constraint == "global 1/1"
        # The waiter, submitted before the requeue's fresh submission time, got the freed place.
        [requeued] = [e for e in await audit_of(h, "silent") if e.type == "requeued"]
        [admitted] = [e for e in await audit_of(h, "waiter") if e.type == "admitted"]
        assert admitted.seq == requeued.seq + 1
        # A requester that no longer holds its lease gives back what waits: it cancels.
        assert silent_result.final["silent"].state == "cancelled"
