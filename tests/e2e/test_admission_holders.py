"""Admission as a shared service: holders that are not workflows share a host group with missions.

One dev server, one host group, and independent schedulers on it: the conductor's missions, the
`temporal` CLI starting an AdmissionHolder workflow and sending the singleton's signals
(workflows/admission/holders.py), and processes under `conductor admission run`
(worker/admission_run.py, run as a real process). The quota holds across
all of them; a preemptible wrapped process loses its lease to an urgent mission and is stopped; a
wrapper killed outright frees its capacity at the TTL; a request never admitted never runs its
command; signals reach the command. AIWG's shared-host-scheduler.ts describes the same contract:
one admission authority per host group for every orchestrator and provider-native loop.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from activities.admission import set_policy_with_start
from substrate.procs import alive
from tests.support.substrate_fixtures import substrate  # noqa: F401  (fixture)
from tests.support.cli_support import conductor_command, conductor_now, ended, environment_for, run_process
from tests.support.mission_harness import mission_harness
from tests.support.processes import eventually, wait_until
from worker.admission_run import EXIT_LEASE_LOST, EXIT_NOT_ADMITTED
from worker.binaries import temporal_cli
from worker.lease import HostGroupWatch, acquire, hold
from worker.mission_control import parse_spec
from workflows.admission.holders import HeldRequest, HolderDecisionQuery, holder_workflow_id
from workflows.admission.messages import AdmissionDecision, LeaseRow, PolicyChange, admission_workflow_id
from workflows.admission.model import AdmissionPolicy, AuditEvent

ONE_SLOT = AdmissionPolicy(max_concurrent=1, runtime_quotas={"host": 1}, lease_ttl_seconds=4, allow_preemption=True)


def _env(client: Client) -> dict[str, str]:
    return environment_for(client.service_client.config.target_host)


async def _host_group(client: Client, h, name: str | None = None, policy: AdmissionPolicy = ONE_SLOT) -> str:
    """A host group of this test's, started with `policy` as an operator would."""
    host_group = name or f"hg-{h.suffix}"
    await set_policy_with_start(client, h.config.task_queue, host_group, PolicyChange(operator="ops", policy=policy))
    return host_group


async def _wrapper(client: Client, host_group: str, *args: str) -> asyncio.subprocess.Process:
    """`conductor admission run --host-group G ARGS` as a real process."""
    return await asyncio.create_subprocess_exec(
        *conductor_command(), "admission", "run", "--host-group", host_group, *args,
        env=_env(client), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )


async def _leases(client: Client, host_group: str) -> list[LeaseRow]:
    return await client.get_workflow_handle(admission_workflow_id(host_group)).query("leases", result_type=list[LeaseRow])


async def _audit(client: Client, host_group: str) -> list[AuditEvent]:
    return await client.get_workflow_handle(admission_workflow_id(host_group)).query("audit", 200, result_type=list[AuditEvent])


async def _until_audited(client: Client, host_group: str, request_id: str) -> None:
    """Until the singleton has recorded `request_id` (queued, at least)."""
    async def seen() -> bool:
        return any(event.request_id == request_id for event in await _audit(client, host_group))

    await eventually(seen, f"request {request_id} recorded", within=30)


async def _until_written(path: Path) -> str:
    """What a wrapped command wrote into `path` once it runs."""
    async def written() -> str | None:
        return (path.read_text().strip() or None) if path.exists() else None

    return await eventually(written, f"the wrapped command writing {path.name}", within=30)


async def _temporal(client: Client, *args: str) -> tuple[int, str, str]:
    return await run_process(temporal_cli(), *args, env=_env(client))


