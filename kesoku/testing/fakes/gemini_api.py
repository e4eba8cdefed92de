"""A wire-level fake of the Gemini API (and its Vertex AI paths) for google-genai to talk to.

Serve ``GeminiFake().app`` with :func:`kesoku.testing.fakes.server.serve_app`. It answers:

- ``POST /{v1,v1beta,v1beta1}/models/{model}:streamGenerateContent?alt=sse`` (and
  ``:generateContent``) and the Vertex form
  ``/{version}/projects/{p}/locations/{l}/publishers/google/models/{model}:...``;
- ``POST .../cachedContents``, ``GET``/``DELETE .../cachedContents/{id}`` on both.

Each generate call takes the next scripted :class:`~kesoku.testing.fakes.gemini_replies.Reply`
(else asks ``handler``): SSE events of ``GenerateContentResponse`` JSON, an HTTP error, a stream
cut after some events, or an error event in the stream. Requests are first checked against the
API's documented rules and a broken rule is answered like the real API, with ``400 {"error":
{"code": 400, "message": ..., "status": "INVALID_ARGUMENT"}}`` (Gemini API, "Function calling" and
"Thought signatures"; the message texts are the API's own where known):

- contents present; roles ``user`` or ``model``; no empty ``parts``; each part sets one data field;
  no empty text; inline data with a MIME type and base64 data;
- function calls only in model contents, responses only in user contents; a model content with N
  function calls is followed by a user content holding N function responses with the same names (and
  ids, where the call had one) in the same order; a response content follows a call content;
- thought signatures: every signature sent must be one this fake issued, byte for byte (or the
  documented placeholder); when thinking is on, the first function call of each model step of the
  current turn carries one if the fake issued one for it (always, for ``gemini-3*`` models);
- contents do not open with a function call (the API answers "function call turn comes immediately
  after a user turn or after a function response turn" when history starts with one);
- ``cachedContent`` names a live cache of the same model, and the request then sets no
  ``systemInstruction``, ``tools`` or ``toolConfig``; the cache's contents and the request's make a
  valid conversation, and the request's own contents do too (a strict validator: they may not open
  with the function responses to calls the cache ends with);
- API key (``x-goog-api-key``) on Gemini API paths, a bearer token on Vertex paths.

``POST /token`` stands in for Google's OAuth token endpoint (RFC 6749 §5.1 response), so Vertex
credentials can be refreshed against the fake.

google-genai writes some keys in snake case (``parameters_json_schema``, ``thinking_config``
fields); proto JSON accepts both spellings, and so does this fake.
"""

from __future__ import annotations

import importlib
import itertools
import json
import re
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from kesoku.testing.fakes.gemini_replies import Reply, error_body, unb64
from kesoku.testing.fakes.server import Recorded, RequestLog

# Starlette's streaming response imports anyio's trio backend at its first use (about 30 ms of CPU):
# imported here, so that never happens inside a test's event loop (the blocking detector would fail
# it).
importlib.import_module("anyio._backends._trio")

PLACEHOLDER_SIGNATURE = b"skip_thought_signature_validator"
_VERSION = r"/(?:v1|v1beta|v1beta1)"
_VERTEX = r"/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)"
_GENERATE = re.compile(
    rf"{_VERSION}(?:{_VERTEX}/publishers/google)?/models/(?P<model>[^/:]+)"
    r":(?P<method>streamGenerateContent|generateContent)"
)
_CACHES = re.compile(rf"{_VERSION}(?:{_VERTEX})?/cachedContents(?:/(?P<cache>[^/]+))?")
_DATA_FIELDS = (
    "text",
    "inlineData",
    "functionCall",
    "functionResponse",
    "fileData",
    "executableCode",
    "codeExecutionResult",
)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]{0,63}")
MISSING_SIGNATURE = (
    "Function call is missing a thought_signature in functionCall parts. This is required for "
    "tools to work correctly, and missing thought_signature may lead to degraded model "
    "performance. Additional data, function call `{name}` , position {position}. Please refer to "
    "https://ai.google.dev/gemini-api/docs/thought-signatures for more details."
)


# -- the fake -------------------------------------------------------------------------------------


