"""Where workflow code issues Temporal commands, and which recorded histories reach each place.

A replay test proves determinism only for the code a history reaches: a branch that no
history takes (a `wait_condition` given a timeout, say, which adds a timer) can change what
the workflow commands without any test noticing. So every *command site* must be reached by
a recorded history, and `tests/histories/README.md` names one for each.

A command site is a call, in a module under `workflows/`, that issues a command: a call of the
SDK's command APIs (activities, child workflows, timers, signals and cancellations to other
workflows, continue-as-new, search attributes, patches), or of a function of these modules
that (transitively) makes one. Found from the source with `ast`; which of them a replay
executes is seen with a line tracer, one history at a time.

    .venv/bin/python -m tests.command_sites     # the index table, to paste into the README
"""

from __future__ import annotations

import ast
import asyncio
import json
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW_CODE = ROOT / "workflows"
HISTORIES = ROOT / "tests" / "histories"
INDEX = HISTORIES / "README.md"

# Calls of the SDK that become commands (or a command's cancellation) in the history.
SDK_COMMANDS = frozenset({
    "execute_activity", "start_activity", "execute_local_activity", "start_local_activity",
    "execute_child_workflow", "start_child_workflow", "sleep", "continue_as_new",
    "upsert_search_attributes", "upsert_memo", "patched", "deprecate_patch",
    "signal", "cancel",  # on an external workflow's handle; `cancel` of a task that awaits a timer cancels the timer
})  # fmt: skip


@dataclass(frozen=True, order=True)
class Site:
    """One command-issuing call: `name` is stable across edits that move lines."""

    name: str
    path: str  # relative to the repository
    line: int


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _issues_sdk_command(call: ast.Call) -> bool:
    name = _called_name(call)
    if name == "wait_condition":  # a timer only when given a timeout
        return any(k.arg == "timeout" and not (isinstance(k.value, ast.Constant) and k.value.value is None) for k in call.keywords)
    return name in SDK_COMMANDS and isinstance(call.func, ast.Attribute)


def _label(call: ast.Call) -> str:
    name = _called_name(call) or "?"
    first = call.args[0] if call.args else None
    if isinstance(first, ast.Name) and first.id.isupper():  # an activity or signal name constant
        return f"{name}({first.id})"
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return f"{name}({first.value!r})"
    return name


class _Module(ast.NodeVisitor):
    """One module's functions (qualified names, with the calls in each one's own body,
    decorators aside) and what its imports of other workflow modules bind."""

    def __init__(self, module: str) -> None:
        self.module = module
        self.calls: dict[str, list[ast.Call]] = {}
        self.classes: set[str] = set()
        self.imported_modules: dict[str, str] = {}  # alias -> module
        self.imported_names: dict[str, str] = {}  # name -> module it comes from
        self._scope: list[str] = []

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module is None or not node.module.startswith("workflows"):
            return
        for alias in node.names:
            if (WORKFLOW_CODE.parent / node.module.replace(".", "/") / f"{alias.name}.py").exists():
                self.imported_modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            else:
                self.imported_names[alias.asname or alias.name] = node.module

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._scope.append(node.name)
        calls = self.calls.setdefault(".".join(self._scope), [])
        for statement in node.body:
            calls.extend(child for child in ast.walk(statement) if isinstance(child, ast.Call))
        for statement in node.body:
            self.visit(statement)  # nested functions get entries of their own too
        self._scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.classes.add(node.name)
        self._scope.append(node.name)
        for statement in node.body:
            self.visit(statement)
        self._scope.pop()

    def visit_Lambda(self, node: ast.Lambda) -> None:
        pass


Function = tuple[str, str]  # (module, qualified name)


def _callees(call: ast.Call, module: _Module, caller: str, methods: dict[str, set[Function]]) -> set[Function]:
    """The workflow functions a call may reach: resolved by scope, `self`, imports, else by method name."""
    func = call.func
    if isinstance(func, ast.Name):
        for qualname in (f"{caller}.{func.id}", func.id):  # a nested function, then a module-level one
            if qualname in module.calls:
                return {(module.module, qualname)}
        if func.id in module.imported_names:
            return {(module.imported_names[func.id], func.id)}
        return set()
    if not isinstance(func, ast.Attribute):
        return set()
    owner = func.value
    if isinstance(owner, ast.Name) and owner.id == "self" and caller.split(".")[0] in module.classes:
        return {(module.module, f"{caller.split('.')[0]}.{func.attr}")}
    if isinstance(owner, ast.Name) and owner.id in module.imported_modules:
        return {(module.imported_modules[owner.id], func.attr)}
    return methods.get(func.attr, set())  # a method of an object of a workflow class


