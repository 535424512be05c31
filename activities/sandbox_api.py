"""Request and response envelopes of the Agentic Sandbox management plane (`/api/v2/...`).

The documents themselves (workload, inventory, reconciliation) are the Fleet Workload
contract's (`workflows.contract`); these are the thin wrappers the HTTP API puts around
them, shared by the client and the local substrate so both sides agree by construction.
Pure data, no I/O.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from workflows.contract import WorkloadKind, WorkloadRecord, WorkloadStatus

Id = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^\s]+$")]
NonNegative = Annotated[StrictInt, Field(ge=0)]


class _Envelope(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RuntimeIdentity(_Envelope):
    """Where a workload runs; each field, once set on a record, never changes."""

    task_id: Id | None = None
    session_id: Id | None = None
    command_id: Id | None = None


class ObservationRequest(_Envelope):
    """`POST /api/v2/fleet/workloads/{child_id}/observations`: `status.revision == expected_revision + 1`."""

    expected_revision: NonNegative
    status: WorkloadStatus
    runtime_identity: RuntimeIdentity | None = None


class ReconcileRequest(_Envelope):
    """`POST /api/v2/fleet/reconcile`."""

    before_revision: NonNegative
    child_ids: list[Id] = Field(min_length=1)


class AdmitResponse(_Envelope):
    replayed: bool
    workload: WorkloadRecord


class WorkloadResponse(_Envelope):
    """Body of a successful observation: the record as stored."""

    workload: WorkloadRecord


class ErrorBody(BaseModel):
    """`{"error": code, "message": text}` plus optional details such as `current_revision`."""

    model_config = ConfigDict(extra="allow")

    error: str
    message: str


class ExecutorInstance(_Envelope):
    """One executor instance (a dispatch target) as `GET /api/v2/admin/instances` lists it."""

    id: Id
    executor_id: Id
    runtime_id: Id
    workload_kinds: list[WorkloadKind]
    isolation_kinds: list[Literal["host", "container", "vm", "microvm", "custom"]]
    status: Literal["ready", "draining", "offline"]
    active_tasks: NonNegative


class InstanceList(_Envelope):
    instances: list[ExecutorInstance]
