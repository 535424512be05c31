"""Fleet Workload Contract v1 (`urn:agentic-orchestration:fleet-workload:v1`) as pydantic models.

The JSON Schema in `workflows/fleet_workload_v1/` is the authority; these models accept
exactly what it accepts (tests cross-check them against it), with one extra restriction the schema
cannot express: credential material never crosses the boundary, so keys that name a credential and
strings that look like one (a JWT, `Bearer ...`, an API key) are rejected at any depth, including
inside the otherwise open `spec.orchestrator_metadata`. What counts as credential material is
decided in one place for the whole product: `workflows.credential_material`.

Why the models are stricter than pydantic's defaults: the schema does not coerce (`"1"` is not an
integer, `1` is not a boolean, a unix time is not a date-time), optional fields may be omitted but
not `null` (only the four nullable lineage ids may be null), and patterns follow ECMA-262, where
`$` does not match before a trailing newline.

`to_wire` is the one way out: it drops absent optional fields, keeps explicit lineage nulls and
writes timestamps in UTC with `Z`, so `parse_document -> to_wire` is stable and safe to hash.

Imported inside the Temporal workflow sandbox: pydantic and side-effect-free stdlib only.
"""

from __future__ import annotations

import difflib
import json
import re
import types
import typing
from datetime import datetime, timedelta, timezone
from typing import Annotated, Any, ClassVar, Literal, Optional, TypeVar, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    PlainSerializer,
    PlainValidator,
    SerializerFunctionWrapHandler,
    Strict,
    StrictBool,
    StrictStr,
    ValidationError,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from workflows.credential_material import (
    ALLOWED_REF_KEYS,
    Finding,
    credential_paths,
    find_credential_material,
    is_credential_key,
    json_path,
    value_credential_kind,
)

__all__ = [
    "API_VERSION",
    "CONTRACT_ID",
    "DOCUMENT_TYPES",
    "ALLOWED_REF_KEYS",
    "TERMINAL_OBSERVED_STATES",
    "TERMINAL_FAILURE_STATES",
    "REVIEW_REQUIRED_STATES",
    "WorkloadKind",
    "DesiredState",
    "ObservedState",
    "Health",
    "IsolationKind",
    "ArtifactKind",
    "BackpressureReason",
    "ExitClassification",
    "ReconciliationClass",
    "CapabilityStatus",
    "Lineage",
    "Capability",
    "WorkloadPolicy",
    "Budgets",
    "Backpressure",
    "Artifact",
    "WorkloadSpec",
    "WorkloadStatus",
    "WorkloadRecord",
    "InventorySnapshot",
    "ReconciliationRow",
    "ReconciliationReport",
    "ContractDocument",
    "ContractError",
    "parse_document",
    "to_wire",
    "find_credential_keys",
    "is_credential_key",
    "describe_validation_error",
    "json_path",
]

API_VERSION = "agentic-orchestration/v1"
CONTRACT_ID = "urn:agentic-orchestration:fleet-workload:v1"

WorkloadKind = Literal["persistent-agent", "daemon", "scheduled-collector", "one-shot-command"]
DesiredState = Literal["pending", "running", "detached", "stopped", "cancelled"]
ObservedState = Literal[
    "pending", "admitted", "starting", "running", "blocked", "detached",
    "retained", "healthy", "degraded", "restarting", "scheduled", "missed",
    "catching-up", "stopping", "succeeded", "failed", "cancelled",
    "timed-out", "unknown", "operator-review-required",
]  # fmt: skip
Health = Literal["healthy", "degraded", "unhealthy", "unknown"]
IsolationKind = Literal["host", "container", "vm", "microvm", "custom"]
ArtifactKind = Literal["result", "log", "telemetry", "verifier", "other"]
BackpressureReason = Literal["capacity", "policy", "approval", "rate-limit", "dependency"]
ExitClassification = Literal["success", "failure", "cancelled", "timeout", "unknown"]
ReconciliationClass = Literal["re-adopted", "terminal", "unknown", "failed-or-aborted", "operator-review-required"]
CapabilityStatus = Literal["supported", "unsupported", "degraded", "policy-blocked"]

