"""`MissionSpec`: what Mission Control asks for. Validated completely before any workflow starts."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from workflows.admission.model import Identifier, Placement
from workflows.contract import ArtifactKind, Budgets, Id, WorkloadKind, WorkloadPolicy
from workflows.credential_material import find_credential_material
from workflows.ids import (
    ATTEMPT_SEPARATOR,
    MAX_ATTEMPT_NUMBER,
    admission_request_id,
    admission_workflow_id,
    dispatch_id,
    fleet_child_id,
    idempotency_key,
    mission_workflow_id,
    reserved_attempt_suffix,
    workload_workflow_id,
)
from workflows.limits import (
    MAX_DURATION_SECONDS,
    MAX_GOAL_CHARS,
    MAX_ID_CHARS,
    MAX_PROMPT_CHARS,
    MAX_SPEC_JSON_BYTES,
    MAX_WORKFLOW_ID_CHARS,
)

LONG_LIVED_KINDS: frozenset[str] = frozenset({"daemon", "persistent-agent", "scheduled-collector"})

_IDENTIFIER = TypeAdapter(Identifier)
_CONTRACT_ID = TypeAdapter(Id)


def _usable_id(value: object) -> object:
    """Spec ids become admission ids, fleet contract ids and workflow ids, and are printed:
    each of those rules holds here (the contract counts \\x1c-\\x1f as whitespace), and an id
    is printable, so no id can hide a control sequence in a terminal or a log. Runs before
    `Identifier`'s own checks, so that a bad id is told in words rather than as a pattern."""
    if not isinstance(value, str):
        return value  # Identifier says what it should be
    try:
        _CONTRACT_ID.validate_python(value)
    except ValidationError as error:
        raise ValueError(error.errors()[0]["msg"]) from None
    for position, char in enumerate(value):
        if not char.isprintable():
            raise ValueError(f"must contain printable characters only (found {ascii(char)} at position {position})")
    return value


def _no_nul(value: str) -> str:
    """A NUL character ends a C string (a /bin/sh argument, a SQLite text): never meaningful here."""
    if "\x00" in value:
        raise ValueError(f"must not contain a NUL character (found one at position {value.index(chr(0))})")
    return value


def _derived_id_problem(
    label: str, template: str, value: str, limit: int, rule: TypeAdapter | None, fields: tuple[str, ...], length: int
) -> str | None:
    """Why `value`, `template` filled in from the spec's `fields` (`length` characters of them),
    would be refused where it is used later; None if it fits."""
    names = " and ".join(fields)
    together, make = (" together", "make") if len(fields) > 1 else ("", "makes")
    if len(value) > limit:
        return (
            f"{names} ({length} characters{together}) {make} the {label} {template} {len(value)} characters "
            f"long, and it may have at most {limit}: shorten {names} to at most "
            f"{limit - (len(value) - length)} characters{together}"
        )
    if rule is not None:
        try:
            rule.validate_python(value)
        except ValidationError as error:
            return f"the {label} {template} built from {names} would not be a valid id: {error.errors()[0]['msg']}"
    return None


SpecId = Annotated[Identifier, BeforeValidator(_usable_id)]
# The rule for a host group's name: MissionSpec.host_group and every --host-group of the CLI.
HostGroup = SpecId
Text = Annotated[str, AfterValidator(_no_nul)]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AllPass(_Spec):
    mode: Literal["all-pass"] = "all-pass"


class Quorum(_Spec):
    mode: Literal["quorum"] = "quorum"
    minimum_successes: int = Field(ge=1)


class BestOutput(_Spec):
    mode: Literal["best-output"] = "best-output"


class FailFast(_Spec):
    mode: Literal["fail-fast"] = "fail-fast"


class ManualReview(_Spec):
    mode: Literal["manual-review"] = "manual-review"


AggregationPolicy = Annotated[
    Union[AllPass, Quorum, BestOutput, FailFast, ManualReview], Field(discriminator="mode")
]


