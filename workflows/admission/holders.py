"""Holders: requesters that are not workflows of their own (an operator's script, a TypeScript
Cockpit, an agent loop started by hand under `conductor admission run`), and what they send.

A holder takes a lease by starting an `AdmissionHolder` workflow (`holder_workflow.py`) with a
`HolderInput`. That small workflow is the holder's requester: it submits the request, hears every
decision by signal like a mission does, and closes with the final decision when the request ends.
The holder learns each decision without any call into the singleton:

- it follows the holder workflow's history (a long poll on `GetWorkflowExecutionHistory`, as a
  workflow's result is awaited): each `admission_decided` signal carries the decision;
- or it reads the holder workflow's `decision` query, or awaits its result (the final decision).

It renews and gives back with the singleton's `renew` (`everything`), `release` and `cancel`
signals, naming the holder workflow as requester. Nothing a holder does is a Temporal update on the
singleton: updates count against a per-workflow limit (ten in flight by default, and on Temporal
Cloud), and an update handled on a cold worker next to other new events can replay in another
order than it ran (docs/admission-api.md, "Why no updates"): one such replay stopped a host group.

Every request goes through the same engine as a workflow's: quotas, order, aging, preemption,
lanes, fair share, audit events, idempotent replay, and a colliding id fails closed. A holder that
stops renewing loses its lease at the TTL and its request ends (it is not requeued).
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

from workflows.admission.model import AdmissionRequest, Identifier, Placement

HOLDER_PREFIX = "holder:"
HOLDER_WORKFLOW = "AdmissionHolder"
DECISION_QUERY = "decision"


def holder_workflow_id(host_group: str, holder: str, request_id: str) -> str:
    """The holder workflow of one request: its requester id at the singleton, and where its
    decisions land. A holder's name and the request id both take part, so two holders that pick
    the same request id never share a workflow (the singleton then refuses the second, typed)."""
    return f"{HOLDER_PREFIX}{host_group}/{holder}/{request_id}"


def is_holder(requester: str) -> bool:
    return requester.startswith(HOLDER_PREFIX)


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HeldRequest(Placement):
    """What a holder asks for: an AdmissionRequest without its time, which the singleton stamps
    (a holder's clock never decides its place in the queue). No gangs: a gang is one orchestrator's
    children, which a mission submits together."""

    request_id: Identifier
    orchestrator_id: Identifier

    def submitted(self, at: datetime) -> AdmissionRequest:
        return AdmissionRequest(submitted_at=at, **self.model_dump())


class HolderInput(_Message):
    """The `AdmissionHolder` workflow's input: whose request, for which host group."""

    host_group: Identifier
    holder: Identifier
    request: HeldRequest
    # True: the holder sends the singleton's `hold` signal itself, right after the start (a round
    # trip sooner); the holder workflow submits only if no decision came within 10 s.
    submitted_by_holder: bool = False


class HolderSubmit(_Message):
    """The singleton's `hold` signal: a holder's request, filed under its holder workflow, stamped
    with the singleton's own time (a holder's clock never decides its place in the queue)."""

    requester: str  # the holder workflow's id (`holder_workflow_id`)
    request: HeldRequest


class HolderDecisionQuery(_Message):
    """What the singleton's `holder_decision` query reads: a holder's request, by the holder's name."""

    holder: Identifier
    request_id: Identifier
