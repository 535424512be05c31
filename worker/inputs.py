"""The CLI's one front door: every JSON input file, standard input and trace line comes in here.

Whatever arrives (any bytes, any size, any nesting), what leaves is either plain JSON data
within the limits of `workflows.limits`, or an `InputError` whose message is one line saying
what is wrong and how to fix it; `worker.cli.run` prints it as `conductor: <message>` and
exits 2. Size is checked here (at most `max_bytes` are read, one more to tell that there is
more, before parsing); encoding, syntax and shape by `workflows.json_input`, the parser the
workflows' own front door (`workflows.inbound`) uses too.

What the data means (a spec's fields, a policy's quotas) is the pydantic models' business.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import IO, Any

from pydantic import TypeAdapter, ValidationError

from workflows.json_input import InputError, decode_utf8, one_line, parse_json, quoted, size_text
from workflows.limits import MAX_INPUT_FILE_BYTES, MAX_TRACE_LINE_BYTES

__all__ = ["STDIN", "STDIN_LABEL", "InputError", "check_argument", "label", "one_line", "parse_json",
           "read_bytes", "read_json", "read_lines"]

STDIN = "-"
STDIN_LABEL = "<stdin>"


def label(source: str | os.PathLike[str]) -> str:
    return STDIN_LABEL if os.fspath(source) == STDIN else os.fspath(source)


# --- reading ---------------------------------------------------------------------------------


def read_json(source: str | os.PathLike[str], what: str, *, max_bytes: int = MAX_INPUT_FILE_BYTES) -> Any:
    """The JSON document in file `source` (`-`: standard input), `what` naming it in errors
    ("mission spec", "policy"); raises InputError."""
    return parse_json(read_bytes(source, what, max_bytes=max_bytes), f"{what} {label(source)}")


def read_bytes(source: str | os.PathLike[str], what: str, *, max_bytes: int = MAX_INPUT_FILE_BYTES) -> bytes:
    """At most `max_bytes` of file `source` (`-`: standard input); InputError if it cannot be
    read or holds more."""
    name = label(source)
    try:
        if os.fspath(source) == STDIN:
            data = _read_stdin(max_bytes + 1)
        else:
            with open(source, "rb") as handle:
                data = handle.read(max_bytes + 1)
    except OSError as error:
        reason = error.strerror or str(error)
        raise InputError(f"cannot read {what} {name}: {reason}", f"cannot read the file: {reason}") from None
    if len(data) > max_bytes:
        detail = f"more than {size_text(max_bytes)}; a {what} may take at most {size_text(max_bytes)}"
        raise InputError(f"{what} {name} is too large: {detail}", f"too large: {detail}")
    return data


def _read_stdin(limit: int) -> bytes:
    stream = sys.stdin
    if stream is None:
        raise OSError(0, "there is no standard input")
    binary = getattr(stream, "buffer", None)
    if binary is not None:
        return binary.read(limit)
    # A text stream without bytes underneath (tests, embedding): encode back; a lone surrogate
    # in it then fails the strict decode as it would have in bytes.
    return stream.read(limit).encode("utf-8", "surrogatepass")


def read_lines(stream: IO[Any], *, max_line_bytes: int = MAX_TRACE_LINE_BYTES) -> Iterator[str | InputError]:
    """Each line of a (binary or text) stream, decoded strictly; a line too long or not UTF-8
    comes as an InputError in its place, so a caller can report that line and read on. Memory
    stays bounded by `max_line_bytes`, however long a line is."""
    binary = getattr(stream, "buffer", stream)
    newline: str | bytes = "\n"
    if isinstance(binary.read(0), bytes):
        stream, newline = binary, b"\n"
    first = True
    while True:
        line = stream.readline(max_line_bytes + 1)
        if not line:
            return
        content = len(line) - (1 if line.endswith(newline) else 0)
        if content > max_line_bytes:
            while line and not line.endswith(newline):
                line = stream.readline(64 * 1024)
            yield InputError(f"longer than {size_text(max_line_bytes)}; a line holds one operation: split it up")
        elif isinstance(line, bytes):
            try:
                yield decode_utf8(line, None, strip_bom=first)
            except InputError as error:
                yield error
        else:
            yield line[1:] if first and line.startswith("\ufeff") else line
        first = False


# --- parsing ---------------------------------------------------------------------------------


# --- values given on the command line ----------------------------------------------------------


def check_argument(rule: Any, value: object, name: str) -> Any:
    """`value` of option or argument `name` (`--host-group`) validated by the pydantic type
    `rule`, the same type the model that carries it uses; InputError if it fails."""
    try:
        return TypeAdapter(rule).validate_python(value)
    except ValidationError as error:
        problems = "; ".join(item["msg"].removeprefix("Value error, ") for item in error.errors())
        shown = quoted(value) if isinstance(value, str) else repr(value)
        raise InputError(f"{name} {shown} is not usable: {problems}") from None
