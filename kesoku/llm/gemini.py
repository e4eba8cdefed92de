"""The gemini backend: Google Gemini through google-genai, by API key or on Vertex AI.

A :class:`BaseLLM` over ``client.aio.models.generate_content_stream``. The base owns retries, so the
SDK gets none (google-genai 3.6 retries nothing without ``HttpRetryOptions``). Under trio the SDK's
async client must use an httpx2 transport: with aiohttp installed it would otherwise pick aiohttp,
which needs an asyncio loop ("no running event loop" under trio). For the same reason Vertex
credentials are loaded and refreshed here, in a worker thread: the SDK would do it with
``asyncio.to_thread``.

Context caching (Gemini API, "Context caching", https://ai.google.dev/gemini-api/docs/caching): once
the part of a request that the next calls repeat (system instruction, tools and the turns before
the last user message) is estimated at ``context_caching_threshold`` tokens or more, it is stored
with ``caches.create`` and the request names it in ``cached_content``, sending only the turns after
it and no system instruction or tools (the API rejects a request that sets them beside a cache).

A cache ends on a complete turn: right before a user content that is not function responses (see
:func:`cache_end`), so the request's own ``contents`` open with the user's message. The API checks
those contents as a conversation of their own, against the turn-order rules of function calling
(Gemini API, "Function calling", https://ai.google.dev/gemini-api/docs/function-calling): contents
that open with function responses are answered 400 "function response turn comes immediately after
a function call turn" (seen from a strict validator when a cache made mid-loop ended on the model's
call), and contents that open with a function call 400 "function call turn comes immediately after
a user turn or after a function response turn". So inside a tool loop the cache made for the loop's
opening serves every step, and a longer one is made at the next user message.

A cache is used while its TTL has :data:`CACHE_MARGIN_S` left and the request starts with exactly
the turns it holds. A cache Kesoku stops using is deleted (best effort, after the next successful
stream, and at :meth:`GeminiLLM.aclose`): one a longer cache of the same prefix replaces, the least
recently used one past :data:`CACHE_SLOTS`, one whose TTL ran into the margin, and one a call
failed through (that call is repeated uncached); a cache whose conversation changed under it (a
compacted history) is left to the LRU and its TTL, as nothing tells it from another session's. A
failed cache never fails the turn: the request goes out uncached. Caching also bounds the CPU the
SDK spends on each request: it converts every part on the event loop (about 0.6 ms a part,
measured), and through a cache only the turns after it are sent.

The mapping of turns, tools, thinking levels and the stream lives in
:mod:`kesoku.llm.gemini_convert`.
"""

from __future__ import annotations

import email.utils
import itertools
import logging
import math
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import google.auth
import google.auth.exceptions as auth_errors
import httpx2
import trio
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from kesoku.llm import gemini_convert as conv
from kesoku.llm.base import MAX_RETRIES, BaseLLM
from kesoku.vocab.errors import BackendError, ConfigError
from kesoku.vocab.ir import DocumentBlock, ImageBlock, LLMEvent, LLMRequest, LLMTurn, head_tokens

if TYPE_CHECKING:
    from google.auth.credentials import Credentials

    from kesoku.config.settings import Config

log = logging.getLogger(__name__)

CACHE_TTL_S = 600
"""TTL asked for a context cache: storage is billed hourly, and a chat turn rarely waits longer."""
CACHE_MARGIN_S = 60.0
"""A cache with less TTL left than this is not used: it could expire during the request."""
CACHE_SLOTS = 4
"""Caches kept per backend (one serves every session); the least recently used is deleted."""
CACHE_PAUSE_S = 300.0
"""After a failed cache creation, requests go uncached this long.

This keeps them from failing the same way again.
"""
CACHE_DELETE_TIMEOUT_S = 10.0
"""Longest wait for deleting a replaced cache (best effort: its TTL removes it anyway)."""
CONVERTED_TURNS = 2048
"""Converted turns remembered (by digest) so a resent history is not converted again."""
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
"""The OAuth scope Vertex AI needs (Vertex AI, "Authenticate to Vertex AI")."""
# A generate call that names a cache and fails with these codes may have met a cache the server no
# longer has (403 "CachedContent not found (or permission denied)"): the call is repeated uncached.
_CACHE_MISS_CODES = frozenset({400, 403, 404})


