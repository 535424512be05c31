"""The CLI's one front door: every JSON input file, standard input and trace line comes in here.

Whatever arrives (any bytes, any size, any nesting), what leaves is either plain JSON data
within the limits of `workflows.limits`, or an `InputError` whose message is one line saying
what is wrong and how to fix it; `worker.cli.run` prints it as `conductor: <message>` and
exits 2. In order:

- size: at most `max_bytes` are read (one more, to tell that there is more), before parsing;
- encoding: UTF-8, strictly (a UTF-8 byte-order mark is skipped; the error names the offset);
- syntax: JSON, without NaN / Infinity, with each key once per object;
- shape: nested at most `MAX_JSON_DEPTH` deep (the parser's own recursion limit is caught too,
  so depth costs no stack), integers of at most `MAX_JSON_INTEGER_DIGITS` digits (Python's own
  4300-digit limit would otherwise raise from inside the parser), finite numbers, and no lone
  UTF-16 surrogate (`"\\ud800"`), which is not a character and cannot be written out again.

What the data means (a spec's fields, a policy's quotas) is the pydantic models' business.
"""

from __future__ import annotations

import codecs
import json
import math
import os
import re
import sys
from collections.abc import Iterator
from typing import IO, Any

from pydantic import TypeAdapter, ValidationError

from workflows.contract import json_path
from workflows.limits import (
    MAX_INPUT_FILE_BYTES,
    MAX_JSON_DEPTH,
    MAX_JSON_INTEGER_DIGITS,
    MAX_JSON_NUMBER_CHARS,
    MAX_TRACE_LINE_BYTES,
)

STDIN = "-"
STDIN_LABEL = "<stdin>"
MAX_MESSAGE_CHARS = 4000

_SURROGATE = re.compile("[\ud800-\udfff]")
_UTF16_BOMS = (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)  # UTF-32 LE starts like UTF-16 LE


class InputError(ValueError):
    """Input that cannot be used.

    `str(error)` is one line naming the input, what is wrong and how to fix it; `report` is
    the same without naming the input, for reports that name it themselves (`FILE: $: ...`).
    """

    def __init__(self, message: str, report: str | None = None) -> None:
        self.message = one_line(message)
        self.report = one_line(report if report is not None else message)
        super().__init__(self.message)


def one_line(text: str) -> str:
    """`text` as one printable line: newlines, control characters and lone surrogates escaped
    (an input's key or value may hold any of them), and at most MAX_MESSAGE_CHARS long."""
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[: MAX_MESSAGE_CHARS - 3] + "..."
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else ascii(char)[1:-1] for char in text)


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
        detail = f"more than {_size(max_bytes)}; a {what} may take at most {_size(max_bytes)}"
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
            yield InputError(f"longer than {_size(max_line_bytes)}; a line holds one operation: split it up")
        elif isinstance(line, bytes):
            try:
                yield _decode(line, None, strip_bom=first)
            except InputError as error:
                yield error
        else:
            yield line[1:] if first and line.startswith("\ufeff") else line
        first = False


# --- parsing ---------------------------------------------------------------------------------


def parse_json(raw: bytes | str, subject: str | None = None) -> Any:
    """`raw` as JSON data within the limits, or InputError; `subject` ("policy p.json") names
    the input in the message (None: the message is the report alone, e.g. for a trace line)."""
    text = _decode(raw, subject, strip_bom=True) if isinstance(raw, bytes) else raw.removeprefix("\ufeff")
    try:
        value = json.loads(
            text,
            parse_constant=_constant,
            parse_int=_integer,
            parse_float=_float,
            object_pairs_hook=_object,
        )
        _check_tree(value)
    except _NotJson as error:
        raise _error(subject, "is not JSON", "not valid JSON", str(error)) from None
    except _Refused as error:
        raise _error(subject, "is not usable JSON", "not usable JSON", str(error)) from None
    except json.JSONDecodeError as error:
        detail = (
            "it is empty; expected a JSON document" if not text.strip()
            else f"{error.msg} at line {error.lineno} column {error.colno}"
        )
        raise _error(subject, "is not JSON", "not valid JSON", detail) from None
    except RecursionError:
        raise _error(subject, "is not usable JSON", "not usable JSON", _too_deep()) from None
    return value


class _NotJson(ValueError):
    pass


class _Refused(ValueError):
    pass


