"""Fleet Workload Contract v1: the models, `conductor contract validate`, and agreement with the JSON Schema.

Every rule test also asks the JSON Schema for its verdict, so the models and the schema cannot
drift; the only allowed disagreement is the credential-key rule, which the schema cannot express
inside `orchestrator_metadata`.
"""

from __future__ import annotations

import copy
import io
import json
import re
import sys
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, get_args

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator, FormatChecker, validators
from jsonschema.exceptions import ValidationError as SchemaError
from rfc3339_validator import validate_rfc3339
from temporalio.worker import Worker
from temporalio.testing import WorkflowEnvironment

from tests.support.contract_workflow import ContractRoundTripWorkflow
from worker.cli import run
from workflows import fleet_workload_v1
from workflows.contract import (
    API_VERSION,
    Artifact,
    ArtifactKind,
    Backpressure,
    BackpressureReason,
    Budgets,
    Capability,
    CapabilityStatus,
    ContractError,
    DesiredState,
    ExitClassification,
    Health,
    InventorySnapshot,
    IsolationKind,
    Lineage,
    ObservedState,
    ReconciliationClass,
    ReconciliationReport,
    ReconciliationRow,
    WorkloadKind,
    WorkloadPolicy,
    WorkloadRecord,
    WorkloadSpec,
    WorkloadStatus,
    find_credential_keys,
    json_path,
    parse_document,
    to_wire,
)

Loc = tuple[int | str, ...]
INVENTORY = "mixed-workload-inventory.json"
RECONCILIATION = "reconciliation-after-restart.json"
SHA = "0123456789abcdef" * 4
# What the two invalid fixtures must report, so "fails" also means "fails for the right reason".
INVALID_FIXTURE_REASONS = {
    "invalid-credential-material.json": ("$.spec.credential_material", "credential material must not cross"),
    "invalid-unknown-completed.json": ("$.rows[0].observed_state", "classified 'unknown' cannot have"),
}


# --- documents and oracles -----------------------------------------------------------------------


class Docs:
    """Fresh deep copies of the contract's own example documents, to mutate per test."""

    def __init__(self, contract_dir: Path) -> None:
        self.dir = contract_dir / "fixtures"
        self._inventory = self.load(INVENTORY)
        self._report = self.load(RECONCILIATION)

    def load(self, name: str) -> Any:
        return json.loads((self.dir / name).read_text())

    def inventory(self) -> dict[str, Any]:
        return copy.deepcopy(self._inventory)

    def report(self) -> dict[str, Any]:
        return copy.deepcopy(self._report)

    def record(self, kind: str = "one-shot-command") -> dict[str, Any]:
        return next(copy.deepcopy(r) for r in self._inventory["records"] if r["kind"] == kind)

    def full_record(self) -> dict[str, Any]:
        """A record carrying every optional field, valid whatever its kind is set to."""
        record = self.record("one-shot-command")
        record["spec"]["schedule"] = "*/5 * * * *"
        record["spec"]["orchestrator_metadata"] = {"attempt": 1, "labels": ["a", "b"], "note": None}
        record["status"]["health"] = "healthy"
        record["status"]["artifacts"] = [{"kind": "log", "uri": "file:///tmp/log", "sha256": SHA}]
        record["status"]["exit_classification"] = "success"
        record["status"]["error_code"] = "none"
        record["spec"]["capabilities"][0]["reason"] = "granted by policy"
        return record


@pytest.fixture(scope="module")
def docs(contract_dir: Path) -> Docs:
    return Docs(contract_dir)


def _ecma_pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[SchemaError]:
    # JSON Schema patterns are ECMA-262, where `$` only matches at the very end; Python's `re`
    # (used by jsonschema) also matches it before a final newline, accepting "child-1\n" as an id.
    ecma = pattern[:-1] + r"\Z" if pattern.endswith("$") else pattern
    if validator.is_type(instance, "string") and not re.search(ecma, instance):
        yield SchemaError(f"{instance!r} does not match {pattern!r}")


@pytest.fixture(scope="module")
def schema_doc(contract_dir: Path) -> dict[str, Any]:
    return json.loads((contract_dir / "fleet-workload-v1.schema.json").read_text())


@pytest.fixture(scope="module")
def schema(schema_doc: dict[str, Any]) -> Draft202012Validator:
    """The contract's JSON Schema with date-time format checking on (and ECMA `$` semantics)."""
    Draft202012Validator.check_schema(schema_doc)
    checker = FormatChecker()

    @checker.checks("date-time")
    def _date_time(instance: object) -> bool:  # same as jsonschema's, minus the trailing-newline quirk
        return not isinstance(instance, str) or (not instance.endswith("\n") and validate_rfc3339(instance.upper()))

    ecma_validator = validators.extend(Draft202012Validator, {"pattern": _ecma_pattern})
    return ecma_validator(schema_doc, format_checker=checker)


def issues_of(doc: object) -> list[tuple[str, str]]:
    try:
        parse_document(doc)
    except ContractError as error:
        return error.issues
    return []


