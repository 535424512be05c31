"""How a substrate is configured: where it keeps state, its two tokens, how many instances."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from activities.credentials import BearerToken, as_token
from substrate.runner import RunnerSettings, _utc_now

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8787
DEFAULT_DATA_DIR = Path(".conductor/substrate")


@dataclass(frozen=True)
class SubstrateConfig:
    """Tokens are `BearerToken`s (plain strings are wrapped), so the config can be printed safely."""

    fleet_token: BearerToken | str
    executor_token: BearerToken | str
    data_dir: Path = DEFAULT_DATA_DIR
    instances: int = 1
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    isolation_kinds: tuple[str, ...] = ("host",)
    kill_grace_seconds: float = 2.0
    daemon_settle_seconds: float = 0.5
    #: Wall clock used for cron schedules only (tests shift it to reach the next tick quickly).
    clock: Callable[[], datetime] = field(default=_utc_now, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fleet_token", as_token(self.fleet_token))
        object.__setattr__(self, "executor_token", as_token(self.executor_token))
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        if self.fleet_token == self.executor_token:
            raise ValueError(
                "the fleet (management) token and the executor (A2A) token must differ: "
                "each plane refuses the other's token"
            )
        if self.instances < 1:
            raise ValueError(f"instances must be at least 1 (got {self.instances})")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0-65535 (got {self.port})")

    @property
    def database(self) -> Path:
        return self.data_dir / "substrate.sqlite3"

    def runner_settings(self) -> RunnerSettings:
        assert isinstance(self.fleet_token, BearerToken) and isinstance(self.executor_token, BearerToken)
        return RunnerSettings(
            data_dir=self.data_dir.resolve(),
            kill_grace_seconds=self.kill_grace_seconds,
            daemon_settle_seconds=self.daemon_settle_seconds,
            secrets=(self.fleet_token.reveal(), self.executor_token.reveal()),
            clock=self.clock,
        )
