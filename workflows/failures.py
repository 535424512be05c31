"""How a workflow refuses to start: the one Temporal failure every workflow's front door raises."""

from __future__ import annotations

from temporalio.exceptions import ApplicationError

from workflows.inbound import Refused

# The failure type of a run refused at start (`ApplicationError.type`; the Temporal UI and every
# SDK show it, `conductor mission show` too).
INVALID_INPUT = "InvalidInput"


def refused_start(error: Refused, workflow_type: str) -> ApplicationError:
    """What a run whose input was refused fails with: non-retryable, so it ends now, for good."""
    return ApplicationError(
        f"{workflow_type} refused its input: {error}", type=INVALID_INPUT, non_retryable=True,
    )
