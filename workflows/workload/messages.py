"""Payloads of the fleet activities and of WorkloadWorkflow.

Pure pydantic models so that workflows (the sandbox) and activities import the same shapes.
Nothing here carries a bearer token or a URL: those are the worker's configuration
(`activities.credentials`, `worker.config`), never part of a workflow's history.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from workflows.admission.model import Identifier
from workflows.ids import ATTEMPT_SEPARATOR, MAX_ATTEMPT_NUMBER, attempt_child_id
from workflows.contract import (
    IsolationKind,
    WorkloadKind,
    WorkloadRecord,
    WorkloadStatus,
)
from workflows.mission.observation import ChildObservation
from workflows.mission.questions import Question
from workflows.mission.spec import ChildSpec

# Activity names: stable, they are what histories and other workflows refer to.
LIST_TARGETS = "list_targets"
ADMIT_WORKLOAD = "admit_workload"
GET_WORKLOAD = "get_workload"
DISPATCH_AND_READ = "dispatch_and_read"
ADMIT_AND_DISPATCH = "admit_and_dispatch"
OBSERVE_WORKLOAD = "observe_workload"
WATCH_WORKLOAD = "watch_workload"
DISPATCH_TASK = "dispatch_task"
READ_OUTPUT = "read_output"
CANCEL_TASK = "cancel_task"
RUN_VERIFIER = "run_verifier"
READ_QUESTION = "read_question"
PROJECT_TASK = "project_task"
ANSWER_QUESTION = "answer_question"

WORKLOAD_WORKFLOW = "WorkloadWorkflow"

TaskState = Literal[
    "submitted", "working", "input-required", "auth-required",
    "completed", "failed", "canceled", "rejected", "unknown",
]  # fmt: skip
Verdict = Literal["progressing", "satisfied", "failed", "review-required"]

DEFAULT_OUTPUT_CHARS = 64 * 1024
VERIFIER_GRACE_SECONDS = 30  # past its budget, the executor gets this long to end a verifier itself


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- targets --------------------------------------------------------------------------------


class Target(_Message):
    """One executor instance a workload can be dispatched to (`target_id` = `id`)."""

    id: str
    executor_id: str
    runtime_id: str
    workload_kinds: list[WorkloadKind]
    isolation_kinds: list[IsolationKind]
    status: Literal["ready", "draining", "offline"]
    active_tasks: int
    # False: its executor has no fleet API (404 on /api/v2/fleet/*, or a store that stays
    # unavailable): it runs one-shot commands and persistent agents over A2A alone, the conductor
    # keeping their records (workflows.workload.kept), and no daemon or scheduled collector.
    fleet_api: bool = True


class TargetList(_Message):
    targets: list[Target]


# --- fleet records --------------------------------------------------------------------------


class AdmitWorkload(_Message):
    record: WorkloadRecord


class Admitted(_Message):
    """`replayed` is True when an identical record was already admitted; `record` is the current one."""

    replayed: bool
    record: WorkloadRecord


class WorkloadRef(_Message):
    child_id: str


class RuntimeIdentityUpdate(_Message):
    """Runtime identity to bind with an observation; a field already set can never change."""

    task_id: str | None = None
    session_id: str | None = None
    command_id: str | None = None


class ObserveWorkload(_Message):
    child_id: str
    expected_revision: int = Field(ge=0)
    status: WorkloadStatus
    runtime_identity: RuntimeIdentityUpdate | None = None


class Observed(_Message):
    """`applied` False: the compare-and-swap lost; `record` is the current one to reduce against."""

    applied: bool
    record: WorkloadRecord


class WatchWorkload(_Message):
    child_id: str
    after_revision: int = Field(ge=0)
    poll_interval_seconds: float = Field(default=1.0, gt=0)
    # The activity returns the unchanged record after this long so that no activity runs forever.
    max_wait_seconds: float = Field(default=300.0, gt=0)
    # A fleet-less executor: the record the conductor keeps, projected from its task on `instance_id`.
    kept: WorkloadRecord | None = None
    instance_id: str | None = None


class KeptRecord(_Message):
    """A record the conductor keeps (workflows.workload.kept), to project its bound task into."""

    instance_id: str
    record: WorkloadRecord


# --- executor tasks -------------------------------------------------------------------------


class TaskDispatch(_Message):
    """One workload's start message, the one model of it from the workflow to the executor's A2A
    message (`activities.agentic_sandbox_api.build_message`); `message_id` is its idempotency key
    (same id, same task)."""

    message_id: str = Field(min_length=1, max_length=256)
    child_id: Identifier | None = None  # None: a command for no workload record (a verifier)
    kind: WorkloadKind
    prompt: str = Field(min_length=1)
    timeout_seconds: int | None = Field(default=None, ge=1)
    schedule: str | None = None
    context_id: str | None = None


class DispatchTask(_Message):
    instance_id: str
    dispatch: TaskDispatch


class TaskRef(_Message):
    instance_id: str
    task_id: str
    max_output_chars: int = Field(default=DEFAULT_OUTPUT_CHARS, ge=0)


class AskedQuestion(_Message):
    """A task's state and, while it waits on a person, its hitl-prompt/v1 envelope as sent (read
    by `workflows.mission.questions.read_prompt`, which says what is wrong with a malformed one)."""

    state: str
    envelope: Any = None


class QuestionAnswer(_Message):
    """An operator's answer on its way to the task that asked (`answer_question`)."""

    instance_id: str
    task_id: str
    message_id: str
    prompt_id: str
    payload: dict[str, Any]


