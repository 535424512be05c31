"""How fast a question reaches an operator, and an answer the task (issue 36's two figures).

    .venv/bin/python -m bench.approval_latency [--rounds 10] [--cli-rounds 3]

The embedded stack (dev server, local substrate, worker: `conductor demo`'s). Each round runs a
mission of two one-shot children, side by side on two instances:
- `ask`: `$CONDUCTOR_ASK 'Proceed?' && echo ok`. Measured:
  1. asked -> shown: from the task's `input-required` (its status timestamp at the executor) to the
     first `conductor mission show` (the `ledger` query, read every 20 ms) with the question;
  2. approve -> working: from sending the answer (`MissionControl.answer`, what `conductor mission
     approve` calls) to the task being `working` again at the executor (read every 20 ms).
- `plain`: `sleep 1; echo done`, the baseline of (1): from its task's `completed` to the first
  `show` with the child `succeeded`. The same watch carries both, so the ratio says what asking
  adds to an ordinary change of state.
`--cli-rounds` more rounds answer with the CLI itself (`conductor mission approve` as a process,
Python start-up included), printed apart. Wall-clock figures, medians and p90, and the ratio
of (1) to its baseline from the same run (these machines are noisy).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from activities.credentials import executor_token
from activities.sandbox_client import ExecutorClient
from worker.mission_control import MissionControl, parse_spec
from worker.stack import DevStack
from workflows.mission.questions import AnswerRequest

POLL = 0.02
CONDUCTOR = [sys.executable, "-c", "from worker.cli import main; main()"]


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def at(text: str | None) -> float:
    assert text is not None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


async def until(check, within: float = 60.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = await check()
        if found:
            return found
        await asyncio.sleep(POLL)
    raise TimeoutError("gave up waiting")


async def one_round(stack: DevStack, control: MissionControl, executor: ExecutorClient, n: int, *, cli: bool) -> dict[str, float]:
    spec = parse_spec({
        "mission_id": f"latency-{os.getpid()}-{n}", "orchestrator_id": "bench", "goal": "measure approval waits",
        "children": [
            {"child_id": "ask", "kind": "one-shot-command", "prompt": "$CONDUCTOR_ASK 'Proceed?' && echo ok"},
            {"child_id": "plain", "kind": "one-shot-command", "prompt": "sleep 1; echo done"},
        ],
    })
    await control.start(spec)

    async def asked():
        ledger = await control.show(spec.mission_id)
        return (time.time(), ledger) if ledger.child("ask").question is not None else None

    shown, ledger = await until(asked)
    child = ledger.child("ask")
    task = await executor.get_task(child.lineage.target_id, child.question.task_id)
    figures = {"asked -> shown": shown - at(task.status.timestamp)}

    async def plain_done():
        ledger = await control.show(spec.mission_id)
        return (time.time(), ledger) if ledger.child("plain").observed_state == "succeeded" else None

    done, ledger = await until(plain_done)
    plain = ledger.child("plain")
    ended = await executor.get_task(plain.lineage.target_id, plain.lineage.task_id)
    figures["baseline: completed -> shown"] = done - at(ended.status.timestamp)

    began = time.time()
    if cli:
        env = {**os.environ, **stack.cli_environment()}
        done = await asyncio.to_thread(subprocess.run, [*CONDUCTOR, "mission", "approve", spec.mission_id, "ask",
                                       "--operator", "bench"], env=env, capture_output=True, text=True)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"conductor mission approve exited {done.returncode}: {done.stderr.strip()}")
    else:
        await control.answer(spec.mission_id, AnswerRequest(child_id="ask", operator="bench", payload={"approved": True},
                                                            prompt_id=child.question.prompt_id))  # fmt: skip

    async def working():
        read = await executor.get_task(child.lineage.target_id, child.question.task_id)
        return time.time() if read.status.state != "input-required" else None

    figures["approve -> working"] = await until(working) - began
    await control.wait_for_verdict(spec.mission_id)
    return figures


async def main(rounds: int, cli_rounds: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        async with DevStack(Path(scratch), temporal_port=0, ui_port=0, substrate_port=0, instances=2) as stack:
            control = MissionControl(stack.client, stack.task_queue)
            executor = ExecutorClient(stack.substrate_url, executor_token(environ=stack.cli_environment()))
            try:
                await one_round(stack, control, executor, 0, cli=False)  # warm-up: imports, first workflow tasks
                runs = [await one_round(stack, control, executor, n, cli=False) for n in range(1, rounds + 1)]
                cli = [await one_round(stack, control, executor, n, cli=True) for n in range(rounds + 1, rounds + 1 + cli_rounds)]
            finally:
                await executor.aclose()
    print(f"{rounds} rounds (in-process answer), {cli_rounds} more answered by `conductor mission approve` as a process")
    for name in ("asked -> shown", "baseline: completed -> shown", "approve -> working"):
        values = [run[name] for run in runs]
        print(f"  {name:<30} median {statistics.median(values) * 1000:7.0f} ms   p90 {percentile(values, 0.9) * 1000:7.0f} ms")
    ratio = statistics.median(r["asked -> shown"] for r in runs) / statistics.median(r["baseline: completed -> shown"] for r in runs)
    print(f"  asked -> shown / baseline      {ratio:.2f}x")
    if cli:
        values = [run["approve -> working"] for run in cli]
        print(f"  approve -> working, CLI        median {statistics.median(values) * 1000:7.0f} ms   (Python start-up included)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--cli-rounds", type=int, default=3)
    options = parser.parse_args()
    asyncio.run(main(options.rounds, options.cli_rounds))
