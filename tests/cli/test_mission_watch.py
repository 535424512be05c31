"""`conductor mission watch`: a timestamped line per change (not per snapshot), --json, and following
the mission past its verdict until it closes (long-lived children supervised until `stop`)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from datetime import datetime

from temporalio.client import Client

from tests.support.substrate_fixtures import substrate  # noqa: F401  (fixture)
from tests.support.mission_harness import mission_harness
from worker.cli import run as run_cli
from worker.mission_control import parse_spec
from workflows.admission.messages import LeaseRef, LeaseRow, RenewBatch, admission_workflow_id
from workflows.admission.model import AdmissionPolicy

# A short lease, renewed every second while the watchers follow the mission.
SHORT_LEASES = AdmissionPolicy(max_concurrent=8, runtime_quotas={"host": 8}, lease_ttl_seconds=3)

PROGRESS = re.compile(r"^\d\d:\d\d:\d\d snapshot \d+ ")
CLI = "from worker.cli import main; main()"  # as the console script: exit_now, no finalizing with Temporal core loaded


async def _conductor_process(env: dict[str, str], *argv: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-c", CLI, *argv, env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )


async def test_watch_follows_a_daemon_mission_past_its_verdict_until_stop(
    dev_client: Client, substrate, tmp_path, monkeypatch, capsys,
):
    (tmp_path / "temporal.toml").write_text("")  # no profile of whoever runs the tests
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(tmp_path / "temporal.toml"))
    async with mission_harness(dev_client, substrate, tmp_path, policy=SHORT_LEASES) as h:
        env = {**h.cli_env(), "TEMPORAL_CONFIG_FILE": str(tmp_path / "temporal.toml")}
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        spec = parse_spec(h.spec("watched", [
            {"child_id": "report", "kind": "one-shot-command", "prompt": "echo report ready"},
            {"child_id": "api", "kind": "daemon", "prompt": "sleep 300"},
        ], aggregation={"mode": "all-pass"}))
        await h.control.start(spec)
        capsys.readouterr()
        watch = asyncio.create_task(asyncio.to_thread(run_cli, ["mission", "watch", spec.mission_id]))
        as_json = await _conductor_process(env, "mission", "watch", "--json", spec.mission_id)
        until_verdict = await _conductor_process(env, "mission", "watch", "--until-verdict", spec.mission_id)

        # The verdict settles; the mission runs on, the daemon's lease renewed every second.
        verdict = await h.until(
            lambda: _final_ledger(h, spec.mission_id), "the verdict", within=20,
        )
        assert verdict.parent_state == "completed", verdict.aggregation.reason
        out, err = await asyncio.wait_for(until_verdict.communicate(), 10)
        assert until_verdict.returncode == 0, err.decode()
        assert "verdict settled" not in out.decode() and f"mission {spec.mission_id}: completed" in out.decode()
        # Ledger snapshots that change nothing a person reads: the mission's own renewals get no
        # answer (requester renewals), so the test renews its lease by name, as the mission's
        # client does when a renewal may have arrived late, and each decision back is a new lease
        # revision in the ledger.
        renewed = verdict
        for _ in range(3):
            await _renew_by_name(h, spec.host_group, h.control.handle(spec.mission_id).id)
            renewed = await h.until(
                lambda seq=renewed.snapshot_seq: _seq_past(h, spec.mission_id, seq + 1), "a renewal's decision in the ledger",
            )
            await asyncio.sleep(0.6)  # the watchers (every 0.5 s) read each of them
        assert not watch.done() and as_json.returncode is None, "watch stopped at the verdict"

        await h.control.stop(spec.mission_id)
        code = await asyncio.wait_for(watch, 15)
        text = capsys.readouterr().out
        out, err = await asyncio.wait_for(as_json.communicate(), 15)
        final = await h.control.handle(spec.mission_id).result()
        assert final.snapshot_seq > renewed.snapshot_seq

    # Text: one timestamped line per change, never the same thing twice in a row, the verdict said
    # once, then the final ledger; exit 0 (completed).
    assert code == 0, text
    lines = text.splitlines()
    progress = [line for line in lines if PROGRESS.match(line)]
    assert progress, text
    said = [line.split(" ", 3)[3] for line in progress]  # what each says, without time and sequence
    assert all(a != b for a, b in zip(said, said[1:])), text
    assert len(progress) < final.snapshot_seq, "a line for every snapshot"
    settled = [line for line in lines if "verdict settled: completed" in line]
    assert len(settled) == 1 and re.match(r"^\d\d:\d\d:\d\d ", settled[0]), text
    assert f"until `conductor mission stop {spec.mission_id}`" in settled[0]
    assert lines.index(settled[0]) < lines.index(f"mission {spec.mission_id}: completed")
    assert lines[-1] == f"  ledger snapshot {final.snapshot_seq}", text

    # JSON Lines: every line an object; the changes, the verdict, the final ledger last.
    assert as_json.returncode == 0, err.decode()
    records = [json.loads(line) for line in out.decode().splitlines()]
    assert records and all(isinstance(r, dict) for r in records)
    for record in records:
        assert datetime.fromisoformat(record["time"]).utcoffset().total_seconds() == 0
        assert {"snapshot_seq", "parent_state", "aggregation", "children"} <= record.keys()
        assert "reason" in record["aggregation"] and set(record["children"]) == {"report", "api"}
    changes = [r for r in records if r["event"] == "progress"]
    seen = [(r["parent_state"], r["children"], r["counts"]) for r in changes]
    assert all(a != b for a, b in zip(seen, seen[1:]))
    assert [r["event"] for r in records].count("verdict") == 1
    last = records[-1]
    assert last["event"] == "final" and last["closed"] is True and last["parent_state"] == "completed"
    assert last["snapshot_seq"] == final.snapshot_seq and last["ledger"]["mission_id"] == spec.mission_id


async def _final_ledger(h, mission_id: str):
    from workflows.mission.aggregation import is_final

    ledger = await h.control.show(mission_id)
    return ledger if is_final(ledger) else None


async def _renew_by_name(h, host_group: str, holder: str) -> None:
    singleton = h.client.get_workflow_handle(admission_workflow_id(host_group))
    leases = [row for row in await singleton.query("leases", result_type=list[LeaseRow]) if row.holder == holder]
    assert leases, f"{holder} holds no lease"
    await singleton.signal("renew", RenewBatch(
        requester=holder, leases=[LeaseRef(request_id=row.request_id, lease_revision=row.lease_revision) for row in leases],
    ))


async def _seq_past(h, mission_id: str, seq: int):
    ledger = await h.control.show(mission_id)
    return ledger if ledger.snapshot_seq >= seq else None