class AnswerDelivered(_Message):
    """`delivered`: the executor took the answer, or said the prompt was already answered (409)."""

    delivered: bool
    task_state: str | None = None
    detail: str


class TaskView(_Message):
    """An A2A task as the workflow needs it: state, why, and the result artifact's text."""

    instance_id: str
    task_id: str
    context_id: str | None = None  # the real executor sends contextId only if the message carried one
    state: TaskState
    status_text: str | None = None
    artifact_names: list[str] = Field(default_factory=list)
    output: str | None = None
    output_truncated: bool = False


class RunVerifier(_Message):
    """Run a child's verifier on its instance, in the context its task ran in, and wait for it."""

    instance_id: str
    message_id: str = Field(min_length=1, max_length=256)  # same id, same verifier task
    context_id: str = Field(min_length=1, max_length=256)
    command: str = Field(min_length=1)
    timeout_seconds: int = Field(ge=1)
    poll_interval_seconds: float = Field(default=1.0, gt=0, le=60)


class VerifierRun(_Message):
    """How the verifier ended. `passed` only for a `completed` task (exit status 0)."""

    task_id: str
    state: TaskState
    passed: bool
    status_text: str | None = None
    status_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")  # of the task's status as read: the evidence's hash


class TaskOutput(_Message):
    """What a task wrote to stdout (its artifacts), cut to the caller's `max_output_chars`."""

    output: str | None = None
    output_truncated: bool = False


class DispatchAndRead(_Message):
    """Dispatch, then read the workload's record back (and the result's text if it has one)."""

    dispatch: DispatchTask
    child_id: str  # the fleet child id
    max_output_chars: int = Field(default=DEFAULT_OUTPUT_CHARS, ge=0)
    wait_for_end_seconds: float = Field(default=0.0, ge=0, le=5)  # keep reading until the task ends, this long


class Dispatched(_Message):
    task: TaskView  # as accepted (or rejected) by the executor
    record: WorkloadRecord  # read right after the dispatch
    output: TaskOutput | None = None  # the task's text, once the record promises some (`output_version`)


class AdmitAndDispatch(_Message):
    """Admit the record; then, unless it already names a task or has ended, dispatch and read back."""

    record: WorkloadRecord
    dispatch: DispatchAndRead
    # The executor has no fleet API: `record` is the one the conductor keeps (admitted), nothing is
    # admitted on the server, and the task is bound and projected here (workflows.workload.kept).
    fleetless: bool = False


