"""Who may call which plane: bearer tokens with roles, as the real server's operator auth has them.

The real server (`management/src/http/operator_auth.rs`) keeps one token file in which every
token carries a role, `admin` or `operator`. The fleet routes demand `admin` (403 for an
operator token); the executor plane takes any valid token. The substrate does the same, so a
worker configured for the substrate is configured for the real server: an admin token for the
fleet plane, an operator token for the executor plane, two bearer domains in practice.

The token file is TOML, the real server's format::

    [[tokens]]
    token = "..."
    role = "admin"

    [[tokens]]
    token = "..."
    role = "operator"

Where the real server skips an entry with an unknown role (with a warning), the substrate refuses
the whole file: a misspelt role would otherwise show up only as a worker's 401 much later. A
token given twice with two roles is refused too, since either answer would be a guess.

Only SHA-256 digests of the tokens are kept for checking (as the real server does), and a
presented token is compared against every entry with `hmac.compare_digest`, so neither the
answer's timing nor a memory dump gives a token away. Tokens never reach a log: `Secret`
prints as `****`.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import tomllib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from starlette.requests import Request

from substrate.errors import SubstrateError

#: The variables the substrate (and the worker, in `activities/credentials.py`) read tokens from.
FLEET_TOKEN_ENV = "CONDUCTOR_FLEET_TOKEN"
EXECUTOR_TOKEN_ENV = "CONDUCTOR_EXECUTOR_TOKEN"
TOKEN_FILE_ENV = "CONDUCTOR_SUBSTRATE_TOKEN_FILE"
#: Every variable that can carry a token or point at one; workload processes never inherit them.
TOKEN_ENV_VARS = (
    FLEET_TOKEN_ENV,
    f"{FLEET_TOKEN_ENV}_FILE",
    EXECUTOR_TOKEN_ENV,
    f"{EXECUTOR_TOKEN_ENV}_FILE",
    TOKEN_FILE_ENV,
)


class TokenError(ValueError):
    """A token or token file is unusable; the message says what is wrong and how to fix it."""


class Role(str, Enum):
    ADMIN = "admin"
    OPERATOR = "operator"


class Secret:
    """A bearer token that shows itself only through `reveal()`."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        value = value.strip()
        if not value:
            raise TokenError("a bearer token must not be empty")
        if any(ch.isspace() for ch in value):
            raise TokenError("a bearer token must not contain whitespace")
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret(****)"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and hmac.compare_digest(other._value.encode(), self._value.encode())

    def __hash__(self) -> int:
        return hash(("Secret", _digest(self._value)))

    def __reduce__(self) -> object:
        raise TypeError("a Secret cannot be pickled")


def as_secret(value: object) -> Secret:
    """A `Secret` from a string or from any token type with `reveal()` (the worker's `BearerToken`)."""
    if isinstance(value, Secret):
        return value
    if isinstance(value, str):
        return Secret(value)
    reveal = getattr(value, "reveal", None)
    if callable(reveal):
        return Secret(str(reveal()))
    raise TokenError(f"a bearer token must be a string, not {type(value).__name__}")


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode()).digest()


@dataclass(frozen=True)
class RoleToken:
    secret: Secret
    role: Role


class TokenTable:
    """Digests of the accepted tokens and their roles."""

    def __init__(self, entries: Iterable[RoleToken]) -> None:
        entries = list(entries)
        table: dict[bytes, Role] = {}
        for entry in entries:
            digest = _digest(entry.secret.reveal())
            known = table.get(digest)
            if known is not None and known != entry.role:
                raise TokenError(
                    f"one token is given both the {known.value} and the {entry.role.value} role; the tokens "
                    "must differ, one role each (an admin token for the fleet plane, an operator token for "
                    "the executor plane)"
                )
            table[digest] = entry.role
        if not table:
            raise TokenError("no bearer token is configured: give at least one admin token")
        self._entries = tuple(table.items())

    def resolve(self, presented: str) -> Role | None:
        """The role of `presented`, or None; looks at every entry whatever it finds."""
        digest = _digest(presented)
        found: Role | None = None
        for known, role in self._entries:
            if hmac.compare_digest(known, digest):
                found = role
        return found

    def roles(self) -> dict[Role, int]:
        counts = {role: 0 for role in Role}
        for _, role in self._entries:
            counts[role] += 1
        return counts

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        counts = self.roles()
        return f"TokenTable(admin={counts[Role.ADMIN]}, operator={counts[Role.OPERATOR]})"


# -- loading -----------------------------------------------------------------------------


