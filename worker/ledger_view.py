"""Mission ledgers rendered for people (the CLI, the demo)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from workflows.mission.ledger import ChildLedger, MissionLedger


def _child_line(child: ChildLedger) -> str:
    state = child.observed_state
    if child.health:
        state += f"/{child.health}"
    if child.backpressure:
        state += f" ({child.backpressure.reason}{', retryable' if child.backpressure.retryable else ''})"
    target = child.lineage.target_id if child.lineage else "-"
    mark = {"satisfied": "ok", "failed": "FAIL", "review-required": "REVIEW", "pending": ".."}[child.outcome]
    output = (child.output or "").strip().splitlines()
    shown = f"  -> {output[0][:60]}" if output else ""
    note = f"  [{child.note}]" if child.note else ""
    return f"  {mark:<6} {child.child_id:<20} {child.kind:<19} {state:<28} rev {child.revision if child.revision is not None else '-':<3} {target}{shown}{note}"


def render_progress(ledger: MissionLedger) -> str:
    summary = ledger.aggregation
    return (
        f"[{ledger.snapshot_seq:>3}] {ledger.mission_id}: {ledger.parent_state} | "
        f"{len(summary.successful)} ok, {len(summary.failed)} failed, {len(summary.pending)} pending, "
        f"{len(summary.review_required)} review | " + ", ".join(f"{c.child_id}={c.observed_state}" for c in ledger.children)
    )


def render_ledger(
    ledger: MissionLedger, *, waits: Mapping[str, str] | None = None, notes: Sequence[str] = (),
) -> str:
    """The ledger for a person; `waits` adds a line under a child saying why it waits (its place in
    the admission queue), `notes` lines at the end (e.g. that the queue could not be read)."""
    summary = ledger.aggregation
    lines = [
        f"mission {ledger.mission_id}: {ledger.parent_state}",
        f"  aggregation {summary.mode}: {summary.reason}",
    ]
    if ledger.verdict_reason and ledger.verdict_reason != summary.reason:
        lines.append(f"  verdict: {ledger.verdict_reason}")
    if ledger.best_output:
        lines.append(f"  best output ({ledger.best_output.child_id}): {ledger.best_output.output.strip()[:120]}")
    if ledger.review:
        review = ledger.review
        lines.append(f"  review: {review.decision} by {review.operator} at {review.decided_at.isoformat()}: {review.reason}")
    if ledger.cancellation:
        lines.append(f"  cancellation: {ledger.cancellation}")
    lines.append("  children:")
    for child in ledger.children:
        lines.append(_child_line(child))
        if waits and child.child_id in waits:
            lines.append(f"         {waits[child.child_id]}")
    lines.append(f"  ledger snapshot {ledger.snapshot_seq}")
    lines.extend(f"  {note}" for note in notes)
    return "\n".join(lines)
