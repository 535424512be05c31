"""Why a mission's queued children wait: their place in the host group's admission queue.

`conductor mission show` reads it from the admission workflow's `queue` query through the
admission live view (`worker.admission_live`); the mission's host group comes from its
MissionHostGroup search attribute. Any failure to read it is one note line, never an error of
`show`: the ledger stands on its own.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio.service import RPCError

from worker.admission_live import QUEUE_ROWS, LiveAdmission, LiveError
from worker.mission_control import MissionControl
from workflows.admission.messages import QueueRow, admission_workflow_id, queue_place
from workflows.mission.ledger import MissionLedger
from workflows.mission.search import MISSION_HOST_GROUP

QUEUE_TIMEOUT = timedelta(seconds=5)  # `show` answers promptly even with no worker on the admission workflow


def queued_children(ledger: MissionLedger) -> dict[str, str]:
    """child_id -> admission request id, for every child whose admission is still queued."""
    return {
        child.child_id: child.admission.request_id
        for child in ledger.children
        if child.admission.state == "queued" and child.admission.request_id
    }


def wait_line(row: QueueRow, host_group: str) -> str:
    return f"waiting for admission: {queue_place(row.position, row.binding_constraint, admission_workflow_id(host_group), row.eta)}"


async def admission_waits(
    control: MissionControl, mission_id: str, ledger: MissionLedger,
) -> tuple[dict[str, str], list[str]]:
    """(child_id -> why it waits, notes): empty when no child is queued."""
    queued = queued_children(ledger)
    if not queued:
        return {}, []
    try:
        description = await control.handle(mission_id).describe(rpc_timeout=QUEUE_TIMEOUT)
        host_group = description.typed_search_attributes.get(MISSION_HOST_GROUP)
    except RPCError as error:
        return {}, [f"note: cannot tell the mission's host group to read its admission queue ({error.message})"]
    except Exception as error:  # a lost connection, say: still only a note
        return {}, [f"note: cannot tell the mission's host group to read its admission queue ({error})"]
    if not host_group:
        return {}, ["note: the mission has no MissionHostGroup search attribute: its admission queue is not shown"]
    live = LiveAdmission(control.client, host_group, reconnect_seconds=QUEUE_TIMEOUT.total_seconds())
    try:
        rows = await live.query("queue", QUEUE_ROWS, result_type=list[QueueRow], timeout=QUEUE_TIMEOUT)
    except LiveError as error:
        return {}, [f"note: admission queue not shown: {error}"]
    except Exception as error:  # anything else: still only a note
        return {}, [f"note: admission queue not shown: {type(error).__name__}: {error}"]
    by_request = {row.request_id: row for row in rows}
    waits = {}
    for child_id, request_id in queued.items():
        row = by_request.get(request_id)
        waits[child_id] = (
            wait_line(row, host_group) if row is not None
            else f"waiting for admission: not in the queue of {admission_workflow_id(host_group)} now (decided since?)"
        )
    return waits, []
