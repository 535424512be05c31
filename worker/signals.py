"""Running a long-lived command until the operator stops it (Ctrl-C or SIGTERM).

Both signals set one event instead of raising `KeyboardInterrupt` wherever the code
happens to be, so shutdown runs in order from a single place. A signal that arrives
while the command is still starting is remembered and honoured as soon as start-up ends.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def stop_requested() -> Iterator[asyncio.Event]:
    """An event set by SIGINT/SIGTERM while the block runs (call from the event loop's thread)."""
    loop = asyncio.get_running_loop()
    event = asyncio.Event()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, event.set)
    try:
        yield event
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
