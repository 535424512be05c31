"""A fault-injecting TCP proxy on loopback, for bench/chaos.py.

    .venv/bin/python -m bench.faultproxy --target 127.0.0.1:PORT --mode http [--http-503 0.1] [--drop 0.05]
    .venv/bin/python -m bench.faultproxy --target 127.0.0.1:PORT --mode tcp [--drop 0.1] [--reset 0.3] [--latency-ms 0:20]

It listens on 127.0.0.1 only (`--port`, 0 picks a free one) and connects only to a loopback
target, prints `faultproxy listening on 127.0.0.1:PORT` once bound, and stops by itself after
`--max-seconds` (or on SIGTERM/SIGINT), printing one line `faultproxy stats {...}` (JSON counts).

- `--mode http` (in front of the substrate): HTTP/1.1 is parsed request by request, so faults hit
  single requests on a kept-alive connection. A fraction `--http-503` is answered 503 by the
  proxy without reaching the target; a fraction `--drop` has its connection cut, half of them
  before the request is forwarded and half after the target has answered (the request took
  effect, the client never hears so: what a retry must survive without doing the work twice).
- `--mode tcp` (in front of Temporal's gRPC port): bytes are piped, each chunk delayed by a
  random `--latency-ms LOW:HIGH`; a fraction `--drop` of connections is reset as soon as it is
  accepted, and a fraction `--reset` is reset after a random lifetime of 1 to `--reset-after`
  seconds (RST, not FIN: as a crashed middlebox would).

Run without arguments it prints this text and exits 0 (`make bench` runs every bench/*.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import socket
import struct
import sys
import time
from collections import Counter

HOST = "127.0.0.1"
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
MAX_HEAD = 64 * 1024
READY_PREFIX = "faultproxy listening on "
STATS_PREFIX = "faultproxy stats "


class _Closed(Exception):
    """The peer closed (or broke) the connection."""


def _reset(writer: asyncio.StreamWriter | None) -> None:
    """Close with RST: SO_LINGER 0, then abort."""
    if writer is None:
        return
    sock = writer.get_extra_info("socket")
    try:
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    writer.transport.abort()


def _close(writer: asyncio.StreamWriter | None) -> None:
    if writer is not None and not writer.is_closing():
        writer.close()


class FaultProxy:
    def __init__(self, options: argparse.Namespace) -> None:
        self.options = options
        host, _, port = options.target.rpartition(":")
        if host.strip("[]") not in LOOPBACK:
            raise SystemExit(f"faultproxy: the target must be on loopback (got {options.target})")
        self.target = (host.strip("[]"), int(port))
        self.random = random.Random(options.seed)
        low, _, high = options.latency_ms.partition(":")
        self.latency = (float(low) / 1000, float(high or low) / 1000)
        self.stats: Counter[str] = Counter()
        self.tasks: set[asyncio.Task[None]] = set()

    # --- plumbing ---------------------------------------------------------------------------

    async def serve(self) -> None:
        handler = self.http_connection if self.options.mode == "http" else self.tcp_connection
        server = await asyncio.start_server(handler, HOST, self.options.port, reuse_address=True)
        port = server.sockets[0].getsockname()[1]
        print(f"{READY_PREFIX}{HOST}:{port} -> {self.target[0]}:{self.target[1]} ({self.options.mode})", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        started = time.monotonic()
        try:
            await asyncio.wait_for(stop.wait(), self.options.max_seconds)
        except TimeoutError:
            self.stats["stopped_at_max_seconds"] += 1
        server.close()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.stats["seconds"] = round(time.monotonic() - started)
        print(STATS_PREFIX + json.dumps(dict(sorted(self.stats.items()))), flush=True)

    def _track(self) -> None:
        task = asyncio.current_task()
        if task is not None:
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        try:
            return await asyncio.wait_for(asyncio.open_connection(*self.target), 5)
        except (OSError, TimeoutError):
            self.stats["upstream_unreachable"] += 1
            return None

    # --- tcp --------------------------------------------------------------------------------

    async def tcp_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._track()
        self.stats["connections"] += 1
        options = self.options
        if self.random.random() < options.drop:
            self.stats["reset_at_accept"] += 1
            _reset(writer)
            return
        upstream = await self._upstream()
        if upstream is None:
            _reset(writer)
            return
        up_reader, up_writer = upstream
        lifetime = None
        if self.random.random() < options.reset:
            lifetime = self.random.uniform(1.0, options.reset_after)
        pipes = [
            asyncio.ensure_future(self._pipe(reader, up_writer, "bytes_up")),
            asyncio.ensure_future(self._pipe(up_reader, writer, "bytes_down")),
        ]
        try:
            done, _ = await asyncio.wait(pipes, timeout=lifetime, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                self.stats["reset_after_lifetime"] += 1
                _reset(writer)
                _reset(up_writer)
            else:
                # One side finished: let the other drain briefly, then close both.
                await asyncio.wait(pipes, timeout=1)
                _close(writer)
                _close(up_writer)
        finally:
            for pipe in pipes:
                pipe.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)
            _close(writer)
            _close(up_writer)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, counter: str) -> None:
        low, high = self.latency
        try:
            while True:
                chunk = await reader.read(65536)
                if not chunk:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                if high > 0:
                    await asyncio.sleep(self.random.uniform(low, high))
                writer.write(chunk)
                await writer.drain()
                self.stats[counter] += len(chunk)
        except (OSError, RuntimeError):
            return

    # --- http -------------------------------------------------------------------------------

    async def http_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._track()
        self.stats["connections"] += 1
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            while True:
                try:
                    head, body = await _read_message(reader, request=True)
                except _Closed:
                    return
                self.stats["requests"] += 1
                method = head.split(b" ", 1)[0].upper()
                roll = self.random.random()
                if roll < self.options.http_503:
                    self.stats["answered_503"] += 1
                    writer.write(_unavailable())
                    await writer.drain()
                    continue
                drop_after = False
                if roll < self.options.http_503 + self.options.drop:
                    if self.random.random() < 0.5:
                        self.stats["dropped_before_forwarding"] += 1
                        _reset(writer)
                        return
                    drop_after = True
                if upstream is None:
                    upstream = await self._upstream()
                    if upstream is None:
                        _reset(writer)
                        return
                up_reader, up_writer = upstream
                up_writer.write(head + body)
                try:
                    await up_writer.drain()
                    response_head, response_body = await _read_message(up_reader, request=False, method=method)
                except (_Closed, OSError):
                    # The target closed a kept-alive connection (or died): so does the proxy.
                    self.stats["upstream_closed"] += 1
                    _reset(writer)
                    return
                if drop_after:
                    self.stats["dropped_after_forwarding"] += 1
                    _reset(writer)
                    return
                self.stats["forwarded"] += 1
                writer.write(response_head + response_body)
                await writer.drain()
                if _wants_close(head) or _wants_close(response_head):
                    return
        except (OSError, RuntimeError, ValueError):
            self.stats["connection_errors"] += 1
        finally:
            _close(writer)
            if upstream is not None:
                _close(upstream[1])


def _unavailable() -> bytes:
    body = json.dumps({"error": "proxy.unavailable", "message": "503 injected by bench/faultproxy.py"}).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nretry-after: 0\r\n\r\n"
    )
    return head.encode() + body


def _headers(head: bytes) -> dict[bytes, bytes]:
    headers = {}
    for line in head.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return headers


def _wants_close(head: bytes) -> bool:
    return _headers(head).get(b"connection", b"").lower() == b"close"


async def _read_message(reader: asyncio.StreamReader, *, request: bool, method: bytes = b"GET") -> tuple[bytes, bytes]:
    """One HTTP/1.1 message: its head (with the blank line) and its raw body (chunked kept as is)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as error:
        if error.partial.strip():
            raise ValueError("truncated HTTP head") from None
        raise _Closed() from None
    except asyncio.LimitOverrunError:
        raise ValueError("HTTP head too long") from None
    except OSError:
        raise _Closed() from None
    if len(head) > MAX_HEAD:
        raise ValueError("HTTP head too long")
    headers = _headers(head)
    if not request:
        status = int(head.split(b" ", 2)[1])
        if method == b"HEAD" or status in (204, 304) or 100 <= status < 200:
            return head, b""
    try:
        if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
            return head, await _read_chunked(reader)
        if b"content-length" in headers:
            return head, await reader.readexactly(int(headers[b"content-length"]))
        if request:
            return head, b""
        return head, await reader.read()  # delimited by the close
    except asyncio.IncompleteReadError:
        raise _Closed() from None


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts = []
    while True:
        size_line = await reader.readuntil(b"\r\n")
        parts.append(size_line)
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            while True:  # trailers, up to the blank line
                line = await reader.readuntil(b"\r\n")
                parts.append(line)
                if line == b"\r\n":
                    return b"".join(parts)
        parts.append(await reader.readexactly(size + 2))


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="HOST:PORT on loopback")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (127.0.0.1), 0 for a free one")
    parser.add_argument("--mode", choices=("http", "tcp"), required=True)
    parser.add_argument("--http-503", type=float, default=0.0, help="fraction of HTTP requests answered 503")
    parser.add_argument("--drop", type=float, default=0.0, help="fraction of requests (http) or connections (tcp) cut")
    parser.add_argument("--reset", type=float, default=0.0, help="tcp: fraction of connections reset after a while")
    parser.add_argument("--reset-after", type=float, default=10.0, help="tcp: longest lifetime before such a reset (s)")
    parser.add_argument("--latency-ms", default="0", help="tcp: per-chunk delay, LOW:HIGH milliseconds")
    parser.add_argument("--max-seconds", type=float, default=600.0, help="stop by itself after this long")
    parser.add_argument("--seed", type=int, default=None)
    options = parser.parse_args(argv)
    for name in ("http_503", "drop", "reset"):
        if not 0 <= getattr(options, name) <= 1:
            parser.error(f"--{name.replace('_', '-')} is a fraction between 0 and 1")
    asyncio.run(FaultProxy(options).serve())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
