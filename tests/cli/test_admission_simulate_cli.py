"""`conductor admission simulate`: the engine's black-box interface, through the real CLI."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from worker.cli import run

EXAMPLES = Path(__file__).resolve().parents[2] / "worker" / "examples"


def simulate(capsys: pytest.CaptureFixture[str], policy: dict | Path, lines: list[dict | str], *extra: str,
             tmp_path: Path) -> list[dict]:
    policy_path = policy if isinstance(policy, Path) else tmp_path / "policy.json"
    if not isinstance(policy, Path):
        policy_path.write_text(json.dumps(policy))
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    assert run(["admission", "simulate", "--policy", str(policy_path), str(trace), *extra]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def submit(at: str, request_id: str, **fields: object) -> dict:
    request = {"request_id": request_id, "orchestrator_id": "mission-1", "environment": "prod",
               "provider": "local", "runtime_kind": "container", "priority": 0, "queue_timeout_seconds": 600}
    request.update(fields)
    return {"at": at, "op": "submit", "request": request}


def test_one_output_line_per_input_line_with_records_snapshots_and_errors(capsys, tmp_path):
    out = simulate(capsys, {"max_concurrent": 1, "lease_ttl_seconds": 60}, [
        submit("2026-01-01T00:00:00Z", "a"),
        submit("2026-01-01T01:00:01+01:00", "b"),
        {"at": "2026-01-01T00:00:30Z", "op": "renew", "request_id": "a"},
        {"at": "2026-01-01T00:00:40Z", "op": "renew", "request_id": "b"},
        {"at": "2026-01-01T00:00:50Z", "op": "snapshot"},
        {"at": "2026-01-01T00:01:00Z", "op": "release", "request_id": "a"},
        {"at": "2026-01-01T00:01:10Z", "op": "reconcile"},
    ], tmp_path=tmp_path)
    assert [line["op"] for line in out] == ["submit", "submit", "renew", "renew", "snapshot", "release", "reconcile"]
    assert out[0]["record"]["state"] == "admitted"
    assert out[0]["record"]["lease_expires_at"] == "2026-01-01T00:01:00Z"
    # Times come back in UTC whatever offset they were given with.
    assert out[1]["record"]["submitted_at"] == "2026-01-01T00:00:01Z"
    assert out[1]["record"]["state"] == "queued" and out[1]["record"]["admitted_at"] is None
    assert out[2]["record"]["lease_revision"] == 2
    assert out[3] == {"op": "renew", "ok": False, "error": out[3]["error"]}
    assert out[3]["error"]["code"] == "not-admitted"
    snapshot = out[4]["snapshot"]
    assert set(snapshot["records"]) == {"a", "b"}
    assert snapshot["queue"] == [{"request_id": "b", "position": 1, "effective_priority": 1,
                                  "binding_constraint": "global 1/1", "eta": None}]  # a lease of unknown length
    assert out[5]["record"]["state"] == "released"
    assert out[6] == {"op": "reconcile", "ok": True}


def test_bad_lines_become_error_lines_and_the_run_goes_on(capsys, tmp_path):
    out = simulate(capsys, {"max_concurrent": 1}, [
        "{not json",
        {"at": "yesterday", "op": "reconcile"},
        {"at": "2026-01-01T00:00:00Z", "op": "launch"},
        submit("2026-01-01T00:00:00Z", "a", priority="high", runtime_kind="kubernetes"),
        {"at": "2026-01-01T00:00:00Z", "op": "renew"},
        submit("2026-01-01T00:00:00Z", "ok"),
    ], tmp_path=tmp_path)
    assert [line["ok"] for line in out] == [False, False, False, False, False, True]
    assert out[0]["error"]["code"] == "invalid-line" and "line 1" in out[0]["error"]["message"]
    assert "RFC 3339" in out[1]["error"]["message"]
    assert "unknown op 'launch'" in out[2]["error"]["message"]
    assert out[3]["error"]["code"] == "invalid-request"
    assert "request.priority" in out[3]["error"]["message"] and "request.runtime_kind" in out[3]["error"]["message"]
    assert "request_id" in out[4]["error"]["message"]
    assert out[5]["record"]["state"] == "admitted"


def test_audit_flag_adds_event_lines(capsys, tmp_path):
    out = simulate(capsys, {"max_concurrent": 1}, [submit("2026-01-01T00:00:00Z", "a")], "--audit", tmp_path=tmp_path)
    assert out[0]["op"] == "submit"
    assert [line["event"]["type"] for line in out[1:]] == ["queued", "admitted"]
    assert [line["event"]["seq"] for line in out[1:]] == [1, 2]


def test_stdin_trace(capsys, tmp_path, monkeypatch):
    policy = tmp_path / "policy.json"
    policy.write_text('{"max_concurrent": 0}')
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(submit("2026-01-01T00:00:00Z", "a")) + "\n"))
    assert run(["admission", "simulate", "--policy", str(policy), "-"]) == 0
    [line] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert line["record"]["state"] == "denied"
    assert line["record"]["reason"] == "max_concurrent is 0: this request can never run"


@pytest.mark.parametrize(
    ("policy_text", "expected"),
    [
        ('{"max_concurrent": 1, "max_concurency": 2}', "max_concurency: Extra inputs are not permitted"),
        ('{"lease_ttl_seconds": 10}', "max_concurrent: Field required"),
        ('{"max_concurrent": 1, "environment_quotas": {"prod": -1}}', "environment_quotas.prod"),
        ("{oops", "is not JSON"),
    ],
)
def test_bad_policy_is_refused_with_what_is_wrong(capsys, tmp_path, policy_text, expected):
    policy = tmp_path / "policy.json"
    policy.write_text(policy_text)
    trace = tmp_path / "trace.jsonl"
    trace.write_text("")
    assert run(["admission", "simulate", "--policy", str(policy), str(trace)]) == 2
    assert expected in capsys.readouterr().err


def test_set_policy_line_changes_the_rules_mid_trace(capsys, tmp_path):
    out = simulate(capsys, {"max_concurrent": 1}, [
        submit("2026-01-01T00:00:00Z", "a"),
        submit("2026-01-01T00:00:01Z", "b"),
        {"at": "2026-01-01T00:00:02Z", "op": "set_policy", "policy": {"max_concurrent": 2}},
        {"at": "2026-01-01T00:00:03Z", "op": "set_policy", "policy": {"max_concurrent": 2, "bogus": 1}},
        {"at": "2026-01-01T00:00:04Z", "op": "snapshot"},
    ], tmp_path=tmp_path)
    assert out[2] == {"op": "set_policy", "ok": True}
    assert out[3]["ok"] is False and "bogus" in out[3]["error"]["message"]
    assert {rid: rec["state"] for rid, rec in out[4]["snapshot"]["records"].items()} == {"a": "admitted", "b": "admitted"}


def test_bundled_example_runs(capsys, tmp_path):
    out = simulate(capsys, EXAMPLES / "policy.json", (EXAMPLES / "trace.jsonl").read_text().splitlines(),
                   "--audit", tmp_path=tmp_path)
    events = [line["event"] for line in out if "event" in line]
    assert any(event["type"] == "preempted" for event in events)
    assert any(event["policy"] == "priority-wip-override-v1" for event in events)


def test_requeues_gang_decisions_and_fair_share_order_show_in_the_audit_output(capsys, tmp_path):
    policy = {"max_concurrent": 2, "lease_ttl_seconds": 60, "aging_interval_seconds": 86400,
              "max_requeue_attempts": 1, "fair_share": {"weights": {"mission-a": 1, "mission-b": 1}}}
    out = simulate(capsys, policy, [
        submit("2026-01-01T00:00:00Z", "build-1", orchestrator_id="mission-a", gang_id="build", gang_size=2),
        submit("2026-01-01T00:00:01Z", "build-2", orchestrator_id="mission-a", gang_id="build", gang_size=2),
        submit("2026-01-01T00:00:02Z", "a-more", orchestrator_id="mission-a"),
        submit("2026-01-01T00:00:03Z", "b-first", orchestrator_id="mission-b"),
        {"at": "2026-01-01T00:00:30Z", "op": "release", "request_id": "build-2"},
        {"at": "2026-01-01T00:00:40Z", "op": "snapshot"},
        submit("2026-01-01T00:00:41Z", "odd", orchestrator_id="mission-a", gang_id="build", gang_size=3),
        {"at": "2026-01-01T00:01:01Z", "op": "reconcile"},
        {"at": "2026-01-01T00:10:00Z", "op": "reconcile"},
        {"at": "2026-01-01T00:20:00Z", "op": "reconcile"},
        {"at": "2026-01-01T00:20:01Z", "op": "snapshot"},
    ], "--audit", tmp_path=tmp_path)
    events = [line["event"] for line in out if "event" in line]
    moves = [(event["type"], event["request_id"], event["policy"]) for event in events]
    # The gang waits for its second member, then both are admitted together.
    assert ("queued", "build-1", None) in moves
    assert moves.index(("admitted", "build-1", "gang")) > moves.index(("queued", "build-2", None))
    assert ("admitted", "build-2", "gang") in moves
    # Fair share: mission-a holds the gang, so mission-b's later request goes first.
    assert ("admitted", "b-first", "fair-share") in moves
    snapshot = next(line["snapshot"] for line in out if "snapshot" in line)
    assert [entry["request_id"] for entry in snapshot["queue"]] == ["a-more"]
    # A lease that runs out comes back once (max_requeue_attempts 1), then times out.
    requeued = [event for event in events if event["type"] == "requeued"]
    assert requeued and requeued[0]["reason"] == "lease expired; requeued (attempt 1/1)"
    assert requeued[0]["policy"] == "requeue"
    assert any(event["type"] == "timed-out" and event["reason"] == "admission lease expired; capacity recovered"
               for event in events)
    final = [line["snapshot"] for line in out if "snapshot" in line][-1]["records"]
    assert (final["b-first"]["state"], final["b-first"]["requeue_attempts"]) == ("timed-out", 1)
    # A member naming another gang size is an error line, and the run goes on.
    errors = [line for line in out if line.get("ok") is False]
    assert [error["error"]["code"] for error in errors] == ["gang-mismatch"]


def test_a_lease_shorter_than_startup_p95_is_refused_naming_the_field(capsys, tmp_path):
    policy = tmp_path / "policy.json"
    policy.write_text('{"max_concurrent": 1, "lease_ttl_seconds": 30, "startup_p95_seconds": 90}')
    trace = tmp_path / "trace.jsonl"
    trace.write_text("")
    assert run(["admission", "simulate", "--policy", str(policy), str(trace)]) == 2
    err = capsys.readouterr().err
    assert "raise lease_ttl_seconds to at least 90" in err
    assert "Traceback" not in err


def test_a_gang_member_without_a_gang_size_is_an_error_line(capsys, tmp_path):
    out = simulate(capsys, {"max_concurrent": 1}, [
        submit("2026-01-01T00:00:00Z", "a", gang_id="g"),
        submit("2026-01-01T00:00:01Z", "b", gang_id="g", gang_size=0),
    ], tmp_path=tmp_path)
    assert [line["error"]["code"] for line in out] == ["invalid-request", "invalid-request"]
    assert "gang_id and gang_size go together" in out[0]["error"]["message"]
    assert "request.gang_size" in out[1]["error"]["message"]
