"""The repository stands on its own: no tracked file refers to a path outside it, and the wheel ships the contract.

A user's `git clone` (and CI's) has nothing beside it, so a test, a doc or a build step that reaches
for a sibling folder of the checkout, or for a folder of one person's machine, works only where it
was written.

What counts as a reference to the outside (the patterns are below; the detector tests show them at
work on sample lines):
- a relative path whose `..` segments climb above the repository root. Markdown link targets are
  resolved from the file's own folder, as renderers do; every other relative path (prose, code
  spans, commands, code) from the repository root, where the README, the Makefile, CI and pytest run;
- `Path(__file__)` climbing above the root (`.parents[N]`, `.parent` chains, `os.path.dirname`);
- an absolute path of a particular machine: under the work, root, home or Users folders, mnt, the
  temp folder, macOS's per-user temp folders, a Windows drive; also inside a `file://` URI, except
  the temp folder, which runs write artifacts under (such URIs in contract examples and in recorded
  histories are data a run produced, not a place the project reads from).

Not references: URLs (`https://...`), `file://` URIs built at run time, system paths that every
machine has (`/dev/null`, `/usr/bin/env`, `/proc`, `/etc`), home-relative `~/...` defaults of tools.

Recorded histories (`tests/histories/*.json`) are checked like every other file, and their base64
payloads are decoded and checked too: the raw base64 cannot match (a path inside it is always glued
to base64 characters, which the patterns refuse as the start of a path), and what a payload carries
is what the history really recorded. The artifact URIs the substrate recorded there point into the
temp folder of the recording run, which is why that folder is allowed inside `file://` URIs.
"""

from __future__ import annotations

import base64
import binascii
import os
import posixpath
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path, PurePosixPath

import pytest

from workflows import fleet_workload_v1

REPO = Path(__file__).resolve().parents[2]

HOW_TO_FIX = """\
Each of these refers to something outside the repository, which a fresh clone does not have.
Fix: bring what it points at into the repository (package data such as workflows/fleet_workload_v1/,
read with importlib.resources; docs under docs/) and refer to it by a path inside the repository:
relative to the repository root in prose and commands, relative to the file in Markdown links,
from Path(__file__) within the repository in code. Scratch files belong in pytest's tmp_path or
tempfile, never a hard-coded folder of the temp directory. If a finding is not a path at all, narrow the pattern in
tests/interfaces/test_self_contained.py (and add the line to its detector tests) rather than skipping the file."""


@dataclass(frozen=True)
class Finding:
    line: int
    rule: str
    text: str


# Where a path starts: not in the middle of a word or host name, a longer path (`a/tmp/`,
# `file:///tmp`), a placeholder path (`<data>/tasks/<task>/work`), a base64 run (`+`, `/`, letters)
# or a variable expansion (`$TMP/`, `${X}/`, `$(pwd)/`).
_START = r"(?<![\w.~+\-/\\$})%>\]])"
_END = r"[^\s'\"`<>()\[\]{},;|*]*"
_MACHINE_PATH = re.compile(
    _START
    + r"(?P<path>(?:/(?:work|root|mnt)(?=[/\s'\"`),;:]|$)|/(?:home|Users)/[\w.\-]+|/(?:tmp)/|/(?:private/)?var/folders/)"
    + _END
    + ")"
)
# A drive letter, a colon and a folder after a backslash (escaped or not) or a slash; a backslash
# before n, t, r, u, x, ... is a string escape (`"A:\n"`), not a folder.
_WINDOWS_PATH = re.compile(r"(?<![\w\\/])(?P<path>[A-Z]:(?:\\\\?(?![ntrux0bfav\"'])|/)[A-Za-z0-9_]" + _END + ")")
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]*://" + _END)
_FILE_URI_MACHINE = re.compile(
    r"\bfile://(?:localhost)?(?P<path>/(?:work|root|mnt|home/[\w.\-]+|Users/[\w.\-]+)(?:/" + _END + r")?)(?![\w.\-])"
)
_CLIMB = re.compile(_START + r"(?P<path>(?:[\w\-][\w.\-]*[/\\])*\.\.[/\\][\w.\-/\\]*)")
_MARKDOWN_TARGET = re.compile(r"\]\(\s*<?(?P<target>[^)\s>]+)|\bhref=[\"'](?P<href>[^\"']+)")
_PARENTS_N = re.compile(r"\.parents\[(\d+)\]")
_PARENT = re.compile(r"\.parent\b")
_DIRNAME = re.compile(r"\bdirname\(")
_DOTDOT_PART = re.compile(r"[\"']\.\.[\"']")
_PAYLOAD = re.compile(r"\"data\":\s*\"(?P<b64>[A-Za-z0-9+/]{8,}={0,2})\"")


