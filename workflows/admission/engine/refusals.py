"""What a request may never be: a class no policy limit lets run, a gang it cannot join; and the
wording of an operation's errors.
"""

from __future__ import annotations

from workflows.admission.engine.capacity import class_limits_of
from workflows.admission.engine.state import ClassKey, EngineState, gang_members
from workflows.admission.model import (
    AdmissionPolicy,
    AdmissionRequest,
    OpError,
    OpResult,
    amount_text,
)


def never_runs(policy: AdmissionPolicy, key: ClassKey) -> str | None:
    """The first limit that is zero for this class, named for a person; None if it can run."""
    environment, provider, runtime_kind, lane = key[:4]
    names = {
        "global": "max_concurrent",
        "environment": f"environment quota for {environment}",
        "provider": f"provider quota for {provider}",
        "runtime": f"runtime quota for {runtime_kind}",
        "lane": f"lane WIP limit for {lane}",
    }
    for kind, _label, limit in class_limits_of(policy, key):
        if limit == 0:
            return f"{names[kind]} is 0: this request can never run"
    return _amounts_never_fit(policy, key[5])


def _amounts_never_fit(policy: AdmissionPolicy, amounts: tuple) -> str | None:
    offered = policy.resource_capacity
    for name, asked in amounts:
        if name not in offered:
            has = f"it offers {', '.join(sorted(offered))}" if offered else "its policy sets no resource_capacity"
            return f"resource {name} is not offered by this host group ({has}): this request can never run"
        capacity = round(offered[name] * 1000)
        if asked > capacity:
            return (
                f"resource {name}: asks {amount_text(asked)} but the host group has {amount_text(capacity)} in all: "
                "this request can never run"
            )
    return None


def gang_refusal(state: EngineState, request: AdmissionRequest) -> OpResult | None:
    gang = state.gangs.get((request.orchestrator_id, request.gang_id))  # type: ignore[arg-type]
    if gang is None:
        return None
    if gang.size != request.gang_size:
        return op_error(
            "submit", "gang-mismatch",
            f"gang {request.gang_id} of {request.orchestrator_id} has gang_size {gang.size}, not "
            f"{request.gang_size}; every member must name the same gang_size",
        )
    members = gang_members(state, gang)
    if any(member.state == "admitted" for member in members):
        return op_error(
            "submit", "gang-running",
            f"gang {request.gang_id} of {request.orchestrator_id} is already admitted; a member cannot join "
            "a gang that runs: give the new request another gang_id",
        )
    if len(members) >= gang.size:
        return op_error(
            "submit", "gang-full",
            f"gang {request.gang_id} of {request.orchestrator_id} already has its {gang.size} members; "
            "give the new request another gang_id or raise gang_size for a new gang",
        )
    return None


def op_error(op: str, code: str, message: str) -> OpResult:
    return OpResult.model_construct(op=op, ok=False, record=None, snapshot=None, error=OpError(code=code, message=message))


def not_found(op: str, request_id: str) -> OpResult:
    return op_error(op, "not-found", f"no admission request {request_id} in this host group (never submitted, or dropped after retention)")
