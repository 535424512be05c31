"""The ids built from a mission spec's ids, defined once.

A mission's id and each child's id are joined into several more: the admission request id,
the fleet record's child id, dispatch id and idempotency key, and the workflow ids. Each of
those meets its own limit later, inside a workflow, where a refusal can no longer be fixed;
`workflows.mission.spec` builds them with these same functions and refuses a spec whose
ids would not fit. The modules that use an id import it from here (and re-export it).
"""

from __future__ import annotations


def mission_workflow_id(mission_id: str) -> str:
    return f"mission:{mission_id}"


def admission_workflow_id(host_group: str) -> str:
    return f"admission:{host_group}"


def admission_request_id(mission_id: str, child_id: str) -> str:
    return f"{mission_id}:{child_id}"


def workload_workflow_id(mission_id: str, child_id: str) -> str:
    return f"workload:{mission_id}:{child_id}"


def idempotency_key(mission_id: str, child_id: str) -> str:
    return f"{mission_id}:{child_id}"


def fleet_child_id(mission_id: str, child_id: str) -> str:
    """The child's id on the substrate, which every orchestrator shares: qualified by mission,
    so two missions may both have a child called `build` without colliding."""
    return f"{mission_id}:{child_id}"


def dispatch_id(mission_id: str, child_id: str) -> str:
    """Also the A2A `messageId`: the executor starts at most one task per dispatch id."""
    return f"{mission_id}:{child_id}:dispatch"


def verifier_message_id(mission_id: str, child_id: str) -> str:
    """The A2A `messageId` of the child's verifier run: one verifier task per child, however
    often the call is retried. Never longer than `dispatch_id`, so the spec's check covers it."""
    return f"{mission_id}:{child_id}:verify"


def context_id(mission_id: str, child_id: str) -> str:
    """The A2A `contextId` of the child's tasks: a persistent agent's session, and what lets a
    verifier see the command's files (tasks of one context share a workspace). Never longer
    than `dispatch_id`."""
    return f"{mission_id}:{child_id}:context"