def outside_references(path: str, text: str) -> list[Finding]:
    """Every reference in `text` (the file at repository-relative `path`) to a path outside the repository."""
    where = PurePosixPath(path)
    depth = len(where.parts) - 1
    markdown = where.suffix.lower() in {".md", ".markdown"}
    python = where.suffix == ".py"
    findings: list[Finding] = []
    for number, line in enumerate(text.splitlines(), start=1):
        findings += [Finding(number, rule, found) for rule, found in _line_references(line, depth, markdown, python)]
        if where.suffix == ".json":
            for payload in _decoded_payloads(line):
                findings += [
                    Finding(number, f"{rule} (in a base64 payload)", found)
                    for rule, found in _line_references(payload, 0, False, False)
                ]
    return findings


def _line_references(line: str, depth: int, markdown: bool, python: bool) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    found += [("machine path in a file URI", m.group(0)) for m in _FILE_URI_MACHINE.finditer(line)]
    bare = _URL.sub(lambda m: " " * len(m.group(0)), line)  # URLs are not paths of this machine
    found += [("absolute machine path", m.group("path").rstrip(".:")) for m in _MACHINE_PATH.finditer(bare)]
    found += [("absolute machine path", m.group("path").rstrip(".:")) for m in _WINDOWS_PATH.finditer(bare)]
    link_spans = (
        [m.span("target") if m.group("target") else m.span("href") for m in _MARKDOWN_TARGET.finditer(bare)]
        if markdown
        else []
    )
    for m in _CLIMB.finditer(bare):
        in_link = any(start <= m.start() < end for start, end in link_spans)
        if _climbs_out(m.group("path"), depth if in_link else 0):
            found.append(("relative path climbs out of the repository", m.group("path")))
    if python and "__file__" in line and _file_levels(line) > depth + 1:
        found.append(("Path(__file__) climbs out of the repository", line.strip()))
    return found


def _climbs_out(relative: str, depth: int) -> bool:
    """Whether `relative`, resolved from a folder `depth` levels below the root, leaves the repository."""
    level = depth
    for part in re.split(r"[/\\]", relative):
        if part == "..":
            level -= 1
            if level < 0:
                return True
        elif part not in ("", "."):
            level += 1
    return False


def _file_levels(line: str) -> int:
    """How many folders up from the file a `__file__` expression goes (the file's own folder is 1)."""
    return (
        sum(int(n) + 1 for n in _PARENTS_N.findall(line))
        + len(_PARENT.findall(line))
        + len(_DIRNAME.findall(line))
        + len(_DOTDOT_PART.findall(line))
    )


def _decoded_payloads(line: str) -> list[str]:
    texts = []
    for m in _PAYLOAD.finditer(line):
        try:
            texts.append(base64.b64decode(m.group("b64"), validate=True).decode("utf-8"))
        except (binascii.Error, UnicodeDecodeError):
            continue  # binary payloads (compressed state, protobuf) carry no readable path
    return texts


def _tracked_files() -> list[str]:
    if shutil.which("git") is None:
        pytest.skip("git is not installed: cannot list the repository's tracked files")
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=REPO, capture_output=True, text=True)
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != REPO:
        pytest.skip(f"{REPO} is not the top of a git work tree (an unpacked sdist?): no tracked files to check")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
    return [name for name in listed.stdout.decode("utf-8").split("\0") if name]


def _read_text(path: Path) -> str | None:
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return None  # deleted in the work tree but still tracked, or a submodule
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


# --- the repository --------------------------------------------------------------------------------


def test_no_tracked_file_refers_to_a_path_outside_the_repository() -> None:
    tracked = _tracked_files()
    assert "tests/conftest.py" in tracked and "pyproject.toml" in tracked, tracked[:10]
    problems = []
    checked = 0
    for name in tracked:
        text = _read_text(REPO / name)
        if text is None:
            continue
        checked += 1
        problems += [f"{name}:{f.line}: {f.rule}: {f.text}" for f in outside_references(name, text)]
    assert checked > 100, f"only {checked} text files read: is the file listing broken?"
    assert not problems, "\n".join([*problems, "", HOW_TO_FIX])


def test_the_files_that_run_the_suite_are_checked_too() -> None:
    tracked = set(_tracked_files())
    assert {"tests/conftest.py", "Makefile", ".ci/run", "pyproject.toml", "README.md"} <= tracked
    for name in ("tests/conftest.py", "Makefile", ".ci/run", "pyproject.toml", "README.md"):
        assert outside_references(name, (REPO / name).read_text(encoding="utf-8")) == [], name


