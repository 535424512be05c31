"""Connecting to Temporal the way every Temporal tool does: environment configuration.

`temporalio.envconfig` reads the profile file (`~/.config/temporalio/temporal.toml`,
or `TEMPORAL_CONFIG_FILE`), `TEMPORAL_PROFILE`, `TEMPORAL_ADDRESS`,
`TEMPORAL_NAMESPACE`, TLS and `TEMPORAL_API_KEY`. Whatever it leaves unset falls
back to the local dev server that `conductor dev` starts. Every client uses the
pydantic data converter, as the workers and the replayer do.

The CLI's global flags (`conductor --address H:P --namespace NS --profile NAME ...`) are the
one override on top: `worker.cli.run` checks them (`ConnectionFlags.checked`) and holds them
with `using_flags` for the invocation, and `connect_options` applies them, so every command
that connects sees them. Precedence: flag > TEMPORAL_* variable > profile file > default.

The one retry policy of the clients here: a call is sent again only after a lost connection
(`transport_failure`) or the server's back-pressure (`server_busy`), never after an answer, and
with one `Backoff`. `resend` does that for a call that is safe to repeat as it is (a signal its
workflow takes once, a read); `Reconnect` carries any waiting call of the CLI through a Temporal
restart or a network break, announcing it, for `CONDUCTOR_RECONNECT_SECONDS` (60 s).
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client, RPCTimeoutOrCancelledError
from temporalio.envconfig import ClientConfig
from temporalio.service import RetryConfig, RPCError, RPCStatusCode

from worker.payloads import DATA_CONVERTER

T = TypeVar("T")

DEFAULT_ADDRESS = "127.0.0.1:7233"
DEFAULT_NAMESPACE = "default"


MAX_NAME_CHARS = 256  # a namespace or profile name given as a flag


class ConnectionSettingError(ValueError):
    """A connection flag's value cannot be used; the message is one line naming the flag."""


def check_address(value: str, source: str = "--address") -> str:
    """`value` if it is HOST:PORT (an IPv6 host in brackets) with a port 1-65535."""
    match = re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[^\s:\[\]/]+):([0-9]{1,5})", value)
    if match is None:
        raise ConnectionSettingError(
            f"{source} must be HOST:PORT (for example 127.0.0.1:7233), got {value!r}"
        )
    if not 1 <= int(match.group(2)) <= 65535:
        raise ConnectionSettingError(f"{source} must have a port from 1 to 65535, got {value!r}")
    return value


def check_name(value: str, source: str) -> str:
    """`value` if it is a usable namespace or profile name: non-empty, printable, at most 256 characters."""
    if not value or value.strip() != value:
        raise ConnectionSettingError(f"{source} must be a non-empty name without surrounding spaces, got {value!r}")
    if not value.isprintable():
        raise ConnectionSettingError(f"{source} must be printable characters only, got {value!r}")
    if len(value) > MAX_NAME_CHARS:
        raise ConnectionSettingError(f"{source} must be at most {MAX_NAME_CHARS} characters, got {len(value)}")
    return value


@dataclass(frozen=True)
class ConnectionFlags:
    """The CLI's global connection flags for one invocation (None: not given)."""

    address: str | None = None
    namespace: str | None = None
    profile: str | None = None

    @classmethod
    def checked(cls, address: str | None = None, namespace: str | None = None, profile: str | None = None) -> ConnectionFlags:
        """The flags, each validated (`ConnectionSettingError` on the first bad one)."""
        return cls(
            address=None if address is None else check_address(address),
            namespace=None if namespace is None else check_name(namespace, "--namespace"),
            profile=None if profile is None else check_name(profile, "--profile"),
        )

    def given(self) -> list[str]:
        return [f"--{name}" for name in ("address", "namespace", "profile") if getattr(self, name) is not None]


NO_FLAGS = ConnectionFlags()
_flags = NO_FLAGS  # one CLI invocation at a time per process; the workers never set it


@contextmanager
def using_flags(flags: ConnectionFlags) -> Iterator[None]:
    """Every `connect_options` / `connect` inside (any thread) applies `flags`."""
    global _flags
    previous, _flags = _flags, flags
    try:
        yield
    finally:
        _flags = previous


