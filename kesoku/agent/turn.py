"""One turn: build the context, stream the model, run each step's tool calls as a batch, repeat.

Where it runs: ARCHITECTURE.md, "Task tree".

Interruption and stop act through two scopes the turn exposes to its worker:

- the *stream scope* wraps one model call. An interruption (a new user message) or a stop cancels
  it: the partial answer is kept as an ``interrupted`` message and the turn ends.
- the *batch scope* wraps one step's tool calls and the post of their results. It is shielded, so
  an interruption or a first stop never cuts a running tool: it finishes (or hits its own
  ``timeout_s``) and its result is posted; calls that had not started get ``skipped`` results. A
  second stop (or ``force``) cancels it: running tools are cancelled and their results say
  ``killed`` and why (a second stop, the user), posted in a shielded scope of their own. A
  shutdown whose grace ran out kills them the same way (:meth:`Turn.kill_tools`) without stopping
  the turn: it stays ``processing`` and resumes after the restart, its results saying so.

Every tool call of a step is posted before the batch runs and every result is posted together after
it, so parallel calls and their results stay grouped (the Gemini rule) and a crash leaves calls the
next turn can answer with ``lost``.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import trio

from kesoku.agent.compaction.compactor import Compactor
from kesoku.agent.guard import SessionGuard
from kesoku.agent.history import SessionHistory
from kesoku.agent.loop import StepLoop
from kesoku.agent.prompt import build_system_prompt, read_notes
from kesoku.tools.base import Tool, ToolContext
from kesoku.tools.execute import run_tool
from kesoku.vocab.errors import BackendError
from kesoku.vocab.events import Compacted, ModelDelta, ToolFinished, ToolStarted
from kesoku.vocab.ir import LLMEvent, LLMRequest, LLMResponse, LLMTurn, ToolCallBlock, ToolSpec
from kesoku.vocab.metrics import TurnMetrics, TurnState
from kesoku.vocab.model import (
    Kind,
    Message,
    Metadata,
    Outcome,
    Role,
    Session,
    Status,
    Usage,
    in_turn,
)
from kesoku.vocab.spend import SpendKind
from kesoku.vocab.transcript import LOST_RESULT, call_id_of

if TYPE_CHECKING:
    from kesoku.agent.runtime import Runtime
    from kesoku.llm.base import BaseLLM

log = logging.getLogger(__name__)

BATCH_BOUND_S = 6 * 3600.0
"""Outer bound of a shielded tool batch, for a tool that ignores its own timeout."""

COMPACTION_RETRY_GROWTH = 0.1
"""After an auto compaction found nothing old enough to compact, the turn tries again once its
estimate has grown by this fraction of the compaction limit (the whole history is planned on each
try)."""

_ROOT_STATUS = {
    TurnState.DONE: Status.DONE,
    TurnState.STEP_LIMIT: Status.DONE,
    TurnState.INTERRUPTED: Status.INTERRUPTED,
    TurnState.STOPPED: Status.INTERRUPTED,
    TurnState.FAILED: Status.FAILED,
    TurnState.REPEATING: Status.DONE,
    TurnState.BUDGET: Status.DONE,
}
_SKIPPED = "[skipped] Not run: the turn was interrupted or stopped before this call started."


class Turn(StepLoop[Message]):
    """One turn of a session, opened on the newest of its pending user messages.

    Args:
        rt: The runtime (gateway, tools, settings).
        session: The session.
        roots: The user messages this turn answers, oldest first; the newest is the turn's root, so
            the turn's messages sort after all of them.
        llm: The backend for this session.
        history: The worker's cached history of the session (a fresh one is read when None).
        session_turns: User messages of the session processed before this turn.
        guard: The session's taint sources and questions (the worker's; a fresh one when None).
        compactor: The session's compactor (the worker's; a fresh one when None).
    """

    def __init__(
        self,
        rt: Runtime,
        session: Session,
        roots: Sequence[Message],
        llm: BaseLLM,
        *,
        history: SessionHistory | None = None,
        session_turns: int = 0,
        guard: SessionGuard | None = None,
        compactor: Compactor | None = None,
    ) -> None:
        super().__init__(
            llm,
            session,
            rt.turnlog,
            max_identical_calls=rt.max_identical_calls,
            meter=rt.budget.meter(session),
        )
        self.rt = rt
        self.compactor = compactor if compactor is not None else Compactor(rt.store, rt.compaction)
        self.guard = (
            guard if guard is not None else SessionGuard(rt.store, rt.questions, session.id)
        )
        self.history = history if history is not None else SessionHistory(rt.gateway, session.id)
        self.session_turns = session_turns
        self.roots = list(roots)
        self.root = self.roots[-1]
        self.interrupted = False
        self.stops = 0
        self.kill_reason: str | None = None
        """Why running tools were killed (their results say it); None: they were not."""
        self.tool_calls = 0
        self.tokens = 0
        self.context_tokens = 0
        self._stream_scope: trio.CancelScope | None = None
        self._batch_scope: trio.CancelScope | None = None
        self._last_ts = 0.0
        self._tools: dict[str, Tool] = {}
        """The tools of the current step, by name."""
        self._tool_set: tuple[Tool, ...] | None = None
        """The tools :attr:`_tools`, :attr:`_specs` and :attr:`_fixed` were worked out for."""
        self._specs: list[ToolSpec] = []
        self._cwd = rt.cwd(session)  # fixed for the turn: the session's and the runtime's settings
        self._overflow_retried = False
        self._system = ""
        self._fixed = 0.0
        """The estimated tokens of the system prompt and tools of the step in progress."""
        # Estimated tokens below which auto compaction is not tried again: after an attempt that
        # found nothing old enough, re-planning over the whole history on every step would be in
        # vain.
        self._compaction_retry_at = 0.0

    # -- control, called by the worker ------------------------------------------------------------

    @property
    def cut(self) -> bool:
        """True once an interruption or a stop asked the turn to end."""
        return self.interrupted or self.stops > 0

    def interrupt(self) -> None:
        """A new user message arrived: cut the model stream; let running tools finish.

        Open questions of the session are denied: the user moved on instead of answering.
        """
        self.interrupted = True
        if self._stream_scope is not None:
            self._stream_scope.cancel()
        self.rt.questions.dismiss(
            self.session.id, "the user sent a new message instead of answering"
        )

    def stop(self, *, force: bool = False) -> None:
        """Stop the turn without pivoting; the second stop (or ``force``) kills running tools."""
        self.stops += 2 if force else 1
        if self._stream_scope is not None:
            self._stream_scope.cancel()
        self.rt.questions.dismiss(self.session.id, "the turn was stopped")
        if self.stops >= 2 and self.kill_reason is None:
            second = "the user stopped the turn a second time"
            self.kill_reason = "the user stopped the turn and killed its tools" if force else second
        if self.stops >= 2 and self._batch_scope is not None:
            self._batch_scope.cancel()

    def kill_tools(self, reason: str) -> None:
        """Kill the running tools without stopping the turn (a shutdown whose grace ran out).

        Args:
            reason: Why, for their results (``Kesoku shut down: agent.shutdown_grace_s ran out``).

        The turn is not stopped: the shutdown that cancels it leaves it ``processing``, so it
        resumes at the next start and the model sees why its tools were cut.
        """
        if self.kill_reason is None:
            self.kill_reason = reason
        if self._batch_scope is not None:
            self._batch_scope.cancel()

    # -- the loop ---------------------------------------------------------------------------------

    async def run(self) -> TurnMetrics:
        """Run the turn to its end and set its roots' status.

        Returns:
            The turn's metrics.

        Raises:
            Exception: A bug; the worker marks the turn failed and tells the user.

        Cancellation:
            Cancelling the caller (daemon shutdown) leaves the roots ``processing`` so the turn
            resumes at the next start; a running tool batch still finishes and posts its results.
        """
        started = trio.current_time()
        store = self.rt.store
        store.set_status(
            (r.id for r in self.roots if r.status is not Status.PROCESSING), Status.PROCESSING
        )
        for root in self.roots:
            for attachment in root.metadata.attachments:
                self.guard.add_taint("attachment", attachment.filename)
        self.guard.flush()
        self.guard.root = self.root
        try:
            state = await self._loop()
        finally:
            self.guard.root = None
        store.set_status((r.id for r in self.roots), _ROOT_STATUS[state])
        return TurnMetrics(
            session_id=self.session.id,
            root_id=self.root.id,
            state=state,
            session_turns=self.session_turns + len(self.roots),
            context_tokens=self.context_tokens,
            tool_calls=self.tool_calls,
            turn_tokens=self.tokens,
            model_calls=self.model_calls,
            turn_s=trio.current_time() - started,
            spend=self.rt.budget.summary(self.session),
        )

    async def _loop(self) -> TurnState:
        await self._heal()
        # a model no table knows: ask its server, once
        await self.rt.compaction.learn_window(self.llm)
        self._system = self._system_prompt()
        return await self.run_steps()

    # -- the step loop's hooks (kesoku.agent.loop) ------------------------------------------------

    async def _prepare(self) -> LLMRequest | TurnState:
        # A shutdown cancels the turn between steps as well: it must stay `processing` (resumed
        # after the restart), not end below as if the last batch's killed tools had stopped it.
        await trio.lowlevel.checkpoint_if_cancelled()
        if self.cut:
            return self._cut_state()
        if self.model_calls >= self.rt.max_steps_per_turn:
            limit = self.rt.max_steps_per_turn
            await self._post_system(
                f"Stopped after {limit} model calls in one turn "
                f"(agent.max_steps_per_turn = {limit}). "
                "Send a message to let it continue."
            )
            return TurnState.STEP_LIMIT
        tools = self.rt.current_tools()  # MCP tools come and go between steps
        if tools != self._tool_set:  # the same tools (compared by identity first): as they were
            self._tool_set = tools
            self._tools = {t.name: t for t in tools}
            self._specs = [t.spec for t in tools]
            self._fixed = self.llm.head_tokens(self._system, self._specs)
        turns = self._turns()
        specs, fixed = self._specs, self._fixed
        estimate = self.compactor.estimate(turns, fixed)
        if self._over_limit(estimate) and await self._compact("auto", fixed):
            self._compaction_retry_at = 0.0
            turns = self._turns()
            estimate = self.compactor.estimate(turns, fixed)
        refusal = self._refusal(estimate)
        if refusal is not None:  # sending it would only earn a refusal, or a silently cut prompt
            await self._post_system(refusal)
            return TurnState.FAILED
        return await self.llm.request_from_turns(
            turns, system=self._system, tools=specs, checker=self.history.checker
        )

    async def _failed(self, error: BackendError, response: LLMResponse) -> TurnState | None:
        if error.context_overflow and not self._overflow_retried:
            self._overflow_retried = True  # compact, then retry once
            if await self._compact("context overflow", self._fixed, force=True):
                return None
        # The notice is the failed call's only message: it carries whatever usage was streamed.
        return await self._end(
            TurnState.FAILED, f"⚠ The model call failed: {error}", response.usage
        )

    def _called(self, request: LLMRequest, response: LLMResponse) -> None:
        if response.usage.input_tokens:
            self.compactor.learn(response.usage.input_tokens)

    async def _cut_short(self, response: LLMResponse) -> TurnState:
        await self._post_partial(response)
        return self._cut_state()

    async def _keep(self, response: LLMResponse) -> list[Message]:
        calls = [self._call_message(c) for c in response.tool_calls]
        answer = self._answer_messages(response, Status.DONE)
        posted = await self._post(_with_step_usage([*answer, *calls], response.usage))
        return posted[len(answer) :]

    async def _answered(self, response: LLMResponse, cut: str | None) -> TurnState:
        if cut is not None:
            await self._post_system(f"⚠ The answer was {cut}.")
        return TurnState.DONE

    async def _refuse(self, calls: Sequence[Message], notes: Sequence[str]) -> None:
        results = [
            self._result(c, note, Outcome.TRUNCATED) for c, note in zip(calls, notes, strict=True)
        ]
        for result in await self._post(results):
            self.rt.hub.publish(ToolFinished(self.session.id, result))

    async def _repeating(self, name: str) -> TurnState:
        return await self._end(
            TurnState.REPEATING,
            f"Stopped: the model kept calling {name} with the same arguments after being told "
            "it repeats (agent.max_identical_calls). Send a message to let it continue.",
        )

    async def _end(self, state: TurnState, notice: str, usage: Usage | None = None) -> TurnState:
        await self._post_system(notice, usage)
        return state

    def _streaming(self, scope: trio.CancelScope | None) -> None:
        self._stream_scope = scope
        if scope is not None and self.cut:
            scope.cancel()

    def _on_event(self, event: LLMEvent) -> None:
        self.rt.hub.publish(ModelDelta(self.session.id, event))

    def _on_response(self, response: LLMResponse) -> None:
        self._account(response.usage)

    def _cut_state(self) -> TurnState:
        return TurnState.STOPPED if self.stops else TurnState.INTERRUPTED

    def _account(self, usage: Usage) -> None:
        self.tokens += usage.total_tokens
        if usage.input_tokens:
            self.context_tokens = usage.input_tokens

    # -- tools ------------------------------------------------------------------------------------

    async def _run_batch(self, calls: Sequence[Message]) -> None:
        results: dict[int, Message] = {}
        # Identical calls that keep returning the same are answered without running.
        step = [(c.metadata.tool_name or "", c.metadata.tool_arguments or {}) for c in calls]
        for call, refusal in zip(calls, self.repeats.refusals(step), strict=True):
            if refusal is not None:
                results[call.id] = self._result(call, refusal, Outcome.REPEATED)
        calls_to_run = [c for c in calls if c.id not in results]
        # Shielded: an interruption or a first stop never cuts a running tool (ARCHITECTURE.md);
        # each call has its own timeout_s, and BATCH_BOUND_S bounds a tool that ignores it. Only a
        # forced stop cancels this scope: the tools are cancelled and report `killed`. One scope
        # for the tools and the post of their results (a scope costs about 1% of a round trip):
        # once cancelled it cannot post, so the results of killed tools are posted below.
        with trio.CancelScope(shield=True, deadline=trio.current_time() + BATCH_BOUND_S) as batch:
            self._batch_scope = batch
            if self.kill_reason is not None:
                batch.cancel()
            # the usual step: no nursery and task for one call
            if not self.cut and len(calls_to_run) == 1:
                await self._run_call(calls_to_run[0], results)
            elif not self.cut and calls_to_run:
                async with trio.open_nursery() as nursery:
                    for call in calls_to_run:
                        nursery.start_soon(self._run_call, call, results)
            self._batch_scope = None  # from here on nothing cancels the scope but its deadline
            posted = await self._post_results(calls, results)
        self._batch_scope = None
        # Killed, or past the bound: a post the cancellation reached wrote nothing (all or nothing).
        if batch.cancelled_caught:
            # Still shielded: the effects happened, so their results must be written even at
            # shutdown.
            with trio.CancelScope(shield=True):
                posted = await self._post_results(calls, results)
        for result in posted:
            self.rt.hub.publish(ToolFinished(self.session.id, result))

    async def _post_results(
        self, calls: Sequence[Message], results: Mapping[int, Message]
    ) -> list[Message]:
        """Post the batch's results in call order; calls that did not run get ``skipped``."""
        messages = [results.get(c.id) or self._result(c, _SKIPPED, Outcome.SKIPPED) for c in calls]
        self.guard.flush()
        return await self._post(messages)

    async def _run_call(self, call: Message, results: dict[int, Message]) -> None:
        name = call.metadata.tool_name or ""
        self.tool_calls += 1
        self.rt.hub.publish(ToolStarted(self.session.id, call))
        arguments: Mapping[str, object] = call.metadata.tool_arguments or {}
        cap = self.rt.compaction.result_cap(self.llm, self.compactor.calibration.ratio)
        ctx = ToolContext(
            self.session,
            self._cwd,
            call_id_of(call),
            self.guard,
            max_output_bytes=cap,
        )
        try:
            content, outcome = await run_tool(
                self._tools.get(name), name, arguments, ctx, known=self._tools
            )
        except BaseException:  # only cancellations get here (run_tool types every other failure)
            results[call.id] = self._cancelled_result(call, name)
            raise
        self.repeats.record(name, arguments, content, outcome)
        results[call.id] = self._result(call, content, outcome)

    def _cancelled_result(self, call: Message, name: str) -> Message:
        if self.kill_reason is not None:
            return self._result(
                call, f"[killed] {name} was killed: {self.kill_reason}.", Outcome.KILLED
            )
        bound = f"{BATCH_BOUND_S / 3600:g} h"
        return self._result(
            call, f"[timed_out] {name} exceeded the batch bound ({bound}).", Outcome.TIMED_OUT
        )

    def _result(self, call: Message, content: str, outcome: Outcome) -> Message:
        name = call.metadata.tool_name or "tool"
        meta = Metadata(tool_name=name, call_id=call.metadata.call_id, outcome=outcome)
        return in_turn(
            self.root, Role.TOOL, Kind.TOOL_RESULT, content, parent_id=call.id, metadata=meta
        )

    # -- posting ----------------------------------------------------------------------------------

    def _call_message(self, call: ToolCallBlock) -> Message:
        meta = Metadata(
            tool_name=call.name,
            tool_arguments=call.arguments,
            call_id=call.id,
            thought_signature=call.signature,
            signed_by=call.signed_by,
        )
        return in_turn(
            self.root,
            Role.ASSISTANT,
            Kind.TOOL_CALL,
            _call_summary(call.name, call.arguments),
            metadata=meta,
        )

    def _answer_messages(self, response: LLMResponse, status: Status) -> list[Message]:
        out: list[Message] = []
        # One thought message per signed block: each block goes back to the provider with its own
        # signature.
        for block in response.thought_blocks:
            meta = Metadata(thought_signature=block.signature, signed_by=block.signed_by)
            out.append(
                in_turn(
                    self.root,
                    Role.ASSISTANT,
                    Kind.THOUGHT,
                    block.text,
                    status=status,
                    metadata=meta,
                )
            )
        if response.text.strip():
            out.append(in_turn(self.root, Role.ASSISTANT, Kind.TEXT, response.text, status=status))
        return out

    async def _post_partial(self, response: LLMResponse) -> None:
        """Keep what the model streamed before the cut.

        Its unfinished tool calls are dropped unrun.
        """
        await self._post(
            _with_step_usage(self._answer_messages(response, Status.INTERRUPTED), response.usage)
        )

    async def _post_system(self, text: str, usage: Usage | None = None) -> None:
        notice = in_turn(self.root, Role.SYSTEM, Kind.TEXT, text)
        await self._post(_with_step_usage([notice], usage or Usage()))

    async def _post(self, messages: list[Message]) -> list[Message]:
        if not messages:
            return []
        # One timestamp per post, never behind the previous one: history sorts by (root_ts, ts, id),
        # so the messages of a post stay in posting order even if the wall clock steps back.
        ts = self._last_ts = max(time.time(), self._last_ts + 1e-6)
        return await self.rt.gateway.post_many(
            [msgspec.structs.replace(m, ts=ts) for m in messages]
        )

    # -- context ----------------------------------------------------------------------------------

    def _turns(self) -> list[LLMTurn]:
        """The request turns.

        The cached history, caught up with what was written since the last call.
        """
        self.history.sync()
        return self.history.turns(self.root)

    async def _heal(self) -> None:
        """Answer tool calls left without a result with ``lost``, before anything else.

        Such calls are left by a crash or a failed worker.
        """
        self.history.sync()
        orphans = self.history.unanswered()
        if not orphans:
            return
        results = []
        for call in orphans:
            name = call.metadata.tool_name or "tool"
            meta = Metadata(tool_name=name, call_id=call.metadata.call_id, outcome=Outcome.LOST)
            results.append(
                in_turn(
                    call, Role.TOOL, Kind.TOOL_RESULT, LOST_RESULT, parent_id=call.id, metadata=meta
                )
            )
        log.warning(
            "session %s: %d tool call(s) without results marked lost", self.session.id, len(results)
        )
        await self.rt.gateway.post_many(results)

    def _over_limit(self, estimate: int) -> bool:
        """Whether a request of ``estimate`` tokens (calibrated) should be compacted first."""
        policy = self.rt.compaction
        if not policy.enabled:
            return False
        limit = policy.limit(self.llm)
        if estimate <= limit or (
            estimate < self._compaction_retry_at and estimate <= policy.window(self.llm)
        ):
            return False
        # Should this attempt find nothing old enough, the next is worth it only once the turn has
        # grown.
        self._compaction_retry_at = estimate + limit * COMPACTION_RETRY_GROWTH
        return True

    def _refusal(self, estimate: int) -> str | None:
        """The one-line notice for a request the estimate puts over the window.

        None when it fits.
        """
        window = self.rt.compaction.window(self.llm)
        if estimate <= window:
            return None
        why = (
            "compaction could not make it smaller"
            if self.rt.compaction.enabled
            else "compaction is off"
        )
        # The local model's window is the n_ctx it is loaded with: a larger one is set there.
        key = "[local] n_ctx" if self.llm.provider == "local" else "[compaction.context_windows]"
        return (
            f"⚠ Not sent: the request would be about {estimate:,} tokens, "
            f"over the model's context window of {window:,} ({why}). "
            f"Start a new session, or if the model's window is larger, set it under {key}."
        )

    async def _compact(self, reason: str, fixed: float, *, force: bool = False) -> bool:
        """Compact the session's view before the next request; True when a new view is in force."""
        self.history.sync()
        # every message this turn answers stays verbatim
        active_ts = min(r.root_ts for r in self.roots)
        view = await self.compactor.compact(
            self.history.up_to(self.root),
            active_ts,
            self.llm,
            current=self.history.view,
            fixed_tokens=fixed,
            reason=reason,
            force=force,
            meter=self.rt.budget.meter(self.session, SpendKind.COMPACTION),
        )
        if view is not None:
            self.history.set_view(view)
        self.rt.hub.publish(Compacted(self.session.id, view, reason))
        return view is not None

    def _system_prompt(self) -> str:
        return system_prompt(self.rt, self.session)


