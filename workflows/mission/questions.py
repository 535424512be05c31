"""Questions a child asks a person, and the answers operators give: hitl-prompt/v1.

An agent asks by putting its A2A task in `input-required` with a prompt envelope at
`status.message.metadata[<the extension's URI>]` (agentic-sandbox e901dc2,
`docs/contracts/extensions/hitl-prompt/v1/spec.md` and `envelope.schema.json`). Its fleet record
then shows `blocked` with backpressure `approval` (fleet.rs `project_task_observation`). The
answer goes back as a `messages:send` to the same agent whose `message.taskId` is the task and
whose `message.metadata.hitl_response_for` is `{"prompt_id", "payload"}`
(`handlers/send_message.rs` `handle_hitl_response`).

The mission asks too: a child whose spec says `approval.required` is admitted and then asked
"dispatch CHILD?" before anything is sent to an executor (a *gate*, `source="gate"`).

What the spec leaves to the orchestrator is decided here, purely (no Temporal, no I/O):
- reading an envelope, refusing a malformed one (spec S-2: a `response_schema` over 64 KiB, or
  nested deeper than MAX_SCHEMA_DEPTH, is a malformed prompt);
- whether an answer may be forwarded (S-3: the orchestrator enforces `allowed_responders`;
  `consensus:N` forwards once N distinct operators agree) and whether its payload validates
  against the prompt's `response_schema` (JSON Schema draft 2020-12, `jsonschema`: the
  reference implementation in Python, deterministic, and it reports every error with its path);
- the deadline (S-4: a soft signal for the agent; the orchestrator keeps its own timer).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any, Literal

import jsonschema
from pydantic import BaseModel, ConfigDict, Field

from workflows.admission.model import OperatorName
from workflows.credential_material import find_credential_material

MAX_PROMPT_CHARS = 4096
MAX_SCHEMA_BYTES = 64 * 1024
MAX_SCHEMA_DEPTH = 32
MAX_PAYLOAD_BYTES = 64 * 1024
MAX_ANSWERS_KEPT = 50  # per child, in the ledger: the newest (every one is in the update's history event)
PROMPT_ID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[1-5][0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}$")
RESPONDER = re.compile(r"^(any|specific:[^\s]+|consensus:[1-9][0-9]*)$")
# What a gate asks, and what the CLI's approve/reject fills in for any question that takes it.
APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["approved"],
    "properties": {"approved": {"type": "boolean"}, "comment": {"type": "string", "maxLength": 1024}},
}
APPROVAL_TIMEOUT_CODE = "conductor.approval_timeout"
GATE_REJECTED_CODE = "conductor.dispatch_rejected"

Source = Literal["executor", "gate"]
Outcome = Literal["delivered", "vote", "refused-by-executor", "approved-dispatch", "rejected-dispatch"]


_NAMESPACE_URL = bytes.fromhex("6ba7b8119dad11d180b400c04fd430c8")  # RFC 4122 appendix C


def name_uuid(name: str) -> str:
    """RFC 4122's name-based UUID (version 5, SHA-1, URL namespace): `uuid.uuid5(NAMESPACE_URL, name)`,
    written out with hashlib because workflow modules import nothing that could draw a random id."""
    digest = bytearray(hashlib.sha1(_NAMESPACE_URL + name.encode()).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50
    digest[8] = (digest[8] & 0x3F) | 0x80
    text = digest.hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Question(_Model):
    """An open question of one child: the envelope's fields, plus where it came from and when."""

    prompt_id: str
    prompt: str
    response_schema: dict[str, Any]
    deadline: datetime | None = None  # the envelope's, else asked_at + the child's approval.timeout_seconds
    allowed_responders: tuple[str, ...] = ("any",)
    asked_at: datetime
    source: Source = "executor"
    task_id: str | None = None  # the task that asked (an executor's question)


class Answer(_Model):
    """One operator's answer, as the ledger keeps it: who, when, which prompt, what, and what came of it."""

    prompt_id: str
    operator: str
    answered_at: datetime
    payload: dict[str, Any]
    outcome: Outcome
    detail: str | None = None


class AnswerRequest(_Model):
    """The `answer_child` update's argument."""

    child_id: str = Field(min_length=1, max_length=256)
    operator: OperatorName
    payload: dict[str, Any]
    prompt_id: str | None = None  # when given, must be the open question's: an answer to an old prompt is refused


class AnswerResult(_Model):
    """What `answer_child` did: `outcome` (see `Answer`), and what an operator reads."""

    child_id: str
    prompt_id: str
    outcome: Outcome
    detail: str