def test_markdown_links_point_at_files_in_the_repository() -> None:
    tracked = set(_tracked_files())
    folders = {str(parent) for name in tracked for parent in PurePosixPath(name).parents}
    broken = []
    for name in sorted(n for n in tracked if n.endswith(".md")):
        text = _read_text(REPO / name) or ""
        for number, line in enumerate(text.splitlines(), start=1):
            for m in _MARKDOWN_TARGET.finditer(line):
                target = (m.group("target") or m.group("href")).split("#", 1)[0]
                if not target or re.match(r"[A-Za-z][A-Za-z0-9+.\-]*:", target):
                    continue  # an anchor in the same page, or a URL
                resolved = posixpath.normpath(posixpath.join(str(PurePosixPath(name).parent), target))
                if resolved not in tracked and resolved not in folders:
                    broken.append(f"{name}:{number}: {target} is not a file of the repository")
    assert not broken, "\n".join([*broken, "", "Link to tracked files by their path relative to the linking file."])


# --- the detector itself ---------------------------------------------------------------------------
# Written with {up} for a climbing segment, {r} for a leading slash, {c} for a drive letter and {f} for
# the module's file name, so that this file does not trip its own check.


def _sample(line: str) -> str:
    return line.format(up=".." + "/", r="/", c="C" + ":", f="__" + "file__")


@pytest.mark.parametrize(
    ("path", "line", "rule"),
    [
        ("README.md", "Design: `{up}shared/DESIGN.md`.", "relative path climbs out of the repository"),
        ("docs/design.md", "see [the design]({up}{up}shared/DESIGN.md)", "relative path climbs out of the repository"),
        ("docs/notes.md", "cat `{up}shared/DESIGN.md` (prose is read from the root)", "relative path climbs out"),
        ("tests/test_x.py", 'data = Path("{up}shared/contract")', "relative path climbs out of the repository"),
        ("Makefile", "\tcp docs/{up}{up}x .", "relative path climbs out of the repository"),
        ("docs/HELPERS.md", "- Repo: {r}work/main (branch main).", "absolute machine path"),
        ("tests/conftest.py", 'ROOT = "{r}root/.pyenv/versions/3.11.7"', "absolute machine path"),
        ("docs/x.md", "clone into {r}home/alice/src/conductor", "absolute machine path"),
        ("docs/x.md", "clone into {r}Users/alice/src/conductor", "absolute machine path"),
        ("bench/x.py", 'OUT = "{r}tmp/bench-results.json"', "absolute machine path"),
        ("bench/x.py", "--out={r}tmp/bench.json", "absolute machine path"),
        ("docs/x.md", "{c}\\Users\\alice\\conductor", "absolute machine path"),
        ("tests/x.py", 'DATA = "{c}\\\\Users\\\\alice"', "absolute machine path"),
        ("tests/x.py", 'uri = "file://{r}work/main/tests/x.json"', "machine path in a file URI"),
        ("tests/conftest.py", 'D = Path({f}).resolve().parents[2] / "shared"', "Path({f}) climbs out"),
        ("tests/conftest.py", "D = Path({f}).parent.parent.parent", "Path({f}) climbs out"),
        ("bench/x.py", "D = os.path.dirname(os.path.dirname(os.path.dirname({f})))", "Path({f}) climbs out"),
    ],
)
def test_detector_finds_references_outside_the_repository(path: str, line: str, rule: str) -> None:
    findings = outside_references(path, _sample(line))
    assert [f.line for f in findings] == [1], findings
    assert findings[0].rule.startswith(_sample(rule)), findings


