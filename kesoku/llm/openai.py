"""The OpenAI-compatible backend: Chat Completions through the official ``openai`` SDK.

One backend for every server that speaks the Chat Completions API: OpenAI, Ollama, vLLM, the
llama.cpp server, LM Studio, DeepSeek. The SDK's own retries are off (``max_retries=0``):
:class:`~kesoku.llm.base.BaseLLM` retries. Wire facts come from the Chat Completions reference
(https://platform.openai.com/docs/api-reference/chat/create). Here: the SDK client, the request's
options, the stream's transport, a self-hosted server's window, and the mapping of errors (error
events inside the stream included).

The mapping of turns and tools to ``messages``, and of the streamed chunks to IR events, lives in
:mod:`kesoku.llm.openai_convert`.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

import httpx2
import openai as openai_sdk
import trio

from kesoku.llm.base import MAX_RETRIES, BaseLLM, retry_after_s
from kesoku.llm.openai_convert import _Assembler, _tool, build_messages
from kesoku.llm.windows import ask_window
from kesoku.vocab.errors import BackendError, ConfigError
from kesoku.vocab.ir import LLMEvent, LLMRequest

if TYPE_CHECKING:
    from kesoku.config.settings import Config

DEFAULT_BASE_URL = "https://api.openai.com/v1"
"""The endpoint when none is set; passed explicitly so the SDK never reads ``OPENAI_BASE_URL``."""
NO_KEY = "not-needed"
"""The key sent to a server that needs none (Ollama, vLLM, llama.cpp, LM Studio).

The SDK requires one.
"""


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
    "is_deepseek",
    "stream_error_is_retryable",
]
