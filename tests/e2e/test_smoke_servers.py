"""The servers the rest of the suite relies on start from the bundled binaries."""

from temporalio.testing import WorkflowEnvironment


async def test_time_skipping_server_skips_time(time_skipping_env: WorkflowEnvironment) -> None:
    assert time_skipping_env.supports_time_skipping
    before = await time_skipping_env.get_current_time()
    await time_skipping_env.sleep(3600)
    after = await time_skipping_env.get_current_time()
    assert (after - before).total_seconds() >= 3600
