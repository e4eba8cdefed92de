"""A wire-level fake of OpenAI's Chat Completions API, for the real ``openai`` SDK.

Route: ``POST /v1/chat/completions``. Plain JSON (a ``chat.completion``) when ``stream`` is false;
server-sent events when true, shaped like OpenAI's (https://platform.openai.com/docs/api-reference/
chat-streaming): an opening chunk with ``role``, then content, reasoning and tool-call deltas, a
chunk with ``finish_reason``, ``"usage": null`` on each chunk when ``stream_options.include_usage``
is set and then a last chunk with empty ``choices`` and the usage, and ``data: [DONE]``.

Self-hosted servers answer the questions Kesoku asks for a model's context window, each in its own
dialect (``server=``): llama.cpp ``GET /props`` (``default_generation_settings.n_ctx``), Ollama
``POST /api/show`` (``num_ctx`` in ``parameters``, ``model_info["<arch>.context_length"]``), vLLM
``GET /v1/models`` (``data[].max_model_len``); OpenAI's ``GET /v1/models`` has no window. A route of
another dialect answers 404, as the real servers do.

Each request is recorded, then checked against the API's request rules; a broken rule is answered
like the real API: HTTP 400 ``{"error": {"message", "type": "invalid_request_error", "param",
"code"}}``. Responses are scripted per test: a queue of :class:`Reply` / :class:`ErrorReply`, or a
``handler(body) -> reply``.
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from kesoku.testing.backends import Failure
from kesoku.testing.backends import Reply as ContractReply
from kesoku.testing.fakes.server import RequestLog, serve_app


@dataclass
class Call:
    """A tool call; its arguments (a dict as compact JSON, a str as is) stream in ``pieces``."""

    id: str | None
    name: str
    arguments: dict[str, Any] | str
    pieces: int = 3

    @property
    def json(self) -> str:
        """The arguments as the API streams them."""
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, separators=(",", ":"), ensure_ascii=False)


ServerKind = Literal["openai", "llama.cpp", "ollama", "vllm"]
Style = Literal["split", "interleaved", "whole", "repeated_id", "index_zero"]


@dataclass
class Reply:
    """A successful response.

    Attributes:
        text: The answer, streamed in ``chunks`` deltas (a count of even pieces, or the pieces).
        reasoning: Thinking text, streamed before the answer under ``reasoning_key``
            (``reasoning_content``, ``reasoning``, or ``both``: the same text under each).
        calls: Tool calls, streamed in ``style``: ``split`` (OpenAI: the id and name in the first
            fragment, then argument pieces, one call after another), ``interleaved`` (every call
            opened, then pieces round-robin), ``whole`` (Ollama: every call whole in one delta),
            ``repeated_id`` (the id on every fragment), ``index_zero`` (index 0 for every call).
        deltas: Raw deltas sent instead of the above (after the opening chunk).
        usage: ``prompt_tokens``, ``completion_tokens``, ``cached_tokens``, ``reasoning_tokens``.
        finish_reason: "auto": ``tool_calls`` with calls, else ``stop``; None: never sent.
        finish_on_last_delta: Send the finish_reason with the last delta, not in a chunk of its own.
        cut_after: Drop the connection after this many chunks (the opening chunk counts).
        error_after: ``(chunks, type, message)``: an error event after that many chunks.
        delay: ``(chunks, seconds)``: sleep before the chunk after that many.
    """

    text: str = ""
    chunks: int | tuple[str, ...] = 1
    reasoning: str = ""
    reasoning_key: str = "reasoning_content"
    calls: list[Call] = field(default_factory=list)
    style: Style = "split"
    deltas: list[dict[str, Any]] | None = None
    usage: dict[str, int] = field(
        default_factory=lambda: {"prompt_tokens": 10, "completion_tokens": 5}
    )
    finish_reason: str | None = "auto"
    finish_on_last_delta: bool = False
    cut_after: int | None = None
    error_after: tuple[int, str, str] | None = None
    delay: tuple[int, float] | None = None


@dataclass
class EmptyReply:
    """HTTP 200, empty body: what the llama.cpp server answers to a prompt over its ``n_ctx``."""

    content_type: str = "text/event-stream"


@dataclass
class ErrorReply:
    """An HTTP error with OpenAI's body shape."""

    status: int
    message: str
    type: str = "invalid_request_error"
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


