"""Test-only workflows for `conductor replay`: one version to run on the server, and a changed
version of the same workflow type whose first command differs, to replay the first one's
histories against (a nondeterministic change, on purpose)."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

REPLAY_PROBE = "ReplayProbeWorkflow"


class _ReplayProbeBase:
    """What both versions share: the `finish` signal and everything after the first command, so
    the two differ only where the careless edit is."""

    def __init__(self) -> None:
        self._finish = False

    @workflow.signal
    def finish(self) -> None:
        self._finish = True

    async def _after_first_command(self, mode: str) -> str:
        if mode == "continue":
            workflow.continue_as_new("return")
        if mode == "wait":
            await workflow.wait_condition(lambda: self._finish)
        return "done"


@workflow.defn(name=REPLAY_PROBE)
class ReplayProbeWorkflow(_ReplayProbeBase):
    """Starts a short timer; then `mode` says what it does: "return", "wait" for `finish` (so a
    run can be left running), or "continue" as new once (a second run of the same id)."""

    @workflow.run
    async def run(self, mode: str) -> str:
        await workflow.sleep(timedelta(milliseconds=50))
        return await self._after_first_command(mode)


@workflow.defn(name=REPLAY_PROBE)
class ChangedReplayProbeWorkflow(_ReplayProbeBase):
    """The same type after a careless edit: an activity where the timer was."""

    @workflow.run
    async def run(self, mode: str) -> str:
        await workflow.execute_activity("replay_probe_step", start_to_close_timeout=timedelta(seconds=5))
        return await self._after_first_command(mode)
