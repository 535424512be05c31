"""`conductor substrate check URL` against a real local substrate, sound and broken.

Sound: every line `ok`, exit 0. Broken: a wrong fleet token fails that check (the checks that
need it are skipped), a wrong executor token fails only its own, swapped tokens say which role
is missing, an unreachable URL is one line; all exit 1 without a traceback. Bad arguments and
missing tokens: one line on stderr, exit 2. Tokens never appear in the output.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from substrate.server import RunningSubstrate, serve_in_thread
from tests.support.cli_support import Result, conductor_now
from tests.support.substrate_fixtures import substrate_config, substrate_tasks
from tests.support.substrate_support import EXECUTOR_TOKEN, FLEET_TOKEN
from worker.ports import free_port

CHECKS = ["health", "ready", "fleet token", "executor token", "instances", "fleet API", "admit", "replay", "reconcile", "retire"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningSubstrate]:
    with serve_in_thread(substrate_config(tmp_path_factory.mktemp("check"))) as running:
        yield running


@pytest.fixture
def tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    for name in ("CONDUCTOR_FLEET_TOKEN", "CONDUCTOR_EXECUTOR_TOKEN", "CONDUCTOR_FLEET_TOKEN_FILE",
                 "CONDUCTOR_EXECUTOR_TOKEN_FILE"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    files = {}
    for name, value in (("fleet", FLEET_TOKEN), ("executor", EXECUTOR_TOKEN), ("wrong", "not-a-known-token")):
        files[name] = tmp_path / f"{name}.token"
        files[name].write_text(value + "\n")
    return files


def check(capsys: pytest.CaptureFixture[str], url: str, fleet: Path, executor: Path) -> tuple[Result, dict[str, str]]:
    result = conductor_now(capsys, "substrate", "check", url, "--fleet-token-file", str(fleet),
                           "--executor-token-file", str(executor), "--timeout", "5")  # fmt: skip
    assert "Traceback" not in result.out + result.err
    for secret in (FLEET_TOKEN, EXECUTOR_TOKEN, "not-a-known-token"):
        assert secret not in result.out + result.err
    outcomes = {}
    for line in result.out.splitlines():
        match = re.match(r"(ok|FAIL|skip) +([A-Za-z ]+): (.+)$", line)
        assert match, f"not a check line: {line!r}"
        outcomes[match.group(2)] = match.group(1)
    return result, outcomes


def test_a_sound_substrate_passes_every_check_and_nothing_is_dispatched(
    server: RunningSubstrate, tokens: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    result, outcomes = check(capsys, server.base_url, tokens["fleet"], tokens["executor"])
    assert (result.code, list(outcomes), set(outcomes.values())) == (0, CHECKS, {"ok"}), result.out
    assert "operator role" in result.out and "4 listed, 4 ready" in result.out
    child_id = re.search(r"(conductor-check-[0-9a-f]{12}) admitted", result.out).group(1)  # type: ignore[union-attr]
    assert substrate_tasks(server, child_id) == []  # admitted, replayed, reconciled, retired: never run
    assert f"{child_id}: re-adopted" in result.out and f"{child_id} cancelled" in result.out


def test_an_executor_without_the_fleet_api_is_said_so_and_only_the_record_checks_are_skipped(
    tmp_path: Path, tokens: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    with serve_in_thread(substrate_config(tmp_path / "bare", fleet_api=False)) as bare:
        result, outcomes = check(capsys, bare.base_url, tokens["fleet"], tokens["executor"])
    assert result.code == 0, result.out
    assert outcomes == {**{name: "ok" for name in CHECKS[:6]}, **{name: "skip" for name in CHECKS[6:]}}
    assert "absent (404 on /api/v2/fleet): a fleet-less executor" in result.out


def test_a_wrong_fleet_token_fails_its_check_and_skips_what_needs_it(
    server: RunningSubstrate, tokens: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    result, outcomes = check(capsys, server.base_url, tokens["wrong"], tokens["executor"])
    assert result.code == 1
    assert outcomes == {"health": "ok", "ready": "ok", "fleet token": "FAIL", "executor token": "ok",
                        **{name: "skip" for name in CHECKS[4:]}}  # fmt: skip
    assert "refused (401)" in result.out


def test_a_wrong_executor_token_fails_only_its_check(
    server: RunningSubstrate, tokens: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    result, outcomes = check(capsys, server.base_url, tokens["fleet"], tokens["wrong"])
    assert result.code == 1
    assert outcomes == {name: "FAIL" if name == "executor token" else "ok" for name in CHECKS}


def test_swapped_tokens_say_the_fleet_plane_needs_the_admin_role(
    server: RunningSubstrate, tokens: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    result, outcomes = check(capsys, server.base_url, tokens["executor"], tokens["fleet"])
    assert result.code == 1 and outcomes["fleet token"] == "FAIL" and outcomes["executor token"] == "ok"
    assert "operator role; the fleet routes need an admin token" in result.out
    assert "admin role: also accepted on the fleet plane" in result.out


def test_an_unreachable_url_is_one_line_and_exit_1(tokens: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    result, outcomes = check(capsys, f"http://127.0.0.1:{free_port('127.0.0.1')}", tokens["fleet"], tokens["executor"])
    assert (result.code, outcomes) == (1, {"health": "FAIL"})
    assert "cannot reach" in result.out and result.out.count("\n") == 1


def test_not_an_agentic_sandbox_fails_health(tokens: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    import http.server
    import threading

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(404)
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        result, outcomes = check(capsys, f"http://127.0.0.1:{httpd.server_port}", tokens["fleet"], tokens["executor"])
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert result.code == 1 and outcomes["health"] == "FAIL" and outcomes["fleet token"] == "FAIL"
    assert "is this an Agentic Sandbox" in result.out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["ftp://example"], "http:// or https://"),
        (["http://"], "with a host"),
        (["http://127.0.0.1:1/x?y=1"], "without a query"),
        (["http://127.0.0.1:1", "--timeout", "0"], "--timeout must be a positive"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(
    argv: list[str], message: str, tokens: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    result = conductor_now(capsys, "substrate", "check", *argv, "--fleet-token-file", str(tokens["fleet"]),
                           "--executor-token-file", str(tokens["executor"]))  # fmt: skip
    assert result.code == 2 and message in result.line and result.out == ""


def test_missing_tokens_are_one_line_and_exit_2(tokens: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    result = conductor_now(capsys, "substrate", "check", "http://127.0.0.1:1")
    assert result.code == 2 and "CONDUCTOR_FLEET_TOKEN is not set" in result.line
    result = conductor_now(capsys, "substrate", "check", "http://127.0.0.1:1",
                           "--fleet-token-file", str(tokens["fleet"]), "--executor-token-file", str(tokens["fleet"].with_name("missing.token")))  # fmt: skip
    assert result.code == 2 and "cannot read" in result.line
