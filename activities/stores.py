"""Which ledger and audit stores a worker or a CLI command uses: one URL decides.

CONDUCTOR_DATABASE_URL=postgresql://... (or postgres://...) selects the PostgreSQL stores, shared by
every worker that names the same database; unset, the stores are the SQLite files in the data
directory (embedded, one host). Any other value is refused in one line before anything starts,
because a typo silently falling back to local files would split the ledger across hosts.

URLs carry passwords, so every message and description here shows the URL redacted. psycopg is
imported only when PostgreSQL is selected: every `conductor` command reads the configuration, and
the driver's import costs about a tenth of a second.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from activities.audit_store import AsyncAuditStore, AuditStore, ThreadedAuditStore
from activities.store_errors import StoreUnavailable
from activities.ledger_store import AsyncLedgerStore, SqliteLedgerStore, ThreadedLedgerStore

if TYPE_CHECKING:
    from activities.postgres_stores import PostgresDatabase

DATABASE_URL_ENV = "CONDUCTOR_DATABASE_URL"
SCHEMES = ("postgresql", "postgres")
ACCEPTED = (
    "postgresql://USER:PASSWORD@HOST:PORT/DATABASE (or postgres://...; libpq URL parameters allowed), "
    "or unset it for the SQLite files in the data directory"
)

# user:password@ in the authority part (greedy up to the last @ before the path: a password may hold one).
_PASSWORD_IN_AUTHORITY = re.compile(r"^(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/@?#]*):(?P<password>[^/?#]*)@")
_PASSWORD_PARAMETER = re.compile(r"(?P<head>[?&]password=)(?P<password>[^&#]*)", re.IGNORECASE)


class DatabaseURLError(ValueError):
    """CONDUCTOR_DATABASE_URL cannot be used; the message is one line and shows the URL redacted."""


def redact(url: str) -> str:
    """The URL with any password replaced by ***, safe for logs and error messages."""
    url = _PASSWORD_IN_AUTHORITY.sub(r"\g<head>:***@", url)
    return _PASSWORD_PARAMETER.sub(r"\g<head>***", url)


def _scrub(message: str, url: str) -> str:
    """`message` (e.g. from libpq) with the URL's password removed wherever it appears, on one line."""
    secrets = [m.group("password") for m in (*_PASSWORD_IN_AUTHORITY.finditer(url), *_PASSWORD_PARAMETER.finditer(url))]
    for secret in secrets:
        if secret:
            message = message.replace(secret, "***")
    return " ".join(message.replace(url, redact(url)).split())


def check_database_url(url: str | None) -> str | None:
    """The URL if it selects PostgreSQL, None if unset or empty; `DatabaseURLError` otherwise."""
    if url is None or not url.strip():
        return None
    url = url.strip()
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme not in SCHEMES:
        raise DatabaseURLError(f"{DATABASE_URL_ENV}={redact(url)!r} is not a PostgreSQL URL: use {ACCEPTED}")
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(url)
    except psycopg.ProgrammingError as error:
        raise DatabaseURLError(
            f"{DATABASE_URL_ENV}={redact(url)!r} cannot be parsed ({_scrub(str(error), url)}): use {ACCEPTED}"
        ) from None
    ports = str(params.get("port") or "")
    if ports and not all(port.isdigit() for port in ports.split(",")):
        raise DatabaseURLError(f"{DATABASE_URL_ENV}={redact(url)!r} has a port that is not a number: use {ACCEPTED}")
    return url


@dataclass
class Stores:
    """The ledger and audit stores and what holds them open (a PostgreSQL pool, or nothing for SQLite)."""

    ledger: AsyncLedgerStore
    audit: AsyncAuditStore
    description: str
    _database: "PostgresDatabase | None" = None
    _url: str = field(default="", repr=False)
    _opened: bool = False

    @property
    def backend(self) -> str:
        return "sqlite" if self._database is None else "postgres"

    async def open(self) -> None:
        """Connect and migrate (PostgreSQL); idempotent. `StoreUnavailable` in one line if it cannot."""
        if self._opened or self._database is None:
            self._opened = True
            return
        import psycopg
        import psycopg_pool

        try:
            await self._database.open()
        except (psycopg.Error, psycopg_pool.PoolTimeout, OSError) as error:
            await self._database.close()
            reason = _scrub(str(error) or type(error).__name__, self._url)
            raise StoreUnavailable(f"cannot open the stores in {self.description} ({DATABASE_URL_ENV}): {reason}") from None
        self._opened = True

    async def close(self) -> None:
        if self._database is not None and self._opened:
            await self._database.close()
        self._opened = False

    async def __aenter__(self) -> "Stores":
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def select_stores(
    database_url: str | None, *, ledger_db: Path, audit_db: Path, existing_only: bool = False, pool_size: int = 10
) -> Stores:
    """The stores `database_url` names (checked as `check_database_url` does), else the SQLite files.

    `existing_only` is for readers (the CLI): a missing SQLite file is `StoreUnavailable` rather
    than an empty store created on the spot, which would hide a wrong data directory.
    """
    url = check_database_url(database_url)
    if url is not None:
        from activities.postgres_stores import PostgresAuditStore, PostgresDatabase, PostgresLedgerStore

        database = PostgresDatabase(url, max_size=pool_size)
        return Stores(
            ledger=PostgresLedgerStore(database), audit=PostgresAuditStore(database),
            description=f"PostgreSQL {redact(url)}", _database=database, _url=url,
        )  # fmt: skip
    if existing_only:
        for path in (ledger_db, audit_db):
            if not Path(path).is_file():
                raise StoreUnavailable(
                    f"no store at {path}: no worker has written there. Point CONDUCTOR_DATA_DIR at the worker's "
                    f"data directory, or set {DATABASE_URL_ENV} if the workers use PostgreSQL"
                )
    return Stores(
        ledger=ThreadedLedgerStore(SqliteLedgerStore(ledger_db)), audit=ThreadedAuditStore(AuditStore(audit_db)),
        description=f"SQLite files {ledger_db} and {audit_db}",
    )  # fmt: skip
