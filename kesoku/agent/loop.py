"""The step loop a turn and a subagent share.

One step: the request, one model call (streamed, turn-logged), the answer and its tool calls kept,
the calls run as a batch, their results kept; again until the model answers without calls. The loop
also holds what any loop needs with an imperfect model:

- a reply cut at its output limit, or flagged malformed by the provider, runs none of its calls:
  each gets a ``truncated`` result saying so, and the loop's later calls get a larger output limit,
  once (:meth:`~kesoku.llm.base.BaseLLM.larger_output_limit`); a cut reply with nothing in it is
  asked again with that larger limit;
- identical calls that keep returning the same are refused
  (:class:`~kesoku.agent.repeat.RepeatGuard`), and a model that makes one again ends the loop
  ``repeating``.

Where things are kept and what surrounds a step differ, and are the hooks of :class:`StepLoop`: a
:class:`~kesoku.agent.turn.Turn` posts to the session's durable log, compacts, checks the window and
runs its batch shielded; a :class:`~kesoku.agent.subagent.Subagent` keeps an in-memory history and
runs inside its parent's batch.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Sequence
from contextlib import aclosing
from typing import TYPE_CHECKING, Generic, TypeVar

import msgspec
import trio

from kesoku.agent.repeat import RepeatGuard
from kesoku.observe.turnlog import TurnLogEntry
from kesoku.vocab.errors import BackendError
from kesoku.vocab.ir import LLMEvent, LLMRequest, LLMResponse, ResponseBuilder, StopReason
from kesoku.vocab.metrics import TurnState
from kesoku.vocab.model import Outcome, Session, Usage
from kesoku.vocab.spend import BudgetExceeded, Meter

if TYPE_CHECKING:
    from kesoku.llm.base import BaseLLM
    from kesoku.observe.turnlog_writer import TurnLogWriter

C = TypeVar("C")
"""How a loop holds one tool call: a stored message (a turn) or an IR block (a subagent)."""


class StepLoop(abc.ABC, Generic[C]):
    """The loop of model calls and tool batches; subclasses say where messages go.

    Args:
        llm: The backend.
        session: The session (its folder receives the turn logs).
        turnlog: The turn-log writer; None: calls are not logged.
        max_identical_calls: ``agent.max_identical_calls`` (0: no repeat guard).
        meter: Checks the spend caps before each model call and keeps its usage in the ledger
            (:mod:`kesoku.observe.spend`); None: calls are not metered.
    """

    log_prefix = ""
    """Put before a failed call's error in its turn log (a subagent's say so)."""

    def __init__(
        self,
        llm: BaseLLM,
        session: Session,
        turnlog: TurnLogWriter | None,
        *,
        max_identical_calls: int,
        meter: Meter | None = None,
    ) -> None:
        self.llm = llm
        self.meter = meter
        self.session = session
        self.turnlog = turnlog
        self.repeats = RepeatGuard(max_identical_calls)
        self.model_calls = 0
        self.output_limit: int | None = None
        """The larger output limit of the loop's calls after a reply was cut at its own."""

    async def run_steps(self) -> TurnState:
        """Run steps until the model answers without tool calls, or a hook ends the loop.

        Returns:
            How the loop ended.
        """
        try:
            if self.meter is not None:  # a capped session makes no call, not even a compaction's
                self.meter.check()
            return await self._steps()
        except BudgetExceeded as exc:
            return await self._end(TurnState.BUDGET, str(exc))

    async def _steps(self) -> TurnState:
        while True:
            prepared = await self._prepare()
            if isinstance(prepared, TurnState):
                return prepared
            request = prepared
            if self.output_limit is not None:
                request = msgspec.structs.replace(request, max_output_tokens=self.output_limit)
            response, error, cancelled = await self._call(request)
            if error is not None:
                ended = await self._failed(error, response)
                if ended is None:
                    continue
                return ended
            self._called(request, response)
            if cancelled:
                return await self._cut_short(response)
            grown = self._grow_output_limit(request, response)
            limit = request.max_output_tokens or self.llm.output_limit
            cut = response.cut_description(limit) if response.cut else None
            if cut is not None and not response.tool_calls and not response.text.strip():
                if grown is not None:
                    continue  # nothing to keep: ask again with the larger limit
                return await self._end(
                    TurnState.FAILED,
                    f"⚠ The model's reply was {cut} before it said anything.",
                    response.usage,
                )
            calls = await self._keep(response)
            if not calls:
                return await self._answered(response, cut)
            if cut is not None:  # the calls may be incomplete: none runs, and the model is told why
                await self._refuse_cut(response, calls, truncated_result(response, limit, grown))
                if self.repeats.stuck is not None:
                    return await self._repeating(self.repeats.stuck)
                continue
            await self._run_batch(calls)
            if self.repeats.stuck is not None:
                return await self._repeating(self.repeats.stuck)

    async def _call(self, request: LLMRequest) -> tuple[LLMResponse, BackendError | None, bool]:
        """One model call, its events handed to :meth:`_on_event`.

        The result is (response so far, error, cut short). The call runs in a cancel scope handed to
        :meth:`_streaming`, so a subclass can cut it (an interruption); what streamed before the cut
        is the response.
        """
        builder = ResponseBuilder()
        error: BackendError | None = None
        started_at, t0 = time.time(), trio.current_time()
        with trio.CancelScope() as scope:
            self._streaming(scope)
            try:
                async with aclosing(self.llm.stream(request, meter=self.meter)) as events:
                    async for event in events:
                        builder.add(event)
                        self._on_event(event)
            except BackendError as exc:
                error = exc
            finally:  # a reached cap (BudgetExceeded) passes through to run_steps
                self._streaming(None)
        self.model_calls += 1
        response = builder.build()
        self._on_response(response)
        if self.turnlog is not None:
            entry = TurnLogEntry(
                folder=self.session.workspace,
                session_id=self.session.id,
                provider=self.llm.provider,
                model=self.llm.model,
                started_at=started_at,
                duration_s=trio.current_time() - t0,
                request=request,
                response=response,
                error=None if error is None else f"{self.log_prefix}{error}",
            )
            await self.turnlog.submit(entry)
        return response, error, scope.cancelled_caught

    async def _refuse_cut(self, response: LLMResponse, calls: Sequence[C], note: str) -> None:
        """Answer a cut reply's calls with ``note``, none run; the repeat guard counts them as runs.

        A model whose every reply is cut with the same call (a server that always answers at its
        limit) would otherwise go on to the step limit: the same call cut again and again is refused
        as a repeat, and made once more it ends the loop.
        """
        made = [(c.name, c.arguments) for c in response.tool_calls]
        refusals = self.repeats.refusals(made)
        for name, arguments in made:
            self.repeats.record(name, arguments, note, Outcome.TRUNCATED)
        notes = [note if refusal is None else f"{note} {refusal}" for refusal in refusals]
        await self._refuse(calls, notes)

    def _grow_output_limit(self, request: LLMRequest, response: LLMResponse) -> int | None:
        """The loop's larger output limit for later calls, set by its first reply cut at its limit.

        Once per loop, where the backend can raise it; returns the new limit when this reply set it.
        """
        if response.stop_reason is not StopReason.MAX_TOKENS or self.output_limit is not None:
            return None
        self.output_limit = self.llm.larger_output_limit(request)
        return self.output_limit

    # -- hooks ------------------------------------------------------------------------------------

    @abc.abstractmethod
    async def _prepare(self) -> LLMRequest | TurnState:
        """The next step's request, or how the loop ends before it (a cut, the step limit)."""

    @abc.abstractmethod
    async def _failed(self, error: BackendError, response: LLMResponse) -> TurnState | None:
        """A model call failed after the backend's retries: how the loop ends (None: try again)."""

    def _called(self, request: LLMRequest, response: LLMResponse) -> None:
        """A call succeeded (the turn calibrates its size estimate)."""

    async def _cut_short(self, response: LLMResponse) -> TurnState:
        """The call's scope was cancelled (an interruption, a stop).

        Keep what streamed; returns how it ends.
        """
        raise AssertionError("this loop never cancels its stream scope")

    @abc.abstractmethod
    async def _keep(self, response: LLMResponse) -> Sequence[C]:
        """Keep the reply (thoughts, text, calls); returns its tool calls as kept."""

    @abc.abstractmethod
    async def _answered(self, response: LLMResponse, cut: str | None) -> TurnState:
        """The model answered without tool calls (``cut``: how the answer was cut, if it was)."""

    @abc.abstractmethod
    async def _refuse(self, calls: Sequence[C], notes: Sequence[str]) -> None:
        """Keep a ``truncated`` result for each call of a cut reply, none run.

        Each result is its call's note, in order.
        """

    @abc.abstractmethod
    async def _run_batch(self, calls: Sequence[C]) -> None:
        """Run the step's calls (the repeat guard's refusals aside) and keep their results."""

    @abc.abstractmethod
    async def _repeating(self, name: str) -> TurnState:
        """The model made a call again after it was told the call repeats: end the loop."""

    @abc.abstractmethod
    async def _end(self, state: TurnState, notice: str, usage: Usage | None = None) -> TurnState:
        """End the loop as ``state`` with a one-line ``notice``.

        The notice carries a failed call's ``usage``.
        """

    def _streaming(self, scope: trio.CancelScope | None) -> None:
        """The scope of the call in progress (None: the call ended); a turn cuts it to interrupt."""

    def _on_event(self, event: LLMEvent) -> None:
        """One streamed event (a turn publishes it to the adapters)."""

    def _on_response(self, response: LLMResponse) -> None:
        """The call's response, before it is logged (a turn counts its tokens)."""


def truncated_result(response: LLMResponse, limit: int | None, grown: int | None = None) -> str:
    """The result of a call that was not run because the reply that made it was cut (or malformed).

    Args:
        response: The cut reply.
        limit: The output limit its request had (None: unknown).
        grown: The larger limit the next call gets, if any.
    """
    if response.stop_reason is StopReason.MALFORMED:
        advice = "make the call again with arguments that match the tool's parameters"
    elif grown is not None:
        advice = f"make it again: your next reply may use up to {grown} tokens"
    else:
        advice = "make it again, shorter (write a large file in parts)"
    what = response.cut_description(limit)
    return f"[truncated] Not run: your reply was {what}, so this call may be incomplete; {advice}."
