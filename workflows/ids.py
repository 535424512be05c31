"""The ids built from a mission spec's ids, defined once.

A mission's id and each child's id are joined into several more: the admission request id,
the fleet record's child id, dispatch id and idempotency key, and the workflow ids. Each of
those meets its own limit later, inside a workflow, where a refusal can no longer be fixed;
`workflows.mission.spec` builds them with these same functions and refuses a spec whose
ids would not fit. The modules that use an id import it from here (and re-export it).
"""

from __future__ import annotations

import re

# A child runs as numbered attempts (workflows.mission.attempts). The first attempt keeps the
# plain ids, so a mission whose children never retry reads as it always did; attempt n > 1
# appends `:attempt-<n>` to the child's part of every id, so each attempt has its own fleet
# record, dispatch (A2A message id), idempotency key and workflow ids: a retry can never
# re-adopt the task of an earlier attempt, and a restarted attempt re-adopts its own.
ATTEMPT_SEPARATOR = ":attempt-"
# The highest attempt number any child may reach, retries and re-admissions together: ids are
# checked against it when a spec comes in (`MissionSpec._derived_ids_fit`), so every attempt's
# ids fit wherever they are used later.
MAX_ATTEMPT_NUMBER = 999
_RESERVED_SUFFIX = re.compile(re.escape(ATTEMPT_SEPARATOR) + r"[0-9]+$")


def attempt_child_id(child_id: str, attempt: int = 1) -> str:
    """The child's part of every id of one attempt."""
    return child_id if attempt == 1 else f"{child_id}{ATTEMPT_SEPARATOR}{attempt}"


def reserved_attempt_suffix(child_id: str) -> bool:
    """A child id that ends like an attempt id would collide with another child's retry."""
    return _RESERVED_SUFFIX.search(child_id) is not None


def mission_workflow_id(mission_id: str) -> str:
    return f"mission:{mission_id}"


def admission_workflow_id(host_group: str) -> str:
    return f"admission:{host_group}"


def admission_request_id(mission_id: str, child_id: str, attempt: int = 1) -> str:
    return f"{mission_id}:{attempt_child_id(child_id, attempt)}"


def workload_workflow_id(mission_id: str, child_id: str, attempt: int = 1) -> str:
    return f"workload:{mission_id}:{attempt_child_id(child_id, attempt)}"


def idempotency_key(mission_id: str, child_id: str, attempt: int = 1) -> str:
    return f"{mission_id}:{attempt_child_id(child_id, attempt)}"


def fleet_child_id(mission_id: str, child_id: str, attempt: int = 1) -> str:
    """The child's id on the substrate, which every orchestrator shares: qualified by mission,
    so two missions may both have a child called `build` without colliding."""
    return f"{mission_id}:{attempt_child_id(child_id, attempt)}"


def dispatch_id(mission_id: str, child_id: str, attempt: int = 1) -> str:
    """Also the A2A `messageId`: the executor starts at most one task per dispatch id."""
    return f"{mission_id}:{attempt_child_id(child_id, attempt)}:dispatch"


def verifier_message_id(mission_id: str, child_id: str, attempt: int = 1) -> str:
    """The A2A `messageId` of the attempt's verifier run: one verifier task per attempt, however
    often the call is retried. Never longer than `dispatch_id`, so the spec's check covers it."""
    return f"{mission_id}:{attempt_child_id(child_id, attempt)}:verify"


def context_id(mission_id: str, child_id: str, attempt: int = 1) -> str:
    """The A2A `contextId` of a child's tasks. Tasks of one context share a workspace, so a
    verifier sent in its attempt's context sees the files the command left. A persistent agent
    names the context of attempt 1 in every attempt: its session goes on. A checked command
    names its own attempt's: a verifier never sees what an earlier attempt left. Never longer
    than `dispatch_id`."""
    return f"{mission_id}:{attempt_child_id(child_id, attempt)}:context"
