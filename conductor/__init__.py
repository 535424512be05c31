"""Mission Conductor for Python programs: the one module a client imports.

    import conductor

    client = await conductor.connect()                      # envconfig, the CLI's converter
    missions = conductor.MissionControl(client, conductor.TASK_QUEUE)  # where `conductor worker` polls
    ledger = await missions.run(conductor.parse_spec(spec_json))

    request = conductor.HeldRequest(request_id="etl-42", orchestrator_id="etl")
    async with conductor.hold(client, "default", request, holder="etl@host-3") as lease:
        ...                                                 # runs only while admitted

Missions (docs/mission-control-api.md): `MissionControl` starts, waits on, shows, reviews, stops,
cancels and watches them; its failures are the `Mission*` errors below, and `TemporalUnreachable`
once the server stayed out of reach past the reconnect bound. Holding an admission
lease from code that is not a workflow (docs/admission-api.md): `hold` around a block, or its two
halves `acquire` and `kept`; `HeldLease` is the lease, `NotAdmitted` a request that never got one,
`HostGroupWatch` one reader of the host group's decisions for a process with many holders.
Everything else in this repository is its implementation, free to change.
"""

from worker.connection import TemporalUnreachable, connect
from worker.lease import HeldLease, HostGroupWatch, NotAdmitted, acquire, hold, kept
from worker.mission_control import (
    MissionClosed,
    MissionControl,
    MissionIdUsed,
    MissionNotFound,
    MissionRefused,
    MissionSpecError,
    ReviewRefused,
    VerdictPending,
    parse_spec,
)
from worker.payloads import DATA_CONVERTER
from workflows.admission.holders import HeldRequest
from workflows.admission.messages import ADMISSION_TASK_QUEUE as TASK_QUEUE, AdmissionDecision
from workflows.mission.ledger import MissionLedger
from workflows.mission.spec import MissionSpec

__all__ = [
    "DATA_CONVERTER",
    "AdmissionDecision",
    "HeldLease",
    "HeldRequest",
    "HostGroupWatch",
    "MissionClosed",
    "MissionControl",
    "MissionIdUsed",
    "MissionLedger",
    "MissionNotFound",
    "MissionRefused",
    "MissionSpec",
    "MissionSpecError",
    "NotAdmitted",
    "ReviewRefused",
    "TASK_QUEUE",
    "TemporalUnreachable",
    "VerdictPending",
    "acquire",
    "connect",
    "hold",
    "kept",
    "parse_spec",
]
