"""What operators expect from the `temporal` CLI: `--version`, global connection flags, completion.

The flags (`--address`, `--namespace`, `--profile`) go before the subcommand, win over the
environment configuration for that invocation (flag > TEMPORAL_* > profile file > default),
reach every command that connects, and a bad value is one line and exit 2 before anything runs.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import uuid
from importlib import metadata
from pathlib import Path

import pytest
from temporalio.client import Client

from tests.support.cli_support import conductor, conductor_now, without_profiles
from worker import connection
from worker.cli import build_parser
from worker.cli import run as run_cli
from worker.cli.completion import script, walk
from worker.connection import ConnectionFlags, connect_options, using_flags


BOGUS = "127.0.0.1:1"  # where the environment points when a flag must win: nothing listens there


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No profile or TEMPORAL_* of whoever runs the tests; returns the (empty) profile file."""
    profile_file = without_profiles(monkeypatch, tmp_path, "TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE")
    monkeypatch.setenv("CONDUCTOR_TASK_QUEUE", f"tq-nobody-{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv("CONDUCTOR_RECONNECT_SECONDS", "2")
    return profile_file


# --- --version --------------------------------------------------------------------------------------


def test_version_is_the_installed_distributions(capsys):
    result = conductor_now(capsys, "--version")
    assert result.code == 0 and result.err == ""
    assert result.out == f"conductor {metadata.version('mission-conductor')}\n"


def test_version_falls_back_to_pyproject_when_not_installed(monkeypatch):
    import tomllib

    import worker.cli as cli

    def not_installed(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(cli.metadata, "version", not_installed)
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    assert cli.version() == tomllib.loads(pyproject.read_text())["project"]["version"]


# --- precedence, where connect() reads it -------------------------------------------------------------


def test_flags_win_over_variables_which_win_over_the_profile_file(clean_env, monkeypatch):
    clean_env.write_text(
        '[profile.default]\naddress = "file-default:7233"\nnamespace = "ns-file-default"\n'
        '[profile.staging]\naddress = "file-staging:7233"\nnamespace = "ns-file-staging"\n'
    )
    assert (connect_options()["target_host"], connect_options()["namespace"]) == ("file-default:7233", "ns-file-default")
    with using_flags(ConnectionFlags.checked(profile="staging")):
        assert connect_options()["target_host"] == "file-staging:7233"
        assert connect_options(profile="default")["target_host"] == "file-default:7233"  # a command's own --profile
    monkeypatch.setenv("TEMPORAL_ADDRESS", "env:7233")
    monkeypatch.setenv("TEMPORAL_NAMESPACE", "ns-env")
    with using_flags(ConnectionFlags.checked(profile="staging")):
        assert (connect_options()["target_host"], connect_options()["namespace"]) == ("env:7233", "ns-env")
    with using_flags(ConnectionFlags.checked(address="flag:7233", namespace="ns-flag", profile="staging")):
        assert (connect_options()["target_host"], connect_options()["namespace"]) == ("flag:7233", "ns-flag")
    assert connect_options()["target_host"] == "env:7233"  # the flags last one invocation only


def test_defaults_when_nothing_is_configured(clean_env):
    assert (connect_options()["target_host"], connect_options()["namespace"]) == ("127.0.0.1:7233", "default")


# --- the flags reach every command that connects ----------------------------------------------------


async def test_address_reaches_mission_commands(dev_client: Client, clean_env, monkeypatch, capsys):
    address = dev_client.service_client.config.target_host
    monkeypatch.setenv("TEMPORAL_ADDRESS", BOGUS)
    mission_id = f"nope-{uuid.uuid4().hex[:8]}"
    result = await conductor(capsys, "--address", address, "mission", "show", mission_id)
    assert result.code == 1, result
    assert result.line.startswith(f"conductor: no mission {mission_id} on the Temporal server at {address}, namespace default")


async def test_a_wrong_namespace_is_reported(dev_client: Client, clean_env, capsys):
    address = dev_client.service_client.config.target_host
    namespace = f"no-such-ns-{uuid.uuid4().hex[:6]}"
    result = await conductor(capsys, "--address", address, "--namespace", namespace, "mission", "show", "NOPE")
    assert result.code == 1, result
    assert namespace in result.line and address in result.line, result.line


async def test_profile_reaches_mission_commands(dev_client: Client, clean_env, capsys):
    address = dev_client.service_client.config.target_host
    clean_env.write_text(f'[profile.default]\naddress = "{BOGUS}"\n[profile.here]\naddress = "{address}"\n')
    mission_id = f"nope-{uuid.uuid4().hex[:8]}"
    result = await conductor(capsys, "--profile", "here", "mission", "show", mission_id)
    assert result.code == 1 and f"no mission {mission_id} on the Temporal server at {address}" in result.line
    missing = await conductor(capsys, "--profile", "absent", "mission", "show", mission_id)
    assert missing.code == 1 and "Profile 'absent' not found" in missing.line


async def test_address_and_namespace_reach_admission_commands(dev_client: Client, clean_env, monkeypatch, capsys):
    address = dev_client.service_client.config.target_host
    monkeypatch.setenv("TEMPORAL_ADDRESS", BOGUS)
    group = f"hg-nobody-{uuid.uuid4().hex[:6]}"
    result = await conductor(capsys, "--address", address, "admission", "queue", "--host-group", group)
    assert result.code == 1 and f"no admission workflow for host group {group}" in result.line, result
    monkeypatch.setenv("TEMPORAL_ADDRESS", address)
    unreachable = await conductor(capsys, "--address", BOGUS, "admission", "queue", "--host-group", group)
    assert unreachable.code == 1 and unreachable.line.startswith(f"conductor: cannot reach Temporal at {BOGUS}")


def test_flags_reach_conductor_worker(clean_env, monkeypatch, capsys):  # main thread: it sets signal handlers
    seen: dict[str, object] = {}

    async def refuse(target_host: str, **options: object) -> Client:
        seen.update(options, target_host=target_host)
        raise RuntimeError("refused (test)")

    monkeypatch.setattr(connection.Client, "connect", refuse)
    monkeypatch.setenv("TEMPORAL_ADDRESS", BOGUS)
    result = conductor_now(capsys, "--address", "flag.example:7233", "--namespace", "ns-flag", "worker")
    assert result.code == 1
    assert result.line.startswith("conductor worker: cannot reach Temporal at flag.example:7233 (namespace ns-flag)")
    assert seen["target_host"] == "flag.example:7233" and seen["namespace"] == "ns-flag"


@pytest.mark.parametrize("command", ["dev", "demo"])
def test_commands_with_their_own_server_refuse_connection_flags(capsys, command):
    result = conductor_now(capsys, "--address", "127.0.0.1:7233", command)
    assert result.code == 2 and "does not apply to `conductor " in result.line and result.out == ""


# --- bad values: one line, exit 2, nothing run -----------------------------------------------------------

BAD = [
    ("--address", "nope"),
    ("--address", "host:"),
    ("--address", ":7233"),
    ("--address", "host:0"),
    ("--address", "host:65536"),
    ("--address", "host:99999999"),
    ("--address", "host:port"),
    ("--address", "http://host:7233"),
    ("--address", "ho st:7233"),
    ("--namespace", ""),
    ("--namespace", "a\tb"),
    ("--namespace", " padded"),
    ("--namespace", "n" * 257),
    ("--profile", ""),
    ("--profile", "bell\a"),
]


@pytest.mark.parametrize(("flag", "value"), BAD)
def test_a_bad_flag_value_is_one_line_and_exit_2(capsys, flag, value):
    result = conductor_now(capsys, flag, value, "mission", "show", "X")
    assert result.code == 2 and result.out == ""
    assert result.line.startswith(f"conductor: {flag} must ")


@pytest.mark.parametrize("address", ["127.0.0.1:7233", "localhost:1", "[::1]:65535", "temporal.example.com:443"])
def test_good_addresses_pass(address):
    assert ConnectionFlags.checked(address=address).address == address
    assert ConnectionFlags.checked(namespace="n" * 256).namespace == "n" * 256


# --- completion ----------------------------------------------------------------------------------------


def _all_subcommands(parser: argparse.ArgumentParser) -> set[str]:
    return {name for node in walk(parser) for name in node.subcommands}


def test_bash_completion_is_valid_bash_and_names_every_subcommand(capsys, tmp_path):
    result = conductor_now(capsys, "completion", "bash")
    assert result.code == 0 and result.err == ""
    path = tmp_path / "conductor.bash"
    path.write_text(result.out)
    checked = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    names = _all_subcommands(build_parser())
    assert {"mission", "admission", "completion", "policy", "show", "worker", "dev"} <= names
    for name in names:
        assert name in result.out, name


def _complete(script_path: Path, *words: str) -> list[str]:
    """What bash offers for `conductor WORDS` (the last word being completed)."""
    words_bash = " ".join(f"'{word}'" for word in ("conductor", *words))
    program = (
        f"source '{script_path}'; COMP_WORDS=({words_bash}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); "
        '_conductor; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True)
    return done.stdout.split()


def test_bash_completion_completes_subcommands_options_and_choices(tmp_path):
    path = tmp_path / "conductor.bash"
    path.write_text(script(build_parser(), "bash"))
    assert set(_complete(path, "")) >= {"mission", "admission", "completion", "contract"}
    assert set(_complete(path, "-")) >= {"--version", "--address", "--namespace", "--profile"}
    assert _complete(path, "--address", "127.0.0.1:7233", "adm") == ["admission"]  # a flag's value is skipped
    assert set(_complete(path, "admission", "policy", "")) == {"show", "set"}
    assert _complete(path, "completion", "") == ["bash", "zsh"]
    assert "--json" in _complete(path, "mission", "show", "--")


def test_zsh_completion_uses_the_same_function_through_bashcompinit(capsys):
    result = conductor_now(capsys, "completion", "zsh")
    assert result.code == 0 and "bashcompinit" in result.out and "complete -o default -F _conductor conductor" in result.out
    if shutil.which("zsh"):
        checked = subprocess.run(["zsh", "-n"], input=result.out, capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr


@pytest.mark.parametrize("argv, says", [
    (["mision", "list"], "invalid choice: 'mision'"),
    (["mission", "show"], "the following arguments are required: mission_id"),
    (["mission", "list", "--limit", "0"], "argument --limit: must be 1 to"),
    (["admission", "queue", "--host-group", "g", "--limit", "x"], "not a whole number: 'x'"),
    (["demo", "--instances", "0"], "must be at least 1, got 0"),
])
def test_a_usage_mistake_is_one_line_naming_help_and_exit_2(capsys, argv, says):
    with pytest.raises(SystemExit) as exited:
        run_cli(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.count("\n") == 1, err
    assert says in err and err.rstrip().endswith("--help`)") and "usage:" not in err
