"""The contract every model backend keeps, as a check a backend's own tests run.

A backend subclasses :class:`~kesoku.llm.base.BaseLLM`; the runtime relies on more than its
signatures: text streamed as it arrives, complete tool calls, the usage and the stop reason of each
reply, failures classified (retried, final, the operator's to fix) and retried the same way by every
backend, a stalled or dropped stream retried only while nothing was streamed, and a stream that can
be cancelled at any point without leaving the backend unusable. :func:`check_backend_contract`
checks all of that against a fake of the provider, driven with provider-neutral replies
(:class:`Answer`, :class:`Failure`) that the backend's author translates into the fake's own.

A third-party backend's test (pytest-trio, with its ``autojump_clock`` fixture)::

    @asynccontextmanager
    async def my_backend() -> AsyncIterator[ContractFake]:
        fake = MyProviderFake()  # it records each request it receives in fake.requests
        async with serve_app(fake.app) as url:  # kesoku.testing.fakes.server
            llm = MyLLM(base_url=url, api_key="test")
            # Any thread work your backend does once (building its SDK client) goes here, before
            # the autojump clock runs the rules.
            try:
                yield ContractFake(
                    llm,
                    play=lambda item: fake.push(to_my_reply(item)),
                    requests=lambda: len(fake.requests),
                )
            finally:
                await llm.aclose()


    async def test_my_backend_keeps_the_contract(autojump_clock: MockClock) -> None:
        await check_backend_contract(my_backend)

A backend for an API the bundled fakes speak reuses them: :mod:`kesoku.testing.fakes` has a fake of
Anthropic's Messages API, OpenAI's Chat Completions and the Gemini API, each with a
``contract_reply`` translator (``anthropic_api``, ``openai_api``, and ``gemini_replies`` for
Gemini); :func:`scripted_step` is the translator for
:class:`~kesoku.llm.scripted.ScriptedLLM`. ``tests/test_backend_contract.py`` runs the contract over
every first-party backend.
"""

from __future__ import annotations

import functools
import gc
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, aclosing
from dataclasses import dataclass, field
from typing import Literal, NoReturn

import trio
import trio.testing

from kesoku.llm.base import BaseLLM
from kesoku.llm.scripted import Step, StepError, StepEvent, StepToolCall, StepUsage
from kesoku.vocab.errors import BackendError
from kesoku.vocab.ir import (
    LLMEvent,
    LLMRequest,
    LLMTurn,
    StopEvent,
    StopReason,
    TextBlock,
    TextDelta,
    ToolCallBlock,
    ToolCallEvent,
    ToolResultBlock,
    ToolSpec,
    UsageEvent,
)
from kesoku.vocab.model import Usage

RETRYABLE_STATUSES = (408, 409, 429, 500, 503, 529)
"""HTTP statuses every backend retries (with 5xx in general): timeout, conflict, rate limit, server
error, unavailable, overloaded."""
AUTH_STATUSES = (401, 403)
"""HTTP statuses that are the operator's to fix: never retried."""


def is_retryable_status(status: int) -> bool:
    """Whether a backend retries an HTTP error with this status (408, 409, 429 and 5xx)."""
    return status in (408, 409, 429) or status >= 500


@dataclass(frozen=True)
class Answer:
    """A reply the fake streams, in provider-neutral terms.

    Attributes:
        text: The answer's chunks, each sent as its own stream item (one
            :class:`~kesoku.vocab.ir.TextDelta` each).
        tool_calls: Complete tool calls (id, name, arguments), sent after the text.
        usage: The token counts the reply reports (input and output).
        stop: Why the reply ended: ``end`` (the model finished) or ``max_tokens`` (cut at the output
            limit).
        cut_after: Drop the connection after this many text chunks (0: before any content), with no
            clean end of the stream; None: the reply ends cleanly.
        stall_s: Silence, with the connection open, before the first content.
    """

    text: tuple[str, ...] = ()
    tool_calls: tuple[ToolCallBlock, ...] = ()
    usage: Usage = field(default_factory=lambda: Usage(input_tokens=10, output_tokens=5))
    stop: Literal["end", "max_tokens"] = "end"
    cut_after: int | None = None
    stall_s: float = 0.0


@dataclass(frozen=True)
class Failure:
    """An HTTP error the fake answers instead of a reply, in the provider's error body shape.

    Attributes:
        status: The HTTP status.
        message: The provider's message in the error body.
        retry_after_s: Sent as the ``retry-after`` header (whole seconds) when set.
    """

    status: int
    message: str
    retry_after_s: float | None = None


