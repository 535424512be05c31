"""The CLI's front door (worker.inputs) and the limits of the models behind it, as a hostile operator meets them.

Every command that reads input refuses bad input with one line on stderr (`conductor: ...`,
saying what is wrong and how to fix it) and exit code 2, before anything is sent, whatever the
input: bytes, depth, size. The numbered tests are the failures a hostile-operator test found;
the property tests at the end throw generated garbage at every surface that reads input.

No server runs here: TEMPORAL_ADDRESS points at a closed port, so a command that got past the
door fails to connect (exit 1, one line) within milliseconds, which tells it apart from a refusal.
"""

from __future__ import annotations

import codecs
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tests.support.cli_support import Result, conductor_now, without_profiles
from worker.mission_control import MissionSpecError, parse_spec
from worker.ports import free_port
from workflows.admission.messages import PolicyChange
from workflows.admission.model import AdmissionPolicy, AdmissionRequest
from workflows.ids import (
    MAX_ATTEMPT_NUMBER,
    admission_request_id,
    dispatch_id,
    fleet_child_id,
    idempotency_key,
    mission_workflow_id,
    workload_workflow_id,
)
from workflows.limits import (
    KIB,
    MAX_GOAL_CHARS,
    MAX_ID_CHARS,
    MAX_JSON_DEPTH,
    MAX_JSON_INTEGER_DIGITS,
    MAX_OPERATOR_CHARS,
    MAX_PROMPT_CHARS,
    MAX_SPEC_JSON_BYTES,
    MAX_WORKFLOW_ID_CHARS,
)
from workflows.mission.messages import ReviewRequest
from workflows.mission.spec import MissionSpec
from workflows.workload.messages import WorkloadInput
from workflows.workload.record import build_dispatch, build_record

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
ADMISSION_HOST_GROUP_COMMANDS = [
    ["queue"], ["leases"], ["usage"], ["audit"], ["what-if", "REQUEST"], ["policy", "show"], ["policy", "set", "POLICY"],
]


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No Temporal here: whatever gets past the door fails to connect, fast, with exit 1."""
    without_profiles(monkeypatch, tmp_path, "CONDUCTOR_ADMISSION_POLICY")
    monkeypatch.setenv("TEMPORAL_ADDRESS", f"127.0.0.1:{free_port('127.0.0.1')}")
    monkeypatch.setenv("CONDUCTOR_RECONNECT_SECONDS", "0")
    monkeypatch.setenv("USER", "ops-alice")


def assert_refused(result: Result, *words: str) -> None:
    """Exit 2, nothing on stdout, exactly one `conductor: ` line on stderr naming the problem."""
    assert result.code == 2, result
    assert result.out == ""
    assert result.err.startswith("conductor: ") and result.err.count("\n") == 1 and result.err.endswith("\n"), result.err
    assert "Traceback" not in result.err
    for word in words:
        assert word in result.err, (word, result.err)


def spec(child: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    return {
        "mission_id": "m-1", "orchestrator_id": "orch-1", "goal": "check the door",
        "children": [{"child_id": "only", "kind": "one-shot-command", "prompt": "echo hi", **(child or {})}],
        **fields,
    }


def write(path: Path, content: bytes | str | dict | list) -> Path:
    if isinstance(content, (dict, list)):
        content = json.dumps(content)
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


POLICY = {"max_concurrent": 1}
REQUEST = {"request_id": "r-1", "environment": "prod", "provider": "local", "runtime_kind": "host", "priority": 0}


# --- 2. a spec file that is not UTF-8 ---------------------------------------------------------


@pytest.mark.parametrize("command", ["run", "start"])
def test_2_a_spec_that_is_not_utf8_is_refused_with_the_byte_offset(offline, capsys, tmp_path, command):
    path = write(tmp_path / "spec.json", b'{"mission_id": "m\xff1"}')
    assert_refused(conductor_now(capsys, "mission", command, str(path)),
                   f"mission spec {path} is not UTF-8", "byte 0xff at offset 17", "save it as UTF-8")


def test_2_a_utf16_spec_is_told_apart_and_a_utf8_bom_is_accepted(offline, capsys, tmp_path):
    utf16 = write(tmp_path / "utf16.json", codecs.BOM_UTF16_LE + json.dumps(spec()).encode("utf-16-le"))
    assert_refused(conductor_now(capsys, "mission", "run", str(utf16)), "UTF-16 byte-order mark")
    with_bom = write(tmp_path / "bom.json", codecs.BOM_UTF8 + json.dumps(spec()).encode())
    passed = conductor_now(capsys, "mission", "run", str(with_bom))
    assert passed.code == 1 and "cannot reach Temporal" in passed.err  # past the door, at the connection


# --- 3. deep nesting ---------------------------------------------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000


def refusing_commands(tmp_path: Path, content: bytes | str) -> list[list[str]]:
    """Every command that reads a JSON document, reading `content`."""
    bad = write(tmp_path / "bad.json", content)
    trace = write(tmp_path / "trace.jsonl", "")
    return [
        ["mission", "run", str(bad)],
        ["mission", "start", str(bad)],
        ["admission", "policy", "set", "--host-group", "hg", str(bad)],
        ["admission", "what-if", "--host-group", "hg", str(bad)],
        ["admission", "simulate", "--policy", str(bad), str(trace)],
    ]


def test_3_deep_nesting_is_refused_by_every_command_that_reads_json(offline, capsys, tmp_path):
    for argv in refusing_commands(tmp_path, DEEP):
        assert_refused(conductor_now(capsys, *argv), f"nested more than {MAX_JSON_DEPTH} levels")
    just_deep_enough = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    for argv in refusing_commands(tmp_path, just_deep_enough):  # parsed; refused for its content
        result = conductor_now(capsys, *argv)
        assert result.code == 2 and "nested" not in result.err and result.err.count("\n") == 1, result


def test_3_contract_validate_reports_deep_nesting_as_its_one_line_per_file(offline, capsys, tmp_path):
    deep = write(tmp_path / "deep.json", '{"document_type": "workload", "spec": ' + DEEP + "}")
    not_utf8 = write(tmp_path / "latin1.json", b'{"document_type": "w\xe9"}')
    result = conductor_now(capsys, "contract", "validate", str(deep), str(not_utf8))
    assert (result.code, result.err) == (1, "")
    assert result.out.splitlines() == [
        f"{deep}: $: not usable JSON: arrays and objects are nested more than {MAX_JSON_DEPTH} levels deep; no input here needs "
        "more than a few levels",
        f"{not_utf8}: $: not valid JSON: not UTF-8 text: byte 0xe9 at offset 20 (line 1): invalid continuation byte; "
        "save it as UTF-8",
    ]


def test_3_a_deep_trace_line_is_an_error_line_and_the_run_goes_on(offline, capsys, tmp_path):
    policy = write(tmp_path / "policy.json", POLICY)
    trace = write(tmp_path / "trace.jsonl", DEEP + "\n" + json.dumps({"at": "2026-01-01T00:00:00Z", "op": "snapshot"}) + "\n")
    result = conductor_now(capsys, "admission", "simulate", "--policy", str(policy), str(trace))
    assert (result.code, result.err) == (0, "")
    first, second = [json.loads(line) for line in result.out.splitlines()]
    assert first["ok"] is False and first["error"]["code"] == "invalid-line"
    assert first["error"]["message"].startswith(f"line 1: not usable JSON: arrays and objects are nested more than {MAX_JSON_DEPTH}")
    assert second["op"] == "snapshot" and second["ok"] is True


# --- 4. integers beyond Python's digit limit ---------------------------------------------------

HUGE = "1" * 5000


def test_4_an_integer_of_5000_digits_is_refused_by_every_command_that_reads_json(offline, capsys, tmp_path):
    for argv in refusing_commands(tmp_path, '{"max_concurrent": ' + HUGE + "}"):
        assert_refused(conductor_now(capsys, *argv), "an integer of 5000 digits",
                       f"at most {MAX_JSON_INTEGER_DIGITS} digits")
    doc = write(tmp_path / "doc.json", '{"document_type": "workload", "revision": ' + HUGE + "}")
    result = conductor_now(capsys, "contract", "validate", str(doc))
    assert (result.code, result.err) == (1, "")
    assert result.out.splitlines() == [f"{doc}: $: not usable JSON: an integer of 5000 digits (111111111111...); "
                                       f"numbers here have at most {MAX_JSON_INTEGER_DIGITS} digits (64 bits)"]


def test_4_a_huge_integer_in_a_trace_line_is_an_error_line(offline, capsys, tmp_path):
    policy = write(tmp_path / "policy.json", POLICY)
    trace = write(tmp_path / "trace.jsonl", '{"at": "2026-01-01T00:00:00Z", "op": "renew", "request_id": "a", '
                                            '"lease_revision": ' + HUGE + "}\n")
    result = conductor_now(capsys, "admission", "simulate", "--policy", str(policy), str(trace))
    assert result.code == 0
    [line] = [json.loads(line) for line in result.out.splitlines()]
    assert "an integer of 5000 digits" in line["error"]["message"]


def test_4_numbers_json_has_no_words_for_are_refused(offline, capsys, tmp_path):
    for text, says in (('{"max_concurrent": NaN}', "NaN is not a JSON value"),
                       ('{"max_concurrent": 1e999}', "too large for a 64-bit float")):
        for argv in refusing_commands(tmp_path, text):
            assert_refused(conductor_now(capsys, *argv), says)


def test_4_the_policy_file_the_environment_names_goes_through_the_same_door(offline, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("CONDUCTOR_ADMISSION_POLICY", str(write(tmp_path / "env-policy.json", DEEP)))
    policy = write(tmp_path / "policy.json", POLICY)
    assert_refused(conductor_now(capsys, "admission", "policy", "set", "--host-group", "hg", str(policy)),
                   "admission policy (CONDUCTOR_ADMISSION_POLICY)", f"nested more than {MAX_JSON_DEPTH} levels")
    monkeypatch.setenv("CONDUCTOR_ADMISSION_POLICY", str(write(tmp_path / "env-policy.json", {"max_concurrent": -1})))
    assert_refused(conductor_now(capsys, "admission", "policy", "set", "--host-group", "hg", str(policy)),
                   "invalid admission policy", "max_concurrent: Input should be greater than or equal to 0")


# --- 5. ids derived from spec ids --------------------------------------------------------------


def test_5_a_spec_whose_derived_ids_would_not_fit_is_refused_at_the_door(offline, capsys, tmp_path):
    path = write(tmp_path / "spec.json", spec(child={"child_id": "c" * 56}, mission_id="m" * 200))
    assert_refused(conductor_now(capsys, "mission", "run", str(path)), f"invalid mission spec {path}:",
                   "children[0].child_id", f"mission_id and child_id ({MAX_ID_CHARS} characters together)",
                   "dispatch id <mission_id>:<child_id>:attempt-999:dispatch", "at most 234 characters together")


@pytest.mark.parametrize("mission_length", [1, 120, 233])
def test_5_every_id_derived_from_an_accepted_spec_passes_where_it_is_used_later(mission_length):
    mission_id = "m" * mission_length
    # The longest ids are those of the last attempt a child may run (workflows.ids).
    longest = parse_spec(spec(child={"child_id": "c" * (234 - mission_length)}, mission_id=mission_id))
    child = longest.children[0]
    # The admission request, the fleet record (whole: lineage, dispatch id, idempotency key), the
    # task's start message and the workload's own input: each validates them with its own rules.
    AdmissionRequest(request_id=admission_request_id(mission_id, child.child_id), orchestrator_id="o",
                     environment="e", provider="p", runtime_kind="host", priority=0, submitted_at=NOW,
                     queue_timeout_seconds=60)
    workload = WorkloadInput(mission_id=mission_id, orchestrator_id=longest.orchestrator_id, child=child,
                             target_id="t", executor_id="e")
    record = build_record(workload, NOW)
    assert record.lineage.dispatch_id == dispatch_id(mission_id, child.child_id)
    assert record.lineage.child_id == fleet_child_id(mission_id, child.child_id)
    assert record.lineage.idempotency_key == idempotency_key(mission_id, child.child_id)
    assert build_dispatch(workload).message_id == dispatch_id(mission_id, child.child_id)
    assert len(workload_workflow_id(mission_id, child.child_id)) <= MAX_WORKFLOW_ID_CHARS
    assert len(mission_workflow_id(mission_id)) <= MAX_WORKFLOW_ID_CHARS
    last = WorkloadInput(mission_id=mission_id, orchestrator_id=longest.orchestrator_id, child=child,
                         target_id="t", executor_id="e", attempt=MAX_ATTEMPT_NUMBER)
    record = build_record(last, NOW)
    assert record.lineage.dispatch_id == dispatch_id(mission_id, child.child_id, MAX_ATTEMPT_NUMBER)
    assert build_dispatch(last).message_id == record.lineage.dispatch_id
    AdmissionRequest(request_id=admission_request_id(mission_id, child.child_id, MAX_ATTEMPT_NUMBER),
                     orchestrator_id="o", environment="e", provider="p", runtime_kind="host", priority=0,
                     submitted_at=NOW, queue_timeout_seconds=60)
    # One character more, and the spec itself is refused (MissionControl refuses the same).
    with pytest.raises(MissionSpecError, match="at most 234 characters together"):
        parse_spec(spec(child={"child_id": "c" * (235 - mission_length)}, mission_id=mission_id))


@pytest.mark.parametrize(("field", "value", "says"), [
    ("mission_id", "a\x1cb", "must not contain whitespace"),  # whitespace to the fleet contract, not to a pattern
    ("mission_id", "esc\x1b[31m", "must contain printable characters only"),
    ("orchestrator_id", "nul\x00", "must contain printable characters only"),
    ("host_group", "bad group", "must not contain whitespace"),
])
def test_5_spec_ids_hold_to_the_fleet_contracts_id_rule_and_print_safely(field, value, says):
    with pytest.raises(MissionSpecError) as refused:
        parse_spec(spec(**{field: value}))
    assert f"{field}: {says}" in str(refused.value) and "\n" not in str(refused.value)


def test_5_a_child_target_environment_or_lane_too_long_for_admission_is_refused():
    too_long = "x" * (MAX_ID_CHARS + 1)
    for child, says in ((dict(environment=too_long), f"children[0].environment: String should have at most {MAX_ID_CHARS}"),
                        (dict(lane=too_long), f"children[0].lane: String should have at most {MAX_ID_CHARS}"),
                        (dict(target_id="t y"), "children[0].target_id: must not contain whitespace"),
                        (dict(queue_timeout_seconds=1e15), "children[0].queue_timeout_seconds: Input should be less"),
                        (dict(priority=2**64), "children[0].priority: Input should be less than or equal to")):
        with pytest.raises(MissionSpecError, match=says.replace("[", r"\[").replace("]", r"\]")):
            parse_spec(spec(child=child))


# --- 6. size limits of goal, prompt and the whole spec -----------------------------------------


@pytest.mark.parametrize(("content", "says"), [
    (spec(goal="g" * (MAX_GOAL_CHARS + 1)), f"goal: String should have at most {MAX_GOAL_CHARS} characters"),
    (spec(child={"prompt": "p" * (MAX_PROMPT_CHARS + 1)}), f"children[0].prompt: String should have at most {MAX_PROMPT_CHARS}"),
    (spec(child={"prompt": "echo \x00"}), "children[0].prompt: must not contain a NUL character"),
    ({**spec(), "children": [{"child_id": f"c{i}", "kind": "one-shot-command", "prompt": "p" * 30_000}
                             for i in range(20)]},
     f"a mission spec may take at most {MAX_SPEC_JSON_BYTES} bytes ({MAX_SPEC_JSON_BYTES // KIB} KiB)"),
    (spec(goal="g" * 5_000_000), "is too large: more than 1 MiB; a mission spec may take at most 1 MiB"),
    (spec(child={"prompt": "p" * 3_000_000}), "is too large: more than 1 MiB"),
])
def test_6_goal_prompt_and_spec_sizes_are_limited(offline, capsys, tmp_path, content, says):
    path = write(tmp_path / "spec.json", content)
    assert_refused(conductor_now(capsys, "mission", "run", str(path)), says)


def test_6_mission_control_refuses_the_same_sizes():
    for content, field in ((spec(goal="g" * 5_000_000), "goal"), (spec(child={"prompt": "p" * 3_000_000}), "prompt")):
        with pytest.raises(MissionSpecError, match=f"{field}: String should have at most"):
            parse_spec(content)
    with pytest.raises(ValidationError):
        MissionSpec.model_validate(spec(goal="g" * 5_000_000))


def test_6_a_spec_with_many_problems_is_still_one_line(offline, capsys, tmp_path):
    children = [{"child_id": f"c {i}", "kind": "daemon", "prompt": ""} for i in range(40)]
    path = write(tmp_path / "spec.json", {**spec(), "children": children})
    assert_refused(conductor_now(capsys, "mission", "run", str(path)), "; and 70 more")
    path = write(tmp_path / "spec.json", {**spec(), "odd\nkey\u2028": 1})
    assert_refused(conductor_now(capsys, "mission", "run", str(path)), "['odd\\nkey\\u2028']: Extra inputs are not permitted")


# --- 7. --host-group: the rule a mission's host_group follows ----------------------------------


@pytest.mark.parametrize("command", ADMISSION_HOST_GROUP_COMMANDS, ids=lambda c: " ".join(c[:2]).lower())
@pytest.mark.parametrize("group", ["bad group", "tab\there", "sep\x1crow", "esc\x1b[1m", "x" * 257, ""])
def test_7_every_admission_command_refuses_a_host_group_no_mission_can_name(offline, capsys, tmp_path, command, group):
    files = {"REQUEST": str(write(tmp_path / "r.json", REQUEST)), "POLICY": str(write(tmp_path / "p.json", POLICY))}
    argv = ["admission", *[files.get(part, part) for part in command], "--host-group", group]
    assert_refused(conductor_now(capsys, *argv), "--host-group")
    with pytest.raises(MissionSpecError, match="host_group"):
        parse_spec(spec(host_group=group))


@pytest.mark.parametrize("command", ADMISSION_HOST_GROUP_COMMANDS, ids=lambda c: " ".join(c[:2]).lower())
def test_7_a_host_group_a_mission_can_name_gets_past_the_door(offline, capsys, tmp_path, command):
    files = {"REQUEST": str(write(tmp_path / "r.json", REQUEST)), "POLICY": str(write(tmp_path / "p.json", POLICY))}
    parse_spec(spec(host_group="gpu-hosts.eu@1"))
    result = conductor_now(capsys, "admission", *[files.get(part, part) for part in command], "--host-group", "gpu-hosts.eu@1")
    assert result.code == 1 and "cannot reach Temporal" in result.err and result.err.count("\n") == 1, result


# --- 8. --operator -----------------------------------------------------------------------------

HUGE_NAME = "x" * 100_000


@pytest.mark.parametrize(("operator", "says"), [
    (HUGE_NAME, f"at most {MAX_OPERATOR_CHARS} characters"),
    ("Jane Doe", "without spaces or control characters"),
    ("eve\x1b]0;owned\x07", "without spaces or control characters"),
])
def test_8_operator_names_are_limited_in_the_cli(offline, capsys, tmp_path, operator, says):
    policy = write(tmp_path / "policy.json", POLICY)
    for argv in (["mission", "review", "m-1", "--approve", "--operator", operator, "--reason", "looked at it"],
                 ["admission", "policy", "set", "--host-group", "hg", str(policy), "--operator", operator]):
        result = conductor_now(capsys, *argv)
        assert_refused(result, "--operator", says)
        assert len(result.err) < 500  # the 100 KB name is not echoed


def test_8_a_review_reason_the_ledger_cannot_keep_is_refused(offline, capsys):
    result = conductor_now(capsys, "mission", "review", "m-1", "--reject", "--operator", "bob", "--reason", "r" * 2001)
    assert_refused(result, "--reason: String should have at most 2000 characters")


def test_8_the_models_that_carry_an_operator_limit_it_and_keep_what_histories_hold():
    for bad in (HUGE_NAME, "Jane Doe", "", "tab\t"):
        with pytest.raises(ValidationError):
            ReviewRequest(operator=bad, decision="approve", reason="ok")
        with pytest.raises(ValidationError):
            PolicyChange(operator=bad, policy=AdmissionPolicy(**POLICY))
    for recorded in ("recorder", "alice", "ops-alice", "alice@example.com", "x" * MAX_OPERATOR_CHARS):
        assert ReviewRequest(operator=recorded, decision="reject", reason="r").operator == recorded
        assert PolicyChange(operator=recorded, policy=AdmissionPolicy(**POLICY)).operator == recorded


def test_8_mission_id_arguments_follow_the_spec_rule(offline, capsys):
    for command in (["watch"], ["show"], ["stop"], ["cancel"], ["review", "--approve", "--operator", "a", "--reason", "r"]):
        assert_refused(conductor_now(capsys, "mission", command[0], "m 1", *command[1:]), "mission id", "whitespace")
        assert_refused(conductor_now(capsys, "mission", command[0], "m" * (MAX_ID_CHARS + 1), *command[1:]), "mission id",
                       f"at most {MAX_ID_CHARS}")


# --- property tests: generated garbage at every surface ----------------------------------------

JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20), st.sampled_from(["", "-", "\u2028", "\ufeff", "\x00", "a\nb", "\x1b[31m", "é", "😀"]),
)
JSON_VALUES = st.recursive(
    JSON_SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
NASTY_TOKENS = st.sampled_from([
    "[" * 100_000, "[" * 65 + "]" * 65, '{"a":' * 2000 + "1" + "}" * 2000, "1" * 5000, "-" + "9" * 21,
    "1e999", "-1e400", "NaN", "Infinity", '"\\ud800"', '"\\udfff\\ud800"', '{"\\udc00": 1}', '"' + "s" * 200_000 + '"',
    '{"a": 1, "a": 2}', "\x00", '"\\u0000"', "\ufeff{}", '"\u2028"', "{", "]", "", " ", "0" * 30, "1." + "0" * 100,
])


@st.composite
def documents(draw: st.DrawFn, base: dict[str, Any]) -> bytes:
    """Bytes a hostile operator might hand over: random bytes, JSON of any shape, limits' edges,
    encodings' edge cases, and a valid `base` document with one value replaced by any of those."""
    kind = draw(st.sampled_from(["bytes", "json", "token", "mutated", "mutated", "encoded"]))
    if kind == "bytes":
        return draw(st.binary(max_size=64))
    if kind == "json":
        return json.dumps(draw(JSON_VALUES), ensure_ascii=draw(st.booleans())).encode()
    if kind == "token":
        return draw(NASTY_TOKENS).encode("utf-8", "surrogatepass")
    document = json.loads(json.dumps(base))
    target = document
    if "children" in document and draw(st.booleans()):
        target = document["children"][0]
    key = draw(st.sampled_from(sorted(target) + ["surprise"]))
    replacement = draw(st.one_of(JSON_VALUES, NASTY_TOKENS.map(lambda token: ("RAW", token))))
    if isinstance(replacement, tuple):
        target[key] = "__RAW__"
        text = json.dumps(document).replace('"__RAW__"', replacement[1])
    else:
        target[key] = replacement
        text = json.dumps(document, ensure_ascii=draw(st.booleans()))
    if kind == "encoded":
        prefix = draw(st.sampled_from([codecs.BOM_UTF8, codecs.BOM_UTF16_LE, b"\x00", b"\xff", b""]))
        return prefix + text.encode(draw(st.sampled_from(["utf-8", "utf-16-le", "latin-1"])), "replace")
    return text.encode("utf-8", "surrogatepass")


PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def assert_one_line_outcome(result: Result) -> None:
    assert result.code in (0, 1, 2), result
    assert "Traceback" not in result.err
    if result.code != 0 or result.err:
        assert result.err.startswith("conductor: ") and result.err.count("\n") == 1, result.err


@pytest.mark.parametrize("surface", ["mission run", "policy set", "what-if", "simulate --policy"])
@PROPERTY
@given(data=st.data())
def test_property_no_input_makes_a_json_reading_command_raise(offline, capsys, tmp_path, surface, data):
    base = {"mission run": spec(), "policy set": POLICY, "what-if": REQUEST, "simulate --policy": POLICY}[surface]
    path = write(tmp_path / "input.json", data.draw(documents(base)))
    trace = write(tmp_path / "trace.jsonl", json.dumps({"at": "2026-01-01T00:00:00Z", "op": "snapshot"}) + "\n")
    argv = {
        "mission run": ["mission", "run", str(path)],
        "policy set": ["admission", "policy", "set", "--host-group", "hg", str(path)],
        "what-if": ["admission", "what-if", "--host-group", "hg", str(path)],
        "simulate --policy": ["admission", "simulate", "--policy", str(path), str(trace)],
    }[surface]
    assert_one_line_outcome(conductor_now(capsys, *argv))


