"""A mission renews its leases as a requester (docs/scaling.md, "The plan past it", item 2): one
`renew` signal per round naming no lease, no decision back, and the leases stay held. Read from
both histories on the dev server, with a 6 s lease: a round every 2 s, and 4 s for each renewal
to arrive (on a shared machine a 1 s margin is sometimes missed, and a renewal that may have
arrived late is rightly followed by one that names its leases)."""

from __future__ import annotations

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from activities.ledger_store import SqliteLedgerStore
from tests.support.mission_harness import mission_harness
from tests.support.substrate_fixtures import substrate, substrate_tasks  # noqa: F401  (fixture)
from worker.mission_control import parse_spec
from workflows.admission.messages import DECISION_SIGNAL, LeaseRow, RenewBatch, admission_workflow_id
from workflows.admission.model import AdmissionPolicy, AuditEvent
from workflows.mission.ledger import WRITE_LEDGER_SNAPSHOT_ACTIVITY
from workflows.ids import admission_request_id, fleet_child_id

SHORT_LEASES = AdmissionPolicy(max_concurrent=8, runtime_quotas={"host": 8}, lease_ttl_seconds=6)
ROUNDS = 4
UP = ("running", "healthy")  # a persistent agent's and a daemon's state while they run
CHILDREN = [
    {"child_id": "api", "kind": "daemon", "prompt": "sleep 300"},
    {"child_id": "agent", "kind": "persistent-agent", "prompt": "sleep 300"},
]


async def _chain(client: Client, workflow_id: str) -> list:
    """Every event of every run so far, first run first: on the dev server of the tests both
    workflows continue as new every hundred events or so (conftest.DEV_SERVER_DYNAMIC_CONFIG)."""
    first = (await client.get_workflow_handle(workflow_id).describe()).raw_description.workflow_execution_info.first_run_id
    events, run_id = [], first
    while run_id:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        events.extend(history.events)
        last = history.events[-1]
        run_id = (
            last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
            if last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW else None
        )
    return events


def _renewals_from(events: list, requester: str) -> list[RenewBatch]:
    renewals = []
    for event in events:
        if event.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            continue
        signaled = event.workflow_execution_signaled_event_attributes
        if signaled.signal_name != "renew":
            continue
        [batch] = pydantic_data_converter.payload_converter.from_payloads(signaled.input.payloads, [RenewBatch])
        if batch.requester == requester:
            renewals.append(batch)
    return renewals


def _count(events: list, event_type: EventType.ValueType, test=lambda event: True) -> int:
    return sum(1 for event in events if event.event_type == event_type and test(event))


def _is_snapshot(event) -> bool:
    return event.activity_task_scheduled_event_attributes.activity_type.name == WRITE_LEDGER_SNAPSHOT_ACTIVITY


def _is_decision_to(mission_workflow_id: str):
    def test(event) -> bool:
        attributes = event.signal_external_workflow_execution_initiated_event_attributes
        return attributes.signal_name == DECISION_SIGNAL and attributes.workflow_execution.workflow_id == mission_workflow_id
    return test


async def test_a_mission_renews_its_leases_as_a_requester_and_hears_nothing_back(dev_client: Client, substrate, tmp_path):
    async with mission_harness(dev_client, substrate, tmp_path, policy=SHORT_LEASES) as h:
        spec = parse_spec(h.spec("requester-renewal", CHILDREN))
        verdict = await h.control.run(spec)
        assert verdict.parent_state == "completed", verdict.aggregation.reason
        handle = h.control.handle(spec.mission_id)
        singleton = dev_client.get_workflow_handle(admission_workflow_id(spec.host_group))

        async def settled():
            # Both children up and their ledger written (stored, and no snapshot write in flight or
            # waiting out the interval between writes): from here on, renewal rounds are the only
            # thing going on.
            ledger = await h.control.show(spec.mission_id)
            if any(ledger.child(child["child_id"]).observed_state not in UP for child in CHILDREN):
                return None
            stored = SqliteLedgerStore(h.config.ledger_db).latest(spec.mission_id)
            if stored is None or stored.snapshot_seq != ledger.snapshot_seq:
                return None
            events = await _chain(dev_client, handle.id)
            scheduled = _count(events, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)
            if _count(events, EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED) != scheduled:
                return None
            return ledger if ledger.snapshot_seq == (await h.control.show(spec.mission_id)).snapshot_seq else None

        before = await h.until(settled, "the children up and the ledger written")
        mission_before = await _chain(dev_client, handle.id)
        singleton_before = await _chain(dev_client, singleton.id)
        at_start = len(_renewals_from(singleton_before, handle.id))

        async def rounds():
            renewals = _renewals_from(await _chain(dev_client, singleton.id), handle.id)
            return renewals if len(renewals) >= at_start + ROUNDS else None

        renewals = await h.until(rounds, f"{ROUNDS} renewal rounds", within=2 * ROUNDS + 20)
        singleton_after = await _chain(dev_client, singleton.id)
        mission_after = await _chain(dev_client, handle.id)

        # Every renewal the mission sent is a requester renewal: everything it holds, no lease named
        # (a lease named would be one the mission feared the renewal reached too late: none here).
        assert renewals, "the mission sent no renewal"
        for renewal in renewals:
            assert renewal.everything and renewal.leases == [], renewal
            assert renewal.sent_at is not None

        # Nothing comes back for them: no decision signal to the mission while the rounds ran, no
        # `renewed` audit event, nothing expired or requeued; the leases keep the revision of their admission.
        sent_back = EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED
        assert _count(singleton_after, sent_back, _is_decision_to(handle.id)) == _count(
            singleton_before, sent_back, _is_decision_to(handle.id),
        ), "the singleton answered a requester renewal"
        audit = await singleton.query("audit", 200, result_type=list[AuditEvent])
        types = [event.type for event in audit if event.request_id.startswith(f"{spec.mission_id}:")]
        assert types.count("admitted") == len(CHILDREN), types
        assert not {"renewed", "requeued", "timed-out", "preempted"} & set(types), types
        leases = await singleton.query("leases", result_type=list[LeaseRow])
        assert sorted(row.request_id for row in leases) == sorted(admission_request_id(spec.mission_id, c["child_id"]) for c in CHILDREN)
        assert all(row.lease_revision == 1 and row.holder == handle.id for row in leases), leases

        # The mission's side: no decision arrived, so no ledger snapshot per round (per-lease renewals
        # wrote one each: a new lease revision in the ledger), and its children ran on untouched.
        ledger = await h.control.show(spec.mission_id)
        assert ledger.snapshot_seq == before.snapshot_seq, "the ledger changed while only renewals happened"
        scheduled = EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        assert _count(mission_after, scheduled, _is_snapshot) == _count(mission_before, scheduled, _is_snapshot)
        received = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
        decisions_heard = lambda event: event.workflow_execution_signaled_event_attributes.signal_name == DECISION_SIGNAL  # noqa: E731
        assert _count(mission_after, received, decisions_heard) == _count(mission_before, received, decisions_heard)
        for child in CHILDREN:
            shown = ledger.child(child["child_id"])
            assert shown.observed_state in UP and shown.attempt == 1 and shown.stopping is None, shown
            assert len(substrate_tasks(substrate, fleet_child_id(spec.mission_id, child["child_id"]))) == 1

        # Stopping still gives every lease back.
        await h.control.stop(spec.mission_id)
        final = await handle.result()
        assert final.parent_state == "completed"
        assert await h.admission_leases(spec.host_group) == []
