"""Workflow cancellation that an operation's completion must not swallow."""

from __future__ import annotations

import asyncio

from temporalio import workflow

# Runs that absorbed a cancellation before this check existed replay their old path.
CANCEL_NOT_ABSORBED = "cancel-not-absorbed"


def raise_if_cancel_was_absorbed() -> None:
    """Raise the workflow's cancellation if an operation completed instead of surfacing it.

    The SDK hands a workflow cancellation to the Temporal operation being awaited; when that
    operation completes anyway (a signal already sent, a local activity that finished), the
    await returns its result and the cancellation is gone: the workflow would carry on, e.g.
    following a task nobody will cancel. Loops call this before they wait again.
    """
    if workflow.cancellation_reason() is not None and workflow.patched(CANCEL_NOT_ABSORBED):
        raise asyncio.CancelledError()
