"""The published interface of every workflow, as JSON Schemas: what a client in any language sends
and gets back (docs/mission-control-api.md says which message each one is).

The schemas are generated from the pydantic models the workflows validate with
(`workflows.inbound`), and shipped beside this module as files, so that an installed wheel can
hand them to other tools (`conductor mission schema NAME`) and a change to a model shows up as a
change to a published file in review. `python -m worker.schemas` writes them again;
tests/test_schemas.py fails when a file and its model disagree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, TypeAdapter

from workflows.admission.holders import HolderDecisionQuery, HolderInput, HolderSubmit
from workflows.admission.messages import (
    AdmissionDecision,
    AdmissionWorkflowInput,
    CancelBatch,
    DecisionBatch,
    LeaseRow,
    PolicyChange,
    QueueRow,
    ReleaseBatch,
    RenewBatch,
    UsageRow,
    WhatIf,
)
from workflows.admission.model import AdmissionPolicy, AdmissionRequest, AuditEvent
from workflows.inbound import Refusal
from workflows.mission.executor_v1 import ExecutorDispatch
from workflows.mission.ledger import MissionLedger
from workflows.mission.messages import MissionInput, ReviewRequest
from workflows.mission.questions import AnswerRequest, AnswerResult
from workflows.mission.spec import MissionSpec

PACKAGE = Path(__file__).parent
DIALECT = "https://json-schema.org/draft/2020-12/schema"
# Fields a run hands to its next one at continue-as-new: not part of any client's interface.
INTERNAL_FIELDS = ("carried",)


@dataclass(frozen=True)
class Schema:
    name: str
    title: str
    used_as: str
    rule: Any  # a model or a type

    @property
    def file(self) -> Path:
        return PACKAGE / f"{self.name}.schema.json"

    def generate(self) -> dict[str, Any]:
        rule = self.rule
        body = rule.model_json_schema() if isinstance(rule, type) and issubclass(rule, BaseModel) else TypeAdapter(rule).json_schema()
        for field in INTERNAL_FIELDS:
            body.get("properties", {}).pop(field, None)
        _drop_unreferenced(body)
        return {"$schema": DIALECT, "$id": f"urn:mission-conductor:{self.name}", "title": self.title,
                "description": self.used_as, **{k: v for k, v in body.items() if k not in ("title", "description")}}

    def text(self) -> str:
        return json.dumps(self.generate(), indent=2, ensure_ascii=False) + "\n"


SCHEMAS: tuple[Schema, ...] = (
    # MissionWorkflow
    Schema("mission-input", "MissionWorkflow input",
           "MissionWorkflow's one argument: {\"spec\": MissionSpec} and optional tuning (or an executor.v1 dispatch: "
           "executor-v1-dispatch); a run whose input does not validate fails at once with an ApplicationError of type "
           "InvalidInput.", MissionInput),
    Schema("executor-v1-dispatch", "AIWG executor.v1 dispatch",
           "The other form MissionWorkflow's input takes: an AIWG executor.v1 dispatch payload, run as a one-child "
           "mission (docs/mission-spec.md, \"AIWG executor.v1 dispatches\").", ExecutorDispatch),
    Schema("mission-spec", "MissionSpec", "The `spec` of MissionWorkflow's input (docs/mission-spec.md).", MissionSpec),
    Schema("mission-ledger", "MissionLedger",
           "MissionWorkflow's result, and the answer of its `ledger` query and its `review` and `wait_for_verdict` "
           "updates.", MissionLedger),
    Schema("review-request", "ReviewRequest", "The one argument of MissionWorkflow's `review` update.", ReviewRequest),
    Schema("answer-request", "AnswerRequest",
           "The one argument of MissionWorkflow's `answer_child` update: an operator's answer to a child's open "
           "question.", AnswerRequest),
    Schema("answer-result", "AnswerResult", "The result of MissionWorkflow's `answer_child` update.", AnswerResult),
    # AdmissionWorkflow, its operator surface
    Schema("admission-input", "AdmissionWorkflow input",
           "AdmissionWorkflow's one argument: the host group and its policy.", AdmissionWorkflowInput),
    Schema("admission-policy", "AdmissionPolicy",
           "A host group's policy: the `policy` query's answer, and what the `set_policy` signal sets.", AdmissionPolicy),
    Schema("policy-change", "PolicyChange", "The one argument of AdmissionWorkflow's `set_policy` signal.", PolicyChange),
    Schema("admission-request", "AdmissionRequest", "The one argument of AdmissionWorkflow's `what_if` query.", AdmissionRequest),
    Schema("what-if", "WhatIf", "The answer of AdmissionWorkflow's `what_if` query.", WhatIf),
    Schema("queue-rows", "Queue rows", "The answer of AdmissionWorkflow's `queue` query (argument: an optional limit).", list[QueueRow]),
    Schema("lease-rows", "Lease rows", "The answer of AdmissionWorkflow's `leases` query.", list[LeaseRow]),
    Schema("usage-rows", "Usage rows", "The answer of AdmissionWorkflow's `usage` query.", list[UsageRow]),
    Schema("audit-events", "Audit events", "The answer of AdmissionWorkflow's `audit` query (argument: an optional limit).", list[AuditEvent]),
    # Holders that are not workflows (docs/admission-api.md): their AdmissionHolder workflow and the
    # singleton's signals they send
    Schema("holder-input", "AdmissionHolder input",
           "AdmissionHolder's one argument: the host group, the holder's name and its request.", HolderInput),
    Schema("holder-submit", "HolderSubmit",
           "The one argument of AdmissionWorkflow's `hold` signal: a holder's request under its holder workflow.", HolderSubmit),
    Schema("holder-decision-query", "HolderDecisionQuery",
           "The one argument of AdmissionWorkflow's `holder_decision` query.", HolderDecisionQuery),
    Schema("renew-batch", "RenewBatch",
           "The one argument of AdmissionWorkflow's `renew` signal (a holder sends {requester, everything: true}).", RenewBatch),
    Schema("release-batch", "ReleaseBatch", "The one argument of AdmissionWorkflow's `release` signal.", ReleaseBatch),
    Schema("cancel-batch", "CancelBatch", "The one argument of AdmissionWorkflow's `cancel` signal.", CancelBatch),
    Schema("decision-batch", "DecisionBatch",
           "The one argument of the `admission_decided` signal the singleton sends each requester.", DecisionBatch),
    Schema("admission-decision", "AdmissionDecision",
           "Where a request stands (state, revision, lease, queue position): AdmissionHolder's `decision` query and result.",
           AdmissionDecision),
    Schema("refusals", "Refusals", "The answer of AdmissionWorkflow's `refusals` query: signals it did not act on, and why.", list[Refusal]),
)

def _drop_unreferenced(body: dict[str, Any]) -> None:
    """Leave out the definitions only the internal fields used."""
    defs = body.get("$defs", {})
    kept: set[str] = set()
    pending = [{k: v for k, v in body.items() if k != "$defs"}]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/") and ref[8:] not in kept:
                kept.add(ref[8:])
                pending.append(defs[ref[8:]])
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    if defs:
        body["$defs"] = {name: schema for name, schema in defs.items() if name in kept}


BY_NAME = {schema.name: schema for schema in SCHEMAS}


def shipped(name: str) -> str:
    """The published schema `name`, as shipped (KeyError for a name that is not one)."""
    return BY_NAME[name].file.read_text(encoding="utf-8")


def write_all() -> list[Path]:
    for schema in SCHEMAS:
        schema.file.write_text(schema.text(), encoding="utf-8")
    return [schema.file for schema in SCHEMAS]
