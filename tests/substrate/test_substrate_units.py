"""Substrate parts with no server: cron, state mapping, credentials, client error mapping, CLI, CAS."""

from __future__ import annotations

import pickle
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import worker.cli
from activities.credentials import BearerToken, MissingCredential, executor_token, fleet_token
from activities.sandbox_client import (
    FleetRejected,
    IdempotencyCollision,
    NotFound,
    ProtocolViolation,
    StaleRevision,
    SubstrateUnavailable,
    Unauthorized,
    error_from_response,
)
from substrate.cron import CronError, CronSchedule
from substrate.errors import SubstrateError
from substrate.fleet import FleetService
from substrate.store import Store
from tests.support.substrate_support import make_record
from workflows.contract import WorkloadStatus, to_wire

# --- cron ----------------------------------------------------------------------------------


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize(
    ("expression", "after", "expected"),
    [
        ("* * * * *", "2026-08-02T15:00:30", "2026-08-02T15:01:00"),
        ("*/15 * * * *", "2026-08-02T15:00:00", "2026-08-02T15:15:00"),
        ("0 * * * *", "2026-08-02T15:00:00", "2026-08-02T16:00:00"),
        ("30 9 * jan mon-fri", "2026-08-02T15:00:00", "2027-01-01T09:30:00"),  # Jan 1 2027 is a Friday
        ("0 0 * * 7", "2026-08-03T00:00:00", "2026-08-09T00:00:00"),  # 7 is Sunday
        ("0 0 13 * 5", "2026-08-02T00:00:00", "2026-08-07T00:00:00"),  # day OR weekday: Friday the 7th
        ("0 0 29 2 *", "2026-03-01T00:00:00", "2028-02-29T00:00:00"),
        ("5/20 1 * * *", "2026-08-02T01:06:00", "2026-08-02T01:25:00"),
        ("@daily", "2026-12-31T23:59:00", "2027-01-01T00:00:00"),
        ("@hourly", "2026-08-02T15:59:59", "2026-08-02T16:00:00"),
    ],
)
def test_cron_next_after(expression: str, after: str, expected: str) -> None:
    assert CronSchedule.parse(expression).next_after(at(after)) == at(expected)


@pytest.mark.parametrize(
    ("expression", "needle"),
    [
        ("* * * *", "5"),
        ("60 * * * *", "outside 0-59"),
        ("* * * * mon-xyz", "not a number"),
        ("10-5 * * * *", "backwards"),
        ("*/0 * * * *", "positive"),
        ("0 0 30 2 *", "never fires"),
        ("1,,2 * * * *", "empty"),
    ],
)
def test_cron_rejects_bad_expressions(expression: str, needle: str) -> None:
    with pytest.raises(CronError, match=needle):
        CronSchedule.parse(expression)


def _field(low: int, high: int) -> st.SearchStrategy[str]:
    single = st.integers(low, high).map(str)
    ranged = st.tuples(st.integers(low, high), st.integers(low, high)).map(lambda p: f"{min(p)}-{max(p)}")
    item = st.one_of(st.just("*"), single, ranged)
    stepped = st.tuples(item, st.integers(1, 7)).map(lambda p: f"{p[0]}/{p[1]}")
    return st.lists(st.one_of(item, stepped), min_size=1, max_size=3).map(",".join)


@settings(max_examples=60, deadline=None)
@given(
    minute=_field(0, 59),
    hour=_field(0, 23),
    day=_field(1, 31),
    weekday=_field(0, 7),
    start=st.datetimes(min_value=datetime(2020, 1, 1), max_value=datetime(2035, 1, 1)),
)
def test_cron_next_after_agrees_with_a_minute_by_minute_search(
    minute: str, hour: str, day: str, weekday: str, start: datetime
) -> None:
    try:
        schedule = CronSchedule.parse(f"{minute} {hour} {day} * {weekday}")
    except CronError:
        return
    start = start.replace(tzinfo=UTC)
    found = schedule.next_after(start)
    assert found > start and schedule.matches(found) and found.second == 0
    probe = start.replace(second=0, microsecond=0) + timedelta(minutes=1)
    window_end = probe + timedelta(days=3)
    while probe < min(found, window_end):
        assert not schedule.matches(probe), f"{schedule.expression} fires at {probe}, before {found}"
        probe += timedelta(minutes=1)


# The task state -> record state table: the projection tests at the end of this file.


# --- credentials ---------------------------------------------------------------------------


