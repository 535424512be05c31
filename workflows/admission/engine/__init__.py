"""The admission engine: a deterministic state machine for one host group.

`apply(state, operation, now)` is the whole interface; `docs/admission-engine.md`
is its exact specification. There is no I/O and no clock here, so the same code
runs inside the AdmissionWorkflow, the `conductor admission simulate` CLI, the
property tests and the benchmarks.

Why the data structures look the way they do (the queue may hold 100,000
requests and an operation must stay well under 100 µs):

* Queued requests are partitioned into *classes* by everything that decides
  whether they fit and how they may displace others: (environment, provider,
  runtime kind, lane, priority class). Requests of one class fit or do not fit
  together, so admission inspects classes, not requests. A gang that is ready
  to run sits in a class of its own kind, keyed by the multiset of its members'
  classes: gangs of one shape fit or do not fit together too.
* Inside a class, requests are bucketed by base priority, each bucket sorted by
  (submitted_at, request_id). Aging adds the same step function of age to every
  member of a bucket, so the bucket's first element is always its best, and the
  class's best is the best of its bucket heads. Aging therefore never forces a
  re-sort.
* With fair share on, requests of equal effective priority are ordered by their
  orchestrator's held leases per unit of weight. Only orchestrators that hold a
  lease have a share above zero, and there are never more of them than leases,
  so each bucket also keeps the oldest request of every orchestrator in it
  (sorted by age): the bucket's best is found by skipping at most the
  lease-holding orchestrators at its top effective priority.
* Lease expiries and queue deadlines sit in heaps with lazy deletion: the
  earliest one is O(1) to find and renewals are O(log n).

The state is owned and mutated by `apply`; callers treat the state they pass in
as consumed and use the returned one.

This package is that one public surface (`__all__`); its modules split it by concern:
`state` (records and the structures that index them), `order`, `capacity` (what fits),
`indexes`, `transitions` (one record's changes and their audit events), `preemption`
(choosing targets, over the state only), `reservations` (amounts reserved ahead, backfill),
`scheduling` (the admission pass), `refusals`, `apply` (the operations), `forecast` (the
queue played forward: each request's predicted start) and `views` (what clients read).
"""

from workflows.admission.engine.apply import apply
from workflows.admission.engine.capacity import waiting_on
from workflows.admission.engine.forecast import forecast, forecast_new
from workflows.admission.engine.indexes import rebuild_indexes
from workflows.admission.engine.order import effective_priority, order_key
from workflows.admission.engine.scheduling import next_wakeup
from workflows.admission.engine.state import (
    EngineState,
    Rec,
    from_micros,
    new_state,
    to_micros,
)
from workflows.admission.engine.views import (
    queue_position,
    queue_view,
    queued_in_order,
    snapshot,
    usage_view,
    what_if,
)

__all__ = [
    "EngineState",
    "Rec",
    "apply",
    "effective_priority",
    "forecast",
    "forecast_new",
    "from_micros",
    "new_state",
    "next_wakeup",
    "order_key",
    "queue_position",
    "queue_view",
    "queued_in_order",
    "rebuild_indexes",
    "snapshot",
    "to_micros",
    "usage_view",
    "waiting_on",
    "what_if",
]
