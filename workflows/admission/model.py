"""Boundary types of the admission engine.

These are pydantic models because they cross boundaries: CLI traces, Temporal
payloads, query results. The engine keeps its own compact internal state and
converts at the edges, so validation cost is paid once per operation.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    model_validator,
)
from pydantic_core import InitErrorDetails

from workflows.limits import (
    MAX_DURATION_SECONDS,
    MAX_OPERATOR_CHARS,
    MAX_PRIORITY,
    MAX_RESOURCE_AMOUNT,
    MAX_RESOURCE_NAMES,
    MIN_PRIORITY,
)

RuntimeKind = Literal["host", "container", "vm", "microvm", "custom"]
PriorityClass = Literal["P0", "P1", "P2", "P3"]
AdmissionState = Literal["queued", "admitted", "denied", "cancelled", "timed-out", "preempted", "released"]
AuditEventType = Literal[
    "queued", "admitted", "renewed", "released", "cancelled", "timed-out",
    "denied", "preempted", "displaced", "policy-changed", "requeued",
]

TERMINAL_STATES: frozenset[str] = frozenset({"denied", "cancelled", "timed-out", "preempted", "released"})
LANE_OVERRIDE_POLICY = "priority-wip-override-v1"
PREEMPTION_POLICY = "preemption"
QUOTA_POLICY = "quota"
REQUEUE_POLICY = "requeue"  # ADR-004 bounded requeue after lease expiry
GANG_POLICY = "gang"  # all-or-nothing admission of a gang
FAIR_SHARE_POLICY = "fair-share"  # a plain admission ordered by fair share between orchestrators
BACKFILL_POLICY = "backfill"  # admitted past a reservation it ends before
DRAIN_POLICY = "drain"  # preempted because an operator held the host group with --drain
HOLD_POLICY = "hold"  # the policy change that held or resumed admission


def _aware(value: datetime) -> datetime:
    """Times must say where they are; they are kept in UTC so every output reads the same."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("must carry a UTC offset, e.g. 2026-01-01T00:00:00Z")
    return value.astimezone(timezone.utc)


AwareDatetime = Annotated[datetime, AfterValidator(_aware)]
Identifier = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^\s]+$")]
Name = Annotated[str, Field(min_length=1, max_length=256)]
Quota = Annotated[int, Field(ge=0)]
# A wait the engine turns into a date: bounded so that the date exists (see workflows.limits).
Duration = Annotated[float, Field(gt=0, le=MAX_DURATION_SECONDS)]


def _thousandths(value: float) -> float:
    """Amounts are counted in thousandths (like Kubernetes' millicores), so that used + asked is
    exact however many requests add up."""
    if abs(round(value * 1000) - value * 1000) > 1e-6:
        raise ValueError(f"amounts are counted in thousandths: {value!r} has more than 3 decimal places")
    return value


def _not_a_flag(value: object) -> object:
    if isinstance(value, bool):
        raise ValueError("an amount is a number (like 2 or 0.5), not true or false")
    return value


def _as_written(value: float) -> int | float:
    """A whole amount reads as one (4, not 4.0) in every record, dump and view."""
    return int(value) if value.is_integer() else value


Amount = Annotated[
    float,
    Field(ge=0, le=MAX_RESOURCE_AMOUNT, allow_inf_nan=False),
    BeforeValidator(_not_a_flag),
    AfterValidator(_thousandths),
    PlainSerializer(_as_written, return_type=Union[int, float]),
]
Resources = Annotated[dict[Identifier, Amount], Field(max_length=MAX_RESOURCE_NAMES)]


def to_thousandths(amount: float) -> int:
    return round(amount * 1000)


def amount_value(thousandths: int) -> int | float:
    """An amount as a person wrote it: 4, 0.5, 2.25 (a whole amount stays an int)."""
    return thousandths // 1000 if thousandths % 1000 == 0 else thousandths / 1000


def amount_text(thousandths: int) -> str:
    return str(amount_value(thousandths))