def assert_rejected(schema: Draft202012Validator, doc: dict[str, Any], path: str, says: str = "") -> None:
    issues = issues_of(doc)
    assert any(p == path and says in m for p, m in issues), f"expected {path}: …{says}… in {issues}"
    if not find_credential_keys(doc):
        assert not schema.is_valid(doc), "the JSON Schema accepts a document the models reject"


def assert_accepted(schema: Draft202012Validator, doc: dict[str, Any]) -> Any:
    assert issues_of(doc) == []
    assert schema.is_valid(doc), [e.message for e in schema.iter_errors(doc)]
    return parse_document(doc)


def get_at(doc: Any, loc: Loc) -> Any:
    for part in loc:
        doc = doc[part]
    return doc


def set_at(doc: Any, loc: Loc, value: Any) -> dict[str, Any]:
    get_at(doc, loc[:-1])[loc[-1]] = value
    return doc


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    code = run(["contract", "validate", *args])
    return code, capsys.readouterr().out.splitlines()


# --- the CLI ---------------------------------------------------------------------------------------


def test_every_contract_fixture_gets_the_verdict_its_name_promises(
    contract_dir: Path, schema: Draft202012Validator, capsys: pytest.CaptureFixture[str]
) -> None:
    fixtures = sorted((contract_dir / "fixtures").glob("*.json"))
    assert {INVENTORY, RECONCILIATION, *INVALID_FIXTURE_REASONS} <= {f.name for f in fixtures}
    for fixture in fixtures:
        code, lines = cli(capsys, str(fixture))
        if fixture.name.startswith("invalid-"):
            assert code == 1, lines
            assert lines and all(line.startswith(f"{fixture}: $") for line in lines), lines
            if fixture.name in INVALID_FIXTURE_REASONS:
                path, says = INVALID_FIXTURE_REASONS[fixture.name]
                assert any(line.startswith(f"{fixture}: {path}: ") and says in line for line in lines), lines
        else:
            assert (code, lines) == (0, [f"{fixture}: ok"])
        assert schema.is_valid(json.loads(fixture.read_text())) == (not fixture.name.startswith("invalid-"))


def test_validate_reports_every_file_and_fails_if_any_is_invalid(
    docs: Docs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = docs.record("daemon")
    del bad["status"]["health"]
    bad["lineage"]["child_id"] = ""
    bad_file = tmp_path / "bad.json"
    bad_file.write_text(json.dumps(bad))
    good = str(docs.dir / INVENTORY)
    code, lines = cli(capsys, good, str(bad_file))
    assert code == 1
    assert lines == [
        f"{good}: ok",
        f"{bad_file}: $.lineage.child_id: must not be empty (ids are 1-256 characters without whitespace)",
    ]
    bad["lineage"]["child_id"] = "child-daemon"
    bad_file.write_text(json.dumps(bad))
    assert cli(capsys, str(bad_file)) == (
        1,
        [f"{bad_file}: $.status.health: is required for kind 'daemon': report healthy, degraded, unhealthy or unknown"],
    )


def test_validate_reads_standard_input_for_dash(
    docs: Docs, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(json.dumps(docs.report()).encode())))
    assert cli(capsys, "-") == (0, ["<stdin>: ok"])
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b'{"document_type": "inventory"}')))
    code, lines = cli(capsys, "-")
    assert code == 1 and "<stdin>: $.records: is required but missing" in lines


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "$: cannot read the file: No such file or directory"),
        (b"{not json", "$: not valid JSON: Expecting property name"),
        (b'{"revision": NaN}', "$: not valid JSON: NaN is not a JSON value"),
        (b"\xff\xfe\xfa", "$: not valid JSON"),
        (b"[]", "$: must be a JSON object with a document_type (got an array)"),
        (b"{}", "$.document_type: is required but missing; it must be one of 'workload', 'inventory'"),
        (b'{"document_type": "mission"}', "$.document_type: is \"mission\"; it must be one of 'workload'"),
    ],
)
def test_validate_fails_unreadable_and_non_document_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None, says: str
) -> None:
    target = tmp_path / "doc.json"
    if content is not None:
        target.write_bytes(content)
    code, lines = cli(capsys, str(target))
    assert code == 1
    assert len(lines) == 1 and lines[0].startswith(f"{target}: {says}"), lines


