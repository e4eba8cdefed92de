"""The Claude backend: Anthropic's Messages API through the official ``anthropic`` SDK.

Direct with an API key (``anthropic.AsyncAnthropic``) or on Vertex AI
(``anthropic.AsyncAnthropicVertex``, Application Default Credentials). The SDK's own retries are
off: :class:`~kesoku.llm.base.BaseLLM` retries. Here: the SDK client, the thinking and prompt
caching arguments of each request, the streamed body's transport, and the mapping of errors. Wire
facts come from the Messages API reference (https://docs.claude.com/en/api/messages), "Extended
thinking" (https://docs.claude.com/en/docs/build-with-claude/extended-thinking), "Adaptive thinking"
(https://platform.claude.com/docs/en/build-with-claude/adaptive-thinking) and "Prompt caching"
(https://docs.claude.com/en/docs/build-with-claude/prompt-caching).

Thinking (``claude.thinking_level``): models from Claude 4.6 on take ``{"type": "adaptive"}`` with
``output_config.effort`` (minimal and low → ``low``, medium, high); the budget form is deprecated
there and refused by later models. Older models take ``{"type": "enabled", "budget_tokens": N}``
with N from :data:`THINKING_BUDGET_TOKENS` (minimal: thinking off), capped so at least
:data:`MIN_ANSWER_TOKENS` of the configured ``max_output_tokens`` remain for the answer, and off
when that leaves less than the API's minimum budget of 1024.

The thinking parameters are the same for every request of a turn (a user message and its tool
loop): changing them (enabled or disabled, the budget, adaptive or not) drops the cache of the
messages part ("Prompt caching", "What invalidates the cache"; Adaptive thinking, "Prompt
caching"), and a tool loop is one assistant turn that "must operate in a single thinking mode"
(Extended thinking, "Toggling thinking modes in conversations"). So the adaptive parameters never
change, even when the model skipped thinking at the loop's first step: adaptive thinking does not
require earlier assistant turns to start with a thinking block (Adaptive thinking, "Validation
changes"). The budget does not follow a request's larger ``max_tokens`` after a cut reply (see
:meth:`ClaudeLLM._thinking`). The one change left is the documented one: with the budget form, a
loop whose first assistant message carries no signed thinking (written by another backend of a
fallback chain, or while thinking was off) must run without thinking, so the rest of that turn
does; the next turn turns it back on, once, at its first request.

Prompt caching: above ``context_caching_threshold`` estimated tokens, up to four breakpoints mark
the blocks whose prefix the next requests share
(:func:`~kesoku.llm.claude_convert.cache_breakpoints`).

The mapping of turns, blocks and tools to ``messages``, and of the stream's events to IR events,
lives in :mod:`kesoku.llm.claude_convert`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, ClassVar

import anthropic
import httpx2
import trio

from kesoku.llm.base import MAX_RETRIES, BaseLLM, retry_after_s
from kesoku.llm.claude_convert import (
    _Assembler,
    _estimate_request_tokens,
    _messages,
    _one_line,
    _SSEDecoder,
    _tool,
    cache_breakpoints,
    tool_loop_opens_with_thinking,
    uses_adaptive_thinking,
)
from kesoku.vocab.errors import BackendError, ConfigError
from kesoku.vocab.ir import LLMEvent, LLMRequest

if TYPE_CHECKING:
    from kesoku.config.settings import Config, ThinkingLevel

MAX_RETRY_OUTPUT_TOKENS = 32_000
"""The largest ``max_tokens`` of the retry after a reply cut at its limit.

Every Claude 4 model takes it.
"""
THINKING_BUDGET_TOKENS: dict[str, int] = {"low": 4096, "medium": 10_000, "high": 24_000}
"""budget_tokens per thinking level for models with the budget form; ``minimal``: thinking off."""
ADAPTIVE_EFFORT: dict[str, str] = {
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
}
"""``output_config.effort`` per thinking level for models with adaptive thinking."""
MIN_THINKING_BUDGET_TOKENS = 1024
"""The API's smallest budget_tokens.

