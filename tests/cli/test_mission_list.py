"""`conductor mission list` (Temporal visibility, filters, closed missions, continue-as-new) and
`conductor mission show` saying where a queued child stands in the admission queue.

Real dev server (its visibility answers the queries), a real worker and substrate.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta, timezone
import uuid

import pytest
from temporalio.client import Client

from tests.support.substrate_fixtures import substrate  # noqa: F401  (fixture)
from tests.support.mission_harness import POLICY, mission_harness
from tests.support.cli_support import Result, conductor, without_profiles
from worker.mission_control import parse_spec
from activities.visibility import literal
from worker.mission_list import list_missions, mission_query
from workflows.admission.messages import QueueRow, admission_workflow_id


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, tmp_path):
    """Returns a function that points the CLI at a harness (and no profile of whoever runs the tests)."""
    without_profiles(monkeypatch, tmp_path)
    monkeypatch.setenv("TEMPORAL_NAMESPACE", "default")
    monkeypatch.setenv("CONDUCTOR_RECONNECT_SECONDS", "5")

    def point_at(h) -> None:
        for key, value in h.cli_env().items():
            monkeypatch.setenv(key, value)
    return point_at


def one_shot(child_id: str, prompt: str) -> dict:
    return {"child_id": child_id, "kind": "one-shot-command", "prompt": prompt}


def daemon(child_id: str, prompt: str = "sleep 300") -> dict:
    return {"child_id": child_id, "kind": "daemon", "prompt": prompt}


def rows_of(out: str) -> dict[str, str]:
    """Table lines by mission id (first column)."""
    return {line.split()[0]: line for line in out.splitlines()[1:] if line.strip()}


# --- the query -------------------------------------------------------------------------------------


def test_the_query_quotes_and_checks_every_value():
    query = mission_query(state="running", host_group="o'hg", orchestrator="o'brien\\x", running=True)
    assert query.text == (
        "WorkflowType = 'MissionWorkflow' AND ExecutionStatus != 'ContinuedAsNew' AND MissionState = 'running' "
        "AND MissionHostGroup = 'o''hg' AND ExecutionStatus = 'Running'"
    )
    # A backslash or a double quote is never put in the query: the rows are matched on it.
    assert [(key.name, value) for key, value in query.exact] == [("MissionOrchestrator", "o'brien\\x")]
    assert literal("it's' OR 'a'='a") == "'it''s'' OR ''a''=''a'"
    with pytest.raises(ValueError):
        literal('a"b')
    from worker.inputs import InputError
    for bad in ({"state": "sleeping"}, {"host_group": "two words"}, {"orchestrator": "x' OR 1=1"},
                {"orchestrator": "bell\x07"}, {"running": True, "closed": True}):
        with pytest.raises(InputError):
            mission_query(**bad)


async def test_a_quote_in_a_value_matches_that_value_only(dev_client: Client, substrate, tmp_path):
    """The escaped literal is read by the server as the value itself."""
    async with mission_harness(dev_client, substrate, tmp_path) as h:
        specs = {
            orchestrator: h.spec(f"quoted-{i}", [one_shot("only", "true")], orchestrator_id=orchestrator)
            for i, orchestrator in enumerate((f"o'brien-{h.suffix}", f"back\\slash-{h.suffix}", f'dq"{h.suffix}'))
        }
        for spec in specs.values():
            await h.control.start(parse_spec(spec))
        for orchestrator, spec in specs.items():
            async def found():
                rows = await list_missions(dev_client, mission_query(orchestrator=orchestrator), 10)
                return rows or None

            rows = await h.until(found, f"the mission of {orchestrator} in visibility")
            assert [row.mission_id for row in rows] == [spec["mission_id"]]
        assert await list_missions(dev_client, mission_query(orchestrator=f"o'brien{h.suffix}"), 10) == []
        assert await list_missions(dev_client, mission_query(orchestrator=f"back\\slash{h.suffix}"), 10) == []


# --- the command ------------------------------------------------------------------------------------


async def test_list_filters_closed_missions_and_json(dev_client: Client, substrate, tmp_path, cli_env, capsys):
    async with mission_harness(dev_client, substrate, tmp_path) as h:
        cli_env(h)
        orchestrator = f"orch-{h.suffix}"
        done = parse_spec(h.spec("done", [one_shot("only", "sleep 1; echo done")], orchestrator_id=orchestrator))
        verdict = await h.control.run(done)
        assert verdict.parent_state == "completed"
        await h.control.handle(done.mission_id).result()
        live = parse_spec(h.spec("live", [daemon("api")], orchestrator_id=orchestrator, host_group=f"other-{h.suffix}"))
        await h.control.run(live)  # the verdict settles; the daemon keeps the mission running

        async def listed(*extra: str) -> Result | None:
            result = await conductor(capsys, "mission", "list", "--orchestrator", orchestrator, *extra)
            return result if result.code == 0 and len(rows_of(result.out)) == 2 else None

        result = await h.until(lambda: listed(), "both missions listed with their final state")
        header = result.out.splitlines()[0].split()
        assert header[:4] == ["MISSION", "STATE", "AGGREGATION", "HOST"] and header[-1] == "DURATION"
        rows = rows_of(result.out)
        assert list(rows) == [live.mission_id, done.mission_id]  # newest first
        assert rows[done.mission_id].split()[1:6] == ["completed", "all-pass", done.host_group, "Completed", "1/0/0"]
        assert rows[live.mission_id].split()[4] == "Running" and rows[live.mission_id].endswith("so far")
        assert rows[live.mission_id].split()[1] == "completed"  # its verdict; the daemon still runs

        running = await conductor(capsys, "mission", "list", "--orchestrator", orchestrator, "--running")
        assert list(rows_of(running.out)) == [live.mission_id]
        closed = await conductor(capsys, "mission", "list", "--orchestrator", orchestrator, "--closed", "--json")
        assert closed.code == 0 and closed.err == ""
        [entry] = json.loads(closed.out)
        assert entry["mission_id"] == done.mission_id and entry["status"] == "Completed"
        assert entry["state"] == "completed" and entry["closed"] is not None
        assert entry["children"] == {"ok": 1, "failed": 0, "pending": 0}  # exact once closed
        assert 1 <= entry["duration_seconds"] < 120 and entry["continued_as_new"] is False
        by_group = await conductor(capsys, "mission", "list", "--host-group", done.host_group, "--json")
        assert [item["mission_id"] for item in json.loads(by_group.out)] == [done.mission_id]
        by_state = await conductor(capsys, "mission", "list", "--orchestrator", orchestrator, "--state", "planning")
        assert by_state.code == 0 and by_state.out.splitlines()[1:] == ["(no missions)"]
        limited = await conductor(capsys, "mission", "list", "--orchestrator", orchestrator, "--limit", "1")
        assert list(rows_of(limited.out)) == [live.mission_id]
        recent = await conductor(capsys, "mission", "list", "--orchestrator", orchestrator, "--since", "10m")
        assert set(rows_of(recent.out)) == {live.mission_id, done.mission_id}
        future = datetime.now(timezone.utc) + timedelta(hours=1)
        later = await conductor(capsys, "mission", "list", "--orchestrator", orchestrator, "--since", future.isoformat())
        assert later.code == 0 and later.out.splitlines()[1:] == ["(no missions)"]

        await h.control.stop(live.mission_id)
        await asyncio.wait_for(h.control.handle(live.mission_id).result(), timeout=45)


async def test_no_missions_and_bad_filters(dev_client: Client, substrate, tmp_path, cli_env, capsys):
    async with mission_harness(dev_client, substrate, tmp_path) as h:
        cli_env(h)
        empty = await conductor(capsys, "mission", "list", "--orchestrator", f"nobody-{uuid.uuid4().hex[:8]}")
        assert empty.code == 0 and empty.err == ""
        assert empty.out.splitlines()[0].startswith("MISSION") and empty.out.splitlines()[1] == "(no missions)"
        as_json = await conductor(capsys, "mission", "list", "--orchestrator", f"nobody-{h.suffix}", "--json")
        assert as_json.code == 0 and json.loads(as_json.out) == []
        for bad in (["--state", "sleeping"], ["--host-group", "a b"], ["--orchestrator", "x'\x1b[2J"],
                    ["--since", "yesterday"], ["--since", "2026-12-01T09:00:00"]):
            result = await conductor(capsys, "mission", "list", *bad)
            assert result.code == 2 and result.out == "" and result.err.count("\n") == 1, result
            assert result.err.startswith("conductor: ")


async def test_a_mission_that_continued_as_new_is_listed_once(dev_client: Client, substrate, tmp_path, cli_env, capsys):
    policy = POLICY.model_copy(update={"lease_ttl_seconds": 3})  # a renewal round a second fills the history
    async with mission_harness(dev_client, substrate, tmp_path, policy=policy) as h:
        cli_env(h)
        spec = parse_spec(h.spec("continued", [daemon("api")], orchestrator_id=f"cont-{h.suffix}"))
        await h.control.run(spec, max_history_events=100)
        handle = h.control.handle(spec.mission_id)

        async def runs():
            found = [run async for run in dev_client.list_workflows(f"WorkflowId = {literal(handle.id)}")]
            return sorted(found, key=lambda run: run.start_time) if len(found) >= 2 else None

        first = (await h.until(runs, "the mission to continue as new", within=60))[0]
        result = await conductor(capsys, "mission", "list", "--orchestrator", spec.orchestrator_id, "--json")
        [entry] = json.loads(result.out)
        assert entry["mission_id"] == spec.mission_id and entry["status"] == "Running" and entry["continued_as_new"]
        assert entry["started"] == first.start_time.isoformat()  # the mission's start, not its current run's
        table = await conductor(capsys, "mission", "list", "--orchestrator", spec.orchestrator_id)
        assert list(rows_of(table.out)) == [spec.mission_id] and "continued as new" in table.out
        await h.control.stop(spec.mission_id)
        await asyncio.wait_for(handle.result(), timeout=45)


# --- show: why a child waits -----------------------------------------------------------------------


async def test_show_names_queue_position_and_binding_constraint(dev_client: Client, substrate, tmp_path, cli_env, capsys):
    policy = POLICY.model_copy(update={"max_concurrent": 1, "runtime_quotas": {"host": 1}})
    async with mission_harness(dev_client, substrate, tmp_path, policy=policy) as h:
        cli_env(h)
        holder = parse_spec(h.spec("holder", [daemon("api")]))
        await h.control.run(holder)
        waiter = parse_spec(h.spec("waiter", [one_shot("first", "echo 1"), one_shot("second", "echo 2")]))
        await h.control.start(waiter)

        async def both_queued():
            ledger = await h.control.show(waiter.mission_id)
            return ledger if all(child.admission.state == "queued" for child in ledger.children) else None

        ledger = await h.until(both_queued, "the waiting mission's children queued")
        queue = await dev_client.get_workflow_handle(admission_workflow_id(waiter.host_group)).query(
            "queue", result_type=list[QueueRow])
        by_request = {row.request_id: row for row in queue}
        shown = await conductor(capsys, "mission", "show", waiter.mission_id)
        assert shown.code == 0 and shown.err == "", shown
        lines = shown.out.splitlines()
        for child in ledger.children:
            row = by_request[child.admission.request_id]
            at = next(i for i, line in enumerate(lines) if line.split()[1:2] == [child.child_id])
            assert "blocked (capacity, retryable)" in lines[at]
            assert lines[at + 1].strip() == (
                f"waiting for admission: position {row.position} in {admission_workflow_id(waiter.host_group)}, "
                f"waiting on {row.binding_constraint}"
            )
            assert row.binding_constraint.endswith("1/1")
        assert sorted(by_request[c.admission.request_id].position for c in ledger.children) == [1, 2]

        # --json stays the ledger, exactly.
        as_json = await conductor(capsys, "mission", "show", waiter.mission_id, "--json")
        assert set(json.loads(as_json.out)) == set(ledger.model_dump(mode="json"))

        # An admission workflow that cannot answer: the ledger as before, and one note.
        await dev_client.get_workflow_handle(admission_workflow_id(waiter.host_group)).terminate("test")
        noted = await conductor(capsys, "mission", "show", waiter.mission_id)
        assert noted.code == 0 and noted.err == "", noted
        notes = [line for line in noted.out.splitlines() if line.strip().startswith("note:")]
        assert len(notes) == 1 and "admission queue not shown" in notes[0]
        assert "waiting for admission: position" not in noted.out and f"mission {waiter.mission_id}:" in noted.out

        for spec in (waiter, holder):
            await h.control.cancel(spec.mission_id)
