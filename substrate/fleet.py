"""The management plane's rules: admission, revisioned observations, inventory, reconciliation.

As on the real server (agentic-sandbox e901dc2, `management/src/http/fleet.rs`), the runtime
never writes a record: the orchestrator binds a task with an observation (`apply`, which
answers the bare record), and every read (`get`, `inventory`) projects the bound task's state
into the record as one more revision when it changed (`substrate.projection`, fleet.rs
`refresh_from_task_store`). Every document leaving here went through `to_wire`, i.e. it is
schema-valid; an empty fleet's inventory is the one exception (200 with `records: []`, as
fleet.rs `inventory` answers, although the contract's schema wants at least one record).

Nothing is stored that carries credential material (keys that name a credential or strings that
look like one, `workflows.credential_material`: 400) or that is larger than `max_record_bytes`
of canonical JSON (413 `fleet.record_too_large`, checked before the write, so a refused
observation leaves the stored record as it was).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import UTC, datetime
import logging
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from substrate.errors import SubstrateError, not_found
from substrate.projection import project
from substrate.store import Store, StoredWorkload
from substrate.wire import ObservationRequest, ReconcileRequest, RuntimeIdentity
from workflows.contract import (
    API_VERSION,
    TERMINAL_FAILURE_STATES,
    ContractError,
    ReconciliationReport,
    WorkloadRecord,
    WorkloadStatus,
    describe_validation_error,
    parse_document,
    to_wire,
)
from workflows.credential_material import find_credential_material

_IDENTITY_FIELDS = ("task_id", "session_id", "command_id")
DEFAULT_MAX_RECORD_BYTES = 256 * 1024
M = TypeVar("M", bound=BaseModel)
log = logging.getLogger(__name__)


def now() -> datetime:
    return datetime.now(UTC)


def identity_sha256(wire: dict[str, Any]) -> str:
    """Hash of the canonical JSON of a record without `status.last_seen` (replay identity)."""
    document = json.loads(json.dumps(wire))
    document.get("status", {}).pop("last_seen", None)
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _issues_text(issues: list[tuple[str, str]], limit: int = 8) -> str:
    shown = [f"{path}: {message}" for path, message in issues[:limit]]
    if len(issues) > limit:
        shown.append(f"... and {len(issues) - limit} more")
    return "; ".join(shown)


def _reject_credentials(body: object, code: str) -> None:
    findings = find_credential_material(body, limit=8)
    if findings:
        raise SubstrateError(
            400,
            code,
            "credential material must not cross the contract boundary: remove "
            + ", ".join(f"{finding.path} ({finding.what})" for finding in findings)
            + " and name credentials through spec.policy.credential_policy_ref instead",
        )


def _parse_envelope(model: type[M], body: object, code: str) -> M:
    try:
        return model.model_validate(body)  # type: ignore[return-value]
    except ValidationError as error:
        raise SubstrateError(400, code, _issues_text(describe_validation_error(error))) from None


def _classify(record: WorkloadRecord | None) -> tuple[str, str, int, str | None]:
    """(classification, observed_state, revision, reason) from the stored state alone."""
    if record is None:
        return "unknown", "unknown", 0, "no workload record with this child_id"
    state, revision = record.status.observed_state, record.status.revision
    if state == "succeeded":
        return "terminal", state, revision, None
    if state in TERMINAL_FAILURE_STATES:
        return "failed-or-aborted", state, revision, f"stored state is {state}"
    if state in ("unknown", "operator-review-required"):
        return "operator-review-required", state, revision, f"stored state is {state}: the outcome was not observed"
    return "re-adopted", state, revision, None


class FleetService:
    def __init__(
        self, store: Store, clock: Callable[[], datetime] = now, *, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    ) -> None:
        self._store = store
        self._clock = clock
        self._max_record_bytes = max_record_bytes

    def _check_size(self, wire: dict[str, Any]) -> None:
        size = len(json.dumps(wire, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
        if size > self._max_record_bytes:
            raise SubstrateError(
                413,
                "fleet.record_too_large",
                f"the workload record would be {size} bytes of JSON; a record is at most {self._max_record_bytes} "
                "bytes: keep spec.orchestrator_metadata and status.artifacts small",
            )

    # -- reads -------------------------------------------------------------------------

    def _load(self, stored: StoredWorkload) -> WorkloadRecord:
        return WorkloadRecord.model_validate(stored.record)

    def get(self, child_id: str) -> WorkloadRecord:
        stored = self._store.get_workload(child_id)
        if stored is None:
            raise not_found(child_id)
        return self._load(self._refresh(stored))

    def get_wire(self, child_id: str) -> dict[str, Any]:
        """The record as `GET /api/v2/fleet/workloads/{child_id}` answers it (projected first)."""
        stored = self._store.get_workload(child_id)
        if stored is None:
            raise not_found(child_id)
        return self._refresh(stored).record

    def _refresh(self, stored: StoredWorkload) -> StoredWorkload:
        """Project the bound task into the record, written as a new revision if it changed.

        A projection the contract refuses (it should not happen) is logged and skipped: the
        stored record is still the truth, as fleet.rs keeps `current` when the write fails."""
        task_id = stored.record.get("lineage", {}).get("task_id")
        if not task_id:
            return stored
        with self._store.transaction():
            current = self._store.get_workload(stored.child_id)
            task = self._store.get_task(task_id)
            if current is None or task is None:
                return current or stored
            projected = project(current.record, task)
            if projected is None:
                return current
            try:
                wire = to_wire(WorkloadRecord.model_validate(projected))
                self._check_size(wire)
            except (ValidationError, ContractError, SubstrateError) as error:
                log.warning("substrate: cannot project task %s into %s: %s", task_id, current.child_id, error)
                return current
            revision = wire["status"]["revision"]
            self._store.replace_record(current.child_id, revision, wire)
            return StoredWorkload(current.child_id, current.idempotency_key, current.identity_sha256, revision, wire)

    def find(self, child_id: str) -> WorkloadRecord | None:
        stored = self._store.get_workload(child_id)
        return None if stored is None else self._load(stored)

    def _inventory_revision(self, stored: list[StoredWorkload]) -> int:
        return len(stored) + sum(w.revision for w in stored)

    def inventory(self) -> dict[str, Any]:
        """The inventory document, every record projected first; an empty fleet has `records: []`."""
        stored = [self._refresh(w) for w in self._store.list_workloads()]
        if not stored:
            return {
                "document_type": "inventory",
                "api_version": API_VERSION,
                "inventory_revision": 0,
                "generated_at": self._clock().isoformat().replace("+00:00", "Z"),
                "records": [],
            }
        document = {
            "document_type": "inventory",
            "api_version": API_VERSION,
            "inventory_revision": self._inventory_revision(stored),
            "generated_at": self._clock(),
            "records": [w.record for w in stored],
        }
        return to_wire(parse_document(document))

    # -- admission ---------------------------------------------------------------------

    def admit(self, body: object) -> tuple[bool, dict[str, Any]]:
        """Returns (replayed, wire record)."""
        _reject_credentials(body, "fleet.invalid_record")
        try:
            document = parse_document(body)
        except ContractError as error:
            raise SubstrateError(400, "fleet.invalid_record", _issues_text(error.issues)) from None
        if not isinstance(document, WorkloadRecord):
            raise SubstrateError(
                400, "fleet.invalid_record", f"expected a workload record, got a {document.document_type} document"
            )
        if document.status.observed_state != "pending" or document.status.revision != 0:
            raise SubstrateError(
                400,
                "fleet.invalid_record",
                "a record is admitted with status.observed_state 'pending' and status.revision 0 "
                f"(got {document.status.observed_state!r}, revision {document.status.revision})",
            )
        submitted = to_wire(document)
        identity = identity_sha256(submitted)
        lineage = document.lineage
        with self._store.transaction():
            existing = self._store.get_workload(lineage.child_id)
            if existing is not None:
                if existing.identity_sha256 == identity:
                    return True, existing.record
                raise SubstrateError(
                    422,
                    "fleet.idempotency_collision",
                    f"child_id {lineage.child_id!r} was already admitted with different content; "
                    "use a new child_id and idempotency_key for a different workload",
                )
            other = self._store.workload_by_idempotency_key(lineage.idempotency_key)
            if other is not None:
                raise SubstrateError(
                    422,
                    "fleet.idempotency_collision",
                    f"idempotency_key {lineage.idempotency_key!r} already belongs to child_id {other.child_id!r}",
                )
            status = document.status.model_copy(
                update={"observed_state": "admitted", "revision": 1, "last_seen": self._clock()}
            )
            admitted = to_wire(document.model_copy(update={"status": status}))
            self._check_size(admitted)
            self._store.insert_workload(
                StoredWorkload(lineage.child_id, lineage.idempotency_key, identity, 1, admitted)
            )
        return False, admitted

    # -- observations ------------------------------------------------------------------

    def observe(self, child_id: str, body: object) -> dict[str, Any]:
        """An orchestrator's observation (fleet.rs `observe`): validated, then compare-and-swap; the bare record."""
        _reject_credentials(body, "fleet.invalid_observation")
        request = _parse_envelope(ObservationRequest, body, "fleet.invalid_observation")
        identity = request.runtime_identity
        if identity is not None and not any(getattr(identity, name) for name in _IDENTITY_FIELDS):
            # fleet.rs `apply_runtime_identity`: an identity update must bind something.
            raise SubstrateError(
                400, "fleet.invalid_runtime_identity", "runtime_identity must assign at least one identity"
            )
        return self.apply(child_id, request.expected_revision, request.status, request.runtime_identity)

    def apply(
        self,
        child_id: str,
        expected_revision: int,
        status: WorkloadStatus,
        identity: RuntimeIdentity | None = None,
    ) -> dict[str, Any]:
        """Compare-and-swap one observation onto the stored record; returns the new wire record."""
        with self._store.transaction():
            stored = self._store.get_workload(child_id)
            if stored is None:
                raise not_found(child_id)
            if stored.revision != expected_revision:
                raise SubstrateError(
                    409,
                    "fleet.stale_revision",
                    f"expected revision {expected_revision} but the record is at revision {stored.revision}; "
                    "read it again and re-apply the observation",
                    current_revision=stored.revision,
                )
            if status.revision != expected_revision + 1:
                raise SubstrateError(
                    400,
                    "fleet.invalid_observation",
                    f"status.revision must be expected_revision + 1 = {expected_revision + 1} "
                    f"(got {status.revision})",
                )
            record = self._load(stored)
            lineage = record.lineage
            if identity is not None:
                changes: dict[str, str] = {}
                for field in _IDENTITY_FIELDS:
                    new, old = getattr(identity, field), getattr(lineage, field)
                    if new is None or new == old:
                        continue
                    if old is not None:
                        raise SubstrateError(
                            409,
                            "fleet.runtime_identity_immutable",
                            f"lineage.{field} is already {old!r} and cannot change to {new!r}",
                        )
                    changes[field] = new
                if changes:
                    lineage = lineage.model_copy(update=changes)
            try:
                wire = to_wire(record.model_copy(update={"lineage": lineage, "status": status}))
            except ContractError as error:
                raise SubstrateError(400, "fleet.invalid_observation", _issues_text(error.issues)) from None
            self._check_size(wire)
            self._store.replace_record(child_id, status.revision, wire)
        return wire

    # -- reconciliation ----------------------------------------------------------------

    def reconcile(self, body: object) -> dict[str, Any]:
        request = _parse_envelope(ReconcileRequest, body, "fleet.invalid_request")
        stored = self._store.list_workloads()
        by_child = {w.child_id: w for w in stored}
        rows = []
        for child_id in dict.fromkeys(request.child_ids):
            found = by_child.get(child_id)
            classification, state, revision, reason = _classify(None if found is None else self._load(found))
            row: dict[str, Any] = {
                "child_id": child_id,
                "classification": classification,
                "observed_state": state,
                "revision": revision,
            }
            if reason:
                row["reason"] = reason
            rows.append(row)
        report = ReconciliationReport.model_validate(
            {
                "document_type": "reconciliation",
                "api_version": API_VERSION,
                "generated_at": self._clock(),
                "before_revision": request.before_revision,
                "after_revision": self._inventory_revision(stored),
                "rows": rows,
            }
        )
        return to_wire(report)
