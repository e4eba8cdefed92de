"""The OpenAI-compatible backend: Chat Completions through the official ``openai`` SDK.

One backend for every server that speaks the Chat Completions API: OpenAI, Ollama, vLLM, the
llama.cpp server, LM Studio, DeepSeek. The SDK's own retries are off (``max_retries=0``):
:class:`~kesoku.llm.base.BaseLLM` retries. Wire facts come from the Chat Completions reference
(https://platform.openai.com/docs/api-reference/chat/create) and its streaming chunk object
(https://platform.openai.com/docs/api-reference/chat-streaming).

Mapping of the IR:

- ``system`` → a ``system`` message first (left out when empty).
- user turns: each :class:`ToolResultBlock` → a ``tool`` message, right after the assistant message
  that made the call and before any user text; the rest → one ``user`` message, a plain string when
  it is only text, a parts list (``text`` and ``image_url`` with a data URL) when it holds images.
  Text documents (``text/*``, JSON, YAML, XML, TOML) go inline as text; any other file (a PDF) is
  replaced by a one-line note saying it was not sent, so the model knows it was there.
- assistant turns: the text → ``content``, :class:`ToolCallBlock` → ``tool_calls`` with the
  arguments as compact JSON strings. Thoughts are not sent back, except to DeepSeek, whose thinking
  mode answers 400 unless an assistant message that made tool calls carries its
  ``reasoning_content`` (DeepSeek API docs, "Thinking Mode": "For turns that do perform tool calls,
  the reasoning_content must be fully passed back to the API in all subsequent requests").

Streaming: ``reasoning_content`` (DeepSeek, vLLM) or ``reasoning`` (Ollama, OpenRouter) deltas
become :class:`ThoughtDelta`; tool calls are assembled per stream (see :class:`_Assembler` for the
styles servers use) and emitted when a ``finish_reason`` arrives, or at the end of the stream.
"""

from __future__ import annotations

import base64
import contextlib
import re
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

import httpx2
import msgspec
import openai as openai_sdk
import trio

from kesoku.llm.base import MAX_RETRIES, BaseLLM, retry_after_s
from kesoku.llm.windows import ask_window
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
)
from kesoku.vocab.model import Usage
from kesoku.vocab.text import decode_json

if TYPE_CHECKING:
    from kesoku.config.settings import Config

DEFAULT_BASE_URL = "https://api.openai.com/v1"
"""The endpoint when none is set; passed explicitly so the SDK never reads ``OPENAI_BASE_URL``."""
NO_KEY = "not-needed"
"""The key sent to a server that needs none (Ollama, vLLM, llama.cpp, LM Studio).

The SDK requires one.
"""
IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
"""Image types the API reads (Images and vision, "Image input requirements")."""
TEXT_APPLICATION_TYPES = frozenset(
    {
        "application/json",
        "application/xml",
        "application/yaml",
        "application/x-yaml",
        "application/toml",
        "application/x-toml",
    }
)
"""Non-``text/*`` types of a document that is sent inline as text."""
NO_OUTPUT = "(no output)"
"""The content of a tool message whose result is empty (a tool message needs content)."""


