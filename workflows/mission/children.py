"""Where each routed child of a mission stands: one `ChildRun` per child, with an explicit phase.

The mission's ledger says what a child did (its observations, attempts and outcome); this says
what the mission is doing about it, which the ledger cannot: whether it was started and by which
run, whether its attempt is being stopped and why, whether its lease went back. One record per
child with a phase replaces a dozen parallel sets, so a child is in exactly one phase at a time,
and continue-as-new carries the records whole.

    waiting ──start──▶ running ──its end──▶ over ──judged: done──▶ done
       ▲                                     │
       └────────── judged: retry ────────────┤
                                             └─ judged: request still live ─▶ withdrawing ──cancelled──▶ done

- `waiting`: not started (its request queued, admitted or ended); with `resubmit`, preempted and
  waiting for a request of its own before it can be admitted again.
- `running`: its workload workflow was started and has not ended; `mark` says how many times its
  lease had been taken away when it started. Why the mission is stopping it, if it is (its lease
  went), is the ledger's (`aggregation.mark_stopping`, `aggregation.stop_of`): its one home.
- `over`: its attempt ended; judged next (`workflows.mission.attempts`).
- `withdrawing`: done with, but its request lives on (requeued): the request is cancelled next.
- `done`: nothing more runs; `released` once its lease or request went back (released, or withdrawn
  when the engine had requeued it).

Pure: no Temporal imports. Whether this run started a running child (`followed`) and which
decision it last folded belong to a run, not to the mission: they are not carried.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler
from pydantic_core import core_schema

from workflows.admission.messages import AdmissionDecision
from workflows.mission.planning import Assignment

Phase = Literal["waiting", "running", "over", "withdrawing", "done"]


class ChildRun(BaseModel):
    model_config = ConfigDict(extra="forbid")

    child_id: str
    assignment: Assignment  # where it runs (the planner's answer)
    request_id: str  # its admission request now: its first attempt's, or a later one's after a preemption
    phase: Phase = "waiting"
    resubmit: bool = False  # waiting: preempted, to be admitted again under `request_id` (not yet sent)
    mark: int = 0  # running: lease interruptions seen when this attempt started
    released: bool = False  # done: its lease was released or its request withdrawn
    approved: bool = False  # a gated child (`approval.required`): an operator approved its dispatch
    # This run's own, never carried: it started the running attempt and awaits its handle (an
    # earlier run's child ends with its last observation), and the decision it last folded.
    followed: bool = Field(default=False, exclude=True)
    folded: AdmissionDecision | None = Field(default=None, exclude=True)


class ChildRuns:
    """The routed children's records, in spec order."""

    def __init__(self, runs: Iterable[ChildRun] = ()) -> None:
        self._runs = {run.child_id: run for run in runs}

    def __iter__(self) -> Iterator[ChildRun]:
        return iter(self._runs.values())

    def __contains__(self, child_id: object) -> bool:
        return child_id in self._runs

    def __getitem__(self, child_id: str) -> ChildRun:
        return self._runs[child_id]

    def __bool__(self) -> bool:
        return bool(self._runs)

    def ids(self, *phases: Phase) -> list[str]:
        """The children in any of `phases` (all of them when none is named), sorted."""
        return sorted(run.child_id for run in self._runs.values() if not phases or run.phase in phases)

    def in_phase(self, *phases: Phase) -> list[ChildRun]:
        return [run for run in self._runs.values() if run.phase in phases]

    def phase_of(self, child_id: str) -> Phase | None:
        run = self._runs.get(child_id)
        return run.phase if run is not None else None

    def records(self) -> list[ChildRun]:
        """What continue-as-new carries (serialised without the run's own fields)."""
        return list(self._runs.values())

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        """As a field of a model (the mission's carried progress): the list of its records."""
        records = handler.generate_schema(list[ChildRun])
        return core_schema.union_schema(
            [core_schema.is_instance_schema(cls), core_schema.no_info_after_validator_function(cls, records)],
            serialization=core_schema.plain_serializer_function_ser_schema(cls.records, return_schema=records),
        )
