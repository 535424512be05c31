"""One `Placement` (workflows/admission/model.py) for the engine's request, a holder's request and
a mission's child: the same fields and defaults at the edges, and an engine request that must name
where it runs (as before the three shared one type)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from pydantic import ValidationError

from workflows.admission.holders import HeldRequest
from workflows.admission.model import ENGINE_PLACEMENT, AdmissionRequest, Placement
from workflows.mission.spec import ChildSpec

T0 = datetime(2026, 12, 1, tzinfo=timezone.utc)


def test_the_edges_take_the_defaults_and_hand_the_engine_a_full_placement() -> None:
    held = HeldRequest(request_id="r", orchestrator_id="o", priority=3)
    child = ChildSpec(child_id="c", kind="one-shot-command", prompt="true", priority=3)
    assert held.placement() == child.placement() == Placement(priority=3).placement()
    request = held.submitted(T0)
    assert request.placement() == held.placement() and request.submitted_at == T0


def test_the_engines_request_names_every_field_it_places_by() -> None:
    given = {"request_id": "r", "orchestrator_id": "o", "submitted_at": T0.isoformat(), "provider": "local"}
    with pytest.raises(ValidationError) as refused:
        AdmissionRequest.model_validate(given)
    assert [error["loc"] for error in refused.value.errors()] == [
        (name,) for name in ENGINE_PLACEMENT if name != "provider"
    ]
    # ... together with whatever else is wrong, as one answer.
    with pytest.raises(ValidationError) as refused:
        AdmissionRequest.model_validate({"request_id": "r", "orchestrator_id": "o", "priority": "high", "bogus": 1})
    problems = {error["loc"][0]: error["type"] for error in refused.value.errors()}
    assert problems == {
        "environment": "missing", "provider": "missing", "runtime_kind": "missing", "priority": "int_parsing",
        "queue_timeout_seconds": "missing", "submitted_at": "missing", "bogus": "extra_forbidden",
    }
    schema = AdmissionRequest.model_json_schema()
    assert set(ENGINE_PLACEMENT) <= set(schema["required"])
    assert not any("default" in schema["properties"][name] for name in ENGINE_PLACEMENT)