async def test_a_wrapped_command_runs_under_a_lease_and_exits_with_its_status(dev_client: Client, substrate, tmp_path):
    async with mission_harness(dev_client, substrate, tmp_path, as_in_production=True) as h:
        host_group = await _host_group(dev_client, h)
        wrapper = await _wrapper(dev_client, host_group, "--request-id", "w-status", "--", "sh", "-c", "echo hello; exit 3")
        code, out, err = await ended(wrapper)
        assert (code, out) == (3, "hello\n"), err
        assert "admitted: request w-status holds a lease" in err and err.count("\n") == 1, err
        events = [(event.type, event.reason) for event in await _audit(dev_client, host_group) if event.request_id == "w-status"]
        assert [kind for kind, _ in events] == ["queued", "admitted", "released"], events
        assert await _leases(dev_client, host_group) == []

        # A command that cannot be run: 127 (126 for one that is not executable) and one line, as a shell says.
        for name, status, why in (("no-such-command-here", 127, "No such file or directory"), (str(tmp_path), 126, "Permission denied")):
            missing = await _wrapper(dev_client, host_group, "--request-id", f"w-{status}", "--", name)
            code, out, err = await ended(missing)
            assert code == status and f"cannot run {name}: {why}" in err.splitlines()[-1], (code, err)
        assert await _leases(dev_client, host_group) == []


async def test_missions_the_temporal_cli_and_wrapped_processes_share_one_quota(dev_client: Client, substrate, tmp_path):
    async with mission_harness(dev_client, substrate, tmp_path, as_in_production=True) as h:
        host_group = f"hg-{h.suffix}"
        singleton = admission_workflow_id(host_group)
        await set_policy_with_start(dev_client, h.config.task_queue, host_group, PolicyChange(operator="ops", policy=ONE_SLOT))
        marker = tmp_path / "wrapped.pid"
        victim = await _wrapper(dev_client, host_group, "--request-id", "w-victim", "--preemptible", "--grace", "2",
                                "--", "sh", "-c", f"echo $$ > {marker}; exec sleep 300")

        command_pid = int(await _until_written(marker))

        # A TypeScript Cockpit or an operator's script through the `temporal` CLI: its holder workflow, started.
        holder = holder_workflow_id(host_group, "cockpit", "cli-1")
        request = {"host_group": host_group, "holder": "cockpit", "request": {"request_id": "cli-1", "orchestrator_id": "cockpit"}}
        code, _, err = await _temporal(h.client, "workflow", "start", "--type", "AdmissionHolder", "--task-queue",
                                       h.config.task_queue, "--workflow-id", holder, "--input", json.dumps(request))
        assert code == 0, err

        async def decision() -> AdmissionDecision:
            code, out, err = await _temporal(h.client, "workflow", "query", "--workflow-id", holder, "--name", "decision",
                                             "--output", "json")
            assert code == 0, err
            return AdmissionDecision.model_validate(json.loads(out)["queryResult"][0])

        async def queued_first() -> AdmissionDecision | None:
            current = await decision()
            return current if current.state == "queued" and current.position == 1 else None

        await eventually(queued_first, "the CLI holder queued at position 1")
        assert len(await _leases(dev_client, host_group)) == 1  # the wrapped process holds the only slot

        # An urgent mission preempts the preemptible wrapped process, which is stopped; the mission runs.
        urgent = parse_spec(h.spec("urgent", [{"child_id": "now", "kind": "one-shot-command", "prompt": "true", "priority": 9}]))
        ledger = await h.control.run(urgent)
        assert ledger.parent_state == "completed"
        code, _, err = await ended(victim)
        assert code == EXIT_LEASE_LOST and "lease lost (preempted by urgent-" in err, (code, err)
        assert not alive(command_pid)

        # The CLI holder's request comes next; it gives the lease back with the singleton's `release` signal.
        async def admitted() -> AdmissionDecision | None:
            current = await decision()
            return current if current.state == "admitted" else None

        await eventually(admitted, "the CLI holder admitted")
        [lease] = await _leases(dev_client, host_group)
        assert (lease.request_id, lease.holder) == ("cli-1", holder)
        # Someone else's lease is not this holder's to give back: refused, the lease stays.
        code, _, err = await _temporal(h.client, "workflow", "signal", "--workflow-id", singleton, "--name", "release",
                                       "--input", json.dumps({"requester": "holder:mallory", "request_ids": ["cli-1"]}))
        assert code == 0, err
        code, _, err = await _temporal(h.client, "workflow", "signal", "--workflow-id", singleton, "--name", "release",
                                       "--input", json.dumps({"requester": holder, "request_ids": ["cli-1"]}))
        assert code == 0, err
        code, out, err = await _temporal(h.client, "workflow", "result", "--workflow-id", holder, "--output", "json")
        assert code == 0 and json.loads(out)["result"]["state"] == "released", out + err
        trail = [event.type for event in await _audit(dev_client, host_group) if event.request_id == "cli-1"]
        assert trail == ["queued", "admitted", "released"], trail
        # At no moment did more than one request hold a lease.
        held, most = 0, 0
        for event in await _audit(dev_client, host_group):
            held += (event.to_state == "admitted") - (event.from_state == "admitted")
            most = max(most, held)
        assert most == 1


