"""Search attributes a mission keeps current, so operators can find missions in the Temporal UI.

They must be registered on the server (`conductor dev` does it; on another server:
`temporal operator search-attribute create --name MissionState --type Keyword`, and so on).
"""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

MISSION_STATE = SearchAttributeKey.for_keyword("MissionState")
MISSION_AGGREGATION = SearchAttributeKey.for_keyword("MissionAggregation")
MISSION_HOST_GROUP = SearchAttributeKey.for_keyword("MissionHostGroup")
MISSION_ORCHESTRATOR = SearchAttributeKey.for_keyword("MissionOrchestrator")

SEARCH_ATTRIBUTES = [MISSION_STATE, MISSION_AGGREGATION, MISSION_HOST_GROUP, MISSION_ORCHESTRATOR]
