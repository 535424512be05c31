// Missions driven from TypeScript with @temporalio/client alone: start, await the ledger, query,
// review, answer a child's question, stop, cancel, and what a mistake looks like. A conductor worker must poll the task queue.
//
//   npm install && npx tsc && TEMPORAL_ADDRESS=127.0.0.1:7233 HOST_GROUP=default node dist/missions.js
import {
  ApplicationFailure, CancelledFailure, Client, Connection, WorkflowFailedError, WorkflowUpdateFailedError,
} from '@temporalio/client';
import {
  DEFAULT_TASK_QUEUE, MissionLedger, MissionSpec, ParentState, WorkloadKind, Aggregation,
  answerChild, ledger, review, startMission, stop, waitForVerdict,
} from './mission-control.js';

const address = process.env.TEMPORAL_ADDRESS ?? 'localhost:7233';
const namespace = process.env.TEMPORAL_NAMESPACE ?? 'default';
const taskQueue = process.env.CONDUCTOR_TASK_QUEUE ?? DEFAULT_TASK_QUEUE;
const hostGroup = process.env.HOST_GROUP ?? 'default';
const prefix = process.env.MISSION_PREFIX ?? `ts-${Date.now()}`;

function spec(suffix: string, aggregation: Aggregation, kind: WorkloadKind, prompt: string): MissionSpec {
  return {
    mission_id: `${prefix}-${suffix}`,
    orchestrator_id: 'typescript-example',
    goal: 'TypeScript example',
    host_group: hostGroup,
    aggregation,
    children: [{ child_id: 'only', kind, prompt }],
  };
}

function expect(step: string, got: unknown, wanted: unknown): void {
  if (got !== wanted) throw new Error(`${step}: got ${String(got)}, wanted ${String(wanted)}`);
}

async function until(step: string, check: () => Promise<boolean>): Promise<void> {
  for (let i = 0; i < 150; i++) {
    if (await check()) return;
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  throw new Error(`${step}: timed out`);
}

async function main(): Promise<void> {
  const connection = await Connection.connect({ address });
  const client = new Client({ connection, namespace });
  try {
    // 1. Start a one-shot mission; its result is the final ledger.
    let handle = await startMission(client, taskQueue, spec('run', { mode: 'all-pass' }, 'one-shot-command', 'echo hello from TypeScript'));
    const done: MissionLedger = await handle.result();
    expect('run', done.parent_state, 'completed');
    console.log(`run: mission ${done.mission_id} completed`);

    // 2. The ledger query answers for running and closed missions alike.
    console.log(`query: mission ${done.mission_id} is ${(await ledger(handle)).parent_state}`);

    // 3. Manual review: the `review` update records the operator's decision (a validator refuses
    //    a malformed or untimely one before it reaches history).
    handle = await startMission(client, taskQueue, spec('review', { mode: 'manual-review' }, 'one-shot-command', 'echo please review'));
    await until('review', async () => (await ledger(handle)).parent_state === ('awaiting-review' as ParentState));
    await review(handle, { operator: 'ops@example.com', decision: 'approve', reason: 'output checked' });
    expect('review', ((await handle.result()) as MissionLedger).parent_state, 'completed');
    console.log(`review: mission ${handle.workflowId} approved and completed`);

    // 4. A child asks a person (its task goes input-required with a hitl-prompt/v1 envelope; on the
    //    local substrate, `$CONDUCTOR_ASK`): the ledger shows the question, `answer_child` answers it.
    //    A payload its response_schema refuses is a rejected update, and nothing reaches the task.
    handle = await startMission(client, taskQueue, spec('answer', { mode: 'all-pass' }, 'one-shot-command',
      "$CONDUCTOR_ASK 'Proceed?' && echo proceeding"));
    await until('answer', async () => (await ledger(handle)).children[0].question !== null);
    const question = (await ledger(handle)).children[0].question!;
    try {
      await answerChild(handle, { child_id: 'only', operator: 'ops@example.com', payload: { approved: 'yes' } });
      throw new Error('answer: a wrong payload was taken');
    } catch (error) {
      if (!(error instanceof WorkflowUpdateFailedError) || !String(error.cause?.message).includes('/approved')) throw error;
    }
    const answered = await answerChild(handle, {
      child_id: 'only', operator: 'ops@example.com', payload: { approved: true }, prompt_id: question.prompt_id,
    });
    expect('answer', answered.outcome, 'delivered');
    expect('answer', ((await handle.result()) as MissionLedger).parent_state, 'completed');
    console.log(`answer: ${question.prompt} ${answered.outcome}; mission ${handle.workflowId} completed`);

    // 5. Long-lived children run on after the verdict until `stop`.
    handle = await startMission(client, taskQueue, spec('stop', { mode: 'all-pass' }, 'daemon', 'sleep 300'));
    expect('stop', (await waitForVerdict(handle)).parent_state, 'completed');
    await stop(handle);
    expect('stop', ((await handle.result()) as MissionLedger).parent_state, 'completed');
    console.log(`stop: mission ${handle.workflowId} stopped after its verdict`);

    // 6. Cancel abandons a mission before its verdict; the run ends cancelled.
    handle = await startMission(client, taskQueue, spec('cancel', { mode: 'all-pass' }, 'one-shot-command', 'sleep 300'));
    await until('cancel', async () => (await ledger(handle)).parent_state === 'running');
    await handle.cancel();
    try {
      await handle.result();
      throw new Error('cancel: the mission completed instead');
    } catch (error) {
      if (!(error instanceof WorkflowFailedError && error.cause instanceof CancelledFailure)) throw error;
    }
    console.log(`cancel: mission ${handle.workflowId} cancelled`);

    // 7. A mistake fails the run at once, typed: ApplicationFailure of type InvalidInput, non-retryable.
    const wrong = { ...spec('mistake', { mode: 'all-pass' }, 'one-shot-command', 'true'), aggregation: { mode: 'quorum', quorum: 1 } };
    handle = await startMission(client, taskQueue, wrong as unknown as MissionSpec);
    try {
      await handle.result();
      throw new Error('mistake: the mission ran');
    } catch (error) {
      const cause = error instanceof WorkflowFailedError ? error.cause : undefined;
      if (!(cause instanceof ApplicationFailure) || cause.type !== 'InvalidInput' || !cause.nonRetryable) throw error;
      console.log(`mistake: ${cause.message}`);
    }
  } finally {
    await connection.close();
  }
}

main().catch((error) => {
  console.error(`missions.ts: ${error instanceof Error ? error.message : String(error)}`);
  process.exit(1);
});