def test_validate_needs_at_least_one_file(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run(["contract", "validate"])
    assert exit_info.value.code == 2
    assert "FILE" in capsys.readouterr().err


def test_schema_prints_the_bundled_json_schema_byte_for_byte(
    contract_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["contract", "schema"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out == (contract_dir / "fleet-workload-v1.schema.json").read_text(encoding="utf-8")
    printed = json.loads(out)
    assert printed["$id"] == "urn:agentic-orchestration:fleet-workload:v1"
    assert printed == fleet_workload_v1.load_schema()
    Draft202012Validator.check_schema(printed)


def test_bundled_contract_is_the_package_data_the_tests_use(contract_dir: Path) -> None:
    # The schema and fixtures the CLI ships are the very files these tests check the models against.
    assert Path(str(fleet_workload_v1.SCHEMA_FILE)) == contract_dir / "fleet-workload-v1.schema.json"
    assert sorted(f.name for f in fleet_workload_v1.FIXTURES.iterdir()) == sorted(fleet_workload_v1.FIXTURE_NAMES)


# --- documents and dispatch -------------------------------------------------------------------------


def test_parse_document_dispatches_on_document_type(docs: Docs) -> None:
    assert isinstance(parse_document(docs.inventory()), InventorySnapshot)
    assert isinstance(parse_document(docs.report()), ReconciliationReport)
    record = parse_document(docs.record("daemon"))
    assert isinstance(record, WorkloadRecord) and record.status.health == "healthy"
    inventory = docs.inventory()
    inventory["records"][0]["document_type"] = "inventory"
    assert issues_of(inventory) == [("$.records[0].document_type", "must be 'workload' (got \"inventory\")")]


def test_wrong_api_version_is_rejected(docs: Docs, schema: Draft202012Validator) -> None:
    record = docs.record()
    record["api_version"] = "agentic-orchestration/v2"
    assert_rejected(schema, record, "$.api_version", f"must be '{API_VERSION}'")


ENUM_FIELDS: list[tuple[str, Loc, Any, tuple[str, ...]]] = [
    ("record", ("kind",), WorkloadKind, ("workload_kind",)),
    ("record", ("spec", "desired_state"), DesiredState, ("desired_state",)),
    ("record", ("spec", "capabilities", 0, "status"), CapabilityStatus, ("capability", "properties", "status")),
    ("record", ("spec", "policy", "isolation_kind"), IsolationKind, ("policy", "properties", "isolation_kind")),
    ("record", ("status", "observed_state"), ObservedState, ("observed_state",)),
    ("record", ("status", "health"), Health, ("workload_record", "properties", "status", "properties", "health")),
    ("record", ("status", "backpressure", "reason"), BackpressureReason, ("backpressure", "properties", "reason")),
    ("record", ("status", "artifacts", 0, "kind"), ArtifactKind, ("artifact", "properties", "kind")),
    (
        "record",
        ("status", "exit_classification"),
        ExitClassification,
        ("workload_record", "properties", "status", "properties", "exit_classification"),
    ),
    (
        "report",
        ("rows", 0, "classification"),
        ReconciliationClass,
        ("reconciliation_row", "properties", "classification"),
    ),
    ("report", ("rows", 0, "observed_state"), ObservedState, ("observed_state",)),
]


def _base(docs: Docs, name: str) -> dict[str, Any]:
    return docs.full_record() if name == "record" else docs.report()


@pytest.mark.parametrize(("base", "loc", "alias", "schema_def"), ENUM_FIELDS, ids=lambda v: str(v)[:40])
def test_each_enum_accepts_exactly_the_schema_values(
    docs: Docs, schema: Draft202012Validator, schema_doc: dict[str, Any], base: str, loc: Loc, alias: Any,
    schema_def: tuple[str, ...],
) -> None:  # fmt: skip
    assert list(get_args(alias)) == get_at(schema_doc["$defs"], schema_def)["enum"]
    for value in get_args(alias):
        assert_accepted(schema, set_at(_base(docs, base), loc, value))
    allowed = f"must be '{get_args(alias)[0]}', "
    assert_rejected(schema, set_at(_base(docs, base), loc, "bogus"), json_path(loc), allowed)
    assert_rejected(schema, set_at(_base(docs, base), loc, get_args(alias)[0].upper()), json_path(loc), allowed)
    assert_rejected(schema, set_at(_base(docs, base), loc, None), json_path(loc))


ID_LOCS: list[tuple[str, Loc]] = [
    *(("record", ("lineage", name)) for name in Lineage.model_fields),
    ("record", ("spec", "capabilities", 0, "name")),
    ("record", ("spec", "policy", "credential_policy_ref")),
    ("record", ("spec", "policy", "network_policy_ref")),
    ("report", ("rows", 0, "child_id")),
]


@pytest.mark.parametrize(("base", "loc"), ID_LOCS, ids=lambda v: str(v))
def test_every_id_field_rejects_whitespace(docs: Docs, schema: Draft202012Validator, base: str, loc: Loc) -> None:
    doc = set_at(_base(docs, base), loc, "has space")
    assert_rejected(schema, doc, json_path(loc), 'must not contain whitespace (found " " at position 3')


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("", "must not be empty"),
        ("x" * 257, "is 257 characters long; ids are at most 256"),
        (" child", "must not contain whitespace"),
        ("child\tone", 'found "\\t" at position 5'),
        ("child\u00a0one", "must not contain whitespace"),
        ("child-1\n", "must not contain whitespace"),
        (17, "must be a string (got 17)"),
        (None, "must be a string (got null)"),
    ],
    ids=repr,
)
def test_id_rules(docs: Docs, schema: Draft202012Validator, value: object, says: str) -> None:
    assert_rejected(schema, set_at(docs.record(), ("lineage", "child_id"), value), "$.lineage.child_id", says)


@pytest.mark.parametrize("value", ["c", "x" * 256, "session:reattach", "naïve/ünïcode-id", "a.b@c#1"])
def test_ids_may_be_any_one_to_256_non_whitespace_characters(
    docs: Docs, schema: Draft202012Validator, value: str
) -> None:
    assert_accepted(schema, set_at(docs.record(), ("lineage", "child_id"), value))


def test_nullable_lineage_ids_may_be_null_or_absent(docs: Docs, schema: Draft202012Validator) -> None:
    record = docs.record()
    for name in ("parent_id", "session_id", "task_id", "command_id"):
        record["lineage"][name] = None
    assert_accepted(schema, record)
    for name in ("parent_id", "session_id", "task_id", "command_id"):
        del record["lineage"][name]
    assert_accepted(schema, record)
    del record["lineage"]["runtime_id"]
    assert_rejected(schema, record, "$.lineage.runtime_id", "is required but missing")


OBJECT_LOCS: list[tuple[str, Loc]] = [
    ("record", ()),
    ("record", ("lineage",)),
    ("record", ("spec",)),
    ("record", ("spec", "capabilities", 0)),
    ("record", ("spec", "policy")),
    ("record", ("spec", "budgets")),
    ("record", ("status",)),
    ("record", ("status", "backpressure")),
    ("record", ("status", "artifacts", 0)),
    ("inventory", ()),
    ("inventory", ("records", 2, "spec")),
    ("report", ()),
    ("report", ("rows", 1)),
]


@pytest.mark.parametrize(("base", "loc"), OBJECT_LOCS, ids=lambda v: str(v))
def test_unknown_keys_are_rejected_at_every_level(
    docs: Docs, schema: Draft202012Validator, base: str, loc: Loc
) -> None:
    doc = docs.inventory() if base == "inventory" else _base(docs, base)
    get_at(doc, loc)["surplus"] = 1
    assert_rejected(schema, doc, json_path((*loc, "surplus")), "unknown field 'surplus': remove it; fields allowed")


def test_unknown_key_message_suggests_the_near_miss(docs: Docs) -> None:
    record = docs.record()
    record["status"]["helth"] = "healthy"
    [(path, message)] = issues_of(record)
    assert path == "$.status.helth" and "did you mean 'health'?" in message


def test_orchestrator_metadata_is_open(docs: Docs, schema: Draft202012Validator) -> None:
    record = docs.record()
    record["spec"]["orchestrator_metadata"] = {"anything": {"nested": [1, None, "x", {"deep": True}]}, "max_tokens": 8}
    parsed = assert_accepted(schema, record)
    assert to_wire(parsed)["spec"]["orchestrator_metadata"] == record["spec"]["orchestrator_metadata"]
    record["spec"]["orchestrator_metadata"] = ["not", "an", "object"]
    assert_rejected(schema, record, "$.spec.orchestrator_metadata", "must be an object")


# --- conditional rules -------------------------------------------------------------------------------


def test_scheduled_collector_needs_a_schedule(docs: Docs, schema: Draft202012Validator) -> None:
    collector = docs.record("scheduled-collector")
    assert_accepted(schema, collector)
    del collector["spec"]["schedule"]
    assert_rejected(schema, collector, "$.spec.schedule", "is required for kind 'scheduled-collector'")
    collector["spec"]["schedule"] = ""
    assert_rejected(schema, collector, "$.spec.schedule", "must not be empty")
    inventory = docs.inventory()
    del inventory["records"][2]["spec"]["schedule"]
    assert_rejected(schema, inventory, "$.records[2].spec.schedule", "is required for kind 'scheduled-collector'")


def test_daemon_needs_health(docs: Docs, schema: Draft202012Validator) -> None:
    daemon = docs.record("daemon")
    daemon["status"]["health"] = "unknown"
    assert_accepted(schema, daemon)
    del daemon["status"]["health"]
    assert_rejected(schema, daemon, "$.status.health", "is required for kind 'daemon'")
    daemon["status"]["health"] = None
    assert_rejected(schema, daemon, "$.status.health", "must not be null: omit the field")


@pytest.mark.parametrize("kind", ["persistent-agent", "one-shot-command"])
def test_other_kinds_need_neither_schedule_nor_health(docs: Docs, schema: Draft202012Validator, kind: str) -> None:
    record = docs.record(kind)
    assert "schedule" not in record["spec"] and "health" not in record["status"]
    assert_accepted(schema, record)


@pytest.mark.parametrize("state", ["succeeded", "failed", "cancelled", "timed-out"])
def test_unknown_rows_cannot_carry_a_terminal_state(docs: Docs, schema: Draft202012Validator, state: str) -> None:
    report = docs.report()
    report["rows"][3]["observed_state"] = state
    says = f"classified 'unknown' cannot have the terminal observed_state '{state}'"
    assert_rejected(schema, report, "$.rows[3].observed_state", says)
    report["rows"][3]["classification"] = "terminal" if state == "succeeded" else "failed-or-aborted"
    assert_accepted(schema, report)


@pytest.mark.parametrize("state", ["unknown", "running", "operator-review-required", "stopping"])
def test_unknown_rows_may_carry_non_terminal_states(docs: Docs, schema: Draft202012Validator, state: str) -> None:
    report = docs.report()
    report["rows"][3]["observed_state"] = state
    assert_accepted(schema, report)


# --- credential material -----------------------------------------------------------------------------

FORBIDDEN_KEYS = [
    "credential", "credentials", "secret", "secrets", "password", "token", "private_key", "access_key", "api_key",
    "credential_material", "github_token", "db-password", "PASSWORD", "Api-Key", "client_secret",
    "aws_access_key_id", "githubToken", "apiKey", "APIKey", "privateKey", "apikey", "token_count",
]  # fmt: skip
ALLOWED_KEYS = [
    "credential_policy_ref", "network_policy_ref", "CREDENTIAL_POLICY_REF", "max_tokens", "tokenizer",
    "secretary", "passwords_rotated_at", "api_version", "access_log", "private_network", "key", "keyboard",
]  # fmt: skip


@pytest.mark.parametrize("key", FORBIDDEN_KEYS)
def test_credential_keys_are_rejected_at_any_depth_in_metadata(
    docs: Docs, schema: Draft202012Validator, key: str
) -> None:
    record = docs.record()
    record["spec"]["orchestrator_metadata"] = {"runner": {"env": [{"name": "A"}, {key: "s3cr3t"}]}}
    path = json_path(("spec", "orchestrator_metadata", "runner", "env", 1, key))
    assert find_credential_keys(record) == [path]
    assert issues_of(record) == [
        (path, f"credential material must not cross the contract boundary: remove key {key!r} and name "
               "the credential through spec.policy.credential_policy_ref instead"),
    ]  # fmt: skip
    assert schema.is_valid(record), "the schema alone cannot see this; the models must"


@pytest.mark.parametrize("key", ALLOWED_KEYS)
def test_reference_and_lookalike_keys_are_allowed_in_metadata(
    docs: Docs, schema: Draft202012Validator, key: str
) -> None:
    record = docs.record()
    record["spec"]["orchestrator_metadata"] = {"nested": [{key: "value"}], key: 1}
    assert find_credential_keys(record) == []
    assert_accepted(schema, record)


def test_credential_keys_outside_metadata_are_named_as_such(docs: Docs, schema: Draft202012Validator) -> None:
    record = docs.record()
    record["spec"]["policy"]["credential_policy_ref"] = "policy-1"
    record["spec"]["policy"]["network_policy_ref"] = "net-1"
    assert_accepted(schema, record)
    record["lineage"]["session_token"] = "abc"
    record["status"]["extra"] = {"Secrets": [{"api-key": "k"}]}
    assert find_credential_keys(record) == [
        "$.lineage.session_token",
        "$.status.extra.Secrets",
        "$.status.extra.Secrets[0]['api-key']",
    ]
    issues = dict(issues_of(record))
    assert issues["$.lineage.session_token"].startswith("credential material must not cross")
    assert issues["$.status.extra"].startswith("unknown field 'extra'")
    assert issues["$.status.extra.Secrets[0]['api-key']"].startswith("credential material must not cross")
    assert not schema.is_valid(record)


def test_every_credential_key_in_metadata_is_reported(docs: Docs) -> None:
    inventory = docs.inventory()
    inventory["records"][1]["spec"]["orchestrator_metadata"] = {"token": 1, "ok": {"password": 2}}
    assert [path for path, _ in issues_of(inventory)] == [
        "$.records[1].spec.orchestrator_metadata.token",
        "$.records[1].spec.orchestrator_metadata.ok.password",
    ]


def test_models_reject_credential_metadata_without_parse_document(docs: Docs) -> None:
    record = docs.record()
    record["spec"]["orchestrator_metadata"] = {"db": {"password": "x"}}
    with pytest.raises(ValueError, match="credential material"):
        WorkloadRecord.model_validate(record)


# --- values ---------------------------------------------------------------------------------------------


def test_duplicate_capabilities_are_rejected(docs: Docs, schema: Draft202012Validator) -> None:
    record = docs.record()
    capability = {"name": "command:exec", "status": "supported"}
    record["spec"]["capabilities"] = [capability, {"name": "net:egress", "status": "policy-blocked"}, dict(capability)]
    assert_rejected(schema, record, "$.spec.capabilities[2]", "duplicates capabilities[0] (\"command:exec\")")
    # uniqueItems compares whole objects: same name, different status is two items.
    record["spec"]["capabilities"][2]["status"] = "degraded"
    assert_accepted(schema, record)


@pytest.mark.parametrize(
    "digest", [SHA.upper(), SHA[:-1], SHA + "0", SHA[:-1] + "g", SHA + "\n", "", 123], ids=lambda v: repr(v)[:12]
)
def test_artifact_digests_must_be_lowercase_sha256(docs: Docs, schema: Draft202012Validator, digest: object) -> None:
    record = docs.full_record()
    record["status"]["artifacts"][0]["sha256"] = digest
    assert_rejected(schema, record, "$.status.artifacts[0].sha256")


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("2026-08-02T15:00:00", "has no UTC offset: append Z"),
        ("2026-08-02", "must be an RFC 3339 date-time"),
        ("yesterday", "must be an RFC 3339 date-time"),
        ("2026-08-02 15:00:00Z", "must be an RFC 3339 date-time"),
        ("2026-08-02T15:00Z", "must be an RFC 3339 date-time"),
        ("2026-08-02T15:00:00Z\n", "must be an RFC 3339 date-time"),
        ("2026-02-29T00:00:00Z", "day is out of range for month"),
        ("2026-13-01T00:00:00Z", "is not a valid date-time"),
        ("2026-08-02T24:00:00Z", "is not a valid date-time"),
        ("2016-12-31T23:59:60Z", "is not a valid date-time"),
        ("2026-08-02T15:00:00+24:00", "offset +24:00 is out of range"),
        (1785682800, "must be an RFC 3339 date-time string"),
        (None, "must be an RFC 3339 date-time string"),
    ],
)
def test_timestamps_must_be_rfc3339_with_an_offset(
    docs: Docs, schema: Draft202012Validator, value: object, says: str
) -> None:
    assert_rejected(schema, set_at(docs.record(), ("status", "last_seen"), value), "$.status.last_seen", says)
    assert_rejected(schema, set_at(docs.report(), ("generated_at",), value), "$.generated_at", says)
    doc = set_at(docs.record(), ("status", "backpressure", "retry_after"), value)
    optional_says = "must not be null: omit the field" if value is None else says
    assert_rejected(schema, doc, "$.status.backpressure.retry_after", optional_says)


