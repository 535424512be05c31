// The mission interface as a TypeScript program sees it: written from the published JSON Schemas
// (`conductor mission schema mission-input`, `mission-spec`, `mission-ledger`, `review-request`, `answer-request`,
// `answer-result`; shipped in worker/schemas/) and
// docs/mission-control-api.md. Only the fields this example reads are typed; the schemas have all.
import { Client, WorkflowHandle, WorkflowIdReusePolicy } from '@temporalio/client';

export const MISSION_WORKFLOW = 'MissionWorkflow';
export const DEFAULT_TASK_QUEUE = 'mission-conductor';

export type WorkloadKind = 'one-shot-command' | 'daemon' | 'persistent-agent' | 'scheduled-collector';
export type Aggregation =
  | { mode: 'all-pass' }
  | { mode: 'quorum'; minimum_successes: number }
  | { mode: 'best-output' }
  | { mode: 'fail-fast' }
  | { mode: 'manual-review' };

export interface ChildSpec {
  child_id: string;
  kind: WorkloadKind;
  prompt: string;
  [field: string]: unknown; // environment, provider, priority, budgets, ... (mission-spec.schema.json)
}

export interface MissionSpec {
  mission_id: string;
  orchestrator_id: string;
  goal: string;
  host_group: string;
  aggregation?: Aggregation;
  children: ChildSpec[];
}

/** The workflow's input: `{"spec": ...}` (worker/schemas/mission-input.schema.json). */
export interface MissionInput {
  spec: MissionSpec;
}

export type ParentState =
  | 'planning' | 'admitting' | 'running' | 'awaiting-review'
  | 'completed' | 'failed' | 'operator-review-required' | 'cancelled';

export interface Refusal {
  at: string;
  signal: string;
  reason: string;
}

/** The workflow's result, the `ledger` query's answer and the updates' (mission-ledger.schema.json). */
export interface MissionLedger {
  mission_id: string;
  parent_state: ParentState;
  verdict_reason: string | null;
  children: { child_id: string; observed_state: string; outcome: string; question: Question | null }[];
  refused: Refusal[];
  snapshot_seq: number;
}

/** The `review` update's argument (review-request.schema.json). */
export interface ReviewRequest {
  operator: string;
  decision: 'approve' | 'reject';
  reason: string;
}

/** A child's open question (mission-ledger.schema.json, `children[].question`): hitl-prompt/v1's envelope. */
export interface Question {
  prompt_id: string;
  prompt: string;
  response_schema: Record<string, unknown>;
  deadline: string | null;
  allowed_responders: string[];
  source: 'executor' | 'gate';
}

/** The `answer_child` update's argument (answer-request.schema.json) and result (answer-result.schema.json). */
export interface AnswerRequest {
  child_id: string;
  operator: string;
  payload: Record<string, unknown>;
  prompt_id?: string;
}

export interface AnswerResult {
  child_id: string;
  prompt_id: string;
  outcome: 'delivered' | 'vote' | 'refused-by-executor' | 'approved-dispatch' | 'rejected-dispatch';
  detail: string;
}

/** A mission's workflow id: one id names one mission for good. */
export function missionWorkflowId(missionId: string): string {
  return `mission:${missionId}`;
}

export async function startMission(client: Client, taskQueue: string, spec: MissionSpec): Promise<WorkflowHandle> {
  const input: MissionInput = { spec };
  return client.workflow.start(MISSION_WORKFLOW, {
    taskQueue,
    workflowId: missionWorkflowId(spec.mission_id),
    workflowIdReusePolicy: WorkflowIdReusePolicy.REJECT_DUPLICATE,
    args: [input],
    memo: { goal: spec.goal },
  });
}

export const ledger = (handle: WorkflowHandle) => handle.query<MissionLedger>('ledger');
export const waitForVerdict = (handle: WorkflowHandle) => handle.executeUpdate<MissionLedger, []>('wait_for_verdict');
export const review = (handle: WorkflowHandle, request: ReviewRequest) =>
  handle.executeUpdate<MissionLedger, [ReviewRequest]>('review', { args: [request] });
export const answerChild = (handle: WorkflowHandle, request: AnswerRequest) =>
  handle.executeUpdate<AnswerResult, [AnswerRequest]>('answer_child', { args: [request] });
export const stop = (handle: WorkflowHandle) => handle.signal('stop');
