"""The substrate's bearer tokens with roles, and its unauthenticated health routes, over real HTTP.

As the real server (`operator_auth.rs`): the fleet routes need the admin role (an operator token
is 403), `/agents/*` takes any valid token, no token or an unknown one is 401 on both planes.
A token file is the real server's TOML; a malformed one stops `serve` with one line and exit 2.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

import worker.cli
from activities.sandbox_client import ExecutorClient, FleetClient, TaskNotFound, Unauthorized
from substrate.auth import Role, RoleToken, Secret, TokenError, TokenTable, load_tokens, parse_token_file
from substrate.config import SubstrateConfig
from substrate.server import RunningSubstrate, serve_in_thread, spawn
from tests.support.substrate_fixtures import substrate_config
from tests.support.substrate_support import EXECUTOR_TOKEN, FLEET_TOKEN, make_record
from workflows.workload.messages import TaskDispatch

ADMIN_FROM_FILE = "file-admin-9c1d7e"
OPERATOR_FROM_FILE = "file-operator-2b8f44"


def token_file(tmp_path: Path, text: str | None = None) -> Path:
    path = tmp_path / "operator-tokens.toml"
    path.write_text(
        text
        if text is not None
        else f'[[tokens]]\ntoken = "{ADMIN_FROM_FILE}"\nrole = "admin"\n\n'
        f'[[tokens]]\ntoken = "{OPERATOR_FROM_FILE}"\nrole = "Operator"\n'
    )
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningSubstrate]:
    data = tmp_path_factory.mktemp("auth")
    extra = tuple(parse_token_file(token_file(data)))
    with serve_in_thread(substrate_config(data / "substrate", tokens=extra)) as running:
        yield running


@pytest.fixture
async def raw(server: RunningSubstrate) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as client:
        yield client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_fleet_routes_need_the_admin_role(raw: httpx.AsyncClient) -> None:
    for admin in (FLEET_TOKEN, ADMIN_FROM_FILE):
        for path in ("/api/v2/admin/instances", "/api/v2/fleet/workloads"):
            assert (await raw.get(path, headers=bearer(admin))).status_code == 200, (admin, path)
    for operator in (EXECUTOR_TOKEN, OPERATOR_FROM_FILE):
        answer = await raw.get("/api/v2/admin/instances", headers=bearer(operator))
        assert answer.status_code == 403
        assert answer.json()["error"] == "auth.forbidden" and "admin" in answer.json()["message"]
        answer = await raw.post("/api/v2/fleet/reconcile", json={"before_revision": 0, "child_ids": ["x"]},
                                headers=bearer(operator))  # fmt: skip
        assert answer.status_code == 403


async def test_no_token_or_an_unknown_one_is_401_on_both_planes(raw: httpx.AsyncClient) -> None:
    for headers in ({}, bearer("wrong"), bearer("x" + FLEET_TOKEN), {"Authorization": "Basic Zm9vOmJhcg=="},
                    {"Authorization": FLEET_TOKEN}, {"Authorization": "Bearer"}):  # fmt: skip
        for path in ("/api/v2/fleet/workloads", "/agents/local-1/v1/tasks/x"):
            answer = await raw.get(path, headers=headers)
            assert answer.status_code == 401, (headers, path)
            assert answer.json()["error"] == "auth.unauthorized"
            assert answer.headers["www-authenticate"] == "Bearer"


async def test_the_executor_plane_takes_any_valid_token(server: RunningSubstrate) -> None:
    for token in (EXECUTOR_TOKEN, OPERATOR_FROM_FILE, FLEET_TOKEN, ADMIN_FROM_FILE):
        async with ExecutorClient(server.base_url, token) as client:
            with pytest.raises(TaskNotFound):  # past authentication: the route itself answered
                await client.get_task("local-1", "no-such-task")
    async with ExecutorClient(server.base_url, "not-a-token") as client:
        with pytest.raises(Unauthorized):
            await client.get_task("local-1", "no-such-task")
    async with FleetClient(server.base_url, EXECUTOR_TOKEN) as client:
        with pytest.raises(Unauthorized) as caught:  # the client types 401 and 403 alike
            await client.instances()
        assert caught.value.status == 403


async def test_health_routes_answer_without_a_token_as_the_real_server_does(raw: httpx.AsyncClient) -> None:
    expected = {
        "/health": {"status": "ok", "service": "agentic-management"},
        "/healthz": {"status": "alive"},
        "/healthz/http": {"http": "alive"},
        "/readyz": {"status": "ready", "agent_count": 4},
    }
    for path, body in expected.items():
        answer = await raw.get(path)
        assert (answer.status_code, answer.json()) == (200, body), path
    assert (await raw.get("/healthz/deep")).status_code in (401, 404)  # authenticated on the real server


def test_a_token_table_keeps_digests_compares_every_entry_and_prints_no_token() -> None:
    table = TokenTable([RoleToken(Secret("a-admin"), Role.ADMIN), RoleToken(Secret("b-op"), Role.OPERATOR)])
    assert table.resolve("a-admin") is Role.ADMIN and table.resolve("b-op") is Role.OPERATOR
    assert table.resolve("a-admi") is None and table.resolve("") is None
    assert "a-admin" not in repr(table) and "admin=1" in repr(table)
    with pytest.raises(TokenError, match="both the admin and the operator role"):
        TokenTable([RoleToken(Secret("same"), Role.ADMIN), RoleToken(Secret("same"), Role.OPERATOR)])
    with pytest.raises(TokenError, match="no bearer token"):
        TokenTable([])
    config = SubstrateConfig(FLEET_TOKEN, EXECUTOR_TOKEN)
    assert FLEET_TOKEN not in repr(config) and EXECUTOR_TOKEN not in repr(config)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tokens = [", "not valid TOML"),
        ("", "no [[tokens]] entries"),
        ('[[tokens]]\ntoken = "tok-77x"\nrole = "superuser"\n', 'role must be "admin" or "operator"'),
        ('[[tokens]]\nrole = "admin"\n', "no token string"),
        ('[[tokens]]\ntoken = "tok 77x"\nrole = "admin"\n', "whitespace"),
        ('[[tokens]]\ntoken = "tok-77x"\nrole = "admin"\nscope = "all"\n', "unknown keys"),
        ('admins = ["tok-77x"]\n', "unknown keys"),
        ('[[tokens]]\ntoken = "tok-77x"\nrole = "admin"\n[[tokens]]\ntoken = "tok-77x"\nrole = "operator"\n', "both the admin"),
    ],
    ids=["toml", "empty", "role", "no-token", "whitespace", "entry-key", "top-key", "two-roles"],
)
def test_a_malformed_token_file_stops_serve_with_one_line_and_exit_2(
    text: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("CONDUCTOR_FLEET_TOKEN", "CONDUCTOR_EXECUTOR_TOKEN", "CONDUCTOR_FLEET_TOKEN_FILE",
                 "CONDUCTOR_EXECUTOR_TOKEN_FILE", "CONDUCTOR_SUBSTRATE_TOKEN_FILE"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    path = token_file(tmp_path, text)
    code = worker.cli.run(["substrate", "serve", "--port", "0", "--data-dir", str(tmp_path / "d"),
                           "--token-file", str(path)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert err.count("\n") == 1 and err.startswith("conductor substrate: ")
    assert "tok-77x" not in err


def test_tokens_come_from_a_file_and_the_two_token_variables_together(tmp_path: Path) -> None:
    path = token_file(tmp_path)
    fleet = tmp_path / "fleet.token"
    fleet.write_text("from-fleet-file\n")
    entries = load_tokens(token_file=path, fleet_token_file=fleet, environ={"CONDUCTOR_EXECUTOR_TOKEN": "from-env"})
    table = TokenTable(entries)
    assert table.resolve(ADMIN_FROM_FILE) is Role.ADMIN and table.resolve(OPERATOR_FROM_FILE) is Role.OPERATOR
    assert table.resolve("from-fleet-file") is Role.ADMIN and table.resolve("from-env") is Role.OPERATOR
    assert len(load_tokens(environ={"CONDUCTOR_SUBSTRATE_TOKEN_FILE": str(path)})) == 2
    with pytest.raises(TokenError, match="no token configured"):
        load_tokens(environ={})
    with pytest.raises(TokenError, match="set only one"):
        load_tokens(environ={"CONDUCTOR_FLEET_TOKEN": "a", "CONDUCTOR_FLEET_TOKEN_FILE": str(fleet)})


def test_a_served_substrate_takes_only_a_token_file_and_never_logs_a_token(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    path = token_file(tmp_path)
    with spawn(tmp_path / "data", token_file=path) as process:
        with httpx.Client(base_url=process.base_url, timeout=10) as http:
            assert http.get("/api/v2/admin/instances", headers=bearer(ADMIN_FROM_FILE)).status_code == 200
            assert http.get("/api/v2/admin/instances", headers=bearer(OPERATOR_FROM_FILE)).status_code == 403
            assert http.get("/api/v2/admin/instances", headers=bearer("guess")).status_code == 401
            assert http.get("/readyz").json() == {"status": "ready", "agent_count": 1}
    log = (tmp_path / "data" / "substrate.log").read_text()
    for token in (ADMIN_FROM_FILE, OPERATOR_FROM_FILE):
        assert token not in log and token not in caplog.text


async def test_tokens_from_a_token_file_never_reach_a_workload_process(
    server: RunningSubstrate, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONDUCTOR_SUBSTRATE_TOKEN_FILE", "/dev/null")  # pointed at, never passed on
    monkeypatch.setenv("SOME_TOOL_SETTING", OPERATOR_FROM_FILE)  # a copy under an unrelated name
    async with FleetClient(server.base_url, ADMIN_FROM_FILE) as fleet, ExecutorClient(server.base_url, OPERATOR_FROM_FILE) as executor:
        await fleet.admit(make_record("auth-env"))
        task = await executor.send_message("local-1", TaskDispatch(message_id="msg-auth-env", child_id="auth-env",
                                           kind="one-shot-command", prompt="env"))  # fmt: skip
        for _ in range(200):
            if (await executor.get_task("local-1", task.id)).status.state == "completed":
                break
            await asyncio.sleep(0.02)
    output = (server.config.data_dir / "tasks" / task.id / "stdout.txt").read_text()
    assert "CONDUCTOR_CHILD_ID=auth-env" in output
    for secret in (ADMIN_FROM_FILE, OPERATOR_FROM_FILE, FLEET_TOKEN, EXECUTOR_TOKEN, "CONDUCTOR_SUBSTRATE_TOKEN_FILE"):
        assert secret not in output
