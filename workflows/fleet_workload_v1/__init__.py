"""Fleet Workload Contract v1 (`urn:agentic-orchestration:fleet-workload:v1`): the JSON Schema and its fixtures.

Origin: Agentic Sandbox `docs/contracts/fleet-workload/v1/` at commit e901dc2, copied byte for byte.

The product carries its own copy so that an installed wheel (and a bare clone) can validate
against it, print it (`conductor contract schema`) and test against it without anything beside
the repository. `workflows/contract.py` holds the pydantic models; tests check them against this
schema so the two cannot drift.

Importable inside the Temporal workflow sandbox: stdlib only, and nothing is read at import time
(`importlib.resources.files` only builds a reference to the package's directory).
"""

from __future__ import annotations

import json
from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import Any

SCHEMA_NAME = "fleet-workload-v1.schema.json"
FIXTURE_NAMES = (
    "invalid-credential-material.json",
    "invalid-unknown-completed.json",
    "mixed-workload-inventory.json",
    "reconciliation-after-restart.json",
)

PACKAGE: Traversable = files(__name__)
SCHEMA_FILE: Traversable = PACKAGE / SCHEMA_NAME
FIXTURES: Traversable = PACKAGE / "fixtures"


def schema_text() -> str:
    """The schema exactly as shipped (UTF-8), for printing or hashing."""
    return SCHEMA_FILE.read_text(encoding="utf-8")


def load_schema() -> dict[str, Any]:
    """The schema as a parsed JSON object."""
    schema: dict[str, Any] = json.loads(schema_text())
    return schema