async def test_never_admitted_never_runs_and_a_killed_wrapper_frees_its_capacity_at_the_ttl(
    dev_client: Client, substrate, tmp_path,
):
    async with mission_harness(dev_client, substrate, tmp_path, as_in_production=True) as h:
        host_group = await _host_group(dev_client, h)
        marker = tmp_path / "holder.pid"
        holder = await _wrapper(dev_client, host_group, "--request-id", "w-holder", "--",
                                "sh", "-c", f"echo $$ > {marker}; exec sleep 300")
        command_pid = int(await _until_written(marker))

        # Queued behind it with a one-second queue timeout: never admitted, the command never runs.
        never = tmp_path / "never"
        code, _, err = await ended(await _wrapper(dev_client, host_group, "--request-id", "w-late", "--queue-timeout", "1",
                                                   "--", "touch", str(never)))
        assert code == EXIT_NOT_ADMITTED and "not admitted: request w-late was timed-out" in err, (code, err)
        assert "request w-late queued: position 1" in err and not never.exists()

        # Interrupted while queued: the request is withdrawn.
        waiting = await _wrapper(dev_client, host_group, "--request-id", "w-interrupted", "--", "touch", str(never))
        await _until_audited(dev_client, host_group, "w-interrupted")
        waiting.send_signal(signal.SIGINT)
        code, _, err = await ended(waiting)
        assert code == 130 and "interrupted while queued" in err and not never.exists(), (code, err)

        # The holder killed outright: its command dies with it, and its lease ends at the TTL.
        started = asyncio.get_running_loop().time()
        holder.kill()
        await holder.wait()
        after = await _wrapper(dev_client, host_group, "--request-id", "w-after", "--", "true")
        code, _, err = await ended(after)
        waited = asyncio.get_running_loop().time() - started
        assert code == 0, err
        assert waited < ONE_SLOT.lease_ttl_seconds + 6, waited
        assert not alive(command_pid)
        trail = [event for event in await _audit(dev_client, host_group) if event.request_id == "w-holder"]
        assert trail[-1].to_state == "cancelled" and "not requeued" in trail[-1].reason, trail


async def test_signals_reach_the_wrapped_command_and_python_code_holds_leases_with_async_with(
    dev_client: Client, substrate, tmp_path,
):
    async with mission_harness(dev_client, substrate, tmp_path, as_in_production=True) as h:
        host_group = await _host_group(dev_client, h)
        ready = tmp_path / "ready"
        wrapper = await _wrapper(dev_client, host_group, "--request-id", "w-term", "--",
                                 "sh", "-c", f"trap 'exit 7' TERM; echo trapped > {ready}; while :; do sleep 0.1; done")
        await _until_written(ready)
        wrapper.send_signal(signal.SIGTERM)
        code, _, err = await ended(wrapper)
        assert code == 7, err

        # A signal the moment the wrapper says it is admitted, as the command starts: the wrapper
        # never dies of it (a SIGTERM in that gap once killed it, seen under load in CI). Either
        # the command never ran (143, the lease given back) or it got the signal.
        racing = await _wrapper(dev_client, host_group, "--request-id", "w-race", "--",
                                "sh", "-c", "trap 'exit 7' TERM; while :; do sleep 0.1; done")
        while b"admitted:" not in (line := await racing.stderr.readline()):
            assert line, "the wrapper ended before it was admitted"
        racing.send_signal(signal.SIGTERM)
        code, _, err = await ended(racing)
        assert code in (7, 143), (code, err)
        assert await _leases(dev_client, host_group) == []

        # The same API from Python code that is not a workflow, on a host group of short leases.
        policy = ONE_SLOT.model_copy(update={"lease_ttl_seconds": 1.5})
        brief = await _host_group(dev_client, h, f"brief-{h.suffix}", policy)
        request = HeldRequest(request_id="py-1", orchestrator_id="python")
        async with hold(dev_client, brief, request, holder="python@tests") as lease:
            assert lease.decision.state == "admitted" and not lease.lost.is_set()
            [row] = await _leases(dev_client, brief)
            assert row.holder == holder_workflow_id(brief, "python@tests", "py-1")
            await asyncio.sleep(policy.lease_ttl_seconds * 2)  # renewed meanwhile: still held
            [again] = await _leases(dev_client, brief)
            assert not lease.lost.is_set() and again.lease_expires_at > row.lease_expires_at
        assert await _leases(dev_client, brief) == []