Extended thinking: "Must be ≥1024 and less than max_tokens".
"""
MIN_ANSWER_TOKENS = 1024
"""Output tokens a thinking budget always leaves for the answer itself."""
DRAIN_TIMEOUT_S = 1.0
"""Longest wait for the end of the body after an ``error`` event.

The body is read to the end so that every layer closes.
"""


class ClaudeLLM(BaseLLM):
    """Claude through the ``anthropic`` SDK, streaming.

    Args:
        model: The model id (Vertex AI form ``claude-sonnet-4-5@20250929``).
        api_key: The Anthropic API key (direct API).
        base_url: Override of the endpoint (a proxy, a test fake); for Vertex, up to and including
            ``/v1``.
        vertex: Call Vertex AI instead of the direct API.
        project_id: The Google Cloud project (Vertex); None: from the credentials.
        location: The Vertex AI region (Vertex).
        access_token: A Vertex access token; None: Application Default Credentials.
        thinking_level: Reasoning effort (see the module docstring).
        max_output_tokens: ``max_tokens`` of every call, thinking included.
        context_caching_threshold: Estimated request tokens above which the prompt is cached.
        timeout_s: The SDK's request timeout, and the stall timeout between stream events.
        max_retries: Retries of a retryable failure (by the base; the SDK's are off).

    Raises:
        ValueError: Neither an API key nor Vertex is given.
    """

    provider: ClassVar[str] = "claude"

    def __init__(
        self,
        *,
        model: str,
        api_key: str | None = None,
        base_url: str | None = None,
        vertex: bool = False,
        project_id: str | None = None,
        location: str = "us-east5",
        access_token: str | None = None,
        thinking_level: ThinkingLevel = "medium",
        max_output_tokens: int = 16384,
        context_caching_threshold: int = 1024,
        timeout_s: float = 120.0,
        max_retries: int = MAX_RETRIES,
    ) -> None:
        super().__init__(model, max_retries=max_retries, stall_timeout_s=timeout_s)
        if not vertex and not api_key:
            raise ValueError("claude: an API key is needed unless vertex is set")
        self.api_key = api_key
        self.base_url = base_url
        self.vertex = vertex
        self.project_id = project_id
        self.location = location
        self.access_token = access_token
        self.thinking_level: ThinkingLevel = thinking_level
        self.max_output_tokens = max_output_tokens
        self.output_limit = max_output_tokens
        # Claude Opus 4 and 4.1 allow 32,000 output tokens, the other Claude 4 models 64,000 (Models
        # overview, "Model comparison"): a retry after a cut reply asks for at most the smaller.
        self.max_output_limit = max(max_output_tokens, MAX_RETRY_OUTPUT_TOKENS)
        self.context_caching_threshold = context_caching_threshold
        self.timeout_s = timeout_s
        self._label = "claude (vertex)" if vertex else "claude"
        self._client: anthropic.AsyncAnthropic | anthropic.AsyncAnthropicVertex | None = None
        self._client_lock = trio.Lock()

    @classmethod
    def from_config(cls, config: Config) -> ClaudeLLM:
        """Build the backend from ``[claude]``.

        Raises:
            ConfigError: The API key mode has no key (``claude.api_key`` nor ``ANTHROPIC_API_KEY``).
        """
        section = config.claude
        vertex = section.resolved_auth_mode == "vertex"
        if not vertex and not section.api_key:
            raise ConfigError(
                "claude.api_key: not set (nor ANTHROPIC_API_KEY); set it, or use Vertex AI with "
                'claude.auth_mode = "vertex" and claude.project_id'
            )
        return cls(
            model=section.model_name,
            api_key=section.api_key,
            base_url=section.base_url,
            vertex=vertex,
            project_id=section.project_id,
            location=section.location,
            thinking_level=section.thinking_level,
            max_output_tokens=section.max_output_tokens,
            context_caching_threshold=section.context_caching_threshold,
            timeout_s=section.timeout_s,
        )

    # -- the SDK client ---------------------------------------------------------------------------

    async def connect(self) -> None:
        """Create the SDK client, once, in a worker thread (the first stream does it when not done).

        Building the client loads the system's CA certificates (about 30 ms), and the SDK builds its
        parsers lazily (see :func:`_warm_sdk`): either would hold the event loop.
        """
        async with self._client_lock:
            if self._client is None:
                self._client = await trio.to_thread.run_sync(self._new_client)

    def _new_client(self) -> anthropic.AsyncAnthropic | anthropic.AsyncAnthropicVertex:
        client: anthropic.AsyncAnthropic | anthropic.AsyncAnthropicVertex
        if self.vertex:
            client = anthropic.AsyncAnthropicVertex(
                region=self.location,
                project_id=self.project_id if self.project_id else anthropic.NOT_GIVEN,
                access_token=self.access_token,
                base_url=self.base_url,
                timeout=self.timeout_s,
                max_retries=0,
            )
        else:
            client = anthropic.AsyncAnthropic(
                api_key=self.api_key, base_url=self.base_url, timeout=self.timeout_s, max_retries=0
            )
        _warm_sdk()
        with contextlib.suppress(Exception):
            # The SDK resolves the platform on its first request in a worker thread; resolve it in
            # this one.
            from anthropic._base_client import get_platform

            client._platform = get_platform()
        return client

    async def aclose(self) -> None:
        """Close the SDK's HTTP connections."""
        if self._client is not None:
            await self._client.close()
            self._client = None

    # -- the template's steps ---------------------------------------------------------------------

    def _build_native_input(self, request: LLMRequest) -> dict[str, Any]:
        messages = _messages(request.turns)
        system: list[dict[str, Any]] = (
            [{"type": "text", "text": request.system}] if request.system.strip() else []
        )
        tools = [_tool(spec) for spec in request.tools]
        max_tokens = request.max_output_tokens or self.max_output_tokens
        native: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_tokens,
            "messages": messages,
        }
        if system:
            native["system"] = system
        if tools:
            native["tools"] = tools
        native.update(self._thinking(messages, max_tokens))
        if _estimate_request_tokens(request) > self.context_caching_threshold:
            # Prompt caching: a breakpoint caches the prefix up to it; tools, system, then messages.
            for block in cache_breakpoints(system, tools, messages):
                block["cache_control"] = {"type": "ephemeral"}
        return native

    def _thinking(self, messages: Sequence[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
        """The ``thinking`` (and ``output_config``) arguments for this request.

        The same for every request of a turn (see the module docstring): adaptive thinking
        whatever the loop's first step did; the budget from the configured ``max_output_tokens``,
        not from this request's ``max_tokens``, which a cut reply raises for the rest of the loop
        (:meth:`~kesoku.llm.base.BaseLLM.larger_output_limit`). Only a request whose own
        ``max_tokens`` is below the configured one (none of a turn's) gets a smaller budget, as the
        API requires ``budget_tokens`` < ``max_tokens`` (Extended thinking).
        """
        if uses_adaptive_thinking(self.model):
            return {
                "thinking": {"type": "adaptive"},
                "output_config": {"effort": ADAPTIVE_EFFORT[self.thinking_level]},
            }
        budget = THINKING_BUDGET_TOKENS.get(self.thinking_level)
        if budget is None:
            return {}
        budget = min(budget, min(max_tokens, self.max_output_tokens) - MIN_ANSWER_TOKENS)
        if budget < MIN_THINKING_BUDGET_TOKENS or not tool_loop_opens_with_thinking(messages):
            # A loop that opened without signed thinking runs without it to its end (the turn's
            # only change of thinking parameters, needed: see the module docstring).
            return {}
        return {"thinking": {"type": "enabled", "budget_tokens": budget}}

    async def _call(self, native: dict[str, Any]) -> AsyncIterator[tuple[LLMEvent, ...]]:
        """Stream the response, one tuple of IR events per chunk read.

        An empty tuple keeps the stall timer alive. The SDK sends the request (auth, headers, the
        Vertex route, timeouts) and raises its status errors; the body's server-sent events are
        decoded here rather than by the SDK's ``AsyncStream``, whose nested async generators stay
        suspended when a stream ends early (an interruption, an ``error`` event), which trio
        reports as unclosed at garbage collection.
        """
        if self._client is None:
            await self.connect()
        assert self._client is not None
        assembler = _Assembler(self._label)
        decoder = _SSEDecoder()
        request = self._client.messages.with_streaming_response.create(**native, stream=True)
        async with request as response, aclosing(response.http_response.aiter_bytes()) as chunks:
            async for chunk in chunks:
                try:
                    events = [
                        e for name, data in decoder.feed(chunk) for e in assembler.feed(name, data)
                    ]
                except BackendError:
                    # the API ends the body after an error event
                    with trio.move_on_after(DRAIN_TIMEOUT_S):
                        async for _ in chunks:
                            pass
                    raise
                yield tuple(events)

    def _parse(self, raw: tuple[LLMEvent, ...]) -> Iterable[LLMEvent]:
        return raw

    def _map_error(self, exc: Exception) -> BackendError:
        """Classify an SDK error (Messages API "Errors": https://docs.claude.com/en/api/errors).

        HTTP 401/403 are the operator's to fix; 408, 409, 429 and 5xx (529 overloaded included)
        are retried, honouring ``retry-after`` (seconds or an HTTP date); other 4xx are final.
        Connection failures, timeouts and a stream cut mid-way (``httpx2.RemoteProtocolError``) are
        retried. An ``error`` event inside the stream is classified by :class:`_Assembler`.
        """
        label = self._label
        if isinstance(exc, anthropic.APIStatusError):
            status = exc.status_code
            kind = exc.type or ""
            message = _one_line(exc.api_message or _body_message(exc.body) or exc.message)
            auth = status in (401, 403)
            retryable = status in (408, 409, 429) or status >= 500
            text = f"{label}: HTTP {status}{f' {kind}' if kind else ''}: {message}"
            wait_s = retry_after_s(exc.response.headers) if retryable else None
            return BackendError(
                text, retryable=retryable, status=status, retry_after_s=wait_s, auth=auth
            )
        if isinstance(exc, anthropic.APIConnectionError):  # APITimeoutError included
            return BackendError(f"{label}: {_one_line(exc.message)}", retryable=True)
        if isinstance(exc, httpx2.TransportError):  # raised raw while the body streams
            reason = f"{type(exc).__name__}: {_one_line(str(exc))}"
            return BackendError(f"{label}: connection lost ({reason})", retryable=True)
        return super()._map_error(exc)


# -- errors ---------------------------------------------------------------------------------------


def _body_message(body: object) -> str | None:
    """``error.message`` of an error body (Anthropic and Google Cloud errors both have it)."""
    if isinstance(body, dict):
        error = body.get("error")
        message = error.get("message") if isinstance(error, dict) else None
        if isinstance(message, str):
            return message
    return None


def _warm_sdk() -> None:
    """Build, off the event loop, what the SDK otherwise builds lazily on first use.

    It runs once per process. The first SDK error object builds a union of about 130 error-detail
    models (about 100 ms); anyio loads its trio backend on first use.
    """
    global _warmed
    if _warmed:
        return
    _warmed = True
    request = httpx2.Request("POST", "https://api.anthropic.com/v1/messages")
    body = {"type": "error", "error": {"type": "api_error", "message": "warm-up"}}
    anthropic.APIStatusError("warm-up", response=httpx2.Response(500, request=request), body=body)
    with contextlib.suppress(ImportError):
        import anyio._backends._trio  # noqa: F401


_warmed = False


__all__ = ["ClaudeLLM"]