def rate_limited(retry_after: str, header: str = "retry-after") -> ErrorReply:
    """HTTP 429 ``rate_limit_exceeded`` with ``retry_after`` in ``header``."""
    message = "Rate limit reached for gpt-5-mini in organization org-fake on tokens per min (TPM)."
    return ErrorReply(429, message, "tokens", "rate_limit_exceeded", {header: retry_after})


def server_error(status: int = 500) -> ErrorReply:
    """An HTTP 5xx ``server_error`` with OpenAI's message for the status."""
    message = {
        500: "The server had an error while processing your request. Sorry about that!",
        503: "The engine is currently overloaded, please try again later.",
        529: "Overloaded",
    }.get(status, "Server error")
    return ErrorReply(status, message, "server_error")


def text_reply(text: str, **usage: int) -> Reply:
    """A text answer in one delta; ``usage`` overrides the default counts (10 in, 5 out)."""
    return Reply(text, usage={"prompt_tokens": 10, "completion_tokens": 5, **usage})


def contract_reply(reply: ContractReply) -> Reply | ErrorReply:
    """The fake's reply for a provider-neutral one of :mod:`kesoku.testing.backends`."""
    if isinstance(reply, Failure):
        kind = (
            "server_error"
            if reply.status >= 500
            else "requests"
            if reply.status == 429
            else "invalid_request_error"
        )
        headers = {} if reply.retry_after_s is None else {"retry-after": f"{reply.retry_after_s:g}"}
        return ErrorReply(reply.status, reply.message, kind, headers=headers)
    return Reply(
        "".join(reply.text),
        chunks=reply.text,
        calls=[Call(c.id, c.name, dict(c.arguments)) for c in reply.tool_calls],
        usage={
            "prompt_tokens": reply.usage.input_tokens,
            "completion_tokens": reply.usage.output_tokens,
        },
        finish_reason="length" if reply.stop == "max_tokens" else "auto",
        # the opening chunk (the role) counts
        cut_after=None if reply.cut_after is None else 1 + reply.cut_after,
        delay=(0, reply.stall_s) if reply.stall_s else None,
    )


Handler = Callable[[dict[str, Any]], Reply | ErrorReply | EmptyReply]


@dataclass
class Problem:
    """A broken request rule: the 400 the API would send."""

    message: str
    param: str | None = None
    code: str | None = None


class _Cut(Exception):
    """Raised inside the response body to drop the connection mid-stream."""


