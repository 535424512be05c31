"""Reusable fixtures: a real local substrate on a free loopback port, and fleet activities for it.

Import the fixtures into a test module (`from tests.support.substrate_fixtures import substrate,
fleet_activities`); each importing module gets its own substrate for the session. Tokens
are the test tokens of `tests.support.substrate_support`, so tests can assert they never leak.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from activities.fleet import FleetActivities
from substrate.config import SubstrateConfig
from substrate.server import RunningSubstrate, serve_in_thread
from tests.support.substrate_support import EXECUTOR_TOKEN, FLEET_TOKEN

TOKENS = (FLEET_TOKEN, EXECUTOR_TOKEN)


def substrate_config(data_dir: Path, **overrides: object) -> SubstrateConfig:
    """Fast settings for tests: short kill grace, four targets."""
    options: dict[str, object] = {
        "data_dir": data_dir,
        "port": 0,
        "instances": 4,
        "kill_grace_seconds": 0.5,
    }
    options.update(overrides)
    return SubstrateConfig(FLEET_TOKEN, EXECUTOR_TOKEN, **options)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def substrate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningSubstrate]:
    with serve_in_thread(substrate_config(tmp_path_factory.mktemp("substrate"))) as running:
        yield running


@pytest.fixture
async def fleet_activities(substrate: RunningSubstrate) -> AsyncIterator[FleetActivities]:
    activities = FleetActivities(substrate.base_url, substrate.base_url, FLEET_TOKEN, EXECUTOR_TOKEN)
    try:
        yield activities
    finally:
        await activities.aclose()


def substrate_tasks(running: RunningSubstrate, child_id: str) -> list[dict[str, object]]:
    """Every executor task the substrate ever created for `child_id` (read from its SQLite store)."""
    db = sqlite3.connect(f"file:{running.config.database}?mode=ro", uri=True)
    try:
        db.row_factory = sqlite3.Row
        rows = db.execute("SELECT task_id, state, pid FROM tasks WHERE child_id = ? ORDER BY rowid", (child_id,))
        return [dict(row) for row in rows]
    finally:
        db.close()
