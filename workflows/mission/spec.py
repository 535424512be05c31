"""`MissionSpec`: what Mission Control asks for. Validated completely before any workflow starts."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from workflows.admission.model import Identifier, PriorityClass, RuntimeKind
from workflows.contract import ArtifactKind, Budgets, WorkloadKind, WorkloadPolicy
from workflows.credential_material import find_credential_material

LONG_LIVED_KINDS: frozenset[str] = frozenset({"daemon", "persistent-agent", "scheduled-collector"})


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


class ChildSpec(_Spec):
    """One child workload: what runs, where it may run, and how it competes for admission."""

    child_id: Identifier
    kind: WorkloadKind
    prompt: str = Field(min_length=1, description="what the executor runs (a /bin/sh command on the local substrate)")
    runtime_kind: RuntimeKind = "host"
    environment: str = Field(default="default", min_length=1)
    provider: str = Field(default="local", min_length=1)
    priority: int = 0
    preemptible: bool = False
    lane: str | None = None
    priority_class: PriorityClass = "P2"
    required_evidence: list[ArtifactKind] = Field(default_factory=list)
    schedule: str | None = Field(default=None, min_length=1)
    target_id: Identifier | None = None
    policy: WorkloadPolicy | None = None
    budgets: Budgets = Field(default_factory=lambda: Budgets(max_attempts=1, timeout_seconds=600))
    verifier: str | None = Field(default=None, min_length=1)
    queue_timeout_seconds: float = Field(default=3600, gt=0)

    @property
    def long_lived(self) -> bool:
        return self.kind in LONG_LIVED_KINDS

    def workload_policy(self) -> WorkloadPolicy:
        """The contract policy: given, or the lowest trust tier isolated as the runtime kind says."""
        return self.policy or WorkloadPolicy(trust_tier="T1", isolation_kind=self.runtime_kind)


class MissionSpec(_Spec):
    mission_id: Identifier
    orchestrator_id: Identifier
    goal: str = Field(min_length=1)
    host_group: Identifier = "default"
    aggregation: AggregationPolicy = Field(default_factory=AllPass)
    require_distinct_targets: bool = True
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
            if child.kind == "scheduled-collector" and child.schedule is None:
                problems.append(f"{where}: a scheduled-collector needs a `schedule` (cron, e.g. \"*/5 * * * *\")")
            if child.kind != "scheduled-collector" and child.schedule is not None:
                problems.append(f"{where}: only a scheduled-collector takes a `schedule`")
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
