"""`conductor replay`: replay the server's workflow histories against the code installed here.

Run it against staging or production with the build about to be rolled out (CONTRIBUTING.md):
exit 0 means every fetched history replays; 1 means at least one does not (or the server could
not be reached); 2 means an argument, or the query, is wrong.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

from temporalio.service import RPCError

from worker.connection import CLI_RETRY_CONFIG, connect, one_line, refusal, transport_failure
from worker.inputs import InputError
from worker.mission_list import since_time
from worker.replay_check import (
    DEFAULT_LIMIT, DEFAULT_QUERY, MAX_LIMIT, QueryRefused, check_limit, replay_from_server, replay_query,
)


def workflow_classes() -> list[type]:
    """The classes a replay runs against: the ones the worker registers (a test substitutes others)."""
    from worker.worker import WORKFLOWS

    return list(WORKFLOWS)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "replay", help="replay running and recent workflows' histories against this code (before a deploy)",
        description="Fetch the histories of running and recent workflows from Temporal and replay them against "
        "the workflow classes installed here, with the production data converter. One line per workflow type "
        "(replayed, passed, nondeterministic, other failures), then one per failing run with its first mismatch. "
        "Exit 0: all replay; 1: some do not, or the server is unreachable; 2: a bad argument or query.",
    )
    parser.add_argument("--query", metavar="Q", help=f"a visibility query (default: {DEFAULT_QUERY})")
    parser.add_argument("--limit", default=str(DEFAULT_LIMIT), metavar="N",
                        help=f"at most N histories, newest first (1 to {MAX_LIMIT}, default {DEFAULT_LIMIT})")
    parser.add_argument("--since", metavar="T", help="only workflows started since T: 30m, 6h, 7d, or 2026-12-01T09:00:00Z")
    parser.add_argument("--save", metavar="DIR", type=Path,
                        help="also write each history as JSON into DIR (the form tests/histories/ holds)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON for scripts")
    parser.set_defaults(func=_command)


def _command(args: argparse.Namespace) -> int:
    limit = check_limit(args.limit)
    since = since_time(args.since, datetime.now(timezone.utc)) if args.since is not None else None
    replay_query(args.query, since)  # a bad query is refused before anything connects
    save_dir: Path | None = args.save
    if save_dir is not None and save_dir.exists() and not save_dir.is_dir():
        raise InputError(f"--save {save_dir}: not a directory; give a directory to write the histories into")
    try:
        return asyncio.run(_replay(args.query, since, limit, save_dir, args.json))
    except QueryRefused as error:
        print(f"conductor: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader of our output left: worker.cli.main answers that
        raise
    except ConnectionError as error:  # the server is not there (or a profile cannot be loaded)
        print(f"conductor: {one_line(error)}", file=sys.stderr)
        return 1
    except RPCError as error:
        lost = transport_failure(error)
        if lost is not None:  # the server went away mid-run: a check that did not finish fails
            print(f"conductor: lost the Temporal server before every history was replayed ({one_line(RuntimeError(lost))})",
                  file=sys.stderr)
            return 1
        print(f"conductor: {refusal(error)}", file=sys.stderr)
        return 1
    except OSError as error:  # --save: a directory we cannot create or write into
        print(f"conductor: --save {save_dir}: {error.strerror or one_line(error)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("conductor: interrupted", file=sys.stderr)
        return 130


async def _replay(query: str | None, since: datetime | None, limit: int, save_dir: Path | None, as_json: bool) -> int:
    client = await connect(retry_config=CLI_RETRY_CONFIG)
    report = await replay_from_server(client, workflow_classes(), query=query, since=since, limit=limit, save_dir=save_dir)
    if as_json:
        print(json.dumps(report.as_json(), indent=2))
    else:
        print("\n".join(report.lines()))
    return 0 if report.ok else 1
