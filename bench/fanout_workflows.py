"""The ceiling's workflows for bench/mission_fanout.py (a module of their own: the workflow
sandbox re-imports workflow modules by name, which a script's __main__ cannot be)."""

from __future__ import annotations

import asyncio

from temporalio import workflow


@workflow.defn(name="BenchNoopChild")
class NoopChild:
    @workflow.run
    async def run(self) -> None:
        return None


@workflow.defn(name="BenchFanoutParent")
class FanoutParent:
    @workflow.run
    async def run(self, children: int) -> None:
        me = workflow.info().workflow_id
        handles = await asyncio.gather(*(
            workflow.start_child_workflow(NoopChild.run, id=f"{me}:child-{i}") for i in range(children)
        ))
        await asyncio.gather(*handles)