def _sensible_name(value: str) -> str:
    """Who did something, as the audit, the ledger and the logs will name them: one word of
    printable characters (a login name or an e-mail address), nothing that can break a line."""
    for position, char in enumerate(value):
        if char.isspace() or not char.isprintable():
            raise ValueError(
                f"must be a login name or an e-mail address without spaces or control characters "
                f"(found {ascii(char)} at position {position})"
            )
    return value


OperatorName = Annotated[str, Field(min_length=1, max_length=MAX_OPERATOR_CHARS), AfterValidator(_sensible_name)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PriorityAdmission(_Strict):
    """Lane priority admission (`priority-wip-override-v1`): opt-in displacement in a full lane."""

    enabled: bool = False
    override_priorities: list[PriorityClass] = Field(default_factory=lambda: ["P0", "P1"])


Weight = Annotated[int, Field(ge=1)]


class FairShare(_Strict):
    """Opt-in fair share between orchestrators: among requests of equal effective priority, the
    orchestrator holding the fewest leases per unit of weight goes first (docs/admission-engine.md).
    Weights are whole numbers so that shares compare exactly (2 against 1, not 0.2 against 0.1)."""

    weights: dict[Identifier, Weight] = Field(default_factory=dict)
    default_weight: Weight = 1

    def weight(self, orchestrator_id: str) -> int:
        return self.weights.get(orchestrator_id, self.default_weight)


class AdmissionPolicy(_Strict):
    """Quotas and rules of one host group. Missing quota maps mean 'unlimited'."""

    max_concurrent: Quota
    lease_ttl_seconds: Duration = 300
    aging_interval_seconds: float = Field(default=30, gt=0)
    allow_preemption: bool = False
    preemption_margin: int = Field(default=0, ge=0)
    environment_quotas: dict[str, Quota] = Field(default_factory=dict)
    provider_quotas: dict[str, Quota] = Field(default_factory=dict)
    runtime_quotas: dict[RuntimeKind, Quota] = Field(default_factory=dict)
    default_host_quota: Quota = 1
    lane_wip_limits: dict[str, Quota] = Field(default_factory=dict)
    priority_admission: PriorityAdmission = Field(default_factory=PriorityAdmission)
    terminal_retention_seconds: float = Field(default=86400, ge=0)
    # Amounts of named resources the host group offers (`{"gpu": 4, "memory_gib": 64}`): a request
    # naming some fits only while, for each, used + asked <= capacity (on top of the quotas, which
    # count leases). Unset: requests name no resources.
    resource_capacity: Resources = Field(default_factory=dict)
    # How many queued requests naming resources, in admission order, the reservation plan looks at
    # (Slurm's bf_max_job_test): those that cannot start now hold a reservation, later ones only
    # pass them by ending first (backfill). Beyond it, requests hold no reservation.
    reservation_depth: int = Field(default=32, ge=0, le=10_000)
    # Hold (Kueue's stopPolicy Hold): nothing new is admitted, queued requests stay queued (their
    # deadlines run), leases run on. `conductor admission hold` / `resume` set it.
    hold: bool = False
    hold_reason: str | None = Field(default=None, max_length=2000)
    # ADR-004: how often a request whose lease expired goes back to the queue before it ends timed-out.
    max_requeue_attempts: int = Field(default=2, ge=0)
    # ADR-004: the measured time workloads take to start (admission to first sign of life). A lease
    # shorter than that expires before a healthy workload can renew it, so it is refused.
    startup_p95_seconds: float | None = Field(default=None, gt=0, le=MAX_DURATION_SECONDS)
    fair_share: FairShare | None = None
    # How often the singleton asks Temporal's visibility which requesters closed without giving
    # their leases back (terminated, timed out): their capacity comes back within about this long,
    # however long the lease TTL. None: only an expired lease or a failed decision frees it.
    requester_sweep_seconds: float | None = Field(default=30, ge=1, le=86_400)

    @model_validator(mode="after")
    def _lease_outlasts_startup(self) -> "AdmissionPolicy":
        if self.startup_p95_seconds is not None and self.lease_ttl_seconds < self.startup_p95_seconds:
            raise ValueError(
                f"lease_ttl_seconds ({self.lease_ttl_seconds:g} s) is shorter than startup_p95_seconds "
                f"({self.startup_p95_seconds:g} s), so a workload's lease would expire before it has started: "
                f"raise lease_ttl_seconds to at least {self.startup_p95_seconds:g}"
            )
        return self

    def runtime_limit(self, runtime_kind: str) -> int | None:
        """The `host` tier is serialised (default 1) unless set; other tiers are unlimited unless set."""
        if runtime_kind in self.runtime_quotas:
            return self.runtime_quotas[runtime_kind]  # type: ignore[index]
        return self.default_host_quota if runtime_kind == "host" else None


class Placement(_Strict):
    """Where a workload asks to run and how it competes for admission: the fields the engine places
    by, with one set of defaults, shared by the engine's request, a holder's request
    (`holders.HeldRequest`) and a mission's child (`mission.spec.ChildSpec`)."""

    environment: Name = "default"
    provider: Name = "local"
    runtime_kind: RuntimeKind = "host"
    priority: int = Field(default=0, ge=MIN_PRIORITY, le=MAX_PRIORITY)
    preemptible: bool = False
    lane: Name | None = None
    priority_class: PriorityClass = "P2"
    queue_timeout_seconds: Duration = 3600
    # Amounts of the host group's named resources this workload takes while it runs.
    resources: Resources = Field(default_factory=dict)
    # How long it will hold its lease once admitted, if known: what lets it backfill past a
    # reservation and what the queue's predicted starts (`eta`) are computed from.
    expected_duration_seconds: Duration | None = None

    def placement(self) -> dict[str, object]:
        """Just these fields, to build another model on them (a child's admission request)."""
        return {name: getattr(self, name) for name in Placement.model_fields}


# What the engine's own request must name (a holder's request and a child spec may leave them to
# the defaults, which their owners fill in): the engine never guesses where a request runs.
ENGINE_PLACEMENT = ("environment", "provider", "runtime_kind", "priority", "queue_timeout_seconds")


def _engine_placement_required(schema: dict) -> None:
    """The published schema says what `_placement_named` enforces."""
    schema["required"] = [*ENGINE_PLACEMENT, *schema.get("required", ())]
    for name in ENGINE_PLACEMENT:
        schema["properties"][name].pop("default", None)


class AdmissionRequest(Placement):
    """One workload asking to run on the host group."""

    model_config = ConfigDict(json_schema_extra=_engine_placement_required)

    request_id: Identifier
    orchestrator_id: Identifier
    submitted_at: AwareDatetime
    # Gang admission: requests of one orchestrator with the same gang id run all together or not at
    # all; every member names the same gang size (how many members the gang has).
    gang_id: Identifier | None = None
    gang_size: int | None = Field(default=None, ge=1, le=10_000)

    @model_validator(mode="wrap")
    @classmethod
    def _placement_named(cls, data: object, handler):
        """Each placement field the engine needs and was not given is missing, reported with
        whatever else is wrong, in field order."""
        missing = [name for name in ENGINE_PLACEMENT if name not in data] if isinstance(data, dict) else []
        try:
            validated = handler(data)
        except ValidationError as error:
            if not missing:
                raise
            found = error.errors()
        else:
            if not missing:
                return validated
            found = []
        found += [{"type": "missing", "loc": (name,), "input": data} for name in missing]
        order = {name: index for index, name in enumerate(cls.model_fields)}
        found.sort(key=lambda problem: order.get(problem["loc"][0], len(order)) if problem["loc"] else -1)
        raise ValidationError.from_exception_data(cls.__name__, [
            InitErrorDetails(type=p["type"], loc=p["loc"], input=p["input"], **({"ctx": p["ctx"]} if "ctx" in p else {}))
            for p in found
        ])

    @model_validator(mode="after")
    def _gang_fields_together(self) -> "AdmissionRequest":
        if (self.gang_id is None) != (self.gang_size is None):
            raise ValueError("gang_id and gang_size go together: give both (a gang member) or neither")
        return self

    def placement_identity(self) -> tuple:
        """What a replay of the same id must repeat; anything else is an identity collision."""
        identity: tuple = (self.orchestrator_id, self.environment, self.provider, self.runtime_kind, self.lane)
        if self.gang_id is not None:
            identity += (self.gang_id, self.gang_size)
        if self.resources:
            identity += (tuple(sorted(self.resources.items())),)
        return identity


class AdmissionRecord(AdmissionRequest):
    """A request plus everything the engine decided about it."""

    state: AdmissionState
    revision: int
    reason: str
    queue_deadline: datetime | None = None
    admitted_at: datetime | None = None
    lease_expires_at: datetime | None = None
    lease_revision: int = 0
    finished_at: datetime | None = None
    preempted_by: str | None = None
    requeue_attempts: int = 0  # ADR-004: times it went back to the queue after its lease expired
    # When a queued request is predicted to start (RFC 3339), or None when that cannot be known:
    # filled by the views (engine.forecast), not by every operation.
    eta: datetime | None = None


class AuditEvent(_Strict):
    """One change of one record (or of the policy), numbered by the engine's revision (`seq`)."""

    seq: int
    type: AuditEventType
    at: datetime
    request_id: str | None = None
    from_state: AdmissionState | None = None
    to_state: AdmissionState | None = None
    reason: str = ""
    related_request_id: str | None = None
    policy: str | None = None


class QueueEntry(_Strict):
    request_id: str
    position: int
    effective_priority: int
    binding_constraint: str
    eta: datetime | None = None


class Snapshot(_Strict):
    revision: int
    records: dict[str, AdmissionRecord]
    queue: list[QueueEntry]


# --- operations ---------------------------------------------------------------------------------


class Submit(_Strict):
    op: Literal["submit"] = "submit"
    request: AdmissionRequest


class Renew(_Strict):
    op: Literal["renew"] = "renew"
    request_id: str
    lease_revision: int | None = None


class Extend(_Strict):
    """Renew leases, each as of when its holder sent the renewal (request id -> that moment): no
    event, no new lease revision. What the requester renewals (`RenewBatch.everything`) of one
    decision pass become in the engine: one operation, so that none is expired by another's tick."""

    op: Literal["extend"] = "extend"
    renewals: dict[str, AwareDatetime]


class Release(_Strict):
    op: Literal["release"] = "release"
    request_id: str
    reason: str | None = None  # for the audit trail when it is not the holder's own release


class Cancel(_Strict):
    op: Literal["cancel"] = "cancel"
    request_id: str
    reason: str | None = None


class Reconcile(_Strict):
    op: Literal["reconcile"] = "reconcile"


class TakeSnapshot(_Strict):
    op: Literal["snapshot"] = "snapshot"


class SetPolicy(_Strict):
    op: Literal["set_policy"] = "set_policy"
    policy: AdmissionPolicy
    operator: str | None = None  # who changed it: the audit event names them
    # With a policy that holds: also preempt every preemptible lease (Kueue's HoldAndDrain).
    drain: bool = False


Operation = Annotated[
    Union[Submit, Renew, Extend, Release, Cancel, Reconcile, TakeSnapshot, SetPolicy],
    Field(discriminator="op"),
]

ErrorCode = Literal[
    "identity-collision", "not-found", "not-admitted", "stale-lease-revision", "gang-mismatch", "gang-full",
    "gang-running",
]


class OpError(_Strict):
    code: str
    message: str


class OpResult(_Strict):
    """The outcome of one operation: the record it touched, a snapshot, or an error."""

    op: str
    ok: bool
    record: AdmissionRecord | None = None
    snapshot: Snapshot | None = None
    error: OpError | None = None

    @model_validator(mode="after")
    def _error_iff_not_ok(self) -> "OpResult":
        if self.ok == (self.error is not None):
            raise ValueError("an OpResult carries an error exactly when ok is false")
        return self
