"""Request and response envelopes of the Agentic Sandbox management plane (`/api/v2/...`).

The documents themselves (workload, inventory, reconciliation) are the Fleet Workload
contract's (`workflows.contract`); these are the wrappers the client still reads with its
contract models (the rest of the real server's shapes: `activities.agentic_sandbox_api`; the
local substrate has its own, `substrate/wire.py`). Pure data, no I/O.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from workflows.contract import WorkloadRecord

Id = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^\s]+$")]


class _Envelope(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RuntimeIdentity(_Envelope):
    """Where a workload runs; each field, once set on a record, never changes."""

    task_id: Id | None = None
    session_id: Id | None = None
    command_id: Id | None = None


class AdmitResponse(_Envelope):
    replayed: bool
    workload: WorkloadRecord
