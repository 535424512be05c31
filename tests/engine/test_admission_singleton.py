"""The admission singleton's pure core (workflows/admission/singleton.py), with no server.

Random traces of what the shell hands it (signals from three requesters, one of them a holder,
requesters found gone, time passing, audit exports ending) and the invariants the shell relies on:
- a pass takes at most `max_requests_per_pass` requests, renewals aside, and loses or repeats no
  inbox item;
- a requester hears only of its own requests: a renewal, release or cancellation naming another's
  is answered `unknown`, and no decision about a request goes to anyone but its owner;
- every audit event leaves in exactly one export, in order, no more than one export in flight;
- a state carried at continue-as-new decides on exactly as the original (`carry`/`restoring`).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workflows.admission import engine, singleton
from workflows.admission.messages import (
    AdmissionWorkflowInput,
    CancelBatch,
    InboxItem,
    LeaseRef,
    ReleaseBatch,
    RenewBatch,
    SubmitBatch,
    SweepResult,
)
from workflows.admission.model import AdmissionPolicy, AdmissionRequest

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
POLICY = AdmissionPolicy(max_concurrent=2, lease_ttl_seconds=30)
REQUESTERS = ["mission:a", "mission:b", "holder:default/agent/h1"]
IDS = [f"r{i}" for i in range(6)]


def request(request_id: str, at: datetime) -> AdmissionRequest:
    return AdmissionRequest(
        request_id=request_id, orchestrator_id="mission-control", environment="prod", provider="local",
        runtime_kind="host", priority=0, submitted_at=at, queue_timeout_seconds=60,
    )


@st.composite
def steps(draw) -> list[tuple]:
    out = []
    for _ in range(draw(st.integers(1, 25))):
        kind = draw(st.sampled_from(["submit", "renew", "renew-all", "release", "cancel", "gone", "wait", "stored"]))
        requester = draw(st.sampled_from(REQUESTERS))
        ids = draw(st.lists(st.sampled_from(IDS), min_size=1, max_size=4))
        out.append((kind, requester, ids, draw(st.integers(0, 40))))
    return out


def item(kind: str, requester: str, ids: list[str], now: datetime) -> InboxItem:
    if kind == "submit":
        return InboxItem(kind="submit", submit=SubmitBatch(requester=requester, requests=[request(i, now) for i in ids]))
    if kind == "renew":
        return InboxItem(kind="renew", renew=RenewBatch(requester=requester, leases=[LeaseRef(request_id=i, lease_revision=1) for i in ids]))
    if kind == "renew-all":
        return InboxItem(kind="renew", renew=RenewBatch(requester=requester, everything=True, sent_at=now))
    batch = (ReleaseBatch if kind == "release" else CancelBatch)(requester=requester, request_ids=ids)
    return InboxItem(kind=kind, **{kind: batch})


def new_core(max_per_pass: int) -> singleton.SingletonState:
    input = AdmissionWorkflowInput(host_group="default", policy=POLICY, max_requests_per_pass=max_per_pass)
    core, restore = singleton.SingletonState.restoring(input, "run-1", T0, T0)
    assert restore is None
    return core


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=steps(), max_per_pass=st.integers(1, 5))
def test_passes_decide_every_item_once_and_tell_only_owners(trace: list[tuple], max_per_pass: int) -> None:
    core = new_core(max_per_pass)
    now = T0
    exported: list[int] = []
    produced: list[int] = []
    for kind, requester, ids, seconds in trace:
        now += timedelta(seconds=seconds)
        if kind == "wait":
            pass
        elif kind == "gone":
            core.gone.add(requester)
        elif kind == "stored":
            if core.outbox.exporting:
                exported.extend(event.seq for event in core.outbox.exporting)
                core.outbox.stored(now)
        else:
            singleton.hear(core, item(kind, requester, ids, now))
        while singleton.has_work(core, now):
            owners = dict(core.requesters)
            decided = singleton.decide(core, now)
            produced.extend(event.seq for event in decided.events)
            for to, batch in decided.signals:
                for answer in batch.decisions:
                    owner = core.requesters.get(answer.request_id, owners.get(answer.request_id))
                    if answer.state != "unknown":
                        assert owner == to, (answer, to)
            core.outbox.take(now)
    # Everything leaves: the rest, export by export.
    while core.outbox.unstored():
        if not core.outbox.exporting:
            core.outbox.due = now
            assert core.outbox.take(now)
        exported.extend(event.seq for event in core.outbox.exporting)
        core.outbox.stored(now)
    assert exported == produced  # each event once, in the order the engine wrote them


@settings(max_examples=200, deadline=None)
@given(trace=steps(), max_per_pass=st.integers(1, 5))
def test_passes_take_the_inbox_in_order_within_their_budget_and_lose_nothing(trace: list[tuple], max_per_pass: int) -> None:
    core = new_core(max_per_pass)
    for kind, requester, ids, _ in trace:
        if kind in ("submit", "renew", "renew-all", "release", "cancel"):
            singleton.hear(core, item(kind, requester, ids, T0))
    heard = list(core.inbox)
    passes = []
    while core.inbox:
        passes.append(singleton.take_inbox(core))
    renewals = [i for i in heard if i.renew is not None and i.renew.everything]
    assert not heard or passes[0][: len(renewals)] == renewals  # every requester renewal goes first, in the first pass
    others = [taken[len(renewals):] if n == 0 else taken for n, taken in enumerate(passes)]
    for taken in others:
        weight = sum(singleton._weight(i) for i in taken)
        assert weight <= max_per_pass or len(taken) == 1, (max_per_pass, taken)  # only a lone item may exceed it
    # Nothing lost, repeated or reordered: a submit split over passes joins up again.
    def flat(items):
        out = []
        for i in items:
            if i.submit is not None:
                out += [("submit", i.submit.requester, r.request_id) for r in i.submit.requests]
            elif not (i.renew is not None and i.renew.everything):
                out.append(i)
        return out
    assert flat(i for taken in others for i in taken) == flat(heard)


def test_a_renewal_naming_another_requesters_lease_is_answered_unknown() -> None:
    core = new_core(10)
    singleton.hear(core, item("submit", "mission:a", ["r1"], T0))
    singleton.decide(core, T0)
    singleton.hear(core, item("release", "mission:b", ["r1"], T0))
    decided = singleton.decide(core, T0)
    assert [(to, [d.state for d in batch.decisions]) for to, batch in decided.signals] == [("mission:b", ["unknown"])]
    assert core.engine.records["r1"].state == "admitted"


def test_a_pass_takes_every_renewal_first_and_splits_a_big_submit() -> None:
    core = new_core(2)
    singleton.hear(core, item("submit", "mission:a", ["r1", "r2", "r3"], T0))
    singleton.hear(core, item("renew-all", "mission:b", [], T0))
    taken = singleton.take_inbox(core)
    assert [i.kind for i in taken] == ["renew", "submit"]
    assert [r.request_id for r in taken[1].submit.requests] == ["r1", "r2"]
    assert [r.request_id for r in core.inbox[0].submit.requests] == ["r3"]


def test_an_expired_holder_lease_ends_and_the_holder_hears_it() -> None:
    core = new_core(10)
    holder = REQUESTERS[2]
    singleton.hear(core, item("submit", holder, ["r1"], T0))
    singleton.decide(core, T0)
    decided = singleton.decide(core, T0 + timedelta(seconds=31))
    assert core.engine.records["r1"].state == "cancelled"
    assert [(to, batch.decisions[0].state) for to, batch in decided.signals] == [(holder, "cancelled")]


def test_an_unreachable_requester_gives_back_at_the_next_pass() -> None:
    core = new_core(10)
    singleton.hear(core, item("submit", "mission:a", ["r1"], T0))
    singleton.decide(core, T0)
    assert singleton.requester_unreachable(core, "mission:a")
    assert not singleton.requester_unreachable(core, "mission:b")  # holds nothing: nothing to do
    singleton.decide(core, T0)
    assert core.engine.records["r1"].state == "released"


def test_the_sweep_clock_starts_one_sweep_at_a_time_and_moves_on_from_where_it_read() -> None:
    clock = singleton.SweepClock(swept_from=T0)
    assert clock.start(T0, 60, anything_held=True) is None  # the first interval starts now
    assert clock.start(T0 + timedelta(seconds=60), 60, anything_held=False) is None  # nothing to free
    assert clock.start(T0 + timedelta(seconds=61), 60, anything_held=True) == timedelta(seconds=60)
    assert clock.start(T0 + timedelta(seconds=200), 60, anything_held=True) is None  # one in flight
    assert clock.ended(SweepResult(supported=True, gone=["mission:a"], next_closed_since=T0 + timedelta(seconds=61))) == ["mission:a"]
    assert clock.swept_from == T0 + timedelta(seconds=61)
    assert clock.ended(SweepResult(supported=False, gone=[], next_closed_since=T0)) == [] and clock.unsupported
    assert clock.start(T0 + timedelta(seconds=999), 60, anything_held=True) is None


def test_the_carried_state_decides_on_exactly_as_the_original() -> None:
    core = new_core(10)
    for index, requester in enumerate(REQUESTERS):
        singleton.hear(core, item("submit", requester, [f"r{index}"], T0))
    singleton.decide(core, T0)
    singleton.hear(core, item("cancel", "mission:a", ["r0"], T0))  # still in the inbox when it hands over
    core.gone.add("mission:b")
    input = AdmissionWorkflowInput(host_group="default", policy=core.engine.policy, max_requests_per_pass=10,
                                   restore_records_per_task=1, carried=core.carry())
    later = T0 + timedelta(seconds=5)
    restored, restore = singleton.SingletonState.restoring(input, "run-2", later, later)
    assert restore is not None  # three records, one a slice
    while not restore.step(1):
        pass
    restored.index()
    assert restored.audit_chain == "run-1" and restored.outbox.waiting == core.outbox.unstored()
    assert list(restored.recent) == list(core.recent)
    a, b = singleton.decide(core, later), singleton.decide(restored, later)
    assert a.signals == b.signals and a.events == b.events
    assert engine.snapshot(core.engine) == engine.snapshot(restored.engine)