@dataclass(frozen=True)
class GeminiInput:
    """The request as google-genai arguments, with what context caching needs.

    Attributes:
        contents: One Content per turn.
        system: The system instruction ("" for none).
        tools: The tool declarations (empty for none).
        keys: ``keys[k]`` is a digest of the model, system, tools and the first ``k`` turns; None
            when a turn had nothing to send and contents no longer match turns one to one (no
            caching).
        turn_tokens: The estimated tokens of each turn.
        head_tokens: The estimated tokens of system and tools.
    """

    contents: list[types.Content]
    system: str
    tools: list[types.Tool]
    keys: list[bytes] | None
    turn_tokens: list[int]
    head_tokens: int


@dataclass
class _Prepared:
    """What ``_build_native_input`` hands to ``_call``.

    The request, converted once the SDK types are built.
    """

    request: LLMRequest
    native: GeminiInput | None = None


@dataclass(frozen=True)
class _Cache:
    """A context cache this backend made: its name, what it holds, and until when it is used."""

    name: str
    key: bytes
    covered: int
    deadline: float


class GeminiLLM(BaseLLM):
    """Google Gemini through the official google-genai SDK.

    Args:
        model: The Gemini model id.
        api_key: The Gemini API key; required unless ``vertex``.
        vertex: Use Vertex AI with Application Default Credentials (or ``credentials``).
        project: The Google Cloud project (Vertex); None: the one ADC names.
        location: The Vertex AI region.
        credentials: Vertex credentials to use instead of ADC (tests pass a fixed token).
        base_url: Another API endpoint (a proxy, a test fake); None: Google's.
        timeout_s: The HTTP timeout of a request (each read of the stream included) and the base's
            stall timeout.
        thinking_level: ``minimal``, ``low``, ``medium`` or ``high``: a thinking budget
            (:data:`~kesoku.llm.gemini_convert.THINKING_BUDGETS_TOKENS`).
        context_caching_threshold: Estimated tokens from which the repeated prefix is cached; None:
            never cache.
        cache_ttl_s: The TTL asked for a cache.
        max_retries: As for :class:`BaseLLM`.

    Raises:
        ValueError: No API key and not ``vertex``, or an unknown thinking level.
    """

    provider: ClassVar[str] = "gemini"

    def __init__(
        self,
        *,
        model: str = "gemini-2.5-flash",
        api_key: str | None = None,
        vertex: bool = False,
        project: str | None = None,
        location: str = "us-central1",
        credentials: Credentials | None = None,
        base_url: str | None = None,
        timeout_s: float = 120.0,
        thinking_level: str = "medium",
        context_caching_threshold: int | None = 4096,
        cache_ttl_s: int = CACHE_TTL_S,
        max_retries: int = MAX_RETRIES,
    ) -> None:
        super().__init__(model, max_retries=max_retries, stall_timeout_s=timeout_s)
        if not vertex and not api_key:
            raise ValueError("gemini: an API key is needed unless vertex=True")
        if thinking_level not in conv.THINKING_BUDGETS_TOKENS:
            raise ValueError(f"gemini: unknown thinking level {thinking_level!r}")
        self.api_key = api_key
        self.vertex = vertex
        self.project = project
        self.location = location
        self.base_url = base_url
        self.timeout_s = timeout_s
        self.thinking_level = thinking_level
        self.thinking_budget_tokens = conv.thinking_budget_tokens(thinking_level, model)
        self.context_caching_threshold = context_caching_threshold
        self.cache_ttl_s = cache_ttl_s
        self._credentials = credentials
        # The client closes its HTTP client when collected: it lives as long as the backend.
        self._client: genai.Client | None = None
        self._client_lock = trio.Lock()
        self._caches: OrderedDict[str, _Cache] = OrderedDict()
        self._doomed: list[str] = []  # replaced caches, deleted after the next successful stream
        self._cache_paused_until = -math.inf
        self._ids = itertools.count(1)
        # Converted turns by digest: a session resends its history every step, and building the
        # SDK's pydantic objects costs about 75 µs a part (measured), so only new turns are
        # converted.
        self._converted: OrderedDict[bytes, types.Content | None] = OrderedDict()

    @classmethod
    def from_config(cls, config: Config) -> GeminiLLM:
        """Build the backend from the ``[gemini]`` section (env fallbacks already applied).

        Raises:
            ConfigError: ``auth_mode = "api_key"`` and no key is set.
        """
        g = config.gemini
        vertex = g.auth_mode == "vertex"
        if not vertex and g.api_key is None:
            raise ConfigError(
                "gemini.api_key: not set, and neither is GEMINI_API_KEY or GOOGLE_API_KEY "
                '(or set gemini.auth_mode = "vertex" to use Application Default Credentials)'
            )
        return cls(
            model=g.model_name,
            api_key=g.api_key,
            vertex=vertex,
            project=g.project_id,
            location=g.location,
            base_url=g.base_url,
            timeout_s=g.timeout_s,
            thinking_level=g.thinking_level,
            context_caching_threshold=g.context_caching_threshold,
        )

    # -- lifetime ---------------------------------------------------------------------------------

    async def connect(self) -> None:
        """Build the SDK client now, not at the first call (it loads TLS certificates: ~0.1 s).

        Raises:
            BackendError: Vertex credentials cannot be loaded or refreshed.
        """
        try:
            await self._ready_client()
        except BackendError:
            raise
        except Exception as exc:
            raise self._map_error(exc) from exc

    async def aclose(self) -> None:
        """Delete this backend's context caches (best effort) and close the HTTP client.

        Cancellation:
            Shielded, bounded by :data:`CACHE_DELETE_TIMEOUT_S` per cache.
        """
        client, self._client = self._client, None
        if client is None:
            return
        self._doomed.extend(self._caches)
        self._caches.clear()
        with trio.CancelScope(shield=True):
            await self._delete_doomed(client)
            await client.aio.aclose()

    # -- the template's steps ---------------------------------------------------------------------

    def _build_native_input(self, request: LLMRequest) -> _Prepared:
        # Until the SDK's types are built (in a worker thread, with the client), converting here
        # would build them on the event loop: the call converts then.
        return _Prepared(request, self._convert(request) if conv.sdk_types_built() else None)

    def _convert(self, request: LLMRequest) -> GeminiInput:
        digests = [conv.turn_digest(t) for t in request.turns]
        per_turn = [self._content_of(t, d) for t, d in zip(request.turns, digests, strict=True)]
        contents = conv.merge_contents(per_turn)
        keys = None
        if self.context_caching_threshold is not None and len(contents) == len(per_turn):
            keys = conv.prefix_keys(self.model, request.system, request.tools, digests)
        return GeminiInput(
            contents=contents,
            system=request.system,
            tools=conv.to_tools(request.tools),
            keys=keys,
            turn_tokens=[conv.turn_tokens(t) for t in request.turns],
            head_tokens=head_tokens(request.system, request.tools),
        )

    def _content_of(self, turn: LLMTurn, digest: bytes) -> types.Content | None:
        memo = self._converted
        if digest in memo:
            memo.move_to_end(digest)
            return memo[digest]
        content = conv.to_content(turn)
        # Attachments are left out: the memo would keep their bytes alive after the session moved
        # on.
        if not any(isinstance(b, ImageBlock | DocumentBlock) for b in turn.blocks):
            memo[digest] = content
            if len(memo) > CONVERTED_TURNS:
                memo.popitem(last=False)
        return content

    def _call(self, native: _Prepared) -> AsyncIterator[types.GenerateContentResponse]:
        return self._chunks(native)

    def _parse(self, raw: types.GenerateContentResponse) -> Iterable[LLMEvent]:
        return conv.events_of(raw, self._new_id)

    def _new_id(self) -> str:
        return f"gemini_{next(self._ids)}"

    # -- the call ---------------------------------------------------------------------------------

    async def _chunks(
        self, prepared: _Prepared
    ) -> AsyncGenerator[types.GenerateContentResponse, None]:
        """Stream the chunks of one call, through a context cache when one applies.

        Raises:
            BackendError: The prompt was blocked, or the model stopped with no answer (SAFETY, ...).
            genai_errors.APIError: The API refused the call (mapped by :meth:`_map_error`).
        """
        client = await self._ready_client()
        if prepared.native is None:
            prepared.native = self._convert(prepared.request)
        native = prepared.native
        cache = await self._cache_for(client, native)
        stream = self._open(client, native, cache)
        try:
            try:
                chunk = await anext(stream, None)
            except genai_errors.ClientError as exc:
                if cache is None or exc.code not in _CACHE_MISS_CODES:
                    raise
                reason = self._map_error(exc)
                log.warning(
                    "gemini: the call through cache %s failed (%s); repeating it uncached",
                    cache.name,
                    reason,
                )
                # Not used again: deleted after this stream (the server may have lost it already).
                self._retire(cache.name)
                await stream.aclose()
                stream = self._open(client, native, None)
                chunk = await anext(stream, None)
            answered = False
            while chunk is not None:
                answered = answered or conv.has_answer(chunk)
                try:
                    conv.check_refusal(chunk, answered)
                except BackendError:
                    # Read to the end first (the refusal is the last chunk): the SDK nests async
                    # generators it never closes, and one left suspended is only finalised by the
                    # garbage collector (with a ResourceWarning from trio).
                    async for _ in stream:
                        pass
                    raise
                yield chunk
                chunk = await anext(stream, None)
        finally:
            await stream.aclose()
        await self._delete_doomed(client)

    async def _open(
        self, client: genai.Client, native: GeminiInput, cache: _Cache | None
    ) -> AsyncGenerator[types.GenerateContentResponse, None]:
        config = types.GenerateContentConfig(
            system_instruction=None if cache is not None or not native.system else native.system,
            tools=None if cache is not None or not native.tools else list(native.tools),
            cached_content=None if cache is None else cache.name,
            thinking_config=types.ThinkingConfig(
                thinking_budget=self.thinking_budget_tokens, include_thoughts=True
            ),
            automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
        )
        contents = native.contents if cache is None else native.contents[cache.covered :]
        # The SDK's iterator sends the request at its first step.
        stream = await client.aio.models.generate_content_stream(
            model=self.model, contents=contents, config=config
        )
        try:
            async for chunk in stream:
                yield chunk
        finally:
            # typed as an AsyncIterator; it is an async generator
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()

    async def _ready_client(self) -> genai.Client:
        async with self._client_lock:
            if self._client is None:
                # Building the client loads TLS certificates (~0.1 s), on Vertex it may read ADC,
                # and the SDK's types are built with it (~0.3 s once per process).
                self._client = await trio.to_thread.run_sync(self._make_client)
            credentials = self._credentials
            if (
                self.vertex
                and credentials is not None
                and (credentials.expired or not credentials.token)
            ):
                await trio.to_thread.run_sync(_refresh, credentials)
            return self._client

    def _make_client(self) -> genai.Client:
        """Build the SDK client and the SDK's types (in a worker thread)."""
        conv.build_sdk_types()
        options = types.HttpOptions(
            base_url=self.base_url,
            timeout=round(self.timeout_s * 1000),  # HttpOptions.timeout is in milliseconds
            async_client_args={"transport": httpx2.AsyncHTTPTransport()},
        )
        if not self.vertex:
            return genai.Client(api_key=self.api_key, http_options=options)
        if self._credentials is None:
            credentials, project = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
            self._credentials = credentials
            self.project = self.project or project
        if not self.project:
            raise BackendError(
                "gemini: Vertex AI needs a Google Cloud project: "
                "set gemini.project_id or GOOGLE_CLOUD_PROJECT"
            )
        return genai.Client(
            vertexai=True,
            project=self.project,
            location=self.location,
            credentials=self._credentials,
            http_options=options,
        )

    # -- context caching --------------------------------------------------------------------------

    async def _cache_for(self, client: genai.Client, native: GeminiInput) -> _Cache | None:
        """The cache to send this request through: a valid one holding its prefix, or a new one.

        Returns:
            None below the threshold, when caching is paused after a failure, or when creating the
            cache failed (logged).
        """
        threshold = self.context_caching_threshold
        if threshold is None or native.keys is None:
            return None
        keys = native.keys
        now = trio.current_time()
        # The turns before the last user message: what the next calls repeat, ending on a complete
        # turn (a cache that covers target turns or fewer and holds this request's prefix does too).
        target = cache_end(native.contents)
        for entry in [e for e in self._caches.values() if e.deadline <= now]:
            del self._caches[entry.name]
            if now < entry.deadline + CACHE_MARGIN_S:  # the server still holds it for a while
                self._doomed.append(entry.name)
        best: _Cache | None = None
        for entry in self._caches.values():
            fits = entry.covered <= target and keys[entry.covered] == entry.key
            if fits and (best is None or entry.covered > best.covered):
                best = entry
        if best is not None:
            self._caches.move_to_end(best.name)
            if (
                sum(native.turn_tokens[best.covered : target]) < threshold
                or now < self._cache_paused_until
            ):
                return best
        elif (
            now < self._cache_paused_until
            or native.head_tokens + sum(native.turn_tokens[:target]) < threshold
        ):
            return None
        created = await self._create_cache(client, native, target)
        if created is None:
            return best
        if best is not None:
            self._retire(best.name)
        return created

    async def _create_cache(
        self, client: genai.Client, native: GeminiInput, covered: int
    ) -> _Cache | None:
        assert native.keys is not None
        started = trio.current_time()
        config = types.CreateCachedContentConfig(
            contents=native.contents[:covered] or None,
            system_instruction=native.system or None,
            tools=list(native.tools) or None,
            ttl=f"{self.cache_ttl_s}s",
        )
        try:
            cache = await client.aio.caches.create(model=self.model, config=config)
        except Exception as exc:
            self._cache_paused_until = trio.current_time() + CACHE_PAUSE_S
            log.warning(
                "gemini: creating a context cache failed, sending the request uncached: %s",
                self._map_error(exc),
            )
            return None
        if not cache.name:
            return None
        entry = _Cache(
            cache.name, native.keys[covered], covered, started + self.cache_ttl_s - CACHE_MARGIN_S
        )
        self._caches[entry.name] = entry
        while len(self._caches) > CACHE_SLOTS:
            self._retire(next(iter(self._caches)))
        return entry

    def _retire(self, name: str) -> None:
        self._caches.pop(name, None)
        self._doomed.append(name)

    async def _delete_doomed(self, client: genai.Client) -> None:
        while self._doomed:
            name = self._doomed.pop()
            with trio.move_on_after(CACHE_DELETE_TIMEOUT_S):
                try:
                    await client.aio.caches.delete(name=name)
                except Exception as exc:  # best effort: the TTL removes it anyway
                    log.info(
                        "gemini: deleting context cache %s failed: %s", name, conv.one_line(exc)
                    )

    # -- errors -----------------------------------------------------------------------------------

    def _map_error(self, exc: Exception) -> BackendError:
        """Map google-genai, httpx2 and google-auth exceptions to a :class:`BackendError`.

        HTTP statuses follow :class:`BackendError`: 401/403 (and a 400 whose ``ErrorInfo.reason``
        is ``API_KEY_INVALID``: the Gemini API's answer to a bad key) are auth errors; 408, 409,
        429 and 5xx are retryable, with the wait from ``retry-after`` or else from
        ``google.rpc.RetryInfo`` (AIP-193); other 4xx are not. Dropped connections, cut streams
        (``RemoteProtocolError``) and read timeouts are retryable (the SDK raises
        ``httpx2.RemoteProtocolError`` and ``httpx2.ReadTimeout`` for them).
        """
        if isinstance(exc, genai_errors.ContinuationInterruptedError) and isinstance(
            exc.__cause__, Exception
        ):
            exc = exc.__cause__
        if isinstance(exc, genai_errors.APIError):
            code = exc.code
            auth = code in (401, 403) or "API_KEY_INVALID" in conv.error_reasons(exc.details)
            retryable = code in (408, 409, 429) or code >= 500
            retry_after = _retry_after_s(exc) if retryable else None
            status = f" {exc.status}" if exc.status else ""
            message = conv.one_line(exc.message or exc.details)
            return BackendError(
                f"gemini: HTTP {code}{status}: {message}",
                retryable=retryable,
                status=code,
                retry_after_s=retry_after,
                auth=auth,
            )
        if isinstance(
            exc, httpx2.TimeoutException | httpx2.NetworkError | httpx2.RemoteProtocolError
        ):
            return BackendError(
                f"gemini: connection failed: {type(exc).__name__}: {conv.one_line(exc)}",
                retryable=True,
            )
        if isinstance(exc, genai_errors.UnknownApiResponseError):  # a garbled (cut) stream
            return BackendError(
                f"gemini: unreadable response: {conv.one_line(exc)}", retryable=True
            )
        if isinstance(exc, auth_errors.DefaultCredentialsError | auth_errors.RefreshError):
            return BackendError(f"gemini: Vertex AI credentials: {conv.one_line(exc)}", auth=True)
        if isinstance(exc, auth_errors.TransportError):
            return BackendError(
                f"gemini: Vertex AI credentials: {conv.one_line(exc)}", retryable=True
            )
        return BackendError(f"gemini: {type(exc).__name__}: {conv.one_line(exc)}")