class _StreamCut(Exception):
    """Raised inside a streaming body so the server drops the connection mid-stream."""


class _Invalid(Exception):
    def __init__(
        self, message: str, code: int = 400, details: Iterable[dict[str, Any]] = ()
    ) -> None:
        super().__init__(message)
        self.code = code
        self.details = list(details)


@dataclass
class CachedContent:
    """A cache the fake holds."""

    name: str
    model: str
    contents: list[dict[str, Any]]
    system: dict[str, Any] | None
    tools: list[dict[str, Any]] | None
    expires_at: float
    tokens: int


Handler = Callable[[dict[str, Any]], Reply]


class GeminiFake:
    """The fake API: scripted replies, recorded requests, enforced rules.

    Args:
        replies: Replies to generate calls, in order.
        handler: Decides the reply from the request body once ``replies`` is used up.
        api_keys: Keys accepted on Gemini API paths (None: any non-empty key).
        min_cache_tokens: The smallest cache accepted (estimated at 4 characters a token of its
            JSON); the real minimum is model-dependent (1024 or more).
        verify_signatures: Refuse signatures the fake did not issue.
        count_tokens: Report the prompt's own token counts in each reply's ``usageMetadata``
            (``promptTokenCount``, the cached part included, and ``cachedContentTokenCount``, the
            tokens of the cache named), whatever the reply scripted; counted like caches, at 4
            characters a token of the JSON of contents, system instruction and tools. Only the
            explicit context cache is counted, not implicit caching.

    Attributes:
        log: Every request received.
        cache_failures: Replies to the next cache creations (injected failures), before any check.
        caches: The live caches by name.
        deleted: The names of the caches deleted, in order.
        issued: Every signature streamed (and the placeholder).
    """

    def __init__(
        self,
        replies: Iterable[Reply] = (),
        *,
        handler: Handler | None = None,
        api_keys: Iterable[str] | None = ("test-key",),
        min_cache_tokens: int = 0,
        verify_signatures: bool = True,
        count_tokens: bool = False,
    ) -> None:
        self.replies: deque[Reply] = deque(replies)
        self.handler = handler
        self.api_keys = None if api_keys is None else set(api_keys)
        self.min_cache_tokens = min_cache_tokens
        self.verify_signatures = verify_signatures
        self.count_tokens = count_tokens
        self.counted: list[tuple[int, int]] = []
        """``(promptTokenCount, cachedContentTokenCount)`` of each reply, with ``count_tokens``."""
        self.log = RequestLog()
        self.cache_failures: deque[Reply] = deque()
        self.caches: dict[str, CachedContent] = {}
        self.deleted: list[str] = []
        self.issued: set[bytes] = {PLACEHOLDER_SIGNATURE}
        self._issued_for_call: dict[str, bytes] = {}
        self.tokens_issued = 0
        self._ids = itertools.count(1)
        self.app = Starlette(
            routes=[
                Route("/{path:path}", self._dispatch, methods=["GET", "POST", "DELETE", "PATCH"])
            ]
        )

    # -- what tests read ------------------------------------------------------------------------

    @property
    def generate_calls(self) -> list[Recorded]:
        """The generate requests received, in order."""
        return [r for r in self.log.requests if "enerateContent" in r.path]

    @property
    def cache_calls(self) -> list[Recorded]:
        """The context-cache requests received (create, get, delete), in order."""
        return [r for r in self.log.requests if "/cachedContents" in r.path]

    def push(self, *replies: Reply) -> None:
        """Queue replies to generate calls, one per call."""
        self.replies.extend(replies)

    def issue(self, *signatures: bytes) -> None:
        """Accept these signatures as the fake's own (for hand-built histories)."""
        self.issued.update(signatures)

    def issue_for_call(self, name: str, args: dict[str, Any], signature: bytes) -> None:
        """Act as if the fake had streamed this call with this signature (so it must come back)."""
        self.issued.add(signature)
        self._issued_for_call[_call_key({"name": name, "args": args})] = signature

    # -- dispatch -------------------------------------------------------------------------------

    async def _dispatch(self, request: Request) -> Response:
        rec = await self.log.record(request)
        if (
            rec.path == "/token"
        ):  # Google's OAuth token endpoint, for credentials refreshed by the backend
            self.tokens_issued += 1
            token = f"fresh-token-{self.tokens_issued}"
            return JSONResponse({"access_token": token, "expires_in": 3600, "token_type": "Bearer"})
        try:
            vertex = "/projects/" in rec.path
            self._check_auth(rec, vertex)
            if match := _GENERATE.fullmatch(rec.path):
                if request.method != "POST":
                    raise _Invalid("Method not allowed", 405)
                return await self._generate(
                    rec, match["model"], stream=match["method"] == "streamGenerateContent"
                )
            if match := _CACHES.fullmatch(rec.path):
                prefix = rec.path.split("/cachedContents")[0].split("/", 2)[2] if vertex else ""
                return self._caches(rec, match["cache"], prefix)
            raise _Invalid(f"The requested URL {rec.path} was not found on this server.", 404)
        except _Invalid as exc:
            return JSONResponse(
                error_body(exc.code, str(exc), details=exc.details), status_code=exc.code
            )

    def _check_auth(self, rec: Recorded, vertex: bool) -> None:
        if vertex:
            if not rec.headers.get("authorization", "").startswith("Bearer "):
                raise _Invalid("Request is missing required authentication credential.", 401)
            return
        key = rec.headers.get("x-goog-api-key") or rec.query.get("key")
        if not key:
            raise _Invalid("Method doesn't allow unregistered callers. Please use an API Key.", 403)
        if self.api_keys is not None and key not in self.api_keys:
            info = {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": "API_KEY_INVALID",
                "domain": "googleapis.com",
                "metadata": {"service": "generativelanguage.googleapis.com"},
            }
            raise _Invalid("API key not valid. Please pass a valid API key.", details=[info])

    # -- generate -------------------------------------------------------------------------------

    async def _generate(self, rec: Recorded, model: str, *, stream: bool) -> Response:
        body = rec.body if isinstance(rec.body, dict) else {}
        contents = _get(body, "contents") or []
        if not isinstance(contents, list) or not contents:
            raise _Invalid("* GenerateContentRequest.contents: contents is not specified")
        history = contents
        cache_name = _get(body, "cachedContent")
        cached_tokens = 0
        if cache_name:
            for key in ("systemInstruction", "tools", "toolConfig"):
                if _get(body, key) is not None:
                    raise _Invalid(
                        "CachedContent can not be used with GenerateContent request setting "
                        "system_instruction, tools or tool_config.\n\nProposed fix: move those "
                        "values to CachedContent from GenerateContent request."
                    )
            cache = self._live_cache(cache_name)
            if cache.model != model:
                raise _Invalid(
                    f"Model used by GenerateContent request (models/{model}) and CachedContent "
                    f"(models/{cache.model}) has to be the same."
                )
            # The request's own contents are a conversation of their own: they may not open with
            # the function responses (or calls) of a step the cache ends in.
            self._check_contents(contents, "GenerateContentRequest.contents")
            history = [*cache.contents, *contents]
            cached_tokens = cache.tokens
        else:
            self._check_system(_get(body, "systemInstruction"))
            self._check_tools(_get(body, "tools"))
        self._check_contents(history, "GenerateContentRequest.contents")
        self._check_signatures(history, model, _thinking_on(body, model))
        scripted = (
            self.replies.popleft() if self.replies else self.handler(body) if self.handler else None
        )
        if scripted is None:
            raise _Invalid("gemini fake: no reply scripted for this request")
        if scripted.status != 200:
            body = scripted.body or error_body(scripted.status, "error")
            return JSONResponse(body, scripted.status, scripted.headers)
        if self.count_tokens:
            own = _tokens(
                [contents, _get(body, "systemInstruction"), _get(body, "tools")]
                if not cache_name
                else [contents, None, None]
            )
            scripted = _with_prompt_tokens(scripted, cached_tokens + own, cached_tokens)
            self.counted.append((cached_tokens + own, cached_tokens))
        self._issue(scripted.chunks)
        if not stream:
            return JSONResponse(_merge(scripted.chunks), headers=scripted.headers)
        return StreamingResponse(
            self._sse(scripted), media_type="text/event-stream", headers=scripted.headers
        )

    async def _sse(self, scripted: Reply) -> AsyncIterator[str]:
        for i, item in enumerate(scripted.chunks):
            if scripted.cut_after is not None and i >= scripted.cut_after:
                raise _StreamCut("the fake drops the connection here")
            if scripted.delay_s:
                await trio.sleep(scripted.delay_s)
            yield f"data: {json.dumps(item)}\r\n\r\n"
        if scripted.cut_after is not None and scripted.cut_after >= len(scripted.chunks):
            raise _StreamCut("the fake drops the connection here")

    def _issue(self, chunks: list[dict[str, Any]]) -> None:
        for item in chunks:
            for candidate in item.get("candidates") or ():
                for part in (candidate.get("content") or {}).get("parts") or ():
                    if part.get("thoughtSignature") is None:
                        continue
                    sig = unb64(part["thoughtSignature"])
                    self.issued.add(sig)
                    if "functionCall" in part:
                        self._issued_for_call[_call_key(part["functionCall"])] = sig

    # -- rules ----------------------------------------------------------------------------------

    def _check_system(self, system: Any) -> None:
        if system is None:
            return
        parts = _get(system, "parts") or []
        if not parts:
            raise _Invalid(
                "* GenerateContentRequest.system_instruction.parts: contents.parts must not be "
                "empty."
            )
        for j, part in enumerate(parts):
            if not part.get("text"):
                raise _Invalid(
                    f"* GenerateContentRequest.system_instruction.parts[{j}].data: required oneof "
                    "field 'data' must have one initialized field"
                )

    def _check_tools(self, tools: Any) -> None:
        names: set[str] = set()
        for i, tool in enumerate(tools or ()):
            for j, decl in enumerate(_get(tool, "functionDeclarations") or ()):
                where = f"* GenerateContentRequest.tools[{i}].function_declarations[{j}]"
                name = decl.get("name", "")
                if not _NAME.fullmatch(name):
                    raise _Invalid(
                        f"{where}.name: Invalid function name. Must start with a letter or an "
                        "underscore. Must be a-z, A-Z, 0-9, or contain underscores, dots, colons "
                        "and dashes, with a maximum length of 64."
                    )
                if name in names:
                    raise _Invalid(f"{where}.name: Duplicate function declaration found: {name}")
                names.add(name)
                if (
                    _get(decl, "parameters") is not None
                    and _get(decl, "parametersJsonSchema") is not None
                ):
                    raise _Invalid(
                        f"{where}: parameters and parameters_json_schema are mutually exclusive."
                    )

    def _check_contents(self, contents: list[Any], where: str, *, complete: bool = True) -> None:
        expected: list[dict[str, Any]] = []  # the calls the next content must answer
        for i, content in enumerate(contents):
            role = content.get("role")
            if role not in ("user", "model"):
                raise _Invalid(
                    f"Please use a valid role: user, model. Got {role!r} at contents[{i}]."
                )
            parts = content.get("parts") or []
            if not parts:
                raise _Invalid(f"* {where}[{i}].parts: contents.parts must not be empty.")
            calls, responses = [], []
            for j, part in enumerate(parts):
                present = [k for k in _DATA_FIELDS if _get(part, k) not in (None, "", {})]
                if len(present) != 1:
                    raise _Invalid(
                        f"* {where}[{i}].parts[{j}].data: required oneof field 'data' must have "
                        "one initialized field"
                    )
                if present[0] == "inlineData":
                    blob = _get(part, "inlineData")
                    if not _get(blob, "mimeType") or not blob.get("data"):
                        raise _Invalid(
                            f"* {where}[{i}].parts[{j}].inline_data: mime_type and data are "
                            "required"
                        )
                    _bytes(blob["data"], f"contents[{i}].parts[{j}].inline_data.data")
                if present[0] == "functionCall":
                    calls.append(_get(part, "functionCall"))
                if present[0] == "functionResponse":
                    response = _get(part, "functionResponse")
                    if not isinstance(response.get("response"), dict):
                        raise _Invalid(
                            f"* {where}[{i}].parts[{j}].function_response.response: must be an "
                            "object"
                        )
                    responses.append(response)
            if calls and role != "model":
                raise _Invalid("Please ensure that function call turns come from the model.")
            if responses and role != "user":
                raise _Invalid("Please ensure that function response turns come from the user.")
            if responses and not expected:
                raise _Invalid(
                    "Please ensure that function response turn comes immediately after a function "
                    "call turn."
                )
            if expected:
                if role != "user" or len(responses) != len(expected):
                    raise _Invalid(
                        "Please ensure that the number of function response parts is equal to the "
                        "number of function call parts of the function call turn."
                    )
                for fc, fr in zip(expected, responses, strict=True):
                    if fc.get("name") != fr.get("name") or (
                        fc.get("id") and fc.get("id") != fr.get("id")
                    ):
                        raise _Invalid(
                            f"Function response {fr.get('name')!r} (id {fr.get('id')!r}) does not "
                            f"match function call {fc.get('name')!r} (id {fc.get('id')!r}) at the "
                            "same position."
                        )
            if calls and (i == 0 or contents[i - 1].get("role") != "user"):
                raise _Invalid(
                    "Please ensure that function call turn comes immediately after a user turn or "
                    "after a function response turn."
                )
            expected = calls
        if expected and complete:
            raise _Invalid(
                "Please ensure that the number of function response parts is equal to the number "
                "of function call parts of the function call turn."
            )

    def _check_signatures(self, contents: list[Any], model: str, thinking: bool) -> None:
        if self.verify_signatures:
            for content in contents:
                for part in content.get("parts") or ():
                    sig = _get(part, "thoughtSignature")
                    if sig is not None and _bytes(sig, "thought_signature") not in self.issued:
                        raise _Invalid("Corrupted thought signature.")
        if not thinking:
            return
        # The current turn starts at the last user content that is not only function responses.
        start = 0
        for i, content in enumerate(contents):
            parts = content.get("parts") or ()
            if content.get("role") == "user" and not all(
                _get(p, "functionResponse") for p in parts
            ):
                start = i
        strict = model.startswith("gemini-3")
        for content in contents[start:]:
            if content.get("role") != "model":
                continue
            for j, part in enumerate(content.get("parts") or ()):
                fc = _get(part, "functionCall")
                if fc is None:
                    continue
                needed = strict or _call_key(fc) in self._issued_for_call
                if needed and _get(part, "thoughtSignature") is None:
                    raise _Invalid(MISSING_SIGNATURE.format(name=fc.get("name"), position=j + 1))
                break  # only the first call of a step carries the signature

    # -- caches ---------------------------------------------------------------------------------

    def _live_cache(self, name: str) -> CachedContent:
        cache = self.caches.get(name)
        if cache is None or cache.expires_at <= trio.current_time():
            raise _Invalid("CachedContent not found (or permission denied)", 403)
        return cache

    def _caches(self, rec: Recorded, cache_id: str | None, prefix: str) -> Response:
        if cache_id is None:
            if rec.method != "POST":
                return JSONResponse(
                    {"cachedContents": [self._cache_json(c) for c in self.caches.values()]}
                )
            if self.cache_failures:
                failure = self.cache_failures.popleft()
                return JSONResponse(failure.body, failure.status, failure.headers)
            return self._create_cache(rec.body if isinstance(rec.body, dict) else {}, prefix)
        name = f"{prefix}/cachedContents/{cache_id}" if prefix else f"cachedContents/{cache_id}"
        if rec.method == "DELETE":
            if self.caches.pop(name, None) is None:
                raise _Invalid("CachedContent not found (or permission denied)", 403)
            self.deleted.append(name)
            return JSONResponse({})
        return JSONResponse(self._cache_json(self._live_cache(name)))

    def _create_cache(self, body: dict[str, Any], prefix: str) -> Response:
        model = str(body.get("model", "")).rsplit("/", 1)[-1]
        if not model:
            raise _Invalid("* CreateCachedContentRequest.cached_content.model: model is required")
        ttl = body.get("ttl")
        match = re.fullmatch(r"(\d+(?:\.\d+)?)s", str(ttl))
        if match is None:
            raise _Invalid(
                f"Invalid value at 'cached_content.ttl' ({ttl!r}): expected a duration such as "
                "'300s'"
            )
        contents = _get(body, "contents") or []
        if contents:  # a prefix may end with function calls: their responses come with the request
            self._check_contents(
                contents, "CreateCachedContentRequest.cached_content.contents", complete=False
            )
        system = _get(body, "systemInstruction")
        self._check_system(system)
        self._check_tools(_get(body, "tools"))
        tokens = _tokens([contents, system, _get(body, "tools")])
        if tokens < self.min_cache_tokens:
            raise _Invalid(
                f"Cached content is too small. total_token_count={tokens}, "
                f"min_total_token_count={self.min_cache_tokens}"
            )
        cache_id = f"fake{next(self._ids)}"
        name = f"{prefix}/cachedContents/{cache_id}" if prefix else f"cachedContents/{cache_id}"
        cache = CachedContent(
            name,
            model,
            contents,
            system,
            _get(body, "tools"),
            trio.current_time() + float(match[1]),
            tokens,
        )
        self.caches[name] = cache
        return JSONResponse(self._cache_json(cache))

    def _cache_json(self, cache: CachedContent) -> dict[str, Any]:
        return {
            "name": cache.name,
            "model": f"models/{cache.model}",
            "createTime": "2026-01-01T00:00:00Z",
            "updateTime": "2026-01-01T00:00:00Z",
            "expireTime": "2026-01-01T01:00:00Z",
            "usageMetadata": {"totalTokenCount": cache.tokens},
        }