class OpenAIFake:
    """The fake API; ``async with fake.serve() as base_url`` runs it (base_url ends in ``/v1``).

    Args:
        api_key: The key accepted (``Authorization: Bearer``); None: any key.
        deepseek_thinking: Apply DeepSeek's thinking-mode rule: an assistant message with tool calls
            must carry ``reasoning_content``.
        server: Which server's window dialect it answers (see the module docstring).
        window: The window it reports; None: none (Ollama without ``num_ctx``).
        model_window: Ollama only: ``<arch>.context_length`` in ``model_info``.
        model_id: The model ``GET /v1/models`` lists.
    """

    def __init__(
        self,
        *,
        api_key: str | None = "sk-test",
        deepseek_thinking: bool = False,
        server: ServerKind = "openai",
        window: int | None = None,
        model_window: int | None = None,
        model_id: str = "served-model",
    ) -> None:
        self.api_key = api_key
        self.deepseek_thinking = deepseek_thinking
        self.server = server
        self.window = window
        """The window the server runs with
        (llama.cpp ``n_ctx``, Ollama ``num_ctx``, vLLM ``max_model_len``)."""
        self.model_window = model_window
        """Ollama: the model's trained ``context_length`` in ``model_info``."""
        self.model_id = model_id
        """The model ``GET /v1/models`` lists."""
        self.prompt_sizes: list[int] = []
        """Each completion request's size by :func:`prompt_size`, in order."""
        self.probes: list[str] = []
        """The window questions asked (``GET /props`` …), in order."""
        self.replies: deque[Reply | ErrorReply | EmptyReply] = deque()
        self.handler: Handler | None = None
        self.log = RequestLog()
        self.rejections: list[str] = []
        """The 400 messages sent, in order."""
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._completions, methods=["POST"]),
                Route("/props", self._props, methods=["GET"]),
                Route("/api/show", self._show, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ]
        )

    def push(self, *replies: Reply | ErrorReply | EmptyReply) -> None:
        """Queue responses, one per request."""
        self.replies.extend(replies)

    @property
    def bodies(self) -> list[Any]:
        """The JSON bodies received, in order."""
        return [r.body for r in self.log.requests]

    @asynccontextmanager
    async def serve(self) -> AsyncIterator[str]:
        """Serve on loopback; yields the base URL, ending in ``/v1``."""
        async with serve_app(self.app) as url:
            yield f"{url}/v1"

    async def _props(self, request: Request) -> Response:
        self.probes.append("GET /props")
        if self.server != "llama.cpp":
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        settings = {"n_ctx": self.window, "temperature": 0.8, "n_predict": -1}
        return JSONResponse(
            {"default_generation_settings": settings, "total_slots": 1, "build_info": "b1-fake"}
        )

    async def _show(self, request: Request) -> Response:
        self.probes.append("POST /api/show")
        if self.server != "ollama":
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        body = await request.json()
        model = body.get("model") if isinstance(body, dict) else None
        if not isinstance(model, str):
            return JSONResponse({"error": "model is required"}, status_code=400)
        answer: dict[str, Any] = {
            "modelfile": f"FROM {model}",
            "details": {"format": "gguf", "family": "qwen3", "parameter_size": "8.2B"},
            "model_info": {"general.architecture": "qwen3", "qwen3.embedding_length": 4096},
            "capabilities": ["completion", "tools"],
        }
        if self.window is not None:
            answer["parameters"] = f"temperature 0.6\nnum_ctx {self.window}\ntop_k 20"
        if self.model_window is not None:
            answer["model_info"]["qwen3.context_length"] = self.model_window
        return JSONResponse(answer)

    async def _models(self, request: Request) -> Response:
        self.probes.append("GET /v1/models")
        card: dict[str, Any] = {
            "id": self.model_id,
            "object": "model",
            "created": 0,
            "owned_by": self.server,
        }
        if self.server == "vllm" and self.window is not None:
            card["max_model_len"] = self.window
        return JSONResponse({"object": "list", "data": [card]})

    async def _completions(self, request: Request) -> Response:
        rec = await self.log.record(request)
        if (
            self.api_key is not None
            and rec.headers.get("authorization") != f"Bearer {self.api_key}"
        ):
            key = rec.headers.get("authorization", "").removeprefix("Bearer ")
            message = (
                f"Incorrect API key provided: {key}. You can find your API key at "
                "https://platform.openai.com/account/api-keys."
            )
            return _error(401, message, code="invalid_api_key")
        problem = validate(rec.body, deepseek_thinking=self.deepseek_thinking)
        if problem is not None:
            self.rejections.append(problem.message)
            return _error(400, problem.message, param=problem.param, code=problem.code)
        prompt_tokens = prompt_size(rec.body)
        self.prompt_sizes.append(prompt_tokens)
        if self.server == "llama.cpp" and self.window is not None and prompt_tokens > self.window:
            # llama.cpp server: tools/server/server.cpp, ERROR_TYPE_EXCEED_CONTEXT_SIZE.
            self.rejections.append("exceeds the available context size")
            return JSONResponse(
                {
                    "error": {
                        "code": 400,
                        "message": (
                            "the request exceeds the available context size, try increasing it"
                        ),
                        "type": "exceed_context_size_error",
                        "n_prompt_tokens": prompt_tokens,
                        "n_ctx": self.window,
                    }
                },
                status_code=400,
            )
        if self.handler is not None:
            reply = self.handler(rec.body)
        elif self.replies:
            reply = self.replies.popleft()
        else:
            return _error(500, "fake: no scripted reply left", "server_error")
        if isinstance(reply, ErrorReply):
            return _error(
                reply.status, reply.message, reply.type, code=reply.code, headers=reply.headers
            )
        if isinstance(reply, EmptyReply):
            return Response(b"", status_code=200, media_type=reply.content_type)
        body = rec.body
        if not body.get("stream"):
            return JSONResponse(_completion_json(reply, body["model"]))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return StreamingResponse(
            _SSE(reply, body["model"], include_usage), media_type="text/event-stream"
        )