def test_tokens_load_from_env_file_variable_or_explicit_file(tmp_path: Path) -> None:
    secret_file = tmp_path / "fleet.token"
    secret_file.write_text("from-file\n")
    assert fleet_token(environ={"CONDUCTOR_FLEET_TOKEN": "from-env"}).reveal() == "from-env"
    assert fleet_token(environ={"CONDUCTOR_FLEET_TOKEN_FILE": str(secret_file)}).reveal() == "from-file"
    assert fleet_token(file=secret_file, environ={"CONDUCTOR_FLEET_TOKEN": "from-env"}).reveal() == "from-file"
    with pytest.raises(MissingCredential, match="CONDUCTOR_EXECUTOR_TOKEN"):
        executor_token(environ={})
    with pytest.raises(MissingCredential, match="only one"):
        fleet_token(environ={"CONDUCTOR_FLEET_TOKEN": "a", "CONDUCTOR_FLEET_TOKEN_FILE": str(secret_file)})
    with pytest.raises(MissingCredential, match="cannot read"):
        fleet_token(file=tmp_path / "missing")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(MissingCredential, match="empty"):
        fleet_token(file=tmp_path / "empty")


def test_a_token_does_not_show_itself() -> None:
    token = BearerToken("s3cr3t-value")
    assert "s3cr3t" not in repr(token) + str(token) + f"{token}" + repr({"t": token})
    with pytest.raises(TypeError):
        pickle.dumps(token)


# --- client error mapping ------------------------------------------------------------------


def response(status: int, body: object = None, text: str | None = None) -> httpx.Response:
    request = httpx.Request("POST", "http://substrate/api/v2/fleet/workloads")
    if text is not None:
        return httpx.Response(status, text=text, request=request)
    return httpx.Response(status, json=body, request=request)


def test_error_responses_map_to_typed_exceptions() -> None:
    assert isinstance(error_from_response(response(503, text="busy")), SubstrateUnavailable)
    assert isinstance(error_from_response(response(429, {"error": "rate", "message": "slow"})), SubstrateUnavailable)
    assert isinstance(error_from_response(response(401, {"error": "auth.unauthorized", "message": ""})), Unauthorized)
    stale = error_from_response(response(409, {"error": "fleet.stale_revision", "message": "", "current_revision": 7}))
    assert isinstance(stale, StaleRevision) and stale.current_revision == 7
    assert isinstance(error_from_response(response(409, {"error": "fleet.stale_revision", "message": ""})),
                      ProtocolViolation)  # fmt: skip
    collision = error_from_response(response(422, {"error": "fleet.idempotency_collision", "message": "x"}))
    assert isinstance(collision, IdempotencyCollision) and isinstance(collision, FleetRejected)
    odd = error_from_response(response(404, text="<html>no</html>"))
    assert isinstance(odd, NotFound) and odd.code == "http.404"
    plain = error_from_response(response(400, text="bad"))
    assert type(plain) is FleetRejected and not plain.retryable


# --- compare-and-swap under contention -----------------------------------------------------


