"""The pure cores import no Temporal: every module under `workflows/` imports with `temporalio`
unavailable, except the Temporal shells and adapters named here, each for its reason.

So the engine, the singleton's and the mission's cores, the aggregation, the models and the
front door (`workflows.inbound`) run in the CLI, the property tests and the benchmarks as plain
Python, and the line between the decisions and their Temporal shell stays where CONTRIBUTING.md
draws it."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import workflows

TEMPORAL_FACING = {
    "workflows.admission.workflow": "the singleton's shell",
    "workflows.admission.holder_workflow": "the holder's workflow",
    "workflows.admission.probe": "a probe workflow for the benchmarks",
    "workflows.admission.client": "a requester's side of the singleton, inside requester workflows",
    "workflows.mission.workflow": "the mission's shell",
    "workflows.mission.snapshots": "writes ledger snapshots through activities",
    "workflows.mission.search": "search attributes are Temporal's types",
    "workflows.mission.dispatch": "a child's start options carry Temporal's search attributes",
    "workflows.workload.workflow": "the workload's shell",
    "workflows.workload.client": "cancels and reads workload workflows",
    "workflows.cancellation": "reads the workflow's cancellation",
    "workflows.failures": "the ApplicationError a refused start fails with",
    "workflows.metrics": "the workflow's metric meter",
    "workflows.timers": "durable timers",
}

BLOCK_TEMPORAL = "import sys; sys.modules['temporalio'] = None; import importlib\n"


def test_every_pure_module_imports_without_temporalio() -> None:
    modules = sorted(m.name for m in pkgutil.walk_packages(workflows.__path__, "workflows."))
    pure = [name for name in modules if name not in TEMPORAL_FACING]
    assert set(TEMPORAL_FACING) <= set(modules), set(TEMPORAL_FACING) - set(modules)
    assert "workflows.admission.singleton" in pure and "workflows.mission.supervisor" in pure
    script = BLOCK_TEMPORAL + "".join(
        f"try:\n    importlib.import_module({name!r})\nexcept ImportError as e:\n    print({name!r}, e)\n" for name in pure
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "", f"pure modules that import temporalio:\n{result.stdout}"


def test_the_check_would_see_a_module_that_imports_temporalio() -> None:
    result = subprocess.run(
        [sys.executable, "-c", BLOCK_TEMPORAL + "importlib.import_module('workflows.timers')"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode != 0 and "temporalio" in result.stderr
