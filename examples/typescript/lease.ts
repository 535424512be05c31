// A holder that is not a workflow takes a lease from a host group's admission singleton, waits with
// long polls, holds it while renewing, and gives it back (docs/admission-api.md). A conductor
// worker must poll the host group's task queue.
//
//   npx tsc && TEMPORAL_ADDRESS=127.0.0.1:7233 HOST_GROUP=default node dist/lease.js
import { ApplicationFailure, Client, Connection, WorkflowUpdateFailedError } from '@temporalio/client';

const address = process.env.TEMPORAL_ADDRESS ?? 'localhost:7233';
const namespace = process.env.TEMPORAL_NAMESPACE ?? 'default';
const hostGroup = process.env.HOST_GROUP ?? 'default';
const requestId = process.env.REQUEST_ID ?? `ts-lease-${Date.now()}`;
const holder = 'typescript-example';

/** The singleton's answer to every holder update (admission-decision.schema.json). */
interface AdmissionDecision {
  request_id: string;
  state: 'queued' | 'admitted' | 'released' | 'cancelled' | 'denied' | 'timed-out' | 'preempted' | 'requeued';
  revision: number;
  lease_revision: number;
  lease_ttl_seconds: number | null;
  position: number | null;
  binding_constraint: string | null;
  reason: string;
}

async function main(): Promise<void> {
  const connection = await Connection.connect({ address });
  const admission = new Client({ connection, namespace }).workflow.getHandle(`admission:${hostGroup}`);
  // While the singleton hands over to its next run (continue-as-new) it refuses new updates with
  // an ApplicationFailure of type HandingOver: send the same update again a moment later.
  const update = async (name: string, arg: object): Promise<AdmissionDecision> => {
    for (;;) {
      try {
        return await admission.executeUpdate<AdmissionDecision, [object]>(name, { args: [arg] });
      } catch (error) {
        const cause = error instanceof WorkflowUpdateFailedError ? error.cause : undefined;
        if (!(cause instanceof ApplicationFailure && cause.type === 'HandingOver')) throw error;
        await new Promise((resolve) => setTimeout(resolve, 200));
      }
    }
  };
  // A long poll for the next decision. When as many long polls as the host group allows wait
  // already (Temporal admits ten updates in flight per workflow by default), it is refused with an
  // ApplicationFailure of type PollLater: read the holder_decision query every few seconds instead.
  const news = async (afterRevision: number): Promise<AdmissionDecision> => {
    try {
      return await update('await_decision', { holder, request_id: requestId, after_revision: afterRevision, wait_seconds: 30 });
    } catch (error) {
      const cause = error instanceof WorkflowUpdateFailedError ? error.cause : undefined;
      if (!(cause instanceof ApplicationFailure && cause.type === 'PollLater')) throw error;
    }
    for (let waited = 0; ; waited += 2000) {
      await new Promise((resolve) => setTimeout(resolve, 2000));
      const decision = await admission.query<AdmissionDecision, [object]>('holder_decision', { holder, request_id: requestId });
      if (decision.revision > afterRevision || waited >= 30000) return decision;
    }
  };
  try {
    let decision = await update('acquire', {
      holder, request: { request_id: requestId, orchestrator_id: 'typescript-example', runtime_kind: 'host' }, wait_seconds: 0,
    });
    while (decision.state === 'queued') {
      console.log(`queued: position ${decision.position}, waiting on ${decision.binding_constraint}`);
      decision = await news(decision.revision);
    }
    if (decision.state !== 'admitted') throw new Error(`not admitted: ${decision.state} (${decision.reason})`);
    console.log(`admitted: lease revision ${decision.lease_revision}, TTL ${decision.lease_ttl_seconds} s`);
    decision = await update('renew_lease', { holder, request_id: requestId, lease_revision: decision.lease_revision });
    console.log(`renewed: lease revision ${decision.lease_revision}`);
    decision = await update('release_lease', { holder, request_id: requestId });
    console.log(`released: ${decision.state}`);
  } finally {
    await connection.close();
  }
}

main().catch((error) => {
  console.error(`lease.ts: ${error instanceof Error ? error.message : String(error)}`);
  process.exit(1);
});
