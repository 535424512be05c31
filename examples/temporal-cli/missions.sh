#!/usr/bin/env bash
# Missions driven with nothing but the `temporal` CLI and the published interface
# (docs/mission-control-api.md): start, await the ledger, query it, review, stop and cancel.
#
#   TEMPORAL_ADDRESS=127.0.0.1:7233 CONDUCTOR_TASK_QUEUE=mission-conductor HOST_GROUP=default \
#       examples/temporal-cli/missions.sh
#
# A conductor worker must poll the task queue (`conductor dev` runs one; `eval "$(conductor dev env)"`
# points this shell at it). Each step prints one line; the script exits non-zero at the first
# that does not hold. TEMPORAL (default `temporal`) names the CLI binary.
set -euo pipefail

temporal=${TEMPORAL:-temporal}
queue=${CONDUCTOR_TASK_QUEUE:-mission-conductor}
host_group=${HOST_GROUP:-default}
prefix=${MISSION_PREFIX:-cli-$(date +%s)-$$}

# The spec of a one-child mission, as JSON (docs/mission-spec.md; `conductor mission schema spec`).
spec() {  # mission-id aggregation-json kind prompt
    printf '{"mission_id":"%s","orchestrator_id":"temporal-cli","goal":"temporal CLI example","host_group":"%s","aggregation":%s,"children":[{"child_id":"only","kind":"%s","prompt":"%s"}]}' \
        "$1" "$host_group" "$2" "$3" "$4"
}

start() {  # mission-id spec-json: the workflow id is mission:<mission_id>, never reused
    "$temporal" workflow start --type MissionWorkflow --task-queue "$queue" \
        --workflow-id "mission:$1" --id-reuse-policy RejectDuplicate \
        --input "{\"spec\": $2}" >/dev/null
}

parent_state() {  # the ledger's parent_state in the JSON on standard input
    local json
    json=$(cat)
    [[ $json =~ \"parent_state\":\ *\"([a-z-]+)\" ]] && echo "${BASH_REMATCH[1]}"
}

ledger_state() {  # mission-id: where the mission stands, read with the `ledger` query
    "$temporal" workflow query --workflow-id "mission:$1" --name ledger --output json | parent_state
}

result_state() {  # mission-id: waits for the mission to close; its result is the final ledger
    "$temporal" workflow result --workflow-id "mission:$1" --output json | parent_state
}

expect() {  # what got wanted
    [ "$2" = "$3" ] || { echo "$1: got ${2:-nothing}, wanted $3" >&2; exit 1; }
}

until_state() {  # mission-id state
    for _ in $(seq 150); do
        [ "$(ledger_state "$1")" = "$2" ] && return 0
        sleep 0.2
    done
    echo "mission $1 never reached $2" >&2
    return 1
}

# 1. Start a one-shot mission and wait for its result: the final ledger.
id="$prefix-run"
start "$id" "$(spec "$id" '{"mode":"all-pass"}' one-shot-command 'echo hello from the temporal CLI')"
expect "run" "$(result_state "$id")" completed
echo "run: mission $id completed"

# 2. Query the ledger of a mission (running or closed).
echo "query: mission $id is $(ledger_state "$id")"

# 3. A manual-review mission waits for an operator: the `review` update records the decision.
id="$prefix-review"
start "$id" "$(spec "$id" '{"mode":"manual-review"}' one-shot-command 'echo please review')"
until_state "$id" awaiting-review
"$temporal" workflow update execute --workflow-id "mission:$id" --name review \
    --input '{"operator": "ops@example.com", "decision": "approve", "reason": "output checked"}' >/dev/null
expect "review" "$(result_state "$id")" completed
echo "review: mission $id approved and completed"

# 4. A daemon runs on after the verdict until the `stop` signal (the `wait_for_verdict` update
#    returns once the verdict has settled).
id="$prefix-stop"
start "$id" "$(spec "$id" '{"mode":"all-pass"}' daemon 'sleep 300')"
"$temporal" workflow update execute --workflow-id "mission:$id" --name wait_for_verdict >/dev/null
"$temporal" workflow signal --workflow-id "mission:$id" --name stop >/dev/null
expect "stop" "$(result_state "$id")" completed
echo "stop: mission $id stopped after its verdict"

# 5. Cancel abandons a mission before its verdict: its children are stopped, its leases given back.
id="$prefix-cancel"
start "$id" "$(spec "$id" '{"mode":"all-pass"}' one-shot-command 'sleep 300')"
until_state "$id" running
"$temporal" workflow cancel --workflow-id "mission:$id" >/dev/null
# The run ends cancelled once its children are stopped: `result` then reports the cancellation.
if "$temporal" workflow result --workflow-id "mission:$id" >/dev/null 2>&1; then
    echo "cancel: mission $id completed instead of being cancelled" >&2; exit 1
fi
expect "cancel" "$(ledger_state "$id")" cancelled
echo "cancel: mission $id cancelled"
