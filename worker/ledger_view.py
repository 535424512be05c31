"""Mission ledgers rendered for people (the CLI, the demo)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone

from workflows.json_input import one_line
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


_SOURCE_WORDS = {"executor": "the executor, task", "conductor-verifier": "the conductor's verifier, task",
                 "observation": "an observation"}  # fmt: skip


def evidence_line(child: ChildLedger) -> str | None:
    """`evidence: log, result from the executor, task T; verifier from the conductor's verifier,
    task V`, for a child that requires evidence or was verified; None for the others."""
    if not child.required_evidence and all(e.source == "executor" for e in child.evidence):
        return None
    groups: dict[tuple[str, str | None], list[str]] = {}
    for item in child.evidence:
        groups.setdefault((item.source, item.task_id), []).append(item.kind)
    parts = [
        f"{', '.join(kinds)} from {_SOURCE_WORDS[source]}{f' {task}' if task and source != 'observation' else ''}"
        for (source, task), kinds in groups.items()
    ]
    missing = f" (missing: {', '.join(child.missing_evidence)})" if child.missing_evidence else ""
    return f"evidence: {'; '.join(parts) or 'none yet'}{missing}"


def progress_text(ledger: MissionLedger) -> str:
    """What a progress line says, without the snapshot sequence: two ledgers with the same text
    (e.g. before and after a lease renewal) say the same to a person."""
    summary = ledger.aggregation
    return (
        f"{ledger.mission_id}: {ledger.parent_state} | "
        f"{len(summary.successful)} ok, {len(summary.failed)} failed, {len(summary.pending)} pending, "
        f"{len(summary.review_required)} review | " + ", ".join(f"{c.child_id}={c.observed_state}" for c in ledger.children)
    )


def render_progress(ledger: MissionLedger, at: datetime | None = None) -> str:
    """`HH:MM:SS snapshot N mission: state | counts | child=state, ...` (the time in UTC, left out
    without `at`; N is the ledger's snapshot sequence, as `conductor mission show` ends with)."""
    stamp = f"{at.astimezone(timezone.utc):%H:%M:%S} " if at is not None else ""
    return f"{stamp}snapshot {ledger.snapshot_seq} {progress_text(ledger)}"


def progress_record(ledger: MissionLedger, at: datetime, event: str = "progress") -> dict:
    """One JSON Lines record of `conductor mission watch --json`."""
    summary = ledger.aggregation
    return {
        "event": event,
        "time": at.astimezone(timezone.utc).isoformat(),
        "mission_id": ledger.mission_id,
        "snapshot_seq": ledger.snapshot_seq,
        "parent_state": ledger.parent_state,
        "aggregation": {"mode": summary.mode, "reason": summary.reason},
        "counts": {
            "ok": len(summary.successful), "failed": len(summary.failed),
            "pending": len(summary.pending), "review": len(summary.review_required),
        },
        "children": {c.child_id: c.observed_state for c in ledger.children},
    }


class ProgressLines:
    """Says whether a ledger says something new (its `progress_text` differs from the last one's)."""

    def __init__(self) -> None:
        self._last: str | None = None

    def changed(self, ledger: MissionLedger) -> bool:
        text = progress_text(ledger)
        if text == self._last:
            return False
        self._last = text
        return True


def _counts(summary) -> str:
    return (
        f"{len(summary.successful)} ok, {len(summary.failed)} failed, {len(summary.pending)} pending, "
        f"{len(summary.review_required)} review"
    )


def question_lines(mission_id: str, child: ChildLedger) -> list[str]:
    """A child's open question (what it asks, until when, the answer's schema, how to answer) and
    the answers given to it, for `mission show`."""
    lines = []
    question = child.question
    if question is not None:
        until = f", deadline {question.deadline.isoformat()}" if question.deadline is not None else ""
        who = "" if question.allowed_responders == ("any",) else f", answered by {', '.join(question.allowed_responders)}"
        # The prompt is the agent's text: shown as plain text, never as terminal control (spec.md S-1).
        lines.append(f"asks ({question.source}, prompt {question.prompt_id}{until}{who}): {one_line(question.prompt)}")
        lines.append(f"  answer schema: {json.dumps(question.response_schema, separators=(',', ':'))[:300]}")
        lines.append(f"  answer: conductor mission approve {mission_id} {child.child_id} [--reject] [--comment TEXT] [--payload JSON]")
    for answer in child.answers[-5:]:
        lines.append(
            f"answered by {answer.operator} at {answer.answered_at.isoformat()} (prompt {answer.prompt_id}): "
            f"{json.dumps(answer.payload, separators=(',', ':'))[:200]} -> {answer.outcome}"
        )
    return lines


def render_ledger(
    ledger: MissionLedger, *, waits: Mapping[str, str] | None = None, notes: Sequence[str] = (),
    details: Mapping[str, Sequence[str]] | None = None,
) -> str:
    """The ledger for a person; `waits` adds a line under a child saying why it waits (its place in
    the admission queue), `details` lines under a child (e.g. how a failed child ended), `notes`
    lines at the end (e.g. that the queue could not be read).

    Once the verdict has settled its reason is fixed, while the live summary keeps following the
    children (a quorum of 3 met, then a fourth child satisfied): the verdict's reason is said once,
    and the children since then as counts, so the two never read as two verdicts."""
    summary = ledger.aggregation
    lines = [f"mission {ledger.mission_id}: {ledger.parent_state}"]
    if ledger.verdict_reason:
        said = "cancelled" if ledger.parent_state == "cancelled" else f"verdict ({summary.mode})"
        lines.append(f"  {said}: {ledger.verdict_reason}")
        if ledger.verdict_reason != summary.reason:
            since = "as they are now" if ledger.parent_state == "cancelled" else "the verdict stays as it settled"
            lines.append(f"  children now: {_counts(summary)} ({since})")
    else:
        lines.append(f"  aggregation {summary.mode}: {summary.reason}")
    if ledger.best_output:
        lines.append(f"  best output ({ledger.best_output.child_id}): {ledger.best_output.output.strip()[:120]}")
    if ledger.review:
        review = ledger.review
        lines.append(f"  review: {review.decision} by {review.operator} at {review.decided_at.isoformat()}: {review.reason}")
    if ledger.cancellation and ledger.cancellation != ledger.verdict_reason:
        lines.append(f"  cancellation: {ledger.cancellation}")
    lines.append("  children:")
    for child in ledger.children:
        lines.append(_child_line(child))
        for attempt in child.attempts:  # earlier attempts: why each ended and was tried again
            if attempt.retried:
                lines.append(f"         attempt {attempt.attempt}: {attempt.ended}")
        if child.stopping:
            lines.append(f"         attempt {child.attempt} stopping: {child.stopping}")
        elif child.attempt > 1:
            lines.append(f"         attempt {child.attempt}" + (" (running)" if child.outcome == "pending" else ""))
        if waits and child.child_id in waits:
            lines.append(f"         {waits[child.child_id]}")
        evidence = evidence_line(child)
        if evidence is not None:
            lines.append(f"         {evidence}")
        lines.extend(f"         {line}" for line in question_lines(ledger.mission_id, child))
        for line in (details or {}).get(child.child_id, ()):
            lines.append(f"         {line}")
    for refusal in ledger.refused:  # a client's mistake: nothing changed, the mission ran on
        lines.append(f"  refused signal {refusal.signal} at {refusal.at.isoformat()}: {refusal.reason}")
    lines.append(f"  ledger snapshot {ledger.snapshot_seq}")
    lines.extend(f"  {note}" for note in notes)
    return "\n".join(lines)
