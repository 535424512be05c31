"""Questions and answers (workflows/mission/questions.py), gates in the supervisor, and the record
the conductor keeps for a fleet-less executor (workflows/workload/kept.py), on plain data.

Envelopes are the spec's own examples (Agentic Sandbox e901dc2,
docs/contracts/extensions/hitl-prompt/v1/examples/, copied into tests/fixtures/hitl_prompt_v1/).
"""

from __future__ import annotations

import itertools
import json
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from substrate import projection
from substrate.store import TaskRow
from tests.engine.test_mission_supervisor import HERE, Admission
from workflows.contract import WorkloadRecord
from workflows.mission import supervisor
from workflows.mission.questions import (
    APPROVAL_TIMEOUT_CODE,
    GATE_REJECTED_CODE,
    PROMPT_ID,
    Answer,
    AnswerRequest,
    agreeing,
    answer_refusal,
    consensus_needed,
    gate_question,
    name_uuid,
    read_prompt,
)
from workflows.mission.spec import MissionSpec
from workflows.mission.supervisor import Answered, MissionState, Pass, Planned, Release, Start
from workflows.mission import aggregation
from workflows.workload import kept
from workflows.workload.messages import RuntimeIdentityUpdate
from tests.support.substrate_support import make_record

T0 = datetime(2026, 5, 9, 17, 42, 11, tzinfo=timezone.utc)
FIXTURES = Path(__file__).parents[1] / "fixtures" / "hitl_prompt_v1"
URI = "https://agentic-sandbox.aiwg.io/extensions/hitl-prompt/v1"
EXAMPLE = json.loads((FIXTURES / "prompt-event.json").read_text())["status"]["message"]["metadata"][URI]


def question(**changes):
    read = read_prompt({**EXAMPLE, **changes}, asked_at=T0, task_id="task-1", timeout_seconds=None)
    assert not isinstance(read, str), read
    return read


def request(payload, operator="release-manager@example.com", prompt_id=None):
    return AnswerRequest(child_id="c", operator=operator, payload=payload, prompt_id=prompt_id)


def test_the_specs_example_envelope_reads_as_a_question_with_its_deadline_and_responders() -> None:
    asked = question()
    assert asked.prompt_id == EXAMPLE["prompt_id"] and asked.prompt == EXAMPLE["prompt"]
    assert asked.deadline == datetime(2026, 5, 9, 18, 30, tzinfo=timezone.utc)
    assert asked.allowed_responders == ("specific:release-manager@example.com",)
    no_deadline = {k: v for k, v in EXAMPLE.items() if k != "deadline"}
    bounded = read_prompt(no_deadline, asked_at=T0, task_id="t", timeout_seconds=90)
    assert bounded.deadline == T0 + timedelta(seconds=90)  # the child's approval.timeout_seconds
    assert question(allowed_responders=["any", "someday:soon"]).allowed_responders == ("any",)  # unknown patterns ignored


@pytest.mark.parametrize("change, says", [
    ({"prompt_id": "not-a-uuid"}, "prompt_id"),
    ({"prompt": ""}, "prompt"),
    ({"response_schema": {"type": "array"}}, '"type": "object"'),
    ({"response_schema": {"type": "object", "properties": {"x": {"type": "nonsense"}}}}, "not a valid JSON Schema"),
    ({"response_schema": {"type": "object", "description": "x" * 70_000}}, "64 KiB"),
    ({"response_schema": {"type": "object", "x": json.loads("[" * 40 + "]" * 40)}}, "nested deeper"),
    ({"deadline": "tomorrow"}, "deadline"),
    ({"surprise": 1}, "unknown fields surprise"),
])
def test_a_malformed_envelope_is_said_so_and_never_becomes_a_question(change, says) -> None:
    read = read_prompt({**EXAMPLE, **change}, asked_at=T0, task_id="t", timeout_seconds=None)
    assert isinstance(read, str) and says in read
    assert isinstance(read_prompt(None, asked_at=T0, task_id="t", timeout_seconds=None), str)


