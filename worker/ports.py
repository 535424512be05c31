"""Loopback ports for the embedded dev stack: refuse a taken one, pick a free one only when asked.

Silently moving to another port when the default is taken would leave the CLI, the
worker and the Web UI bookmark pointing at whatever else holds that port, so a taken
port is an error naming the option that changes it. Port 0 means "any free port"
(tests, several stacks side by side).
"""

from __future__ import annotations

import socket


class PortInUse(RuntimeError):
    """A requested port is already bound; the message names the option that changes it."""


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def free_port(host: str) -> int:
    """A port the kernel considers free right now (for servers that cannot bind port 0 themselves)."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def claim(host: str, port: int, what: str, option: str) -> int:
    """`port` if it can be bound now (0: a free one); otherwise `PortInUse` saying how to change it.

    SO_REUSEADDR mirrors what the servers themselves do, so a port left in TIME_WAIT by the
    previous run is not mistaken for a taken one; a listening socket still is.
    """
    if port == 0:
        return free_port(host)
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as error:
            raise PortInUse(
                f"the {what} port {host}:{port} is already in use ({error.strerror}); stop whatever holds it "
                f"(another `conductor dev`?) or choose another port with {option} (0 picks a free one)"
            ) from None
    return port