TERMINAL_FAILURE_STATES: frozenset[ObservedState] = frozenset({"failed", "cancelled", "timed-out"})
TERMINAL_OBSERVED_STATES: frozenset[ObservedState] = frozenset({"succeeded"}) | TERMINAL_FAILURE_STATES
# States that never count as success: they always need an operator (the design's "fail closed").
REVIEW_REQUIRED_STATES: frozenset[ObservedState] = frozenset({"unknown", "operator-review-required"})

_WHITESPACE = re.compile(r"\s")  # Python's \s, the same set the reference validator uses
_TRUST_TIER = re.compile(r"T[0-9]+")
_SHA256 = re.compile(r"[a-f0-9]{64}")
# RFC 3339 date-time, as JSON Schema's `format: date-time` reads it ("T" and "Z" in either case).
_DATE_TIME = re.compile(
    r"(?P<year>\d{4})-(?P<month>\d{2})-(?P<day>\d{2})[Tt](?P<hour>\d{2}):(?P<minute>\d{2}):(?P<second>\d{2})"
    r"(?:\.(?P<fraction>\d+))?(?P<offset>[Zz]|[+-]\d{2}:\d{2})?",
    re.ASCII,
)
_MAX_ID_LENGTH = 256
_MAX_REASON_LENGTH = 512

_CREDENTIAL_MESSAGE = (
    "credential material must not cross the contract boundary: remove key {key} and name the "
    "credential through spec.policy.credential_policy_ref instead"
)
_CREDENTIAL_TEXT_MESSAGE = (
    "credential material must not cross the contract boundary: this is {what}; remove it and name the "
    "credential through spec.policy.credential_policy_ref instead"
)


# --- credential material (the rules: workflows/credential_material.py) ---------------------------


def find_credential_keys(value: object) -> list[str]:
    """JSON paths (`$.spec.orchestrator_metadata.db['db-password']`) of every credential-named key, in order."""
    return credential_paths(value, values=False)


def _credential_message(finding: Finding) -> str:
    """Name a credential-named key; never echo text that looks like a credential."""
    if finding.in_key:
        key = str(finding.loc[-1])
        looks_like = value_credential_kind(key)
        if looks_like is None:
            return _CREDENTIAL_MESSAGE.format(key=repr(key))
        return _CREDENTIAL_TEXT_MESSAGE.format(what=f"a key that looks like {looks_like}")
    return _CREDENTIAL_TEXT_MESSAGE.format(what=finding.what)


def _reject_credential_keys(metadata: dict[str, Any]) -> dict[str, Any]:
    findings = find_credential_material(metadata)
    if findings:
        shown = ", ".join(finding.describe() for finding in findings[:8])
        raise PydanticCustomError(
            "contract.credential_keys",
            "credential material must not cross the contract boundary ({shown})",
            {"shown": shown, "findings": [(f.loc, _credential_message(f)) for f in findings]},
        )
    return metadata


# --- field types ---------------------------------------------------------------------------------


def _describe(value: object) -> str:
    """A short JSON-flavoured rendering of an offending value for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
        return text if len(text) <= 60 else text[:56] + '..."'
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "an array"
    return type(value).__name__


def _check_id(value: str) -> str:
    if not value:
        raise PydanticCustomError("contract.id", "must not be empty (ids are 1-256 characters without whitespace)")
    if len(value) > _MAX_ID_LENGTH:
        raise PydanticCustomError(
            "contract.id", "is {length} characters long; ids are at most 256", {"length": len(value)}
        )
    space = _WHITESPACE.search(value)
    if space:
        raise PydanticCustomError(
            "contract.id",
            "must not contain whitespace (found {char} at position {position} in {value})",
            {"char": json.dumps(space.group()), "position": space.start(), "value": _describe(value)},
        )
    return value


def _check_trust_tier(value: str) -> str:
    if not _TRUST_TIER.fullmatch(value):
        raise PydanticCustomError(
            "contract.trust_tier", "must be 'T' followed by digits, e.g. T0 or T2 (got {value})",
            {"value": _describe(value)},
        )  # fmt: skip
    return value


def _check_sha256(value: str) -> str:
    if not _SHA256.fullmatch(value):
        raise PydanticCustomError(
            "contract.sha256", "must be a SHA-256 digest: 64 lowercase hex characters (got {value})",
            {"value": _describe(value)},
        )  # fmt: skip
    return value


def _integral_float_to_int(value: object) -> object:
    """JSON Schema counts 3.0 as an integer; normalise it so the wire form is stable."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _non_negative_number(value: object) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PydanticCustomError("contract.number", "must be a number (got {value})", {"value": _describe(value)})
    if value != value or value in (float("inf"), float("-inf")):
        raise PydanticCustomError("contract.number", "must be a finite number (got {value})", {"value": value})
    if value < 0:
        raise PydanticCustomError("contract.number", "must be at least 0 (got {value})", {"value": value})
    return value


