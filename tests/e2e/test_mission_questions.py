"""Approval waits end to end (hitl-prompt/v1): a child's task asks, operators answer through
`conductor mission approve`, deadlines end the wait, and gates hold a child before dispatch.

Dev server, worker, real HTTP to the local substrate, whose processes ask with `$CONDUCTOR_ASK`
(substrate/questions.py), so the question travels the real wire: `input-required` with the
envelope, the record `blocked` on approval (fleet.rs), the answer a `messages:send` naming the task.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from temporalio.client import Client

from tests.support.mission_harness import MissionHarness, mission_harness
from tests.support.substrate_fixtures import substrate, substrate_tasks  # noqa: F401  (fixture)
from worker.cli import run as run_cli
from worker.ledger_view import render_ledger
from worker.mission_control import parse_spec
from workflows.admission.model import AdmissionPolicy
from workflows.mission.ledger import ChildLedger
from workflows.mission.questions import APPROVAL_TIMEOUT_CODE, GATE_REJECTED_CODE, AnswerRequest
from workflows.mission.search import MISSION_AWAITING_ANSWER
from workflows.workload.record import fleet_child_id

pytestmark = pytest.mark.timeout(120)
# Leases of 4 s, renewed every third of that: a wait of a few seconds outlives several TTLs.
SHORT_LEASES = AdmissionPolicy(max_concurrent=8, runtime_quotas={"host": 8}, lease_ttl_seconds=4)
SCHEMA = {"type": "object", "required": ["color"], "additionalProperties": False,
          "properties": {"color": {"enum": ["red", "blue"]}, "comment": {"type": "string"}}}


def child(child_id: str, prompt: str, **fields: object) -> dict:
    return {"child_id": child_id, "kind": "one-shot-command", "prompt": prompt, **fields}


async def asking(h: MissionHarness, mission_id: str, child_id: str) -> ChildLedger:
    async def asked() -> ChildLedger | None:
        found = (await h.control.show(mission_id)).child(child_id)
        return found if found.question is not None else None

    return await h.until(asked, f"{child_id} asking its question")


def approve(*argv: str) -> int:
    return run_cli(["mission", "approve", *argv])


async def test_a_childs_question_is_shown_answered_once_and_its_lease_held_meanwhile(
    dev_client: Client, substrate, tmp_path, monkeypatch, capsys,
) -> None:
    async with mission_harness(dev_client, substrate, tmp_path, policy=SHORT_LEASES) as h:
        for key, value in h.cli_env().items():
            monkeypatch.setenv(key, value)
        schema = json.dumps(SCHEMA)
        spec = parse_spec(h.spec("asks", [
            child("pick", f"$CONDUCTOR_ASK 'Which color?' --schema '{schema}'"),
            child("ship", "$CONDUCTOR_ASK 'Ship it?' --responder consensus:2 && echo shipped"),
        ]))
        await h.control.start(spec)
        mission = spec.mission_id
        pick = await asking(h, mission, "pick")
        assert pick.observed_state == "blocked" and pick.backpressure and pick.backpressure.reason == "approval"
        assert pick.question.prompt == "Which color?" and pick.question.response_schema == SCHEMA
        await asking(h, mission, "ship")
        shown = render_ledger(await h.control.show(mission))
        assert "asks (executor, prompt" in shown and "Which color?" in shown and f"mission approve {mission} pick" in shown

        async def listed() -> bool:  # the search attribute finds the missions waiting on an answer
            query = f"{MISSION_AWAITING_ANSWER.name} = true AND WorkflowId = 'mission:{mission}'"
            return bool([row async for row in dev_client.list_workflows(query)])

        await h.until(listed, "the mission found by MissionAwaitingAnswer = true")
        capsys.readouterr()
        assert await asyncio.to_thread(run_cli, ["mission", "list", "--awaiting-answer", "--json"]) == 0
        assert mission in capsys.readouterr().out

        # Refused, and nothing sent: a payload the schema refuses (exit 2), approve on a schema without `approved`.
        assert await asyncio.to_thread(approve, mission, "pick", "--payload", '{"color": "green"}', "--operator", "alice") == 2
        assert "color" in capsys.readouterr().err
        assert await asyncio.to_thread(approve, mission, "pick", "--operator", "alice") == 2
        assert "--payload" in capsys.readouterr().err
        assert (await h.control.show(mission)).child("pick").question is not None

        assert await asyncio.to_thread(approve, mission, "pick", "--payload", '{"color": "blue"}', "--operator", "alice") == 0
        assert "delivered" in capsys.readouterr().out
        # consensus:2: the first agreeing operator is a vote; the same operator again is refused; a second forwards.
        assert await asyncio.to_thread(approve, mission, "ship", "--operator", "alice") == 0
        assert "vote" in capsys.readouterr().out
        assert await asyncio.to_thread(approve, mission, "ship", "--operator", "alice") == 2
        assert "already answered" in capsys.readouterr().err
        await asyncio.sleep(9)  # more than two lease TTLs with the questions open... and one answered
        leases = await h.admission_leases(spec.host_group)
        assert any(lease.endswith(":ship") for lease in leases), leases  # still admitted: capacity stays reserved
        assert await asyncio.to_thread(approve, mission, "ship", "--operator", "bob", "--comment", "lgtm") == 0

        ledger = await h.control.wait_for_verdict(mission)
        assert ledger.parent_state == "completed", ledger.aggregation.reason
        final = await h.control.handle(mission).result()
        assert json.loads(final.child("pick").output) == {"color": "blue"}
        assert "shipped" in final.child("ship").output
        answers = final.child("ship").answers
        assert [(a.operator, a.outcome) for a in answers] == [("alice", "vote"), ("bob", "delivered")]
        assert answers[1].payload == {"approved": True, "comment": "lgtm"}
        assert final.child("ship").attempts[0].lease_revision == 1  # one lease the whole wait: renewed, never re-admitted
        assert await asyncio.to_thread(approve, mission, "pick") == 1  # nothing open: exit 1


async def test_an_unanswered_question_times_out_the_child_and_cancels_its_task(dev_client: Client, substrate, tmp_path) -> None:
    async with mission_harness(dev_client, substrate, tmp_path) as h:
        spec = parse_spec(h.spec("deadline", [
            child("late", "$CONDUCTOR_ASK 'Anyone?' --deadline-seconds 2; sleep 60"),
            child("bounded", "$CONDUCTOR_ASK 'Anyone at all?'; sleep 60", approval={"timeout_seconds": 2}),
        ], aggregation={"mode": "quorum", "minimum_successes": 1}))
        final = await h.control.run(spec)
        final = await h.control.handle(spec.mission_id).result()
        for child_id in ("late", "bounded"):
            ended = final.child(child_id)
            assert (ended.observed_state, ended.error_code) == ("timed-out", APPROVAL_TIMEOUT_CODE), ended
            tasks = substrate_tasks(substrate, fleet_child_id(spec.mission_id, child_id))
            assert [task["state"] for task in tasks] == ["canceled"]
            assert ended.admission.state == "released"
        assert final.parent_state == "failed"


async def test_gates_hold_children_before_dispatch_until_approved_rejected_or_late(
    dev_client: Client, substrate, tmp_path, monkeypatch, capsys,
) -> None:
    async with mission_harness(dev_client, substrate, tmp_path) as h:
        for key, value in h.cli_env().items():
            monkeypatch.setenv(key, value)
        spec = parse_spec(h.spec("gates", [
            child("go", "echo went", approval={"required": True}),
            child("no", "echo never", approval={"required": True}),
            child("slow", "echo never", approval={"required": True, "timeout_seconds": 3}),
        ], aggregation={"mode": "quorum", "minimum_successes": 1}))
        await h.control.start(spec)
        mission = spec.mission_id
        gate = await asking(h, mission, "go")
        assert gate.question.prompt == "dispatch go?" and gate.question.source == "gate"
        assert gate.observed_state == "blocked" and gate.backpressure.reason == "approval"
        assert gate.admission.state == "admitted"  # admitted, lease held, and nothing dispatched:
        assert substrate_tasks(substrate, fleet_child_id(mission, "go")) == []
        await asking(h, mission, "no")
        assert await asyncio.to_thread(approve, mission, "go", "--operator", "alice") == 0
        assert await asyncio.to_thread(approve, mission, "no", "--reject", "--comment", "not today", "--operator", "bob") == 0
        final = await h.control.handle(mission).result()
        assert final.child("go").observed_state == "succeeded" and final.child("go").output.strip() == "went"
        rejected = final.child("no")
        assert (rejected.observed_state, rejected.error_code) == ("cancelled", GATE_REJECTED_CODE)
        assert rejected.backpressure.reason == "policy" and rejected.backpressure.retryable is False
        assert "not today" in rejected.note and rejected.admission.state == "released"
        late = final.child("slow")
        assert (late.observed_state, late.error_code) == ("timed-out", APPROVAL_TIMEOUT_CODE)
        for child_id in ("no", "slow"):
            assert substrate_tasks(substrate, fleet_child_id(mission, child_id)) == []  # never dispatched
        assert [a.outcome for a in rejected.answers] == ["rejected-dispatch"]


async def test_a_mission_continues_as_new_while_its_children_wait_for_answers(dev_client: Client, substrate, tmp_path) -> None:
    """A person may take days to answer, and renewing the leases meanwhile lengthens the history:
    the mission hands over to a new run while a gate asks and while a one-shot with `approval`
    waits on its question (it reports by signal, as long-lived children do), and still finishes."""
    async with mission_harness(dev_client, substrate, tmp_path, policy=SHORT_LEASES) as h:
        spec = parse_spec(h.spec("patient", [
            child("gate", "echo gated", approval={"required": True}),
            child("ask", "$CONDUCTOR_ASK 'Still there?' && echo still", approval={"timeout_seconds": 600}),
        ]))
        await h.control.start(spec, max_history_events=100, alive_every_seconds=1)
        mission = spec.mission_id
        await asking(h, mission, "gate")
        await asking(h, mission, "ask")
        workflow_id = f"mission:{mission}"

        async def handed_over() -> bool:
            return len([run async for run in dev_client.list_workflows(f"WorkflowId = '{workflow_id}'")]) >= 2

        await h.until(handed_over, "the mission continuing as new while both wait", within=60)
        for child_id in ("gate", "ask"):
            await h.control.answer(mission, AnswerRequest(child_id=child_id, operator="alice", payload={"approved": True}))
        final = await h.control.handle(mission).result()
        assert final.parent_state == "completed", final.aggregation.reason
        assert final.child("gate").output.strip() == "gated" and "still" in final.child("ask").output
        assert [a.outcome for a in final.child("gate").answers] == ["approved-dispatch"]
