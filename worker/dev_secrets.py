"""The dev stack's two substrate bearer tokens, generated once and kept in owner-only files.

Generating them on every start would strand whatever a previous run left behind (a
worker started with `conductor worker`, a shell that exported the `_FILE` variables);
keeping them in `<data>/secrets/` lets a restart reuse them. Only paths ever leave this
module for printing; the values go to the substrate's environment and, through the
`*_FILE` variables, to the worker (activities.credentials).
"""

from __future__ import annotations

import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from activities.credentials import EXECUTOR_TOKEN_ENV, FLEET_TOKEN_ENV, BearerToken, MissingCredential

FLEET_TOKEN_FILE = "fleet.token"
EXECUTOR_TOKEN_FILE = "executor.token"


@dataclass(frozen=True)
class TokenFiles:
    fleet: Path
    executor: Path

    def environment(self) -> dict[str, str]:
        """The variables that point a worker (or `conductor worker`) at these files."""
        return {f"{FLEET_TOKEN_ENV}_FILE": str(self.fleet), f"{EXECUTOR_TOKEN_ENV}_FILE": str(self.executor)}

    def read(self) -> tuple[BearerToken, BearerToken]:
        return _read(self.fleet), _read(self.executor)


def _read(path: Path) -> BearerToken:
    # Tighten rather than refuse: the file is ours, and a copy made with a loose umask
    # should not stop the stack; the secret itself is unchanged.
    if stat.S_IMODE(path.stat().st_mode) & 0o077:
        os.chmod(path, 0o600)
    text = path.read_text(encoding="utf-8")
    if not text.strip():
        raise MissingCredential(f"the token file {path} is empty; delete it and a new token is generated")
    return BearerToken(text)


def _create(path: Path) -> None:
    # O_EXCL + mode at creation: the secret is never readable by others, not even briefly.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(secrets.token_urlsafe(32) + "\n")


def ensure_token_files(secrets_dir: Path) -> TokenFiles:
    """Create the fleet and executor tokens in `secrets_dir` unless they exist; check they differ."""
    secrets_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(secrets_dir, 0o700)
    files = TokenFiles(fleet=secrets_dir / FLEET_TOKEN_FILE, executor=secrets_dir / EXECUTOR_TOKEN_FILE)
    for path in (files.fleet, files.executor):
        if not path.exists():
            _create(path)
    fleet, executor = files.read()
    if fleet == executor:
        raise MissingCredential(
            f"{files.fleet} and {files.executor} hold the same token, but each substrate plane must refuse "
            "the other's; delete one of them and a new token is generated"
        )
    return files
