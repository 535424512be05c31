"""The parent's side of WorkloadWorkflow: its id, how to cancel it so the cancel lands, and how
to read the result of one that failed.

Cancel a workload through `cancel_workload(workflow_id)`, not `ChildWorkflowHandle.cancel()`:
the child handle aims its request at the child's first run, and a workload that has continued
as new (every long-lived one does, eventually) is no longer that run, so the server accepts
the request and nobody receives it (seen on the dev server 1.32 with the Python SDK 1.35;
tests/workflows/test_workload_workflow.py covers the path used here). A request by workflow id alone
reaches whichever run is current.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ApplicationError, ChildWorkflowError, is_cancelled_exception

from workflows.ids import workload_workflow_id  # noqa: F401 (defined once there)
from workflows.mission.observation import ChildObservation
from workflows.workload.messages import WorkloadResult

# A workload whose verdict is not success fails its workflow with an ApplicationError of type
# `workload.<verdict>` (`workload.failed`, `workload.review-required`), its WorkloadResult as the
# only detail: the Temporal UI shows it failed, and the parent still gets the last observation.
FAILED_VERDICT_PREFIX = "workload."


async def cancel_workload(workflow_id: str) -> None:
    """Request cancellation of the current run of a WorkloadWorkflow (call from a workflow)."""
    await workflow.get_external_workflow_handle(workflow_id).cancel()


def verdict_failure(result: WorkloadResult) -> ApplicationError:
    """The failure a workload ends its workflow with when its verdict is not success."""
    observation = result.observation
    why = observation.error_code or observation.note or observation.observed_state
    missing = f"; missing evidence: {', '.join(result.missing_evidence)}" if result.missing_evidence else ""
    return ApplicationError(
        f"workload {result.child_id}: {result.verdict} ({why}{missing})",
        result,
        type=f"{FAILED_VERDICT_PREFIX}{result.verdict}",
        non_retryable=True,
    )


def result_of_failed(error: BaseException) -> WorkloadResult | None:
    """The WorkloadResult carried by a child workload's verdict failure; None for any other error."""
    cause = error.cause if isinstance(error, ChildWorkflowError) else None
    if not (isinstance(cause, ApplicationError) and (cause.type or "").startswith(FAILED_VERDICT_PREFIX)):
        return None
    try:
        return WorkloadResult.model_validate(cause.details[0])
    except Exception:  # not ours after all (or unreadable): the parent fails closed on it
        return None


def how_it_ended(error: BaseException) -> tuple[ChildObservation | None, str | None]:
    """A child workload's end, from what awaiting its handle raised: its last observation (a
    verdict failure carries it) or, when it failed without one, why (neither when it was cancelled)."""
    ended = result_of_failed(error)
    if ended is not None:
        return ended.observation, None
    if is_cancelled_exception(error):
        return None, None
    return None, failure_text(error)


def failure_text(error: BaseException) -> str:
    """A failure down to its cause (`ChildWorkflowError` only says that the child failed)."""
    parts = []
    while error is not None and len(parts) < 3:
        parts.append(getattr(error, "message", None) or str(error) or type(error).__name__)
        error = error.__cause__ or getattr(error, "cause", None)
    return ": ".join(parts)[:500]
