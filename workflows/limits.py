"""Every size limit an input is held to, in one place (README.md, "Input limits", lists them).

Why limits at all: a mission spec travels whole in one Temporal payload (the MissionWorkflow's
input, and again at every continue-as-new), each child's part of it in another (the
WorkloadWorkflow's input), and its text lands in memos, summaries, ledgers, audit events and
logs. Temporal refuses a payload over 2 MiB and its SDK warns from 512 KiB, so anything unbounded
is a workflow that starts and then cannot go on. Each limit is checked where the input comes
in (`worker.inputs` for files and standard input, the pydantic models for the values), so a
bad input is refused with a line saying which limit it broke, before anything starts.

Pure constants: imported by workflow code (inside the sandbox) and by the CLI alike.
"""

from __future__ import annotations

KIB = 1024
MIB = 1024 * KIB

# --- what a mission spec may hold (workflows.mission.spec) -----------------------------------

# A goal is a sentence or a paragraph. It is the mission's memo (the SDK warns above 2 KiB),
# its static summary in the UI and part of its current details, so it stays short.
MAX_GOAL_CHARS = 2000
# What a child runs: a shell command on the local substrate, an agent's prompt elsewhere. It
# travels in the spec, the child's workflow input and the executor task; longer instructions
# belong in a file the command reads.
MAX_PROMPT_CHARS = 32 * KIB
# The whole spec as JSON, defaults included (1000 minimal children take ~370 KiB): Temporal's
# SDK warns about any payload above 512 KiB, and the spec shares its payload with the carried
# ledger when the mission continues as new.
MAX_SPEC_JSON_BYTES = 512 * KIB
# The longest wait a request, or a lease, may be given. Far beyond any sensible value, and far
# inside what the admission engine's date arithmetic can represent.
MAX_DURATION_SECONDS = 366 * 86_400
# Amounts of named resources (admission's `resource_capacity` and a request's `resources`):
# counted in thousandths, so that sums are exact; at most this many names in one map.
MAX_RESOURCE_AMOUNT = 10**12
MAX_RESOURCE_NAMES = 32
# Priorities are 64-bit integers wherever they are stored (fleet records, substrate, engine).
MIN_PRIORITY = -(2**63)
MAX_PRIORITY = 2**63 - 1

# --- ids and names ---------------------------------------------------------------------------

# Ids (workflows.admission.model.Identifier, the fleet contract's ids): 1-256 characters.
MAX_ID_CHARS = 256
# Temporal's default `limit.maxIDLength` for workflow ids.
MAX_WORKFLOW_ID_CHARS = 1000
# Who reviews a mission or changes a policy: a login name or an e-mail address, not a text.
MAX_OPERATOR_CHARS = 128
# Why an operator approved or rejected a mission (the ledger's ReviewDecision keeps 2000).
MAX_REVIEW_REASON_CHARS = 2000

# --- what the CLI reads (worker.inputs) ------------------------------------------------------

# A mission spec, an admission policy or request file, read before it is parsed. Larger than
# MAX_SPEC_JSON_BYTES so that a pretty-printed spec of the largest size still fits.
MAX_INPUT_FILE_BYTES = 1 * MIB
# A Fleet Workload v1 document (`conductor contract validate`): inventories list whole fleets.
MAX_CONTRACT_DOCUMENT_BYTES = 16 * MIB
# One line of an admission trace (`conductor admission simulate`); the trace itself is streamed.
MAX_TRACE_LINE_BYTES = 1 * MIB
# Arrays and objects inside each other. Every document here nests a handful of levels deep.
MAX_JSON_DEPTH = 64
# Digits of a JSON integer: enough for any 64-bit integer (19 digits, 20 unsigned).
MAX_JSON_INTEGER_DIGITS = 20
# Characters of a JSON number with a fraction or exponent (a float needs at most 24).
MAX_JSON_NUMBER_CHARS = 64