def cache_end(contents: Sequence[types.Content]) -> int:
    """How many leading contents a context cache of this request may hold.

    The index of the last user content after the first that holds no function response: the
    user's message that opened the current turn, or the one just sent. A cache of the contents
    before it ends on a complete turn, and the request's own contents open with that message, as
    the API requires of them (see the module docstring). 0 when there is none: the cache then holds
    the system instruction and tools only.
    """
    for k in range(len(contents) - 1, 0, -1):
        content = contents[k]
        if content.role == "user" and not any(
            p.function_response is not None for p in content.parts or ()
        ):
            return k
    return 0


def _refresh(credentials: Credentials) -> None:
    """Refresh an OAuth token (blocking HTTP: run in a worker thread)."""
    import google.auth.transport.requests

    credentials.refresh(google.auth.transport.requests.Request())  # type: ignore[no-untyped-call]


def _retry_after_s(exc: genai_errors.APIError) -> float | None:
    """The wait a refused call asks for: ``retry-after``, else ``RetryInfo``.

    ``retry-after`` holds seconds or an HTTP date.
    """
    headers: Any = getattr(exc.response, "headers", None)
    value = headers.get("retry-after") if headers is not None else None
    if value:
        try:
            return max(0.0, float(value))
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError):
                when = None
            if when is not None:
                return max(0.0, when.timestamp() - time.time())
    return conv.retry_delay_s(exc.details)


__all__ = ["CACHE_TTL_S", "GeminiInput", "GeminiLLM", "cache_end"]
