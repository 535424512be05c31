"""The continue-as-new payload stays far from the server's 2 MB limit with 10,000 queued requests."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter

from workflows.admission import codec, engine
from workflows.admission.messages import AdmissionWorkflowInput
from workflows.admission.model import AdmissionPolicy, AdmissionRequest, Submit
from workflows.admission.singleton import SingletonState


@pytest.mark.slow
def test_carried_state_with_10000_queued_mission_requests_is_under_1_mb() -> None:
    policy = AdmissionPolicy(max_concurrent=50, runtime_quotas={"host": 50})
    state = engine.new_state(policy)
    requesters: dict[str, str] = {}
    base = datetime(2026, 11, 1, tzinfo=timezone.utc)
    for index in range(10_050):
        mission = f"mission:{uuid.UUID(int=index // 10)}"  # mission-shaped: 44-character requester ids
        request_id = f"{mission.removeprefix('mission:')}:child-{index % 10}"
        at = base + timedelta(milliseconds=index)
        state, _, _ = engine.apply(state, Submit(request=AdmissionRequest(
            request_id=request_id, orchestrator_id="mission-control", environment="prod", provider="local",
            runtime_kind="host", priority=index % 7, submitted_at=at, queue_timeout_seconds=86_400,
        )), at)
        requesters[request_id] = mission
    assert state.queued_count == 10_000

    carried = SingletonState(host_group="default", engine=state, requesters=requesters, audit_chain="run-1").carry()
    payload = pydantic_data_converter.payload_converter.to_payloads(
        [AdmissionWorkflowInput(host_group="default", policy=policy, carried=carried)]
    )[0]
    assert len(payload.data) < 1_000_000, len(payload.data)

    # And it carries everything: the decoded state decides exactly like the original.
    restored, carried_requesters = codec.decode_carried(carried.engine)
    assert engine.snapshot(restored) == engine.snapshot(state)
    assert carried_requesters == requesters


@pytest.mark.slow
def test_a_burst_of_30000_submitted_requests_carried_in_the_inbox_stays_under_the_payload_limit() -> None:
    """Signals that arrive while a run hands over are carried: a burst of submits must not make
    continue-as-new fail (it would fail on every retry, and the singleton would be stuck)."""
    from workflows.admission.messages import InboxItem, SubmitBatch

    policy = AdmissionPolicy(max_concurrent=100_000)
    base = datetime(2026, 11, 1, tzinfo=timezone.utc)
    inbox = []
    for mission_index in range(300):
        mission = f"mission:{uuid.UUID(int=mission_index)}"
        inbox.append(InboxItem(kind="submit", submit=SubmitBatch(requester=mission, requests=[
            AdmissionRequest(
                request_id=f"{mission}/w{i}", orchestrator_id=mission, environment="prod", provider="local",
                runtime_kind="container", priority=0, submitted_at=base, queue_timeout_seconds=3600,
            )
            for i in range(100)
        ])))
    carried = SingletonState(host_group="default", engine=engine.new_state(policy), requesters={}, audit_chain="run-1", inbox=inbox).carry()
    payload = pydantic_data_converter.payload_converter.to_payloads(
        [AdmissionWorkflowInput(host_group="default", policy=policy, carried=carried)]
    )[0]
    assert len(payload.data) < 1_000_000, len(payload.data)
    decoded = AdmissionWorkflowInput.model_validate_json(payload.data).carried
    assert decoded is not None and decoded.inbox_packed is not None
    assert [InboxItem.model_validate(item) for item in codec.unpack_json(decoded.inbox_packed)] == inbox
