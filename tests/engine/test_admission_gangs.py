"""Gang admission: requests of one orchestrator with one gang id run all together or not at all.

All-or-nothing admission as Kueue and Slurm heterogeneous jobs offer it: the engine admits a
gang only when every member fits at once, never holds part of a gang while the rest waits (so
two gangs cannot deadlock), shows the member and limit that block a waiting gang, and takes or
spares a gang whole (preemption takes it whole, lane override spares it, a lease expiry
requeues or ends every admitted member). Semantics: docs/admission-engine.md.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tests.engine.test_admission_scenarios import HostGroup, request
from workflows.admission import codec, engine
from workflows.admission.model import AdmissionRequest, Cancel, Reconcile, Release, Renew, Submit


def test_a_gang_waits_until_every_member_is_there_then_all_are_admitted_together() -> None:
    group = HostGroup(max_concurrent=5)
    group.submit("m1", gang=("g", 3))
    group.submit("m2", gang=("g", 3))
    assert group.queue() == [("m1", "gang g waiting for members 2/3"), ("m2", "gang g waiting for members 2/3")]
    group.submit("m3", gang=("g", 3))
    assert group.moves() == [("queued", "m3"), ("admitted", "m1"), ("admitted", "m2"), ("admitted", "m3")]
    assert {event.policy for event in group.last_events[1:]} == {"gang"}
    assert group.admitted() == {"m1", "m2", "m3"}


def test_a_gang_that_does_not_fit_at_once_waits_whole_and_names_the_member_and_limit() -> None:
    group = HostGroup(max_concurrent=3)
    group.submit("holder")
    for member in ("a", "b", "c"):
        group.submit(member, gang=("g", 3))
    assert group.admitted() == {"holder"}  # two members would fit, but no part of a gang is held
    assert group.queue() == [(member, "gang g: c needs global 3/3") for member in ("a", "b", "c")]
    group.submit("single")  # a request that fits is not blocked by the waiting gang
    assert group.admitted() == {"holder", "single"}
    group.apply(Release(request_id="holder"))
    group.apply(Release(request_id="single"))
    assert group.admitted() == {"a", "b", "c"}


def test_the_blocking_limit_can_be_a_quota_of_one_member() -> None:
    group = HostGroup(max_concurrent=5)
    group.submit("h", runtime="host")
    group.submit("a", gang=("g", 2))
    group.submit("b", gang=("g", 2), runtime="host")
    assert group.queue() == [("a", "gang g: b needs runtime host 1/1"), ("b", "gang g: b needs runtime host 1/1")]


def test_two_gangs_competing_for_one_group_never_deadlock() -> None:
    group = HostGroup(max_concurrent=3)
    # Interleaved: with per-request admission each gang would hold part and wait for the rest.
    group.submit("a1", gang=("A", 2))
    group.submit("b1", gang=("B", 2), orchestrator="orch-2")
    group.submit("a2", gang=("A", 2))
    group.submit("b2", gang=("B", 2), orchestrator="orch-2")
    assert group.admitted() == {"a1", "a2"}
    assert group.queue() == [("b1", "gang B: b2 needs global 3/3"), ("b2", "gang B: b2 needs global 3/3")]
    group.apply(Release(request_id="a1"))  # two places free: B runs whole
    assert group.admitted() == {"a2", "b1", "b2"}


def test_gang_ids_are_per_orchestrator() -> None:
    group = HostGroup(max_concurrent=5)
    group.submit("x", gang=("g", 2), orchestrator="orch-1")
    group.submit("y", gang=("g", 2), orchestrator="orch-2")
    assert group.admitted() == set()
    assert group.queue() == [("x", "gang g waiting for members 1/2"), ("y", "gang g waiting for members 1/2")]


def test_an_expired_member_lease_requeues_the_whole_gang_which_runs_again_together() -> None:
    group = HostGroup(max_concurrent=2, lease_ttl_seconds=60)
    group.submit("m1", t=0, gang=("g", 2))
    group.submit("m2", t=0, gang=("g", 2))
    group.apply(Renew(request_id="m1"), 30)  # only m1 is renewed: m2's lease ends at 60
    group.apply(Reconcile(), 60)
    assert group.moves() == [("requeued", "m2"), ("requeued", "m1"), ("admitted", "m1"), ("admitted", "m2")]
    co_member = group.last_events[1]
    assert co_member.related_request_id == "m2" and co_member.reason == "lease expired; requeued (attempt 1/2)"
    assert {rid: group.record(rid).requeue_attempts for rid in ("m1", "m2")} == {"m1": 1, "m2": 1}


def test_without_requeue_attempts_an_expired_member_ends_the_whole_gang() -> None:
    group = HostGroup(max_concurrent=2, lease_ttl_seconds=60, max_requeue_attempts=0)
    group.submit("m1", t=0, gang=("g", 2))
    group.submit("m2", t=0, gang=("g", 2))
    group.apply(Renew(request_id="m1"), 30)
    group.apply(Reconcile(), 60)
    assert group.moves() == [("timed-out", "m2"), ("timed-out", "m1")]
    assert group.last_events[1].related_request_id == "m2"


def test_what_is_left_of_a_requeued_gang_runs_together_again() -> None:
    group = HostGroup(max_concurrent=3, lease_ttl_seconds=60)
    for member in ("m1", "m2", "m3"):
        group.submit(member, t=0, gang=("g", 3))
    group.apply(Release(request_id="m3"), 10)  # m3 is done; m1 and m2 still run
    group.submit("other", t=59)
    group.apply(Reconcile(), 60)
    assert group.moves() == [("requeued", "m1"), ("requeued", "m2"), ("admitted", "m1"), ("admitted", "m2")]


def test_preemption_takes_a_gang_whole() -> None:
    group = HostGroup(max_concurrent=2, allow_preemption=True)
    group.submit("m1", preemptible=True, gang=("g", 2))
    group.submit("m2", preemptible=True, gang=("g", 2))
    group.submit("urgent", priority=10)
    assert group.moves() == [
        ("queued", "urgent"), ("preempted", "m1"), ("preempted", "m2"), ("admitted", "urgent"),
    ]
    assert group.last_events[-1].related_request_id == "m1"
    assert group.states() == {"m1": "preempted", "m2": "preempted", "urgent": "admitted"}


def test_preemption_spares_a_gang_with_a_member_that_is_not_preemptible() -> None:
    group = HostGroup(max_concurrent=2, allow_preemption=True)
    group.submit("m1", preemptible=True, gang=("g", 2))
    group.submit("m2", preemptible=False, gang=("g", 2))
    group.submit("urgent", priority=10)
    assert group.admitted() == {"m1", "m2"}
    assert group.states()["urgent"] == "queued"


def test_lane_override_spares_a_gang_whole() -> None:
    group = HostGroup(max_concurrent=5, lane_wip_limits={"build": 1}, priority_admission={"enabled": True})
    group.submit("m1", lane="build", priority_class="P3", gang=("g", 2))
    group.submit("m2", priority_class="P3", gang=("g", 2))
    group.submit("p0", lane="build", priority_class="P0")
    assert group.admitted() == {"m1", "m2"}
    assert group.queue() == [("p0", "lane build 1/1")]


def test_a_gang_never_preempts_or_displaces_it_waits_until_it_fits() -> None:
    group = HostGroup(max_concurrent=1, allow_preemption=True)
    group.submit("weak", preemptible=True)
    group.submit("s1", priority=10, gang=("g", 1))
    assert group.admitted() == {"weak"}
    assert group.queue() == [("s1", "gang g: s1 needs global 1/1")]


def test_cancelling_a_waiting_member_leaves_the_rest_waiting_for_a_new_member() -> None:
    group = HostGroup(max_concurrent=5)
    group.submit("m1", gang=("g", 2))
    group.apply(Cancel(request_id="m1"))
    group.submit("m2", gang=("g", 2))
    assert group.queue() == [("m2", "gang g waiting for members 1/2")]
    group.submit("m3", gang=("g", 2))
    assert group.admitted() == {"m2", "m3"}


@pytest.mark.parametrize(
    ("prepare", "member", "code"),
    [
        ([("m1", 2)], ("x", 3), "gang-mismatch"),
        ([("m1", 2), ("m2", 2)], ("x", 2), "gang-running"),
    ],
)
def test_members_that_cannot_join_are_refused_and_change_nothing(prepare, member, code) -> None:
    group = HostGroup(max_concurrent=5)
    for request_id, size in prepare:
        group.submit(request_id, gang=("g", size))
    before = group.snapshot()
    result = group.apply(Submit(request=request(member[0], gang=("g", member[1]))))
    assert (result.ok, result.error.code) == (False, code)
    assert group.last_events == []
    assert group.snapshot() == before.model_copy(update={"revision": before.revision})


def test_a_full_gang_refuses_one_more_member() -> None:
    group = HostGroup(max_concurrent=1)
    group.submit("holder")
    group.submit("m1", gang=("g", 2))
    group.submit("m2", gang=("g", 2))
    result = group.apply(Submit(request=request("m3", gang=("g", 2))))
    assert (result.ok, result.error.code) == (False, "gang-full")
    assert "already has its 2 members" in result.error.message


def test_gang_id_and_gang_size_go_together() -> None:
    with pytest.raises(ValidationError, match="gang_id and gang_size go together"):
        AdmissionRequest.model_validate({**request("a").model_dump(), "gang_id": "g"})


def test_what_if_answers_for_a_gang_member() -> None:
    group = HostGroup(max_concurrent=5)
    group.submit("m1", gang=("g", 2))
    assert engine.what_if(group.state, request("m2", gang=("g", 2))) == (
        "admitted", "completes gang g, which fits every limit now",
    )
    assert engine.what_if(group.state, request("m2", gang=("g", 3)))[0] == "gang-mismatch"


def test_gangs_survive_the_carried_state() -> None:
    group = HostGroup(max_concurrent=3)
    group.submit("holder")
    for member in ("a", "b", "c"):
        group.submit(member, gang=("g", 3))
    group.submit("x", gang=("h", 2))
    restored = codec.decode(codec.encode(group.state))
    assert engine.snapshot(restored) == engine.snapshot(group.state)
    restored, _, events = engine.apply(restored, Release(request_id="holder"), engine.from_micros(restored.now_us))
    assert [(event.type, event.request_id) for event in events] == [
        ("released", "holder"), ("admitted", "a"), ("admitted", "b"), ("admitted", "c"),
    ]
