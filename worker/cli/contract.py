"""`conductor contract validate FILE...` and `conductor contract schema`: Fleet Workload Contract v1.

`validate` prints one line per file that passes (`FILE: ok`) and one line per problem otherwise
(`FILE: $.json.path: message`), so the output can be grepped and fixed line by line. A file that
cannot be read, is too large, is not UTF-8 or not JSON within the limits (`worker.inputs`) is one
`FILE: $: problem` line; every line is escaped to stay one line, whatever keys a document has.

`schema` prints the JSON Schema the product ships (workflows/fleet_workload_v1/), byte for byte,
so a user of an installed wheel can hand it to other tools: `conductor contract schema > v1.json`.
"""

from __future__ import annotations

import argparse
import sys

from worker.inputs import STDIN, STDIN_LABEL, InputError, one_line, parse_json, read_bytes
from workflows import fleet_workload_v1
from workflows.contract import ContractError, parse_document
from workflows.limits import MAX_CONTRACT_DOCUMENT_BYTES


def register(subparsers: argparse._SubParsersAction) -> None:
    contract = subparsers.add_parser(
        "contract", help="Fleet Workload Contract v1: validate documents, print the JSON Schema"
    )
    commands = contract.add_subparsers(dest="contract_command", required=True, metavar="COMMAND")
    validate = commands.add_parser(
        "validate",
        help="check workload, inventory and reconciliation documents against the contract",
        description="Validate JSON documents against Fleet Workload Contract v1 "
        "(urn:agentic-orchestration:fleet-workload:v1), including the rule that no credential material "
        "crosses the boundary. Prints 'FILE: ok' or one 'FILE: $.path: problem' line per problem; "
        "exits 1 if any file is invalid, unreadable or not JSON.",
    )
    validate.add_argument("files", nargs="+", metavar="FILE", help="JSON document to check; - reads standard input")
    validate.set_defaults(func=run_validate)
    schema = commands.add_parser(
        "schema",
        help="print the contract's JSON Schema (the copy this installation ships)",
        description="Print the Fleet Workload Contract v1 JSON Schema "
        "(urn:agentic-orchestration:fleet-workload:v1, draft 2020-12) to standard output, exactly as "
        "shipped with Mission Conductor.",
    )
    schema.set_defaults(func=run_schema)


def run_validate(args: argparse.Namespace) -> int:
    all_ok = True
    for name in args.files:
        label = STDIN_LABEL if name == STDIN else name
        issues = _check(name)
        for path, message in issues:
            print(one_line(f"{label}: {path}: {message}"))
        if not issues:
            print(one_line(f"{label}: ok"))
        all_ok = all_ok and not issues
    return 0 if all_ok else 1


def run_schema(args: argparse.Namespace) -> int:
    sys.stdout.write(fleet_workload_v1.schema_text())
    return 0


def _check(name: str) -> list[tuple[str, str]]:
    try:
        data = parse_json(read_bytes(name, "contract document", max_bytes=MAX_CONTRACT_DOCUMENT_BYTES))
    except InputError as error:
        return [("$", error.report)]
    try:
        parse_document(data)
    except ContractError as error:
        return error.issues
    return []