class OpenAILLM(BaseLLM):
    """A Chat Completions server through the ``openai`` SDK, streaming.

    Args:
        model: The model id as the server knows it.
        api_key: The API key; None with a ``base_url``: a server that needs none.
        base_url: The server, up to and including ``/v1``; None: OpenAI.
        timeout_s: The SDK's request timeout (connect, read, write).
        max_retries: Retries of a retryable failure (by the base; the SDK's are off).
        stall_timeout_s: Longest silence between two stream chunks; None: ``timeout_s``.
        send_reasoning: Send thoughts back as ``reasoning_content`` on assistant messages that made
            tool calls; None: on when the host is DeepSeek's.

    Raises:
        ConfigError: Neither an API key nor a base URL is given.
    """

    provider: ClassVar[str] = "openai"

    def __init__(
        self,
        *,
        model: str,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout_s: float = 120.0,
        max_retries: int = MAX_RETRIES,
        stall_timeout_s: float | None = None,
        send_reasoning: bool | None = None,
    ) -> None:
        super().__init__(
            model,
            max_retries=max_retries,
            stall_timeout_s=timeout_s if stall_timeout_s is None else stall_timeout_s,
        )
        if not api_key and not base_url:
            raise ConfigError(
                "openai.api_key: not set (nor OPENAI_API_KEY); set it, "
                "or set openai.base_url to a server "
                "that needs no key (Ollama, vLLM, llama.cpp, LM Studio)"
            )
        self.api_key = api_key or NO_KEY
        self.base_url = base_url or DEFAULT_BASE_URL
        self.timeout_s = timeout_s
        self.send_reasoning = (
            is_deepseek(self.base_url) if send_reasoning is None else send_reasoning
        )
        self._client: openai_sdk.AsyncOpenAI | None = None
        self._client_lock = trio.Lock()

    @classmethod
    def from_config(cls, config: Config) -> OpenAILLM:
        """Build the backend from ``[openai]``.

        Raises:
            ConfigError: Neither ``openai.api_key`` (nor ``OPENAI_API_KEY``) nor ``openai.base_url``
                is set.
        """
        section = config.openai
        return cls(
            model=section.model_name,
            api_key=section.api_key,
            base_url=section.base_url,
            timeout_s=section.timeout_s,
        )

    # -- the SDK client ---------------------------------------------------------------------------

    async def client(self) -> openai_sdk.AsyncOpenAI:
        """The SDK client, created on first use in a worker thread.

        Creating it loads the system's CA certificates (30–250 ms), and the first request imports
        the chat resources and checks the platform: all of it happens here, off the event loop.
        """
        async with self._client_lock:
            if self._client is None:
                self._client = await trio.to_thread.run_sync(self._new_client)
            return self._client

    def _new_client(self) -> openai_sdk.AsyncOpenAI:
        client = openai_sdk.AsyncOpenAI(
            api_key=self.api_key, base_url=self.base_url, timeout=self.timeout_s, max_retries=0
        )
        _warm_sdk(client)
        with contextlib.suppress(Exception):
            # The SDK resolves the platform on its first request in a worker thread; resolve it in
            # this one.
            from openai._base_client import get_platform

            client._platform = get_platform()
        return client

    async def aclose(self) -> None:
        """Close the SDK's HTTP connections (its cleanup at garbage collection needs asyncio)."""
        client, self._client = self._client, None
        if client is not None:
            await client.close()
        else:
            await trio.lowlevel.checkpoint()

    # -- the template's steps ---------------------------------------------------------------------

    def _build_native_input(self, request: LLMRequest) -> dict[str, Any]:
        native: dict[str, Any] = {
            "model": self.model,
            "messages": build_messages(
                request.system, request.turns, send_reasoning=self.send_reasoning
            ),
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            native["tools"] = [_tool(spec) for spec in request.tools]
        return native

    async def _call(self, native: dict[str, Any]) -> AsyncIterator[tuple[LLMEvent, ...]]:
        """Stream the response: one tuple of IR events per chunk.

        An empty tuple keeps the stall timer alive. The assembler lives here, so each stream has its
        own tool-call state. The SDK's stream stops reading at ``data: [DONE]`` without closing its
        inner async generators; trio closes them at garbage collection with a ResourceWarning
        (harmless; ignored by Python's default filters).
        """
        client = await self.client()
        assembler = _Assembler()
        stream = await client.chat.completions.create(**native, stream=True)
        async with stream:
            while True:
                try:
                    chunk = await stream.__anext__()
                except StopAsyncIteration:
                    break
                yield tuple(assembler.feed(chunk))
        rest = assembler.finish()
        if rest:
            yield tuple(rest)

    def _parse(self, raw: tuple[LLMEvent, ...]) -> Iterable[LLMEvent]:
        return raw

    async def _discover_window(self) -> int | None:
        """Ask a self-hosted server (llama.cpp, Ollama, vLLM) for the window.

        See :mod:`kesoku.llm.windows`. OpenAI's own API reports no window; its models are in the
        built-in table.
        """
        if self.base_url.rstrip("/") == DEFAULT_BASE_URL:
            await trio.lowlevel.checkpoint()
            return None
        return await ask_window(await self.client(), self.base_url, self.model)

    def _map_error(self, exc: Exception) -> BackendError:
        """Classify an SDK error (Error codes: https://platform.openai.com/docs/guides/error-codes).

        HTTP 401/403 are the operator's to fix; 408, 409, 429 and 5xx are retried, honouring
        ``retry-after-ms`` or ``retry-after`` (seconds or an HTTP date); other 4xx are final.
        Connection failures, timeouts and a stream cut mid-way (``APIConnectionError``) are retried;
        an error event inside the stream is retried when it names a server error, an overload or a
        rate limit.
        """
        label = self.provider
        if isinstance(exc, openai_sdk.APIStatusError):
            status = exc.status_code
            kind = _error_field(exc.body, "type") or _error_field(exc.body, "code")
            message = _one_line(
                _error_field(exc.body, "message") or _body_text(exc.body) or exc.message
            )
            auth = status in (401, 403)
            retryable = status in (408, 409, 429) or status >= 500
            text = f"{label}: HTTP {status}{f' {kind}' if kind else ''}: {message}"
            wait_s = retry_after_s(exc.response.headers) if retryable else None
            return BackendError(
                text, retryable=retryable, status=status, retry_after_s=wait_s, auth=auth
            )
        if isinstance(exc, openai_sdk.APITimeoutError):
            return BackendError(
                f"{label}: no response within {self.timeout_s:g} s (timed out)", retryable=True
            )
        if isinstance(exc, openai_sdk.APIConnectionError):
            cause = exc.__cause__
            reason = (
                f" ({type(cause).__name__}: {_one_line(str(cause))})" if cause is not None else ""
            )
            return BackendError(f"{label}: connection lost{reason}", retryable=True)
        if isinstance(exc, openai_sdk.APIError):  # an error event inside the stream
            kind = _error_field(exc.body, "type") or _error_field(exc.body, "code")
            message = _one_line(
                _error_field(exc.body, "message") or _body_text(exc.body) or exc.message
            )
            retryable = stream_error_is_retryable(kind, message)
            return BackendError(
                f"{label}: stream error{f' {kind}' if kind else ''}: {message}", retryable=retryable
            )
        if isinstance(exc, httpx2.TransportError):
            return BackendError(
                f"{label}: connection lost ({type(exc).__name__}: {_one_line(str(exc))})",
                retryable=True,
            )
        return super()._map_error(exc)


def is_deepseek(base_url: str) -> bool:
    """Whether a base URL is DeepSeek's API (``deepseek.com`` or a subdomain)."""
    host = (urlsplit(base_url).hostname or "").lower()
    return host == "deepseek.com" or host.endswith(".deepseek.com")


# -- requests -------------------------------------------------------------------------------------


def build_messages(
    system: str, turns: Sequence[LLMTurn], *, send_reasoning: bool = False
) -> list[dict[str, Any]]:
    """The ``messages`` of a request: the system prompt, then each turn's messages in order."""
    messages: list[dict[str, Any]] = []
    if system.strip():
        messages.append({"role": "system", "content": system})
    for turn in turns:
        if turn.role == "assistant":
            message = _assistant_message(turn.blocks, send_reasoning)
            if message is not None:
                messages.append(message)
        else:
            messages.extend(_user_messages(turn.blocks))
    return messages


def _user_messages(blocks: Sequence[Any]) -> list[dict[str, Any]]:
    """Tool messages for the results, then one user message for the rest (if any)."""
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for block in blocks:
        if isinstance(block, ToolResultBlock):
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": block.call_id,
                    "content": block.content or NO_OUTPUT,
                }
            )
        elif isinstance(block, TextBlock):
            if block.text.strip():
                parts.append({"type": "text", "text": block.text})
        elif isinstance(block, ImageBlock):
            parts.append(_image(block))
        elif isinstance(block, DocumentBlock):
            parts.append({"type": "text", "text": _document_text(block)})
    if parts:
        if all(p["type"] == "text" for p in parts):
            out.append({"role": "user", "content": "\n\n".join(p["text"] for p in parts)})
        else:
            out.append({"role": "user", "content": parts})
    return out


