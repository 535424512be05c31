"""The embedded dev stack: Temporal dev server + local substrate + one worker, all on loopback.

`conductor dev` runs it until Ctrl-C; the demo and the tests use it as an async context
manager::

    async with DevStack(Path(".conductor")) as stack:
        await stack.client.start_workflow(..., task_queue=stack.task_queue)
        print(stack.ui_url, stack.substrate_url)

Everything lives under one data directory, so a second start finds the first one's
missions (SQLite for Temporal and the substrate) and reuses its bearer tokens::

    <data>/temporal.sqlite, temporal.log   Temporal dev server state and log
    <data>/substrate/                      substrate SQLite, task outputs, substrate.log
    <data>/secrets/{fleet,executor}.token  the two substrate tokens (0600, in a 0700 directory)
    <data>/audit.sqlite, ledger.sqlite     the worker's stores
    <data>/dev.lock                        held while a stack runs on this directory

Stopping goes in dependency order (worker, then substrate, then Temporal), also when
start-up fails half-way or the task is cancelled (Ctrl-C under `asyncio.run`), so no child
process outlives the stack.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import shlex
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from temporalio.client import Client

from activities.credentials import EXECUTOR_TOKEN_ENV, FLEET_TOKEN_ENV
from substrate.server import SubstrateProcess, spawn
from worker.config import WorkerConfig
from worker.dev_secrets import TokenFiles, ensure_token_files
from worker.devserver import DevServer, start_dev_server
from worker.host_groups import create_host_group
from worker.ports import claim
from worker.worker import build_worker
from workflows.admission.messages import ADMISSION_TASK_QUEUE
from workflows.mission.search import SEARCH_ATTRIBUTES

HOST = "127.0.0.1"
DEFAULT_DATA_DIR = Path(".conductor")
DEFAULT_TEMPORAL_PORT = 7233
DEFAULT_UI_PORT = 8233
DEFAULT_SUBSTRATE_PORT = 8787
DEFAULT_INSTANCES = 5
DEFAULT_NAMESPACE = "default"
LOCK_FILE = "dev.lock"
# Written while a stack runs (`conductor dev env` reads the first; the second is a Temporal envconfig file).
ENVIRONMENT_FILE = "env.json"
PROFILE_FILE = "temporal.toml"
DEFAULT_HOST_GROUP = "default"  # the host group MissionSpec.host_group defaults to
DEV_OPERATOR = "conductor-dev"  # who the admission audit says created it


class StackError(RuntimeError):
    """The stack cannot start as asked; the message says what to change (the cause is chained)."""


@contextlib.contextmanager
def _worker_environment(variables: Mapping[str, str], remove: Sequence[str]) -> Iterator[None]:
    """Set `variables` (and unset `remove`) while the worker reads its credentials, then restore.

    The fleet activities read their tokens from the process environment once, when the
    worker is built; the dev stack's token files must win over any token the calling
    shell exported for some other substrate, without changing that shell's environment
    for the rest of the process.
    """
    saved = {key: os.environ.get(key) for key in [*variables, *remove]}
    try:
        for key in remove:
            os.environ.pop(key, None)
        os.environ.update(variables)
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class DevStack:
    """Temporal dev server, local substrate and an in-process worker sharing one data directory.

    `start()` raises `StackError` for anything the operator can fix (the original error chained):
    ports are taken as given (a taken port is refused, naming the option that changes it);
    0 picks a free one. `run_worker=False` starts only the servers (e.g. to run `conductor
    worker` against them).
    """

    def __init__(
        self,
        data_dir: Path | str = DEFAULT_DATA_DIR,
        *,
        temporal_port: int = DEFAULT_TEMPORAL_PORT,
        ui_port: int = DEFAULT_UI_PORT,
        substrate_port: int = DEFAULT_SUBSTRATE_PORT,
        instances: int = DEFAULT_INSTANCES,
        task_queue: str = ADMISSION_TASK_QUEUE,
        namespace: str = DEFAULT_NAMESPACE,
        run_worker: bool = True,
        extra_workflows: Sequence[type] = (),
        worker_options: Mapping[str, Any] | None = None,
        startup_timeout: float = 60.0,
    ) -> None:
        if instances < 1:
            raise StackError(f"--instances must be at least 1 (got {instances})")
        for name, port in (("--port", temporal_port), ("--ui-port", ui_port), ("--substrate-port", substrate_port)):
            if not 0 <= port <= 65535:
                raise StackError(f"{name} must be 0-65535 (got {port})")
        self.data_dir = Path(data_dir).resolve()
        self.task_queue = task_queue
        self.namespace = namespace
        self.instances = instances
        self._ports = (temporal_port, ui_port, substrate_port)
        self._run_worker = run_worker
        self._extra_workflows = list(extra_workflows)
        self._worker_options = dict(worker_options or {})
        self._startup_timeout = startup_timeout
        self._exit: contextlib.AsyncExitStack | None = None
        self._server: DevServer | None = None
        self._substrate: SubstrateProcess | None = None
        self._client: Client | None = None
        self._tokens: TokenFiles | None = None

    # --- what callers use once started ------------------------------------------------------

    @property
    def client(self) -> Client:
        """A client for the dev server (namespace `self.namespace`, pydantic data converter)."""
        return self._require(self._client)

    @property
    def temporal_address(self) -> str:
        return self._require(self._server).address

    @property
    def ui_url(self) -> str:
        return self._require(self._server).ui_url

    @property
    def substrate_url(self) -> str:
        return self._require(self._substrate).base_url

    @property
    def token_files(self) -> TokenFiles:
        return self._require(self._tokens)

    @property
    def worker_config(self) -> WorkerConfig:
        return WorkerConfig(
            data_dir=self.data_dir, task_queue=self.task_queue, fleet_url=self.substrate_url, executor_url=self.substrate_url
        )

    @property
    def pids(self) -> dict[str, int]:
        """Child processes of the stack, by role (to check that none is left after a stop)."""
        return {"temporal": self._require(self._server).pid, "substrate": self._require(self._substrate).process.pid}

    def ended_unexpectedly(self) -> str | None:
        """Which child process has ended on its own while the stack runs (and where its log is), if any."""
        server, substrate = self._server, self._substrate
        if server is not None and server.process.poll() is not None:
            return f"the Temporal dev server exited with status {server.process.returncode}; see {server.log_path}"
        if substrate is not None and substrate.process.poll() is not None:
            log = self.data_dir / "substrate" / "substrate.log"
            return f"the substrate exited with status {substrate.process.returncode}; see {log}"
        return None

    def cli_environment(self) -> dict[str, str]:
        """What `conductor` (or `conductor worker`, or the `temporal` CLI) needs to use this stack.

        Token *paths* only: the values stay in their files.
        """
        return {
            "TEMPORAL_ADDRESS": self.temporal_address,
            "TEMPORAL_NAMESPACE": self.namespace,
            "CONDUCTOR_SUBSTRATE_URL": self.substrate_url,
            "CONDUCTOR_TASK_QUEUE": self.task_queue,
            "CONDUCTOR_DATA_DIR": str(self.data_dir),
            **self.token_files.environment(),
        }

    @staticmethod
    def _require(value: Any) -> Any:
        if value is None:
            raise StackError("the dev stack is not running; use `async with DevStack(...)` or `await stack.start()`")
        return value

    # --- lifecycle ------------------------------------------------------------------------------

    async def __aenter__(self) -> DevStack:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        if self._exit is not None:
            raise StackError("the dev stack is already running")
        self._exit = contextlib.AsyncExitStack()
        try:
            await self._start(self._exit)
        except BaseException as error:
            await self.stop()
            # One exception type for callers (`conductor dev`, the demo): a taken port, a server that
            # died while starting, an unreadable token file; the message already says what to do.
            if isinstance(error, (RuntimeError, OSError)) and not isinstance(error, StackError):
                raise StackError(str(error)) from error
            raise

    async def stop(self) -> None:
        """Stop everything that was started, newest first; safe to call twice."""
        exit_stack, self._exit = self._exit, None
        if exit_stack is not None:
            try:
                await exit_stack.aclose()
            finally:
                self._server = self._substrate = self._client = None

    async def _start(self, stack: contextlib.AsyncExitStack) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        stack.enter_context(self._lock())
        temporal_port, ui_port, substrate_port = self._claim_ports()
        self._tokens = ensure_token_files(self.data_dir / "secrets")

        server, client = await start_dev_server(
            self.data_dir,
            host=HOST,
            port=temporal_port,
            ui_port=ui_port,
            namespace=self.namespace,
            search_attributes=SEARCH_ATTRIBUTES,
            startup_timeout=self._startup_timeout,
        )
        stack.push_async_callback(asyncio.to_thread, server.stop)
        self._server, self._client = server, client

        fleet, executor = self._tokens.read()
        substrate = spawn(
            self.data_dir / "substrate",
            fleet,
            executor,
            instances=self.instances,
            host=HOST,
            port=substrate_port,
            startup_timeout=self._startup_timeout,
        )
        # Entered on a thread: spawning blocks until the child reports its URL.
        self._substrate = await asyncio.to_thread(substrate.__enter__)
        stack.push_async_callback(asyncio.to_thread, substrate.__exit__, None, None, None)

        if self._run_worker:
            with _worker_environment(self._tokens.environment(), remove=(FLEET_TOKEN_ENV, EXECUTOR_TOKEN_ENV)):
                worker = build_worker(
                    client, self.worker_config, extra_workflows=self._extra_workflows, **self._worker_options
                )
            await stack.enter_async_context(worker)
        await self._create_default_host_group(client)
        self._publish_environment()
        stack.callback(self._withdraw_environment)

    def _publish_environment(self) -> None:
        """What a second shell needs to use this stack (`eval "$(conductor dev env)"`), and a Temporal
        environment-configuration profile (`TEMPORAL_CONFIG_FILE=<data dir>/temporal.toml`) for the
        `temporal` CLI and any SDK; both say where things are, never a token (only the token files)."""
        environment = {**self.cli_environment(), "TEMPORAL_CONFIG_FILE": str((self.data_dir / PROFILE_FILE).resolve())}
        profile = (
            "# Written by `conductor dev` while its stack runs: the Temporal environment configuration of this stack.\n"
            f"[profile.default]\naddress = {json.dumps(self.temporal_address)}\nnamespace = {json.dumps(self.namespace)}\n"
        )
        for name, text in ((PROFILE_FILE, profile), (ENVIRONMENT_FILE, json.dumps(environment, indent=2) + "\n")):
            partial = self.data_dir / f".{name}.partial"
            partial.write_text(text, encoding="utf-8")
            partial.replace(self.data_dir / name)

    def _withdraw_environment(self) -> None:
        for name in (ENVIRONMENT_FILE, PROFILE_FILE):
            (self.data_dir / name).unlink(missing_ok=True)

    async def _create_default_host_group(self, client: Client) -> None:
        """Missions name a host group that an operator created (`conductor mission run` refuses any
        other): the dev stack creates `default`, with the worker's policy, as an operator would
        (`conductor admission policy set`), unless it runs already (then its policy stays)."""
        await create_host_group(
            client, self.task_queue, DEFAULT_HOST_GROUP, self.worker_config.policy_for(DEFAULT_HOST_GROUP), DEV_OPERATOR,
        )

    def _claim_ports(self) -> tuple[int, int, int]:
        temporal_port, ui_port, substrate_port = self._ports
        claimed: list[int] = []
        for port, what, option in (
            (temporal_port, "Temporal gRPC", "--port"),
            (ui_port, "Temporal Web UI", "--ui-port"),
            (substrate_port, "substrate", "--substrate-port"),
        ):
            chosen = claim(HOST, port, what, option)
            # Free ports are picked one by one; never hand the same one out twice.
            while port == 0 and chosen in claimed:
                chosen = claim(HOST, 0, what, option)
            if port != 0 and port in claimed:
                raise StackError(f"the {what} port {port} is also given to another service; give each its own")
            claimed.append(chosen)
        # The substrate binds port 0 itself and reports its URL: no window for another process.
        return claimed[0], claimed[1], 0 if substrate_port == 0 else claimed[2]

    @contextlib.contextmanager
    def _lock(self) -> Iterator[IO[str]]:
        """One stack per data directory: two Temporal servers on one SQLite file corrupt it."""
        handle = open(self.data_dir / LOCK_FILE, "a+", encoding="utf-8")
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "unknown"
                raise StackError(
                    f"another dev stack (pid {holder}) is using {self.data_dir}; stop it, or give this one "
                    "another --data-dir"
                ) from None
            handle.seek(0)
            handle.truncate()
            handle.write(f"{os.getpid()}\n")
            handle.flush()
            yield handle
        finally:
            handle.close()


def running_environment(data_dir: Path) -> dict[str, str]:
    """The environment of the stack running in `data_dir` (see `DevStack._publish_environment`);
    StackError if none runs there. A stack holds its data directory's lock for as long as it runs,
    so a file left by one that was killed is never taken for a running stack."""
    try:
        with open(data_dir / LOCK_FILE, "a+", encoding="utf-8") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                pass  # held: a stack runs here
            else:
                raise StackError(f"no dev stack is running in {data_dir}: start one with `conductor dev --data-dir {data_dir}`")
    except FileNotFoundError:
        raise StackError(f"no dev stack has run in {data_dir} (no such directory): start one with `conductor dev`") from None
    try:
        environment = json.loads((data_dir / ENVIRONMENT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise StackError(f"the dev stack in {data_dir} is still starting; ask again in a moment") from None
    return {str(name): str(value) for name, value in environment.items()}


def shell_exports(environment: Mapping[str, str]) -> str:
    """`export NAME=value` lines for a POSIX shell (bash, zsh, sh): `eval "$(conductor dev env)"`."""
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in sorted(environment.items()))