async def test_aging_lets_an_old_wrapped_request_past_newer_urgent_missions(dev_client: Client, substrate, tmp_path):
    aging = ONE_SLOT.model_copy(update={"aging_interval_seconds": 0.25, "allow_preemption": False})
    async with mission_harness(dev_client, substrate, tmp_path, as_in_production=True) as h:
        host_group = await _host_group(dev_client, h, policy=aging)
        async with hold(dev_client, host_group, HeldRequest(request_id="blocker", orchestrator_id="ops"), holder="ops"):
            old = await _wrapper(dev_client, host_group, "--request-id", "w-old", "--", "true")
            await _until_audited(dev_client, host_group, "w-old")
            await asyncio.sleep(3)  # twelve aging steps: effective priority 12
            newer = parse_spec(h.spec("newer", [{"child_id": "c", "kind": "one-shot-command", "prompt": "true", "priority": 5}]))
            await h.control.start(newer)
            await _until_audited(dev_client, host_group, f"{newer.mission_id}:c")
        assert (await ended(old))[0] == 0
        await h.control.wait_for_verdict(newer.mission_id)
        admitted = [event.request_id for event in await _audit(dev_client, host_group) if event.type == "admitted"]
        assert admitted.index("w-old") < admitted.index(f"{newer.mission_id}:c"), admitted


async def test_holders_of_one_process_hear_their_decisions_through_one_watch_of_the_singleton(
    dev_client: Client, substrate, tmp_path,
):
    """A process with many holders (a Cockpit, the storm of bench/admission_storm.py) reads the
    decisions from the singleton's history, as the singleton writes them; the `holder_decision`
    query answers too, for a client that only asks now and then."""
    async with mission_harness(dev_client, substrate, tmp_path, as_in_production=True) as h:
        host_group = await _host_group(dev_client, h)
        singleton = dev_client.get_workflow_handle(admission_workflow_id(host_group))
        heard: list[tuple[str, str]] = []
        async with HostGroupWatch(dev_client, host_group) as watch:
            first = await acquire(dev_client, host_group, HeldRequest(request_id="first", orchestrator_id="ops"), holder="ops",
                                  watch=watch, on_decision=lambda d: heard.append((d.request_id, d.state)))
            second = asyncio.ensure_future(acquire(
                dev_client, host_group, HeldRequest(request_id="second", orchestrator_id="ops"), holder="ci",
                watch=watch, on_decision=lambda d: heard.append((d.request_id, d.state)),
            ))
            await _until_audited(dev_client, host_group, "second")
            queued = await singleton.query("holder_decision", HolderDecisionQuery(holder="ci", request_id="second"),
                                           result_type=AdmissionDecision)
            assert queued.state == "queued" and queued.position == 1, queued
            assert not second.done()
            await first.give_back()
            lease = await asyncio.wait_for(second, 15)
            assert lease.decision.state == "admitted"
            await lease.give_back()
        # Each decision heard once, in order, whichever of the watch and the holder workflow's history brought it.
        assert [state for request, state in heard if request == "first"] == ["admitted", "released"], heard
        assert [state for request, state in heard if request == "second"] == ["queued", "admitted", "released"], heard
        assert await _leases(dev_client, host_group) == []