def _parse_timestamp(value: object) -> datetime:
    """RFC 3339 with a mandatory offset; held as an aware UTC datetime."""
    if isinstance(value, datetime):
        if value.utcoffset() is None:
            raise PydanticCustomError("contract.timestamp", "must be timezone-aware (got a naive datetime)")
        parsed = value
    elif isinstance(value, str):
        match = _DATE_TIME.fullmatch(value)
        if match is None:
            raise PydanticCustomError(
                "contract.timestamp",
                "must be an RFC 3339 date-time such as 2026-08-02T15:00:00Z (got {value})",
                {"value": _describe(value)},
            )
        if match["offset"] is None:
            raise PydanticCustomError(
                "contract.timestamp",
                "has no UTC offset: append Z (UTC) or an offset like +02:00 (got {value})",
                {"value": _describe(value)},
            )
        parsed = _timestamp_from_match(match, value)
    else:
        raise PydanticCustomError(
            "contract.timestamp",
            "must be an RFC 3339 date-time string such as 2026-08-02T15:00:00Z (got {value})",
            {"value": _describe(value)},
        )
    try:
        return parsed.astimezone(timezone.utc)
    except OverflowError:
        raise PydanticCustomError(
            "contract.timestamp", "is out of range once converted to UTC (got {value})", {"value": _describe(value)}
        ) from None


def _timestamp_from_match(match: re.Match[str], text: str) -> datetime:
    offset = match["offset"].upper()
    try:
        if offset == "Z":
            tz = timezone.utc
        else:
            hours, minutes = int(offset[1:3]), int(offset[4:6])
            if hours > 23 or minutes > 59:
                raise ValueError(f"offset {offset} is out of range")
            sign = -1 if offset[0] == "-" else 1
            tz = timezone(sign * timedelta(hours=hours, minutes=minutes))
        # Sub-microsecond digits are truncated: datetime has no finer resolution.
        micros = int((match["fraction"] or "0")[:6].ljust(6, "0"))
        return datetime(
            int(match["year"]), int(match["month"]), int(match["day"]),
            int(match["hour"]), int(match["minute"]), int(match["second"]), micros, tzinfo=tz,
        )  # fmt: skip
    except ValueError as error:
        raise PydanticCustomError(
            "contract.timestamp", "is not a valid date-time: {reason} (got {value})",
            {"reason": str(error), "value": _describe(text)},
        ) from None  # fmt: skip


def _format_timestamp(value: datetime) -> str:
    utc = value.astimezone(timezone.utc).replace(tzinfo=None)
    text = utc.replace(microsecond=0).isoformat()
    if utc.microsecond:
        text += f".{utc.microsecond:06d}".rstrip("0")
    return text + "Z"


def _reject_null(value: object) -> object:
    if value is None:
        raise PydanticCustomError("contract.null", "must not be null: omit the field when it has no value")
    return value


T = TypeVar("T")
# Optional in the schema but never null: leave it out instead.
Omittable = Annotated[Optional[T], BeforeValidator(_reject_null)]

