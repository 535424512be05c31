"""What the `temporal` CLI prints is read back: `temporal workflow query --output json` prints an
empty list as null (seen with Temporal CLI 1.9.1 on a holder's first decision, before any signal:
`"happened":null`), and a client that validates it with our models must not fail on it."""

import json

from workflows.admission.messages import AdmissionDecision

PRINTED = (
    '{"queryResult":[{"binding_constraint":null,"error_code":null,"eta":null,"happened":null,"lease_expires_at":null,'
    '"lease_revision":0,"lease_ttl_seconds":null,"position":null,"reason":"","related_request_id":null,'
    '"request_id":"r1","revision":0,"state":"queued"}]}'
)


def test_a_decision_printed_by_the_temporal_cli_reads_back_with_nothing_happened():
    decision = AdmissionDecision.model_validate(json.loads(PRINTED)["queryResult"][0])
    assert decision.happened == [] and decision.state == "queued" and decision.revision == 0
    assert AdmissionDecision.model_validate({"request_id": "r1", "state": "queued", "happened": ["queued"]}).happened == ["queued"]