def parse_token_file(path: Path) -> list[RoleToken]:
    """The entries of a TOML token file; `TokenError` with a one-line reason when it is malformed."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise TokenError(f"cannot read the token file {path}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise TokenError(f"the token file {path} is not UTF-8 text") from None
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        # The parser's message names a line and column, never the file's content.
        raise TokenError(f"the token file {path} is not valid TOML ({error}); see substrate/auth.py for the format") from None
    unknown = sorted(set(document) - {"tokens"})
    if unknown:
        raise TokenError(f"the token file {path} has unknown keys {unknown}; it holds only [[tokens]] entries")
    items = document.get("tokens")
    if not isinstance(items, list) or not items:
        raise TokenError(f"the token file {path} has no [[tokens]] entries; add one with token = \"...\" and role = \"admin\"")
    entries = []
    for number, item in enumerate(items, start=1):
        where = f"the token file {path}, entry {number}"
        if not isinstance(item, dict):
            raise TokenError(f"{where} is not a table; write it as [[tokens]] with token and role keys")
        extra = sorted(set(item) - {"token", "role"})
        if extra:
            raise TokenError(f"{where} has unknown keys {extra}; an entry has only token and role")
        token, role = item.get("token"), item.get("role")
        if not isinstance(token, str):
            raise TokenError(f"{where} has no token string; add token = \"...\"")
        if not isinstance(role, str) or role.strip().lower() not in {r.value for r in Role}:
            raise TokenError(f"{where}: role must be \"admin\" or \"operator\"")
        try:
            secret = Secret(token)
        except TokenError as error:
            raise TokenError(f"{where}: {error}") from None
        entries.append(RoleToken(secret, Role(role.strip().lower())))
    return entries


def _read_token(path: Path, what: str) -> Secret:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise TokenError(f"cannot read the {what} from {path}: {error.strerror}") from None
    if not text.strip():
        raise TokenError(f"the {what} file {path} is empty")
    try:
        return Secret(text)
    except TokenError as error:
        raise TokenError(f"the {what} file {path}: {error}") from None


def _env_token(env: Mapping[str, str], variable: str, file: Path | None) -> Secret | None:
    what = f"token {variable}"
    if file is not None:
        return _read_token(file, what)
    direct, from_file = env.get(variable), env.get(f"{variable}_FILE")
    if direct and from_file:
        raise TokenError(f"both {variable} and {variable}_FILE are set; set only one of them")
    if direct:
        try:
            return Secret(direct)
        except TokenError as error:
            raise TokenError(f"{variable}: {error}") from None
    if from_file:
        return _read_token(Path(from_file), what)
    return None


def load_tokens(
    *,
    token_file: Path | None = None,
    fleet_token_file: Path | None = None,
    executor_token_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[RoleToken]:
    """Every token the substrate accepts, from a token file and/or the two-token variables.

    The fleet token (`CONDUCTOR_FLEET_TOKEN`, or `--fleet-token-file`) gets the admin role, the
    executor token the operator role: the dev stack and the tests configure the substrate that
    way. A token file (`--token-file` or `CONDUCTOR_SUBSTRATE_TOKEN_FILE`) adds its entries.
    """
    env = os.environ if environ is None else environ
    entries: list[RoleToken] = []
    file = token_file if token_file is not None else (Path(env[TOKEN_FILE_ENV]) if env.get(TOKEN_FILE_ENV) else None)
    if file is not None:
        entries.extend(parse_token_file(file))
    fleet = _env_token(env, FLEET_TOKEN_ENV, fleet_token_file)
    executor = _env_token(env, EXECUTOR_TOKEN_ENV, executor_token_file)
    if fleet is not None:
        entries.append(RoleToken(fleet, Role.ADMIN))
    if executor is not None:
        entries.append(RoleToken(executor, Role.OPERATOR))
    if not entries:
        raise TokenError(
            f"no token configured: give --token-file (TOML with [[tokens]] token/role entries) or set "
            f"{FLEET_TOKEN_ENV} (admin) and {EXECUTOR_TOKEN_ENV} (operator), or their _FILE variants"
        )
    return entries


# -- checking requests -------------------------------------------------------------------


def require(table: TokenTable, role: Role | None, plane: str) -> Callable[[Request], Awaitable[None]]:
    """A route dependency: 401 without a valid bearer, 403 when `role` is needed and not held.

    A coroutine although it never awaits: FastAPI runs a plain `def` dependency in its thread
    pool, a thread hop on every request for a dictionary lookup."""

    async def check(request: Request) -> None:
        scheme, _, presented = request.headers.get("authorization", "").partition(" ")
        held = table.resolve(presented.strip()) if scheme.lower() == "bearer" and presented.strip() else None
        if held is None:
            raise SubstrateError(401, "auth.unauthorized", f"a valid bearer token is required for the {plane} plane")
        if role is not None and held is not role:
            raise SubstrateError(
                403, "auth.forbidden", f"the {plane} plane requires the `{role.value}` role; this token has `{held.value}`"
            )

    return check
