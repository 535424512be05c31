"""Workflow code stays deterministic: a static check of every module under `workflows/`.

The production worker runs workflows outside the Temporal sandbox
(`worker.worker.PRODUCTION_WORKFLOW_RUNNER`), so at run time nothing refuses a wall-clock read
or an I/O call inside those modules. Two guards remain. The replay of every recorded history
runs the workflow modules in the SDK's strict default sandbox (`tests/workflows/test_replay.py`). And
this check covers every module under `workflows/`, including the pure engines and models,
which are passed through in every sandbox and so were never guarded at run time.

What it refuses:
- importing a module that reads the world or the clock, or writes: `os`, `time`, `random`,
  `secrets`, `uuid`, `socket`, `subprocess`, `threading`, `sqlite3`, HTTP and database clients;
- calling `.now()`, `.utcnow()`, `.today()` or `.fromtimestamp()` on anything but `workflow`
  (`workflow.now()` is the deterministic clock), and the builtins `open` and `input`;
- `global` statements: a passed-through module is shared by every workflow run in a worker, so
  state kept in it would leak from one run into another.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW_MODULES = sorted((ROOT / "workflows").rglob("*.py"))
FORBIDDEN_MODULES = frozenset({
    "os", "time", "random", "secrets", "uuid", "socket", "subprocess", "threading", "multiprocessing",
    "sqlite3", "httpx", "requests", "urllib", "psycopg", "psycopg_pool", "asyncpg", "shutil", "tempfile",
})  # fmt: skip
CLOCK_CALLS = frozenset({"now", "utcnow", "today", "fromtimestamp"})
FORBIDDEN_BUILTINS = frozenset({"open", "input"})


def problems(source: str, name: str = "<source>") -> list[str]:
    """`file:line: what` for each nondeterministic construct in `source`."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source, name)):
        where = f"{name}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            found += [f"{where}: imports {a.name}" for a in node.names if a.name.split(".")[0] in FORBIDDEN_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in FORBIDDEN_MODULES:
                found.append(f"{where}: imports from {node.module}")
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in CLOCK_CALLS:
                if not (isinstance(func.value, ast.Name) and func.value.id == "workflow"):
                    found.append(f"{where}: calls .{func.attr}() (use workflow.now())")
            elif isinstance(func, ast.Name) and func.id in FORBIDDEN_BUILTINS:
                found.append(f"{where}: calls {func.id}()")
        elif isinstance(node, ast.Global):
            found.append(f"{where}: global {', '.join(node.names)} (module state is shared by every run)")
    return found


def test_the_check_catches_what_it_should_and_leaves_the_rest_alone() -> None:
    bad = (
        "import os\nfrom time import monotonic\nimport uuid as u\nfrom datetime import datetime\n"
        "x = datetime.now()\ny = open('f')\ndef f():\n    global z\n"
    )
    assert [line.split(": ", 1)[1] for line in problems(bad)] == [
        "imports os", "imports from time", "imports uuid", "calls .now() (use workflow.now())",
        "calls open()", "global z (module state is shared by every run)",
    ]  # fmt: skip
    good = "from temporalio import workflow\nfrom datetime import timedelta\nnow = workflow.now()\nimport asyncio\n"
    assert problems(good) == []


@pytest.mark.parametrize("path", WORKFLOW_MODULES, ids=[str(p.relative_to(ROOT)) for p in WORKFLOW_MODULES])
def test_workflow_modules_make_no_nondeterministic_calls(path: Path) -> None:
    assert problems(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT))) == []


def test_the_production_worker_runs_unsandboxed_and_the_replayers_stay_strict() -> None:
    from temporalio.worker import UnsandboxedWorkflowRunner
    from temporalio.worker.workflow_sandbox import SandboxRestrictions

    from worker.worker import PRODUCTION_WORKFLOW_RUNNER

    assert isinstance(PRODUCTION_WORKFLOW_RUNNER, UnsandboxedWorkflowRunner)
    # The release guards build their Replayer without a workflow_runner: the SDK's strict default.
    for guard in (ROOT / "tests" / "workflows" / "test_replay.py", ROOT / "worker" / "replay_check.py"):
        calls = [n for n in ast.walk(ast.parse(guard.read_text())) if isinstance(n, ast.Call)
                 and getattr(n.func, "id", None) == "Replayer"]  # fmt: skip
        assert calls and all("workflow_runner" not in {k.arg for k in c.keywords} for c in calls), guard
    assert "workflows" not in SandboxRestrictions.default.passthrough_modules