def connect_options(profile: str | None = None) -> dict[str, Any]:
    """`Client.connect` arguments: envconfig (profile file, then TEMPORAL_*), then the CLI's flags.

    `profile` (a command's own option) wins over the global `--profile`, which wins over
    TEMPORAL_PROFILE. A profile that cannot be loaded is a `ConnectionSettingError`.
    """
    flags = _flags
    chosen = profile if profile is not None else flags.profile
    try:
        options: dict[str, Any] = dict(ClientConfig.load_client_connect_config(profile=chosen))
    except Exception as error:  # the core's ConfigError: a missing profile, a file that is not TOML, ...
        raise ConnectionSettingError(f"cannot load the Temporal environment configuration: {one_line(error)}") from None
    if flags.address is not None:
        options["target_host"] = flags.address
    if flags.namespace is not None:
        options["namespace"] = flags.namespace
    options.setdefault("target_host", DEFAULT_ADDRESS)
    options.setdefault("namespace", DEFAULT_NAMESPACE)
    return options


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def refusal(error: RPCError) -> str:
    """The line for an answer the server gave that is a refusal: its message and status."""
    return f"the Temporal server refused: {' '.join(error.message.split())} ({error.status.name if error.status else 'no status'})"


class ServerUnreachable(ConnectionError):
    """`connect` could not reach the server (refused, reset, no such host): a wait may help."""


async def connect(profile: str | None = None, **overrides: Any) -> Client:
    try:
        options = {**connect_options(profile), **overrides}
    except ConnectionSettingError as error:
        raise ConnectionError(str(error)) from None
    target = options.pop("target_host")
    try:
        return await Client.connect(target, data_converter=DATA_CONVERTER, **options)
    except RuntimeError as error:
        raise (ServerUnreachable if _says_connection_lost(str(error)) else ConnectionError)(
            f"cannot reach Temporal at {target} (namespace {options.get('namespace')}): {error}. "
            "Start the local stack with `conductor dev`, or point --address / TEMPORAL_ADDRESS / a profile at your server."
        ) from None


async def connect_patiently(
    profile: str | None = None, seconds: float | str | None = None, *,
    announce: Callable[[str], None] | None = None, **overrides: Any,
) -> Client:
    """`connect`, tried again with backoff while the server is out of reach, for up to `seconds`.

    For a long-running process (the worker) started next to its server: a server still starting,
    or a connection reset while it is made, is a wait, not a reason to exit. A bad setting, or a
    server that stays out of reach past the reconnect bound, is still the one-line `ConnectionError`.
    """
    bound = reconnect_seconds(seconds)
    loop = asyncio.get_running_loop()
    started = loop.time()
    backoff = Backoff()
    announced = False
    while True:
        try:
            return await connect(profile, **overrides)
        except ServerUnreachable as error:
            delay = backoff.next()
            if loop.time() - started + delay > bound:
                raise
            if not announced:
                announced = True
                (announce or _to_stderr)(f"conductor: {error}; trying again for up to {bound:g} s ...")
        await asyncio.sleep(delay)


# --- riding out a lost server: a Temporal restart or a network break --------------------------

RECONNECT_ENV = "CONDUCTOR_RECONNECT_SECONDS"
DEFAULT_RECONNECT_SECONDS = 60.0
BACKOFF_FIRST = 0.5  # seconds; doubles after every failed probe ...
BACKOFF_CAP = 5.0  # ... up to this
PROBE_TIMEOUT = 5.0  # one "is the server there?" call, seconds at most

# For clients that wait on the operator's behalf (the CLI): the core's own retries (by default ten
# over ten seconds, logged as WARN lines on stderr from the sixth attempt on, or from half of a
# nonzero max_retries) stay short, so a lost server reaches `Reconnect`, which says so once and
# backs off within the operator's bound. Blips are still retried inside the call, with the call's
# own request id (a start stays deduplicated). max_retries=0 is "no count limit": the second bound
# alone stops the core after at most four attempts, below its warning threshold.
CLI_RETRY_CONFIG = RetryConfig(
    initial_interval_millis=200, multiplier=2.0, max_interval_millis=1000, max_elapsed_time_millis=1000, max_retries=0,
)

