"""`$CONDUCTOR_ASK PROMPT`: ask a person from a command the local substrate runs, and wait for the answer.

    answer=$($CONDUCTOR_ASK "Ship release 2.0.3 to production?") || exit 1

Writes the question where the substrate looks for it (`substrate.questions`), so the task goes
`input-required` with a hitl-prompt/v1 envelope; waits for the answer; prints its payload (JSON)
on stdout. Exit 0 when answered (and not `"approved": false`), 1 when the answer rejects, 2 when
the question was refused (why on stderr) or this is not run by the substrate, 3 when `--wait`
seconds passed without an answer.

Options: `--schema JSON` (a JSON Schema for the answer; default `{"approved": boolean,
"comment"?: string}`), `--deadline-seconds N` (the envelope's `deadline`, N seconds from now: the
conductor ends the task if nobody answers by then), `--responder R` (repeatable:
`any`, `specific:<id>`, `consensus:<n>`), `--wait S` (give up after S seconds; default: for ever).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from substrate.questions import ANSWER_FILE, ERROR_FILE, QUESTION_DIR_ENV, QUESTION_FILE, REJECTED_FILE, write_atomically

POLL_SECONDS = 0.05


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="conductor-ask", description=__doc__.split("\n\n")[0])
    parser.add_argument("prompt")
    parser.add_argument("--schema", help="a JSON Schema (an object) the answer must match")
    parser.add_argument("--deadline-seconds", type=float, help="the question's deadline, seconds from now")
    parser.add_argument("--responder", action="append", help="any, specific:<id> or consensus:<n> (repeatable)")
    parser.add_argument("--wait", type=float, help="give up after this many seconds (exit 3)")
    args = parser.parse_args(argv)
    where = os.environ.get(QUESTION_DIR_ENV)
    if not where:
        print(f"conductor-ask: {QUESTION_DIR_ENV} is not set: run this inside a task of the local substrate", file=sys.stderr)
        return 2
    directory = Path(where)
    question: dict[str, object] = {"prompt": args.prompt}
    if args.schema is not None:
        try:
            question["response_schema"] = json.loads(args.schema)
        except json.JSONDecodeError as error:
            print(f"conductor-ask: --schema is not JSON: {error}", file=sys.stderr)
            return 2
    if args.deadline_seconds is not None:
        deadline = datetime.now(UTC) + timedelta(seconds=args.deadline_seconds)
        question["deadline"] = deadline.isoformat(timespec="seconds").replace("+00:00", "Z")
    if args.responder:
        question["allowed_responders"] = args.responder
    for stale in (ANSWER_FILE, REJECTED_FILE, ERROR_FILE):
        (directory / stale).unlink(missing_ok=True)
    write_atomically(directory / QUESTION_FILE, question)
    give_up = None if args.wait is None else time.monotonic() + args.wait
    while True:
        answer = directory / ANSWER_FILE
        if answer.exists():
            payload = json.loads(answer.read_text())["payload"]
            answer.unlink()
            print(json.dumps(payload))
            return 1 if isinstance(payload, dict) and payload.get("approved") is False else 0
        if (directory / REJECTED_FILE).exists():
            why = (directory / ERROR_FILE).read_text().strip() if (directory / ERROR_FILE).exists() else "no reason given"
            print(f"conductor-ask: the substrate refused the question: {why}", file=sys.stderr)
            return 2
        if give_up is not None and time.monotonic() >= give_up:
            (directory / QUESTION_FILE).unlink(missing_ok=True)
            print(f"conductor-ask: no answer within {args.wait} s", file=sys.stderr)
            return 3
        time.sleep(POLL_SECONDS)


if __name__ == "__main__":
    sys.exit(main())