# -- helpers --------------------------------------------------------------------------------------


def _bytes(value: Any, where: str) -> bytes:
    try:
        return unb64(str(value))
    except ValueError:
        raise _Invalid(
            f"Invalid value at '{where}' (TYPE_BYTES), Base64 decoding failed for {value!r}"
        ) from None


def _snake(key: str) -> str:
    return re.sub(r"[A-Z]", lambda m: "_" + m.group(0).lower(), key)


def _get(obj: Any, key: str) -> Any:
    """A field in either proto JSON spelling (lowerCamelCase or the proto field name)."""
    if not isinstance(obj, dict):
        return None
    value = obj.get(key)
    return obj.get(_snake(key)) if value is None else value


def _thinking_on(body: dict[str, Any], model: str) -> bool:
    config = _get(_get(body, "generationConfig") or {}, "thinkingConfig")
    if config is None:
        return "2.5" in model or model.startswith("gemini-3")  # thinking models think by default
    budget = _get(config, "thinkingBudget")
    return budget != 0 or _get(config, "thinkingLevel") is not None


def _tokens(value: Any) -> int:
    """The fake's token count: 4 characters a token of the JSON."""
    return (len(json.dumps(value)) + 3) // 4


def _with_prompt_tokens(scripted: Reply, prompt: int, cached: int) -> Reply:
    """``scripted`` with these prompt counts in its usage (on its last chunk if it has none)."""
    chunks = [dict(c) for c in scripted.chunks]
    with_usage = [c for c in chunks if "usageMetadata" in c] or chunks[-1:]
    for item in with_usage:
        meta = dict(item.get("usageMetadata") or {})
        output = meta.get("candidatesTokenCount", 0) + meta.get("thoughtsTokenCount", 0)
        meta.update(promptTokenCount=prompt, totalTokenCount=prompt + output)
        if cached:
            meta["cachedContentTokenCount"] = cached
        else:
            meta.pop("cachedContentTokenCount", None)
        item["usageMetadata"] = meta
    return replace(scripted, chunks=chunks)


def _call_key(fc: dict[str, Any]) -> str:
    return json.dumps([fc.get("name"), fc.get("args") or {}], sort_keys=True)


def _merge(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """The non-streaming response: the chunks' parts in one candidate, the last finish and usage."""
    parts: list[dict[str, Any]] = []
    merged: dict[str, Any] = {
        "candidates": [{"index": 0, "content": {"role": "model", "parts": parts}}]
    }
    for item in chunks:
        for candidate in item.get("candidates") or ():
            parts.extend((candidate.get("content") or {}).get("parts") or ())
            if "finishReason" in candidate:
                merged["candidates"][0]["finishReason"] = candidate["finishReason"]
        if "usageMetadata" in item:
            merged["usageMetadata"] = item["usageMetadata"]
    return merged
