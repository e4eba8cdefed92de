"""The Claude backend: Anthropic's Messages API through the official ``anthropic`` SDK.

Direct with an API key (``anthropic.AsyncAnthropic``) or on Vertex AI
(``anthropic.AsyncAnthropicVertex``, Application Default Credentials). The SDK's own retries are
off: :class:`~kesoku.llm.base.BaseLLM` retries. Wire facts below come from the Messages API
reference (https://docs.claude.com/en/api/messages), "Streaming Messages"
(https://docs.claude.com/en/docs/build-with-claude/streaming), "Extended thinking"
(https://docs.claude.com/en/docs/build-with-claude/extended-thinking), "Adaptive thinking"
(https://platform.claude.com/docs/en/build-with-claude/adaptive-thinking) and "Prompt caching"
(https://docs.claude.com/en/docs/build-with-claude/prompt-caching).

Mapping of the IR:

- ``system`` → one text block (left out when empty); turns → ``messages``, consecutive turns of one
  role merged (strict alternation), tool results first in their user turn.
- user blocks: :class:`ToolResultBlock` → ``tool_result`` (``is_error`` unless completed),
  :class:`TextBlock` → ``text``, :class:`ImageBlock` → base64 ``image`` (jpeg, png, gif, webp),
  :class:`DocumentBlock` → base64 PDF ``document``, or a text-source ``document`` for UTF-8 text;
  an attachment Claude cannot read becomes a one-line text note so the model knows it was there.
- assistant blocks: signed :class:`ThoughtBlock` → ``thinking`` with its signature (an unsigned one
  is dropped: the API rejects it), :class:`TextBlock` → ``text``, :class:`ToolCallBlock` →
  ``tool_use``.
- A ``redacted_thinking`` block travels as a :class:`ThoughtDelta` without text whose signature is
  ``redacted_thinking:`` + its data, and goes back as the same block.

Thinking (``claude.thinking_level``): models from Claude 4.6 on take ``{"type": "adaptive"}`` with
``output_config.effort`` (minimal and low → ``low``, medium, high); the budget form is deprecated
there and refused by later models. Older models take ``{"type": "enabled", "budget_tokens": N}``
with N from :data:`THINKING_BUDGET_TOKENS` (minimal: thinking off), capped so at least
:data:`MIN_ANSWER_TOKENS` of ``max_tokens`` remain for the answer, and off when that leaves less
than the API's minimum budget of 1024. A tool loop runs in one thinking mode: when the assistant
message that opened the current loop carries no signed thinking (it came from another backend, or
thinking was off), thinking is left off for that request rather than refused by the API.
"""

from __future__ import annotations

import base64
import contextlib
import re
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, ClassVar

import anthropic
import httpx2
import msgspec
import trio

