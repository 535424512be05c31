"""The pure core of mission aggregation: child observations and admissions in, ledgers out.

The MissionWorkflow is a thin shell around these functions (this package's public names; its
modules are `outcome`, per child; `verdict`, the rule and its words; and `reducer`, the ledger's changes): it feeds them observations,
admission decisions and review decisions and writes the ledgers they return. Every function
takes a ledger and returns a new one (never changing its argument), fully aggregated, with
`snapshot_seq` incremented exactly when something changed. So a snapshot numbered `n` always has
the same content, and a redelivered signal costs nothing. The batch forms (`apply_admissions`,
`start_attempts`, `apply_observations`) give the same ledger as their changes applied one at a
time, one `snapshot_seq` per change that altered a child, but aggregate the whole ledger once.

Per child (see `child_outcome`):
- An observation is a whole revision of the child's record. A higher revision replaces the
  previous one; a lower one is stale and only recorded in `stale_event_revisions`; the same
  revision again with the same content (ignoring `observed_at`) is a redelivery and a no-op; the
  same revision with different content breaks the substrate's compare-and-swap promise, so the
  first one stays and the revision is recorded as stale.
- Satisfaction per kind is `is_satisfied`; required evidence is every artifact kind in
  `ChildSpec.required_evidence` present in the child's artifacts. A child counts as satisfied
  only with both (missing evidence fails closed).
- Until the substrate reports the child (`revision is None`), its admission is the only truth:
  queued shows `blocked` with capacity backpressure (retryable), denied shows `blocked` with
  policy backpressure (not retryable) and fails the child (it can never run), a queue timeout
  shows `timed-out`, a cancelled or preempted request shows `cancelled`.

Attempts (`workflows.mission.attempts`): a child runs as numbered attempts, each on a fleet
record of its own, and is judged by its last (`ChildLedger.attempt`); `start_attempt` lists an
attempt when the mission starts it, `close_attempt` records why it ended and, when it is tried
again, shows the child as not yet run (its admission says where it waits). An observation of
an earlier attempt only updates that attempt's entry. While an attempt is being stopped or
will be retried (`ChildLedger.stopping`), how it ended does not count: the child stays pending.

Per mission: the verdict rule is `verdict.verdict_rule`, the only one, written out in words in
docs/mission-spec.md ("Aggregation", "Exactly").
- Long-lived children (daemon, persistent-agent, scheduled-collector) count as satisfied while
  running, so a verdict can settle while they keep running. A final parent state never changes
  again; the children and the summary keep following the observations.
"""

from workflows.mission.aggregation.outcome import (
    child_outcome,
    evidence_of,
    is_satisfied,
    missing_evidence,
)
from workflows.mission.aggregation.reducer import (
    LEASE_EXPIRED,
    AttemptStart,
    ReviewNotAccepted,
    aggregate,
    apply_admission,
    apply_admissions,
    apply_observation,
    apply_observations,
    apply_review,
    ask_before_dispatch,
    close_attempt,
    decide_gate,
    initial_ledger,
    judge_attempt,
    mark_cancel_requested,
    mark_cancelled,
    mark_stopping,
    stop_of,
    record_answer,
    record_refusal,
    review_refusal,
    start_attempt,
    start_attempts,
)
from workflows.mission.aggregation.verdict import (
    Tally,
    children_to_cancel,
    is_final,
    live_children,
    output_score,
    verdict,
    verdict_rule,
)

__all__ = [
    "AttemptStart",
    "LEASE_EXPIRED",
    "ReviewNotAccepted",
    "Tally",
    "aggregate",
    "apply_admission",
    "apply_admissions",
    "apply_observation",
    "apply_observations",
    "apply_review",
    "ask_before_dispatch",
    "decide_gate",
    "record_answer",
    "child_outcome",
    "children_to_cancel",
    "close_attempt",
    "evidence_of",
    "initial_ledger",
    "is_final",
    "is_satisfied",
    "judge_attempt",
    "live_children",
    "mark_cancel_requested",
    "mark_cancelled",
    "mark_stopping",
    "stop_of",
    "missing_evidence",
    "output_score",
    "record_refusal",
    "review_refusal",
    "start_attempt",
    "start_attempts",
    "verdict",
    "verdict_rule",
]