def prompt_size(body: Any) -> int:
    """The fake's own token count of a request.

    The characters of every message's content and of the tool schemas, four to a token (deliberately
    not Kesoku's estimator).
    """
    chars = 0
    for msg in body.get("messages") or ():
        content = msg.get("content")
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            chars += sum(len(part.get("text") or "") for part in content if isinstance(part, dict))
        for call in msg.get("tool_calls") or ():
            chars += len(json.dumps(call.get("function") or {}))
    chars += len(json.dumps(body.get("tools") or []))
    return chars // 4


def _error(
    status: int,
    message: str,
    kind: str = "invalid_request_error",
    *,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


# -- responses ------------------------------------------------------------------------------------


def _finish_reason(reply: Reply) -> str | None:
    if reply.finish_reason != "auto":
        return reply.finish_reason
    return "tool_calls" if reply.calls else "stop"


def _usage_json(reply: Reply) -> dict[str, Any]:
    u = reply.usage
    prompt, completion = u.get("prompt_tokens", 0), u.get("completion_tokens", 0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": u.get("cached_tokens", 0), "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": u.get("reasoning_tokens", 0),
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _completion_json(reply: Reply, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None, "refusal": None}
    if reply.calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.json}}
            for c in reply.calls
        ]
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1_764_460_800,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": _finish_reason(reply),
            }
        ],
        "usage": _usage_json(reply),
    }