def _error(subject: str | None, is_what: str, report_what: str, detail: str) -> InputError:
    report = f"{report_what}: {detail}"
    return InputError(f"{subject} {is_what}: {detail}" if subject else report, report)


def _decode(raw: bytes, subject: str | None, *, strip_bom: bool) -> str:
    if strip_bom and raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8):]
    if raw.startswith(_UTF16_BOMS):
        detail = "it starts with a UTF-16 byte-order mark; save it as UTF-8"
        raise _error(subject, "is not UTF-8 text", "not valid JSON: not UTF-8 text", detail)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        offset = error.start
        line = raw.count(b"\n", 0, offset) + 1
        detail = f"byte 0x{raw[offset]:02x} at offset {offset} (line {line}): {error.reason}; save it as UTF-8"
        raise _error(subject, "is not UTF-8 text", "not valid JSON: not UTF-8 text", detail) from None


def _constant(token: str) -> Any:
    raise _NotJson(f"{token} is not a JSON value (JSON has no NaN or Infinity): write a number")


def _integer(token: str) -> int:
    digits = len(token) - token.startswith("-")
    if digits > MAX_JSON_INTEGER_DIGITS:
        raise _Refused(
            f"an integer of {digits} digits ({token[:12]}...); numbers here have at most "
            f"{MAX_JSON_INTEGER_DIGITS} digits (64 bits)"
        )
    return int(token)


def _float(token: str) -> float:
    if len(token) > MAX_JSON_NUMBER_CHARS:
        raise _Refused(
            f"a number written with {len(token)} characters ({token[:12]}...); write it with at most "
            f"{MAX_JSON_NUMBER_CHARS}"
        )
    value = float(token)
    if not math.isfinite(value):
        raise _Refused(f"the number {token} is too large for a 64-bit float")
    return value


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _NotJson(f"the key {_quoted(key)} appears twice in one object; give each key once")
            seen.add(key)
    return result


def _check_tree(value: Any) -> None:
    """Depth and lone surrogates, without recursion (the tree may be as deep as the parser let it)."""
    stack: list[tuple[Any, int, tuple[int | str, ...]]] = [(value, 1, ())]
    while stack:
        item, depth, loc = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                raise _Refused(_surrogate(item, f"the string at {_where(loc)}"))
        elif isinstance(item, dict):
            if depth > MAX_JSON_DEPTH:
                raise _Refused(_too_deep())
            for key, child in item.items():
                if _SURROGATE.search(key):
                    raise _Refused(_surrogate(key, f"a key at {_where(loc)}"))
                stack.append((child, depth + 1, (*loc, key)))
        elif isinstance(item, list):
            if depth > MAX_JSON_DEPTH:
                raise _Refused(_too_deep())
            stack.extend((child, depth + 1, (*loc, index)) for index, child in enumerate(item))


def _too_deep() -> str:
    return (
        f"arrays and objects are nested more than {MAX_JSON_DEPTH} levels deep; no input here needs "
        "more than a few levels"
    )


def _surrogate(text: str, where: str) -> str:
    found = _SURROGATE.search(text)
    assert found is not None
    return (
        f"{where} holds {ascii(found.group())}, half of a UTF-16 surrogate pair, which is not a character; "
        "remove it, or escape the whole pair"
    )


def _where(loc: tuple[int | str, ...]) -> str:
    path = json_path(loc)
    return path if len(path) <= 200 else path[:197] + "..."


def _quoted(key: str) -> str:
    text = json.dumps(key)
    return text if len(text) <= 60 else text[:56] + '..."'


def _size(count: int) -> str:
    for unit, size in (("MiB", 1024 * 1024), ("KiB", 1024)):
        if count >= size and count % size == 0:
            return f"{count // size} {unit}"
    return f"{count} bytes"


# --- values given on the command line ----------------------------------------------------------


def check_argument(rule: Any, value: object, name: str) -> Any:
    """`value` of option or argument `name` (`--host-group`) validated by the pydantic type
    `rule`, the same type the model that carries it uses; InputError if it fails."""
    try:
        return TypeAdapter(rule).validate_python(value)
    except ValidationError as error:
        problems = "; ".join(item["msg"].removeprefix("Value error, ") for item in error.errors())
        shown = _quoted(value) if isinstance(value, str) else repr(value)
        raise InputError(f"{name} {shown} is not usable: {problems}") from None