@PROPERTY
@given(document=documents({"document_type": "workload", "api_version": "agentic-orchestration/v1"}))
def test_property_contract_validate_reports_any_input_as_lines_of_its_file(offline, capsys, tmp_path, document):
    path = write(tmp_path / "doc.json", document)
    result = conductor_now(capsys, "contract", "validate", str(path))
    assert result.code in (0, 1) and result.err == "", result
    lines = result.out.splitlines()
    assert lines and all(line.startswith(f"{path}: ") and line.isprintable() for line in lines), lines
    assert (result.code == 0) == (lines == [f"{path}: ok"])


def deeply_nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


PYTHON_NASTIES = st.one_of(
    JSON_VALUES, st.sampled_from([float("inf"), float("nan"), 10**5000, -(2**64), "\ud800", b"bytes", {1, 2}, 1e300,
                                  "x" * 300, "a\x1cb", "\x00"]),
    st.integers(0, 20_000).map(deeply_nested),
)


@PROPERTY
@given(key=st.sampled_from(sorted(spec()) + sorted(spec()["children"][0]) + ["surprise"]), value=PYTHON_NASTIES)
def test_property_mission_control_refuses_any_spec_value_with_one_line(key, value):
    """MissionControl's entry point: a spec built in Python meets the same limits, and is either
    a MissionSpec or a MissionSpecError whose message is one line."""
    document = spec()
    target = document["children"][0] if key in document["children"][0] else document
    target[key] = value
    try:
        parse_spec(document)
    except MissionSpecError as error:
        assert str(error).isprintable() and error.problems