@pytest.mark.parametrize(
    ("value", "wire"),
    [
        ("2026-08-02T15:00:00Z", "2026-08-02T15:00:00Z"),
        ("2026-08-02t15:00:00z", "2026-08-02T15:00:00Z"),
        ("2026-08-02T17:30:00+02:30", "2026-08-02T15:00:00Z"),
        ("2026-08-02T14:00:00.250-01:00", "2026-08-02T15:00:00.25Z"),
        ("2024-02-29T00:00:00.123456789Z", "2024-02-29T00:00:00.123456Z"),
    ],
)
def test_valid_timestamps_are_written_in_utc_with_z(
    docs: Docs, schema: Draft202012Validator, value: str, wire: str
) -> None:
    parsed = assert_accepted(schema, set_at(docs.record(), ("status", "last_seen"), value))
    assert to_wire(parsed)["status"]["last_seen"] == wire


INTEGER_BOUNDS: list[tuple[str, Loc, int, int | None]] = [
    ("record", ("status", "revision"), 0, None),
    ("record", ("spec", "budgets", "max_attempts"), 1, 100),
    ("record", ("spec", "budgets", "timeout_seconds"), 1, None),
    ("inventory", ("inventory_revision",), 0, None),
    ("inventory", ("records", 0, "status", "revision"), 0, None),
    ("report", ("before_revision",), 0, None),
    ("report", ("after_revision",), 0, None),
    ("report", ("rows", 0, "revision"), 0, None),
]


