"""The spec is documented where a newcomer looks: `conductor mission schema` prints the JSON Schema
of MissionSpec, and every example in docs/mission-spec.md is a spec the model accepts (and the
schema too), with one per aggregation mode and one per workload kind, and every field explained."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from tests.support.cli_support import conductor_now
from workflows.mission.executor_v1 import ExecutorDispatch, is_dispatch
from workflows.mission.spec import ChildSpec, MissionSpec

DOC = Path(__file__).resolve().parents[2] / "docs" / "mission-spec.md"
AGGREGATION_MODES = {"all-pass", "quorum", "best-output", "fail-fast", "manual-review"}
KINDS = {"one-shot-command", "daemon", "persistent-agent", "scheduled-collector"}


def examples() -> list[dict]:
    blocks = re.findall(r"```json\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.DOTALL)
    assert blocks, f"no ```json blocks in {DOC}"
    return [json.loads(block) for block in blocks]


def test_schema_is_the_models_and_accepts_what_the_model_accepts(capsys):
    result = conductor_now(capsys, "mission", "schema")
    assert result.code == 0 and result.err == ""
    schema = result.json
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["title"] == "MissionSpec" and set(schema["required"]) == {"mission_id", "orchestrator_id", "goal", "children"}
    bundled = json.loads((Path(__file__).resolve().parents[2] / "worker" / "examples" / "mission.json").read_text())
    jsonschema.validate(bundled, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**bundled, "mission_idd": "typo"}, schema)  # unknown fields are refused, as by the model


def spec_of(example: dict) -> MissionSpec:
    """A spec example as the model reads it; an executor.v1 dispatch as the one-child mission it is."""
    return ExecutorDispatch.model_validate(example).to_spec() if is_dispatch(example) else MissionSpec.model_validate(example)


@pytest.mark.parametrize("index", range(len(examples())))
def test_every_example_in_the_doc_is_a_valid_spec(index, capsys):
    example = examples()[index]
    spec = spec_of(example)
    schema = "executor-v1-dispatch" if is_dispatch(example) else "mission-spec"
    jsonschema.validate(example, conductor_now(capsys, "mission", "schema", schema).json)
    assert spec.mission_id == example["mission_id"]


def test_the_doc_has_an_example_per_aggregation_mode_and_kind_and_explains_every_field():
    specs = [spec_of(example) for example in examples()]
    assert {spec.aggregation.mode for spec in specs} >= AGGREGATION_MODES
    assert {child.kind for spec in specs for child in spec.children} >= KINDS
    # Each mode and kind also has an example of its own (a spec of one mode, a child of one kind).
    explicit_modes = {example["aggregation"]["mode"] for example in examples() if "aggregation" in example}
    assert explicit_modes >= AGGREGATION_MODES
    text = DOC.read_text(encoding="utf-8")
    for field in [*MissionSpec.model_fields, *ChildSpec.model_fields]:
        assert f"| `{field}` |" in text, f"docs/mission-spec.md does not explain {field}"


@pytest.mark.parametrize("command", ["run", "start"])
def test_run_and_start_help_point_to_the_schema_and_the_doc(command, capsys):
    with pytest.raises(SystemExit) as exited:
        conductor_now(capsys, "mission", command, "--help")
    assert exited.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "conductor mission schema" in out and "docs/mission-spec.md" in out and "--create-host-group" in out


@pytest.mark.parametrize("kind", sorted(KINDS - {"one-shot-command"}))
def test_only_a_one_shot_command_takes_a_verifier(kind: str) -> None:
    """A verifier checks a finished run. The real server keeps projecting a long-lived kind's record
    from its task (fleet.rs `project_task_observation`), which would overwrite the verifier's
    evidence, so the spec refuses it with the fix named."""
    extra = {"schedule": "*/5 * * * *"} if kind == "scheduled-collector" else {}
    child = {"child_id": "c", "kind": kind, "prompt": "true", "verifier": "true", **extra}
    with pytest.raises(ValueError, match=f"only a one-shot-command takes a `verifier`.*a {kind} never finishes"):
        MissionSpec.model_validate({"mission_id": "m", "orchestrator_id": "o", "goal": "g", "children": [child]})
    one_shot = {"child_id": "c", "kind": "one-shot-command", "prompt": "true", "verifier": "true"}
    assert MissionSpec.model_validate({"mission_id": "m", "orchestrator_id": "o", "goal": "g", "children": [one_shot]})