@pytest.mark.parametrize(
    ("path", "line"),
    [
        ("substrate/runner.py", "(the prompt is always `{r}bin/sh -c PROMPT`, cwd `<data>/tasks/<task>/work`):"),
        ("README.md", "Web UI on http://127.0.0.1:8233/namespaces/default/workflows"),
        ("README.md", "see https://github.com/jmagly/agentic-sandbox/tree/e901dc2/management{r}work/x"),
        ("docs/design.md", "the [README]({up}README.md) and the [costs](workflow-costs.md)"),
        ("docs/design.md", "the schema in `workflows/fleet_workload_v1/` and `./tests/{up}README.md`"),
        ("tests/test_x.py", '{{"kind": "log", "uri": "file://{r}tmp/log"}}'),
        ("tests/test_x.py", 'uri = f"file://{{path}}"'),
        ("substrate/x.py", 'subprocess.run(cmd, stdout=open("{r}dev/null", "w"))'),
        (".ci/run", "#!{r}usr/bin/env bash"),
        (".ci/run", 'cd "$(dirname "$0")/.."'),
        ("docs/ops.md", "install the unit as {r}etc/systemd/system/conductor.service; read {r}proc/self/status"),
        ("worker/connection.py", "the profile file (`~/.config/temporalio/temporal.toml`)"),
        ("worker/x.py", 'scratch = Path(tempfile.gettempdir()) / "conductor"; see $TMPDIR{r}tmp/x and ${{HOME}}{r}work'),
        ("workflows/x.py", "from ..contract import WorkloadRecord"),
        ("README.md", "conductor mission start|watch|show|stop|cancel ... and git log a..b"),
        ("tests/test_x.py", 'assert msg == "A:\\n" and re.match(r"\\d:\\\\", s)'),
        ("tests/conftest.py", 'EXAMPLES = Path(__file__).resolve().parents[1] / "worker" / "examples"'),
        ("bench/x.py", "_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))"),
        # {"uri":"file:///tmp/tmpabc/substrate/tasks/t/log"}, as a recorded history carries it
        ("tests/histories/x.json", '"data": "eyJ1cmkiOiJmaWxlOi8vL3RtcC90bXBhYmMvc3Vic3RyYXRlL3Rhc2tzL3QvbG9nIn0="'),
        ("tests/histories/x.json", '"data": "QUJD+{r}tmp{r}work{r}rootAAA+{r}tmp/x/{r}home/a="'),
        ("workflows/fleet_workload_v1/fixtures/x.json", '"uri": "file://{r}tmp/artifacts/result.json"'),
    ],
)
def test_detector_leaves_legitimate_content_alone(path: str, line: str) -> None:
    assert outside_references(path, _sample(line)) == []


def test_detector_decodes_base64_payloads_in_json() -> None:
    leaked = base64.b64encode(_sample('{{"workdir": "{r}work/main/.conductor"}}').encode()).decode()
    findings = outside_references("tests/histories/x.json", f'{{\n  "data": "{leaked}"\n}}')
    assert findings == [Finding(2, "absolute machine path (in a base64 payload)", _sample("{r}work/main/.conductor"))]
    # The same payload in a file that is not JSON is not decoded (and its raw base64 matches nothing).
    assert outside_references("docs/x.md", f'"data": "{leaked}"') == []


def test_detector_names_the_line_of_each_finding() -> None:
    text = _sample("fine\nDesign: {up}shared/DESIGN.md\nfine\nrepo at {r}work/main\n")
    assert [(f.line, f.text) for f in outside_references("README.md", text)] == [
        (2, _sample("{up}shared/DESIGN.md")),
        (4, _sample("{r}work/main")),
    ]


# --- the wheel -----------------------------------------------------------------------------------------

# Left out of the copy a wheel is built from: a stale build/ could supply files the current
# configuration no longer ships, and the rest is large or local.
_NOT_SOURCES = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".conductor", ".pytest_cache", ".hypothesis"
)


@pytest.mark.timeout(120)
def test_the_wheel_ships_the_contract_schema_and_fixtures(tmp_path: Path) -> None:
    if find_spec("pip") is None:
        pytest.skip("pip is not installed in this interpreter: cannot build a wheel")
    if not _can_build_wheels():
        pytest.skip(
            "building a wheel without build isolation needs setuptools>=70.1 (or the wheel package) "
            "here: run `pip install -e '.[dev]'`"
        )
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=_NOT_SOURCES)
    out = tmp_path / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(out), "."],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=110,
        env={**_clean_env(), "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = out.glob("mission_conductor-*.whl")
    package = "workflows/fleet_workload_v1/"
    expected = {
        f"{package}__init__.py": REPO / package / "__init__.py",
        f"{package}{fleet_workload_v1.SCHEMA_NAME}": REPO / package / fleet_workload_v1.SCHEMA_NAME,
        **{f"{package}fixtures/{name}": REPO / package / "fixtures" / name for name in fleet_workload_v1.FIXTURE_NAMES},
    }
    assert len(fleet_workload_v1.FIXTURE_NAMES) == 4
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        missing = sorted(set(expected) - names)
        assert not missing, f"{wheel.name} lacks {missing}; see [tool.setuptools.package-data] in pyproject.toml"
        for name, original in expected.items():
            assert archive.read(name) == original.read_bytes(), f"{name} in the wheel differs from the repository's"


def _can_build_wheels() -> bool:
    # Looked up without importing setuptools here: importing it into a process that has already
    # imported distutils trips setuptools' distutils shim.
    setuptools = find_spec("setuptools")
    if setuptools is None or setuptools.origin is None:
        return False
    return (Path(setuptools.origin).parent / "command" / "bdist_wheel.py").is_file() or find_spec("wheel") is not None


def _clean_env() -> dict[str, str]:
    # PYTHONPATH would let the build see this checkout's modules instead of the copy's.
    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