@pytest.mark.parametrize(("base", "loc", "low", "high"), INTEGER_BOUNDS, ids=lambda v: str(v))
def test_integer_fields_enforce_type_and_bounds(
    docs: Docs, schema: Draft202012Validator, base: str, loc: Loc, low: int, high: int | None
) -> None:
    def doc(value: object) -> dict[str, Any]:
        return set_at(docs.inventory() if base == "inventory" else _base(docs, base), loc, value)

    path = json_path(loc)
    assert_accepted(schema, doc(low))
    assert_rejected(schema, doc(low - 1), path, f"must be at least {low} (got {low - 1})")
    if high is not None:
        assert_accepted(schema, doc(high))
        assert_rejected(schema, doc(high + 1), path, f"must be at most {high}")
    for wrong in (True, str(low + 1), low + 1.5, None, [low]):
        assert_rejected(schema, doc(wrong), path)
    # JSON Schema counts 3.0 as an integer; it is written back as 3.
    assert get_at(to_wire(assert_accepted(schema, doc(float(low + 2)))), loc) == low + 2


@pytest.mark.parametrize(
    ("value", "ok"), [(0, True), (2.5, True), (5, True), (-0.01, False), ("5", False), (True, False)]
)
def test_max_cost_is_a_non_negative_number(docs: Docs, schema: Draft202012Validator, value: object, ok: bool) -> None:
    record = set_at(docs.record(), ("spec", "budgets", "max_cost_usd"), value)
    if ok:
        wire = to_wire(assert_accepted(schema, record))["spec"]["budgets"]["max_cost_usd"]
        assert wire == value and type(wire) is type(value)
    else:
        assert_rejected(schema, record, "$.spec.budgets.max_cost_usd")