Reply = Answer | Failure
"""What a fake answers to one model call."""


@dataclass(frozen=True)
class ContractFake:
    """A backend pointed at a fake of its provider, and the fake's two controls.

    Attributes:
        llm: The backend under test, ready to stream (its client built, any worker-thread work done:
            the contract runs under an autojump clock, which jumps while a thread runs).
        play: Queues one reply, translated into the fake's own; the fake answers the model calls in
            order, one reply each.
        requests: How many model calls the fake has received (so retries are counted on the wire,
            not only by the backend: a provider SDK that retries on its own is caught).
    """

    llm: BaseLLM
    play: Callable[[Reply], None]
    requests: Callable[[], int]

    def push(self, *replies: Reply) -> None:
        """Queue replies, one per model call."""
        for reply in replies:
            self.play(reply)


ContractFactory = Callable[[], AbstractAsyncContextManager[ContractFake]]
"""Builds a fresh fake and a backend pointed at it; the contract opens one per rule."""


def scripted_step(reply: Reply) -> Step:
    """The :class:`~kesoku.llm.scripted.Step` that plays ``reply`` in a :class:`ScriptedLLM`.

    A dropped connection becomes a retryable error (``connection lost``), a stall a sleep, an HTTP
    failure an error step, retryable as the backends classify its status.
    """
    if isinstance(reply, Failure):
        error = StepError(
            message=f"HTTP {reply.status}: {reply.message}",
            status=reply.status,
            retryable=is_retryable_status(reply.status),
            retry_after_s=reply.retry_after_s,
        )
        return Step(error=error)
    events: list[StepEvent] = []
    if reply.stall_s:
        events.append(StepEvent(sleep_s=reply.stall_s))
    chunks = reply.text if reply.cut_after is None else reply.text[: reply.cut_after]
    events += [StepEvent(text=chunk) for chunk in chunks]
    if reply.cut_after is not None:
        lost = StepError(message="connection lost", retryable=True)
        return Step(events=(*events, StepEvent(error=lost)))
    events += [
        StepEvent(tool_call=StepToolCall(name=c.name, arguments=dict(c.arguments), id=c.id))
        for c in reply.tool_calls
    ]
    counts = reply.usage
    usage = StepUsage(input_tokens=counts.input_tokens, output_tokens=counts.output_tokens)
    events.append(StepEvent(usage=usage))
    return Step(events=tuple(events), stop=reply.stop)


# -- the rules ------------------------------------------------------------------------------------

