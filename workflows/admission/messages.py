"""Payloads that cross the AdmissionWorkflow's boundary: signals, decisions, queries."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from workflows.admission.model import (
    AdmissionPolicy,
    AdmissionRequest,
    AdmissionState,
    AuditEventType,
    OperatorName,
)
from workflows.ids import admission_workflow_id  # noqa: F401 (defined once there)

ADMISSION_TASK_QUEUE = "mission-conductor"
ADMISSION_WORKFLOW = "AdmissionWorkflow"  # the workflow type of every host group's singleton
DECISION_SIGNAL = "admission_decided"
REQUESTERS_QUERY = "requesters"
# What a query answers while a continued run still decodes its carried state (a second or two).
RESTORING = "admission state is still being restored after continue-as-new"
FIND_GONE_REQUESTERS = "find_gone_requesters"
BETWEEN_RESTORE_SLICES = "between_restore_slices"  # a local activity that does nothing (workflow.py)


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SubmitBatch(_Message):
    """Every request one requester workflow needs, in one signal (its workflow id is the reply address)."""

    requester: str
    requests: list[AdmissionRequest]


class LeaseRef(_Message):
    request_id: str
    lease_revision: int


class RenewBatch(_Message):
    """Either named leases (`leases`, each renewed now with a new lease revision and a decision
    back) or a requester renewal (`everything`): every lease this requester holds, renewed as of
    `sent_at`, with no per-lease payload, no decision back and no audit event (docs/scaling.md)."""

    requester: str
    leases: list[LeaseRef] = Field(default_factory=list)
    everything: bool = False
    # The requester's workflow time when it sent the signal: a requester renewal takes effect
    # then (the singleton never takes a later moment than its own clock), and the requester
    # counts its leases current until sent_at + TTL once the signal is delivered in time.
    sent_at: datetime | None = None
    # When the renewal was due (a third of the TTL into the lease): the singleton's history then
    # shows how late renewals are decided (bench/admission_sustained.py reads it).
    due_at: datetime | None = None


class ReleaseBatch(_Message):
    requester: str
    request_ids: list[str]
    # False: the requester needs no decision back for these requests (typically because it is
    # about to close), so the admission workflow sends none: no signal to a closed workflow.
    confirm: bool = True


class CancelBatch(_Message):
    requester: str
    request_ids: list[str]
    confirm: bool = True


class PolicyChange(_Message):
    operator: OperatorName
    policy: AdmissionPolicy
    drain: bool = False  # with a policy that holds: also preempt every preemptible lease


class Backpressure(_Message):
    """Fleet backpressure a requester reports while it cannot run (contract `status.backpressure`)."""

    reason: Literal["capacity", "policy"]
    retryable: bool


class AdmissionDecision(_Message):
    """Where one request stands after a workflow task, and what happened to it during that task."""

    request_id: str
    state: AdmissionState | Literal["unknown"]
    revision: int = 0  # the record's revision: a requester keeps the highest it has seen
    # The `temporal` CLI prints an empty list as null (`workflow query --output json`): read as none.
    happened: Annotated[list[AuditEventType], BeforeValidator(lambda value: [] if value is None else value)] = Field(
        default_factory=list)
    reason: str = ""
    lease_revision: int = 0
    lease_expires_at: datetime | None = None
    lease_ttl_seconds: float | None = None
    related_request_id: str | None = None
    position: int | None = None
    binding_constraint: str | None = None
    # A queued request's predicted start (engine.forecast), when it can be known.
    eta: datetime | None = None
    error_code: str | None = None

    @property
    def backpressure(self) -> Backpressure | None:
        if self.state == "queued":
            return Backpressure(reason="capacity", retryable=True)
        if self.state == "denied":
            return Backpressure(reason="policy", retryable=False)
        return None


class DecisionBatch(_Message):
    host_group: str
    revision: int
    decisions: list[AdmissionDecision]


class AdmissionWorkflowInput(_Message):
    host_group: str
    policy: AdmissionPolicy
    # Continue-as-new after this many history events even if the server has not suggested it.
    # Short runs keep a replay cheap: a worker that loses the singleton from its cache (a failed or
    # timed-out workflow task evicts it) replays the whole run inside one workflow task (10 s
    # timeout), and a replay costs about the CPU the run took live. Under a ramp past 20,000 held
    # leases, tasks of 6 to 7 s and repeated task failures stopped a singleton of 10,000-event runs.
    max_history_events: int = Field(default=2_000, ge=100)
    # ... or after this many bytes of history. A burst of submits and their decisions writes
    # kilobytes per event: ramping 20,000 held leases to 35,000 grew one run to 8.5 MB before the
    # event count was reached, and a worker that lost it from its cache then spent 6 to 7 s per
    # workflow task replaying it, so the singleton answered nothing for minutes. Replaying 2 MB
    # stays well inside the workflow task timeout.
    max_history_bytes: int = Field(default=2_000_000, ge=100_000)
    recent_audit_events: int = Field(default=200, ge=0)
    # Requests (and named leases) one decision pass takes from the inbox; the rest waits for the
    # next pass, after the decisions of this one went out in a workflow task of their own. Keeps a
    # pass well under the SDK's 2 s deadlock detector and its commands under the 4 MB gRPC limit:
    # a burst of 30,000 submitted requests in one pass broke both, and 2,000 renewals by name the
    # first; at 1,000 a pass under a ramp on a CPU-starved worker still tripped the detector.
    max_requests_per_pass: int = Field(default=500, ge=1)
    # Carried records a continued run decodes per activation (codec.Restore): 50,000 decoded in
    # the first activation of a run outlasted the deadlock detector on a busy worker, every retry
    # too, and slices of 10,000 still did at times with 100,000 held (about 15 us a record quiet,
    # several times that on a starved worker, with the garbage collector walking the old state).
    restore_records_per_task: int = Field(default=2_000, ge=1)
    carried: "CarriedState | None" = None


class CarriedState(_Message):
    """What a continued run needs so that no request, lease or decision is lost or repeated."""

    engine: str  # workflows.admission.codec: the records and request_id -> requester
    # Signals that arrived while the run handed over, packed (codec.pack_json): a burst of submits
    # carried as plain JSON (30,000 requests: 8.8 MB) would exceed the server's 2 MB payload limit,
    # fail continue-as-new and wedge the singleton.
    inbox_packed: str | None = None
    gone_requesters: list[str] = Field(default_factory=list)
    # Where the next requester sweep reads visibility from (RequesterSweep.closed_since).
    swept_from: datetime | None = None
    # The last audit events (for the audit query), packed like the inbox: as plain JSON the 200
    # events a run keeps were about 45 KB, as much as 10,000 queued requests in format 3.
    recent_audit_packed: str | None = None
    # Audit events no export had stored yet when the run handed over (an export in flight is not
    # waited for), packed like the inbox: the next run exports them (the store ignores a repeat).
    audit_outbox_packed: str | None = None
    audit_chain: str  # first run id of the chain: keys the audit store across continue-as-new


class InboxItem(_Message):
    kind: Literal["submit", "renew", "release", "cancel", "set_policy"]
    submit: SubmitBatch | None = None
    renew: RenewBatch | None = None
    release: ReleaseBatch | None = None
    cancel: CancelBatch | None = None
    set_policy: PolicyChange | None = None


def constraint_words(binding_constraint: str | None) -> str:
    """What a queued request waits on, in words (the engine's binding constraint)."""
    if not binding_constraint:
        return ""
    if binding_constraint == "none":
        return "waiting on nothing: admitted at the next decision"
    return f"waiting on {binding_constraint}"


def rfc3339(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def queue_place(
    position: int | None, binding_constraint: str | None, queue: str | None = None, eta: datetime | None = None,
) -> str:
    """Where a queued request stands, the one wording every view uses:
    "position 3 in admission:default, waiting on global 4/4, expected to start 2026-06-01T09:40:00Z"."""
    place = "queued" if position is None else f"position {position}"
    if queue is not None:
        place += f" in {queue}"
    waits = constraint_words(binding_constraint)
    text = f"{place}, {waits}" if waits else place
    return f"{text}, expected to start {rfc3339(eta)}" if eta is not None else text


class QueueRow(_Message):
    request_id: str
    requester: str | None
    position: int
    priority: int
    effective_priority: int
    binding_constraint: str
    waited_seconds: float
    eta: datetime | None = None  # predicted start; None when it cannot be known


class LeaseRow(_Message):
    request_id: str
    holder: str | None
    environment: str
    provider: str
    runtime_kind: str
    lane: str | None
    lease_revision: int
    admitted_at: datetime
    lease_expires_at: datetime
    preemptible: bool


class UsageRow(_Message):
    limit: str  # "global", "environment prod", ..., "resource gpu"
    used: int | float  # amounts of a resource may be fractions
    maximum: int | float | None


class WhatIf(_Message):
    outcome: str
    explanation: str
    eta: datetime | None = None  # when queued: its predicted start, if it can be known


AdmissionWorkflowInput.model_rebuild()
CarriedState.model_rebuild()


class RequesterCarry(_Message):
    """An `AdmissionClient`'s state, handed to its workflow's next run at continue-as-new."""

    decisions: dict[str, AdmissionDecision]
    mine: list[str]
    renew_sent: dict[str, int]
    giving_back: list[str]
    # Leases the engine took away without being asked (workflows.admission.client.INTERRUPTIONS).
    interruptions: dict[str, int] = Field(default_factory=dict)
    interrupted: dict[str, AdmissionDecision] = Field(default_factory=dict)


class RequesterSweep(_Message):
    """Activity input: which of this host group's requesters closed since `closed_since`?"""

    host_group: str
    closed_since: datetime


class SweepResult(_Message):
    gone: list[str]  # requester workflow ids whose latest run closed and that still hold or wait
    # Where the next sweep starts: this sweep's start, less the visibility lag it allows for.
    next_closed_since: datetime
    supported: bool = True  # False: the server has no visibility listing (the time-skipping test server)


class SubmitAdmission(_Message):
    """Activity input: signal-with-start the host group's admission workflow with one batch."""

    host_group: str
    batch: SubmitBatch
    # Start the singleton with the MissionHostGroup search attribute (the server must have it
    # registered, as `conductor dev` does; the requester knows, as it sets its own).
    search_attributes: bool = False