class Admission(_Spec):
    """How the mission's children are admitted: each on its own (`independent`), or all together
    or not at all (`gang`: one admission gang of every routed child; docs/admission-engine.md)."""

    mode: Literal["independent", "gang"] = "independent"


class Approval(_Spec):
    """A person's say over a child (docs/mission-spec.md, "approval"): `required` gates its dispatch
    (admitted, it holds its lease and waits for an answer to "dispatch CHILD?"); `timeout_seconds`
    bounds every wait for an answer, the gate's and its task's own questions that carry no deadline."""

    required: bool = False
    timeout_seconds: int | None = Field(default=None, ge=1, le=MAX_DURATION_SECONDS)


class ChildSpec(Placement):
    """One child workload: what runs, where it may run, and how it competes for admission
    (`Placement`: what the admission request built from this child takes)."""

    child_id: SpecId
    kind: WorkloadKind
    prompt: Text = Field(
        min_length=1, max_length=MAX_PROMPT_CHARS,
        description="what the executor runs (a /bin/sh command on the local substrate)",
    )
    required_evidence: list[ArtifactKind] = Field(default_factory=list)
    schedule: Text | None = Field(default=None, min_length=1)
    target_id: SpecId | None = None
    policy: WorkloadPolicy | None = None
    budgets: Budgets = Field(default_factory=lambda: Budgets(max_attempts=1, timeout_seconds=600))
    verifier: Text | None = Field(default=None, min_length=1)
    approval: Approval | None = None

    @property
    def gated(self) -> bool:
        return self.approval is not None and self.approval.required

    @property
    def reports_by_signal(self) -> bool:
        """Its workload may outlive the mission's run (a mission continues as new while it runs):
        a long-lived kind, or a child with `approval`, which may wait on a person for days."""
        return self.long_lived or self.approval is not None

    @property
    def answer_timeout_seconds(self) -> int | None:
        return self.approval.timeout_seconds if self.approval is not None else None

    @property
    def long_lived(self) -> bool:
        return self.kind in LONG_LIVED_KINDS

    def workload_policy(self) -> WorkloadPolicy:
        """The contract policy: given, or the lowest trust tier isolated as the runtime kind says."""
        return self.policy or WorkloadPolicy(trust_tier="T1", isolation_kind=self.runtime_kind)