from kesoku.llm.base import MAX_RETRIES, BaseLLM, retry_after_s
from kesoku.vocab.errors import BackendError, ConfigError
from kesoku.vocab.ir import (
    DocumentBlock,
    ImageBlock,
    LLMEvent,
    LLMRequest,
    LLMTurn,
    StopEvent,
    StopReason,
    TextBlock,
    TextDelta,
    ThoughtBlock,
    ThoughtDelta,
    ToolCallBlock,
    ToolCallEvent,
    ToolResultBlock,
    ToolSpec,
    UsageEvent,
    head_tokens,
    turn_tokens,
)
from kesoku.vocab.model import Usage
from kesoku.vocab.text import decode_json
from kesoku.vocab.transcript import CONTINUE_PROMPT, OMITTED_OPENING

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
ADAPTIVE_SINCE = (4, 6)
"""First model version whose thinking is adaptive.

Adaptive thinking: Opus 4.6, Sonnet 4.6 and later.
"""
IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
"""Media types of a base64 image source (Messages API, ``Base64ImageSource.media_type``)."""
REDACTED_PREFIX = b"redacted_thinking:"
"""Marks a ThoughtBlock signature that carries a ``redacted_thinking`` block's data."""
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
            for blocks in (system, tools, messages[-1]["content"]):
                if blocks:
                    blocks[-1]["cache_control"] = {"type": "ephemeral"}
        return native

    def _thinking(self, messages: Sequence[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
        """The ``thinking`` (and ``output_config``) arguments for this request."""
        params: dict[str, Any] = {}
        if uses_adaptive_thinking(self.model):
            params["output_config"] = {"effort": ADAPTIVE_EFFORT[self.thinking_level]}
            thinking: dict[str, Any] = {"type": "adaptive"}
        else:
            budget = THINKING_BUDGET_TOKENS.get(self.thinking_level)
            if budget is None:
                return params
            budget = min(budget, max_tokens - MIN_ANSWER_TOKENS)
            if budget < MIN_THINKING_BUDGET_TOKENS:
                return params
            thinking = {"type": "enabled", "budget_tokens": budget}
        if tool_loop_opens_with_thinking(messages):
            params["thinking"] = thinking
        return params

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


# -- requests -------------------------------------------------------------------------------------


def uses_adaptive_thinking(model: str) -> bool:
    """Whether a model id names Claude 4.6 or later (adaptive thinking instead of a budget).

    The version is the first one or two short numbers of the id (``claude-opus-4-6``,
    ``claude-3-7-sonnet-20250219``, ``claude-sonnet-5``); an 8-digit date is not a version; an id
    without a version keeps the budget form.
    """
    name = model.rsplit("/", 1)[-1].split("@", 1)[0]
    numbers = [int(part) for part in re.split(r"[-.]", name) if part.isdigit() and len(part) <= 2]
    if not numbers:
        return False
    version = (numbers[0], numbers[1] if len(numbers) > 1 else 0)
    return version >= ADAPTIVE_SINCE


def tool_loop_opens_with_thinking(messages: Sequence[dict[str, Any]]) -> bool:
    """Whether thinking may be on: true unless the current tool loop opened without signed thinking.

    The loop is what follows the last user message without ``tool_result`` blocks; its first
    assistant message must start with a ``thinking`` or ``redacted_thinking`` block when thinking is
    on (Extended thinking, "Preserving thinking blocks": the API answers 400 "a final assistant
    message must start with a thinking block").
    """
    start = 0
    for i, msg in enumerate(messages):
        if msg["role"] == "user" and not any(b["type"] == "tool_result" for b in msg["content"]):
            start = i + 1
    for msg in messages[start:]:
        if msg["role"] == "assistant":
            return bool(msg["content"]) and msg["content"][0]["type"] in (
                "thinking",
                "redacted_thinking",
            )
    return True


def _messages(turns: Sequence[LLMTurn]) -> list[dict[str, Any]]:
    """Turns → ``messages``: merged per role, empty ones dropped, first and last from the user."""
    out: list[dict[str, Any]] = []
    for turn in turns:
        convert = _user_block if turn.role == "user" else _assistant_block
        content = [native for block in turn.blocks if (native := convert(block)) is not None]
        if not content:
            continue
        if out and out[-1]["role"] == turn.role:
            out[-1]["content"].extend(content)
        else:
            out.append({"role": turn.role, "content": content})
    for msg in out:
        if msg["role"] == "user":  # tool_result blocks must open their user message
            msg["content"].sort(key=lambda b: b["type"] != "tool_result")
    if not out or out[0]["role"] != "user":
        out.insert(0, {"role": "user", "content": [{"type": "text", "text": OMITTED_OPENING}]})
    if out[-1]["role"] != "user":
        out.append({"role": "user", "content": [{"type": "text", "text": CONTINUE_PROMPT}]})
    return out


def _user_block(block: Any) -> dict[str, Any] | None:
    if isinstance(block, ToolResultBlock):
        result: dict[str, Any] = {"type": "tool_result", "tool_use_id": block.call_id}
        if block.content:  # content is optional; an empty text block would be refused
            result["content"] = block.content
        result["is_error"] = block.is_error
        return result
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text} if block.text.strip() else None
    if isinstance(block, ImageBlock):
        if block.mime_type in IMAGE_TYPES and block.data:
            data = base64.b64encode(block.data).decode("ascii")
            return {
                "type": "image",
                "source": {"type": "base64", "media_type": block.mime_type, "data": data},
            }
        return _attachment_note(block.path, block.mime_type, "an image type Claude cannot read")
    if isinstance(block, DocumentBlock):
        return _document(block)
    return _assistant_block(block)  # a block of the other side's kind: keep it where the IR put it


def _document(block: DocumentBlock) -> dict[str, Any]:
    name = block.filename or block.path
    doc: dict[str, Any]
    if block.mime_type == "application/pdf" and block.data:
        data = base64.b64encode(block.data).decode("ascii")
        doc = {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": data},
        }
    else:
        try:
            text = block.data.decode("utf-8")
        except UnicodeDecodeError:
            return _attachment_note(name, block.mime_type, "a file type Claude cannot read")
        if not text.strip():
            return _attachment_note(name, block.mime_type, "empty")
        doc = {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": text},
        }
    if block.filename:
        doc["title"] = block.filename
    return doc


def _attachment_note(name: str, mime_type: str, why: str) -> dict[str, Any]:
    return {"type": "text", "text": f"[attachment {name} ({mime_type}): {why}]"}


def _assistant_block(block: Any) -> dict[str, Any] | None:
    if isinstance(block, ThoughtBlock):
        if not block.signature:
            return None  # the API refuses unsigned thinking
        if block.signature.startswith(REDACTED_PREFIX):
            return {
                "type": "redacted_thinking",
                "data": block.signature[len(REDACTED_PREFIX) :].decode(),
            }
        return {"type": "thinking", "thinking": block.text, "signature": block.signature.decode()}
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text} if block.text.strip() else None
    if isinstance(block, ToolCallBlock):
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.arguments}
    return _user_block(block)


