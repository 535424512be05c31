"""MissionWorkflow: plan, admit, dispatch, supervise and aggregate one mission.

A thin shell around pure cores: planning (`planning`), the supervisor that decides what the
mission does about every child (`supervisor`, over one `ChildRun` per child: `children`), how a
child starts (`dispatch`) and the verdict (`aggregation`); admission is the host group's
singleton, reached through `AdmissionClient`. What stays here is wiring: signals and updates are
handed to the supervisor (`hear`) and wake one loop, which hands it each pass, child's end and
the closing (`step`) and carries out the actions it returns (cancel, submit, start, release),
writes a snapshot when the ledger changed, and keeps the search attributes and current details
true for operators in the Temporal UI.

Verdict and lifetime are separate: the verdict settles (ledger, search
attributes, `wait_for_verdict`) as soon as the aggregation decides; the workflow
itself closes only when no child is live, so long-lived children stay
supervised, their leases renewed, until an operator sends `stop`.

That can be days, and every renewal round costs the history about a dozen events (a
requester renewal gets no answer, but its timer, signal and workflow tasks stay), so
the mission hands over to a new run (continue-as-new) once the history is long,
whenever only long-lived children are running. Those children are started
ABANDON and report everything by signal, their last observation included, so they
outlive the run that started them and the current run hears their end. The new run
takes the ledger, the children's bookkeeping and the admission requests along
(`MissionCarry`). Since a terminated mission can no longer cancel them, they show
it a sign of life after every quiet watch and stop their runtime task once it
cannot be signalled (`workflows.workload.workflow`).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from pydantic import TypeAdapter
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, is_cancelled_exception
from temporalio.workflow import ChildWorkflowCancellationType, ParentClosePolicy

from workflows.cancellation import raise_if_cancel_requested
from workflows.mission.snapshots import LedgerWriter
from workflows.timers import KeptTimer

with workflow.unsafe.imports_passed_through():
    from workflows.admission.client import AdmissionClient
    from workflows.failures import refused_start
    from workflows.inbound import Refusal, Refused, argument, no_argument, signal_argument
    from workflows.metrics import mission_closed
    from workflows.mission import aggregation, supervisor
    from workflows.mission.dispatch import child_start
    from workflows.mission.ledger import MissionLedger, ReviewDecision
    from workflows.mission.messages import (
        ANSWER_CHILD, MISSION_WORKFLOW, RUNNING_WORKFLOWS, MissionCarry, ReviewRequest, WorkflowIds, read_mission_input,
    )
    from workflows.mission.observation import ALIVE_SIGNAL, OBSERVATION_SIGNAL, ChildObservation
    from workflows.mission.planning import plan
    from workflows.mission.questions import (
        Answer, AnswerRequest, AnswerResult, Outcome, answer_message_id, answer_refusal, decided_here,
    )
    from workflows.mission.search import MISSION_AWAITING_ANSWER, mission_attributes
    from workflows.mission.spec import MissionSpec
    from workflows.mission.supervisor import (
        Action, Answered, Cancel, CancelAsked, Closed, Closing, Ended, Event, Fold, Gone, Heard, MissionState, Note, Observed, Pass,
        Planned, Release, Reviewed, SignalRefused, Start, StopAsked, Submit,
    )
    from workflows.workload.client import cancel_workload, how_it_ended
    from workflows.workload.messages import (
        ANSWER_QUESTION, LIST_TARGETS, WORKLOAD_WORKFLOW, AnswerDelivered, QuestionAnswer, TargetList, WorkloadResult,
    )


# How long a stopped child an earlier run started may stay silent before the mission asks the
# server whether its workflow still runs (one that was terminated will never answer).
SILENCE_BEFORE_ASKING = timedelta(seconds=10)
# Where a client that sent a bad argument finds the right shape (docs/mission-control-api.md).
REVIEW_HINT = "see `conductor mission schema review-request` and docs/mission-control-api.md"
ANSWER_HINT = "see `conductor mission schema answer-request` and docs/mission-control-api.md"
# How long an answer's delivery to the executor is tried (it is retried meanwhile): past it, the
# update says it was not delivered and the question stays open for another answer.
ANSWER_DELIVERY = timedelta(seconds=60)
_CHILD_ID = TypeAdapter(str)


@workflow.defn(name=MISSION_WORKFLOW)
class MissionWorkflow:
    @workflow.init
    def __init__(self, *args: Any) -> None:
        # Any client may start a mission (docs/mission-control-api.md): its input is checked here,
        # and a bad one fails the run at once instead of its first workflow task for ever.
        try:
            input = read_mission_input(args)
        except Refused as refused:
            raise refused_start(refused, MISSION_WORKFLOW) from None
        self._input = input
        self._state = MissionState(
            spec=input.spec, ledger=aggregation.initial_ledger(input.spec),
            max_children_in_flight=input.max_children_in_flight,
        )
        # Requester renewals: one signal per round that names no lease and gets no answer
        # (docs/scaling.md), so a round writes no decision, lease revision or ledger snapshot.
        self._admission = AdmissionClient(
            input.spec.host_group, search_attributes=input.search_attributes, renewal="requester",
            on_refused=self._refuse,
        )
        self._wake = 0
        self._lease_timer = KeptTimer("next lease expiry or deadline")  # wakes a pass then
        self._snapshots = LedgerWriter(lambda: self._state.ledger, self._snapshot_summary)
        self._shown_state: str | None = None
        self._shown_awaiting: bool | None = None
        self._delivering: set[str] = set()  # prompt ids whose answer is on its way to the executor
        if input.carried is not None:  # the previous run continued as new
            supervisor.take_over(self._state, input.carried.progress)
            self._snapshots.written_seq = input.carried.written_seq
            self._admission.restore(input.carried.admission)

    @property
    def _spec(self) -> MissionSpec:
        return self._state.spec

    # --- operator and child inputs ----------------------------------------------------------

    def _hear(self, event: Heard) -> None:
        supervisor.hear(self._state, event)
        self._wake += 1

    @workflow.signal(name=OBSERVATION_SIGNAL, description=(
        "For this mission's workload workflows only: a child's new observation. Not an operator action."
    ))
    def workload_observed(self, *args: Any) -> None:
        observation = signal_argument(args, ChildObservation, OBSERVATION_SIGNAL, self._refuse)
        if observation is not None:
            self._hear(Observed(observation))

    @workflow.signal(name=ALIVE_SIGNAL, description=(
        "For this mission's long-lived workload workflows only: a sign of life. Not an operator action."
    ))
    def workload_alive(self, *args: Any) -> None:
        """A long-lived child's sign of life; that the signal was delivered is all it needs."""
        signal_argument(args, _CHILD_ID, ALIVE_SIGNAL, self._refuse)

    @workflow.signal(description=(
        "Operators: once the verdict has settled, stop the long-lived children (their runtime tasks too), "
        "give back their leases and close (`conductor mission stop`). To abandon a mission, cancel it."
    ))
    def stop(self, *args: Any) -> None:
        """Stop supervising: stop every live child's runtime task, release the leases, close."""
        try:
            no_argument(args, "the stop signal")
        except Refused as refused:
            self._refuse("stop", refused)
            return
        self._hear(StopAsked())

    @workflow.update(description=(
        "Operators: approve or reject a manual-review mission (`conductor mission review`); "
        "requires the operator's name and a reason, which the ledger records."
    ))
    def review(self, *args: Any) -> MissionLedger:
        request = argument(args, ReviewRequest, "the review update's argument")
        workflow.logger.info("review %s by %s: %s", request.decision, request.operator, request.reason)
        self._hear(Reviewed(ReviewDecision(
            operator=request.operator, decision=request.decision, reason=request.reason, decided_at=workflow.now(),
        )))
        return self._state.ledger

    @review.validator
    def _review_allowed(self, *args: Any) -> None:
        argument(args, ReviewRequest, "the review update's argument", hint=REVIEW_HINT)
        refusal = aggregation.review_refusal(self._state.ledger, self._spec)
        if refusal is not None:
            raise ValueError(refusal)

    @workflow.update(name=ANSWER_CHILD, description=(
        "Operators: answer a child's open question (its task's hitl-prompt/v1 prompt, or \"dispatch CHILD?\" of "
        "a gated child): {child_id, operator, payload, prompt_id?} (`conductor mission approve`). The payload "
        "must match the question's response_schema; the answer is recorded in the ledger and forwarded once."
    ))
    async def answer_child(self, *args: Any) -> AnswerResult:
        request = argument(args, AnswerRequest, "the answer_child update's argument")
        child = self._state.ledger.child(request.child_id)
        question = child.question
        assert question is not None  # the validator ran in this same workflow task

        def answer(outcome: Outcome, detail: str) -> AnswerResult:
            self._hear(Answered(request.child_id, Answer(
                prompt_id=question.prompt_id, operator=request.operator, answered_at=workflow.now(),
                payload=request.payload, outcome=outcome, detail=detail,
            )))
            workflow.logger.info("answer to %s of %s by %s: %s (%s)", question.prompt_id, request.child_id, request.operator, outcome, detail)
            return AnswerResult(child_id=request.child_id, prompt_id=question.prompt_id, outcome=outcome, detail=detail)

        here = decided_here(question, child.answers, request.payload)
        if here is not None:
            return answer(*here)
        assert question.task_id is not None  # an executor's question names its task
        self._delivering.add(question.prompt_id)
        try:
            delivery: AnswerDelivered = await workflow.execute_activity(
                ANSWER_QUESTION,
                QuestionAnswer(
                    instance_id=self._state.children[request.child_id].assignment.target_id, task_id=question.task_id,
                    message_id=answer_message_id(self._spec.mission_id, request.child_id, question.prompt_id),
                    prompt_id=question.prompt_id, payload=request.payload,
                ),
                result_type=AnswerDelivered, start_to_close_timeout=timedelta(seconds=30),
                schedule_to_close_timeout=ANSWER_DELIVERY, summary=f"answer {request.child_id}'s question",
            )
        except ActivityError as error:
            delivery = AnswerDelivered(delivered=False, detail=f"not delivered: {error.cause or error}")
        finally:
            self._delivering.discard(question.prompt_id)
        return answer("delivered" if delivery.delivered else "refused-by-executor", delivery.detail)

    @answer_child.validator
    def _answer_allowed(self, *args: Any) -> None:
        request = argument(args, AnswerRequest, "the answer_child update's argument", hint=ANSWER_HINT)
        if request.child_id not in self._state.children:
            known = ", ".join(child.child_id for child in self._spec.children[:10])
            raise ValueError(f"mission {self._spec.mission_id} has no routed child {request.child_id!r} (children: {known})")
        child = self._state.ledger.child(request.child_id)
        if child.question is not None and child.question.prompt_id in self._delivering:
            raise ValueError(f"an answer to child {request.child_id}'s question is being delivered; read the ledger for how it went")
        refusal = answer_refusal(child.question, child.answers, request)
        if refusal is not None:
            raise ValueError(refusal)

    @workflow.update(description="Returns the ledger once the verdict has settled (what `conductor mission run` waits on).")
    async def wait_for_verdict(self, *args: Any) -> MissionLedger:
        """Returns the ledger once the verdict has settled (or the mission was cancelled)."""
        await workflow.wait_condition(lambda: aggregation.is_final(self._state.ledger))
        return self._state.ledger

    @wait_for_verdict.validator
    def _wait_takes_nothing(self, *args: Any) -> None:
        no_argument(args, "the wait_for_verdict update")

    @workflow.query(description="The mission's ledger now: every child's state, the aggregation and the verdict.")
    def ledger(self, *args: Any) -> MissionLedger:
        no_argument(args, "the ledger query")
        return self._state.ledger

    def _refuse(self, signal: str, refused: Refused) -> None:
        """A signal refused (workflows.inbound): logged, and kept in the ledger for operators."""
        workflow.logger.warning("signal %s refused: %s", signal, refused)
        self._hear(SignalRefused(Refusal(at=workflow.now(), signal=signal, reason=str(refused))))

    # --- the run ----------------------------------------------------------------------------

    @workflow.run
    async def run(self, *args: Any) -> MissionLedger:
        try:
            if self._input.carried is None:
                await self._plan()
            renewals = asyncio.ensure_future(self._admission.keep_leases_alive())
            await self._supervise()
            await self._close("mission finished")
            await renewals  # give_back_everything (in _close) ends the renewal loop
            await workflow.wait_condition(workflow.all_handlers_finished)  # let wait_for_verdict answer
        except BaseException as error:
            # Cancelled from the CLI or the UI (the cancellation may surface through an activity
            # or child it interrupted): stop children and runtime tasks, give back every request
            # and lease, record why, then end as cancelled.
            if isinstance(error, GeneratorExit) or not is_cancelled_exception(error):
                raise
            self._hear(CancelAsked())
            await asyncio.shield(asyncio.ensure_future(self._close("mission cancelled")))
            raise
        return self._state.ledger

    async def _step(self, event: Event) -> None:
        await self._perform(supervisor.step(self._state, event, self._admission, workflow.now()))

    async def _plan(self) -> None:
        self._details("planning: listing executor targets")
        # A local activity: one marker event, no round trip through the server.
        targets: TargetList = await workflow.execute_local_activity(
            LIST_TARGETS,
            result_type=TargetList,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=10, non_retryable_error_types=["TypeError"]),
            summary="list executor targets",
        )
        actions = supervisor.step(self._state, Planned(*plan(self._spec, targets.targets)), self._admission, workflow.now())
        await self._snapshots.write()
        if actions:
            self._details(f"admitting: {len(self._state.children.ids())} requests to admission:{self._spec.host_group}")
            await self._perform(actions)

    async def _supervise(self) -> None:
        while True:
            at_start = (self._wake, self._admission.version)
            await self._step(Pass())
            if not supervisor.finished(self._state, self._admission):  # else closing writes and shows it
                await self._snapshots.write()
                self._publish()
            if supervisor.supervision_over(self._state, self._admission):
                return
            # Anything that arrived while this pass awaited (an observation during a snapshot,
            # a child ending during a start) must wake the next pass at once: compare with what
            # the pass started from, not with what it ended with.
            raise_if_cancel_requested()  # one that a completed operation swallowed
            expiry = self._lease_timer.at(supervisor.next_wakeup(self._state, self._admission, workflow.now()))
            await workflow.wait_condition(
                lambda: (self._wake, self._admission.version) != at_start or (expiry is not None and expiry.done())
            )
            if self._continue_as_new_due():
                await self._snapshots.write(flush=True)  # the next run starts from a stored ledger
                if self._continue_as_new_due():
                    self._lease_timer.cancel()
                    self._details(f"continuing as new with {len(self._state.children.ids('running'))} running children")
                    workflow.continue_as_new(self._input.model_copy(update={"carried": MissionCarry(
                        progress=self._state.progress, written_seq=self._snapshots.written_seq, admission=self._admission.carry(),
                    )}))

    def _continue_as_new_due(self) -> bool:
        """The history is long, and nothing is in flight that the next run could not take over."""
        info = workflow.info()
        return (
            (info.is_continue_as_new_suggested() or info.get_current_history_length() >= self._input.max_history_events)
            and workflow.all_handlers_finished()
            and supervisor.may_hand_over(self._state, self._admission)
        )

    async def _perform(self, actions: list[Action]) -> None:
        """Carry out the supervisor's actions, in order."""
        for action in actions:
            if isinstance(action, Note):
                (workflow.logger.warning if action.warning else workflow.logger.info)("%s", action.text)
            elif isinstance(action, Cancel):
                for workflow_id in action.workloads:
                    workflow.logger.info("cancelling workload %s: %s", workflow_id, action.why)
                # By workflow id, not through the child handle: a long-lived workload has usually
                # continued-as-new, and only a request by id reaches its current run.
                await asyncio.gather(*(cancel_workload(workflow_id) for workflow_id in action.workloads))
                if action.requests:  # never started: out of the queue, so they are never admitted
                    await self._admission.cancel(action.requests)
            elif isinstance(action, Submit):
                await self._admission.submit(action.requests)
            elif isinstance(action, Start):
                # The starts run on in a task of their own when the mission is cancelled meanwhile:
                # a child whose start was already sent runs, so it must be known (and stopped at closing).
                starts = asyncio.ensure_future(self._start_children(action.child_ids))
                try:
                    await asyncio.shield(starts)
                except asyncio.CancelledError:
                    await workflow.wait_condition(starts.done)
                    raise
            elif isinstance(action, Release):
                # Without confirmation and without waiting for the signal's delivery: the admission
                # client records each release as it sends it (undone if no singleton takes it),
                # which wakes the next pass. Closing and continuing as new wait for what is on its way.
                self._admission.release_in_background(action.request_ids)

    # --- children ---------------------------------------------------------------------------

    async def _start_children(self, child_ids: list[str]) -> None:
        handles = await asyncio.gather(*(self._start_child(child_id) for child_id in child_ids))
        for child_id, handle in zip(child_ids, handles):
            asyncio.ensure_future(self._follow_child(child_id, handle))

    async def _start_child(self, child_id: str) -> workflow.ChildWorkflowHandle:
        start = child_start(self._state, child_id, parent_id=workflow.info().workflow_id, mission=self._input)
        return await workflow.start_child_workflow(
            WORKLOAD_WORKFLOW, start.input, id=start.workflow_id,
            cancellation_type=ChildWorkflowCancellationType.WAIT_CANCELLATION_COMPLETED,
            parent_close_policy=ParentClosePolicy.ABANDON if start.outlives_run else ParentClosePolicy.REQUEST_CANCEL,
            static_summary=start.summary, search_attributes=start.search_attributes, result_type=WorkloadResult,
        )

    async def _follow_child(self, child_id: str, handle: workflow.ChildWorkflowHandle) -> None:
        try:
            result: WorkloadResult = await handle
            self._hear(Ended(child_id, workflow.now(), last=result.observation))
        except Exception as error:  # a failed or cancelled child is reported by its observations
            # A workload whose verdict is not success fails its workflow (so the Temporal UI shows
            # it failed); its last observation travels in the failure's details.
            self._hear(Ended(child_id, workflow.now(), *how_it_ended(error)))

    # --- closing ----------------------------------------------------------------------------

    async def _close(self, why: str) -> None:
        """Stop every live child (runtime tasks included), give back admission, final snapshot."""
        self._lease_timer.cancel()
        live = self._state.children.ids("running")
        if live:
            self._details(f"{why}: stopping {len(live)} live children")
            await self._step(Closing(why))
            await self._until_children_ended()
        # Leases of children that are done go back as every pass gives them back, unconfirmed;
        # what is left (requests never started or still queued) waits for the answer. Confirming
        # the ended ones too cost a fan-out a signal each way and one more snapshot.
        await self._step(Closed())
        self._snapshots.closing = True  # from here on, only the final snapshot is written
        # An unconfirmed release is recorded as it is sent: when only such deliveries are left,
        # the final snapshot is written while they travel (one round trip less before the mission
        # ends), and written again only if one found no singleton. Answers still to come (to what
        # had to be confirmed) change the ledger: then it is written once, after them.
        await self._step(Fold())
        early = asyncio.ensure_future(self._snapshots.write(flush=True)) if self._admission.only_deliveries_left() else None
        await self._admission.give_back_everything()
        if early is not None:
            await early
        await self._step(Fold())
        await self._snapshots.write(flush=True)
        self._publish(closing=True)
        mission_closed(workflow.metric_meter(), self._spec.host_group, self._state.ledger.parent_state)

    async def _until_children_ended(self) -> None:
        """Children this run started end with their handle. One an earlier run started ends
        with its last observation, unless its workflow was terminated or failed first: after a
        silence, ask the server, and record the ones that are gone as `unknown` (fail closed)."""
        children = self._state.children
        while True:
            try:
                await workflow.wait_condition(
                    lambda: not children.ids("running"), timeout=SILENCE_BEFORE_ASKING,
                    timeout_summary="stopped children's last word",
                )
                return
            except asyncio.TimeoutError:
                pass
            silent = supervisor.silent_children(self._state)
            if not silent:
                continue
            ids = {self._state.workload_id(child_id): child_id for child_id in silent}
            running = await workflow.execute_local_activity(
                RUNNING_WORKFLOWS, WorkflowIds(ids=list(ids)), result_type=WorkflowIds,
                start_to_close_timeout=timedelta(seconds=30), summary="are the silent children still running",
            )
            self._hear(Gone([child_id for workflow_id, child_id in ids.items() if workflow_id not in running.ids], workflow.now()))

    # --- what operators see -----------------------------------------------------------------

    def _snapshot_summary(self, ledger: MissionLedger) -> str:
        """A snapshot's line on the workflow page's timeline, with where waiting children stand."""
        return f"ledger snapshot {ledger.snapshot_seq} ({ledger.parent_state}{supervisor.queued_text(self._state, self._admission, at_most=2)})"

    def _publish(self, *, closing: bool = False) -> None:
        """Current details always; search attributes when the state changes, and when closing
        (so a closed mission's children counts are exact)."""
        self._details(supervisor.progress_text(self._state, self._admission))
        parent_state = self._state.ledger.parent_state
        awaiting = bool(supervisor.awaiting_answers(self._state))
        if self._input.search_attributes:
            if parent_state != self._shown_state or closing:
                workflow.upsert_search_attributes([*mission_attributes(self._spec, self._state.ledger),
                                                   MISSION_AWAITING_ANSWER.value_set(awaiting)])  # fmt: skip
            elif awaiting != self._shown_awaiting:
                workflow.upsert_search_attributes([MISSION_AWAITING_ANSWER.value_set(awaiting)])
        self._shown_state, self._shown_awaiting = parent_state, awaiting

    def _details(self, text: str) -> None:
        workflow.set_current_details(f"mission {self._spec.mission_id} ({self._spec.goal}): {text}")