class MissionSpec(_Spec):
    mission_id: SpecId
    orchestrator_id: SpecId
    goal: Text = Field(min_length=1, max_length=MAX_GOAL_CHARS)
    host_group: HostGroup = "default"
    aggregation: AggregationPolicy = Field(default_factory=AllPass)
    require_distinct_targets: bool = True
    admission: Admission = Field(default_factory=Admission)
    children: list[ChildSpec] = Field(min_length=1, max_length=1000)

    @model_validator(mode="after")
    def _consistent(self) -> "MissionSpec":
        problems: list[str] = []
        seen: set[str] = set()
        for index, child in enumerate(self.children):
            where = f"children[{index}] ({child.child_id})"
            if child.child_id in seen:
                problems.append(f"{where}: child_id is used twice; every child needs its own id")
            seen.add(child.child_id)
            if reserved_attempt_suffix(child.child_id):
                problems.append(
                    f"{where}: a child_id may not end in {ATTEMPT_SEPARATOR!r} and a number; that is how the ids "
                    "of a child's later attempts end: rename the child"
                )
            if child.kind == "scheduled-collector" and child.schedule is None:
                problems.append(f"{where}: a scheduled-collector needs a `schedule` (cron, e.g. \"*/5 * * * *\")")
            if child.kind != "scheduled-collector" and child.schedule is not None:
                problems.append(f"{where}: only a scheduled-collector takes a `schedule`")
            if child.verifier is not None and child.kind != "one-shot-command":
                problems.append(
                    f"{where}: only a one-shot-command takes a `verifier` (it checks a finished run; a "
                    f"{child.kind} never finishes for good): remove it, or check from a one-shot child"
                )
            if child.policy is not None and child.policy.isolation_kind != child.runtime_kind:
                problems.append(
                    f"{where}: policy.isolation_kind {child.policy.isolation_kind!r} differs from runtime_kind "
                    f"{child.runtime_kind!r}; admission and the executor must agree"
                )
        if isinstance(self.aggregation, Quorum) and self.aggregation.minimum_successes > len(self.children):
            problems.append(
                f"aggregation: quorum needs {self.aggregation.minimum_successes} successes but the mission has "
                f"only {len(self.children)} children"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _derived_ids_fit(self) -> "MissionSpec":
        """Every id built from the spec's ids must pass where it is used later, inside a
        workflow, where a refusal can no longer be fixed: built here with the same functions
        (workflows.ids) and checked with the same rules."""
        mission = self.mission_id
        problems = [
            problem
            for problem in (
                _derived_id_problem("mission workflow id", "mission:<mission_id>", mission_workflow_id(mission),
                                    MAX_WORKFLOW_ID_CHARS, None, ("mission_id",), len(mission)),
                _derived_id_problem("admission workflow id", "admission:<host_group>",
                                    admission_workflow_id(self.host_group), MAX_WORKFLOW_ID_CHARS, None,
                                    ("host_group",), len(self.host_group)),
            )
            if problem is not None
        ]
        # Checked for the highest attempt number, whose ids are the longest (workflows.ids).
        last = MAX_ATTEMPT_NUMBER
        attempt = f"{ATTEMPT_SEPARATOR}{last}"
        for index, child in enumerate(self.children):
            fields, length = ("mission_id", "child_id"), len(mission) + len(child.child_id)
            derived = (  # the longest first: the first that does not fit is the one to report
                ("dispatch id", f"<mission_id>:<child_id>{attempt}:dispatch", dispatch_id, MAX_ID_CHARS, _CONTRACT_ID),
                ("workload workflow id", f"workload:<mission_id>:<child_id>{attempt}", workload_workflow_id,
                 MAX_WORKFLOW_ID_CHARS, None),
                ("admission request id", f"<mission_id>:<child_id>{attempt}", admission_request_id, MAX_ID_CHARS,
                 _IDENTIFIER),
                ("fleet child id", f"<mission_id>:<child_id>{attempt}", fleet_child_id, MAX_ID_CHARS, _CONTRACT_ID),
                ("idempotency key", f"<mission_id>:<child_id>{attempt}", idempotency_key, MAX_ID_CHARS, _CONTRACT_ID),
            )
            for label, template, build, limit, rule in derived:
                value = build(mission, child.child_id, last)
                problem = _derived_id_problem(label, template, value, limit, rule, fields, length)
                if problem is not None:
                    problems.append(f"children[{index}].child_id: {problem}")
                    break
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _fits_one_payload(self) -> "MissionSpec":
        size = len(self.model_dump_json().encode())
        if size > MAX_SPEC_JSON_BYTES:
            raise ValueError(
                f"the spec is {size} bytes as JSON (defaults included); a mission spec may take at most "
                f"{MAX_SPEC_JSON_BYTES} bytes ({MAX_SPEC_JSON_BYTES // 1024} KiB), since it travels whole in "
                "one Temporal payload: shorten the prompts, or split the mission"
            )
        return self

    @model_validator(mode="after")
    def _no_credential_material(self) -> "MissionSpec":
        """A spec travels into workflow histories, ledgers and records: no secret may ride in it.

        Values only (the spec's keys are its own field names): a prompt is a shell command, so
        `curl -H "Authorization: Bearer $TOKEN"` passes and a literal token does not.
        """
        findings = find_credential_material(self.model_dump(mode="json"), keys=False, limit=8)
        if findings:
            raise ValueError(
                "credential material must not be put in a mission spec: "
                + "; ".join(f"{finding.path.removeprefix('$.')}: {finding.what}" for finding in findings)
                + ". Pass secrets through the worker's environment instead (refer to them as $NAME in a prompt)"
            )
        return self
