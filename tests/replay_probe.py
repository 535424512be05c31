"""Test-only workflows for `conductor replay`: one version to run on the server, and a changed
version of the same workflow type whose first command differs, to replay the first one's
histories against (a nondeterministic change, on purpose)."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

REPLAY_PROBE = "ReplayProbeWorkflow"


@workflow.defn(name=REPLAY_PROBE)
class ReplayProbeWorkflow:
    """Starts a short timer; then `mode` says what it does: "return", "wait" for `finish` (so a
    run can be left running), or "continue" as new once (a second run of the same id)."""

    def __init__(self) -> None:
        self._finish = False

    @workflow.signal
    def finish(self) -> None:
        self._finish = True

    @workflow.run
    async def run(self, mode: str) -> str:
        await workflow.sleep(timedelta(milliseconds=50))
        if mode == "continue":
            workflow.continue_as_new("return")
        if mode == "wait":
            await workflow.wait_condition(lambda: self._finish)
        return "done"


@workflow.defn(name=REPLAY_PROBE)
class ChangedReplayProbeWorkflow:
    """The same type after a careless edit: an activity where the timer was."""

    def __init__(self) -> None:
        self._finish = False

    @workflow.signal
    def finish(self) -> None:
        self._finish = True

    @workflow.run
    async def run(self, mode: str) -> str:
        await workflow.execute_activity("replay_probe_step", start_to_close_timeout=timedelta(seconds=5))
        if mode == "continue":
            workflow.continue_as_new("return")
        if mode == "wait":
            await workflow.wait_condition(lambda: self._finish)
        return "done"