def test_the_wrapper_refuses_a_missing_command_in_one_line(capsys):
    result = conductor_now(capsys, "admission", "run", "--host-group", "default")
    assert result.code == 2 and "needs a command after --" in result.line


async def test_a_watch_that_cannot_read_the_singleton_says_so_at_once_and_when_it_is_left(dev_client: Client, caplog):
    """A watch stopped by an answer no wait changes (here: its client's namespace does not exist)
    logs it as an error when it happens, and raises it where its `async with` ends: a process never
    runs on unaware that its holders lost the quicker path to their decisions."""
    elsewhere = await Client.connect(dev_client.service_client.config.target_host, namespace="no-such-namespace")
    with pytest.raises(RPCError) as refused:
        async with HostGroupWatch(elsewhere, "default"):
            await wait_until(lambda: any(r.levelname == "ERROR" and "decisions watch" in r.getMessage() for r in caplog.records),
                             timeout=20, what="the watch's error in the log")
    assert refused.value.status == RPCStatusCode.NOT_FOUND and "no-such-namespace" in str(refused.value), refused.value


AMOUNTS = AdmissionPolicy(max_concurrent=10, runtime_quotas={"host": 10}, lease_ttl_seconds=4,
                          resource_capacity={"gpu": 2, "memory_gib": 16})


async def test_missions_and_wrapped_processes_share_amounts_and_no_resource_is_ever_over_capacity(
    dev_client: Client, substrate, tmp_path,
):
    """Issue 37 end to end on a dev server: wrapped processes and a mission's children name GPUs and
    memory on one host group. A request for both GPUs waits for the one in use, says what it waits on
    and when it is expected to start; the mission's one-GPU children pass it only by ending first
    (backfill). Replaying the audit trail with each request's amounts: at no moment is any resource
    over its capacity."""
    async with mission_harness(dev_client, substrate, tmp_path, as_in_production=True) as h:
        host_group = await _host_group(dev_client, h, policy=AMOUNTS)
        marker = tmp_path / "one-gpu.pid"
        one = await _wrapper(dev_client, host_group, "--request-id", "w-one", "--resource", "gpu=1",
                             "--resource", "memory_gib=8", "--expected-duration", "4",
                             "--", "sh", "-c", f"echo $$ > {marker}; exec sleep 4")
        await _until_written(marker)
        both = await _wrapper(dev_client, host_group, "--request-id", "w-both", "--resource", "gpu=2",
                              "--expected-duration", "1", "--", "true")
        await _until_audited(dev_client, host_group, "w-both")
        children = [{"child_id": f"c{n}", "kind": "one-shot-command", "prompt": "sleep 1",
                     "resources": {"gpu": 1}, "expected_duration_seconds": 2} for n in range(3)]
        ledger = await h.control.run(parse_spec(h.spec("gpus", children)))
        assert ledger.parent_state == "completed", ledger.aggregation.reason
        assert (await ended(one))[0] == 0
        code, _, err = await ended(both)
        assert code == 0, err
        assert "request w-both queued: position 1, waiting on resource gpu 1/2, expected to start " in err, err

        amounts = {"w-one": {"gpu": 1, "memory_gib": 8}, "w-both": {"gpu": 2}}
        used: dict[str, float] = {"gpu": 0, "memory_gib": 0}
        peak = dict(used)
        admitted = set()
        for event in await _audit(dev_client, host_group):
            asked = amounts.get(event.request_id or "", {"gpu": 1})  # the rest are the mission's children
            sign = (event.to_state == "admitted") - (event.from_state == "admitted")
            if event.to_state == "admitted" and event.from_state != "admitted":
                admitted.add(event.request_id)
            for name, amount in asked.items():
                used[name] += sign * amount
                peak[name] = max(peak[name], used[name])
                assert used[name] <= AMOUNTS.resource_capacity[name], (event, used)
        assert peak["gpu"] == 2 and len(admitted) == 5, (peak, admitted)