@pytest.mark.parametrize(
    ("base", "loc", "value", "says"),
    [
        ("record", ("spec", "policy", "trust_tier"), "t1", "must be 'T' followed by digits"),
        ("record", ("spec", "policy", "trust_tier"), "T", "must be 'T' followed by digits"),
        ("record", ("spec", "policy", "trust_tier"), "T1a", "must be 'T' followed by digits"),
        ("record", ("spec", "capabilities", 0, "reason"), "x" * 513, "must be at most 512 characters"),
        ("record", ("status", "artifacts", 0, "uri"), "", "must not be empty"),
        ("record", ("status", "error_code"), "", "must not be empty"),
        ("record", ("status", "backpressure", "retryable"), "true", "must be true or false"),
        ("record", ("status", "artifacts"), None, "must be an array"),
        ("record", ("spec", "capabilities"), {}, "must be an array"),
        ("record", ("lineage",), "lineage", "must be an object"),
        ("report", ("rows", 0, "reason"), "x" * 513, "must be at most 512 characters"),
        ("report", ("rows",), [], "must contain at least 1 item"),
    ],
    ids=lambda v: repr(v)[:30],
)
def test_string_list_and_object_constraints(
    docs: Docs, schema: Draft202012Validator, base: str, loc: Loc, value: object, says: str
) -> None:
    assert_rejected(schema, set_at(_base(docs, base), loc, value), json_path(loc), says)


