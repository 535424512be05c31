"""Pure functions from a WorkloadInput to the Fleet Workload v1 record, its dispatch, and back.

Everything is derived from the input alone (plus `last_seen`, which the substrate leaves out
of its replay hash), so a second run of the same workload builds the identical record and
the substrate answers `replayed` instead of a collision: that is how a workflow re-adopts a
task it, or an earlier run, already dispatched.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import JsonValue

from workflows.contract import (
    REVIEW_REQUIRED_STATES,
    Artifact,
    TERMINAL_FAILURE_STATES,
    TERMINAL_OBSERVED_STATES,
    Lineage,
    WorkloadRecord,
    WorkloadSpec,
    WorkloadStatus,
)
from workflows.ids import context_id, dispatch_id, fleet_child_id, idempotency_key, verifier_message_id  # defined once there (re-exported)
from workflows.mission.observation import ChildObservation
from workflows.mission.questions import Question
from workflows.workload.messages import RunVerifier, TaskDispatch, Verdict, VerifierRun, WorkloadInput


def orchestrator_hints(input: WorkloadInput) -> dict[str, JsonValue]:
    """Non-secret scheduling hints for people reading the record on the substrate."""
    child = input.child
    hints: dict[str, JsonValue] = {
        "priority_class": child.priority_class,
        "priority": child.priority,
        "environment": child.environment,
        "provider": child.provider,
        "runtime_kind": child.runtime_kind,
        "preemptible": child.preemptible,
    }
    if child.lane is not None:
        hints["lane"] = child.lane
    if child.required_evidence:
        hints["required_evidence"] = list(child.required_evidence)
    return {"conductor": hints}


def _present(**fields: object) -> dict[str, object]:
    """The contract's optional fields are omitted, never null."""
    return {name: value for name, value in fields.items() if value is not None}


def build_record(input: WorkloadInput, now: datetime) -> WorkloadRecord:
    """The `pending` revision-0 record to admit. Raises `ContractError` if the input cannot form one."""
    child = input.child
    lineage = Lineage(
        orchestrator_id=input.orchestrator_id,
        mission_id=input.mission_id,
        dispatch_id=dispatch_id(input.mission_id, child.child_id, input.attempt),
        idempotency_key=idempotency_key(input.mission_id, child.child_id, input.attempt),
        parent_id=input.parent_id,
        child_id=fleet_child_id(input.mission_id, child.child_id, input.attempt),
        target_id=input.target_id,
        executor_id=input.executor_id,
        runtime_id=input.effective_runtime_id,
        session_id=None,
        task_id=None,
        command_id=None,
    )
    spec = WorkloadSpec.model_validate(
        _present(
            desired_state="running",
            capabilities=[],
            policy=child.workload_policy(),
            budgets=child.budgets,
            schedule=child.schedule,
            orchestrator_metadata=orchestrator_hints(input),
        )
    )
    status = WorkloadStatus.model_validate(
        _present(
            observed_state="pending",
            revision=0,
            last_seen=now,
            artifacts=[],
            health="unknown" if child.kind == "daemon" else None,
        )
    )
    record = WorkloadRecord(
        document_type="workload",
        api_version="agentic-orchestration/v1",
        kind=child.kind,
        lineage=lineage,
        spec=spec,
        status=status,
    )
    record.to_wire()  # validates the whole document (id lengths, schedule for collectors, ...)
    return record


def build_dispatch(input: WorkloadInput) -> TaskDispatch:
    child = input.child
    message_id = dispatch_id(input.mission_id, child.child_id, input.attempt)
    return TaskDispatch(
        message_id=message_id,
        child_id=fleet_child_id(input.mission_id, child.child_id, input.attempt),
        kind=child.kind,
        prompt=child.prompt,
        schedule=child.schedule,
        # Without the fleet API no record carries the budget to the executor: the message does.
        timeout_seconds=child.budgets.timeout_seconds if input.fleetless and not child.long_lived else None,
        # The executor gives a task a contextId only when its message carries one
        # (agentic-sandbox-executor handlers/send_message.rs), so the conductor names it, stably:
        # a persistent agent's session (bound to the record), and the context its verifier runs in.
        context_id=task_context_id(input),
    )


def task_context_id(input: WorkloadInput) -> str | None:
    """A persistent agent's session, one for all its attempts; a checked command's workspace,
    one per attempt (`workflows.ids.context_id`); None for the others."""
    child = input.child
    if child.kind == "persistent-agent":
        return context_id(input.mission_id, child.child_id)
    if child.verifier is not None:
        return context_id(input.mission_id, child.child_id, input.attempt)
    return None


def build_verifier_run(input: WorkloadInput) -> RunVerifier:
    """The child's verifier, sent as a command for no record in the context its task ran in."""
    child = input.child
    assert child.verifier is not None
    return RunVerifier(
        instance_id=input.target_id,
        message_id=verifier_message_id(input.mission_id, child.child_id, input.attempt),
        context_id=context_id(input.mission_id, child.child_id, input.attempt),
        command=child.verifier,
        timeout_seconds=child.budgets.timeout_seconds,
        poll_interval_seconds=input.poll_interval_seconds,
    )


