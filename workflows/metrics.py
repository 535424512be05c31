"""The product's own metrics, recorded through Temporal's metric meter.

Workflows record through `workflow.metric_meter()`, which the SDK mutes while a workflow is
replayed, so a value is counted once however often its history is replayed; the worker's
runtime exports them with the SDK's own metrics (Prometheus `/metrics` when the worker is
given a metrics address, see `worker/metrics.py`). Names follow Prometheus conventions, as
Kueue's do (`kueue_pending_workloads`, `kueue_admission_wait_time_seconds`): counters end in
`_total`, durations are seconds.

Every instrument is created in one place, here, so the set of series an operator can rely on is
written down once (`docs/operations.md` lists them) and a test scrapes exactly these names.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from temporalio.common import MetricMeter

ADMISSION_QUEUED = "conductor_admission_requests_queued"
ADMISSION_HELD = "conductor_admission_leases_held"
ADMISSION_LIMIT = "conductor_admission_limit"
ADMISSION_WAIT = "conductor_admission_wait_seconds"
LEASE_EXPIRATIONS = "conductor_admission_lease_expirations_total"
PREEMPTIONS = "conductor_admission_preemptions_total"
MISSIONS = "conductor_missions_total"
DISPATCH_LATENCY = "conductor_workload_dispatch_seconds"

PRODUCT_METRICS = (
    ADMISSION_QUEUED, ADMISSION_HELD, ADMISSION_LIMIT, ADMISSION_WAIT,
    LEASE_EXPIRATIONS, PREEMPTIONS, MISSIONS, DISPATCH_LATENCY,
)


class AdmissionMetrics:
    """What one host group's admission singleton reports after every decision pass."""

    def __init__(self, meter: MetricMeter, host_group: str) -> None:
        meter = meter.with_additional_attributes({"host_group": host_group})
        self._queued = meter.create_gauge(ADMISSION_QUEUED, "Admission requests waiting in the queue.")
        self._held = meter.create_gauge(ADMISSION_HELD, "Leases held, per limit of the policy.")
        self._limit = meter.create_gauge(ADMISSION_LIMIT, "The policy's limit (absent: unlimited).")
        self._wait = meter.create_histogram_float(
            ADMISSION_WAIT, "Time from submission to admission.", "s",
        )
        self._expired = meter.create_counter(LEASE_EXPIRATIONS, "Leases that expired without renewal.")
        self._preempted = meter.create_counter(PREEMPTIONS, "Leases preempted or displaced by other work.")
        # Counters appear in the exposition from their first change; start them at zero so a
        # dashboard (and an alert on their rate) sees the series before the first expiry.
        self._expired.add(0)
        self._preempted.add(0)

    def decided(
        self,
        queued: int,
        usage: Iterable[tuple[str, int, int | None]],
        admitted_after: Iterable[float],
        expired: int,
        preempted: int,
    ) -> None:
        self._queued.set(queued)
        for label, used, maximum in usage:
            attributes = {"limit": label}
            self._held.set(used, attributes)
            if maximum is not None:
                self._limit.set(maximum, attributes)
        for seconds in admitted_after:
            self._wait.record(max(0.0, seconds))
        if expired:
            self._expired.add(expired)
        if preempted:
            self._preempted.add(preempted)


def mission_closed(meter: MetricMeter, host_group: str, parent_state: str) -> None:
    meter.create_counter(MISSIONS, "Missions closed, by how they ended.").add(
        1, {"host_group": host_group, "verdict": parent_state},
    )


def workload_dispatched(meter: MetricMeter, kind: str, started_at: datetime, dispatched_at: datetime) -> None:
    """From the workload workflow's start (its lease current) to its task running on the executor."""
    meter.create_histogram_float(DISPATCH_LATENCY, "Time from a workload's start to its task's dispatch.", "s").record(
        max(0.0, (dispatched_at - started_at).total_seconds()), {"kind": kind},
    )
