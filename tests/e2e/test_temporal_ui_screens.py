"""The Temporal Web UI, rendered by headless Chromium, shows what docs/operations.md claims.

A real dev server with its UI, the local substrate and a worker; a host group that runs one
child at a time. One mission's child fails; a daemon then holds the only slot, and a third
mission's child waits for it. Four pages are rendered (the mission list, the waiting mission,
the failed workload, the admission singleton): the test reads each page's rendered DOM, and
saves a screenshot of each to $CONDUCTOR_UI_SCREENSHOTS (default: the test's tmp dir).

Needs Debian's `chromium` (`.ci/run` installs it); skipped with that reason where it is missing.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from pathlib import Path

import pytest
from playwright.async_api import async_playwright

from tests.support.substrate_fixtures import substrate  # noqa: F401  (fixture)
from tests.support.mission_harness import mission_harness
from worker.devserver import start_dev_server
from worker.mission_control import parse_spec
from worker.ports import free_port
from workflows.admission.messages import admission_workflow_id
from workflows.admission.model import AdmissionPolicy
from workflows.ids import workload_workflow_id
from workflows.mission.messages import mission_workflow_id
from workflows.mission.search import SEARCH_ATTRIBUTES

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Under .ci/run (CONDUCTOR_REQUIRE_UI_TESTS=1) a missing Chromium fails the test instead of skipping it.
pytestmark = pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("CONDUCTOR_REQUIRE_UI_TESTS"),
    reason="needs headless Chromium for the Temporal UI: apt-get install chromium (.ci/run does)",
)
ONE_AT_A_TIME = AdmissionPolicy(max_concurrent=1, lease_ttl_seconds=30)


class Pages:
    """Headless Chromium (Debian's, through Playwright) on the Temporal Web UI."""

    def __init__(self, page) -> None:
        self.page = page

    async def show(self, url: str, screenshot: Path, *must_show: str, tab: str | None = None) -> str:
        """Open `url` (and its `tab`), wait until every text in `must_show` is on the page, take a
        screenshot, and return the page's text. A text that never shows fails the test, naming it."""
        await self.page.goto(url, wait_until="domcontentloaded")
        if tab is not None:
            await self.page.get_by_text(tab, exact=True).first.click(timeout=30_000)
        for text in must_show:
            if not await self._shows(text):
                await self.page.screenshot(path=str(screenshot), full_page=True)
                raise AssertionError(f"{url} never showed {text!r}; see {screenshot}")
        await self.page.wait_for_timeout(500)  # let the rest of the page settle for the screenshot
        await self.page.screenshot(path=str(screenshot), full_page=True)
        return await self._text()

    async def _text(self) -> str:
        """The text of the page and of its frames (the UI renders Markdown details in an iframe)."""
        texts = []
        for frame in self.page.frames:
            try:
                texts.append(await frame.inner_text("body", timeout=2_000))
            except Exception:  # a frame that is navigating or has no body yet
                continue
        return " ".join(" ".join(texts).split())

    async def _shows(self, text: str, within: float = 30.0) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while loop.time() < deadline:
            if text in await self._text():
                return True
            await asyncio.sleep(0.25)
        return False


async def test_the_ui_shows_states_waits_and_details(substrate, tmp_path):
    shots = Path(os.environ.get("CONDUCTOR_UI_SCREENSHOTS") or tmp_path / "screens")
    shots.mkdir(parents=True, exist_ok=True)
    port, ui_port = free_port("127.0.0.1"), free_port("127.0.0.1")
    server, client = await start_dev_server(
        tmp_path / "temporal", host="127.0.0.1", port=port, ui_port=ui_port, namespace="default",
        search_attributes=SEARCH_ATTRIBUTES,
    )
    try:
        async with mission_harness(client, substrate, tmp_path, policy=ONE_AT_A_TIME) as h:
            failed = parse_spec(h.spec("ui-failed", [
                {"child_id": "broken", "kind": "one-shot-command", "prompt": "echo cannot >&2; exit 5"},
            ], aggregation={"mode": "all-pass"}))
            await h.control.run(failed)
            holder = parse_spec(h.spec("ui-holder", [{"child_id": "api", "kind": "daemon", "prompt": "sleep 300"}]))
            await h.control.run(holder)
            waiting = parse_spec(h.spec("ui-waiting", [
                {"child_id": "report", "kind": "one-shot-command", "prompt": "echo later"},
            ]))
            await h.control.start(waiting)

            async def queued() -> bool:
                return any(c.admission.state == "queued" for c in (await h.control.show(waiting.mission_id)).children)

            await h.until(queued, "the third mission's child queued")
            await asyncio.sleep(1.5)  # visibility catches up
            base = f"{server.ui_url}/namespaces/default/workflows"
            host_group = failed.host_group
            waiting_id, failed_id = mission_workflow_id(waiting.mission_id), workload_workflow_id(failed.mission_id, "broken")
            async with async_playwright() as playwright:
                browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
                try:
                    pages = Pages(await browser.new_page(viewport={"width": 1500, "height": 1000}))
                    listing = await pages.show(base, shots / "1-mission-list.png", waiting_id, failed_id)
                    assert mission_workflow_id(failed.mission_id) in listing and admission_workflow_id(host_group) in listing
                    assert re.search(r"\b1 failed\b", listing, re.IGNORECASE), listing[-1500:]  # the failed workload

                    # (the UI renders Current Details as Markdown: "1/1" comes out with a fraction slash)
                    queued = f"report at position 1 in admission:{host_group}, waiting on global"
                    # On the workflow's first page: the timeline's ledger snapshot names it ...
                    await pages.show(
                        f"{base}/{waiting_id}", shots / "2-mission-waiting.png", queued.split(", waiting")[0],
                    )
                    # ... and its current details say it in full.
                    details = await pages.show(
                        f"{base}/{waiting_id}", shots / "2b-mission-waiting-details.png", queued, tab="User Metadata",
                    )
                    assert "admitting" in details and re.search(r"waiting on global 1.1", details), details[:3000]

                    broken = await pages.show(f"{base}/{failed_id}", shots / "3-failed-workload.png", "workload broken: failed")
                    assert re.search(r"\bFAILED workload:", broken), broken[:3000]  # the status badge by the id

                    singleton = await pages.show(
                        f"{base}/{admission_workflow_id(host_group)}", shots / "4-admission-singleton.png",
                        f"admission for host group {host_group}: 1 queued, 1 leases held; global", tab="User Metadata",
                    )
                    assert re.search(r"1 leases held; global 1.1", singleton), singleton[:3000]
                finally:
                    await browser.close()
            await h.control.stop(holder.mission_id)
            await h.control.cancel(waiting.mission_id)
    finally:
        server.stop()
    for shot in shots.glob("*.png"):
        assert shot.stat().st_size > 20_000, shot  # a rendered page, not a blank one
