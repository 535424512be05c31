"""Starting the substrate: in the foreground, in a background thread, or as a subprocess.

- `serve(config, ready=...)` runs uvicorn in the calling thread until SIGINT/SIGTERM (the CLI).
- `serve_in_thread(config)` is a context manager for tests and the embedded dev stack:
  it binds `config.port` (0 = a free port) before starting, so the URL is known, waits until
  the app has started (recovery done), yields a `RunningSubstrate` and stops it on exit.
- `spawn(...)` runs `python -m substrate serve` as a child process (tokens through the
  environment or a token file, never argv) and yields once it prints its URL; `kill()`
  simulates a crash.

Stopping runs the app's shutdown, which kills every workload process group unless the config
keeps them for the next start to re-adopt (`keep_workloads_on_stop`; see runner.py). `spawn`
stops them by default, so a dev stack or test leaves nothing behind; `conductor substrate
serve` keeps them, as the real server keeps its tasks across a restart.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from substrate.auth import EXECUTOR_TOKEN_ENV, FLEET_TOKEN_ENV, TOKEN_ENV_VARS, Secret, as_secret
from substrate.app import create_app
from substrate.config import SubstrateConfig
from substrate.procs import terminate

READY_PREFIX = "substrate listening on "


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP spelled out: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
    # accepted connections inherit it. With proto 0, Nagle held back each response's body behind
    # its headers until the client's delayed ACK: 40 ms added to every call.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.set_inheritable(False)
    return sock


def _url(sock: socket.socket, host: str) -> str:
    port = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def _uvicorn(config: SubstrateConfig) -> uvicorn.Server:
    return uvicorn.Server(
        uvicorn.Config(
            create_app(config),
            loop="asyncio",
            lifespan="on",
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=5,
            # Longer than the clients' pooled-connection expiry (httpx: 5 s): with equal timeouts
            # the server closes an idle connection just as a client reuses it, and the call fails.
            timeout_keep_alive=75,
        )
    )


def serve(config: SubstrateConfig, ready: Callable[[str], None] | None = None) -> None:
    """Run in the foreground until interrupted; `ready(base_url)` is called once serving."""
    sock = _bind(config.host, config.port)
    server = _uvicorn(config)

    async def main() -> None:
        async def announce() -> None:
            while not server.started:
                if server.should_exit:
                    return
                await asyncio.sleep(0.02)
            if ready is not None:
                ready(_url(sock, config.host))

        notifier = asyncio.create_task(announce())
        try:
            await server.serve(sockets=[sock])
        finally:
            notifier.cancel()

    try:
        asyncio.run(main())
    finally:
        sock.close()


@dataclass
class RunningSubstrate:
    base_url: str
    config: SubstrateConfig
    stop: Callable[[], None]


@contextmanager
def serve_in_thread(config: SubstrateConfig, *, startup_timeout: float = 15.0) -> Iterator[RunningSubstrate]:
    """Run the substrate on a background thread for the duration of the `with` block."""
    sock = _bind(config.host, config.port)
    server = _uvicorn(config)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as error:  # reported to the starting thread
            failure.append(error)

    thread = threading.Thread(target=run, name=f"substrate-{sock.getsockname()[1]}", daemon=True)
    thread.start()
    stopped = threading.Event()

    def stop() -> None:
        if stopped.is_set():
            return
        stopped.set()
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()

    try:
        deadline = startup_timeout
        while not server.started:
            if failure or not thread.is_alive():
                raise RuntimeError(f"the substrate did not start: {failure[0] if failure else 'thread ended'}")
            if deadline <= 0:
                raise RuntimeError(f"the substrate did not start within {startup_timeout} s")
            threading.Event().wait(0.01)
            deadline -= 0.01
        yield RunningSubstrate(_url(sock, config.host), config, stop)
    finally:
        stop()


@dataclass
class SubstrateProcess:
    base_url: str
    process: subprocess.Popen[str]

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM (graceful: kills workload processes) and wait."""
        return terminate(self.process, timeout)

    def kill(self) -> None:
        """SIGKILL, as a crash would: no shutdown runs."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


@contextmanager
def spawn(
    data_dir: Path,
    fleet_token: Secret | str | None = None,
    executor_token: Secret | str | None = None,
    *,
    token_file: Path | None = None,
    keep_workloads_on_stop: bool = False,
    instances: int = 1,
    host: str = "127.0.0.1",
    port: int = 0,
    startup_timeout: float = 30.0,
    extra_env: dict[str, str] | None = None,
    fleet_api: bool = True,
) -> Iterator[SubstrateProcess]:
    """Run `python -m substrate serve` as a child process; stopped (SIGTERM) on exit."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **(extra_env or {})}
    for variable in TOKEN_ENV_VARS:
        env.pop(variable, None)
    if fleet_token is not None:
        env[FLEET_TOKEN_ENV] = as_secret(fleet_token).reveal()
    if executor_token is not None:
        env[EXECUTOR_TOKEN_ENV] = as_secret(executor_token).reveal()
    command = [
        sys.executable, "-m", "substrate", "serve",
        "--host", host, "--port", str(port), "--data-dir", str(data_dir), "--instances", str(instances),
    ]  # fmt: skip
    if token_file is not None:
        command += ["--token-file", str(token_file)]
    if not keep_workloads_on_stop:
        command.append("--stop-workloads-on-exit")
    if not fleet_api:
        command.append("--no-fleet")
    log = open(data_dir / "substrate.log", "ab")
    process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=log,
        env=env,
        text=True,
        start_new_session=True,
    )
    log.close()
    handle: SubstrateProcess | None = None
    try:
        url = _await_ready(process, startup_timeout, data_dir / "substrate.log")
        handle = SubstrateProcess(url, process)
        yield handle
    finally:
        (handle or SubstrateProcess("", process)).stop()
        if process.stdout is not None:
            process.stdout.close()


def _await_ready(process: subprocess.Popen[str], timeout: float, log_path: Path) -> str:
    assert process.stdout is not None
    found: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith(READY_PREFIX):
                found.append(line[len(READY_PREFIX) :].split()[0])
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    if not found:
        process.kill()
        process.wait()
        tail = log_path.read_text(errors="replace")[-2000:] if log_path.exists() else ""
        raise RuntimeError(f"the substrate process did not report readiness within {timeout} s\n{tail}")
    return found[0]
