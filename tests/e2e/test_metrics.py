"""A worker serves Prometheus metrics: the SDK runtime's and the product's own.

Scraped over real HTTP from the SDK runtime's exporter while a worker runs real missions on
the dev server and the local substrate; names are those of `workflows/metrics.py`.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys

import httpx
from temporalio.client import Client

from tests.support.substrate_fixtures import substrate  # noqa: F401  (fixture)
from tests.support.mission_harness import mission_harness
from worker.cli import run as run_cli
from worker.metrics import metrics_runtime
from worker.mission_control import parse_spec
from worker.payloads import DATA_CONVERTER
from worker.ports import free_port
from workflows import metrics

CLI = "from worker.cli import main; main()"  # as the console script (exits without finalizing the core)
SERIES = re.compile(r"^(?P<name>[a-z_]+?)(?:_bucket|_sum|_count)?\{(?P<labels>[^}]*)\} (?P<value>\S+)$")


def series(text: str) -> list[tuple[str, dict[str, str], float]]:
    rows = []
    for line in text.splitlines():
        match = SERIES.match(line)
        if match:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"]))
            rows.append((match["name"], labels, float(match["value"])))
    return rows


def value(rows, name: str, **labels: str) -> float:
    found = [v for n, got, v in rows if n == name and all(got.get(k) == want for k, want in labels.items())]
    assert found, f"no series {name} with {labels}"
    return found[-1]


async def test_a_worker_running_missions_serves_every_product_metric(dev_client: Client, substrate, tmp_path):
    address = f"127.0.0.1:{free_port('127.0.0.1')}"
    client = await Client.connect(
        dev_client.service_client.config.target_host, namespace=dev_client.namespace,
        data_converter=DATA_CONVERTER, runtime=metrics_runtime(address),
    )
    async with mission_harness(client, substrate, tmp_path) as h:
        spec = parse_spec(h.spec("metered", [
            {"child_id": "ok", "kind": "one-shot-command", "prompt": "echo fine"},
            {"child_id": "bad", "kind": "one-shot-command", "prompt": "exit 4"},
        ], aggregation={"mode": "all-pass"}))
        await h.control.start(spec)
        try:
            final = await asyncio.wait_for(h.control.handle(spec.mission_id).result(), 60)
        except asyncio.TimeoutError:
            raise AssertionError(f"the mission did not close: {(await h.control.show(spec.mission_id)).model_dump_json()}") from None
        host_group = spec.host_group
        text = ""

        async def scraped() -> bool:
            nonlocal text
            async with httpx.AsyncClient() as http:
                text = (await http.get(f"http://{address}/metrics", timeout=5)).text
            # The leases go back unconfirmed: the singleton applies them on its next task, which
            # may come after the mission has closed.
            held = [v for n, labels, v in series(text) if n == metrics.ADMISSION_HELD
                    and labels.get("host_group") == host_group and labels.get("limit") == "global"]
            return f'verdict="{final.parent_state}"' in text and held[-1:] == [0]

        await h.until(scraped, "the mission's verdict in /metrics, its leases given back", within=15)
    rows = series(text)
    assert {name for name, _, _ in rows} >= set(metrics.PRODUCT_METRICS), sorted({n for n, _, _ in rows})
    assert final.parent_state == "failed"
    assert value(rows, metrics.MISSIONS, host_group=host_group, verdict="failed") == 1
    assert value(rows, metrics.ADMISSION_QUEUED, host_group=host_group) == 0  # everything admitted, then given back
    assert value(rows, metrics.ADMISSION_HELD, host_group=host_group, limit="global") == 0
    assert value(rows, metrics.ADMISSION_LIMIT, host_group=host_group, limit="global") == h.config.admission_policy.max_concurrent
    # Two children were admitted and dispatched: the histograms counted both.
    waits = [v for n, labels, v in rows if n == metrics.ADMISSION_WAIT and labels.get("host_group") == host_group and "le" not in labels]
    assert waits and max(waits) >= 2, waits
    dispatches = [v for n, labels, v in rows if n == metrics.DISPATCH_LATENCY and labels.get("kind") == "one-shot-command" and "le" not in labels]
    assert dispatches and max(dispatches) >= 2, dispatches
    assert value(rows, metrics.LEASE_EXPIRATIONS, host_group=host_group) == 0
    assert value(rows, metrics.PREEMPTIONS, host_group=host_group) == 0
    assert any(name.startswith("temporal_") for name, _, _ in rows)  # the SDK's own, on the same endpoint


async def test_conductor_worker_serves_metrics_where_it_is_told(dev_client: Client, tmp_path):
    address = f"127.0.0.1:{free_port('127.0.0.1')}"
    (tmp_path / "temporal.toml").write_text("")
    env = {
        **os.environ, "TEMPORAL_CONFIG_FILE": str(tmp_path / "temporal.toml"),
        "TEMPORAL_ADDRESS": dev_client.service_client.config.target_host, "CONDUCTOR_DATA_DIR": str(tmp_path),
        "CONDUCTOR_TASK_QUEUE": "metrics-only", "CONDUCTOR_METRICS_ADDRESS": address,
    }
    worker = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CLI, "worker", env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        line = (await asyncio.wait_for(worker.stdout.readline(), 30)).decode()  # type: ignore[union-attr]
        assert f"metrics http://{address}/metrics" in line, line
        async with httpx.AsyncClient() as http:
            response = await http.get(f"http://{address}/metrics", timeout=5)
        assert response.status_code == 200 and "temporal_" in response.text
    finally:
        worker.send_signal(2)
        await asyncio.wait_for(worker.wait(), 30)
    assert worker.returncode == 0, (await worker.stderr.read()).decode()  # type: ignore[union-attr]


def test_a_bad_metrics_address_is_one_line_and_exit_2(capsys, monkeypatch):
    monkeypatch.delenv("CONDUCTOR_METRICS_ADDRESS", raising=False)
    for bad in ("9464", "example.com:9464", "127.0.0.1:0", "127.0.0.1:http"):
        assert run_cli(["worker", "--metrics-address", bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--metrics-address must be HOST:PORT" in err and repr(bad) in err