def command_sites(root: Path = WORKFLOW_CODE) -> list[Site]:
    modules: dict[str, tuple[str, _Module]] = {}
    for path in sorted(root.rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        module = _Module(name)
        module.visit(ast.parse(path.read_text(), str(path)))
        modules[name] = (path.relative_to(ROOT).as_posix(), module)
    methods: dict[str, set[Function]] = {}
    for name, (_, module) in modules.items():
        for qualname in module.calls:
            parts = qualname.split(".")
            if len(parts) == 2 and parts[0] in module.classes:
                methods.setdefault(parts[1], set()).add((name, qualname))
    resolved = {
        (name, qualname): [(call, _callees(call, module, qualname, methods)) for call in calls]
        for name, (_, module) in modules.items()
        for qualname, calls in module.calls.items()
    }
    # Functions that issue commands, directly or through one another.
    issuing: set[Function] = set()
    while True:
        grown = {
            function for function, calls in resolved.items()
            if any(_issues_sdk_command(call) or callees & issuing for call, callees in calls)
        }
        if grown <= issuing:
            break
        issuing |= grown
    sites: list[Site] = []
    for (name, qualname), calls in sorted(resolved.items()):
        seen: dict[str, int] = {}
        for call, callees in sorted(calls, key=lambda item: (item[0].lineno, item[0].col_offset)):
            if not (_issues_sdk_command(call) or callees & issuing):
                continue
            label = _label(call)
            seen[label] = seen.get(label, 0) + 1
            ordinal = f" #{seen[label]}" if seen[label] > 1 else ""
            sites.append(Site(f"{qualname}: {label}{ordinal}", modules[name][0], call.lineno))
    return sites


# --- what a replay executes --------------------------------------------------------------


@contextmanager
def lines_executed(paths: set[str]) -> Iterator[set[tuple[str, int]]]:
    """Record (path, line) of every line executed in `paths` (absolute), in every thread."""
    executed: set[tuple[str, int]] = set()

    def local(frame, event, arg):
        if event == "line":
            executed.add((frame.f_code.co_filename, frame.f_lineno))
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code.co_filename in paths else None

    previous = sys.gettrace()
    threading.settrace(tracer)
    sys.settrace(tracer)
    try:
        yield executed
    finally:
        sys.settrace(previous)
        threading.settrace(None)  # type: ignore[arg-type]


def recorded_history(path: Path):
    """A recorded history as the replayer takes it, under the workflow id it ran with where the
    code reads its own id (an AdmissionHolder's is made from its input); else under the file's name."""
    from temporalio.client import WorkflowHistory

    from workflows.admission.holders import HOLDER_WORKFLOW, HolderInput, holder_workflow_id

    text = path.read_text()
    started = json.loads(text)["events"][0]["workflowExecutionStartedEventAttributes"]
    workflow_id = path.stem
    if started["workflowType"]["name"] == HOLDER_WORKFLOW:
        import base64

        held = HolderInput.model_validate_json(base64.b64decode(started["input"]["payloads"][0]["data"]))
        workflow_id = holder_workflow_id(held.host_group, held.holder, held.request.request_id)
    return WorkflowHistory.from_json(workflow_id, text)


async def _replay_traced(history_paths: list[Path], sites: list[Site]) -> dict[Site, list[str]]:
    from worker.payloads import DATA_CONVERTER
    from temporalio.worker import Replayer

    from tests.support.decision_sink import DecisionSinkWorkflow
    from worker.worker import WORKFLOWS
    from workflows.admission.probe import AdmissionProbeWorkflow

    absolute = {str(ROOT / site.path) for site in sites}
    reached: dict[Site, list[str]] = {site: [] for site in sites}
    for history_path in history_paths:
        with lines_executed(absolute) as executed:
            # Threads made inside the tracer's reach, so the workflow code running on them is traced.
            with ThreadPoolExecutor(max_workers=1) as executor:
                replayer = Replayer(
                    workflows=[*WORKFLOWS, AdmissionProbeWorkflow, DecisionSinkWorkflow],
                    data_converter=DATA_CONVERTER,
                    workflow_task_executor=executor,
                )
                await replayer.replay_workflow(recorded_history(history_path))
        name = history_path.relative_to(HISTORIES).with_suffix("").as_posix()
        for site in sites:
            if (str(ROOT / site.path), site.line) in executed:
                reached[site].append(name)
    return reached


def reached_by_histories(history_paths: list[Path] | None = None) -> dict[Site, list[str]]:
    """Each command site with the recorded histories whose replay executes it."""
    paths = sorted(HISTORIES.glob("**/*.json")) if history_paths is None else history_paths
    return asyncio.run(_replay_traced(paths, command_sites()))


# --- the index -----------------------------------------------------------------------------


def index_rows(text: str) -> dict[str, list[str]]:
    """The README's table: site name -> the histories it names for it."""
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and cells[0].endswith("`"):
            rows[cells[0].strip("`")] = [name.strip().strip("`") for name in cells[2].split(",") if name.strip()]
    return rows


def index_table(reached: dict[Site, list[str]]) -> str:
    lines = ["| command site | where | reached by |", "|---|---|---|"]
    for site in sorted(reached):
        histories = ", ".join(f"`{name}`" for name in sorted(reached[site], key=_smallest_first)[:2]) or "**none**"
        lines.append(f"| `{site.name}` | {site.path} | {histories} |")
    return "\n".join(lines)


def _smallest_first(name: str) -> tuple[int, str]:
    events = json.loads((HISTORIES / f"{name}.json").read_text())["events"]
    return len(events), name


if __name__ == "__main__":
    print(index_table(reached_by_histories()))
    from worker.process import exit_now

    exit_now(0)
