"""The backend template: history → turns → native input → call → parse, with retries.

A backend subclasses :class:`BaseLLM` and implements three steps:

- ``_build_native_input(request)``: the IR request as the provider's request body or SDK arguments;
- ``_call(native)``: an async iterator of the provider's raw stream items (chunks, SSE events);
- ``_parse(raw)``: the :data:`LLMEvent` values in one raw item.

The base owns everything around them: building the request from history (with the transcript repair
and check), loading attachments off the event loop, retries of retryable failures with jittered
backoff honouring ``retry-after``, a stall timeout between stream items, and error mapping through
``_map_error``. Provider SDKs must have their own retries off (``max_retries=0``) so a failure is
not retried twice over (anthropic and openai retry 408, 409, 429 and 5xx themselves by default).
"""

from __future__ import annotations

import email.utils
import random
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import trio

from kesoku.vocab.errors import BackendError
from kesoku.vocab.ir import (
    DocumentBlock,
    ImageBlock,
    LLMEvent,
    LLMRequest,
    LLMResponse,
    LLMTurn,
    ResponseBuilder,
    StopEvent,
    ToolSpec,
    UsageEvent,
    head_tokens,
    own_signatures,
    signed,
    valid_event,
)
from kesoku.vocab.model import Message, Usage
from kesoku.vocab.spend import Meter
from kesoku.vocab.transcript import TranscriptError, TurnChecker, TurnMemo, to_turns

MAX_RETRIES = 4
"""Retries of a retryable failure before the error reaches the turn (``agent.max_retries``)."""
BACKOFF_BASE_S = 1.0
"""First backoff delay; it doubles per attempt, with full jitter."""
BACKOFF_CAP_S = 30.0
"""Default longest backoff delay (``agent.retry_cap_s``); a longer ``retry-after`` is honoured up to
:data:`RETRY_AFTER_CAP_S`."""
RETRY_AFTER_CAP_S = 120.0
"""Longest wait for a provider's ``retry-after``; beyond it the call fails instead."""
STALL_TIMEOUT_S = 120.0
"""Longest silence between two stream items before the call counts as dropped (retryable)."""


