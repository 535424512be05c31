"""Bearer tokens for the Agentic Sandbox planes, loaded from the environment or secret files.

Two different tokens exist on purpose: the management plane (fleet API, token A) and the
executor data plane (A2A, token B). A token is wrapped in `BearerToken` as soon as it is
read so that an accidental `print`, f-string, log record or pydantic dump shows `****`
instead of the secret; only `reveal()` (used when building the `Authorization` header)
returns the value. Tokens never travel anywhere else: not into workflow inputs, histories,
memos, ledgers or logs.

Sources, for each token (`CONDUCTOR_FLEET_TOKEN`, `CONDUCTOR_EXECUTOR_TOKEN`):
- an explicit file (e.g. a CLI `--fleet-token-file`), which wins when given;
- otherwise the variable itself, or `<VARIABLE>_FILE` naming a file that holds the token.
Setting both the variable and its `_FILE` variant is refused: silently preferring one
would hide a misconfiguration.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

FLEET_TOKEN_ENV = "CONDUCTOR_FLEET_TOKEN"
EXECUTOR_TOKEN_ENV = "CONDUCTOR_EXECUTOR_TOKEN"

#: Every environment variable that can carry a token; child processes never inherit them.
TOKEN_ENV_VARS = (
    FLEET_TOKEN_ENV,
    f"{FLEET_TOKEN_ENV}_FILE",
    EXECUTOR_TOKEN_ENV,
    f"{EXECUTOR_TOKEN_ENV}_FILE",
)


class MissingCredential(RuntimeError):
    """A token is absent, empty or unreadable; the message says how to provide it."""


class BearerToken:
    """A secret that does not show itself in reprs, f-strings or logs."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        value = value.strip()
        if not value:
            raise MissingCredential("a bearer token must not be empty")
        if any(ch.isspace() for ch in value):
            raise MissingCredential("a bearer token must not contain whitespace")
        self._value = value

    def reveal(self) -> str:
        """The raw token, for an `Authorization` header and nothing else."""
        return self._value

    def __repr__(self) -> str:
        return "BearerToken(****)"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BearerToken) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("BearerToken", self._value))

    def __reduce__(self) -> object:
        # Pickling would copy the secret into whatever stores the pickle.
        raise TypeError("BearerToken cannot be pickled")


def as_token(value: str | BearerToken) -> BearerToken:
    return value if isinstance(value, BearerToken) else BearerToken(value)


def _read_file(path: Path, what: str) -> BearerToken:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise MissingCredential(f"cannot read the {what} from {path}: {error.strerror}") from None
    if not text.strip():
        raise MissingCredential(f"the {what} file {path} is empty")
    return BearerToken(text)


def load_token(
    env_var: str,
    *,
    file: Path | str | None = None,
    environ: Mapping[str, str] | None = None,
) -> BearerToken:
    """Load one token from `file`, `$env_var` or `$env_var_FILE`, in that order."""
    env = os.environ if environ is None else environ
    what = f"token {env_var}"
    if file is not None:
        return _read_file(Path(file), what)
    direct = env.get(env_var)
    file_var = f"{env_var}_FILE"
    from_file = env.get(file_var)
    if direct and from_file:
        raise MissingCredential(f"both {env_var} and {file_var} are set; set only one of them")
    if direct:
        return BearerToken(direct)
    if from_file:
        return _read_file(Path(from_file), what)
    raise MissingCredential(
        f"{env_var} is not set: export {env_var}=<token> or {file_var}=<path to a file holding it>"
    )


def fleet_token(*, file: Path | str | None = None, environ: Mapping[str, str] | None = None) -> BearerToken:
    """The management-plane (fleet API) token."""
    return load_token(FLEET_TOKEN_ENV, file=file, environ=environ)


def executor_token(*, file: Path | str | None = None, environ: Mapping[str, str] | None = None) -> BearerToken:
    """The executor data-plane (A2A) token."""
    return load_token(EXECUTOR_TOKEN_ENV, file=file, environ=environ)
