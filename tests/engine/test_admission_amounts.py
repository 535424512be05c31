"""Admission by amounts of named resources, reservations with backfill, the predicted start (eta),
hold and drain: scenarios through `conductor admission simulate`'s own code path (one JSON line
in, one out), and the ETA's promise as a property: when every lease lasts what it declared, a
request's first ETA is the moment it starts.

The rules are Slurm's (consumable resources, and its backfill scheduler's: a later job may use
reserved resources only if it ends before the reservation starts) and Kueue's (quotas of
resource amounts; `stopPolicy: Hold / HoldAndDrain`), as docs/admission-engine.md states them.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worker.simulator import simulate
from workflows.admission import engine
from workflows.admission.model import AdmissionPolicy, AdmissionRequest, Release, Submit

T0 = datetime(2026, 6, 1, 9, 0, tzinfo=timezone.utc)
POLICY = {"max_concurrent": 10, "runtime_quotas": {"host": 10}, "resource_capacity": {"gpu": 4, "memory_gib": 64}}


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def submit(seconds: float, request_id: str, **fields) -> dict:
    return {"at": at(seconds), "op": "submit", "request": {
        "request_id": request_id, "orchestrator_id": "o", "environment": "e", "provider": "p",
        "runtime_kind": "host", "priority": 0, "queue_timeout_seconds": 3600, **fields,
    }}


def run(lines: list[dict], policy: dict = POLICY) -> list[dict]:
    return list(simulate(AdmissionPolicy.model_validate(policy), [json.dumps(line) for line in lines], audit=False))


def test_amounts_fit_until_a_resource_is_used_up_and_the_binding_constraint_names_it():
    out = run([
        submit(0, "a", resources={"gpu": 3, "memory_gib": 16}),
        submit(1, "b", resources={"gpu": 1, "memory_gib": 48}),
        submit(2, "c", resources={"gpu": 0.5}),
        submit(3, "plain"),  # names no resources: counts against the quotas only
        {"at": at(4), "op": "snapshot"},
    ])
    assert [line["record"]["state"] for line in out[:4]] == ["admitted", "admitted", "queued", "admitted"]
    assert out[4]["snapshot"]["queue"] == [
        {"request_id": "c", "position": 1, "effective_priority": 0, "binding_constraint": "resource gpu 4/4", "eta": None},
    ]


def test_a_resource_the_group_lacks_or_more_than_its_capacity_is_denied_at_once_naming_it():
    out = run([submit(0, "tpu", resources={"tpu": 1}), submit(0, "huge", resources={"gpu": 5})])
    assert out[0]["record"]["state"] == "denied"
    assert out[0]["record"]["reason"].startswith("resource tpu is not offered by this host group (it offers gpu, memory_gib)")
    assert out[1]["record"]["state"] == "denied"
    assert out[1]["record"]["reason"] == "resource gpu: asks 5 but the host group has 4 in all: this request can never run"
    bad = run([submit(0, "x", resources={"gpu": 0.0001}), submit(0, "y", resources={"gpu": True}),
               submit(0, "z", resources={"gpu": -1})])
    assert [line["error"]["code"] for line in bad] == ["invalid-request"] * 3
    assert "thousandths" in bad[0]["error"]["message"] and "not true or false" in bad[1]["error"]["message"]
    assert "request.resources.gpu: Input should be greater than or equal to 0" in bad[2]["error"]["message"]
    # A whole amount reads as written, in records and snapshots alike.
    assert run([submit(0, "w", resources={"gpu": 2})])[0]["record"]["resources"] == {"gpu": 2}


def test_backfill_lets_a_request_pass_a_reservation_only_when_it_ends_before_it_starts():
    out = run([
        submit(0, "running", resources={"gpu": 2}, expected_duration_seconds=100),
        submit(1, "big", resources={"gpu": 4}, expected_duration_seconds=100),  # reserved from t=100
        submit(2, "short", resources={"gpu": 2}, expected_duration_seconds=50),  # ends at 52: backfills
        submit(3, "long", resources={"gpu": 2}, expected_duration_seconds=200),  # would end at 203: waits
        submit(4, "open-ended", resources={"gpu": 1}),  # no duration: never ends before anything
        submit(5, "no-gpu", resources={"memory_gib": 8}),  # touches nothing reserved: passes
        {"at": at(52), "op": "release", "request_id": "short"},
        {"at": at(100), "op": "release", "request_id": "running"},
    ])
    states = {line["record"]["request_id"]: line["record"] for line in out if "record" in line}
    assert [out[i]["record"]["state"] for i in range(6)] == ["admitted", "queued", "admitted", "queued", "queued", "admitted"]
    assert out[1]["record"]["eta"] == at(100)  # the reservation's start
    assert out[3]["record"]["eta"] == at(200)  # after big, which ends at 200
    assert out[4]["record"]["eta"] == at(200)
    assert states["running"]["state"] == "released"
    # At t=100 the reservation is honoured: big starts, nothing passed it.
    assert out[7]["ok"] and out[7]["record"]["state"] == "released"
    snap = run([*([submit(0, "running", resources={"gpu": 2}, expected_duration_seconds=100),
                   submit(1, "big", resources={"gpu": 4}, expected_duration_seconds=100),
                   submit(3, "long", resources={"gpu": 2}, expected_duration_seconds=200)]),
                {"at": at(4), "op": "snapshot"}])[-1]["snapshot"]
    assert [entry["binding_constraint"] for entry in snap["queue"]] == ["resource gpu 2/4", "resource gpu reserved for big"]


def test_a_big_request_is_not_starved_by_a_stream_of_small_ones():
    lines = [submit(0, "s0", resources={"gpu": 3}, expected_duration_seconds=10), submit(1, "big", resources={"gpu": 4})]
    # One small request every 5 s, each for longer than the time to big's reservation.
    lines += [submit(2 + 5 * n, f"s{n + 1}", resources={"gpu": 1}, expected_duration_seconds=30) for n in range(4)]
    lines += [{"at": at(10), "op": "release", "request_id": "s0"}, {"at": at(10), "op": "snapshot"}]
    out = run(lines, POLICY)
    snapshot = out[-1]["snapshot"]
    assert snapshot["records"]["big"]["state"] == "admitted"
    assert all(snapshot["records"][f"s{n}"]["state"] == "queued" for n in range(1, 5))


def preempted(lines: list[dict], policy: dict) -> set[str]:
    records = run([*lines, {"at": at(9), "op": "snapshot"}], policy)[-1]["snapshot"]["records"]
    return {rid for rid, record in records.items() if record["state"] == "preempted"}


def test_preemption_by_amounts_takes_the_fewest_leases_the_weakest_first_and_only_when_enough():
    policy = {**POLICY, "allow_preemption": True}
    urgent = submit(1, "urgent", resources={"gpu": 2}, priority=9)
    # One lease that alone makes room beats two weaker ones: the fewest first.
    assert preempted([submit(0, "w1", resources={"gpu": 1}, preemptible=True, priority=1),
                      submit(0, "w2", resources={"gpu": 1}, preemptible=True, priority=2),
                      submit(0, "w3", resources={"gpu": 2}, preemptible=True, priority=3), urgent], policy) == {"w3"}
    # No single lease is enough: the weakest are taken until it fits, then any not needed is given back.
    assert preempted([submit(0, "w1", resources={"gpu": 1}, preemptible=True, priority=1),
                      submit(0, "w2", resources={"gpu": 1}, preemptible=True, priority=2),
                      submit(0, "w3", resources={"gpu": 1}, preemptible=True, priority=3),
                      submit(0, "keep", resources={"gpu": 1}), urgent], policy) == {"w1", "w2"}
    # Even every preemptible lease together would not make room: nobody is preempted.
    assert preempted([submit(0, "keep", resources={"gpu": 3}),
                      submit(0, "w", resources={"gpu": 1}, preemptible=True), urgent], policy) == set()


def test_hold_admits_nothing_new_lets_leases_run_and_drain_preempts_the_preemptible():
    held = {**POLICY, "hold": True, "hold_reason": "kernel upgrade"}
    out = run([
        submit(0, "stays", resources={"gpu": 1}),
        submit(0, "goes", resources={"gpu": 1}, preemptible=True),
        {"at": at(1), "op": "set_policy", "policy": held, "operator": "ops", "drain": True},
        submit(2, "waits", queue_timeout_seconds=30),
        {"at": at(3), "op": "snapshot"},
        {"at": at(40), "op": "snapshot"},
        {"at": at(41), "op": "set_policy", "policy": POLICY, "operator": "ops"},
    ], POLICY)
    snapshot = out[4]["snapshot"]
    assert snapshot["records"]["stays"]["state"] == "admitted"
    assert snapshot["records"]["goes"]["state"] == "preempted"
    assert snapshot["records"]["goes"]["reason"] == "drained by ops: kernel upgrade"
    assert snapshot["queue"][0]["binding_constraint"] == "hold: kernel upgrade"
    assert out[5]["snapshot"]["records"]["waits"]["state"] == "timed-out"  # its queue deadline still ran


# --- the ETA's promise ----------------------------------------------------------------------------


@st.composite
def fifo_traces(draw) -> list[tuple[int, dict, int]]:
    """Requests arriving in order at one priority, each (arrival second, amounts, duration)."""
    count = draw(st.integers(2, 25))
    clock = 0
    trace = []
    for _ in range(count):
        clock += draw(st.integers(0, 20))
        amounts = draw(st.dictionaries(st.sampled_from(["gpu", "mem"]), st.sampled_from([0.5, 1, 2, 3, 4]), min_size=1))
        trace.append((clock, amounts, draw(st.integers(1, 120))))
    return trace


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fifo_traces())
def test_first_eta_is_the_actual_start_when_every_lease_lasts_what_it_declared(trace):
    """Each request's ETA right after it was submitted equals the moment it starts, when every
    lease ends exactly at admitted_at + expected_duration_seconds: a reservation is never broken
    by a later arrival, and the forecast plays the same engine."""
    policy = AdmissionPolicy(max_concurrent=100, runtime_quotas={"host": 100}, resource_capacity={"gpu": 4, "mem": 4})
    state = engine.new_state(policy)
    first_eta: dict[str, datetime | None] = {}
    started: dict[str, datetime] = {}
    arrivals = [(T0 + timedelta(seconds=second), f"r{index:02d}", amounts, duration)
                for index, (second, amounts, duration) in enumerate(trace)]
    ends: list[tuple[datetime, str]] = []

    def note(events, moment):
        for event in events:
            if event.type == "admitted":
                started[event.request_id] = moment
                rec = state.records[event.request_id]
                ends.append((moment + timedelta(microseconds=rec.duration_us), event.request_id))

    while arrivals or ends:
        ends.sort()
        if ends and (not arrivals or ends[0][0] <= arrivals[0][0]):
            moment, request_id = ends.pop(0)
            state, _, events = engine.apply(state, Release(request_id=request_id), moment)
        else:
            moment, request_id, amounts, duration = arrivals.pop(0)
            state, result, events = engine.apply(state, Submit(request=AdmissionRequest(
                request_id=request_id, orchestrator_id="o", environment="e", provider="p", runtime_kind="host",
                priority=0, queue_timeout_seconds=86_400, submitted_at=moment, resources=amounts,
                expected_duration_seconds=duration,
            )), moment)
            first_eta[request_id] = moment if result.record.state == "admitted" else engine.forecast(state, [request_id])[request_id]
            assert first_eta[request_id] is None or first_eta[request_id] >= moment, "an ETA in the past"
        note(events, moment)
    assert set(started) == set(first_eta)
    assert {rid: first_eta[rid] for rid in started} == started


def test_what_if_says_when_a_request_that_would_queue_is_expected_to_start():
    """The singleton's what_if query (workflows.admission.singleton.what_if): a request that would
    wait gets its predicted start, from a copy: nothing is submitted."""
    from collections import deque

    from workflows.admission.singleton import SingletonState, what_if

    state = engine.new_state(AdmissionPolicy.model_validate(POLICY))
    for line in (submit(0, "running", resources={"gpu": 3}, expected_duration_seconds=100),):
        request = AdmissionRequest.model_validate({**line["request"], "submitted_at": T0})
        state, _, _ = engine.apply(state, Submit(request=request), T0)
    core = SingletonState(host_group="g", engine=state, requesters={}, audit_chain="run-1", recent=deque())
    asked = AdmissionRequest.model_validate({**submit(1, "next", resources={"gpu": 2})["request"], "submitted_at": T0})
    answer = what_if(core, asked)
    assert (answer.outcome, answer.eta) == ("queued", T0 + timedelta(seconds=100))
    assert answer.explanation == "position 1, waiting on resource gpu 3/4"
    assert "next" not in state.records
    fits = what_if(core, asked.model_copy(update={"resources": {"gpu": 1}}))
    assert (fits.outcome, fits.eta) == ("admitted", None)


def test_a_forecast_with_a_budget_of_moments_gives_no_eta_past_it():
    """Inside a workflow task the singleton forecasts over a bounded number of moments
    (singleton.FORECAST_MOMENTS): a start further out than the budget is unknown, never wrong."""
    lines = [submit(0, "running", resources={"gpu": 4}, expected_duration_seconds=10)]
    lines += [submit(1 + n, f"w{n}", resources={"gpu": 4}, expected_duration_seconds=10) for n in range(3)]
    state = engine.new_state(AdmissionPolicy.model_validate(POLICY))
    for line in lines:
        moment = datetime.fromisoformat(line["at"].replace("Z", "+00:00"))
        state, _, _ = engine.apply(state, Submit(request=AdmissionRequest.model_validate(
            {**line["request"], "submitted_at": moment})), moment)
    unbounded = engine.forecast(state)
    assert unbounded == {"w0": T0 + timedelta(seconds=10), "w1": T0 + timedelta(seconds=20), "w2": T0 + timedelta(seconds=30)}
    assert engine.forecast(state, moments=2) == {"w0": unbounded["w0"], "w1": unbounded["w1"], "w2": None}
