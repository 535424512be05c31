"""argparse types shared by the subcommands: a bad value is argparse's one line and exit 2."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def whole_number(minimum: int = 1, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse `type` for a whole number from `minimum` to `maximum` (no upper bound if None)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            bounds = f"{minimum} to {maximum}" if maximum is not None else f"at least {minimum}"
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {value}")
        return value

    return parse
