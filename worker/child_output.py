"""A child's stdout, stderr and how it ended, from what its ledger entry points to.

Two ways an executor reports output, and both are read here, read-only and bounded:
- `file://` artifacts (`result` = stdout, `log` = stderr, as the local substrate wrote them):
  read only when the file is on this machine (the URI names no other host and the file is
  there), and only its tail;
- the executor plane, for a child whose ledger names its task (`lineage.task_id`) and whose
  artifacts are the executor's own (`sandbox://tasks/...`): `GET /agents/{target}/v1/tasks/{tid}`
  and `.../artifacts` (the real Agentic Sandbox serves both; output is `output_chunk`s by
  `stream`), with the executor-plane token from the environment (CONDUCTOR_EXECUTOR_TOKEN or
  its _FILE), which goes only into the Authorization header.
What cannot be read is said in a line instead (where the output is, and what reading it needs).
The ledger's own `output` (stdout as the workload workflow kept it) is the fallback for stdout.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote, urlparse

import httpx

from activities.credentials import MissingCredential, executor_token
from workflows.contract import Artifact
from workflows.mission.ledger import ChildLedger

STDERR_TAIL_LINES = 10  # `mission show`: the last lines of a failed child's stderr
STDERR_TAIL_BYTES = 4096
LOG_TAIL_BYTES = 256 * 1024  # `mission logs`: at most this much of each stream
EXECUTOR_TIMEOUT = 5.0  # seconds per read: `show` answers promptly even with the executor away

_EXIT_STATUS = re.compile(r"^process\.exit_status_(\d+)$")
_SIGNAL = re.compile(r"^process\.signal_(\d+)$")


@dataclass(frozen=True)
class StreamText:
    """One stream of a child (stdout or stderr): its text's tail, or why it cannot be read here."""

    stream: str
    text: str | None
    source: str = ""  # where it was read
    skipped: int = 0  # characters before the tail that are not shown
    problem: str | None = None


@dataclass
class ChildStreams:
    streams: list[StreamText] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)  # the executor's task status, when read

    def get(self, stream: str) -> StreamText | None:
        return next((item for item in self.streams if item.stream == stream), None)


# --- file:// ------------------------------------------------------------------------------------


def local_path(uri: str) -> str | None:
    """The local file a `file://` URI names, or None if it names another host or another scheme."""
    parsed = urlparse(uri)
    if parsed.scheme != "file" or parsed.netloc not in ("", "localhost"):
        return None
    return unquote(parsed.path)


def read_file_tail(uri: str, stream: str, max_bytes: int) -> StreamText:
    path = local_path(uri)
    if path is None:
        return StreamText(stream, None, uri, problem=f"{uri} is not a file on this machine; read it where the executor runs")
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            begin = max(0, size - max_bytes)
            handle.seek(begin)
            data = handle.read(size - begin)
    except OSError as error:
        return StreamText(stream, None, uri, problem=f"{uri} is not readable here ({error.strerror or error})")
    return StreamText(stream, data.decode("utf-8", errors="replace"), uri, skipped=begin)


def _tail(text: str, max_bytes: int) -> tuple[str, int]:
    """The end of `text`, at most about `max_bytes` (UTF-8), and how many characters are left out."""
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text, 0
    kept = data[-max_bytes:].decode("utf-8", errors="ignore")
    return kept, len(text) - len(kept)


# --- the executor plane --------------------------------------------------------------------------


class ExecutorReader:
    """Read-only GETs of a task and its artifacts on the executor plane."""

    def __init__(self, base_url: str, token: Any, *, timeout: float = EXECUTOR_TIMEOUT) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.AsyncClient(
            base_url=self.base_url, timeout=timeout, headers={"Authorization": f"Bearer {token.reveal()}"},
        )

    @classmethod
    def from_env(cls, base_url: str) -> tuple["ExecutorReader | None", str | None]:
        """A reader for `base_url` with the executor token from the environment, or why there is none."""
        try:
            token = executor_token()
        except MissingCredential as error:
            return None, f"to read it here, give the executor-plane token ({error})"
        return cls(base_url, token), None

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _get(self, path: str) -> Any:
        response = await self._http.get(path)
        if response.status_code != 200:
            raise RuntimeError(f"GET {path} answered {response.status_code}")
        return response.json()

    async def read(self, instance_id: str, task_id: str, max_bytes: int) -> ChildStreams:
        base = f"/agents/{quote(instance_id, safe='')}/v1/tasks/{quote(task_id, safe='')}"
        where = f"the executor at {self.base_url} (task {task_id})"
        result = ChildStreams()
        try:
            task = await self._get(base)
            status = task.get("status") if isinstance(task, dict) else None
            result.status = status if isinstance(status, dict) else {}
            listing = await self._get(f"{base}/artifacts")
        except (httpx.HTTPError, RuntimeError, ValueError) as error:
            problem = f"cannot read it from {where}: {error}"
            result.streams = [StreamText(stream, None, where, problem=problem) for stream in ("stdout", "stderr")]
            return result
        chunks: dict[str, list[tuple[int, str]]] = {}
        rows = listing.get("artifacts") if isinstance(listing, dict) else None
        for row in rows if isinstance(rows, list) else ():
            artifact = row.get("artifact") if isinstance(row, dict) else None
            if not isinstance(artifact, dict) or artifact.get("kind") != "output_chunk":
                continue
            stream, data, seq = artifact.get("stream"), artifact.get("data"), artifact.get("seq")
            if isinstance(stream, str) and isinstance(data, str):
                chunks.setdefault(stream, []).append((seq if isinstance(seq, int) else 0, data))
        for stream in ("stdout", "stderr"):
            parts = sorted(chunks.get(stream, []), key=lambda part: part[0])
            text, skipped = _tail("".join(data for _, data in parts), max_bytes)
            result.streams.append(StreamText(stream, text, where, skipped=skipped))
        return result


