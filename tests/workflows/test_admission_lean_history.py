"""What the admission protocol costs in history events, on the time-skipping server.

A busy singleton spends its time on history events, so the protocol avoids the ones it can:
every submit is one signal-with-start (the first creates the singleton), a closing requester can give back without
a confirmation, the singleton keeps one standing timer instead of one per pass, and at most
one audit export is in flight. Each test also checks that nothing was lost on the way.
"""

from __future__ import annotations

from collections import Counter

from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from tests.support.admission_harness import admission_harness
from tests.workflows.test_admission_workflow import HOLD, audit_of, stored_audit
from workflows.admission.model import AdmissionPolicy, AuditEvent
from workflows.admission.probe import ProbeRequest, ProbeResult


async def _event_types(handle) -> list[str]:
    history = await handle.fetch_history()
    return [EventType.Name(event.event_type).removeprefix("EVENT_TYPE_") for event in history.events]


async def test_every_submit_is_one_signal_with_start_and_the_first_creates_the_singleton(
    fresh_time_skipping_env: WorkflowEnvironment, tmp_path,
):
    policy = AdmissionPolicy(max_concurrent=5, lease_ttl_seconds=60)
    async with admission_harness(fresh_time_skipping_env.client, tmp_path, policy) as h:
        first = await h.start_probe("first", ProbeRequest(request_id="first"), hold_seconds=HOLD)
        await h.until_leased("first")
        second = await h.start_probe("second", ProbeRequest(request_id="second"))
        second_result: ProbeResult = await second.result()
        await first.signal("finish")
        first_result: ProbeResult = await first.result()

        assert first_result.final["first"].state == "released"
        assert second_result.final["second"].state == "released"
        for probe in (first, second):
            events = Counter(await _event_types(probe))
            # The submit went through the activity (signal-with-start), never as a signal command
            # that could fail for want of a singleton.
            assert events["ACTIVITY_TASK_SCHEDULED"] == 1
            assert events["SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_FAILED"] == 0
        # One singleton run, started by the first submit; the second submit only signalled it.
        history = await h.admission.fetch_history()
        signals = [e.workflow_execution_signaled_event_attributes.signal_name for e in history.events
                   if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED]
        assert signals.count("submit") == 2


async def test_give_back_without_confirmation_sends_nothing_back(fresh_time_skipping_env: WorkflowEnvironment, tmp_path):
    policy = AdmissionPolicy(max_concurrent=5, lease_ttl_seconds=60)
    async with admission_harness(fresh_time_skipping_env.client, tmp_path, policy) as h:
        holder = await h.start_probe("holder", ProbeRequest(request_id="holder"), hold_seconds=HOLD)
        await h.until_leased("holder")
        quiet = await h.start_probe("quiet", ProbeRequest(request_id="quiet"), confirm_give_back=False)
        result: ProbeResult = await quiet.result()

        # No answer came: the probe recorded its delivered release itself, at the revision it heard.
        quiet_view = result.final["quiet"]
        assert quiet_view.state == "released" and "asked for no confirmation" in quiet_view.reason
        assert quiet_view.revision == next(d.revision for d in result.history if d.state == "admitted")
        assert [d.state for d in result.history] == ["admitted"]  # the singleton's only word to it
        assert Counter(await _event_types(quiet))["WORKFLOW_EXECUTION_SIGNALED"] == 1  # the admission only
        await h.eventually(lambda: _is(h.leased, ["holder"]), "the quiet lease given back")
        assert [e.type for e in await audit_of(h, "quiet")] == ["queued", "admitted", "released"]
        singleton = Counter(await _event_types(h.admission))
        assert singleton["SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED"] == 2  # one admission each, nothing more
        assert singleton["SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_FAILED"] == 0  # never signalled a closed requester
        await holder.signal("finish")
        await holder.result()


async def test_a_give_back_that_finds_no_singleton_is_undone(fresh_time_skipping_env: WorkflowEnvironment, tmp_path):
    """An unconfirmed give-back is recorded as it is sent (a closing mission writes its last
    ledger meanwhile); when the signal finds no singleton, the record is taken back."""
    policy = AdmissionPolicy(max_concurrent=5, lease_ttl_seconds=60)
    async with admission_harness(fresh_time_skipping_env.client, tmp_path, policy) as h:
        quiet = await h.start_probe(
            "quiet", ProbeRequest(request_id="quiet"), hold_seconds=HOLD, renew=False, confirm_give_back=False,
        )
        await h.until_leased("quiet")
        await h.admission.terminate(reason="the singleton is gone")
        await quiet.signal("finish")
        result: ProbeResult = await quiet.result()

        events = Counter(await _event_types(quiet))
        assert events["SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_FAILED"] == 1  # the release, undeliverable
        # What the probe believes is what the singleton last told it, not its own undelivered release.
        view = result.final["quiet"]
        assert view.state == "admitted" and "asked for no confirmation" not in view.reason


async def test_busy_singleton_keeps_one_timer_and_one_audit_export_in_flight(
    fresh_time_skipping_env: WorkflowEnvironment, tmp_path,
):
    policy = AdmissionPolicy(max_concurrent=20, lease_ttl_seconds=60)
    async with admission_harness(fresh_time_skipping_env.client, tmp_path, policy) as h:
        holder = await h.start_probe("holder", ProbeRequest(request_id="holder"), hold_seconds=HOLD)
        await h.until_leased("holder")
        probes = [await h.start_probe(f"p{i}", ProbeRequest(request_id=f"p{i}")) for i in range(8)]
        for probe in probes:
            assert (await probe.result()).final[probe.id.rsplit(":", 1)[1]].state == "released"
        await fresh_time_skipping_env.sleep(300)  # five TTLs: the holder renews, the timer keeps firing
        await holder.signal("finish")
        assert (await holder.result()).final["holder"].state == "released"

        recent = await h.query("audit", 10_000, result_type=list[AuditEvent])
        await h.eventually(lambda: _stored_seqs_are(h, [e.seq for e in recent]), "every audit event stored")
        types = await _event_types(h.admission)
        counts = Counter(types)
        # The wake-up (the earliest lease expiry) moved earlier only for an audit export due (events
        # wait at most AUDIT_EXPORT_DELAY for others to leave with them): at most one timer replaced
        # per export, and every other timer started after the one before it ended.
        assert counts["TIMER_CANCELED"] <= counts["ACTIVITY_TASK_SCHEDULED"]
        assert counts["TIMER_STARTED"] <= counts["TIMER_FIRED"] + counts["TIMER_CANCELED"] + 1
        assert counts["TIMER_FIRED"] >= 3
        in_flight = 0
        for kind in types:
            in_flight += kind == "ACTIVITY_TASK_SCHEDULED"
            in_flight -= kind in ("ACTIVITY_TASK_COMPLETED", "ACTIVITY_TASK_FAILED", "ACTIVITY_TASK_TIMED_OUT")
            assert in_flight <= 1
        # Fewer exports than passes that produced events: the ones made during an export waited and coalesced.
        assert counts["ACTIVITY_TASK_SCHEDULED"] < counts["WORKFLOW_EXECUTION_SIGNALED"]


async def _is(view, expected) -> bool:
    return await view() == expected


async def _stored_seqs_are(h, seqs: list[int]) -> bool:
    stored = [event.seq for event in stored_audit(h)]
    assert len(stored) == len(set(stored)), "an audit event was stored twice"
    return stored == seqs == list(range(1, len(seqs) + 1))
