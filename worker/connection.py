"""Connecting to Temporal the way every Temporal tool does: environment configuration.

`temporalio.envconfig` reads the profile file (`~/.config/temporalio/temporal.toml`,
or `TEMPORAL_CONFIG_FILE`), `TEMPORAL_PROFILE`, `TEMPORAL_ADDRESS`,
`TEMPORAL_NAMESPACE`, TLS and `TEMPORAL_API_KEY`. Whatever it leaves unset falls
back to the local dev server that `conductor dev` starts. Every client uses the
pydantic data converter, as the workers and the replayer do.
"""

from __future__ import annotations

from typing import Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.envconfig import ClientConfig

DEFAULT_ADDRESS = "127.0.0.1:7233"
DEFAULT_NAMESPACE = "default"


def connect_options(profile: str | None = None) -> dict[str, Any]:
    options: dict[str, Any] = dict(ClientConfig.load_client_connect_config(profile=profile))
    options.setdefault("target_host", DEFAULT_ADDRESS)
    options.setdefault("namespace", DEFAULT_NAMESPACE)
    return options


async def connect(profile: str | None = None, **overrides: Any) -> Client:
    options = {**connect_options(profile), **overrides}
    target = options.pop("target_host")
    try:
        return await Client.connect(target, data_converter=pydantic_data_converter, **options)
    except RuntimeError as error:
        raise ConnectionError(
            f"cannot reach Temporal at {target} (namespace {options.get('namespace')}): {error}. "
            "Start the local stack with `conductor dev`, or point TEMPORAL_ADDRESS / a profile at your server."
        ) from None