# --- one child -----------------------------------------------------------------------------------


def _file_artifact(child: ChildLedger, kind: str) -> Artifact | None:
    found = [item for item in child.artifacts if item.kind == kind and item.uri.startswith("file:")]
    return found[-1] if found else None


async def read_streams(
    child: ChildLedger, reader: ExecutorReader | None, reader_problem: str | None, max_bytes: int,
) -> ChildStreams:
    """The child's stdout and stderr (tails), from its file:// artifacts or its executor's task."""
    stdout_file, stderr_file = _file_artifact(child, "result"), _file_artifact(child, "log")
    if stdout_file is not None or stderr_file is not None:
        result = ChildStreams()
        for stream, item in (("stdout", stdout_file), ("stderr", stderr_file)):
            if item is not None:
                result.streams.append(read_file_tail(item.uri, stream, max_bytes))
    elif child.lineage is not None and child.lineage.task_id:
        task_id, target = child.lineage.task_id, child.lineage.target_id
        if reader is not None:
            result = await reader.read(target, task_id, max_bytes)
        else:
            problem = f"it is on the executor (task {task_id} on {target}); {reader_problem}"
            result = ChildStreams([StreamText(stream, None, "", problem=problem) for stream in ("stdout", "stderr")])
    else:
        result = ChildStreams()
    stdout = result.get("stdout")
    if child.output and (stdout is None or not stdout.text):
        text, skipped = _tail(child.output, max_bytes)
        kept = StreamText("stdout", text, "the ledger", skipped=skipped)
        result.streams = [kept, *(item for item in result.streams if item.stream != "stdout")]
    return result


def exit_text(child: ChildLedger, status: dict[str, Any] | None = None) -> str:
    """How the child's process ended: `exit status 3 (fleet.task_failed, failure): what the executor
    said`, from the executor's task status and the ledger's error code and exit classification."""
    code, status = child.error_code, status or {}
    exit_code = status.get("exit_code")
    how = None
    if isinstance(exit_code, int) and not isinstance(exit_code, bool):
        how = f"exit status {exit_code}"
    elif code and (match := _EXIT_STATUS.match(code)):
        how, code = f"exit status {match.group(1)}", None
    elif code and (match := _SIGNAL.match(code)):
        how, code = f"killed by signal {match.group(1)}", None
    codes = ", ".join(part for part in (code, child.exit_classification) if part)
    text = f"{how or 'no exit status reported'}{f' ({codes})' if codes else ''}"
    said = next((status[key] for key in ("summary", "error") if isinstance(status.get(key), str) and status[key]), None)
    return f"{text}: {printable(said)}" if said else text


def failure_lines(child: ChildLedger, streams: ChildStreams) -> list[str]:
    """What `conductor mission show` adds under a failed child: how it ended and its stderr's tail."""
    lines = [f"ended: {exit_text(child, streams.status)}"]
    stderr = streams.get("stderr")
    if stderr is None:
        lines.append("stderr: none reported")
    elif stderr.text is None:
        lines.append(f"stderr: {stderr.problem}")
    elif not stderr.text.strip():
        lines.append(f"stderr: empty ({stderr.source})")
    else:
        text_lines = stderr.text.splitlines()
        shown = text_lines[-STDERR_TAIL_LINES:]
        more = len(text_lines) > len(shown) or stderr.skipped > 0
        lines.append(f"stderr ({'last ' + str(len(shown)) + ' lines' if more else 'all of it'}, {stderr.source}):")
        lines.extend(f"| {printable(line)}" for line in shown)
    return lines


def printable(line: str) -> str:
    """Text from a child's output, safe to put in a terminal: control characters written as escapes."""
    return "".join(char if char.isprintable() or char == "\t" else f"\\x{ord(char):02x}" for char in line)


class LogPrinter:
    """What `conductor mission logs` prints of a child, again as its streams change (`--follow`):
    each stream once, then only what it has added."""

    def __init__(self, child_id: str, write) -> None:  # write(text): where the text goes
        self._child_id = child_id
        self._write = write
        self._printed: dict[str, str] = {}
        self._problems: dict[str, str] = {}

    def emit(self, streams: ChildStreams) -> bool:
        """Print what is new; True if anything was."""
        printed = False
        for item in streams.streams:
            if item.text is None:
                if self._problems.get(item.stream) != item.problem:
                    self._write(f"==> {self._child_id} {item.stream}: {item.problem} <==\n")
                    self._problems[item.stream] = item.problem or ""
                    printed = True
                continue
            before = self._printed.get(item.stream)
            if before == item.text or not item.text:
                continue
            if before is not None and item.text.startswith(before):
                self._write(item.text[len(before):])
            else:
                self._write(f"==> {self._child_id} {item.stream} ({item.source}) <==\n")
                if item.skipped:
                    self._write(f"[... {item.skipped} characters before these not shown ...]\n")
                self._write(item.text)
            if not item.text.endswith("\n"):
                self._write("\n")
            self._printed[item.stream] = item.text
            printed = True
        return printed