def _tool(spec: ToolSpec) -> dict[str, Any]:
    return {"name": spec.name, "description": spec.description, "input_schema": spec.parameters}


def _estimate_request_tokens(request: LLMRequest) -> int:
    """Tokens of the system prompt, the turns' text and the tool schemas (not the attachments)."""
    turns = sum(turn_tokens(t, image_tokens=0, document_tokens=0) for t in request.turns)
    return head_tokens(request.system, request.tools) + turns


# -- responses ------------------------------------------------------------------------------------


class _SSEDecoder:
    """Server-sent events from byte chunks.

    WHATWG HTML, "Server-sent events", "Interpreting an event stream". Lines end with LF (a CR
    before it is dropped; the API sends LF); ``event:`` names the event, ``data:`` lines join with
    LF, a blank line dispatches, a line opening with ``:`` is a comment.
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._event = ""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[tuple[str, str]]:
        *lines, self._buffer = (self._buffer + chunk).split(b"\n")
        out: list[tuple[str, str]] = []
        for raw in lines:
            line = raw.removesuffix(b"\r").decode("utf-8", errors="replace")
            if not line:
                if self._data or self._event:
                    out.append((self._event or "message", "\n".join(self._data)))
                self._event, self._data = "", []
            elif not line.startswith(":"):
                name, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if name == "event":
                    self._event = value
                elif name == "data":
                    self._data.append(value)
        return out


class _Assembler:
    """One call's stream events → IR events (Streaming Messages, "Event types").

    Text and thinking deltas pass through as they arrive; a ``tool_use`` block's
    ``input_json_delta`` fragments are collected per content block index and emitted as one
    :class:`ToolCallEvent` at its ``content_block_stop``; usage (``message_start``, then cumulative
    in ``message_delta``) is emitted once, at ``message_delta``, so a stream cut before any content
    is still retried.
    """

    def __init__(self, label: str) -> None:
        self.label = label
        self.tools: dict[int, tuple[str, str, list[str]]] = {}
        self.usage: dict[str, Any] = {}
        self.broken: list[
            str
        ] = []  # tools whose input is not a JSON object (cut, if max_tokens follows)

    def feed(self, name: str, data: str) -> list[LLMEvent]:
        """Translate one event.

        Raises:
            BackendError: An ``error`` event (``overloaded_error``, ``api_error``,
                ``rate_limit_error`` and ``timeout_error`` are retryable), an event that is not
                JSON, or tool input that is not a JSON object.
        """
        if name == "ping":
            return []
        try:
            event = decode_json(data)
        except msgspec.DecodeError:
            raise BackendError(
                f"{self.label}: a malformed stream event {name!r}", retryable=True
            ) from None
        kind = event.get("type")
        if kind == "content_block_delta":
            delta = event["delta"]
            if delta["type"] == "text_delta":
                return [TextDelta(delta["text"])] if delta["text"] else []
            if delta["type"] == "thinking_delta":
                return [ThoughtDelta(delta["thinking"])] if delta["thinking"] else []
            if delta["type"] == "signature_delta":
                return [ThoughtDelta("", signature=delta["signature"].encode())]
            if delta["type"] == "input_json_delta" and event["index"] in self.tools:
                self.tools[event["index"]][2].append(delta["partial_json"])
            return []
        if kind == "content_block_start":
            block = event["content_block"]
            if block["type"] == "text":
                return [TextDelta(block["text"])] if block["text"] else []
            if block["type"] == "thinking":
                return [ThoughtDelta(block["thinking"])] if block.get("thinking") else []
            if block["type"] == "redacted_thinking":
                return [ThoughtDelta("", signature=REDACTED_PREFIX + block["data"].encode())]
            if block["type"] == "tool_use":
                initial = (
                    [msgspec.json.encode(block["input"]).decode()] if block.get("input") else []
                )
                self.tools[event["index"]] = (block["id"], block["name"], initial)
            return []
        if kind == "content_block_stop" and event["index"] in self.tools:
            call_id, tool, fragments = self.tools.pop(event["index"])
            return [ToolCallEvent(ToolCallBlock(call_id, tool, self._arguments(tool, fragments)))]
        if kind == "message_start":
            self.usage.update(event["message"].get("usage") or {})
        elif kind == "message_delta":
            self.usage.update(
                {k: v for k, v in (event.get("usage") or {}).items() if v is not None}
            )
            reason = (event.get("delta") or {}).get("stop_reason")
            stop = stop_reason_of(reason) if isinstance(reason, str) else None
            if self.broken and stop is not StopReason.MAX_TOKENS:
                raise BackendError(
                    f"{self.label}: the arguments of tool call {self.broken[0]!r} "
                    "are not a JSON object"
                )
            events: list[LLMEvent] = [UsageEvent(self._usage())]
            if stop is not None:
                events.append(StopEvent(stop, str(reason)))
            return events
        elif kind == "error":
            error = event.get("error") or {}
            etype, message = error.get("type", "error"), _one_line(str(error.get("message", "")))
            retryable = etype in (
                "overloaded_error",
                "api_error",
                "rate_limit_error",
                "timeout_error",
            )
            raise BackendError(
                f"{self.label}: stream error {etype}: {message}", retryable=retryable
            )
        return []

    def _arguments(self, tool: str, fragments: list[str]) -> dict[str, Any]:
        """The call's input; ``{"_raw": text}`` when it is not a JSON object (see :attr:`broken`).

        A reply cut at ``max_tokens`` inside a tool_use block ends it with what was streamed; the
        ``message_delta`` that follows says ``max_tokens``, and the turn runs none of its calls. Any
        other stop reason after such input is an error there.
        """
        text = "".join(fragments).strip()
        if not text:
            return {}
        try:
            arguments = decode_json(text)
        except msgspec.DecodeError:
            arguments = None
        if not isinstance(arguments, dict):
            self.broken.append(tool)
            return {"_raw": text}
        return arguments

    def _usage(self) -> Usage:
        # Prompt caching, "Tracking cache performance": input_tokens counts only the tokens after
        # the last cache breakpoint; the whole input is input + cache read + cache write.
        u = self.usage
        cache_read = u.get("cache_read_input_tokens") or 0
        details = u.get("output_tokens_details") or {}
        return Usage(
            input_tokens=(u.get("input_tokens") or 0)
            + cache_read
            + (u.get("cache_creation_input_tokens") or 0),
            output_tokens=u.get("output_tokens") or 0,
            cached_tokens=cache_read,
            thinking_tokens=details.get("thinking_tokens") or 0,
        )


def stop_reason_of(stop_reason: str) -> StopReason:
    """The IR's stop reason for a Messages API ``stop_reason``.

    ``end_turn``, ``tool_use``, ``stop_sequence``, ``pause_turn``: the model finished;
    ``max_tokens`` and ``model_context_window_exceeded``: cut at the output limit; ``refusal``:
    other (Messages API, "Handling stop reasons",
    https://docs.claude.com/en/api/handling-stop-reasons).
    """
    if stop_reason in ("max_tokens", "model_context_window_exceeded"):
        return StopReason.MAX_TOKENS
    if stop_reason in ("end_turn", "tool_use", "stop_sequence", "pause_turn"):
        return StopReason.END
    return StopReason.OTHER


# -- errors ---------------------------------------------------------------------------------------


def _body_message(body: object) -> str | None:
    """``error.message`` of an error body (Anthropic and Google Cloud errors both have it)."""
    if isinstance(body, dict):
        error = body.get("error")
        message = error.get("message") if isinstance(error, dict) else None
        if isinstance(message, str):
            return message
    return None


def _one_line(text: str) -> str:
    return " ".join(text.split())


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


__all__ = ["ClaudeLLM", "tool_loop_opens_with_thinking", "uses_adaptive_thinking"]
