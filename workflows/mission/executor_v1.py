"""AIWG `executor.v1` as a singleton mission profile: one dispatch payload, one mission of one child.

An `aiwg serve` router dispatches a mission to an executor with one JSON body (Agentic Sandbox
`docs/aiwg-executor.md` and `management/src/http/dispatch.rs`, `DispatchRequest`, at e901dc2):
`mission_id`, `objective` (the command or prompt), `completion` (criteria, prose), `long_running`,
`executor_filter` (`executor_id`, `capabilities`, `agent_id`) and free `metadata`. The Fleet
Workload Contract keeps that profile: its mission identity maps to exactly one fleet workload
child. `to_spec` is that mapping (docs/mission-spec.md, "AIWG executor.v1 dispatches"):

| executor.v1 | MissionSpec |
|---|---|
| `mission_id` | `mission_id` (the workflow id is `mission:<mission_id>`, as for every mission) |
| `objective` | the one child's `prompt`; the child is `objective` |
| `long_running` false / true | the child's kind: `one-shot-command` / `persistent-agent` |
| `completion` | the mission's `goal` (else the objective), cut to the goal's limit |
| `executor_filter.agent_id` | the child's `target_id` |
| `executor_filter.capabilities` `isolation:vm` / `container` / `host` | the child's `runtime_kind` |
| `executor_filter.executor_id`, other capabilities | not used: the AIWG router applies them before it dispatches |
| `metadata` | not part of the spec; it stays in the input (history) and the CLI's memo |

The sandbox's serde ignores unknown fields; this model refuses them (a misspelt `long_runing`
would otherwise run a daemon-like agent as a one-shot command): the product fails closed.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from workflows.limits import MAX_GOAL_CHARS
from workflows.mission.spec import ChildSpec, MissionSpec, SpecId, Text

ORCHESTRATOR_ID = "aiwg-executor-v1"
CHILD_ID = "objective"
ISOLATION_PREFIX = "isolation:"
ISOLATION_RUNTIMES = {"isolation:vm": "vm", "isolation:container": "container", "isolation:host": "host"}


class _Payload(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ExecutorFilter(_Payload):
    executor_id: str | None = None
    capabilities: list[str] = Field(default_factory=list)
    agent_id: SpecId | None = None


class ExecutorDispatch(_Payload):
    """The body of `POST /api/v1/sessions/:id/dispatch` (executor.v1)."""

    mission_id: SpecId
    objective: Text = Field(min_length=1)
    completion: Text = ""
    long_running: bool = False
    executor_filter: ExecutorFilter | None = None
    metadata: Any = None

    def to_spec(self, *, host_group: str = "default") -> MissionSpec:
        """The one-child mission this dispatch asks for (ValueError/ValidationError if it cannot be one)."""
        wanted = self.executor_filter or ExecutorFilter()
        isolation = sorted({cap for cap in wanted.capabilities if cap.startswith(ISOLATION_PREFIX)})
        if len(isolation) > 1:
            raise ValueError(f"executor_filter.capabilities asks for {' and '.join(isolation)}: a child runs under one isolation")
        if isolation and isolation[0] not in ISOLATION_RUNTIMES:
            raise ValueError(f"executor_filter.capabilities: {isolation[0]} is not one of {', '.join(ISOLATION_RUNTIMES)}")
        goal = (self.completion or self.objective).strip() or self.objective
        if len(goal) > MAX_GOAL_CHARS:
            goal = goal[: MAX_GOAL_CHARS - 3] + "..."
        child: dict[str, Any] = {
            "child_id": CHILD_ID,
            "kind": "persistent-agent" if self.long_running else "one-shot-command",
            "prompt": self.objective,
        }
        if wanted.agent_id is not None:
            child["target_id"] = wanted.agent_id
        if isolation:
            child["runtime_kind"] = ISOLATION_RUNTIMES[isolation[0]]
        return MissionSpec(
            mission_id=self.mission_id,
            orchestrator_id=ORCHESTRATOR_ID,
            goal=goal,
            host_group=host_group,
            children=[ChildSpec.model_validate(child)],
        )


def is_dispatch(document: object) -> bool:
    """Whether a JSON document is an executor.v1 dispatch rather than a MissionSpec or a MissionInput."""
    return isinstance(document, dict) and "objective" in document and "children" not in document and "spec" not in document
