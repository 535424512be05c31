"""Prometheus metrics of a worker: the SDK runtime's own and the product's (`workflows/metrics.py`).

The Temporal SDK's runtime serves both on one `/metrics` endpoint when it is given a
Prometheus bind address, so nothing here writes the exposition format. The product's series
are named without the SDK's `temporal_` prefix (they are not Temporal's), and the SDK's
counters keep it.
"""

from __future__ import annotations

import ipaddress
import os

from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from workflows.metrics import ADMISSION_WAIT, DISPATCH_LATENCY

METRICS_ENV = "CONDUCTOR_METRICS_ADDRESS"

# The core's default buckets are for milliseconds; these series are in seconds. Admission waits
# run from instant to hours; a dispatch from milliseconds to about a minute.
SECONDS_BUCKETS = {
    ADMISSION_WAIT: [0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 14400],
    DISPATCH_LATENCY: [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
}


class MetricsSettingError(ValueError):
    """The metrics address is not HOST:PORT."""


def metrics_address(value: str | None = None, source: str = "--metrics-address") -> str | None:
    """`value`, else $CONDUCTOR_METRICS_ADDRESS, checked as HOST:PORT (None: serve no metrics)."""
    if value is None:
        value = os.environ.get(METRICS_ENV, "").strip() or None
        source = METRICS_ENV
    if value is None:
        return None
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    try:
        number = int(port)
        if host != "localhost":
            ipaddress.ip_address(host)
    except ValueError:
        number = -1
    if not sep or not host or not 0 < number < 65536:
        raise MetricsSettingError(
            f"{source} must be HOST:PORT with an IP address (or localhost) and a port 1-65535, "
            f"e.g. 127.0.0.1:9464, got {value!r}"
        )
    return value


def metrics_runtime(address: str) -> Runtime:
    """A runtime that serves Prometheus metrics at http://ADDRESS/metrics; its clients and
    workers report there. Raises `MetricsSettingError` if the address cannot be bound."""
    try:
        return Runtime(telemetry=TelemetryConfig(
            metrics=PrometheusConfig(bind_address=address, histogram_bucket_overrides=SECONDS_BUCKETS),
        ))
    except Exception as error:  # the core's bind failure, e.g. the port is taken
        raise MetricsSettingError(f"cannot serve metrics at {address}: {' '.join(str(error).split())}") from None