def system_prompt(rt: Runtime, session: Session) -> str:
    """The system prompt of a session's next request (tools, skills and notes as they are now).

    An adapter may add a section of its own: a string in ``session.metadata["context"]`` (the
    Discord adapter's server, channel and members) is appended as it is. Secrets in it (an AGENTS.md
    may hold a database URL) are masked (:meth:`Runtime.mask`), so neither the provider nor the turn
    log gets them.
    """
    cwd = rt.cwd(session)
    prompt = build_system_prompt(
        persona=rt.persona,
        tools=rt.current_tools(),
        skills=rt.skills(),
        notes=read_notes(cwd),
        cwd=cwd,
        now=dt.datetime.now().astimezone(),
    )
    context = session.metadata.get("context")
    if isinstance(context, str) and context.strip():
        prompt = f"{prompt}\n\n{context.strip()}"
    return rt.mask(prompt)


def _with_step_usage(messages: list[Message], usage: Usage) -> list[Message]:
    """The messages of one model call, its usage on the first (whatever its kind).

    Readers sum ``metadata.usage`` over messages (:func:`kesoku.observe.usage.session_tokens`), so
    a call's usage goes on exactly one of its messages; on the first because a step may post only
    tool calls. A call that reported nothing, or posts nothing (a cut before any output), stores
    none.
    """
    if messages and usage.total_tokens:
        first = messages[0]
        messages[0] = msgspec.structs.replace(
            first, metadata=msgspec.structs.replace(first.metadata, usage=usage)
        )
    return messages


def _call_summary(name: str, arguments: Mapping[str, object]) -> str:
    """The human-readable content of a tool_call message: ``name(key=value, …)``.

    Cut at 200 characters.
    """
    args = ", ".join(f"{k}={v!r}" for k, v in arguments.items())
    text = f"{name}({args})"
    return text if len(text) <= 200 else text[:199] + "…"


def session_cwd(session: Session, project_dir: Path | None) -> Path:
    """The working directory of a session's tools.

    ``agent.project_dir`` if set, else the session's workspace.
    """
    return project_dir if project_dir is not None else Path(session.workspace)