# How the core reports a connection that broke mid-call (status UNKNOWN) or could not be made.
_TRANSPORT_WORDS = (
    "transport error", "connect error", "error trying to connect", "connection refused", "connection reset",
    "connection closed", "connection error", "broken pipe", "h2 protocol", "dns error",
)


class ReconnectSettingError(ValueError):
    """CONDUCTOR_RECONNECT_SECONDS (or the matching argument) is not a usable number of seconds."""


class TemporalUnreachable(ConnectionError):
    """The server stayed out of reach for longer than the reconnect bound; the message is one line."""


def reconnect_seconds(value: float | str | None = None) -> float:
    """The reconnect bound: `value` if given, else $CONDUCTOR_RECONNECT_SECONDS, else 60 (0: never wait)."""
    source = "reconnect_seconds"
    if value is None:
        value = os.environ.get(RECONNECT_ENV, "").strip() or DEFAULT_RECONNECT_SECONDS
        source = RECONNECT_ENV
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ReconnectSettingError(f"{source} must be a number of seconds, got {value!r}") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise ReconnectSettingError(f"{source} must be a number of seconds, 0 or more, got {value!r}")
    return seconds


def transport_failure(error: BaseException) -> str | None:
    """Why `error` looks like a lost connection rather than an answer (None: it is an answer).

    UNAVAILABLE is the server not being there (or shutting down); UNKNOWN carries the core's
    "transport error" when a connection breaks mid-call. Timeouts and cancellations are
    ambiguous (a query nobody answers times out too), so `Reconnect` asks the server about them.
    """
    if isinstance(error, RPCError):
        if error.status == RPCStatusCode.UNAVAILABLE:
            return error.message or "server unavailable"
        if error.status == RPCStatusCode.UNKNOWN and _says_connection_lost(error.message):
            return error.message
    return None


def _says_connection_lost(message: str) -> bool:
    return any(word in message.lower() for word in _TRANSPORT_WORDS)


def server_busy(error: BaseException) -> str | None:
    """Why `error` is the server asking us to come back later (None: it is not).

    RESOURCE_EXHAUSTED is Temporal's back-pressure, not a refusal: for example "consistent query
    buffer is full" when queries arrive faster than a busy workflow's tasks can answer them, or a
    namespace's rate limit. Temporal's own clients retry it with backoff; so does `Reconnect`.
    """
    if isinstance(error, RPCError) and error.status == RPCStatusCode.RESOURCE_EXHAUSTED:
        return error.message or "resource exhausted"
    return None


def no_such_namespace(error: BaseException) -> bool:
    """A NOT_FOUND that is about the namespace, not the workflow asked for: no wait makes it exist."""
    if not isinstance(error, RPCError) or error.status != RPCStatusCode.NOT_FOUND:
        return False
    return any(detail.type_url.endswith("NamespaceNotFoundFailure") for detail in error.grpc_status.details)


def retryable(error: BaseException) -> str | None:
    """Why a call that failed with `error` may be sent again as it was: a lost connection or the
    server's back-pressure (None: the server answered, and the answer stands)."""
    return transport_failure(error) or server_busy(error)


class Backoff:
    """The delays between tries: BACKOFF_FIRST, doubling up to BACKOFF_CAP; `reset` after a success."""

    def __init__(self) -> None:
        self._delay = BACKOFF_FIRST

    def next(self) -> float:
        delay, self._delay = self._delay, min(self._delay * 2, BACKOFF_CAP)
        return delay

    def reset(self) -> None:
        self._delay = BACKOFF_FIRST


async def resend(operation: Callable[[], Awaitable[T]], *, until: float | None = None) -> T:
    """`await operation()`, sent again with backoff while it fails `retryable`, until the event
    loop's clock reaches `until` (None: for ever); then the last error. Only for an idempotent call:
    the repeat of one that did land must change nothing (a signal its workflow takes once, a read)."""
    loop = asyncio.get_running_loop()
    backoff = Backoff()
    while True:
        try:
            return await operation()
        except RPCError as error:
            if retryable(error) is None or (until is not None and loop.time() >= until):
                raise
        await asyncio.sleep(backoff.next() if until is None else min(backoff.next(), max(0.0, until - loop.time())))


