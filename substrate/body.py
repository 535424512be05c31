"""Request bodies within the substrate's limits: bounded reading, then bounded JSON decoding.

Why here and not in pydantic: every limit must hold *before* the costly step it protects. The
body size is checked against Content-Length before a byte is read and counted while a chunked
body streams in (`BodyLimit`, 413 `http.payload_too_large`, connection closed so the rest is
never read). Nesting depth and number length are checked on the text before `json.loads`
(400 with the route's error code), because the parser itself is what a 100,000-level document
or a 5,000-digit integer breaks. The limits and their reasons: `substrate/config.py`.

Decoding also refuses what would break later steps: bytes that are not valid in the detected
encoding, NaN and Infinity (not JSON; `json.loads` accepts them by default), numbers that
overflow a double, and unpaired UTF-16 surrogate escapes (`"\\ud800"`), which no UTF-8 writer
(SQLite, the replay hash, the response) can encode.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from functools import cache
from itertools import accumulate
from typing import Any

from substrate.errors import SubstrateError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

JSON_MEDIA_TYPE = "application/json"


@dataclass(frozen=True)
class BodyLimits:
    max_request_bytes: int
    max_json_depth: int
    max_number_length: int


def payload_too_large(limit: int) -> SubstrateError:
    return SubstrateError(
        413, "http.payload_too_large", f"the request body is larger than the substrate's limit of {limit} bytes"
    )


# --- reading -------------------------------------------------------------------------------------


class BodyLimit:
    """ASGI middleware: no request body larger than `max_bytes` is read, declared or streamed."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            # Answer before reading anything; `connection: close` so the server never drains the rest.
            error = payload_too_large(self.max_bytes)
            await send_error(send, error.status, error.body())
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise payload_too_large(self.max_bytes)
            return message

        await self.app(scope, limited, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            # The HTTP parser (h11) has already refused a malformed or repeated Content-Length.
            text = value.decode("latin-1").strip()
            return int(text) if text.isascii() and text.isdigit() else None
    return None


async def send_error(send: Send, status: int, body: dict[str, Any], *, close: bool = True) -> None:
    """A JSON error response straight onto the ASGI channel (outside the routes' handlers)."""
    content = json.dumps(body, ensure_ascii=False).encode("utf-8")
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": content})


def check_media_type(content_type: str | None) -> None:
    """JSON routes take `application/json` (or `+json`); a body without a Content-Type is read as JSON."""
    if not content_type or not content_type.strip():
        return
    media = content_type.split(";", 1)[0].strip().lower()
    if media != JSON_MEDIA_TYPE and not (media.startswith("application/") and media.endswith("+json")):
        shown = media if len(media) <= 80 else media[:77] + "..."
        raise SubstrateError(
            415, "http.unsupported_media_type", f"the request body must be {JSON_MEDIA_TYPE} (got {shown!r})"
        )


# --- decoding ------------------------------------------------------------------------------------

# A JSON string, or an unterminated one up to the end. Possessive, and it always matches at a quote,
# so stripping strings is one linear pass whatever the input.
_STRING = re.compile(r'"[^"\\]*+(?:\\[\s\S][^"\\]*+)*+(?:"|\\?\Z)')
_NOT_BRACKET = re.compile(r"[^\[\]{}]++")
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


@cache
def _long_number(limit: int) -> re.Pattern[str]:
    """A run of number characters longer than `limit`, starting where a number can start."""
    return re.compile(r"(?<![-+.0-9eE])[-0-9][-+.0-9eE]{%d,}" % limit)


class _Refused(ValueError):
    pass


def _refuse_constant(name: str) -> object:
    raise _Refused(f"{name} is not a JSON number; send a finite number")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise _Refused(f"the number {text[:30]} is too large for a double")
    return value


def _depth(structure: str) -> int:
    """The deepest nesting of `structure` (JSON text with its strings emptied)."""
    brackets = _NOT_BRACKET.sub("", structure)
    return max(accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0)


def decode_json(raw: bytes, code: str, limits: BodyLimits) -> Any:
    """Decoded JSON, or a 400 `SubstrateError(code)` saying what is wrong with the body."""
    try:
        encoding = json.detect_encoding(raw)
        text = raw.decode(encoding)
    except UnicodeDecodeError as error:
        raise SubstrateError(
            400, code, f"the request body is not valid {error.encoding} text (at byte {error.start}); send UTF-8 JSON"
        ) from None
    structure = _STRING.sub('""', text)  # strings carry no nesting and no numbers
    if structure.count("[") + structure.count("{") > limits.max_json_depth:
        depth = _depth(structure)
        if depth > limits.max_json_depth:
            raise SubstrateError(
                400, code, f"the request body nests {depth} levels deep; the limit is {limits.max_json_depth}"
            )
    if _long_number(limits.max_number_length).search(structure):
        raise SubstrateError(
            400, code, f"the request body has a number longer than {limits.max_number_length} characters"
        )
    try:
        data = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except json.JSONDecodeError as error:
        raise SubstrateError(400, code, f"the request body is not JSON: {error}") from None
    except _Refused as error:
        raise SubstrateError(400, code, f"the request body is not JSON: {error}") from None
    except RecursionError:  # only when max_json_depth is configured above the interpreter's limit
        raise SubstrateError(400, code, "the request body nests too deeply to parse") from None
    if _SURROGATE_ESCAPE.search(text):
        try:
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise SubstrateError(
                400, code, "the request body has an unpaired UTF-16 surrogate escape (\\ud800-\\udfff)"
            ) from None
    return data
