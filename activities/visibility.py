"""Values in Temporal visibility queries, written the one way every store reads alike.

Visibility reads `''` inside a literal as one quote on every store; backslashes and double quotes
it reads differently from one store to the next (the dev server's SQLite drops some of them), so a
value holding either is never put in a query: callers ask the server for the rest and match such
values on the rows themselves, exactly.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

from temporalio.client import Client, WorkflowExecution

_UNQUOTABLE = ("\\", '"')


def quotable(value: str) -> bool:
    return not any(char in value for char in _UNQUOTABLE)


def literal(value: str) -> str:
    """`value` as a visibility query string literal (only for a `quotable` value)."""
    if not quotable(value):
        raise ValueError(f"{value!r} cannot be put in a visibility query literal")
    return "'" + value.replace("'", "''") + "'"


IDS_PER_QUERY = 100  # keeps a query's text short, whatever the number of ids


async def runs_of(client: Client, workflow_ids: Iterable[str], where: str) -> AsyncIterator[WorkflowExecution]:
    """The runs of these workflow ids that match `where`, a hundred ids per list call.

    Ids that are not `quotable` are left out: the caller knows them and decides what they need."""
    ids = sorted(workflow_id for workflow_id in set(workflow_ids) if quotable(workflow_id))
    for start in range(0, len(ids), IDS_PER_QUERY):
        chunk = ", ".join(literal(workflow_id) for workflow_id in ids[start:start + IDS_PER_QUERY])
        async for execution in client.list_workflows(f"WorkflowId IN ({chunk}) AND {where}"):
            yield execution
