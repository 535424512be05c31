"""`substrate/` is a second implementation of the real server, written apart from the client.

So it imports nothing from `activities/`: a misreading of the Agentic Sandbox wire shared by
both sides through common models would pass every test of either side. The substrate's own
reading of the wire is `substrate/wire.py`.
"""

from __future__ import annotations

import ast
from pathlib import Path

SUBSTRATE = Path(__file__).resolve().parents[2] / "substrate"


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def test_the_substrate_imports_nothing_from_activities() -> None:
    modules = sorted(SUBSTRATE.glob("*.py"))
    assert {"app.py", "executor.py", "fleet.py", "runner.py", "wire.py"} <= {m.name for m in modules}
    offending = [
        f"substrate/{module.name}:{line} imports {name}"
        for module in modules
        for line, name in _imports(module)
        if name == "activities" or name.startswith("activities.")
    ]
    assert offending == [], "\n".join(offending)


def test_the_check_sees_an_activities_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import json\nfrom activities.agentic_sandbox_api import Task\nimport activities.fleet as f\nfrom . import wire\n")
    assert [name for _, name in _imports(sample)] == ["json", "activities.agentic_sandbox_api", "activities.fleet"]