def test_answers_are_refused_naming_what_is_wrong_and_consensus_counts_distinct_agreeing_operators() -> None:
    asked = question()
    assert answer_refusal(None, (), request({"approved": True})) == "child c has no open question"
    wrong = answer_refusal(asked, (), request({"approved": "yes please", "extra_unknown_field": 42}))
    assert "/approved" in wrong and "extra_unknown_field" in wrong  # as the spec's 422 example names them
    assert "may not answer" in answer_refusal(asked, (), request({"approved": True}, operator="mallory"))
    assert "not 00000000" in answer_refusal(asked, (), request({"approved": True}, prompt_id="00000000-0000-4000-8000-000000000000"))
    assert "credential material" in answer_refusal(asked, (), request({"approved": True, "comment": "ghp_" + "a" * 36}))
    assert answer_refusal(asked, (), request({"approved": True, "comment": "ok"})) is None

    pair = question(allowed_responders=["consensus:2"])
    assert consensus_needed(pair) == 2
    vote = Answer(prompt_id=pair.prompt_id, operator="alice", answered_at=T0, payload={"approved": True, "comment": "a"}, outcome="vote")
    assert "already answered" in answer_refusal(pair, (vote,), request({"approved": True}, operator="alice"))
    assert agreeing((vote,), pair, {"approved": True, "comment": "other words"}) == 2  # comments may differ
    assert agreeing((vote,), pair, {"approved": False}) == 1


def test_a_gate_question_is_the_same_uuid_on_every_replay_and_a_valid_prompt_id() -> None:
    assert name_uuid("conductor:m:c:1:dispatch") == str(uuid.uuid5(uuid.NAMESPACE_URL, "conductor:m:c:1:dispatch"))
    one, again = (gate_question("m", "c", 1, T0, 30) for _ in range(2))
    assert one.prompt_id == again.prompt_id and PROMPT_ID.match(one.prompt_id)
    assert gate_question("m", "c", 2, T0, None).prompt_id != one.prompt_id and one.deadline == T0 + timedelta(seconds=30)


# --- gates in the supervisor ------------------------------------------------------------------------


def gated_mission() -> tuple[MissionState, Admission]:
    spec = MissionSpec(mission_id="m", orchestrator_id="o", goal="g", aggregation={"mode": "quorum", "minimum_successes": 1},
                       children=[{"child_id": c, "kind": "one-shot-command", "prompt": "true",
                                  "approval": {"required": True, "timeout_seconds": 60}} for c in ("go", "no", "late")])  # fmt: skip
    state = MissionState(spec, aggregation.initial_ledger(spec), 10)
    admission = Admission()
    admission.now = T0
    supervisor.step(state, Planned({c.child_id: HERE for c in spec.children}, {}), admission, T0)
    for child in spec.children:
        admission.decide(state.children[child.child_id].request_id, "admitted", expires=timedelta(hours=1))
    return state, admission


def answered(state: MissionState, child_id: str, outcome: str) -> None:
    asked = state.ledger.child(child_id).question
    supervisor.hear(state, Answered(child_id, Answer(prompt_id=asked.prompt_id, operator="op", answered_at=T0,
                                                     payload={"approved": outcome == "approved-dispatch"}, outcome=outcome)))  # fmt: skip