def _image(block: ImageBlock) -> dict[str, Any]:
    if block.mime_type not in IMAGE_TYPES or not block.data:
        why = "empty" if block.mime_type in IMAGE_TYPES else "an image type this API cannot read"
        return {"type": "text", "text": _note(block.path, block.mime_type, why)}
    url = f"data:{block.mime_type};base64,{base64.b64encode(block.data).decode('ascii')}"
    return {"type": "image_url", "image_url": {"url": url}}


def is_text_type(mime_type: str) -> bool:
    """Whether a document of this type is sent inline as text (text/*, JSON, YAML, XML, TOML)."""
    mime = mime_type.split(";", 1)[0].strip().lower()
    return (
        mime.startswith("text/")
        or mime in TEXT_APPLICATION_TYPES
        or mime.endswith(("+json", "+xml", "+yaml"))
    )


def _document_text(block: DocumentBlock) -> str:
    name = block.filename or block.path
    if not is_text_type(block.mime_type):
        return _note(
            name, block.mime_type, "not sent (this backend sends images and text files only)"
        )
    try:
        text = block.data.decode("utf-8")
    except UnicodeDecodeError:
        return _note(name, block.mime_type, "not sent (not UTF-8 text)")
    if not text.strip():
        return _note(name, block.mime_type, "empty")
    return f"[attachment {name} ({block.mime_type})]\n{text}\n[end of {name}]"