def next_status(record: WorkloadRecord, now: datetime, **changes: object) -> WorkloadStatus:
    """The record's status one revision on, with `changes` applied (health kept for daemons); a
    change to None clears that field (the contract omits it, never nulls it)."""
    current = record.status
    data = current.model_dump()
    data.update(revision=current.revision + 1, last_seen=now)
    data = _present(**{**data, **changes})
    if record.kind == "daemon" and data.get("health") is None:
        data["health"] = "unknown"
    return WorkloadStatus.model_validate(data)


# --- the conductor's verifier ----------------------------------------------------------------

VERIFIER_FAILED = "conductor.verifier_failed"


def verifier_evidence_uri(task_id: str) -> str:
    """Where a verifier's outcome is, as the real server names a task's result (fleet.rs)."""
    return f"sandbox://tasks/{task_id}/status"


def verifier_due(record: WorkloadRecord, input: WorkloadInput) -> bool:
    """A child with a verifier whose command succeeded is verified once, before it counts.

    Only a one-shot command ends `succeeded` for good: a record the real server still projects
    (an agent `retained`, a collector `scheduled`) would overwrite the conductor's observation
    on its next read, so the spec allows a verifier on one-shot commands only."""
    return (
        input.child.verifier is not None
        and record.status.observed_state == "succeeded"
        and not any(artifact.kind == "verifier" for artifact in record.status.artifacts)
    )


def verified_status(record: WorkloadRecord, run: VerifierRun, now: datetime) -> WorkloadStatus | None:
    """The record's next status with the verifier's evidence, `failed` if it did not pass; None
    once that evidence is there (a retried write that landed)."""
    uri = verifier_evidence_uri(run.task_id)
    if record.status.observed_state != "succeeded" or any(artifact.uri == uri for artifact in record.status.artifacts):
        return None  # written already, or no longer the success the verifier checked
    artifacts = [*record.status.artifacts, Artifact(kind="verifier", uri=uri, sha256=run.status_sha256)]
    if run.passed:
        return next_status(record, now, artifacts=artifacts)
    return next_status(record, now, artifacts=artifacts, observed_state="failed",
                       exit_classification="failure", error_code=VERIFIER_FAILED)  # fmt: skip


def verifier_note(run: VerifierRun, command: str) -> str:
    shown = command if len(command) <= 80 else command[:77] + "..."
    outcome = "passed" if run.passed else f"did not pass ({run.state}: {run.status_text or 'no detail'})"
    return f"verifier `{shown}` (task {run.task_id}, run by the conductor) {outcome}"


# --- lifecycle ------------------------------------------------------------------------------


def lifecycle_satisfied(record: WorkloadRecord) -> bool:
    """docs/design.md, "Lifecycle satisfaction per kind" (`succeeded` ends every kind satisfied)."""
    state = record.status.observed_state
    if state == "succeeded":
        return record.kind != "scheduled-collector" or record.spec.schedule is not None
    if record.kind == "daemon":
        return state in ("healthy", "running") and record.status.health == "healthy"
    if record.kind == "persistent-agent":
        return state in ("retained", "detached", "running")
    if record.kind == "scheduled-collector":
        return state == "scheduled" and record.spec.schedule is not None
    return False


def verdict(record: WorkloadRecord) -> Verdict:
    state = record.status.observed_state
    if state in TERMINAL_FAILURE_STATES:
        return "failed"
    if state in REVIEW_REQUIRED_STATES:
        return "review-required"
    return "satisfied" if lifecycle_satisfied(record) else "progressing"


def finished(record: WorkloadRecord) -> bool:
    """Nothing more to follow: a terminal state, or one only an operator can resolve.

    Long-lived kinds that are satisfied are not finished: they are followed until cancelled.
    """
    state = record.status.observed_state
    return state in TERMINAL_OBSERVED_STATES or state in REVIEW_REQUIRED_STATES


def missing_evidence(record: WorkloadRecord, required: list[str]) -> list[str]:
    present = {artifact.kind for artifact in record.status.artifacts}
    return [kind for kind in required if kind not in present]


def output_version(record: WorkloadRecord) -> str | None:
    """Which output the record's artifacts promise, as a hash to read it once per version: the
    `result`'s once the task completed; once a record without one has ended (a failed command),
    its last `log`'s, since its stdout is in its logs; None while there is nothing to read."""
    artifacts = record.status.artifacts
    for artifact in artifacts:
        if artifact.kind == "result":
            return artifact.sha256
    logs = [artifact.sha256 for artifact in artifacts if artifact.kind == "log"]
    return logs[-1] if logs and finished(record) else None


def observation_of(
    record: WorkloadRecord,
    child_id: str,
    *,
    output: str | None = None,
    note: str | None = None,
    attempt: int = 1,
    question: Question | None = None,
) -> ChildObservation:
    status = record.status
    return ChildObservation(
        child_id=child_id,
        attempt=attempt,
        kind=record.kind,
        revision=status.revision,
        observed_state=status.observed_state,
        observed_at=status.last_seen,
        lineage=record.lineage,
        health=status.health,
        backpressure=status.backpressure,
        artifacts=list(status.artifacts),
        exit_classification=status.exit_classification,
        error_code=status.error_code,
        output=output,
        note=note,
        question=question if waits_for_answer(record) else None,
    )


def waits_for_answer(record: WorkloadRecord) -> bool:
    """Its task asks a person (fleet.rs projects `input-required` as blocked on approval)."""
    backpressure = record.status.backpressure
    return record.status.observed_state == "blocked" and backpressure is not None and backpressure.reason == "approval"