def test_concurrent_observations_with_the_same_expected_revision_have_one_winner(tmp_path: Path) -> None:
    store = Store(tmp_path / "cas.sqlite3")
    fleet = FleetService(store)
    fleet.admit(to_wire(make_record("cas-1")))
    results: list[str] = []
    barrier = threading.Barrier(8)

    def observe(n: int) -> None:
        status = WorkloadStatus.model_validate(
            {"observed_state": "running", "revision": 2, "last_seen": "2026-08-02T15:00:00Z", "artifacts": [],
             "error_code": f"writer-{n}"}
        )  # fmt: skip
        barrier.wait()
        try:
            fleet.apply("cas-1", 1, status)
            results.append("won")
        except SubstrateError as error:
            results.append(error.code)

    threads = [threading.Thread(target=observe, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == ["fleet.stale_revision"] * 7 + ["won"]
    assert fleet.get("cas-1").status.revision == 2
    store.close()


# --- CLI -----------------------------------------------------------------------------------


def test_serve_refuses_to_start_without_two_distinct_tokens(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for name in ("CONDUCTOR_FLEET_TOKEN", "CONDUCTOR_EXECUTOR_TOKEN", "CONDUCTOR_FLEET_TOKEN_FILE",
                 "CONDUCTOR_EXECUTOR_TOKEN_FILE"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    assert worker.cli.run(["substrate", "serve", "--port", "0", "--data-dir", str(tmp_path)]) == 2
    assert "no token configured" in capsys.readouterr().err

    same = tmp_path / "same.token"
    same.write_text("identical-secret-value")
    code = worker.cli.run(["substrate", "serve", "--port", "0", "--data-dir", str(tmp_path),
                           "--fleet-token-file", str(same), "--executor-token-file", str(same)])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 2 and "must differ" in captured.err
    assert "identical-secret-value" not in captured.out + captured.err


def test_serve_takes_no_token_values_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):  # not even as an abbreviation of --fleet-token-file
        worker.cli.run(["substrate", "serve", "--fleet-token", "abc"])
    assert "unrecognized arguments" in capsys.readouterr().err


# --- the projection of a bound task into its record (fleet.rs project_task_observation) ------

_PROJECTION_TABLE = [
    # (kind, task state, observed_state, health, exit_classification, error_code)
    ("daemon", "submitted", "starting", "unknown", None, None),
    ("daemon", "working", "healthy", "healthy", None, None),
    ("daemon", "completed", "operator-review-required", "unknown", "unknown", "fleet.daemon_task_exited"),
    ("daemon", "failed", "failed", "unhealthy", "failure", "fleet.task_failed"),
    ("daemon", "canceled", "cancelled", "unknown", "cancelled", None),
    ("daemon", "input-required", "blocked", "unknown", None, None),
    ("persistent-agent", "working", "running", None, None, None),
    ("persistent-agent", "completed", "retained", None, "success", None),
    ("scheduled-collector", "working", "catching-up", None, None, None),
    ("scheduled-collector", "completed", "scheduled", None, "success", None),
    ("one-shot-command", "submitted", "starting", None, None, None),
    ("one-shot-command", "working", "running", None, None, None),
    ("one-shot-command", "completed", "succeeded", None, "success", None),
    ("one-shot-command", "failed", "failed", None, "failure", "fleet.task_failed"),
    ("one-shot-command", "rejected", "failed", None, "failure", "fleet.task_failed"),
    ("one-shot-command", "canceled", "cancelled", None, "cancelled", None),
    ("one-shot-command", "auth-required", "blocked", None, None, "fleet.task_auth_required"),
    ("one-shot-command", "unknown", "unknown", None, "unknown", None),  # the substrate's own row
]


def _bound(kind: str, state: str = "starting", revision: int = 2) -> dict:
    record = to_wire(make_record("proj-1", kind, **({"schedule": "* * * * *"} if kind == "scheduled-collector" else {})))
    record["lineage"]["task_id"] = "task-1"
    record["status"].update(observed_state=state, revision=revision)
    return record


def _task(state: str, artifacts: list | None = None):
    from substrate.store import TaskRow

    return TaskRow(task_id="task-1", message_id="m", message_sha256="x", instance_id="local-1", child_id="proj-1",
                   context_id="", kind="k", state=state, status_text=None, updated_at="2026-12-01T12:00:00.000Z",
                   request={}, artifacts=artifacts or [], status_extra={"exit_code": 0})  # fmt: skip


@pytest.mark.parametrize(("kind", "task_state", "observed", "health", "exit_classification", "error_code"),
                         _PROJECTION_TABLE)  # fmt: skip
def test_a_bound_task_projects_into_its_record_per_kind(
    kind: str, task_state: str, observed: str, health: str | None, exit_classification: str | None,
    error_code: str | None,
) -> None:
    from substrate.projection import project

    start = "admitted" if observed == "starting" else "starting"
    projected = project(_bound(kind, start), _task(task_state))
    assert projected is not None
    status = projected["status"]
    assert (status["observed_state"], status.get("health"), status.get("exit_classification"),
            status.get("error_code"), status["revision"]) == (observed, health, exit_classification, error_code, 3)  # fmt: skip
    expected_backpressure = {"input-required": {"reason": "approval", "retryable": False},
                             "auth-required": {"reason": "policy", "retryable": False}}.get(task_state)  # fmt: skip
    assert status.get("backpressure") == expected_backpressure
    kinds = [a["kind"] for a in status["artifacts"]]
    assert kinds == (["result"] if task_state == "completed" else [])
    WorkloadStatus.model_validate(status)  # what it writes is a valid status


def test_projection_adds_a_log_per_task_artifact_takes_the_command_id_and_leaves_settled_records() -> None:
    from substrate.projection import canonical_sha256, project

    chunk = {"kind": "output_chunk", "stream": "stdout", "data": "ok", "command_id": "cmd-1", "seq": 1}
    row = {"artifact_id": "task-1-stdout-0001", "created_at": "2026-12-01T12:00:05.000Z", "artifact": chunk}
    projected = project(_bound("one-shot-command"), _task("completed", [row]))
    assert projected is not None
    assert projected["status"]["artifacts"][0] == {
        "kind": "log", "uri": "sandbox://tasks/task-1/artifacts/task-1-stdout-0001", "sha256": canonical_sha256(chunk)}  # fmt: skip
    assert projected["status"]["artifacts"][1]["uri"] == "sandbox://tasks/task-1/status"
    assert projected["lineage"]["command_id"] == "cmd-1"
    assert projected["status"]["last_seen"] == "2026-12-01T12:00:05Z"  # the latest of task and artifacts
    assert project(projected, _task("completed", [row])) is None  # settled: left as it is
    running = project(_bound("persistent-agent"), _task("working"))
    assert running is not None and project(running, _task("working")) is None  # unchanged: no revision churn