def _note(name: str, mime_type: str, why: str) -> str:
    return f"[attachment {name} ({mime_type}): {why}]"


def _assistant_message(blocks: Sequence[Any], send_reasoning: bool) -> dict[str, Any] | None:
    texts = [b.text for b in blocks if isinstance(b, TextBlock) and b.text.strip()]
    calls = [b for b in blocks if isinstance(b, ToolCallBlock)]
    if not texts and not calls:
        return None
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "\n\n".join(texts) if texts else None,
    }
    if calls:
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {
                    "name": call.name,
                    "arguments": msgspec.json.encode(call.arguments).decode(),
                },
            }
            for call in calls
        ]
        if send_reasoning:  # DeepSeek: required on these messages, even when empty
            message["reasoning_content"] = "".join(
                b.text for b in blocks if isinstance(b, ThoughtBlock)
            )
    return message


def _tool(spec: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters,
        },
    }


# -- responses ------------------------------------------------------------------------------------


class _PendingCall:
    __slots__ = ("arguments", "fragments", "id", "name")

    def __init__(self, call_id: str) -> None:
        self.id = call_id
        self.name = ""
        self.fragments: list[str] = []
        self.arguments: dict[str, Any] | None = (
            None  # a server that sends an object instead of a string
        )


class _Assembler:
    """One stream's chunks → IR events.

    Tool-call styles handled: OpenAI's fragments keyed by ``index`` (interleaved across calls or
    not; the id and name come with the first fragment only); a whole call in one delta (Ollama); the
    id repeated on every fragment; index 0 (or no index) for every call, told apart by distinct ids;
    no id at all (one is generated, unique). Calls are emitted, in the order they began, when a
    ``finish_reason`` arrives (whatever its value: some servers say ``stop`` after tool calls), or
    at the end of the stream when none comes.
    """

    def __init__(self) -> None:
        self.calls: list[_PendingCall] = []
        self.by_id: dict[str, _PendingCall] = {}
        self.by_index: dict[int | None, _PendingCall] = {}

    def feed(self, chunk: Any) -> list[LLMEvent]:
        """Translate one ``chat.completion.chunk``."""
        events: list[LLMEvent] = []
        for choice in getattr(chunk, "choices", None) or ():
            if (getattr(choice, "index", 0) or 0) != 0:
                continue
            delta = getattr(choice, "delta", None)
            if delta is not None:
                thought = _field(delta, "reasoning_content") or _field(delta, "reasoning")
                if isinstance(thought, str) and thought:
                    events.append(ThoughtDelta(thought))
                content = _field(delta, "content")
                if isinstance(content, str) and content:
                    events.append(TextDelta(content))
                for fragment in _field(delta, "tool_calls") or ():
                    self._add(fragment)
            if finish := getattr(choice, "finish_reason", None):
                events.extend(self.finish())
                events.append(StopEvent(stop_reason_of(str(finish)), str(finish)))
        usage = getattr(chunk, "usage", None)
        if usage is not None:
            events.append(UsageEvent(_usage(usage)))
        return events

    def finish(self) -> list[LLMEvent]:
        """Emit the calls assembled so far."""
        events: list[LLMEvent] = [
            ToolCallEvent(
                ToolCallBlock(c.id, c.name, c.arguments or decode_arguments("".join(c.fragments)))
            )
            for c in self.calls
        ]
        self.calls, self.by_id, self.by_index = [], {}, {}
        return events

    def _add(self, fragment: Any) -> None:
        index = _field(fragment, "index")
        call_id = _field(fragment, "id") or None
        function = _field(fragment, "function")
        name = _field(function, "name") if function is not None else None
        arguments = _field(function, "arguments") if function is not None else None
        if call_id is not None:
            call = self.by_id.get(call_id)
        else:
            call = self.by_index.get(index)
            if (
                call is not None
                and name
                and call.name
                and (call.fragments or call.arguments is not None)
            ):
                call = None  # a second whole call without an id at the same index
        if call is None:
            call = _PendingCall(call_id or f"call_{uuid.uuid4().hex[:24]}")
            self.calls.append(call)
            if call_id is not None:
                self.by_id[call_id] = call
        self.by_index[index] = call
        if name and not call.name:
            call.name = name
        if isinstance(arguments, str):
            call.fragments.append(arguments)
        elif isinstance(arguments, dict):
            call.arguments = arguments


