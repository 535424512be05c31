"""What an audit export carries from a workflow to the append-only audit store."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from workflows.admission.model import AuditEvent


class AuditExport(BaseModel):
    """A batch of admission audit events. `(host_group, chain, seq)` identifies an event forever:
    `chain` is the first run id of the workflow's continue-as-new chain, so a retried export
    never writes an event twice and a re-created workflow never collides with an old one."""

    model_config = ConfigDict(extra="forbid")

    host_group: str
    chain: str
    events: list[AuditEvent]