class BaseLLM(ABC):
    """A model backend.

    Args:
        model: The provider's model id.
        max_retries: Retries of a retryable failure (rate limit, overload, 5xx, dropped connection).
        stall_timeout_s: Longest wait for the next stream item.
        backoff_cap_s: Longest backoff delay between retries (``agent.retry_cap_s``).

    Attributes:
        provider: The backend name (``gemini``, ``claude``, ``openai``, ``local``, ``scripted``).
        calls: Model calls attempted (retries included).
        output_limit: The ``max_tokens`` the backend sends when a request names none; None: it sends
            none, so the server's own limit applies and Kesoku cannot raise it.
        max_output_limit: The largest ``max_tokens`` :meth:`larger_output_limit` may ask for.
    """

    provider: ClassVar[str] = "base"
    output_limit: int | None = None
    max_output_limit: int | None = None

    def __init__(
        self,
        model: str,
        *,
        max_retries: int = MAX_RETRIES,
        stall_timeout_s: float = STALL_TIMEOUT_S,
        backoff_cap_s: float = BACKOFF_CAP_S,
    ) -> None:
        self.model = model
        self.max_retries = max_retries
        self.stall_timeout_s = stall_timeout_s
        self.backoff_cap_s = backoff_cap_s
        self.calls = 0
        self.reported_window: int | None = None
        """The context window the server reported (:meth:`context_window`), once asked."""
        self._window_asked = False
        self._window_lock = trio.Lock()
        # the last request's turns without foreign signatures (see _own_signatures)
        self._signatures: TurnMemo[tuple[LLMTurn, int]] = TurnMemo()

    async def context_window(self) -> int | None:
        """The model's context window as its server reports it, in tokens; asked once per backend.

        Returns:
            Tokens, or None when the server does not say (or cannot be asked). Failures are cached
            too: a server that did not answer is not asked again by every turn.
        """
        # once known, no checkpoint: a turn's start keeps its interleaving
        if not self._window_asked:
            async with self._window_lock:
                if not self._window_asked:
                    self.reported_window = await self._discover_window()
                    self._window_asked = True
        return self.reported_window

    async def _discover_window(self) -> int | None:
        """Ask the server for the model's window; backends that can override it (never raises)."""
        await trio.lowlevel.checkpoint()
        return None

    def sent_head(self, system: str, tools: Sequence[ToolSpec]) -> tuple[str, tuple[ToolSpec, ...]]:
        """The system prompt and the tools this backend really sends for a request offering these.

        The default is the request's own. A backend that sends something else says so here (the
        local model: a short prompt of its own, and no tools unless ``[local] tools``). Requests
        offer only the tools it returns (:meth:`request_from_turns`), and ``/context`` shows both.

        Args:
            system: The system prompt the caller built (Kesoku's).
            tools: The tools the caller would offer.

        Returns:
            ``(system prompt, tools)``.
        """
        return system, tuple(tools)

    def head_tokens(self, system: str, tools: Sequence[ToolSpec]) -> float:
        """Estimated tokens (uncalibrated) of the system prompt and tool schemas this backend sends.

        What compaction and the never-over-the-window check add to the turns: by default the
        estimate of what :meth:`sent_head` returns; a backend whose tools cost no prompt tokens (the
        local model turns them into a grammar) says so here.
        """
        return head_tokens(*self.sent_head(system, tools))

    # -- the template ----------------------------------------------------------------------------

    def history_to_turns(self, history: Sequence[Message]) -> list[LLMTurn]:
        """Translate stored messages to IR turns (repaired to satisfy the transcript invariant)."""
        return to_turns(history)

    async def build_request(
        self, history: Sequence[Message], *, system: str, tools: Sequence[ToolSpec] = ()
    ) -> LLMRequest:
        """Build a model call's request from stored history (see :meth:`request_from_turns`)."""
        return await self.request_from_turns(
            self.history_to_turns(history), system=system, tools=tools
        )

    async def request_from_turns(
        self,
        turns: Sequence[LLMTurn],
        *,
        system: str,
        tools: Sequence[ToolSpec] = (),
        checker: TurnChecker | None = None,
    ) -> LLMRequest:
        """Build a request from IR turns, checking the transcript invariant.

        Attachments are read in a worker thread so a large file never blocks the event loop.

        Args:
            turns: The request turns.
            system: The system prompt.
            tools: The tools to offer; the request holds those the backend takes
                (:meth:`sent_head`).
            checker: A session's checker, which re-checks only the turns that changed since its
                last request (the result is the same as a full check).

        Raises:
            TranscriptError: The turns break the invariant (a bug in Kesoku).
            OSError: An attachment cannot be read.
        """
        checker = checker if checker is not None else TurnChecker()
        problems = checker.check(turns)
        if problems:
            raise TranscriptError("; ".join(problems))
        if checker.attachments:
            turns = await trio.to_thread.run_sync(_load_attachments, list(turns))
        return LLMRequest(system=system, turns=tuple(turns), tools=self.sent_head(system, tools)[1])

    async def stream(
        self, request: LLMRequest, *, meter: Meter | None = None
    ) -> AsyncGenerator[LLMEvent, None]:
        """Stream one model step.

        Args:
            request: From :meth:`build_request` or :meth:`request_from_turns`.
            meter: Asked before each attempt (retries included) and told each attempt's usage
                (:mod:`kesoku.vocab.spend`); None: the call is not metered.

        Yields:
            Text and thought deltas, complete tool calls, usage; their text valid UTF-8
            (:func:`~kesoku.vocab.ir.valid_event`), whatever the provider sent.

        Raises:
            BackendError: The call failed and was not retried (not retryable, the retries ran out,
                or the stream had already yielded events: a retry would repeat them). A stream that
                ended with no content and no stop reason (llama.cpp answers a prompt over its
                ``n_ctx`` with HTTP 200 and an empty body) is a failure, retried like a dropped
                stream.
            BudgetExceeded: The meter refused an attempt: a spend cap is reached; nothing was sent.

        Cancellation:
            Cancelling the consumer closes the provider stream; use ``contextlib.aclosing``.
        """
        native = self._build_native_input(self._own_signatures(request))
        attempt = 0
        while True:
            attempt += 1
            if meter is not None:
                meter.check()
            self.calls += 1
            started = False  # content went out: a retry would repeat it
            stopped = False
            usage: Usage | None = None
            try:
                raw_items = self._call(native)
                try:
                    while True:
                        # A plain scope, not trio.fail_after (a generator context manager): once per
                        # chunk.
                        with trio.CancelScope(
                            deadline=trio.current_time() + self.stall_timeout_s
                        ) as stall:
                            try:
                                raw = await anext(raw_items)
                            except StopAsyncIteration:
                                break
                        if stall.cancelled_caught:
                            raise trio.TooSlowError
                        for event in self._parse(raw):
                            if isinstance(event, StopEvent):
                                stopped = True
                            # usage alone is replaced on a retry
                            elif isinstance(event, UsageEvent):
                                usage = event.usage
                            else:
                                started = True
                            yield signed(valid_event(event), self.provider)
                finally:
                    if meter is not None and usage is not None and usage.total_tokens:
                        meter.record(self.provider, self.model, usage)
                    aclose = getattr(raw_items, "aclose", None)
                    if aclose is not None:
                        # closing is quick and must release the HTTP stream
                        with trio.CancelScope(shield=True):
                            await aclose()
                if started or stopped:
                    return
                error = BackendError(
                    f"{self.provider}: the server answered with nothing: "
                    "no content and no stop reason "
                    "(a prompt over the server's context size, such as llama.cpp's n_ctx, "
                    "does this)",
                    retryable=True,
                )
            except trio.TooSlowError:
                error = BackendError(
                    f"{self.provider}: no data for {self.stall_timeout_s:g} s (stream stalled)",
                    retryable=True,
                )
            except BackendError as exc:
                error = exc
            except Exception as exc:  # each backend maps its SDK's errors
                error = self._map_error(exc)
            if started or not error.retryable or attempt > self.max_retries:
                raise error
            await trio.sleep(self._backoff_s(attempt, error))

    def larger_output_limit(self, request: LLMRequest) -> int | None:
        """The ``max_tokens`` for the retry of a reply that ``request`` got cut at its output limit.

        Twice the limit in force, up to :attr:`max_output_limit`; None where the provider does not
        let Kesoku raise it (the backend sends no limit) or it is already at the largest.
        """
        current = request.max_output_tokens or self.output_limit
        if current is None or self.max_output_limit is None:
            return None
        larger = min(current * 2, self.max_output_limit)
        return larger if larger > current else None

    def _own_signatures(self, request: LLMRequest) -> LLMRequest:
        """:func:`~kesoku.vocab.ir.without_foreign_signatures`, reusing the last request's work.

        The turns it shares with the last request (:func:`~kesoku.vocab.transcript.shared_prefix`)
        are not looked at again. A session's requests grow by a step per call with the earlier
        turns the same objects, so only the new turns are looked at, and a running count says
        whether any turn needed cleaning: the cost of a call must not grow with the history.
        """
        turns, provider = request.turns, self.provider

        def step(before: tuple[LLMTurn, int] | None, turn: LLMTurn) -> tuple[LLMTurn, int]:
            own = own_signatures(turn, provider)
            changed = (0 if before is None else before[1]) + (own is not turn)
            return own, changed  # the turn cleaned, and how many up to it were

        cleaned = self._signatures.update(turns, step)
        if not cleaned or not cleaned[-1][1]:  # nothing to clean: the request as it came
            return request
        return msgspec.structs.replace(request, turns=tuple(own for own, _ in cleaned))

    async def generate(self, request: LLMRequest, *, meter: Meter | None = None) -> LLMResponse:
        """Run one model step to the end and return it assembled (no streaming; see stream)."""
        builder = ResponseBuilder()
        async for event in self.stream(request, meter=meter):
            builder.add(event)
        return builder.build()

    async def aclose(self) -> None:
        """Free what the backend holds (HTTP clients, caches); the runtime calls it at shutdown."""
        await trio.lowlevel.checkpoint()

    def _backoff_s(self, attempt: int, error: BackendError) -> float:
        delay = random.uniform(0, min(self.backoff_cap_s, BACKOFF_BASE_S * 2 ** (attempt - 1)))
        if error.retry_after_s is not None:
            if error.retry_after_s > RETRY_AFTER_CAP_S:
                raise error
            delay = max(delay, error.retry_after_s)
        return delay

    def _map_error(self, exc: Exception) -> BackendError:
        """Map a provider SDK exception to a :class:`BackendError`; backends override it.

        The default treats connection errors as retryable and anything else as not.
        """
        retryable = isinstance(exc, ConnectionError | TimeoutError)
        return BackendError(f"{self.provider}: {type(exc).__name__}: {exc}", retryable=retryable)

    @abstractmethod
    def _build_native_input(self, request: LLMRequest) -> Any:
        """Translate the IR request to the provider's request."""

    @abstractmethod
    def _call(self, native: Any) -> AsyncIterator[Any]:
        """Start the call; return an async iterator of raw stream items."""

    @abstractmethod
    def _parse(self, raw: Any) -> Iterable[LLMEvent]:
        """Return the events in one raw stream item."""


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``retry-after``.

    ``retry-after`` holds seconds, or an HTTP date (RFC 9110 §10.2.3). Backends pass the response
    headers of a 429/5xx; None when there is no usable hint.
    """
    try:
        if (ms := headers.get("retry-after-ms")) is not None:
            return max(0.0, float(ms) / 1000)
    except ValueError:
        pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _load_attachments(turns: Sequence[LLMTurn]) -> list[LLMTurn]:
    """Read attachment bytes (in a worker thread)."""
    loaded: list[LLMTurn] = []
    for turn in turns:
        blocks = tuple(
            msgspec.structs.replace(b, data=Path(b.path).read_bytes())
            if isinstance(b, ImageBlock | DocumentBlock) and not b.data
            else b
            for b in turn.blocks
        )
        loaded.append(LLMTurn(turn.role, blocks))
    return loaded


__all__ = ["BackendError", "BaseLLM", "TranscriptError"]
