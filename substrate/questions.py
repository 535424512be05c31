"""How a process the substrate runs asks a person a question, and how the answer reaches it.

The wire is Agentic Sandbox's hitl-prompt/v1 (e901dc2, `docs/contracts/extensions/hitl-prompt/v1/`;
its two schemas are copied into `substrate/hitl_prompt_v1/`): the task goes `input-required` with
the prompt envelope at `status.message.metadata[HITL_PROMPT_EXTENSION]`, and the answer is a
`messages:send` naming the task (`message.taskId`) with `message.metadata.hitl_response_for`
`{"prompt_id", "payload"}`. As the executor's `handlers/send_message.rs` `handle_hitl_response`:
- a task of another instance, or not `input-required`, or without an envelope: 409
  `hitl_already_answered_or_unknown` (and an unknown `prompt_id` too, as the spec says; the
  real executor's `validate_hitl_response` answers that one 422 "prompt_id mismatch");
- a payload that does not match the prompt's `response_schema`: 422 `hitl_response_invalid` with
  `validation_errors` `[{path, keyword, message}]` (examples/invalid-response-422.json), the task
  stays `input-required`;
- accepted: the task goes `working` with the answer as its status message; 202 with the task.

The process's side, the substrate's own (a local process has no A2A agent to speak for it): its
environment names a directory, `CONDUCTOR_QUESTION_DIR`. To ask, it writes `question.json` there
(a temporary name, then renamed) holding `{"prompt", "response_schema"?, "deadline"?,
"allowed_responders"?, "prompt_id"?}`: a missing schema is the approval schema
(`{"approved": boolean, "comment"?: string}`), a missing prompt id a new UUID. The answer arrives
as `answer.json` (`{"prompt_id", "payload"}`), written the same way; the process takes it (reads,
then removes it) and may ask again. A question the envelope schema refuses is renamed
`question.rejected` beside a `question.error` that says why; the task runs on. `substrate.ask`
(`$CONDUCTOR_ASK` in the environment) does all of that for a shell command.
"""

from __future__ import annotations

import json
import os
import uuid
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

HITL_PROMPT_EXTENSION = "https://agentic-sandbox.aiwg.io/extensions/hitl-prompt/v1"
QUESTION_DIR_ENV = "CONDUCTOR_QUESTION_DIR"
ASK_ENV = "CONDUCTOR_ASK"
QUESTION_FILE = "question.json"
ANSWER_FILE = "answer.json"
REJECTED_FILE = "question.rejected"
ERROR_FILE = "question.error"
MAX_QUESTION_BYTES = 128 * 1024
APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["approved"],
    "properties": {"approved": {"type": "boolean"}, "comment": {"type": "string", "maxLength": 1024}},
}
_SCHEMAS = Path(__file__).with_name("hitl_prompt_v1")


@cache
def _validator(name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads((_SCHEMAS / name).read_text()))


def write_atomically(path: Path, value: Any) -> None:
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    temporary.write_text(json.dumps(value))
    os.replace(temporary, path)


def _errors(validator: jsonschema.Draft202012Validator, value: Any) -> list[dict[str, str]]:
    """`validation_errors` as examples/invalid-response-422.json words them: a JSON Pointer per error,
    an unknown property at its own path."""
    found = []
    for error in sorted(validator.iter_errors(value), key=lambda error: list(map(str, error.absolute_path))):
        at = "".join(f"/{part}" for part in error.absolute_path)
        if error.validator == "additionalProperties" and isinstance(error.instance, dict):
            known = error.schema.get("properties", {}) if isinstance(error.schema, dict) else {}
            found += [
                {"path": f"{at}/{name}", "keyword": "additionalProperties", "message": f"additional property {name!r} is not permitted"}
                for name in error.instance if name not in known
            ]
            continue
        found.append({"path": at or "/", "keyword": str(error.validator), "message": error.message})
    return found


def take_question(directory: Path) -> dict[str, Any] | None:
    """The envelope of the question the process has just written, or None. A question that cannot
    be an envelope is set aside (`question.rejected`, why in `question.error`)."""
    path = directory / QUESTION_FILE
    try:
        raw = path.read_bytes()[: MAX_QUESTION_BYTES + 1]
    except FileNotFoundError:
        return None
    try:
        asked = json.loads(raw) if len(raw) <= MAX_QUESTION_BYTES else None
        problems = [] if isinstance(asked, dict) else [f"a question is a JSON object of at most {MAX_QUESTION_BYTES} bytes"]
    except ValueError as error:
        asked, problems = None, [f"not JSON: {error}"]
    if isinstance(asked, dict):
        envelope = {"prompt_id": str(uuid.uuid4()), "response_schema": APPROVAL_SCHEMA, **asked}
        problems = [f"{e['path']}: {e['message']}" for e in _errors(_validator("envelope.schema.json"), envelope)]
        if not problems and len(json.dumps(envelope["response_schema"])) > 64 * 1024:
            problems = ["/response_schema: more than 64 KiB"]  # spec.md S-2
        if not problems:
            try:
                jsonschema.Draft202012Validator.check_schema(envelope["response_schema"])
            except jsonschema.SchemaError as error:
                problems = [f"/response_schema: not a JSON Schema: {error.message}"]
        if not problems:
            return envelope
    (directory / ERROR_FILE).write_text("; ".join(problems) + "\n")
    os.replace(path, directory / REJECTED_FILE)
    return None


def response_problems(envelope: dict[str, Any], response: Any) -> tuple[int, str, list[dict[str, str]]] | None:
    """Why an answer to `envelope` is refused: (status, detail, validation_errors), None if it is taken."""
    shape = _errors(_validator("response.schema.json"), response)
    if shape:
        return 422, "the hitl_response_for object is malformed", shape
    if response["prompt_id"] != envelope.get("prompt_id"):
        return 409, f"prompt {response['prompt_id']} is not open on this task (it asks {envelope.get('prompt_id')})", []
    invalid = _errors(jsonschema.Draft202012Validator(envelope["response_schema"]), response["payload"])
    if invalid:
        return 422, "the payload does not match the prompt's response_schema", invalid
    return None


def deliver(directory: Path, response: dict[str, Any]) -> None:
    """Hand the answer to the process, and close its question."""
    write_atomically(directory / ANSWER_FILE, {"prompt_id": response["prompt_id"], "payload": response["payload"]})
    (directory / QUESTION_FILE).unlink(missing_ok=True)
