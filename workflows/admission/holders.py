"""Holders: requesters that are not workflows (an operator's script, a TypeScript Cockpit, an agent
loop started by hand under `conductor admission run`), and the updates they use.

A workflow requester hears its decisions by signal; anything else cannot be signalled, so a holder
asks with Temporal updates instead, each answered with the request's `AdmissionDecision`:

- `acquire` submits a request (idempotent by request id) and waits, at most `wait_seconds`, for it
  to leave the queue; a queued answer carries the position and what it waits on;
- `await_decision` waits, at most `wait_seconds`, for a decision newer than `after_revision`
  (a long poll: no tight polling, and a held lease's holder hears a preemption at once);
- `renew_lease` renews a held lease, fenced by its lease revision;
- `release_lease` gives a lease back; `cancel_request` withdraws a request still queued;
- the `holder_decision` query reads a request's decision (no update, no history): for holders
  whose long poll was refused with `PollLater`, because as many as `max_waiting_polls` wait already
  (Temporal admits ten updates in flight per workflow by default, and the rest must not stall).

Every request goes through the same engine as a workflow's: quotas, order, aging, preemption,
lanes, fair share, audit events, idempotent replay, and a colliding id fails closed. A holder that
disappears loses its lease at the TTL (the requester sweep looks for closed workflows, and a
holder is none). Waits are bounded so that an update in flight never holds continue-as-new back
for long: a run that hands over answers every waiting update at once, with what it knows.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from workflows.admission.model import (
    AdmissionRequest,
    Duration,
    Identifier,
    Name,
    PriorityClass,
    RuntimeKind,
)
from workflows.limits import MAX_PRIORITY, MIN_PRIORITY

HOLDER_PREFIX = "holder:"
# The typed refusals a holder answers by sending again (the ApplicationError types of the updates):
HANDING_OVER = "HandingOver"  # the singleton continues as new: send the same update again in a moment
POLL_LATER = "PollLater"  # max_waiting_polls long polls wait already: read holder_decision meanwhile
MAX_WAIT_SECONDS = 60.0
DEFAULT_WAIT_SECONDS = 20.0


def requester_of(holder: str) -> str:
    """The requester key a holder's requests are filed under (never a workflow id: no `:` prefix
    of ours names a workflow)."""
    return f"{HOLDER_PREFIX}{holder}"


def is_holder(requester: str) -> bool:
    return requester.startswith(HOLDER_PREFIX)


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HeldRequest(_Message):
    """What a holder asks for: an AdmissionRequest without its time, which the singleton stamps
    (a holder's clock never decides its place in the queue). No gangs: a gang is one orchestrator's
    children, which a mission submits together."""

    request_id: Identifier
    orchestrator_id: Identifier
    environment: Name = "default"
    provider: Name = "local"
    runtime_kind: RuntimeKind = "host"
    priority: int = Field(default=0, ge=MIN_PRIORITY, le=MAX_PRIORITY)
    queue_timeout_seconds: Duration = 3600
    preemptible: bool = False
    lane: Name | None = None
    priority_class: PriorityClass = "P2"

    def submitted(self, at: datetime) -> AdmissionRequest:
        return AdmissionRequest(submitted_at=at, **self.model_dump())


Wait = Field(default=DEFAULT_WAIT_SECONDS, ge=0, le=MAX_WAIT_SECONDS)


class Acquire(_Message):
    holder: Identifier
    request: HeldRequest
    wait_seconds: float = Wait


class AwaitDecision(_Message):
    holder: Identifier
    request_id: Identifier
    after_revision: int = Field(default=0, ge=0)
    wait_seconds: float = Wait


class RenewLease(_Message):
    holder: Identifier
    request_id: Identifier
    lease_revision: int = Field(ge=1)


class GiveBack(_Message):
    """`release_lease` (a held lease) and `cancel_request` (a request still queued); also what the
    `holder_decision` query reads."""

    holder: Identifier
    request_id: Identifier
