"""Which endings of a child's attempt are tried again, and what they cost its retry budget.

Pure: the MissionWorkflow asks `judge` once an attempt has ended, with why the mission stopped
it (if it did) and the attempt's last observation, and records the answer in the ledger
(`workflows.mission.aggregation.judge_attempt`).

The rules (docs/mission-spec.md, "Attempts and the retry budget"):
- a lease timeout (the admission engine requeued the request after its lease expired, or the
  lease lapsed before any renewal reached the admission workflow) and an executor refusal that
  says it is retryable (`backpressure.retryable`), and a question its task asked that nobody
  answered by its deadline (`conductor.approval_timeout`), are retried while the child has budget left:
  `budgets.max_attempts` counts the attempts that ended this way or for good;
- an attempt whose lease was taken away, displaced by the lane override
  (`priority-wip-override-v1`) or preempted, is retried without costing the budget: the victim
  did nothing wrong. It is still numbered, so its retry has ids of its own; no child runs more
  than `MAX_ATTEMPT_NUMBER` attempts in all;
- a failed command, a policy denial and `unknown` are never retried: they fail closed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

from workflows.admission.model import LANE_OVERRIDE_POLICY, PREEMPTION_POLICY, REQUEUE_POLICY
from workflows.ids import MAX_ATTEMPT_NUMBER

# Why the mission stopped a running attempt (its lease is no longer good).
StopKind = Literal["requeued", "lapsed", "displaced", "preempted"]


class AttemptStop(BaseModel):
    """The mission stopped an attempt: why, and the admission decision that said so."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: StopKind
    reason: str
    interrupted_by: str | None = None
    policy: str | None = None


@dataclass(frozen=True)
class Judgement:
    retry: bool
    counts: bool  # against budgets.max_attempts
    why: str  # why the attempt ended, for the ledger


TAKEN_AWAY: frozenset[str] = frozenset({"displaced", "preempted"})
# A stop's kind by the admission policy that took the lease: all the rules above need of it
# (a lapsed lease and a requeued one are judged alike: a lease timeout).
STOP_KIND_OF_POLICY: dict[str, StopKind] = {
    PREEMPTION_POLICY: "preempted", LANE_OVERRIDE_POLICY: "displaced", REQUEUE_POLICY: "requeued",
}


def judge(
    stop: AttemptStop | None,
    *,
    observed_state: str,
    retryable_refusal: bool,
    attempt: int,
    counted: int,
    max_attempts: int,
    request_ended: str | None = None,
    unanswered: bool = False,
) -> Judgement:
    """`counted`: attempts before this one that cost the budget; `attempt`: this one's number;
    `request_ended`: how the attempt's admission request ended, if the engine has ended it (out
    of requeue attempts, ADR-004): then a lease timeout leaves nothing to run again under;
    `unanswered`: it timed out waiting for an answer to its question."""
    last = attempt >= MAX_ATTEMPT_NUMBER
    if observed_state == "succeeded":  # it did its job before it was stopped: nothing to try again
        return Judgement(False, True, "ended succeeded")
    if stop is not None and stop.kind in TAKEN_AWAY:
        if last:
            return Judgement(False, False, f"{stop.reason}; no attempt is left (at most {MAX_ATTEMPT_NUMBER} in all)")
        return Judgement(True, False, f"{stop.reason}; tried again, not counted against the retry budget")
    if stop is not None:  # a lease timeout
        timeout = stop.reason
    elif observed_state == "failed" and retryable_refusal:
        timeout = "the executor refused it and said a retry may succeed"
    elif observed_state == "timed-out" and unanswered:
        timeout = "its question was not answered by the deadline"
    else:
        return Judgement(False, True, f"ended {observed_state}")
    used = counted + 1
    if used < max_attempts and not last:
        if stop is not None and request_ended is not None:
            return Judgement(False, True, f"{stop.reason}; the admission request ended {request_ended}")
        return Judgement(True, True, f"{timeout}; tried again (retry budget {used}/{max_attempts} used)")
    return Judgement(False, True, f"{timeout}; retry budget exhausted ({used}/{max_attempts} attempts)")
