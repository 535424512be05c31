"""How a workflow refuses what a client sent: a start, with the one Temporal failure every
workflow's front door raises; a signal, kept for the workflow's `refusals` query."""

from __future__ import annotations

from collections import deque

from temporalio import workflow
from temporalio.exceptions import ApplicationError

from workflows.inbound import MAX_REFUSALS_KEPT, Refusal, Refused

# The failure type of a run refused at start (`ApplicationError.type`; the Temporal UI and every
# SDK show it, `conductor mission show` too).
INVALID_INPUT = "InvalidInput"


def refused_start(error: Refused, workflow_type: str) -> ApplicationError:
    """What a run whose input was refused fails with: non-retryable, so it ends now, for good."""
    return ApplicationError(
        f"{workflow_type} refused its input: {error}", type=INVALID_INPUT, non_retryable=True,
    )


class RefusedSignals:
    """The signals a workflow received and did not act on: each logged, the newest kept for its
    `refusals` query. Call it as `signal_argument`'s `refuse`."""

    def __init__(self) -> None:
        self._kept: deque[Refusal] = deque(maxlen=MAX_REFUSALS_KEPT)

    def __call__(self, signal: str, refused: Refused) -> None:
        workflow.logger.warning("signal %s refused: %s", signal, refused)
        self._kept.append(Refusal(at=workflow.now(), signal=signal, reason=str(refused)))

    def kept(self) -> list[Refusal]:
        return list(self._kept)