class Refusal(_Message):
    """A refusal no retry can fix, with the server's code and message."""

    type: str | None
    message: str


class AdmittedAndDispatched(_Message):
    """`admit_and_dispatch`'s answer, with one record: as admitted, or as read back after the
    dispatch (its local activity's result is a marker in every workload's history, and the
    admitted record beside the read-back one was a third of it)."""

    replayed: bool  # an identical record was admitted before
    record: WorkloadRecord
    task: TaskView | None = None  # dispatched; None: the record names a task already, or has ended, or refused
    output: TaskOutput | None = None  # the dispatched task's text, once the record promises some
    # Refused for good (an error no retry fixes), or a task the executor rejected (`executor.task_rejected`).
    dispatch_refused: Refusal | None = None


# --- the workflow ---------------------------------------------------------------------------


class WorkloadCarry(_Message):
    """What a WorkloadWorkflow hands to its next run at continue-as-new."""

    record: WorkloadRecord
    task_id: str | None
    reported_revision: int
    output: str | None = None
    output_sha256: str | None = None
    question: Question | None = None  # the open question its task asks, as first read
    waiting_since: datetime | None = None  # blocked on approval since (a deadline without an envelope's own)


class WorkloadInput(_Message):
    """One admitted child workload: where it runs and who it belongs to; never a credential."""

    mission_id: Identifier
    orchestrator_id: Identifier
    child: ChildSpec
    target_id: Identifier = Field(description="the executor instance the task is sent to")
    executor_id: Identifier
    runtime_id: Identifier | None = Field(default=None, description="defaults to `<target_id>:<kind>`")
    parent_id: Identifier | None = None
    # Which attempt of the child this is (workflows.mission.attempts): every id of the fleet record
    # and of the dispatch is the attempt's own (workflows.ids), so a retry never re-adopts an
    # earlier attempt's task.
    attempt: int = Field(default=1, ge=1, le=MAX_ATTEMPT_NUMBER)
    poll_interval_seconds: float = Field(default=1.0, gt=0, le=60)
    watch_max_seconds: float = Field(default=300.0, gt=0, le=3600)
    max_history_events: int = Field(default=5000, ge=20)
    max_output_chars: int = Field(default=DEFAULT_OUTPUT_CHARS, ge=0)
    # Set by a mission that may continue-as-new while this workload runs (long-lived kinds):
    # its next run cannot see this workflow end, so the last observation is signalled too, a
    # sign of life goes to the mission after every quiet watch, and a mission that can no longer
    # be signalled is gone: the workload then stops its runtime task and ends.
    report_to_mission_by_signal: bool = False
    # The target's executor has no fleet API: the workflow keeps the record (workflows.workload.kept).
    fleetless: bool = False
    carried: WorkloadCarry | None = None

    @model_validator(mode="after")
    def _derived_ids_fit(self) -> WorkloadInput:
        # dispatch_id is the longest id derived from these two (see workflows.workload.record).
        child = attempt_child_id(self.child.child_id, self.attempt)
        length = len(self.mission_id) + len(child) + len("::dispatch")
        if length > 256:
            shown = f"<mission>:<child>{ATTEMPT_SEPARATOR}{self.attempt}" if self.attempt > 1 else "<mission>:<child>"
            raise ValueError(
                f"mission_id and child.child_id are too long together ({length} characters in "
                f"'{shown}:dispatch'); the fleet contract allows 256: shorten one of them"
            )
        return self

    @property
    def effective_runtime_id(self) -> str:
        return self.runtime_id or f"{self.target_id}:{self.child.kind}"


class WorkloadResult(_Message):
    """How the workload ended (cancellation ends the workflow cancelled instead)."""

    child_id: str
    verdict: Verdict
    observation: ChildObservation
    task_id: str | None = None
    missing_evidence: list[str] = Field(default_factory=list)
