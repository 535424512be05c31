"""The CLI's admission views ask again while a continued singleton restores its carried state.

The singleton's side (queries during a restore fail naming `RESTORING`) is exercised against the
real dev server in tests/workflows/test_admission_continue_as_new.py; here, the client's side of it.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from temporalio.client import WorkflowQueryFailedError

from worker.admission_live import LiveAdmission, LiveError
from workflows.admission.messages import RESTORING


class _Handle:
    def __init__(self, failures: list[str]) -> None:
        self.failures = failures
        self.asked = 0

    async def query(self, name: str, **_: object) -> list[str]:
        self.asked += 1
        if self.failures:
            raise WorkflowQueryFailedError(self.failures.pop(0))
        return [name]


class _Live(LiveAdmission):
    def __init__(self, handle: _Handle) -> None:
        super().__init__(None, "hg-restoring", reconnect_seconds=0)  # type: ignore[arg-type]  (never connects)
        self._handle = handle

    @property
    def handle(self):  # type: ignore[override]
        return self._handle


async def test_a_query_during_a_restore_is_asked_again_until_it_is_answered():
    restoring = f"host group hg-restoring: {RESTORING} (2000 of 100000 records); ask again in a moment"
    handle = _Handle([restoring, restoring])
    assert await _Live(handle).query("usage", result_type=list[str]) == ["usage"]
    assert handle.asked == 3


async def test_any_other_query_failure_and_a_restore_past_the_timeout_are_one_line():
    handle = _Handle(["the workflow raised: boom"])
    with pytest.raises(LiveError, match="could not answer usage: the workflow raised: boom"):
        await _Live(handle).query("usage", result_type=list[str])
    assert handle.asked == 1
    endless = _Handle([f"{RESTORING} (0 of 10 records)"] * 100)
    with pytest.raises(LiveError, match=RESTORING):
        await _Live(endless).query("usage", result_type=list[str], timeout=timedelta(seconds=0.5))
    assert 2 <= endless.asked <= 5
