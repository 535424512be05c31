"""Search attributes that let operators find missions, their workloads and the admission
singletons in the Temporal UI (and `temporal workflow list --query`).

A mission keeps its state, aggregation, host group and orchestrator current, with its children's
counts; each workload is started with its mission, kind and host
group and keeps `WorkloadState` current; an admission singleton carries its host group.

They must be registered on the server (`conductor dev` does it; on another server:
`temporal operator search-attribute create --name MissionState --type Keyword`, and so on).
"""

from __future__ import annotations

from temporalio.common import SearchAttributeKey, SearchAttributePair, SearchAttributeUpdate, TypedSearchAttributes

from workflows.mission.ledger import MissionLedger
from workflows.mission.spec import ChildSpec, MissionSpec

MISSION_STATE = SearchAttributeKey.for_keyword("MissionState")
MISSION_AGGREGATION = SearchAttributeKey.for_keyword("MissionAggregation")
MISSION_HOST_GROUP = SearchAttributeKey.for_keyword("MissionHostGroup")
MISSION_ORCHESTRATOR = SearchAttributeKey.for_keyword("MissionOrchestrator")
# Children ok / failed / pending, as of the mission's last change of state and exact once it closed
# (not upserted on every child's end: a hundred children would cost a hundred history events).
MISSION_CHILDREN_OK = SearchAttributeKey.for_int("MissionChildrenOk")
MISSION_CHILDREN_FAILED = SearchAttributeKey.for_int("MissionChildrenFailed")
MISSION_CHILDREN_PENDING = SearchAttributeKey.for_int("MissionChildrenPending")
# A child waits on an operator's answer (a question its task asks, or a gate before dispatch):
# `MissionAwaitingAnswer = true` finds the missions someone must answer (`conductor mission list
# --awaiting-answer`). A Bool, not a count: a stock dev server takes at most three Int attributes.
MISSION_AWAITING_ANSWER = SearchAttributeKey.for_bool("MissionAwaitingAnswer")
MISSION_ID = SearchAttributeKey.for_keyword("MissionId")
WORKLOAD_KIND = SearchAttributeKey.for_keyword("WorkloadKind")
WORKLOAD_STATE = SearchAttributeKey.for_keyword("WorkloadState")

SEARCH_ATTRIBUTES = [
    MISSION_STATE, MISSION_AGGREGATION, MISSION_HOST_GROUP, MISSION_ORCHESTRATOR,
    MISSION_CHILDREN_OK, MISSION_CHILDREN_FAILED, MISSION_CHILDREN_PENDING, MISSION_AWAITING_ANSWER,
    MISSION_ID, WORKLOAD_KIND, WORKLOAD_STATE,
]


def workload_attributes(spec: MissionSpec, child: ChildSpec) -> TypedSearchAttributes:
    """A workload's attributes at its start; it keeps `WorkloadState` current itself."""
    return TypedSearchAttributes([
        SearchAttributePair(MISSION_ID, spec.mission_id),
        SearchAttributePair(MISSION_HOST_GROUP, spec.host_group),
        SearchAttributePair(WORKLOAD_KIND, child.kind),
        SearchAttributePair(WORKLOAD_STATE, "admitted"),
    ])


def mission_attributes(spec: MissionSpec, ledger: MissionLedger) -> list[SearchAttributeUpdate]:
    """The mission's attributes as its ledger stands."""
    summary = ledger.aggregation
    return [
        MISSION_STATE.value_set(ledger.parent_state),
        MISSION_AGGREGATION.value_set(spec.aggregation.mode),
        MISSION_HOST_GROUP.value_set(spec.host_group),
        MISSION_ORCHESTRATOR.value_set(spec.orchestrator_id),
        MISSION_CHILDREN_OK.value_set(len(summary.successful)),
        MISSION_CHILDREN_FAILED.value_set(len(summary.failed)),
        MISSION_CHILDREN_PENDING.value_set(len(summary.pending)),
    ]
