"""One URL selects the stores: CONDUCTOR_DATABASE_URL accepted, refused in one line, never echoed with its password."""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.stores import (
    DATABASE_URL_ENV,
    DatabaseURLError,
    StoreUnavailable,
    check_database_url,
    redact,
    select_stores,
)
from tests.support.cli_support import conductor_now
from worker.config import WorkerConfig
from worker.inputs import InputError

SECRET = "s3cr3t-pa55"


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://conductor:{SECRET}@db.internal:5432/conductor",
        f"postgres://conductor:{SECRET}@db.internal/conductor?sslmode=require",
        "postgresql:///conductor?host=/run/postgresql",
        "postgresql://a@h1:5432,h2:5433/db?target_session_attrs=read-write",
    ],
)
def test_postgresql_urls_select_postgres(url: str, tmp_path: Path) -> None:
    assert check_database_url(f"  {url} ") == url
    stores = select_stores(url, ledger_db=tmp_path / "l.sqlite", audit_db=tmp_path / "a.sqlite")
    assert stores.backend == "postgres" and SECRET not in stores.description and SECRET not in repr(stores)
    assert list(tmp_path.iterdir()) == []  # selecting connects to nothing and creates nothing


@pytest.mark.parametrize("value", [None, "", "   "])
def test_unset_keeps_the_embedded_sqlite_files(value: str | None, tmp_path: Path) -> None:
    assert check_database_url(value) is None
    env = {"CONDUCTOR_DATA_DIR": str(tmp_path)} | ({} if value is None else {DATABASE_URL_ENV: value})
    config = WorkerConfig.from_env(env)
    assert config.database_url is None
    stores = select_stores(config.database_url, ledger_db=config.ledger_db, audit_db=config.audit_db)
    assert stores.backend == "sqlite" and config.ledger_db.is_file() and config.audit_db.is_file()


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        (f"mysql://conductor:{SECRET}@db/conductor", "is not a PostgreSQL URL"),
        ("sqlite:///var/conductor/ledger.sqlite", "is not a PostgreSQL URL"),
        ("db.internal:5432", "is not a PostgreSQL URL"),
        (f"postgresql://conductor:{SECRET}@db/conductor?colour=blue", 'invalid URI query parameter: "colour"'),
        (f"postgresql://conductor:{SECRET}@db:fivefourthreetwo/conductor", "has a port that is not a number"),
        (f"postgres://conductor@db/conductor?password={SECRET}&bogus=1", "cannot be parsed"),
    ],
)
def test_a_bad_url_is_one_line_naming_the_variable_and_what_is_accepted(url: str, problem: str) -> None:
    with pytest.raises(DatabaseURLError) as caught:
        check_database_url(url)
    message = str(caught.value)
    assert message.startswith(f"{DATABASE_URL_ENV}=") and problem in message
    assert "postgresql://USER:PASSWORD@HOST:PORT/DATABASE" in message and "postgres://" in message
    assert SECRET not in message and "\n" not in message
    with pytest.raises(InputError, match=DATABASE_URL_ENV):  # the configuration refuses it the same way
        WorkerConfig.from_env({DATABASE_URL_ENV: url})


def test_redact_hides_passwords_wherever_a_url_carries_them() -> None:
    assert redact(f"postgresql://u:{SECRET}@h:5/db") == "postgresql://u:***@h:5/db"
    assert redact(f"postgresql://u:p@{SECRET}@h/db") == "postgresql://u:***@h/db"  # an unencoded @ in it
    assert redact(f"postgresql://u@h/db?sslmode=require&password={SECRET}") == (
        "postgresql://u@h/db?sslmode=require&password=***"
    )
    assert redact("postgresql://u@h/db") == "postgresql://u@h/db"


def test_conductor_worker_refuses_a_bad_url_in_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DATABASE_URL_ENV, f"postgresq://conductor:{SECRET}@db/conductor")
    result = conductor_now(capsys, "worker")
    assert result.code == 2 and DATABASE_URL_ENV in result.line and SECRET not in result.err


async def test_an_unreachable_database_is_one_line_without_the_password(tmp_path: Path) -> None:
    from worker.ports import free_port

    url = f"postgresql://conductor:{SECRET}@127.0.0.1:{free_port('127.0.0.1')}/conductor"
    stores = select_stores(url, ledger_db=tmp_path / "l.sqlite", audit_db=tmp_path / "a.sqlite")
    with pytest.raises(StoreUnavailable) as caught:
        await stores.open()
    message = str(caught.value)
    assert message.startswith("cannot open the stores in PostgreSQL postgresql://conductor:***@127.0.0.1:")
    assert DATABASE_URL_ENV in message and "refused" in message.lower()
    assert SECRET not in message and "\n" not in message
