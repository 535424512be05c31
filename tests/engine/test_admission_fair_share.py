"""Fair share between orchestrators (opt-in `fair_share` policy).

Among requests of equal effective priority, the orchestrator holding the fewest leases per unit
of weight goes first; FIFO among equal shares. Priority and aging still come first. In the
spirit of Kueue's fair sharing and Slurm's fair-share factor; semantics:
docs/admission-engine.md.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tests.engine.test_admission_scenarios import HostGroup
from workflows.admission import engine
from workflows.admission.model import AdmissionPolicy, Release


def flooded(fair_share: dict | None) -> HostGroup:
    """Three places held by a third orchestrator; o1 then o2 queue four requests each."""
    group = HostGroup(max_concurrent=3, aging_interval_seconds=1e6, fair_share=fair_share)
    for index in range(3):
        group.submit(f"h{index}", t=0, orchestrator="o3")
    for index in range(4):
        group.submit(f"a{index}", t=1 + index, orchestrator="o1")
    for index in range(4):
        group.submit(f"b{index}", t=5 + index, orchestrator="o2")
    return group


def admitted_in_order(group: HostGroup, releases: list[str], t: float = 20) -> list[str]:
    order = []
    for request_id in releases:
        group.apply(Release(request_id=request_id), t)
        order += [event.request_id for event in group.last_events if event.type == "admitted"]
    return order


def test_without_fair_share_the_first_orchestrator_to_flood_takes_the_group() -> None:
    group = flooded(None)
    assert admitted_in_order(group, ["h0", "h1", "h2"]) == ["a0", "a1", "a2"]


def test_with_fair_share_orchestrators_share_the_group_by_their_weights() -> None:
    group = flooded({"weights": {"o1": 2, "o2": 1}})
    # h0: both hold nothing, FIFO -> a0. h1: o1 holds 1/2, o2 0 -> b0. h2: o1 1/2 < o2 1/1 -> a1.
    assert admitted_in_order(group, ["h0", "h1", "h2"]) == ["a0", "b0", "a1"]
    events = [event for event in group.events if event.type == "admitted" and event.request_id in ("a0", "b0", "a1")]
    assert {event.policy for event in events} == {"fair-share"}
    # o1 holds 2 of weight 2 (share 1), o2 1 of weight 1 (share 1): equal, FIFO -> a2 (submitted first).
    assert admitted_in_order(group, ["a0"], t=21) == ["a2"]


def test_equal_weights_alternate_between_orchestrators() -> None:
    group = flooded({"default_weight": 1})
    assert admitted_in_order(group, ["h0", "h1", "h2"]) == ["a0", "b0", "a1"]
    assert admitted_in_order(group, ["a0"], t=21) == ["a2"]  # o1 holds 1, o2 holds 1: equal, FIFO
    assert admitted_in_order(group, ["b0"], t=22) == ["b1"]  # o1 holds 2, o2 none: o2 first


def test_priority_comes_before_fair_share() -> None:
    group = HostGroup(max_concurrent=1, aging_interval_seconds=1e6, fair_share={})
    group.submit("h", t=0, orchestrator="o1")
    group.submit("low", t=1, orchestrator="o2", priority=0)
    group.submit("high", t=2, orchestrator="o1", priority=5)  # o1 already holds the group
    assert admitted_in_order(group, ["h"]) == ["high"]


def test_the_queue_shows_the_fair_share_order_and_positions_agree() -> None:
    group = flooded({"weights": {"o1": 2, "o2": 1}})
    admitted_in_order(group, ["h0", "h1"])  # a0 (o1) and b0 (o2) run; o1's share 1/2, o2's 1
    assert [entry.request_id for entry in group.snapshot().queue] == ["a1", "a2", "a3", "b1", "b2", "b3"]
    group.apply(Release(request_id="a0"), 30)  # o1 0/2 ... a1 admitted, o1 1/2 again
    queue = group.snapshot().queue
    for entry in queue:
        assert engine.queue_position(group.state, group.state.records[entry.request_id]) == entry.position


def test_weights_are_whole_numbers_of_at_least_one() -> None:
    with pytest.raises(ValidationError, match="weights.o1"):
        AdmissionPolicy(max_concurrent=1, fair_share={"weights": {"o1": 0}})
    with pytest.raises(ValidationError, match="default_weight"):
        AdmissionPolicy(max_concurrent=1, fair_share={"default_weight": 0.5})