def _pieces(text: str, n: int) -> list[str]:
    size = max(1, -(-len(text) // max(1, n)))
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _opening(call: Call, index: int, arguments: str = "") -> dict[str, Any]:
    fragment: dict[str, Any] = {"index": index}
    if call.id is not None:
        fragment["id"] = call.id
    fragment |= {"type": "function", "function": {"name": call.name, "arguments": arguments}}
    return fragment


def _call_deltas(reply: Reply) -> list[dict[str, Any]]:
    calls, style = reply.calls, reply.style
    if style == "whole":
        return [{"tool_calls": [_opening(c, i, c.json) for i, c in enumerate(calls)]}]
    deltas: list[dict[str, Any]] = []
    queues: list[tuple[int, Call, list[str]]] = []
    for i, call in enumerate(calls):
        index = 0 if style == "index_zero" else i
        queues.append((index, call, _pieces(call.json, call.pieces)))

    def piece(index: int, call: Call, text: str) -> dict[str, Any]:
        fragment: dict[str, Any] = {"index": index}
        if style == "repeated_id" and call.id is not None:
            fragment |= {"id": call.id, "type": "function"}
        return {"tool_calls": [fragment | {"function": {"arguments": text}}]}

    if style == "interleaved":
        deltas += [{"tool_calls": [_opening(c, i)]} for i, c, _ in queues]
        while any(pieces for _, _, pieces in queues):
            for i, c, pieces in queues:
                if pieces:
                    deltas.append(piece(i, c, pieces.pop(0)))
        return deltas
    for i, c, pieces in queues:
        deltas.append({"tool_calls": [_opening(c, i)]})
        deltas += [piece(i, c, p) for p in pieces]
    return deltas


def _chunks(reply: Reply, model: str, include_usage: bool) -> list[dict[str, Any]]:
    base = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1_764_460_800,
        "model": model,
    }
    base["system_fingerprint"] = "fp_fake"

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        out = base | {"choices": [choice]}
        return out | {"usage": None} if include_usage else out

    deltas: list[dict[str, Any]]
    if reply.deltas is not None:
        deltas = [dict(d) for d in reply.deltas]
    else:
        deltas = []
        if reply.reasoning:
            keys = (
                ["reasoning_content", "reasoning"]
                if reply.reasoning_key == "both"
                else [reply.reasoning_key]
            )
            deltas.append(dict.fromkeys(keys, reply.reasoning))
        if reply.text:
            pieces = (
                list(reply.chunks)
                if isinstance(reply.chunks, tuple)
                else _pieces(reply.text, reply.chunks)
            )
            deltas += [{"content": piece} for piece in pieces]
        deltas += _call_deltas(reply)
    chunks = [chunk({"role": "assistant", "content": "", "refusal": None})]
    finish = _finish_reason(reply)
    for n, delta in enumerate(deltas):
        last = n == len(deltas) - 1
        chunks.append(chunk(delta, finish if last and reply.finish_on_last_delta else None))
    if finish is not None and not (reply.finish_on_last_delta and deltas):
        chunks.append(chunk({}, finish))
    if include_usage:
        chunks.append(base | {"choices": [], "usage": _usage_json(reply)})
    return chunks


class _SSE:
    """The body of a streamed reply.

    A class, not an async generator, so a client that goes away early leaves nothing suspended for
    trio to report at garbage collection.
    """

    def __init__(self, reply: Reply, model: str, include_usage: bool) -> None:
        self.reply = reply
        self.chunks = _chunks(reply, model, include_usage)
        self.sent = 0
        self.done = False

    def __aiter__(self) -> _SSE:
        return self

    async def __anext__(self) -> bytes:
        n, reply = self.sent, self.reply
        if reply.delay is not None and n == reply.delay[0]:
            await trio.sleep(reply.delay[1])
        else:
            await trio.lowlevel.checkpoint()
        if self.done or n > len(self.chunks):
            raise StopAsyncIteration
        self.sent += 1
        if reply.error_after is not None and n == reply.error_after[0]:
            self.done = True
            kind, message = reply.error_after[1], reply.error_after[2]
            error = {"error": {"message": message, "type": kind, "param": None, "code": None}}
            return f"data: {json.dumps(error)}\n\n".encode()
        if reply.cut_after is not None and n == reply.cut_after:
            raise _Cut("connection dropped by the fake")
        if n == len(self.chunks):
            return b"data: [DONE]\n\n"
        return f"data: {wire_json(self.chunks[n])}\n\n".encode()


def wire_json(value: Any) -> str:
    r"""JSON as the API sends it: UTF-8 text, lone surrogates escaped.

    A lone surrogate (which UTF-8 cannot carry) goes as its ``\u`` escape (``\ud800``), the only
    way JSON can hold one (RFC 8259 §7 allows it; §8.2 leaves it to the reader).
    """
    text = json.dumps(value, ensure_ascii=False)
    try:
        text.encode()
    except UnicodeEncodeError:
        return json.dumps(value)
    return text


# -- request rules --------------------------------------------------------------------------------

KNOWN_PARAMETERS = frozenset(
    {
        "model",
        "messages",
        "stream",
        "stream_options",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "temperature",
        "top_p",
        "max_tokens",
        "max_completion_tokens",
        "n",
        "stop",
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "response_format",
        "reasoning_effort",
        "user",
        "metadata",
        "store",
        "service_tier",
        "modalities",
        "prediction",
        "audio",
        "verbosity",
    }
)
ROLES = ("system", "developer", "user", "assistant", "tool", "function")
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_DATA_URL = re.compile(r"^data:image/(png|jpeg|gif|webp);base64,[A-Za-z0-9+/]+=*$")


def validate(body: Any, *, deepseek_thinking: bool = False) -> Problem | None:
    """Return the API's 400 for the first broken rule, or None.

    Rules (Chat Completions reference, and OpenAI's error messages): ``model`` given; no unknown
    top-level parameter; ``messages`` non-empty, every role valid; user, system and tool messages
    have content; content parts are ``text`` or (user only) ``image_url`` with an http(s) or base64
    image data URL; an assistant message has content or tool calls, whose arguments are strings;
    every tool message answers a call of the assistant message just before it, and every call is
    answered before the next user or assistant message; ``tools`` non-empty with valid names;
    ``stream_options`` only with ``stream``. With ``deepseek_thinking``: assistant messages with
    tool calls carry ``reasoning_content`` (DeepSeek, "Thinking Mode").
    """
    if not isinstance(body, dict):
        return Problem("We could not parse the JSON body of your request.")
    if not isinstance(body.get("model"), str) or not body["model"]:
        return Problem("you must provide a model parameter")
    for key in body:
        if key not in KNOWN_PARAMETERS:
            return Problem(f"Unrecognized request argument supplied: {key}")
    messages = body.get("messages")
    if not isinstance(messages, list):
        return Problem(
            "Missing required parameter: 'messages'.", "messages", "missing_required_parameter"
        )
    if not messages:
        return Problem(
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an "
            "empty array instead.",
            "messages",
            "empty_array",
        )
    pending: list[str] = []  # calls of the last assistant message not yet answered
    answerable: list[str] = []  # calls the next tool message may answer
    pending_at = 0
    for i, msg in enumerate(messages):
        role = msg.get("role") if isinstance(msg, dict) else None
        if role not in ROLES:
            supported = "'system', 'assistant', 'user', 'function', 'tool', and 'developer'"
            return Problem(
                f"Invalid value: '{role}'. Supported values are: {supported}.",
                f"messages[{i}].role",
            )
        if role != "tool" and pending:
            return _unanswered(pending, pending_at)
        if role in ("system", "developer", "user", "tool"):
            if msg.get("content") is None:
                return Problem(
                    f"Missing required parameter: 'messages[{i}].content'.",
                    f"messages[{i}].content",
                    "missing_required_parameter",
                )
            problem = _check_content(msg["content"], i, images=role == "user")
            if problem:
                return problem
        if role == "tool":
            call_id = msg.get("tool_call_id")
            if not answerable:
                return Problem(
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceeding message with 'tool_calls'.",
                    f"messages.[{i}].role",
                )
            if call_id not in answerable:
                return Problem(
                    f"Invalid parameter: 'tool_call_id' of '{call_id}' not found in 'tool_calls' "
                    "of previous message.",
                    f"messages.[{i}].tool_call_id",
                )
            if call_id in pending:
                pending.remove(call_id)
            continue
        answerable = []
        if role == "assistant":
            problem = _check_assistant(msg, i, deepseek_thinking)
            if problem:
                return problem
            pending = [c["id"] for c in msg.get("tool_calls") or ()]
            answerable, pending_at = list(pending), i
    if pending:
        return _unanswered(pending, pending_at)
    return _check_tools(body)


def _unanswered(pending: list[str], index: int) -> Problem:
    return Problem(
        "An assistant message with 'tool_calls' must be followed by tool messages responding to "
        "each 'tool_call_id'. The following tool_call_ids did not have response messages: "
        f"{', '.join(pending)}",
        f"messages.[{index}].role",
    )


def _check_content(content: Any, i: int, *, images: bool) -> Problem | None:
    if isinstance(content, str):
        return None
    if not isinstance(content, list) or not content:
        return Problem(
            f"Invalid 'messages[{i}].content': expected a string or a non-empty array of parts."
        )
    for j, part in enumerate(content):
        where = f"messages[{i}].content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            if not isinstance(part.get("text"), str):
                return Problem(f"Missing required parameter: '{where}.text'.", f"{where}.text")
        elif kind == "image_url" and images:
            url = (part.get("image_url") or {}).get("url")
            if not isinstance(url, str) or not (
                url.startswith(("http://", "https://")) or _DATA_URL.match(url)
            ):
                return Problem(
                    f"Invalid '{where}.image_url.url'. Expected a valid URL or a base64-encoded "
                    "data URL with an image MIME type (e.g. "
                    "'data:image/png;base64,aW1nIGJ5dGVzIGhlcmU=').",
                    f"{where}.image_url.url",
                    "invalid_value",
                )
        else:
            supported = (
                "'text', 'image_url', 'input_audio', 'refusal', 'audio', and 'file'"
                if images
                else "'text'"
            )
            return Problem(
                f"Invalid value: '{kind}'. Supported values are: {supported}.",
                f"{where}.type",
                "invalid_value",
            )
    return None


def _check_assistant(msg: dict[str, Any], i: int, deepseek_thinking: bool) -> Problem | None:
    calls = msg.get("tool_calls")
    if msg.get("content") is None and not calls:
        return Problem(
            f"Invalid value for 'content': expected a string, got null. 'messages[{i}]' needs "
            "content or tool_calls.",
            f"messages.[{i}].content",
        )
    if msg.get("content") is not None:
        problem = _check_content(msg["content"], i, images=False)
        if problem:
            return problem
    if calls is not None and (not isinstance(calls, list) or not calls):
        return Problem(
            f"Invalid 'messages[{i}].tool_calls': empty array.",
            f"messages[{i}].tool_calls",
            "empty_array",
        )
    for j, call in enumerate(calls or ()):
        where = f"messages[{i}].tool_calls[{j}]"
        function = call.get("function") or {}
        if (
            not isinstance(call.get("id"), str)
            or call.get("type") != "function"
            or not function.get("name")
        ):
            return Problem(
                f"Missing required parameter: '{where}.id', '.type' or '.function.name'.", where
            )
        if not isinstance(function.get("arguments"), str):
            kind = type(function.get("arguments")).__name__
            return Problem(
                f"Invalid type for '{where}.function.arguments': expected a string, but got {kind} "
                "instead.",
                f"{where}.function.arguments",
                "invalid_type",
            )
    if deepseek_thinking and calls and "reasoning_content" not in msg:
        return Problem("The reasoning_content in the thinking mode must be passed back to the API.")
    return None


def _check_tools(body: dict[str, Any]) -> Problem | None:
    if "stream_options" in body and not body.get("stream"):
        return Problem(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            "stream_options",
            None,
        )
    if "tools" not in body:
        return None
    tools = body["tools"]
    if not isinstance(tools, list) or not tools:
        return Problem(
            "Invalid 'tools': empty array. Expected an array with minimum length 1, but got an "
            "empty array instead.",
            "tools",
            "empty_array",
        )
    for k, tool in enumerate(tools):
        name = (tool.get("function") or {}).get("name", "")
        if tool.get("type") != "function" or not _TOOL_NAME.match(str(name)):
            return Problem(
                f"Invalid 'tools[{k}].function.name': string does not match pattern. Expected a "
                "string that matches the pattern '^[a-zA-Z0-9_-]+$'.",
                f"tools[{k}].function.name",
                "invalid_value",
            )
    return None
