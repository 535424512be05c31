"""`conductor ledger show MISSION`: a mission's ledger snapshots as the store keeps them.

`conductor mission show` asks the running workflow; this reads the store the workers write to
(CONDUCTOR_DATABASE_URL, else the SQLite files under CONDUCTOR_DATA_DIR), so it answers for a
mission whose workflow history is long gone, and shows exactly what an auditor would find: every
snapshot number with its content hash, each snapshot re-hashed as it is read.

`run_with_stores` is shared with `conductor admission audit --stored`: an unusable URL is exit 2
(through `InputError`), a store that cannot be opened or a tampered row one line and exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable

from activities.ledger_store import CorruptSnapshotError
from activities.stores import Stores, select_stores
from worker.cli.arguments import whole_number
from worker.config import WorkerConfig
from worker.inputs import check_argument
from worker.ledger_view import render_ledger
from worker.tables import render_table
from workflows.mission.spec import SpecId


def register(subparsers: argparse._SubParsersAction) -> None:
    ledger = subparsers.add_parser("ledger", help="mission ledgers as stored (PostgreSQL or the SQLite files)")
    commands = ledger.add_subparsers(dest="ledger_command", required=True, metavar="COMMAND")
    show = commands.add_parser(
        "show",
        help="a mission's stored ledger snapshot (the latest by default)",
        description="Read a mission's ledger from the configured store: CONDUCTOR_DATABASE_URL "
        "(postgresql://...) if set, else the SQLite files in CONDUCTOR_DATA_DIR (default .conductor). "
        "Every snapshot is checked against its recorded sha256 as it is read.",
    )
    show.add_argument("mission_id", metavar="MISSION", help="mission id")
    which = show.add_mutually_exclusive_group()
    which.add_argument("--seq", type=whole_number(0), metavar="N", help="show snapshot N instead of the latest")
    which.add_argument("--history", action="store_true", help="list every stored snapshot: number and content hash")
    show.add_argument("--json", action="store_true", help="print JSON for scripts")
    show.set_defaults(func=run_show)


def run_with_stores(body: Callable[[Stores], Awaitable[int]]) -> int:
    """Run `body` with the configured stores open; every failure one line on stderr (a store
    that cannot be opened is `StoreUnavailable`, which `worker.cli.run` reports, exit 1)."""
    config = WorkerConfig.from_env()  # a bad CONDUCTOR_DATABASE_URL: InputError, exit 2
    stores = select_stores(config.database_url, ledger_db=config.ledger_db, audit_db=config.audit_db,
                           existing_only=True, pool_size=1)  # fmt: skip

    async def main() -> int:
        async with stores:
            return await body(stores)

    try:
        return asyncio.run(main())
    except CorruptSnapshotError as error:
        print(f"conductor: {error}", file=sys.stderr)
        return 1


def run_show(args: argparse.Namespace) -> int:
    mission_id = check_argument(SpecId, args.mission_id, "mission id")

    async def show(stores: Stores) -> int:
        if args.history:
            refs = await stores.ledger.history(mission_id)
            if not refs:
                return _none(mission_id, stores)
            if args.json:
                print(json.dumps([ref.model_dump(mode="json") for ref in refs], indent=2))
            else:
                print(render_table(["SEQ", "CONTENT SHA256"], [[ref.seq, ref.content_hash] for ref in refs], right=(0,)))
            return 0
        ledger = await (stores.ledger.latest(mission_id) if args.seq is None else stores.ledger.get(mission_id, args.seq))
        if ledger is None:
            return _none(mission_id, stores, args.seq)
        if args.json:
            print(ledger.model_dump_json(indent=2))
        else:
            print(f"snapshot {ledger.snapshot_seq} of mission {mission_id}, from {stores.description}")
            print(render_ledger(ledger))
        return 0

    return run_with_stores(show)


def _none(mission_id: str, stores: Stores, seq: int | None = None) -> int:
    what = "no ledger snapshots" if seq is None else f"no ledger snapshot {seq}"
    print(f"conductor: {what} of mission {mission_id} in {stores.description}", file=sys.stderr)
    return 1