WEATHER = ToolSpec(
    "weather",
    "Get the weather.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
QUESTION = LLMTurn("user", (TextBlock("Weather in Paris and Rome?"),))
REQUEST = LLMRequest(system="You are a test.", turns=(QUESTION,), tools=(WEATHER,))
"""The request the rules send: one user turn, one tool offered."""
CALLS = (
    ToolCallBlock("call_a", "weather", {"city": "Paris", "units": "metric", "days": [1, 2, 3]}),
    ToolCallBlock("call_b", "weather", {"city": "Rome", "note": 'quote " and ünïcode'}),
)


class _Run:
    """One rule's run: its fake, its backend, and the errors it raises."""

    def __init__(self, rule: str, fake: ContractFake) -> None:
        self.rule = rule
        self.fake = fake
        self.llm = fake.llm

    def fail(self, message: str) -> NoReturn:
        raise AssertionError(f"{self.llm.provider}: {self.rule}: {message}")

    def check(self, ok: bool, message: str) -> None:
        if not ok:
            self.fail(message)

    def counted(self, calls: int, *, requests: int | None = None) -> None:
        """The backend made ``calls`` attempts and the fake saw as many (or ``requests``)."""
        expected = calls if requests is None else requests
        seen = (self.llm.calls, self.fake.requests())
        self.check(
            seen == (calls, expected),
            f"expected {calls} model calls and {expected} requests on the wire, "
            f"got {seen[0]} calls and {seen[1]} requests",
        )

    async def events(self, request: LLMRequest = REQUEST) -> list[LLMEvent]:
        try:
            async with aclosing(self.llm.stream(request)) as stream:
                return [event async for event in stream]
        except BackendError as exc:
            self.fail(f"the call failed: {exc}")

    async def failure(self, request: LLMRequest = REQUEST) -> tuple[list[LLMEvent], BackendError]:
        seen: list[LLMEvent] = []
        try:
            async with aclosing(self.llm.stream(request)) as stream:
                async for event in stream:
                    seen.append(event)
        except BackendError as exc:
            return seen, exc
        except Exception as exc:
            self.fail(f"raised {type(exc).__name__}: {exc}, not a BackendError")
        self.fail(f"no BackendError; the stream ended after {seen}")

    def content(self, events: list[LLMEvent], expected: Iterable[str | ToolCallBlock]) -> None:
        """The text and tool calls streamed, in order, are ``expected`` exactly."""
        got = [
            e.text if isinstance(e, TextDelta) else e.call
            for e in events
            if isinstance(e, TextDelta | ToolCallEvent)
        ]
        want = list(expected)
        self.check(got == want, f"expected the content {want}, got {got}")

    def one_line(self, error: BackendError, message: str) -> None:
        text = str(error)
        self.check(
            text.startswith(self.llm.provider) and "\n" not in text and message in text,
            f"the error should be one line, start with {self.llm.provider!r} and quote the "
            f"server's message {message!r}: got {text!r}",
        )


def _stops(events: list[LLMEvent]) -> list[StopReason]:
    return [e.reason for e in events if isinstance(e, StopEvent)]


async def _text_streams_in_chunks(run: _Run) -> None:
    """Each chunk is a text delta, in order; one usage event with the counts; one ``end`` stop.

    ``generate`` assembles the same reply. One model call, one request.
    """
    usage = Usage(input_tokens=42, output_tokens=7)
    chunks = ("Hel", "lo, ", "wörld")
    run.fake.push(Answer(chunks, usage=usage), Answer(chunks, usage=usage))
    events = await run.events()
    run.content(events, chunks)
    usages = [e.usage for e in events if isinstance(e, UsageEvent)]
    run.check(usages == [usage], f"expected one usage event with {usage}, got {usages}")
    run.check(_stops(events) == [StopReason.END], f"expected one end stop, got {_stops(events)}")
    run.counted(1)
    response = await run.llm.generate(REQUEST)
    run.check(
        (response.text, response.tool_calls, response.usage) == ("".join(chunks), (), usage),
        f"generate() assembled {response}",
    )


async def _tool_calls_round_trip(run: _Run) -> None:
    """Calls come whole (id, name, nested arguments), after the text; stop ``end``.

    The next request, holding the calls and their results, is accepted and answered.
    """
    run.fake.push(Answer(("Checking.",), tool_calls=CALLS), Answer(("Sunny and rainy.",)))
    events = await run.events()
    run.content(events, ["Checking.", *CALLS])
    run.check(_stops(events) == [StopReason.END], f"expected one end stop, got {_stops(events)}")
    follow_up = LLMRequest(
        system=REQUEST.system,
        turns=(
            QUESTION,
            LLMTurn("assistant", (TextBlock("Checking."), *CALLS)),
            LLMTurn(
                "user",
                (
                    ToolResultBlock("call_a", "weather", "sunny"),
                    ToolResultBlock("call_b", "weather", "rain"),
                ),
            ),
        ),
        tools=REQUEST.tools,
    )
    try:
        answer = await run.events(follow_up)
    except AssertionError as exc:
        raise AssertionError(f"{exc} (the request carrying the tool results)") from None
    run.content(answer, ["Sunny and rainy."])
    run.counted(2)


async def _a_cut_reply_says_max_tokens(run: _Run) -> None:
    """A reply cut at the output limit keeps its text and ends with a ``max_tokens`` stop."""
    run.fake.push(Answer(("This is a long", " story"), stop="max_tokens"))
    events = await run.events()
    run.content(events, ["This is a long", " story"])
    run.check(
        _stops(events) == [StopReason.MAX_TOKENS],
        f"expected one max_tokens stop, got {_stops(events)}",
    )


async def _rate_limits_wait_for_retry_after(run: _Run) -> None:
    """A 429 is retried once its ``retry-after`` (7 s) has passed, not sooner, not much later."""
    run.fake.push(Failure(429, "Rate limit reached.", retry_after_s=7), Answer(("after the wait",)))
    start = trio.current_time()
    events = await run.events()
    waited = trio.current_time() - start
    run.content(events, ["after the wait"])
    run.check(7 <= waited < 12, f"retried after {waited:g} s, not after retry-after's 7 s")
    run.counted(2)


async def _server_errors_are_retried(run: _Run, *, status: int) -> None:
    """HTTP 408, 409 and 5xx (529 included) are retried: two failures, then the answer."""
    failure = Failure(status, "Try again later.")
    run.fake.push(failure, failure, Answer(("finally",)))
    run.content(await run.events(), ["finally"])
    run.counted(3)


async def _retries_run_out_with_a_one_line_error(run: _Run) -> None:
    """After ``max_retries`` retries the last error is raised: retryable, its status, one line."""
    attempts = run.llm.max_retries + 1
    run.fake.push(*[Failure(503, "The model is overloaded.")] * attempts, Answer(("never",)))
    _, error = await run.failure()
    run.check(
        (error.status, error.retryable, error.auth) == (503, True, False),
        f"expected status 503, retryable, not auth; got {error.status}, {error.retryable}, "
        f"{error.auth}",
    )
    run.one_line(error, "The model is overloaded.")
    run.counted(attempts)


async def _auth_errors_are_never_retried(run: _Run, *, status: int) -> None:
    """HTTP 401 and 403 are auth errors, never retried, whatever follows."""
    run.fake.push(Failure(status, "Request had invalid authentication credentials."))
    run.fake.push(Answer(("never",)))
    _, error = await run.failure()
    run.check(
        (error.status, error.auth, error.retryable) == (status, True, False),
        f"expected status {status}, auth, not retryable; got {error.status}, {error.auth}, "
        f"{error.retryable}",
    )
    run.one_line(error, "Request had invalid authentication credentials.")
    run.counted(1)


async def _bad_requests_are_final(run: _Run) -> None:
    """HTTP 400 is final: not retried, not an auth error, the server's message quoted."""
    run.fake.push(Failure(400, "Invalid argument: max_tokens is too large."), Answer(("never",)))
    _, error = await run.failure()
    run.check(
        (error.status, error.auth, error.retryable) == (400, False, False),
        f"expected status 400, neither auth nor retryable; got {error.status}, {error.auth}, "
        f"{error.retryable}",
    )
    run.one_line(error, "Invalid argument: max_tokens is too large.")
    run.counted(1)


async def _a_drop_before_content_is_retried(run: _Run) -> None:
    """A connection dropped before any content is retried; the retry's answer comes through."""
    run.fake.push(Answer(("lost",), cut_after=0), Answer(("second try",)))
    run.content(await run.events(), ["second try"])
    run.counted(2)


async def _a_drop_after_content_is_not_retried(run: _Run) -> None:
    """A connection dropped after content is a retryable BackendError raised after that content.

    It is not retried by the backend (a retry would stream the content twice): the turn decides.
    """
    run.fake.push(Answer(("par", "tial", " answer"), cut_after=2), Answer(("never sent",)))
    seen, error = await run.failure()
    run.content(seen, ["par", "tial"])
    run.check(error.retryable, f"a dropped connection should be retryable: {error}")
    run.counted(1)


async def _a_stalled_stream_is_retried(run: _Run) -> None:
    """A stream silent past the stall timeout is abandoned (before the silence ends), retried."""
    silence = max(600.0, 4 * run.llm.stall_timeout_s)
    run.fake.push(Answer(("slow",), stall_s=silence), Answer(("fresh",)))
    start = trio.current_time()
    events = await run.events()
    waited = trio.current_time() - start
    run.content(events, ["fresh"])
    run.check(waited < silence, f"waited {waited:g} s: the whole silence of {silence:g} s")
    run.counted(2)


async def _cancelling_mid_stream_leaves_it_usable(run: _Run) -> None:
    """A stream closed early, or cancelled mid-way, releases its call: the next call works.

    Closing after the first delta (``aclosing`` and ``break``), then cancelling the consumer's scope
    after the first delta (how the runtime interrupts a turn), then an ordinary call.
    """
    chunks = ("one ", "two ", "three")
    run.fake.push(Answer(chunks), Answer(chunks), Answer(("next",)))
    first: list[LLMEvent] = []
    async with aclosing(run.llm.stream(REQUEST)) as stream:
        async for event in stream:
            if isinstance(event, TextDelta):
                first.append(event)
                break
    with trio.CancelScope() as scope:
        async with aclosing(run.llm.stream(REQUEST)) as stream:
            async for event in stream:
                if isinstance(event, TextDelta):
                    first.append(event)
                    scope.cancel()
    run.check(scope.cancelled_caught, "the cancelled stream went on to its end")
    run.content(first, ["one ", "one "])
    # What an abandoned stream left for the garbage collector is finalised here, not in a later
    # test.
    gc.collect()
    for _ in range(10):
        await trio.lowlevel.checkpoint()
    run.content(await run.events(), ["next"])
    run.counted(3)


Rule = Callable[[_Run], Awaitable[None]]

CONTRACT_RULES: Mapping[str, Rule] = {
    "text streams in chunks": _text_streams_in_chunks,
    "tool calls round trip": _tool_calls_round_trip,
    "a cut reply says max_tokens": _a_cut_reply_says_max_tokens,
    "rate limits wait for retry-after": _rate_limits_wait_for_retry_after,
    **{
        f"HTTP {status} is retried": functools.partial(_server_errors_are_retried, status=status)
        for status in RETRYABLE_STATUSES
        if status != 429
    },
    "retries run out with a one-line error": _retries_run_out_with_a_one_line_error,
    **{
        f"HTTP {status} is an auth error, never retried": functools.partial(
            _auth_errors_are_never_retried, status=status
        )
        for status in AUTH_STATUSES
    },
    "HTTP 400 is final": _bad_requests_are_final,
    "a drop before content is retried": _a_drop_before_content_is_retried,
    "a drop after content is not retried": _a_drop_after_content_is_not_retried,
    "a stalled stream is retried": _a_stalled_stream_is_retried,
    "cancelling mid-stream leaves it usable": _cancelling_mid_stream_leaves_it_usable,
}
"""The rules by name, in the order :func:`check_backend_contract` runs them."""


async def check_backend_contract(
    factory: ContractFactory, *, rules: Iterable[str] | None = None
) -> None:
    """Check that a backend keeps the contract every Kesoku model backend keeps.

    Each rule opens ``factory()`` afresh (a new fake, a new backend), queues provider-neutral
    replies, streams :data:`REQUEST` and checks what came out, and what reached the fake:

    - text streams in chunks: one :class:`~kesoku.vocab.ir.TextDelta` per chunk, in order; one
      usage event with the reported counts; one ``end`` stop; ``generate`` assembles the same;
    - tool calls come whole (id, name, nested arguments) after the text, stop ``end``, and the next
      request, holding the calls and their results, is accepted;
    - a reply cut at the output limit keeps its text and stops with ``max_tokens``;
    - HTTP 429 is retried after its ``retry-after``; 408, 409, 500, 503 and 529 are retried;
      after ``max_retries`` retries the error is raised, retryable, with its status, in one line
      that starts with the provider's name and quotes the server;
    - HTTP 401 and 403 are auth errors and 400 is final: none is retried;
    - a connection dropped before any content is retried; one dropped after content is raised
      (retryable) after that content and not retried; a stalled stream is abandoned and retried;
    - a stream closed early or cancelled mid-way leaves the backend usable for the next call;
    - every retry is one request on the wire: the provider SDK's own retries are off.

    Run it under an autojump clock (pytest-trio's ``autojump_clock`` fixture): the rules wait for
    ``retry-after``, backoffs and stalls in virtual time. Abandoned streams are garbage-collected
    inside the rule that left them, so a test that runs it may need to ignore the
    ``ResourceWarning`` of an SDK that leaves an async generator unclosed.

    Args:
        factory: Builds a fresh fake and a backend pointed at it, as an async context manager of a
            :class:`ContractFake`; the backend needs ``max_retries`` of 2 or more.
        rules: Names from :data:`CONTRACT_RULES` to run; None: all of them.

    Raises:
        AssertionError: A rule is broken; the message names the provider, the rule and what was
            seen (``openai: HTTP 429 ...: retried after 0.4 s, not after retry-after's 7 s``).
        KeyError: An unknown rule name.
        RuntimeError: Not run under an autojump clock.
    """
    clock = trio.lowlevel.current_clock()
    if not isinstance(clock, trio.testing.MockClock) or math.isinf(clock.autojump_threshold):
        raise RuntimeError(
            "check_backend_contract waits for retries and stalls in virtual time: run it under "
            "trio.testing.MockClock(autojump_threshold=0) (pytest-trio: the autojump_clock fixture)"
        )
    names = list(CONTRACT_RULES) if rules is None else list(rules)
    for name in names:
        rule = CONTRACT_RULES[name]
        broken: AssertionError | None = None
        async with factory() as fake:
            run = _Run(name, fake)
            try:
                run.check(
                    fake.llm.max_retries >= 2,
                    f"max_retries is {fake.llm.max_retries}: the contract needs 2 or more",
                )
                await rule(run)
            except AssertionError as exc:
                # raised after the factory closes, so a fake's nursery does not wrap it in a group
                broken = exc
        if broken is not None:
            raise broken


__all__ = [
    "AUTH_STATUSES",
    "CONTRACT_RULES",
    "REQUEST",
    "RETRYABLE_STATUSES",
    "Answer",
    "ContractFactory",
    "ContractFake",
    "Failure",
    "Reply",
    "check_backend_contract",
    "is_retryable_status",
    "scripted_step",
]
