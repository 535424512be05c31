// A holder that is not a workflow takes a lease from a host group's admission singleton, holds it
// while renewing, and gives it back (docs/admission-api.md). A conductor worker must poll the host
// group's task queue.
//
//   npx tsc && TEMPORAL_ADDRESS=127.0.0.1:7233 HOST_GROUP=default CONDUCTOR_TASK_QUEUE=mission-conductor node dist/lease.js
//
// The request's requester is an AdmissionHolder workflow that this program starts. The decisions
// the singleton signals to it are read from its history with a long poll (no update, no polling),
// and the lease is renewed and given back with the singleton's `renew` and `release` signals.
import { Client, Connection } from '@temporalio/client';

const address = process.env.TEMPORAL_ADDRESS ?? 'localhost:7233';
const namespace = process.env.TEMPORAL_NAMESPACE ?? 'default';
const taskQueue = process.env.CONDUCTOR_TASK_QUEUE ?? 'mission-conductor';
const hostGroup = process.env.HOST_GROUP ?? 'default';
const requestId = process.env.REQUEST_ID ?? `ts-lease-${Date.now()}`;
const holder = 'typescript-example';

/** Where a request stands (admission-decision.schema.json). */
interface AdmissionDecision {
  request_id: string;
  state: 'queued' | 'admitted' | 'released' | 'cancelled' | 'denied' | 'timed-out' | 'preempted' | 'unknown';
  revision: number;
  lease_revision: number;
  lease_ttl_seconds: number | null;
  position: number | null;
  binding_constraint: string | null;
  reason: string;
}

async function main(): Promise<void> {
  const connection = await Connection.connect({ address });
  const client = new Client({ connection, namespace });
  const requester = `holder:${hostGroup}/${holder}/${requestId}`; // the holder workflow's id (holder-input.schema.json)
  const admission = client.workflow.getHandle(`admission:${hostGroup}`);
  try {
    // One call submits: the holder workflow sends the singleton its `hold` signal itself.
    await client.workflow.start('AdmissionHolder', {
      taskQueue,
      workflowId: requester,
      args: [{ host_group: hostGroup, holder, request: { request_id: requestId, orchestrator_id: 'typescript-example' } }],
    });
    const decisions = followDecisions(client, requester);
    let decision: AdmissionDecision | undefined;
    do {
      const next = await decisions.next();
      if (next.done) throw new Error('the holder workflow ended without a decision');
      decision = next.value;
      if (decision.state === 'queued') console.log(`queued: position ${decision.position}, waiting on ${decision.binding_constraint}`);
    } while (decision.state === 'queued');
    if (decision.state !== 'admitted') throw new Error(`not admitted: ${decision.state} (${decision.reason})`);
    console.log(`admitted: lease revision ${decision.lease_revision}, TTL ${decision.lease_ttl_seconds} s`);
    // Renew at a third of the TTL for as long as the work runs (once here): every lease this requester holds.
    await admission.signal('renew', { requester, everything: true });
    console.log('renewed: a requester renewal sent');
    await admission.signal('release', { requester, request_ids: [requestId] });
    // The holder workflow closes with the request's last decision.
    const last = await client.workflow.getHandle(requester).result();
    console.log(`released: ${(last as AdmissionDecision).state}`);
  } finally {
    await connection.close();
  }
}

/** The decisions in the holder workflow's history (its `admission_decided` signals), as they land. */
async function* followDecisions(client: Client, workflowId: string): AsyncGenerator<AdmissionDecision> {
  let nextPageToken: Uint8Array | undefined;
  for (;;) {
    const page = await client.workflowService.getWorkflowExecutionHistory({
      namespace, execution: { workflowId }, waitNewEvent: true, nextPageToken,
    });
    for (const event of page.history?.events ?? []) {
      const signaled = event.workflowExecutionSignaledEventAttributes;
      if (signaled?.signalName !== 'admission_decided') continue;
      const data = signaled.input?.payloads?.[0]?.data;
      if (!data) continue;
      const batch = JSON.parse(Buffer.from(data).toString('utf8')) as { decisions: AdmissionDecision[] };
      for (const decision of batch.decisions) if (decision.request_id === requestId) yield decision;
    }
    if (!page.nextPageToken?.length) return; // the holder workflow closed
    nextPageToken = page.nextPageToken;
  }
}

main().catch((error) => {
  console.error(`lease.ts: ${error instanceof Error ? error.message : String(error)}`);
  process.exit(1);
});