TRACE_LINES = st.one_of(
    st.binary(max_size=40),
    documents({"at": "2026-01-01T00:00:00Z", "op": "submit", "request": {**REQUEST, "queue_timeout_seconds": 60}}),
    st.sampled_from([b"", b"\r", b"\x1c", b"\xef\xbb\xbf", b'{"at": "9999-12-31T23:59:59Z", "op": "reconcile"}',
                     b'{"at": "0001-01-01T00:00:00Z", "op": "snapshot"}',
                     b'{"at": "2026-01-01T00:00:00Z", "op": "submit", "request": {"request_id": "a", '
                     b'"orchestrator_id": "o", "environment": "e", "provider": "p", "runtime_kind": "host", '
                     b'"priority": 0, "queue_timeout_seconds": 60, "submitted_at": "9999-12-31T23:59:59Z"}}']),
)


def expected_outputs(trace: bytes) -> int:
    """One output line per line that is not blank once decoded (a line that cannot be decoded counts)."""
    chunks = trace.split(b"\n")
    if chunks and chunks[-1] == b"":
        chunks.pop()
    count = 0
    for index, chunk in enumerate(chunks):
        if index == 0 and chunk.startswith(codecs.BOM_UTF8):
            chunk = chunk[len(codecs.BOM_UTF8):]
        try:
            count += bool(chunk.decode("utf-8").strip())
        except UnicodeDecodeError:
            count += 1
    return count


@PROPERTY
@given(lines=st.lists(TRACE_LINES, min_size=1, max_size=6))
def test_property_simulate_answers_every_trace_line_with_one_line(offline, capsys, tmp_path, lines):
    policy = write(tmp_path / "policy.json", POLICY)
    trace = b"\n".join(line.replace(b"\n", b" ") for line in lines) + b"\n"
    path = write(tmp_path / "trace.jsonl", trace)
    result = conductor_now(capsys, "admission", "simulate", "--policy", str(policy), str(path))
    assert (result.code, result.err) == (0, ""), result
    outputs = [json.loads(line) for line in result.out.splitlines()]
    assert len(outputs) == expected_outputs(trace)
    assert all(set(output) >= {"op", "ok"} for output in outputs)