def _ambiguous(error: BaseException) -> str | None:
    """A timeout or cancellation of the call itself: an outage only if the server is out of reach."""
    if isinstance(error, RPCError) and error.status in (RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED):
        return error.message or error.status.name.lower().replace("_", " ")
    if isinstance(error, RPCTimeoutOrCancelledError):
        cause = error.__cause__
        if isinstance(cause, asyncio.CancelledError) or cause is None:
            return None  # our own task was cancelled (Ctrl-C): never retried
        return transport_failure(cause) or _ambiguous(cause)
    return None


class Reconnect:
    """Repeats a call through a lost connection to Temporal, with backoff, for a bounded time.

    Only a lost connection (see `transport_failure`) and back-pressure (see `server_busy`, retried
    quietly with backoff) are repeated; any other answer the server gives, including a refusal,
    goes straight back to the caller. The first loss is announced once
    (`announce`, by default a line on stderr); the announcement is made again only after a
    call has succeeded since. If the server is not back within `seconds` of the loss,
    `TemporalUnreachable` says so in one line. The temporalio client reconnects by itself on
    its next call once the server answers, so a probe that succeeds means the call can be
    repeated; callers make that repeat safe (the same update id, a read of what landed).
    """

    def __init__(
        self, client: Client, seconds: float | str | None = None, *, announce: Callable[[str], None] | None = None,
    ) -> None:
        self.client = client
        self.seconds = reconnect_seconds(seconds)
        self._announce = announce or _to_stderr
        self._announced = False

    @property
    def address(self) -> str:
        return self.client.service_client.config.target_host

    async def call(self, operation: Callable[[], Awaitable[T]], doing: str) -> T:
        """`await operation()`, repeated after each lost connection, and after each "busy" answer
        (see `server_busy`) with backoff; `doing` words the give-up line."""
        busy_since: float | None = None
        busy = Backoff()
        while True:
            try:
                result = await operation()
            except Exception as error:
                too_busy = server_busy(error)
                if too_busy is not None:
                    now = asyncio.get_running_loop().time()
                    busy_since = now if busy_since is None else busy_since
                    if now - busy_since >= self.seconds:
                        raise TemporalUnreachable(
                            f"gave up {doing}: the Temporal server at {self.address} stayed too busy to answer "
                            f"for {self.seconds:g} s ({too_busy}); {RECONNECT_ENV} sets how long to wait"
                        ) from None
                    await asyncio.sleep(busy.next())
                    continue
                reason = await self.lost(error)
                if reason is None:
                    raise
                await self._ride_out(reason, doing)
                continue
            self._announced = False
            return result

    async def lost(self, error: BaseException) -> str | None:
        """Why `error` means the server is out of reach (None if it is an answer to act on)."""
        reason = transport_failure(error)
        if reason is not None:
            return reason
        reason = _ambiguous(error)
        if reason is not None and not await self.reachable():
            return reason
        return None

    async def reachable(self, timeout: float = PROBE_TIMEOUT) -> bool:
        """Whether the server answers a trivial call now (any answer counts, even a refusal)."""
        return await self._probe(timeout) is None

    async def _probe(self, timeout: float) -> str | None:
        """None if the server answers now, else why not."""
        try:
            await self.client.workflow_service.get_system_info(
                GetSystemInfoRequest(), retry=False, timeout=timedelta(seconds=max(timeout, 0.1)),
            )
        except RPCError as error:
            return transport_failure(error) or _ambiguous(error)
        return None

    async def _ride_out(self, reason: str, doing: str) -> None:
        loop = asyncio.get_running_loop()
        lost_at = loop.time()
        if self.seconds > 0 and not self._announced:
            self._announced = True
            self._announce(
                f"conductor: lost the Temporal server at {self.address} ({reason}); "
                f"reconnecting for up to {self.seconds:g} s ..."
            )
        backoff = Backoff()
        while True:
            remaining = self.seconds - (loop.time() - lost_at)
            if remaining <= 0:
                raise TemporalUnreachable(
                    f"gave up {doing}: the Temporal server at {self.address} did not come back within "
                    f"{self.seconds:g} s ({reason}); {RECONNECT_ENV} sets how long to wait"
                )
            await asyncio.sleep(min(backoff.next(), remaining))
            remaining = self.seconds - (loop.time() - lost_at)
            still = await self._probe(min(PROBE_TIMEOUT, max(remaining, 0.1)))
            if still is None:
                return
            reason = still


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
