"""The workflows' front door, without a server: what the worker's converter hands a workflow for any
payload (worker/payloads.py), how `workflows.inbound` reads it, the published schemas, and the
executor.v1 profile (workflows/mission/executor_v1.py)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter
from temporalio.api.common.v1 import Payload

from tests.support.cli_support import conductor_now
from worker import schemas
import worker.examples
from worker.mission_control import MissionSpecError, parse_spec
from worker.payloads import DATA_CONVERTER
from workflows import inbound
from workflows.failures import INVALID_INPUT, refused_start
from workflows.json_input import Unreadable
from workflows.limits import MAX_GOAL_CHARS
from workflows.mission import aggregation
from workflows.mission.executor_v1 import ExecutorDispatch
from workflows.mission.messages import MissionInput, ReviewRequest, read_mission_input
from workflows.mission.spec import MissionSpec

CONVERTER = DATA_CONVERTER.payload_converter


def _received(data: bytes, encoding: bytes = b"json/plain") -> object:
    """What a workflow entry point (no type hints) receives for one payload."""
    [value] = CONVERTER.from_payloads([Payload(metadata={"encoding": encoding}, data=data)], None)
    return value


def _spec(**fields: object) -> dict:
    return {"mission_id": "m", "orchestrator_id": "o", "goal": "g",
            "children": [{"child_id": "c", "kind": "one-shot-command", "prompt": "true"}], **fields}


# --- the converter -------------------------------------------------------------------------------


def test_json_arrives_as_data_and_what_the_cli_refuses_arrives_unread():
    assert _received(b'{"a": [1, 2.5, null, true]}') == {"a": [1, 2.5, None, True]}
    assert _received(b"", b"binary/null") is None
    assert _received(b"raw", b"binary/plain") == b"raw"
    for refused in (b'{"a": 1, "a": 2}', b"[" * 100 + b"]" * 100, b'{"n": 1234567890123456789012}', b"NaN", b"{", b"\xff"):
        assert isinstance(_received(refused), Unreadable), refused
    assert isinstance(_received(b"x", b"made/up"), Unreadable)


def test_typed_payloads_decode_as_pydantic_decodes_them():
    review = ReviewRequest(operator="ops", decision="approve", reason="ok")
    payloads = CONVERTER.to_payloads([review])
    assert CONVERTER.from_payloads(payloads, [ReviewRequest]) == [review]


# --- reading an argument -------------------------------------------------------------------------


@pytest.mark.parametrize("args, words", [
    ((), "takes exactly one argument, a JSON value; 0 were sent"),
    (({}, {}), "2 were sent"),
    (([],), "must be a JSON object, not an array"),
    ((b"x",), "raw bytes (payload encoding binary/plain)"),
    ((_received(b'{"a": 1, "a": 2}'),), 'the key "a" appears twice'),
    ((_received(b"", b"made/up"),), "a payload encoded as 'made/up'; send JSON"),
    (({"operator": "ops", "decision": "maybe", "reason": "r", "when": 1},),
     "decision: Input should be 'approve' or 'reject'; when: Extra inputs are not permitted"),
])
def test_a_bad_argument_is_refused_in_one_line_that_says_what_and_where(args, words):
    with pytest.raises(inbound.Refused) as refused:
        inbound.argument(args, ReviewRequest, "the review", hint="see the schema")
    message = str(refused.value)
    assert message.startswith("the review ") and words in message and message.endswith("; see the schema"), message
    assert "\n" not in message


def test_handlers_without_an_argument_refuse_one_and_optional_ones_take_their_default():
    inbound.no_argument((), "the stop signal")
    with pytest.raises(inbound.Refused, match="takes no argument; 1 were sent"):
        inbound.no_argument(({},), "the stop signal")
    limit = TypeAdapter(int)
    assert inbound.optional_argument((), limit, 50, "the limit") == 50
    assert inbound.optional_argument((7,), limit, 50, "the limit") == 7


def test_a_refused_start_is_a_typed_non_retryable_failure():
    failure = refused_start(inbound.Refused("MissionWorkflow's input is not valid: x"), "MissionWorkflow")
    assert failure.type == INVALID_INPUT and failure.non_retryable
    assert failure.message == "MissionWorkflow refused its input: MissionWorkflow's input is not valid: x"


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200), st.sampled_from([b"json/plain", b"binary/plain", b"binary/null", b"other"]))
def test_no_payload_of_any_bytes_escapes_as_anything_but_a_mission_input_or_a_refusal(data, encoding):
    try:
        value = _received(data, encoding)
    except Exception as error:  # the converter itself must never raise for an untyped payload
        pytest.fail(f"{encoding!r} {data!r}: {error!r}")
    with pytest.raises(inbound.Refused):
        read_mission_input((value,))


# --- the mission's input, executor.v1 included ------------------------------------------------------


def test_the_mission_input_names_each_wrong_field():
    with pytest.raises(inbound.Refused) as refused:
        read_mission_input(({"spec": _spec(aggregation={"mode": "quorum", "quorum": 2})},))
    assert "spec.aggregation.quorum.minimum_successes: Field required" in str(refused.value)
    assert read_mission_input(({"spec": _spec()},)).spec.mission_id == "m"


DISPATCH = {  # Agentic Sandbox docs/aiwg-executor.md at e901dc2, "Request body"
    "mission_id": "0196b1f0-7c1e-7a51-9d3e-2b8f1c4d5e6f",
    "objective": "echo done",
    "completion": "prints done",
    "long_running": False,
    "executor_filter": {"executor_id": None, "capabilities": [], "agent_id": "agent-01"},
    "metadata": {"issue": 1234, "session_id": "s"},
}


def test_an_executor_v1_dispatch_is_a_mission_of_one_child():
    spec = read_mission_input((DISPATCH,)).spec
    assert spec.mission_id == DISPATCH["mission_id"] and spec.orchestrator_id == "aiwg-executor-v1"
    assert spec.goal == "prints done" and spec.aggregation.mode == "all-pass"
    [child] = spec.children
    assert (child.child_id, child.kind, child.prompt, child.target_id) == ("objective", "one-shot-command", "echo done", "agent-01")
    assert parse_spec(DISPATCH) == spec  # the CLI reads the same file the same way


@pytest.mark.parametrize("changes, expected", [
    ({"long_running": True}, ("persistent-agent", "host")),
    ({"executor_filter": {"capabilities": ["isolation:vm", "runtime:claude-code"]}}, ("one-shot-command", "vm")),
    ({"executor_filter": {"capabilities": ["isolation:container"]}, "long_running": True}, ("persistent-agent", "container")),
])
def test_long_running_and_isolation_choose_the_kind_and_runtime(changes, expected):
    [child] = ExecutorDispatch.model_validate({**DISPATCH, **changes}).to_spec().children
    assert (child.kind, child.runtime_kind) == expected


@pytest.mark.parametrize("changes, words", [
    ({"long_runing": True}, "long_runing: Extra inputs are not permitted"),
    ({"objective": ""}, "objective: String should have at least 1 character"),
    ({"executor_filter": {"capabilities": ["isolation:vm", "isolation:host"]}}, "isolation:host and isolation:vm"),
    ({"executor_filter": {"capabilities": ["isolation:moon"]}}, "isolation:moon is not one of"),
])
def test_a_dispatch_that_makes_no_mission_is_refused_in_words(changes, words):
    with pytest.raises(inbound.Refused) as refused:
        read_mission_input(({**DISPATCH, **changes},))
    assert words in str(refused.value), refused.value
    with pytest.raises(MissionSpecError) as cli:
        parse_spec({**DISPATCH, **changes})
    assert words in str(cli.value)


def test_a_long_completion_text_is_cut_to_the_goal_limit():
    spec = ExecutorDispatch.model_validate({**DISPATCH, "completion": "y" * 5000}).to_spec()
    assert len(spec.goal) == MAX_GOAL_CHARS and spec.goal.endswith("...")


# --- the published schemas -------------------------------------------------------------------------


def test_every_shipped_schema_is_the_one_its_model_generates():
    for schema in schemas.SCHEMAS:
        assert schema.file.read_text(encoding="utf-8") == schema.text(), (
            f"{schema.file.name} is out of date: run `python -m worker.schemas`"
        )


def test_the_schemas_accept_what_the_workflows_accept():
    spec = json.loads((Path(worker.examples.__file__).parent / "mission.json").read_text())
    validate = lambda name, value: jsonschema.validate(value, json.loads(schemas.shipped(name)))  # noqa: E731
    validate("mission-input", {"spec": spec})
    validate("mission-spec", spec)
    validate("executor-v1-dispatch", DISPATCH)
    validate("review-request", {"operator": "ops", "decision": "approve", "reason": "ok"})
    parsed = MissionSpec.model_validate(spec)
    validate("mission-ledger", aggregation.initial_ledger(parsed).model_dump(mode="json"))
    with pytest.raises(jsonschema.ValidationError):
        validate("mission-input", {"spec": {**spec, "aggregation": {"mode": "quorum", "quorum": 2}}})
    assert "carried" not in json.loads(schemas.shipped("mission-input"))["properties"]
    assert MissionInput.model_validate({"spec": spec}).carried is None


def test_conductor_mission_schema_prints_any_published_schema(capsys):
    listed = conductor_now(capsys, "mission", "schema", "--list")
    assert listed.code == 0 and [line.split()[0] for line in listed.out.splitlines()] == [s.name for s in schemas.SCHEMAS]
    for name in ("mission-spec", "review-request", "policy-change"):
        shown = conductor_now(capsys, "mission", "schema", *([name] if name != "mission-spec" else []))
        assert shown.code == 0 and shown.out == schemas.shipped(name)
    with pytest.raises(SystemExit) as usage:
        conductor_now(capsys, "mission", "schema", "nope")
    assert usage.value.code == 2 and "invalid choice: 'nope'" in capsys.readouterr().err