def stop_reason_of(finish_reason: str) -> StopReason:
    """The IR's stop reason for a ``finish_reason``.

    Chat Completions: ``stop``, ``length`` (the output limit: ``max_tokens``, or the context),
    ``tool_calls``, ``content_filter``, ``function_call``
    (https://platform.openai.com/docs/api-reference/chat/object); Ollama and the llama.cpp server
    send ``length`` when ``num_predict`` / ``n_predict`` or the context ends the reply.
    """
    if finish_reason == "length":
        return StopReason.MAX_TOKENS
    if finish_reason in ("stop", "tool_calls", "function_call", "eos"):
        return StopReason.END
    return StopReason.OTHER


def decode_arguments(text: str) -> dict[str, Any]:
    """A call's arguments from its JSON.

    ``{}`` when empty, ``{"_raw": text}`` when not a JSON object. A JSON string that holds the
    object (some servers encode twice) is decoded once more.
    """
    text = text.strip()
    if not text:
        return {}
    try:
        value = decode_json(text)
        if isinstance(value, str):
            value = decode_json(value)
    except msgspec.DecodeError:
        return {"_raw": text}
    if value is None:
        return {}
    return value if isinstance(value, dict) else {"_raw": text}


def _usage(usage: Any) -> Usage:
    prompt_details = _field(usage, "prompt_tokens_details")
    completion_details = _field(usage, "completion_tokens_details")
    return Usage(
        input_tokens=_field(usage, "prompt_tokens") or 0,
        output_tokens=_field(usage, "completion_tokens") or 0,
        cached_tokens=_field(prompt_details, "cached_tokens") or 0,
        thinking_tokens=_field(completion_details, "reasoning_tokens") or 0,
    )


def _field(obj: Any, name: str) -> Any:
    """A field of an SDK model (declared or extra) or of a plain dict; None when absent."""
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


# -- errors ---------------------------------------------------------------------------------------

_RETRYABLE_STREAM_ERROR = re.compile(
    r"server.?error|internal.?(?:server.?)?error|overload|rate.?limit|too many requests"
    r"|unavailable|capacity",
    re.I,
)
MAX_ERROR_CHARS = 300
"""A server's error message is cut to this length (a proxy may answer with a whole HTML page)."""


def stream_error_is_retryable(kind: str | None, message: str) -> bool:
    """Whether an error event inside a stream names a server error, an overload or a rate limit.

    A numeric type or code (some servers put the HTTP status there) counts when it is 408, 429 or
    5xx.
    """
    if kind is not None and re.fullmatch(r"408|429|5\d\d", kind.strip()):
        return True
    return bool(_RETRYABLE_STREAM_ERROR.search(f"{kind or ''} {message}"))


def _error_field(body: object, name: str) -> str | None:
    """A field of an error body.

    The SDK passes ``body["error"]``, a stream error passes its ``error``.
    """
    if isinstance(body, dict):
        inner = body.get("error")
        source = inner if isinstance(inner, dict) else body
        value = source.get(name)
        if value is not None and value != "":
            return str(value)
    return None


def _body_text(body: object) -> str | None:
    if isinstance(body, str) and body.strip():
        return body
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return str(body["error"])
    return None


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MAX_ERROR_CHARS else line[: MAX_ERROR_CHARS - 1] + "…"


def _warm_sdk(client: openai_sdk.AsyncOpenAI) -> None:
    """Do, off the event loop, what the SDK otherwise does lazily on the first request.

    The chat resources and chunk types are imported on first access, and anyio loads its trio
    backend on first use.
    """
    with contextlib.suppress(Exception):
        _ = client.chat.completions
        from openai._models import construct_type
        from openai.types.chat import ChatCompletionChunk

        chunk = {
            "id": "warm-up",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "warm-up",
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [{"index": 0, "function": {}}],
                    },
                    "finish_reason": None,
                }
            ],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }
        construct_type(type_=ChatCompletionChunk, value=chunk)
    with contextlib.suppress(ImportError):
        import anyio._backends._trio  # noqa: F401


__all__ = [
    "OpenAILLM",
    "build_messages",
    "decode_arguments",
    "is_deepseek",
    "stop_reason_of",
    "stream_error_is_retryable",
]