# --- reading a prompt ----------------------------------------------------------------------------


def _depth(value: Any, level: int = 0) -> int:
    if level > MAX_SCHEMA_DEPTH:
        return level
    if isinstance(value, dict):
        return max((_depth(item, level + 1) for item in value.values()), default=level)
    if isinstance(value, list):
        return max((_depth(item, level + 1) for item in value), default=level)
    return level


def schema_problem(schema: object) -> str | None:
    """Why `schema` cannot be a response schema (None when it can): spec S-2 and JSON Schema itself."""
    if not isinstance(schema, dict):
        return "response_schema is not a JSON object"
    if schema.get("type") != "object":
        return 'response_schema must declare "type": "object" at its top level'
    size = len(json.dumps(schema, separators=(",", ":")).encode())
    if size > MAX_SCHEMA_BYTES:
        return f"response_schema is {size} bytes; a prompt's schema may take at most {MAX_SCHEMA_BYTES} (64 KiB)"
    if _depth(schema) > MAX_SCHEMA_DEPTH:
        return f"response_schema is nested deeper than {MAX_SCHEMA_DEPTH} levels"
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as error:
        return f"response_schema is not a valid JSON Schema: {error.message}"
    return None


def read_prompt(envelope: object, *, asked_at: datetime, task_id: str | None, timeout_seconds: int | None) -> Question | str:
    """The question in an envelope, or why it is malformed (a line for the ledger's note)."""
    if not isinstance(envelope, dict):
        return "the task is input-required without a hitl-prompt/v1 envelope: nobody can answer it here"
    extra = sorted(set(envelope) - {"prompt_id", "prompt", "response_schema", "deadline", "allowed_responders"})
    prompt_id, prompt, schema = envelope.get("prompt_id"), envelope.get("prompt"), envelope.get("response_schema")
    problem = None
    if extra:
        problem = f"unknown fields {', '.join(extra)}"
    elif not isinstance(prompt_id, str) or not PROMPT_ID.match(prompt_id):
        problem = "prompt_id is not an RFC 4122 UUID"
    elif not isinstance(prompt, str) or not prompt.strip() or len(prompt) > MAX_PROMPT_CHARS:
        problem = f"prompt must be a non-empty text of at most {MAX_PROMPT_CHARS} characters"
    else:
        problem = schema_problem(schema)
    deadline = None
    raw_deadline = envelope.get("deadline")
    if problem is None and raw_deadline is not None:
        try:
            deadline = datetime.fromisoformat(str(raw_deadline).replace("z", "Z"))
        except ValueError:
            deadline = None
        if deadline is None or deadline.tzinfo is None:
            problem = f"deadline {str(raw_deadline)[:40]!r} is not an RFC 3339 time with an offset"
    responders = envelope.get("allowed_responders", ["any"])
    if problem is None and (not isinstance(responders, list) or not responders or not all(isinstance(r, str) for r in responders)):
        problem = "allowed_responders must be a non-empty list of texts"
    if problem is not None:
        return f"malformed hitl-prompt/v1 envelope: {problem}; nobody can answer it here"
    if deadline is None and timeout_seconds is not None:
        deadline = asked_at + timedelta(seconds=timeout_seconds)
    return Question(
        prompt_id=prompt_id, prompt=prompt, response_schema=schema, deadline=deadline,  # type: ignore[arg-type]
        allowed_responders=tuple(r for r in responders if RESPONDER.match(r)) or ("any",),  # unknown ones are ignored
        asked_at=asked_at, source="executor", task_id=task_id,
    )


def gate_question(mission_id: str, child_id: str, child_attempt: int, asked_at: datetime, timeout_seconds: int | None) -> Question:
    """The question a gate asks before a child is dispatched. Its prompt id is a UUID (version 5)
    derived from the child, so a replay or a later run names the same question."""
    prompt_id = name_uuid(f"conductor:{mission_id}:{child_id}:{child_attempt}:dispatch")
    return Question(
        prompt_id=prompt_id, prompt=f"dispatch {child_id}?", response_schema=APPROVAL_SCHEMA,
        deadline=asked_at + timedelta(seconds=timeout_seconds) if timeout_seconds is not None else None,
        asked_at=asked_at, source="gate",
    )


# --- answering -----------------------------------------------------------------------------------


def consensus_needed(question: Question) -> int:
    """How many distinct operators must agree before the answer is forwarded (`consensus:N`)."""
    return max((int(r.split(":", 1)[1]) for r in question.allowed_responders if r.startswith("consensus:")), default=1)