def test_empty_inventory_is_rejected(docs: Docs, schema: Draft202012Validator) -> None:
    assert_rejected(schema, set_at(docs.inventory(), ("records",), []), "$.records", "at least 1 item")


@pytest.mark.parametrize(
    "loc",
    [
        ("status", "health"),
        ("spec", "schedule"),
        ("spec", "budgets", "max_cost_usd"),
        ("spec", "orchestrator_metadata"),
    ],
)
def test_optional_fields_may_be_omitted_but_not_null(docs: Docs, schema: Draft202012Validator, loc: Loc) -> None:
    assert_rejected(schema, set_at(docs.record(), loc, None), json_path(loc), "must not be null: omit the field")


# --- the wire form ----------------------------------------------------------------------------------------


def test_contract_examples_round_trip_exactly(docs: Docs) -> None:
    for name in (INVENTORY, RECONCILIATION):
        raw = docs.load(name)
        assert to_wire(parse_document(raw)) == raw
    record = docs.full_record()
    assert parse_document(record).to_wire() == record


def test_wire_form_keeps_explicit_nulls_and_omits_absent_fields(docs: Docs, schema: Draft202012Validator) -> None:
    record = docs.record("one-shot-command")
    record["lineage"]["parent_id"] = None
    del record["lineage"]["session_id"]
    wire = to_wire(parse_document(record))
    assert wire["lineage"]["parent_id"] is None and wire["lineage"]["command_id"] == "command-1"
    assert "session_id" not in wire["lineage"]
    assert not {"health", "exit_classification", "error_code"} & wire["status"].keys()
    assert not {"schedule", "orchestrator_metadata"} & wire["spec"].keys()
    assert "max_cost_usd" not in wire["spec"]["budgets"]
    assert schema.is_valid(wire)


def test_normalised_wire_form_is_stable(docs: Docs, schema: Draft202012Validator) -> None:
    record = docs.full_record()
    record["status"]["last_seen"] = "2026-08-02T17:00:00.500000+02:00"
    record["status"]["revision"] = 3.0
    first = to_wire(parse_document(record))
    assert first["status"]["last_seen"] == "2026-08-02T15:00:00.5Z" and first["status"]["revision"] == 3
    def canonical(wire: dict[str, Any]) -> str:
        return json.dumps(wire, sort_keys=True, separators=(",", ":"))

    assert canonical(to_wire(parse_document(json.loads(canonical(first))))) == canonical(first)
    assert schema.is_valid(first)


def test_models_built_in_python_serialise_to_schema_valid_json(docs: Docs, schema: Draft202012Validator) -> None:
    record = WorkloadRecord.model_validate(docs.record("daemon"))
    status = record.status.model_copy(update={"last_seen": datetime(2026, 8, 2, 15, 0, tzinfo=timezone.utc)})
    rebuilt = WorkloadRecord(
        document_type="workload", api_version=API_VERSION, kind="daemon",
        lineage=Lineage(
            orchestrator_id="o", mission_id="m", dispatch_id="d", idempotency_key="i", parent_id=None,
            child_id="c", target_id="t", executor_id="e", runtime_id="r",
        ),
        spec=record.spec, status=status,
    )  # fmt: skip
    wire = rebuilt.to_wire()
    assert schema.is_valid(wire)
    assert wire["lineage"]["parent_id"] is None and "task_id" not in wire["lineage"]
    assert wire["status"]["last_seen"] == "2026-08-02T15:00:00Z"


def test_to_wire_refuses_a_model_mutated_into_an_invalid_state(docs: Docs) -> None:
    record = parse_document(docs.record("one-shot-command"))
    assert isinstance(record, WorkloadRecord)
    record.kind = "daemon"
    with pytest.raises(ContractError) as error:
        to_wire(record)
    assert error.value.issues == [
        ("$.status.health", "is required for kind 'daemon': report healthy, degraded, unhealthy or unknown")
    ]


