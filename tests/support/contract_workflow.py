"""A workflow for tests/interfaces/test_contract.py, in its own module so the sandbox imports only the contract.

It proves `workflows.contract` imports and runs inside the Temporal workflow sandbox, and that a
`WorkloadRecord` survives the pydantic data converter unchanged.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow

from workflows.contract import WorkloadRecord, parse_document, to_wire


@workflow.defn(sandboxed=True)
class ContractRoundTripWorkflow:
    @workflow.run
    async def run(self, record: WorkloadRecord) -> dict[str, Any]:
        return to_wire(parse_document(to_wire(record)))