def test_a_gated_child_holds_its_lease_asks_first_and_starts_only_once_approved() -> None:
    state, admission = gated_mission()
    actions = supervisor.step(state, Pass(), admission, T0)
    assert not any(isinstance(action, Start) for action in actions)  # admitted, and nothing dispatched
    for child_id in ("go", "no", "late"):
        child = state.ledger.child(child_id)
        assert (child.observed_state, child.backpressure.reason, child.question.prompt) == ("blocked", "approval", f"dispatch {child_id}?")
    assert supervisor.next_wakeup(state, admission, T0) == T0 + timedelta(seconds=60)  # the gates' deadline
    answered(state, "go", "approved-dispatch")
    answered(state, "no", "rejected-dispatch")
    actions = supervisor.step(state, Pass(), admission, T0 + timedelta(seconds=1))
    assert [a.child_ids for a in actions if isinstance(a, Start)] == [["go"]]
    released = [rid for a in actions if isinstance(a, Release) for rid in a.request_ids]
    assert released == [state.children["no"].request_id]  # the rejected one's lease goes back at once
    no = state.ledger.child("no")
    assert (no.observed_state, no.error_code, no.backpressure.retryable, no.outcome) == ("cancelled", GATE_REJECTED_CODE, False, "failed")
    admission.now = T0 + timedelta(seconds=61)
    actions = supervisor.step(state, Pass(), admission, admission.now)
    late = state.ledger.child("late")
    assert (late.observed_state, late.error_code, late.question) == ("timed-out", APPROVAL_TIMEOUT_CODE, None)
    assert [rid for a in actions if isinstance(a, Release) for rid in a.request_ids] == [state.children["late"].request_id]


# --- the record the conductor keeps for a fleet-less executor ----------------------------------------

STATES = ("submitted", "working", "input-required", "auth-required", "completed", "failed", "rejected", "canceled")
KINDS = ("one-shot-command", "daemon", "persistent-agent", "scheduled-collector")


def bound(kind: str) -> WorkloadRecord:
    options = {"schedule": "*/5 * * * *"} if kind == "scheduled-collector" else {}
    record = kept.admitted(make_record(f"k-{kind}", kind, **options))
    status = record.status.model_copy(update={"observed_state": "starting", "revision": 2})
    return kept.observed(record, status, RuntimeIdentityUpdate(task_id="task-1"))


@pytest.mark.parametrize("kind, state", list(itertools.product(KINDS, STATES)))
def test_the_kept_projection_agrees_with_the_substrates_for_every_kind_and_task_state(kind: str, state: str) -> None:
    """Two implementations of fleet.rs `project_task_observation`, written apart (the conductor's
    workflows/workload/kept.py and the substrate's substrate/projection.py), on the same task."""
    record = bound(kind)
    stamp = "2026-05-09T17:42:11.000Z"
    chunk = {"kind": "output_chunk", "stream": "stdout", "data": "hi", "command_id": "cmd-1", "seq": 1, "task_id": "task-1"}
    row = TaskRow(task_id="task-1", message_id="m", message_sha256="0" * 64, instance_id="i", child_id="k", context_id="",
                  kind=kind, state=state, status_text=None, updated_at=stamp, request={},
                  artifacts=[{"artifact_id": "a1", "created_at": stamp, "artifact": chunk}], status_extra={"task_id": "task-1"})
    theirs = projection.project(json.loads(record.model_dump_json(exclude_none=True)), row)
    reading = kept.TaskReading(
        task_id="task-1", state=state, updated_at=datetime.fromisoformat(stamp.replace("Z", "+00:00")),
        artifacts=(("a1", projection.canonical_sha256(chunk), datetime.fromisoformat(stamp.replace("Z", "+00:00"))),),
        status_sha256=projection.status_sha256(row) if state == "completed" else None, command_id="cmd-1",
    )
    ours = kept.projected(record, reading)
    assert ours is not None and theirs is not None
    assert json.loads(ours.model_dump_json(exclude_none=True)) == WorkloadRecord.model_validate(theirs).model_dump(mode="json", exclude_none=True)
    assert kept.projected(ours, reading) is None  # the same task again: no revision churn


def test_a_kept_record_never_rebinds_and_a_lost_task_is_unknown() -> None:
    record = bound("one-shot-command")
    with pytest.raises(ValueError, match="bound"):
        kept.observed(record, record.status.model_copy(update={"revision": 3}), RuntimeIdentityUpdate(task_id="task-2"))
    with pytest.raises(ValueError, match="revision"):
        kept.observed(record, record.status, None)
    lost = kept.projected(record, kept.TaskReading(task_id="task-1", state="lost", updated_at=T0))
    assert (lost.status.observed_state, lost.status.error_code) == ("unknown", kept.TASK_LOST)