async def test_contract_runs_inside_the_workflow_sandbox(docs: Docs, time_skipping_env: WorkflowEnvironment) -> None:
    record = parse_document(docs.record("persistent-agent"))
    task_queue = f"contract-{uuid.uuid4()}"
    async with Worker(time_skipping_env.client, task_queue=task_queue, workflows=[ContractRoundTripWorkflow]):
        result = await time_skipping_env.client.execute_workflow(
            ContractRoundTripWorkflow.run, record, id=f"contract-{uuid.uuid4()}", task_queue=task_queue
        )
    assert result == to_wire(record) == docs.record("persistent-agent")


# --- the models and the JSON Schema agree ------------------------------------------------------------------

_MODELS = (Lineage, Capability, WorkloadPolicy, Budgets, Backpressure, Artifact, WorkloadSpec, WorkloadStatus,
           WorkloadRecord, InventorySnapshot, ReconciliationRow, ReconciliationReport)  # fmt: skip
_FIELD_NAMES = sorted({name for model in _MODELS for name in model.model_fields})
_ENUMS = (WorkloadKind, DesiredState, ObservedState, Health, IsolationKind, ArtifactKind, BackpressureReason,
          ExitClassification, ReconciliationClass, CapabilityStatus)  # fmt: skip
_PROBES: list[Any] = [
    "", " ", "x", "a b", "x\n", "T1", "t1", "T", "T1a", "0 * * * *", "x" * 256, "x" * 257, "x" * 513, SHA,
    SHA.upper(), SHA[:-1], "workload", "inventory", "reconciliation", API_VERSION, "2026-08-02T15:00:00Z",
    "2026-08-02T15:00:00", "2026-08-02t15:00:00z", "2026-08-02 15:00:00Z", "2026-08-02T15:00:00.5+02:00",
    "2026-02-30T00:00:00Z", "2026-08-02T15:00:00Z\n", "2026-08-02", "1", "unknown", "running", "succeeded",
    *(get_args(alias)[0] for alias in _ENUMS),
    None, True, False, 0, 1, -1, 3.0, 2.5, -0.5, 100, 101, {}, [], {"k": [1, None]},
    [{"name": "a", "status": "supported"}],
    [{"name": "a", "status": "supported"}, {"name": "a", "status": "supported"}],
    [{"kind": "log", "uri": "u", "sha256": SHA}],
    {"reason": "capacity", "retryable": False},
]  # fmt: skip
_SAMPLES = [*_PROBES, *(value for alias in _ENUMS for value in get_args(alias))]
_VALUES = st.one_of(st.sampled_from(_SAMPLES), st.text(max_size=6), st.integers(-3, 300))
_KEYS = st.one_of(st.sampled_from([*_FIELD_NAMES, "surplus", "token", "credential_policy_ref"]), st.text(max_size=5))


def _locs(value: Any, loc: Loc = ()) -> Iterator[Loc]:
    yield loc
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        yield from _locs(item, (*loc, key))


def _mutate(doc: dict[str, Any], data: st.DataObject) -> None:
    loc = data.draw(st.sampled_from(list(_locs(doc))))
    target = get_at(doc, loc)
    operation = data.draw(st.sampled_from(["replace", "delete", "add_key", "duplicate"]))
    if operation == "replace" and loc:
        set_at(doc, loc, copy.deepcopy(data.draw(_VALUES)))
    elif operation == "delete" and loc:
        parent = get_at(doc, loc[:-1])
        del parent[loc[-1]]
    elif operation == "add_key" and isinstance(target, dict):
        target[data.draw(_KEYS)] = copy.deepcopy(data.draw(_VALUES))
    elif operation == "duplicate" and isinstance(target, list) and target:
        target.append(copy.deepcopy(target[data.draw(st.integers(0, len(target) - 1))]))


def _assert_same_verdict(schema: Draft202012Validator, doc: dict[str, Any]) -> None:
    schema_ok = schema.is_valid(doc)
    issues = issues_of(doc)
    if schema_ok and issues:
        assert find_credential_keys(doc), f"models reject a schema-valid document: {issues}"
    else:
        assert schema_ok == (not issues), f"schema says {schema_ok}, models say {issues}"


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_models_and_schema_agree_on_mutated_documents(
    docs: Docs, schema: Draft202012Validator, data: st.DataObject
) -> None:
    bases = [docs.full_record(), docs.inventory(), docs.report(), *(docs.record(k) for k in get_args(WorkloadKind))]
    doc = data.draw(st.sampled_from(bases))
    for _ in range(data.draw(st.integers(1, 3))):
        _mutate(doc, data)
    _assert_same_verdict(schema, doc)
    if not issues_of(doc):
        wire = to_wire(parse_document(doc))
        assert schema.is_valid(wire)
        assert to_wire(parse_document(wire)) == wire


def test_models_and_schema_agree_on_every_single_field_replacement(
    docs: Docs, schema: Draft202012Validator
) -> None:
    """Every probe value in every scalar field: exhaustive where the hypothesis test samples."""
    for base in (docs.full_record(), docs.report()):
        leaves = [loc for loc in _locs(base) if loc and not isinstance(get_at(base, loc), (dict, list))]
        for loc in leaves:
            for value in _PROBES:
                _assert_same_verdict(schema, set_at(copy.deepcopy(base), loc, copy.deepcopy(value)))
