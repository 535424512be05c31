"""Process exit that survives the Temporal SDK's native threads.

The SDK's Rust core keeps Tokio threads alive past the end of `main`; during
CPython finalisation they can touch a torn-down interpreter and abort the
process (SIGSEGV / SIGABRT) *after* all work succeeded, turning a good exit code
into a crash. Once the core is loaded we flush and leave with `os._exit`,
which skips interpreter finalisation entirely.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

_BRIDGE_MODULE = "temporalio.bridge.temporal_sdk_bridge"


def temporal_core_loaded() -> bool:
    return _BRIDGE_MODULE in sys.modules


def exit_now(code: int) -> NoReturn:
    """Exit with `code`, skipping finalisation when the Temporal core is loaded."""
    if temporal_core_loaded():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
