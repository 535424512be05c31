"""How a substrate is configured: where it keeps state, its tokens, how many instances, its limits.

Tokens (`substrate/auth.py`): `fleet_token` is accepted with the admin role, `executor_token`
with the operator role, and `tokens` adds entries from a token file; together they make the
`TokenTable` the routes check. Either may be omitted when the other entries cover it.

`keep_workloads_on_stop`: whether stopping the substrate cleanly leaves its workload processes
running for the next start to re-adopt (the real server keeps tasks across a restart), or kills
them first. A crash always leaves them running; the next start re-adopts them (`runner.py`).

The limits bound what one request can make the substrate read, parse and store; input past one
is refused with a 4xx before it costs more than the limit (see `substrate/body.py`):

- `max_request_bytes` (1 MiB): a request body, checked against Content-Length before reading and
  counted while reading a chunked body; past it, 413 `http.payload_too_large`. A record is at most
  `max_record_bytes` and a dispatch message carries one shell command, so 1 MiB is far above any
  honest request and still a small, fixed amount of memory per connection.
- `max_json_depth` (64): nesting of arrays and objects, checked before parsing (400). Records and
  A2A messages nest about six levels; 64 leaves room for orchestrator metadata and stays far below
  Python's recursion limit, which a deeper document would reach in the parser, pydantic or the
  credential walk (the RecursionError that was an HTTP 500).
- `max_number_length` (64 characters): one JSON number, checked before parsing (400). Revisions are
  64-bit and a double needs at most 25 characters; a 5,000-digit integer made Python's int
  conversion limit raise (another HTTP 500). NaN and Infinity are not JSON and are refused too.
- `max_record_bytes` (256 KiB): a workload record's canonical JSON, checked at admission and on
  every observation before anything is stored (413 `fleet.record_too_large`). A record is a few
  KiB; the bound keeps the inventory (every record in one response) readable.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from substrate.auth import Role, RoleToken, Secret, TokenTable, as_secret
from substrate.fleet import DEFAULT_MAX_RECORD_BYTES  # defined beside the rule it bounds
from substrate.runner import RunnerSettings

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8787
DEFAULT_DATA_DIR = Path(".conductor/substrate")
DEFAULT_MAX_REQUEST_BYTES = 1024 * 1024
DEFAULT_MAX_JSON_DEPTH = 64
DEFAULT_MAX_NUMBER_LENGTH = 64


@dataclass(frozen=True)
class SubstrateConfig:
    """Tokens are `Secret`s (plain strings are wrapped), so the config can be printed safely."""

    fleet_token: Secret | str | None = None
    executor_token: Secret | str | None = None
    data_dir: Path = DEFAULT_DATA_DIR
    instances: int = 1
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    isolation_kinds: tuple[str, ...] = ("host",)
    kill_grace_seconds: float = 2.0
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH
    max_number_length: int = DEFAULT_MAX_NUMBER_LENGTH
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    #: More accepted tokens with their roles (a token file's entries).
    tokens: tuple[RoleToken, ...] = ()
    keep_workloads_on_stop: bool = False
    #: False: play an Agentic Sandbox built without the fleet router: 404 on /api/v2/fleet/*, A2A tasks
    #: only (a message naming a `child_id` runs as its runtime data says, with no record to check).
    fleet_api: bool = True

    def __post_init__(self) -> None:
        for name in ("fleet_token", "executor_token"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, as_secret(getattr(self, name)))
        object.__setattr__(self, "tokens", tuple(self.tokens))
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        if self.fleet_token is not None and self.fleet_token == self.executor_token:
            raise ValueError(
                "the fleet (admin) token and the executor (operator) token must differ: "
                "one token cannot hold both roles"
            )
        object.__setattr__(self, "_table", TokenTable(self.role_tokens()))  # raises TokenError (a ValueError)
        if self.instances < 1:
            raise ValueError(f"instances must be at least 1 (got {self.instances})")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0-65535 (got {self.port})")
        for name in ("max_request_bytes", "max_json_depth", "max_number_length", "max_record_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1 (got {getattr(self, name)})")

    def role_tokens(self) -> list[RoleToken]:
        entries = list(self.tokens)
        if isinstance(self.fleet_token, Secret):
            entries.append(RoleToken(self.fleet_token, Role.ADMIN))
        if isinstance(self.executor_token, Secret):
            entries.append(RoleToken(self.executor_token, Role.OPERATOR))
        return entries

    @property
    def token_table(self) -> TokenTable:
        return self._table  # type: ignore[attr-defined,no-any-return]

    @property
    def database(self) -> Path:
        return self.data_dir / "substrate.sqlite3"

    def runner_settings(self) -> RunnerSettings:
        return RunnerSettings(
            data_dir=self.data_dir.resolve(),
            kill_grace_seconds=self.kill_grace_seconds,
            keep_processes_on_stop=self.keep_workloads_on_stop,
            secrets=tuple(entry.secret.reveal() for entry in self.role_tokens()),
        )
