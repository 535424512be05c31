"""Waiting in real time for a condition that a workflow makes true eventually."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(check: Callable[[], Awaitable[T]], what: str, within: float = 30.0, interval: float = 0.05) -> T:
    """Poll `check()` until it returns something truthy and return that; fail naming `what`."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        value = await check()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last value {value!r}")
        await asyncio.sleep(interval)