Id = Annotated[StrictStr, AfterValidator(_check_id)]
NonEmptyStr = Annotated[StrictStr, Field(min_length=1)]
Reason = Annotated[StrictStr, Field(max_length=_MAX_REASON_LENGTH)]
Timestamp = Annotated[
    datetime, PlainValidator(_parse_timestamp), PlainSerializer(_format_timestamp, return_type=str, when_used="json")
]
JsonInt = Annotated[int, BeforeValidator(_integral_float_to_int), Strict()]
Revision = Annotated[JsonInt, Field(ge=0)]
NonNegativeNumber = Annotated[Union[int, float], PlainValidator(_non_negative_number)]


# --- models --------------------------------------------------------------------------------------


class _ContractModel(BaseModel):
    """Closed objects (`additionalProperties: false`) that serialise to their wire form."""

    model_config = ConfigDict(extra="forbid")

    # Fields the schema lets be null: an explicit null survives a round trip, an absent one stays absent.
    _nullable_fields: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _drop_absent(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        keep_null = self._nullable_fields & self.model_fields_set
        return {key: value for key, value in data.items() if value is not None or key in keep_null}

    def to_wire(self) -> dict[str, Any]:
        """The JSON form; raises `ContractError` if the model was mutated into something invalid."""
        return to_wire(self)


class Lineage(_ContractModel):
    _nullable_fields = frozenset({"parent_id", "session_id", "task_id", "command_id"})

    orchestrator_id: Id
    mission_id: Id
    dispatch_id: Id
    idempotency_key: Id
    parent_id: Optional[Id] = None
    child_id: Id
    target_id: Id
    executor_id: Id
    runtime_id: Id
    session_id: Optional[Id] = None
    task_id: Optional[Id] = None
    command_id: Optional[Id] = None


class Capability(_ContractModel):
    name: Id
    status: CapabilityStatus
    reason: Omittable[Reason] = None


def _unique_capabilities(capabilities: list[Capability]) -> list[Capability]:
    """`uniqueItems`: whole objects compare equal, as JSON Schema compares them (not just names)."""
    first_seen: dict[str, int] = {}
    for index, capability in enumerate(capabilities):
        key = json.dumps(capability.model_dump(mode="json"), sort_keys=True)
        if key in first_seen:
            raise PydanticCustomError(
                "contract.duplicate_capability",
                "duplicates capabilities[{first}] ({name}); list each capability once",
                {"first": first_seen[key], "name": _describe(capability.name), "at": (index,)},
            )
        first_seen[key] = index
    return capabilities


class WorkloadPolicy(_ContractModel):
    trust_tier: Annotated[StrictStr, AfterValidator(_check_trust_tier)]
    isolation_kind: IsolationKind
    credential_policy_ref: Omittable[Id] = None
    network_policy_ref: Omittable[Id] = None


class Budgets(_ContractModel):
    max_attempts: Annotated[JsonInt, Field(ge=1, le=100)]
    timeout_seconds: Annotated[JsonInt, Field(ge=1)]
    max_cost_usd: Omittable[NonNegativeNumber] = None


class Backpressure(_ContractModel):
    reason: BackpressureReason
    retryable: StrictBool
    retry_after: Omittable[Timestamp] = None


class Artifact(_ContractModel):
    kind: ArtifactKind
    uri: NonEmptyStr
    sha256: Annotated[StrictStr, AfterValidator(_check_sha256)]


class WorkloadSpec(_ContractModel):
    desired_state: DesiredState
    capabilities: Annotated[list[Capability], AfterValidator(_unique_capabilities)]
    policy: WorkloadPolicy
    budgets: Budgets
    schedule: Omittable[NonEmptyStr] = None
    # The one open object: orchestrator-private data, still free of credential material.
    orchestrator_metadata: Omittable[Annotated[dict[str, JsonValue], AfterValidator(_reject_credential_keys)]] = None


class WorkloadStatus(_ContractModel):
    observed_state: ObservedState
    revision: Revision
    last_seen: Timestamp
    health: Omittable[Health] = None
    backpressure: Omittable[Backpressure] = None
    artifacts: list[Artifact]
    exit_classification: Omittable[ExitClassification] = None
    error_code: Omittable[NonEmptyStr] = None


class WorkloadRecord(_ContractModel):
    document_type: Literal["workload"]
    api_version: Literal["agentic-orchestration/v1"]
    kind: WorkloadKind
    lineage: Lineage
    spec: WorkloadSpec
    status: WorkloadStatus

    @model_validator(mode="after")
    def _kind_requirements(self) -> WorkloadRecord:
        if self.kind == "scheduled-collector" and self.spec.schedule is None:
            raise PydanticCustomError(
                "contract.schedule_required",
                "is required for kind 'scheduled-collector': give the collector's schedule, e.g. '0 * * * *'",
                {"at": ("spec", "schedule")},
            )
        if self.kind == "daemon" and self.status.health is None:
            raise PydanticCustomError(
                "contract.health_required",
                "is required for kind 'daemon': report healthy, degraded, unhealthy or unknown",
                {"at": ("status", "health")},
            )
        return self


class InventorySnapshot(_ContractModel):
    document_type: Literal["inventory"]
    api_version: Literal["agentic-orchestration/v1"]
    inventory_revision: Revision
    generated_at: Timestamp
    records: Annotated[list[WorkloadRecord], Field(min_length=1)]


class ReconciliationRow(_ContractModel):
    child_id: Id
    classification: ReconciliationClass
    observed_state: ObservedState
    revision: Revision
    reason: Omittable[Reason] = None

    @model_validator(mode="after")
    def _unknown_is_not_terminal(self) -> ReconciliationRow:
        if self.classification == "unknown" and self.observed_state in TERMINAL_OBSERVED_STATES:
            raise PydanticCustomError(
                "contract.unknown_but_terminal",
                "a row classified 'unknown' cannot have the terminal observed_state '{state}': classify it "
                "'terminal' or 'failed-or-aborted', or report observed_state 'unknown'",
                {"state": self.observed_state, "at": ("observed_state",)},
            )
        return self


class ReconciliationReport(_ContractModel):
    document_type: Literal["reconciliation"]
    api_version: Literal["agentic-orchestration/v1"]
    generated_at: Timestamp
    before_revision: Revision
    after_revision: Revision
    rows: Annotated[list[ReconciliationRow], Field(min_length=1)]


ContractDocument = Union[WorkloadRecord, InventorySnapshot, ReconciliationReport]

_DOCUMENT_MODELS: dict[str, type[ContractDocument]] = {
    "workload": WorkloadRecord,
    "inventory": InventorySnapshot,
    "reconciliation": ReconciliationReport,
}
DOCUMENT_TYPES = tuple(_DOCUMENT_MODELS)
_MODELS_BY_NAME: dict[str, type[BaseModel]] = {
    model.__name__: model
    for model in (
        Lineage, Capability, WorkloadPolicy, Budgets, Backpressure, Artifact, WorkloadSpec, WorkloadStatus,
        WorkloadRecord, InventorySnapshot, ReconciliationRow, ReconciliationReport,
    )
}  # fmt: skip


# --- errors, parsing, wire form ------------------------------------------------------------------


class ContractError(ValueError):
    """A document that breaks the contract; `issues` are `(json_path, message)` pairs, one per problem."""

    def __init__(self, issues: list[tuple[str, str]]) -> None:
        super().__init__(issues)
        self.issues = issues

    def __str__(self) -> str:
        return "; ".join(f"{path}: {message}" for path, message in self.issues)


def _model_at(root: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model class that validated the object at `loc` under `root`, to list its fields."""
    annotation: Any = root
    for part in loc:
        annotation = _unwrap(annotation)
        if isinstance(part, int) and typing.get_origin(annotation) is list:
            annotation = typing.get_args(annotation)[0]
        elif isinstance(part, str) and isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = annotation.model_fields.get(part)
            if field is None:
                return None
            annotation = field.annotation
        else:
            return None
    annotation = _unwrap(annotation)
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
            if len(members) != 1:
                return annotation
            annotation = members[0]
        else:
            return annotation


def _unknown_field_message(root: type[BaseModel] | None, loc: tuple[int | str, ...]) -> str:
    key = str(loc[-1])
    owner = _model_at(root, loc[:-1]) if root else None
    if owner is None:
        return f"unknown field {key!r}: remove it"
    allowed = list(owner.model_fields)
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown field {key!r}{hint}: remove it; fields allowed here are {', '.join(allowed)}"


_PLAIN_MESSAGES = {
    "missing": "is required but missing",
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "int_from_float": "must be an integer",
    "bool_type": "must be true or false",
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
    "dict_type": "must be an object",
    "list_type": "must be an array",
}


def describe_validation_error(error: ValidationError) -> list[tuple[str, str]]:
    """Turn a pydantic error from one of these models into `(json_path, message)` pairs a person can act on."""
    root = _MODELS_BY_NAME.get(error.title)
    issues: list[tuple[str, str]] = []
    for detail in error.errors(include_url=False):
        loc = tuple(detail["loc"])
        kind = detail["type"]
        ctx = detail.get("ctx") or {}
        value = detail.get("input")
        if kind == "contract.credential_keys":
            issues.extend((json_path(loc + sub), message) for sub, message in ctx["findings"])
            continue
        loc += tuple(ctx.get("at", ()))
        if kind == "extra_forbidden":
            key = str(loc[-1])
            if (looks_like := value_credential_kind(key)) is not None:
                message = _CREDENTIAL_TEXT_MESSAGE.format(what=f"a key that looks like {looks_like}")
            elif is_credential_key(key):
                message = _CREDENTIAL_MESSAGE.format(key=repr(key))
            else:
                message = _unknown_field_message(root, loc)
        elif kind in _PLAIN_MESSAGES:
            message = _PLAIN_MESSAGES[kind]
            if kind != "missing":
                message += f" (got {_describe(value)})"
        elif kind == "literal_error":
            message = f"must be {ctx['expected']} (got {_describe(value)})"
        elif kind in ("greater_than_equal", "less_than_equal"):
            bound = "at least" if kind == "greater_than_equal" else "at most"
            limit = ctx.get("ge", ctx.get("le"))
            message = f"must be {bound} {limit} (got {_describe(value)})"
        elif kind == "string_too_short":
            message = "must not be empty"
        elif kind == "string_too_long":
            message = f"must be at most {ctx['max_length']} characters (got {len(value)})"
        elif kind == "too_short":
            message = f"must contain at least {ctx['min_length']} item(s)"
        else:
            message = detail["msg"].removeprefix("Value error, ")
        issues.append((json_path(loc), message))
    return issues


def parse_document(data: object) -> ContractDocument:
    """Validate decoded JSON as one of the three documents, chosen by `document_type`.

    Raises `ContractError` listing every problem found, including credential-named keys nested
    under fields that are themselves unknown, and strings anywhere that look like a credential.
    """
    if not isinstance(data, dict):
        raise ContractError([("$", f"must be a JSON object with a document_type (got {_describe(data)})")])
    issues: list[tuple[str, str]] = []
    document_type = data.get("document_type")
    model = _DOCUMENT_MODELS.get(document_type) if isinstance(document_type, str) else None
    document: ContractDocument | None = None
    if model is None:
        expected = ", ".join(repr(name) for name in DOCUMENT_TYPES)
        problem = "is required but missing" if "document_type" not in data else f"is {_describe(document_type)}"
        issues.append(("$.document_type", f"{problem}; it must be one of {expected}"))
    else:
        try:
            document = model.model_validate(data)
        except ValidationError as error:
            issues = describe_validation_error(error)
    reported = {path for path, _ in issues}
    for finding in find_credential_material(data):
        if finding.path not in reported:
            issues.append((finding.path, _credential_message(finding)))
    if issues or document is None:
        raise ContractError(issues)
    return document


def to_wire(model: BaseModel) -> dict[str, Any]:
    """The JSON-ready dict: schema-valid, absent fields absent, lineage nulls kept, UTC `Z` timestamps.

    Re-validates the result, so a model mutated into an invalid state fails here rather than on
    the other side of the boundary.
    """
    wire: dict[str, Any] = model.model_dump(mode="json")
    try:
        type(model).model_validate(wire)
    except ValidationError as error:
        raise ContractError(describe_validation_error(error)) from None
    return wire
