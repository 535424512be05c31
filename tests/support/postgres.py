"""A throw-away PostgreSQL server for the store tests: initdb in a temporary directory, a free loopback port.

PostgreSQL refuses to run as root, and the test suite may run as root (CI containers), so then the
server runs as an unprivileged account (`postgres` if the distribution made one, else one this module
creates). Its data directory and unix socket live in a temporary directory that account owns; the
server listens on 127.0.0.1 only and is stopped, and its directory removed, when the session ends.
fsync is off: the tests check the stores' logic, and a crash of a test server loses nothing of value.

Where the server binaries are not installed the PostgreSQL tests are skipped with a reason saying how
to install them; `.ci/run` installs them and sets CONDUCTOR_REQUIRE_POSTGRES_TESTS=1, so CI never skips.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from worker.ports import free_port

MISSING = (
    "PostgreSQL 15 server binaries (initdb, pg_ctl) not found: apt-get install postgresql-15 "
    "(or postgresql), or put initdb and pg_ctl on PATH"
)
# Set by .ci/run: there, missing binaries fail the PostgreSQL tests instead of skipping them.
REQUIRE_ENV = "CONDUCTOR_REQUIRE_POSTGRES_TESTS"
SERVICE_ACCOUNT = "conductor-pg"
SUPERUSER = "conductor"


def server_binaries() -> Path | None:
    """The directory holding initdb and pg_ctl: PATH first, then Debian's versioned directories."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    for directory in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if Path(directory, "initdb").is_file() and Path(directory, "pg_ctl").is_file():
            return Path(directory)
    return None


def _account() -> pwd.struct_passwd | None:
    """Who runs the server: nobody special when we are not root, else an unprivileged account."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", SERVICE_ACCOUNT):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SERVICE_ACCOUNT],
        check=True, capture_output=True,
    )  # fmt: skip
    return pwd.getpwnam(SERVICE_ACCOUNT)


@dataclass(frozen=True)
class PostgresServer:
    host: str
    port: int
    password: str
    socket_dir: Path

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}:{self.password}@{self.host}:{self.port}/{database}"


def _runner(account: pwd.struct_passwd | None, binaries: Path):
    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        command = [str(binaries / argv[0]), *argv[1:]]
        if account is not None:
            command = ["runuser", "-u", account.pw_name, "--", *command]
        return subprocess.run(command, check=True, capture_output=True, text=True, timeout=120)

    return run


def start_server(binaries: Path) -> Iterator[PostgresServer]:
    """Start a server, yield it, stop it (a generator for a session fixture)."""
    account = _account()
    root = Path(tempfile.mkdtemp(prefix="conductor-pg-"))
    try:
        data, sockets = root / "data", root / "sockets"
        sockets.mkdir()
        password = secrets.token_hex(16)
        (root / "pwfile").write_text(password + "\n")
        if account is not None:
            for path in (root, sockets, root / "pwfile"):
                os.chown(path, account.pw_uid, account.pw_gid)
        run = _runner(account, binaries)
        run("initdb", "-D", str(data), "-U", SUPERUSER, f"--pwfile={root / 'pwfile'}", "--auth=scram-sha-256",
            "--encoding=UTF8", "--locale=C.UTF-8", "--no-sync")  # fmt: skip
        port = free_port("127.0.0.1")
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={sockets} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        run("pg_ctl", "-D", str(data), "-l", str(root / "server.log"), "-o", options, "-w", "-t", "60", "start")
        try:
            yield PostgresServer(host="127.0.0.1", port=port, password=password, socket_dir=sockets)
        finally:
            run("pg_ctl", "-D", str(data), "-m", "immediate", "-w", "stop")
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One server for the session (about a second to start); tests isolate themselves by database."""
    binaries = server_binaries()
    if binaries is None:
        if os.environ.get(REQUIRE_ENV) == "1":  # CI (.ci/run): a skipped store test would pass unseen
            pytest.fail(f"{MISSING} ({REQUIRE_ENV}=1)")
        pytest.skip(MISSING)
    yield from start_server(binaries)


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """The URL of a new, empty database: the test's own, as a tmp_path is for SQLite."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(postgres_server.url(), autocommit=True) as db:
        db.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return postgres_server.url(name)
