"""A workflow cancellation that the operation it interrupted swallowed, raised again.

The SDK delivers a workflow's cancellation to the one Temporal operation being awaited at
that moment. When that operation completes anyway (a local activity that finished its work,
a signal already sent), the await returns its result and the cancellation is spent: the
workflow would go on, following a task that nobody will ever cancel. Loops therefore call
`raise_if_cancel_requested` before every wait, which turns the request the server recorded
back into the `CancelledError` the workflow's own cancellation handling expects.
"""

from __future__ import annotations

import asyncio

from temporalio import workflow


def raise_if_cancel_requested() -> None:
    reason = workflow.cancellation_reason()
    if reason is not None:
        raise asyncio.CancelledError(f"workflow cancellation requested: {reason or 'no reason given'}")