def _named(question: Question) -> list[str]:
    return [r.split(":", 1)[1] for r in question.allowed_responders if r.startswith("specific:")]


def agreement(payload: dict[str, Any]) -> str:
    """What consensus compares: the payload without its free-text `comment` (operators who agree
    may word their comments differently)."""
    return json.dumps({k: v for k, v in payload.items() if k != "comment"}, sort_keys=True, separators=(",", ":"))


def payload_errors(question: Question, payload: object) -> list[str]:
    """Every way `payload` fails the prompt's response_schema, as `path: message`."""
    if not isinstance(payload, dict):
        return ["(payload): must be a JSON object"]
    size = len(json.dumps(payload, separators=(",", ":")).encode())
    if size > MAX_PAYLOAD_BYTES:
        return [f"(payload): {size} bytes; an answer may take at most {MAX_PAYLOAD_BYTES}"]
    validator = jsonschema.Draft202012Validator(question.response_schema)
    errors = sorted(validator.iter_errors(payload), key=lambda error: list(map(str, error.absolute_path)))
    return [f"{'/' + '/'.join(map(str, error.absolute_path)) if error.absolute_path else '(payload)'}: {error.message}" for error in errors]


def votes(answers: Iterable[Answer], prompt_id: str) -> list[Answer]:
    return [answer for answer in answers if answer.prompt_id == prompt_id and answer.outcome == "vote"]


def answer_refusal(question: Question | None, answers: Iterable[Answer], request: AnswerRequest) -> str | None:
    """Why this answer is refused (None: it is taken). Nothing is sent when it is refused."""
    child = request.child_id
    if question is None:
        return f"child {child} has no open question"
    if request.prompt_id is not None and request.prompt_id != question.prompt_id:
        return (
            f"child {child}'s open question is {question.prompt_id} ({question.prompt[:80]!r}), not {request.prompt_id}: "
            "that prompt was answered or replaced; read the open one with `conductor mission show`"
        )
    named = _named(question)
    if named and request.operator not in named:
        return f"operator {request.operator} may not answer this question: it allows only {', '.join(named)}"
    if any(vote.operator == request.operator for vote in votes(answers, question.prompt_id)):
        return f"operator {request.operator} has already answered this question; consensus needs distinct operators"
    findings = find_credential_material(request.payload, limit=4)
    if findings:
        return (
            "an answer must not carry credential material (it is kept in the ledger and the history): remove "
            + ", ".join(f"{finding.path} ({finding.what})" for finding in findings)
        )
    errors = payload_errors(question, request.payload)
    if errors:
        return "the payload does not match the question's response_schema: " + "; ".join(errors[:10])
    return None


def agreeing(answers: Iterable[Answer], question: Question, payload: dict[str, Any]) -> int:
    """How many distinct operators, this one included, gave an answer that agrees with `payload`."""
    wanted = agreement(payload)
    return 1 + sum(1 for vote in votes(answers, question.prompt_id) if agreement(vote.payload) == wanted)


def decided_here(question: Question, answers: Iterable[Answer], payload: dict[str, Any]) -> tuple[Outcome, str] | None:
    """What an answer comes to without the executor: a vote short of consensus, or a gate's
    decision; None: it is to be forwarded to the task that asked."""
    needed, agreed = consensus_needed(question), agreeing(answers, question, payload)
    if agreed < needed:
        return "vote", f"{agreed} of {needed} operators agree; forwarded once {needed} agree"
    if question.source == "gate":
        if approves(payload):
            return "approved-dispatch", "dispatch approved"
        return "rejected-dispatch", "dispatch rejected: the child is cancelled"
    return None


def answer_message_id(mission_id: str, child_id: str, prompt_id: str) -> str:
    """The messageId of an answer: one per prompt, short whatever the ids' lengths."""
    return f"answer-{name_uuid(f'conductor:{mission_id}:{child_id}:{prompt_id}:answer')}"


def approves(payload: dict[str, Any]) -> bool:
    """A gate's answer: dispatch only on `"approved": true`."""
    return payload.get("approved") is True


def with_answer(answers: tuple[Answer, ...], answer: Answer) -> tuple[Answer, ...]:
    """The answers with `answer` last: the newest MAX_ANSWERS_KEPT."""
    return (*answers, answer)[-MAX_ANSWERS_KEPT:]


def overdue(question: Question | None, now: datetime) -> bool:
    return question is not None and question.deadline is not None and now >= question.deadline
