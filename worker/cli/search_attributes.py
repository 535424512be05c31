"""`conductor search-attributes check|create`: the namespace's search attributes for missions.

`create` registers the ones missing, where the caller may (a self-hosted server, the dev server),
as `temporal operator search-attribute create` does; `check` says what is missing, as a starting
`conductor worker` does before it polls (worker/search_attributes.py).
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from temporalio.service import RPCError

from worker import search_attributes
from worker.connection import ConnectionSettingError, connect, connect_options, refusal


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "search-attributes",
        help="check or create the search attributes missions need on a namespace",
        description="Missions upsert search attributes (docs/operations.md lists them); a namespace without them "
        "hangs every mission, so `conductor worker` refuses to start on one. `create` registers the missing ones "
        "(self-hosted or dev server; on Temporal Cloud use its UI or tcld).",
    )
    commands = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    commands.add_parser("check", help="list what the namespace lacks (exit 1 if anything)").set_defaults(func=_check)
    commands.add_parser("create", help="register the missing ones (exit 0 when all are there)").set_defaults(func=_create)


def _check(args: argparse.Namespace) -> int:
    return asyncio.run(_run(create=False))


def _create(args: argparse.Namespace) -> int:
    return asyncio.run(_run(create=True))


async def _run(*, create: bool) -> int:
    namespace = connect_options(None)["namespace"]
    try:
        client = await connect()
        found = await search_attributes.check(client, namespace)
        if create and found.missing:
            await search_attributes.create(client, namespace, found.missing)
            names = ", ".join(f"{key.name} ({search_attributes.type_name(key)})" for key in found.missing)
            print(f"created on namespace {namespace}: {names}")
            found = await search_attributes.check(client, namespace)
    except (ConnectionError, ConnectionSettingError) as error:
        print(f"conductor: {error}", file=sys.stderr)
        return 1
    except RPCError as error:
        print(f"conductor: {refusal(error)}", file=sys.stderr)
        return 1
    if not found.ok:
        print(f"conductor: {found.problem()}", file=sys.stderr)
        return 1
    print(f"namespace {namespace} has every search attribute missions need ({len(search_attributes.SEARCH_ATTRIBUTES)})")
    return 0
