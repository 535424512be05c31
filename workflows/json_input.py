"""JSON as every input here is held to: the parser behind the CLI's front door (`worker.inputs`)
and behind the workflows' own (`workflows.inbound`), so that a document the CLI refuses is refused
by a workflow too, in the same words, whichever client sent it.

Whatever arrives (any bytes, any size, any nesting), what leaves is either plain JSON data within
the limits of `workflows.limits`, or an `InputError` whose message is one line saying what is wrong
and how to fix it:

- encoding: UTF-8, strictly (a UTF-8 byte-order mark is skipped; the error names the offset);
- syntax: JSON, without NaN / Infinity, with each key once per object;
- shape: nested at most `MAX_JSON_DEPTH` deep (the parser's own recursion limit is caught too,
  so depth costs no stack), integers of at most `MAX_JSON_INTEGER_DIGITS` digits (Python's own
  4300-digit limit would otherwise raise from inside the parser), finite numbers, and no lone
  UTF-16 surrogate (`"\\ud800"`), which is not a character and cannot be written out again.

Pure: imported by workflow code (inside the sandbox) and by the CLI alike.
"""

from __future__ import annotations

import codecs
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from workflows.contract import json_path
from workflows.limits import MAX_JSON_DEPTH, MAX_JSON_INTEGER_DIGITS, MAX_JSON_NUMBER_CHARS

MAX_MESSAGE_CHARS = 4000
JSON_ENCODING = b"json/plain"  # the payload encoding every client here writes JSON as

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


def parse_json(raw: bytes | str, subject: str | None = None) -> Any:
    """`raw` as JSON data within the limits, or InputError; `subject` ("policy p.json") names
    the input in the message (None: the message is the report alone, e.g. for a trace line)."""
    text = decode_utf8(raw, subject, strip_bom=True) if isinstance(raw, bytes) else raw.removeprefix("\ufeff")
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


def decode_utf8(raw: bytes, subject: str | None, *, strip_bom: bool) -> str:
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
                raise _NotJson(f"the key {quoted(key)} appears twice in one object; give each key once")
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


def quoted(key: str) -> str:
    text = json.dumps(key)
    return text if len(text) <= 60 else text[:56] + '..."'


def size_text(count: int) -> str:
    for unit, size in (("MiB", 1024 * 1024), ("KiB", 1024)):
        if count >= size and count % size == 0:
            return f"{count // size} {unit}"
    return f"{count} bytes"


@dataclass(frozen=True)
class Unreadable:
    """A payload the data converter could not read as JSON data (`worker.payloads`), and why in
    the CLI's words: a workflow's front door (`workflows.inbound`) refuses it with them."""

    why: str

    @classmethod
    def of(cls, encoding: bytes, data: bytes) -> Unreadable:
        if encoding != JSON_ENCODING:
            shown = encoding.decode("utf-8", "replace") or "no encoding"
            return cls(f"is a payload encoded as {shown!r}; send JSON (payload encoding json/plain)")
        try:
            parse_json(data)
        except InputError as error:
            return cls(f"is {error}")
        return cls("could not be read as JSON")
