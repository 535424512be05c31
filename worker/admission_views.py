"""How the admission workflow's query results look to a person (tables) and to a script (JSON).

JSON is the query's own rows, dumped by their pydantic models, so its keys are
exactly the workflow's boundary types and stay stable; tables are free to abbreviate.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from worker.tables import human_duration, render_table
from workflows.admission.messages import LeaseRow, QueueRow, UsageRow, WhatIf, constraint_words, rfc3339
from workflows.admission.model import AdmissionPolicy, AuditEvent


def as_json(value: BaseModel | Sequence[BaseModel]) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return [item.model_dump(mode="json") for item in value]


def queue_table(host_group: str, rows: Sequence[QueueRow]) -> str:
    if not rows:
        return f"queue is empty: nothing is waiting on host group {host_group}"
    return render_table(
        ["POS", "REQUEST", "REQUESTER", "PRIORITY", "EFFECTIVE", "WAITED", "ETA (UTC)", "BINDING CONSTRAINT"],
        [
            [row.position, row.request_id, row.requester, row.priority, row.effective_priority,
             human_duration(row.waited_seconds), "unknown" if row.eta is None else rfc3339(row.eta),
             constraint_words(row.binding_constraint)]
            for row in rows
        ],
        right=(0, 3, 4, 5),
    )


def expires_in(expires_at: datetime, now: datetime) -> str:
    left = (expires_at - now).total_seconds()
    return human_duration(left) if left >= 0 else f"overdue {human_duration(-left)}"


def leases_table(host_group: str, rows: Sequence[LeaseRow], now: datetime) -> str:
    if not rows:
        return f"no leases held on host group {host_group}"
    return render_table(
        ["REQUEST", "HOLDER", "ENVIRONMENT", "PROVIDER", "RUNTIME", "LANE", "LEASE REV", "EXPIRES IN", "PREEMPTIBLE"],
        [
            [row.request_id, row.holder, row.environment, row.provider, row.runtime_kind, row.lane,
             row.lease_revision, expires_in(row.lease_expires_at, now), "yes" if row.preemptible else "no"]
            for row in rows
        ],
        right=(6, 7),
    )


def held_line(host_group: str, policy: AdmissionPolicy) -> str | None:
    """What an operator must know first about a held host group."""
    if not policy.hold:
        return None
    why = f" ({policy.hold_reason})" if policy.hold_reason else ""
    return (f"host group {host_group} is HELD{why}: nothing new is admitted, leases run on; "
            f"`conductor admission resume --host-group {host_group}` ends the hold")


def usage_table(rows: Sequence[UsageRow]) -> str:
    return render_table(
        ["LIMIT", "USED", "OF"],
        [[row.limit, row.used, "unlimited" if row.maximum is None else row.maximum] for row in rows],
        right=(1, 2),
    )


def audit_table(host_group: str, events: Sequence[AuditEvent]) -> str:
    if not events:
        return f"no audit events for host group {host_group} yet"
    return render_table(
        ["SEQ", "TIME (UTC)", "TYPE", "REQUEST", "FROM->TO", "REASON", "RELATED", "POLICY"],
        [
            [event.seq, event.at.strftime("%Y-%m-%d %H:%M:%S"), event.type, event.request_id,
             _transition(event), event.reason or None, event.related_request_id, event.policy]
            for event in events
        ],
        right=(0,),
    )


def _transition(event: AuditEvent) -> str | None:
    if event.from_state is None and event.to_state is None:
        return None
    return f"{event.from_state or 'new'}->{event.to_state or '-'}"


def what_if_text(result: WhatIf) -> str:
    expected = f", expected to start {rfc3339(result.eta)}" if result.eta is not None else ""
    return f"{result.outcome}: {result.explanation}{expected}"


def policy_table(policy: AdmissionPolicy) -> str:
    rows = []
    for name, value in policy.model_dump(mode="json").items():
        if isinstance(value, dict) and name.endswith(("_quotas", "_limits")):
            shown = ", ".join(f"{key}={limit}" for key, limit in sorted(value.items())) or "none"
            shown += " (others unlimited)" if value else " (all unlimited)"
            if name == "runtime_quotas" and "host" not in value:
                shown = shown.replace("unlimited)", "unlimited; host: default_host_quota)")
        elif isinstance(value, dict):
            shown = ", ".join(f"{key}={_scalar(item)}" for key, item in value.items())
        else:
            shown = _scalar(value)
        rows.append([name, shown])
    return render_table(["SETTING", "VALUE"], rows)


def _scalar(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ",".join(str(item) for item in value) or "none"
    return str(value)
