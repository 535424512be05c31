"""A process on the local substrate asks a person (hitl-prompt/v1), over real HTTP.

The expectations are the spec's and the executor's, not our client's: Agentic Sandbox e901dc2
`docs/contracts/extensions/hitl-prompt/v1/` (spec.md, envelope.schema.json, and the examples copied
into tests/fixtures/hitl_prompt_v1/) and `handlers/send_message.rs` `handle_hitl_response` (409
`hitl_already_answered_or_unknown`, 422 `hitl_response_invalid`, 202 with the task `working`). The
answers here are raw JSON shaped like the spec's examples; the conductor's client
(`ExecutorClient.answer_prompt`) is held to the same server at the end.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import jsonschema
import pytest

from activities.agentic_sandbox_api import HITL_PROMPT_EXTENSION, RUNTIME_EXTENSION
from activities.fleet import FleetActivities
from activities.sandbox_client import AnswerInvalid, ExecutorClient, FleetClient, PromptClosed
from substrate.server import RunningSubstrate, serve_in_thread
from tests.support.processes import eventually
from tests.support.substrate_fixtures import substrate_config
from tests.support.substrate_support import EXECUTOR_TOKEN, FLEET_TOKEN, make_record
from workflows.workload.messages import QuestionAnswer

pytestmark = pytest.mark.timeout(60)
FIXTURES = Path(__file__).parents[1] / "fixtures" / "hitl_prompt_v1"
ENVELOPE_SCHEMA = json.loads((Path(__file__).parents[2] / "substrate" / "hitl_prompt_v1" / "envelope.schema.json").read_text())
EXAMPLE_SCHEMA = json.loads((FIXTURES / "prompt-event.json").read_text())["status"]["message"]["metadata"][HITL_PROMPT_EXTENSION]["response_schema"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningSubstrate]:
    with serve_in_thread(substrate_config(tmp_path_factory.mktemp("substrate"))) as running:
        yield running


@pytest.fixture
async def raw(server: RunningSubstrate) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {EXECUTOR_TOKEN}", "A2A-Extensions": f"{RUNTIME_EXTENSION}, {HITL_PROMPT_EXTENSION}"}
    async with httpx.AsyncClient(base_url=server.base_url, headers=headers) as client:
        yield client


async def ask(server: RunningSubstrate, child_id: str, command: str, *, hitl: bool = True) -> str:
    """Dispatch `command` for a new record; the task id. `hitl`: activate the extension (as the conductor does)."""
    async with FleetClient(server.base_url, FLEET_TOKEN) as fleet:
        await fleet.admit(make_record(child_id))
    body = {"message": {"kind": "message", "messageId": f"msg-{child_id}", "role": "user",
                        "parts": [{"kind": "text", "text": command}],
                        "metadata": {RUNTIME_EXTENSION: {"child_id": child_id, "kind": "one-shot-command"}}}}
    extensions = f"{RUNTIME_EXTENSION}, {HITL_PROMPT_EXTENSION}" if hitl else RUNTIME_EXTENSION
    async with httpx.AsyncClient(base_url=server.base_url) as client:
        response = await client.post("/agents/local-1/v1/messages:send", json=body, headers={
            "Authorization": f"Bearer {EXECUTOR_TOKEN}", "A2A-Extensions": extensions,
        })
    assert response.status_code == 202, response.text
    return response.json()["id"]


async def task_of(raw: httpx.AsyncClient, task_id: str) -> dict:
    response = await raw.get(f"/agents/local-1/v1/tasks/{task_id}")
    assert response.status_code == 200
    return response.json()


async def until_state(raw: httpx.AsyncClient, task_id: str, *states: str) -> dict:
    seen: dict = {}

    async def reached() -> bool:
        seen.update(await task_of(raw, task_id))
        return seen["status"]["state"] in states

    await eventually(reached, f"task {task_id} {' or '.join(states)}", within=15, interval=0.05)
    return seen


def answer(task_id: str, prompt_id: str, payload: object, message_id: str) -> dict:
    """A response message shaped as examples/response-message.json."""
    message = json.loads((FIXTURES / "response-message.json").read_text())
    message.update(messageId=message_id, taskId=task_id)
    message.pop("contextId", None)
    message["metadata"]["hitl_response_for"] = {"prompt_id": prompt_id, "payload": payload}
    return {"message": message}


async def test_a_question_is_an_envelope_a_bad_answer_is_422_a_good_one_resumes_within_a_second_and_a_repeat_is_409(
    server: RunningSubstrate, raw: httpx.AsyncClient,
) -> None:
    schema = json.dumps(EXAMPLE_SCHEMA)
    task_id = await ask(server, "asks-1", f"$CONDUCTOR_ASK 'Approve push of release v2.0.3?' --schema '{schema}' "
                                          "--deadline-seconds 600 --responder specific:release-manager")
    task = await until_state(raw, task_id, "input-required")
    envelope = task["status"]["message"]["metadata"][HITL_PROMPT_EXTENSION]
    jsonschema.Draft202012Validator(ENVELOPE_SCHEMA, format_checker=jsonschema.FormatChecker()).validate(envelope)
    assert envelope["prompt"] == "Approve push of release v2.0.3?"
    assert envelope["response_schema"] == EXAMPLE_SCHEMA
    assert envelope["allowed_responders"] == ["specific:release-manager"]
    prompt_id = envelope["prompt_id"]

    invalid = json.loads((FIXTURES / "invalid-response-422.json").read_text())["request"]["metadata"]["hitl_response_for"]["payload"]
    refused = await raw.post("/agents/local-1/v1/messages:send", json=answer(task_id, prompt_id, invalid, "m-bad"))
    assert refused.status_code == 422
    assert refused.json()["code"] == "hitl_response_invalid"
    assert {e["path"] for e in refused.json()["validation_errors"]} == {"/approved", "/extra_unknown_field"}  # as the spec's example
    assert (await task_of(raw, task_id))["status"]["state"] == "input-required"

    unknown = await raw.post("/agents/local-1/v1/messages:send",
                             json=answer(task_id, "f7d4b1c0-9b25-4e8c-a4ce-3d6a51e8a772", {"approved": True}, "m-unknown"))  # fmt: skip
    assert unknown.status_code == 409 and unknown.json()["code"] == "hitl_already_answered_or_unknown"

    sent = time.monotonic()
    accepted = await raw.post("/agents/local-1/v1/messages:send",
                              json=answer(task_id, prompt_id, {"approved": True, "comment": "smoke tests passed"}, "m-ok"))
    assert accepted.status_code == 202, accepted.text
    assert accepted.json()["status"]["state"] == "working"  # spec AC-4: out of input-required within a second
    assert time.monotonic() - sent < 1.0
    again = await raw.post("/agents/local-1/v1/messages:send", json=answer(task_id, prompt_id, {"approved": True}, "m-again"))
    assert again.status_code == 409  # CF-1: never a second response for one prompt

    done = await until_state(raw, task_id, "completed", "failed")
    assert done["status"]["state"] == "completed"
    artifacts = (await raw.get(f"/agents/local-1/v1/tasks/{task_id}/artifacts")).json()["artifacts"]
    stdout = "".join(a["artifact"]["data"] for a in artifacts if a["artifact"]["stream"] == "stdout")
    assert json.loads(stdout) == {"approved": True, "comment": "smoke tests passed"}  # what the process was handed


async def test_the_conductors_client_answers_and_reads_409_and_422_as_their_own_errors(
    server: RunningSubstrate, raw: httpx.AsyncClient,
) -> None:
    task_id = await ask(server, "asks-2", "$CONDUCTOR_ASK 'Deploy?'")
    envelope = (await until_state(raw, task_id, "input-required"))["status"]["message"]["metadata"][HITL_PROMPT_EXTENSION]
    async with ExecutorClient(server.base_url, EXECUTOR_TOKEN) as client:
        with pytest.raises(AnswerInvalid, match="approved"):
            await client.answer_prompt("local-1", task_id, "c-1", envelope["prompt_id"], {"approved": "yes"})
        task = await client.answer_prompt("local-1", task_id, "c-2", envelope["prompt_id"], {"approved": False})
        assert task.status.state == "working"
        with pytest.raises(PromptClosed):
            await client.answer_prompt("local-1", task_id, "c-3", envelope["prompt_id"], {"approved": False})
    done = await until_state(raw, task_id, "completed", "failed")
    assert done["status"]["state"] == "failed"  # the helper exits 1 on a rejection: `ask && deploy` deploys nothing


async def test_without_the_extension_the_task_waits_with_plain_text_and_a_malformed_question_is_set_aside(
    server: RunningSubstrate, raw: httpx.AsyncClient,
) -> None:
    plain = await ask(server, "asks-3", "$CONDUCTOR_ASK 'Continue?'", hitl=False)
    message = (await until_state(raw, plain, "input-required"))["status"]["message"]
    assert message["parts"][0]["text"] == "Continue?" and "metadata" not in message  # spec.md, "Activation"
    refused = await raw.post("/agents/local-1/v1/messages:send", json=answer(plain, "f7d4b1c0-9b25-4e8c-a4ce-3d6a51e8a772", {}, "m-p"))
    assert refused.status_code == 409  # no envelope: nothing to answer here
    await raw.post(f"/agents/local-1/v1/tasks/{plain}/cancel")

    bad = await ask(server, "asks-4", "$CONDUCTOR_ASK 'Pick one' --schema '{\"type\": \"array\"}'")
    done = await until_state(raw, bad, "completed", "failed", "input-required")
    assert done["status"]["state"] == "failed"
    artifacts = (await raw.get(f"/agents/local-1/v1/tasks/{bad}/artifacts")).json()["artifacts"]
    stderr = "".join(a["artifact"]["data"] for a in artifacts if a["artifact"]["stream"] == "stderr")
    assert "refused the question" in stderr and "response_schema" in stderr


async def test_the_answer_activity_delivers_once_in_effect_and_a_repeat_counts_as_delivered(
    server: RunningSubstrate, raw: httpx.AsyncClient,
) -> None:
    """A retried `answer_question` (its first answer's response lost, or its worker crashed) meets
    the executor's 409 and reports delivered: the process is handed one answer, not two."""
    task_id = await ask(server, "asks-5", "$CONDUCTOR_ASK 'Once?' && $CONDUCTOR_ASK 'Twice?' --wait 2; echo $?")
    envelope = (await until_state(raw, task_id, "input-required"))["status"]["message"]["metadata"][HITL_PROMPT_EXTENSION]
    activities = FleetActivities(server.base_url, server.base_url, FLEET_TOKEN, EXECUTOR_TOKEN)
    try:
        answer = QuestionAnswer(instance_id="local-1", task_id=task_id, message_id="answer-1",
                                prompt_id=envelope["prompt_id"], payload={"approved": True})  # fmt: skip
        first, again = await activities.answer_question(answer), await activities.answer_question(answer)
        assert (first.delivered, first.task_state) == (True, "working")
        assert again.delivered and "already answered" in again.detail
        wrong = answer.model_copy(update={"payload": {"approved": 1}})
        second = (await until_state(raw, task_id, "input-required", "completed"))["status"]
        assert second["state"] == "input-required"  # the second question: a payload it refuses is not delivered
        other = second["message"]["metadata"][HITL_PROMPT_EXTENSION]["prompt_id"]
        assert other != envelope["prompt_id"]
        refused = await activities.answer_question(wrong.model_copy(update={"prompt_id": other}))
        assert not refused.delivered and "approved" in refused.detail
    finally:
        await activities.aclose()
    done = await until_state(raw, task_id, "completed", "failed")
    artifacts = (await raw.get(f"/agents/local-1/v1/tasks/{task_id}/artifacts")).json()["artifacts"]
    stdout = "".join(a["artifact"]["data"] for a in artifacts if a["artifact"]["stream"] == "stdout")
    assert stdout.count('{"approved": true}') == 1, stdout  # handed one answer, whatever was sent twice
    assert stdout.strip().endswith("3") and done["status"]["state"] == "completed"  # nobody answered the second: --wait ran out
