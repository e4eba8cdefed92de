"""Wire-level fake of Anthropic's Messages API (direct, Vertex AI) for the real ``anthropic`` SDK.

Routes: ``POST /v1/messages`` (direct) and ``POST
/v1/projects/{project}/locations/{location}/publishers/ anthropic/models/{model}:rawPredict`` /
``:streamRawPredict`` (Vertex AI). JSON when ``stream`` is false, server-sent events when true, in
the real order (Messages API, "Streaming Messages",
https://docs.claude.com/en/docs/build-with-claude/streaming): ``message_start``, ``ping``, per block
``content_block_start`` / ``content_block_delta`` (``text_delta``, ``thinking_delta``,
``signature_delta``, ``input_json_delta``) / ``content_block_stop``, ``message_delta`` (stop_reason,
usage), ``message_stop``.

Each request is recorded, then checked against the documented request rules; a broken rule is
answered like the real API: HTTP 400 ``{"type": "error", "error": {"type": "invalid_request_error",
"message": ...}}`` (https://docs.claude.com/en/api/errors). Responses are scripted per test: a queue
of :class:`Reply` / :class:`ErrorReply`, or a ``handler(body) -> reply``; ``input_usage`` may
compute the input part of each reply's usage from the request body (a prompt-cache model).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from kesoku.testing.backends import Failure
from kesoku.testing.backends import Reply as ContractReply
from kesoku.testing.fakes.server import RequestLog, serve_app


@dataclass
class Text:
    """A text block, streamed in ``chunks`` deltas (a count of even pieces, or the pieces)."""

    text: str
    chunks: int | tuple[str, ...] = 1


@dataclass
class Thinking:
    """A thinking block with its signature (``thinking_delta`` then ``signature_delta``)."""

    text: str
    signature: str


@dataclass
class Redacted:
    """A ``redacted_thinking`` block (no deltas: its data comes whole in content_block_start)."""

    data: str


@dataclass
class ToolUse:
    """A tool_use block; its input is streamed as ``input_json_delta`` pieces of ``piece_chars``.

    ``cut_at``: only the JSON's first that many characters are sent (a reply cut at ``max_tokens``
    inside the block, which the API then closes with ``content_block_stop``).
    """

    id: str
    name: str
    input: dict[str, Any]
    piece_chars: int = 8
    cut_at: int | None = None


Block = Text | Thinking | Redacted | ToolUse


@dataclass
class Reply:
    """A successful response.

    Attributes:
        blocks: The content blocks, in order.
        usage: ``input_tokens``, ``output_tokens``, ``cache_read_input_tokens``,
            ``cache_creation_input_tokens``, ``thinking_tokens`` (sent as output_tokens_details).
        stop_reason: None: ``tool_use`` when there is a tool_use block, else ``end_turn``.
        interleave_tools: Start every tool_use block first, then send their JSON deltas round-robin.
        cut_after: Drop the connection after this many SSE events (no clean end of the body).
        error_after: ``(events, error type, message)``: an ``event: error`` after that many events.
        delay: ``(events, seconds)``: sleep before the event after that many (a stalled stream).
    """

    blocks: list[Block] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=lambda: {"input_tokens": 10, "output_tokens": 5})
    stop_reason: str | None = None
    interleave_tools: bool = False
    cut_after: int | None = None
    error_after: tuple[int, str, str] | None = None
    delay: tuple[int, float] | None = None


@dataclass
class ErrorReply:
    """An HTTP error, with the Anthropic body shape (or Google's, for a Vertex front-end error)."""

    status: int
    type: str
    message: str
    headers: dict[str, str] = field(default_factory=dict)
    google_status: str | None = None


def rate_limited(retry_after_s: float) -> ErrorReply:
    """HTTP 429 ``rate_limit_error`` with a ``retry-after`` header."""
    message = "Number of request tokens has exceeded your per-minute rate limit"
    return ErrorReply(429, "rate_limit_error", message, {"retry-after": f"{retry_after_s:g}"})


def overloaded() -> ErrorReply:
    """HTTP 529 ``overloaded_error``."""
    return ErrorReply(529, "overloaded_error", "Overloaded")


def server_error() -> ErrorReply:
    """HTTP 500 ``api_error``."""
    return ErrorReply(500, "api_error", "Internal server error")


def text_reply(text: str, **usage: int) -> Reply:
    """A one-block text answer; ``usage`` overrides the default counts (10 in, 5 out)."""
    return Reply([Text(text)], usage={"input_tokens": 10, "output_tokens": 5, **usage})


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def contract_reply(reply: ContractReply) -> Reply | ErrorReply:
    """The fake's reply for a provider-neutral one of :mod:`kesoku.testing.backends`."""
    if isinstance(reply, Failure):
        kind = _ERROR_TYPES.get(
            reply.status, "api_error" if reply.status >= 500 else "invalid_request_error"
        )
        headers = {} if reply.retry_after_s is None else {"retry-after": f"{reply.retry_after_s:g}"}
        return ErrorReply(reply.status, kind, reply.message, headers)
    blocks: list[Block] = []
    if reply.text:
        blocks.append(Text("".join(reply.text), chunks=reply.text))
    blocks += [ToolUse(c.id, c.name, dict(c.arguments)) for c in reply.tool_calls]
    # events: message_start, ping, then content_block_start and the text deltas
    cut = None if reply.cut_after is None else 3 + reply.cut_after if reply.cut_after else 2
    return Reply(
        blocks,
        usage={
            "input_tokens": reply.usage.input_tokens,
            "output_tokens": reply.usage.output_tokens,
        },
        stop_reason="max_tokens" if reply.stop == "max_tokens" else None,
        cut_after=cut,
        delay=(0, reply.stall_s) if reply.stall_s else None,
    )


Handler = Callable[[dict[str, Any]], Reply | ErrorReply]


class _Cut(Exception):
    """Raised inside the response body to drop the connection mid-stream."""


class AnthropicFake:
    """The fake API; ``async with fake.serve() as base_url`` runs it on loopback.

    Args:
        api_key: The key the direct API accepts (``x-api-key``, or ``Authorization: Bearer``).
        access_token: The Vertex access token accepted (``Authorization: Bearer``).
        project: The Vertex project of the route.
        location: The Vertex region of the route.
    """

    def __init__(
        self,
        *,
        api_key: str = "sk-ant-test",
        access_token: str = "ya29.test-token",
        project: str = "kesoku-proj",
        location: str = "us-east5",
    ) -> None:
        self.api_key = api_key
        self.access_token = access_token
        self.project = project
        self.location = location
        self.replies: deque[Reply | ErrorReply] = deque()
        self.handler: Handler | None = None
        self.log = RequestLog()
        self.rejections: list[str] = []
        """The 400 messages sent, in order."""
        self.input_usage: Callable[[dict[str, Any]], dict[str, int]] | None = None
        """Computes the input part of each successful reply's usage from the request body (the
        replies' own counts are replaced): a prompt-cache model such as the tests'
        ``fakes.anthropic_cache.PromptCache``. None: the replies' counts go out as scripted."""
        vertex_path = (
            "/v1/projects/{project}/locations/{location}/publishers/anthropic/models/{target}"
        )
        self.app = Starlette(
            routes=[
                Route("/v1/messages", self._direct, methods=["POST"]),
                Route(vertex_path, self._vertex, methods=["POST"]),
            ]
        )

    def push(self, *replies: Reply | ErrorReply) -> None:
        """Queue responses, one per request."""
        self.replies.extend(replies)

    @property
    def bodies(self) -> list[Any]:
        """The JSON bodies received, in order."""
        return [r.body for r in self.log.requests]

    @asynccontextmanager
    async def serve(self) -> AsyncIterator[str]:
        """Serve on loopback; yields the base URL (direct API; Vertex: append ``/v1``)."""
        async with serve_app(self.app) as url:
            yield url

    # -- routes -----------------------------------------------------------------------------------

    async def _direct(self, request: Request) -> Response:
        rec = await self.log.record(request)
        key = rec.headers.get("x-api-key") or rec.headers.get("authorization", "").removeprefix(
            "Bearer "
        )
        if key != self.api_key:
            return _error(401, "authentication_error", "invalid x-api-key")
        if "anthropic-version" not in rec.headers:
            return _error(400, "invalid_request_error", "anthropic-version: header is required")
        return await self._answer(rec.body, vertex=False)

    async def _vertex(self, request: Request) -> Response:
        rec = await self.log.record(request)
        if rec.headers.get("authorization") != f"Bearer {self.access_token}":
            return _google_error(
                401, "UNAUTHENTICATED", "Request had invalid authentication credentials."
            )
        params = request.path_params
        model, _, action = params["target"].rpartition(":")
        if (params["project"], params["location"]) != (self.project, self.location) or not model:
            return _google_error(
                404, "NOT_FOUND", f"Publisher model {params['target']} was not found."
            )
        body = rec.body if isinstance(rec.body, dict) else {}
        if action not in ("rawPredict", "streamRawPredict") or (
            action == "streamRawPredict"
        ) != bool(body.get("stream")):
            reason = f"unexpected method {action!r} for stream={body.get('stream')}"
            return _google_error(400, "INVALID_ARGUMENT", reason)
        if "anthropic_version" not in body:
            return _error(400, "invalid_request_error", "anthropic_version: Field required")
        return await self._answer(rec.body, vertex=True)

    async def _answer(self, body: Any, *, vertex: bool) -> Response:
        problem = validate(body, vertex=vertex)
        if problem is not None:
            self.rejections.append(problem)
            return _error(400, "invalid_request_error", problem)
        if self.handler is not None:
            reply = self.handler(body)
        elif self.replies:
            reply = self.replies.popleft()
        else:
            return _error(500, "api_error", "fake: no scripted reply left")
        if isinstance(reply, ErrorReply):
            if reply.google_status is not None:
                return _google_error(
                    reply.status, reply.google_status, reply.message, reply.headers
                )
            return _error(reply.status, reply.type, reply.message, reply.headers)
        if self.input_usage is not None:
            reply = replace(reply, usage={**reply.usage, **self.input_usage(body)})
        model = body.get("model", "claude-fake")
        if not body.get("stream"):
            return JSONResponse(_message_json(reply, model))
        return StreamingResponse(_SSE(reply, model), media_type="text/event-stream")


def _error(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> Response:
    body = {"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_fake"}
    return JSONResponse(body, status_code=status, headers=headers)


def _google_error(
    status: int, google_status: str, message: str, headers: dict[str, str] | None = None
) -> Response:
    body = {"error": {"code": status, "message": message, "status": google_status}}
    return JSONResponse(body, status_code=status, headers=headers)


# -- responses ------------------------------------------------------------------------------------


def _stop_reason(reply: Reply) -> str:
    if reply.stop_reason is not None:
        return reply.stop_reason
    return "tool_use" if any(isinstance(b, ToolUse) for b in reply.blocks) else "end_turn"


def _message_json(reply: Reply, model: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    for block in reply.blocks:
        if isinstance(block, Text):
            content.append({"type": "text", "text": block.text})
        elif isinstance(block, Thinking):
            content.append(
                {"type": "thinking", "thinking": block.text, "signature": block.signature}
            )
        elif isinstance(block, Redacted):
            content.append({"type": "redacted_thinking", "data": block.data})
        else:
            content.append(
                {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
            )
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": _stop_reason(reply),
        "stop_sequence": None,
        "usage": _usage(reply, final=True),
    }


def _usage(reply: Reply, *, final: bool) -> dict[str, Any]:
    u = reply.usage
    usage: dict[str, Any] = {
        "input_tokens": u.get("input_tokens", 0),
        "cache_creation_input_tokens": u.get("cache_creation_input_tokens", 0),
        "cache_read_input_tokens": u.get("cache_read_input_tokens", 0),
        "output_tokens": u.get("output_tokens", 0) if final else 1,
    }
    if final and "thinking_tokens" in u:
        usage["output_tokens_details"] = {"thinking_tokens": u["thinking_tokens"]}
    return usage


def _pieces(text: str, n: int) -> list[str]:
    size = max(1, -(-len(text) // max(1, n)))
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _events(reply: Reply, model: str) -> list[tuple[str, dict[str, Any]]]:
    message = _message_json(reply, model) | {
        "content": [],
        "stop_reason": None,
        "usage": _usage(reply, final=False),
    }
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": message})
    ]
    events.append(("ping", {"type": "ping"}))

    def start(i: int, block: dict[str, Any]) -> None:
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": i, "content_block": block},
            )
        )

    def delta(i: int, d: dict[str, Any]) -> None:
        events.append(
            ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": d})
        )

    def stop(i: int) -> None:
        events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))

    def json_pieces(b: ToolUse) -> list[str]:
        text = json.dumps(b.input, separators=(",", ":"))[: b.cut_at]
        return ["", *(text[i : i + b.piece_chars] for i in range(0, len(text), b.piece_chars))]

    tools = [(i, b) for i, b in enumerate(reply.blocks) if isinstance(b, ToolUse)]
    for i, block in enumerate(reply.blocks):
        if isinstance(block, Text):
            start(i, {"type": "text", "text": ""})
            pieces = (
                list(block.chunks)
                if isinstance(block.chunks, tuple)
                else _pieces(block.text, block.chunks)
            )
            for piece in pieces:
                delta(i, {"type": "text_delta", "text": piece})
            stop(i)
        elif isinstance(block, Thinking):
            start(i, {"type": "thinking", "thinking": "", "signature": ""})
            delta(i, {"type": "thinking_delta", "thinking": block.text})
            delta(i, {"type": "signature_delta", "signature": block.signature})
            stop(i)
        elif isinstance(block, Redacted):
            start(i, {"type": "redacted_thinking", "data": block.data})
            stop(i)
        elif not reply.interleave_tools:
            start(i, {"type": "tool_use", "id": block.id, "name": block.name, "input": {}})
            for piece in json_pieces(block):
                delta(i, {"type": "input_json_delta", "partial_json": piece})
            stop(i)
    if reply.interleave_tools and tools:
        for i, b in tools:
            start(i, {"type": "tool_use", "id": b.id, "name": b.name, "input": {}})
        queues = [(i, json_pieces(b)) for i, b in tools]
        while any(pieces for _, pieces in queues):
            for i, pieces in queues:
                if pieces:
                    delta(i, {"type": "input_json_delta", "partial_json": pieces.pop(0)})
        for i, _ in tools:
            stop(i)
    final = _usage(reply, final=True)
    usage = {"output_tokens": final["output_tokens"]}
    if "output_tokens_details" in final:
        usage["output_tokens_details"] = final["output_tokens_details"]
    message_delta = {
        "type": "message_delta",
        "delta": {"stop_reason": _stop_reason(reply), "stop_sequence": None},
    }
    events.append(("message_delta", message_delta | {"usage": usage}))
    events.append(("message_stop", {"type": "message_stop"}))
    return events


class _SSE:
    """The body of a streamed reply.

    A class, not an async generator, so a client that goes away early leaves nothing suspended for
    trio to report at garbage collection.
    """

    def __init__(self, reply: Reply, model: str) -> None:
        self.reply = reply
        self.events = _events(reply, model)
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
        if self.done or n == len(self.events):
            raise StopAsyncIteration
        self.sent += 1
        if reply.error_after is not None and n == reply.error_after[0]:
            self.done = True
            error = {
                "type": "error",
                "error": {"type": reply.error_after[1], "message": reply.error_after[2]},
            }
            return f"event: error\ndata: {json.dumps(error)}\n\n".encode()
        if reply.cut_after is not None and n == reply.cut_after:
            raise _Cut("connection dropped by the fake")
        name, data = self.events[n]
        return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


# -- request rules --------------------------------------------------------------------------------

_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
_IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
_THINKING_TYPES = ("thinking", "redacted_thinking")


def validate(body: Any, *, vertex: bool) -> str | None:
    """Return the API's 400 message for the first broken rule, or None.

    Rules (Messages API reference; Extended thinking; Prompt caching): ``model`` (direct) and
    ``max_tokens`` present; ``system`` text blocks non-empty; ``messages`` non-empty, starting with
    the user and alternating; no empty content or empty text; every ``tool_use`` answered by a
    ``tool_result`` with its id at the start of the next user message, and no ``tool_result``
    without its ``tool_use`` in the previous message; ``tool_use`` only from the assistant,
    ``tool_result`` only from the user; thinking blocks signed; base64 images of a supported type;
    tool names valid and unique; at most 4 ``cache_control`` breakpoints (a top-level
    ``cache_control``, automatic caching, takes one), none on a thinking block; thinking:
    ``budget_tokens`` ≥ 1024 and < ``max_tokens``, and with ``{"type": "enabled"}`` the assistant
    message that opens the current tool loop starts with a thinking block (not with adaptive
    thinking).
    """
    if not isinstance(body, dict):
        return "request body must be a JSON object"
    if not vertex and not isinstance(body.get("model"), str):
        return "model: Field required"
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or max_tokens < 1:
        return "max_tokens: Field required"
    system = body.get("system")
    if isinstance(system, list):
        for k, block in enumerate(system):
            if block.get("type") != "text" or not str(block.get("text", "")).strip():
                return f"system.{k}: text content blocks must contain non-whitespace text"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    if messages[0].get("role") != "user":
        return 'messages: first message must use the "user" role'
    breakpoints = sum(
        1 for b in (system if isinstance(system, list) else []) if "cache_control" in b
    )
    previous_tool_ids: list[str] = []
    for i, msg in enumerate(messages):
        role = msg.get("role")
        if role not in ("user", "assistant"):
            return f"messages.{i}.role: Input should be 'user' or 'assistant'"
        if i and messages[i - 1].get("role") == role:
            return (
                'messages: roles must alternate between "user" and "assistant", '
                f'but found multiple "{role}" roles in a row'
            )
        content = msg.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        if not content:
            return (
                f"messages.{i}: all messages must have non-empty content "
                "except for the optional final assistant message"
            )
        results: list[str] = []
        for j, block in enumerate(content):
            where = f"messages.{i}.content.{j}"
            kind = block.get("type")
            breakpoints += "cache_control" in block
            if kind == "text":
                if not str(block.get("text", "")).strip():
                    return f"{where}.text: text content blocks must contain non-whitespace text"
            elif kind == "tool_result":
                if role != "user":
                    return f"{where}: tool_result blocks are only allowed in user messages"
                if results != [b.get("tool_use_id") for b in content[:j]]:
                    return (
                        f"{where}: tool_result blocks must come before any other content in the "
                        "user message"
                    )
                if block.get("tool_use_id") not in previous_tool_ids:
                    return (
                        f"{where}: unexpected `tool_use_id` found in `tool_result` blocks: "
                        f"{block.get('tool_use_id')}. Each `tool_result` block must have a "
                        "corresponding `tool_use` block in the previous message."
                    )
                results.append(block["tool_use_id"])
                if (
                    "content" in block
                    and isinstance(block["content"], str)
                    and not block["content"]
                ):
                    return f"{where}.content: text content blocks must be non-empty"
            elif kind == "tool_use":
                if role != "assistant":
                    return f"{where}: tool_use blocks are only allowed in assistant messages"
                if not isinstance(block.get("input"), dict):
                    return f"{where}.input: Input should be a valid dictionary"
            elif kind in _THINKING_TYPES and "cache_control" in block:
                # Prompt caching, "What cannot be cached" (the message is the fake's own).
                return f"{where}.{kind}.cache_control: thinking blocks cannot be cached directly"
            elif kind == "thinking":
                if role != "assistant":
                    return f"{where}: thinking blocks are only allowed in assistant messages"
                if not block.get("signature"):
                    return f"{where}.thinking.signature: Field required"
            elif kind == "redacted_thinking":
                if role != "assistant" or not block.get("data"):
                    return f"{where}.redacted_thinking.data: Field required"
            elif kind == "image":
                problem = _check_base64(block.get("source", {}), _IMAGE_TYPES)
                if problem:
                    return f"{where}.source.{problem}"
            elif kind == "document":
                source = block.get("source", {})
                if source.get("type") == "text":
                    if (
                        source.get("media_type") != "text/plain"
                        or not str(source.get("data", "")).strip()
                    ):
                        return (
                            f"{where}.source: a text document needs media_type text/plain and "
                            "non-empty data"
                        )
                else:
                    problem = _check_base64(source, ("application/pdf",))
                    if problem:
                        return f"{where}.source.{problem}"
            else:
                return f"{where}.type: unknown content block type {kind!r}"
        if role == "user" and sorted(results) != sorted(previous_tool_ids):
            missing = [t for t in previous_tool_ids if t not in results]
            return (
                f"messages.{i - 1}: `tool_use` ids were found without `tool_result` blocks "
                f"immediately after: {', '.join(missing)}. Each `tool_use` block must have a "
                "corresponding `tool_result` block in the next message."
            )
        previous_tool_ids = (
            [b["id"] for b in content if b.get("type") == "tool_use"] if role == "assistant" else []
        )
    if previous_tool_ids:
        return (
            f"messages.{len(messages) - 1}: `tool_use` ids were found without `tool_result` blocks "
            f"immediately after: {', '.join(previous_tool_ids)}."
        )
    tools = body.get("tools") or []
    names = [t.get("name", "") for t in tools]
    for k, tool in enumerate(tools):
        breakpoints += "cache_control" in tool
        if not _TOOL_NAME.match(tool.get("name", "")):
            return f"tools.{k}.custom.name: String should match pattern '^[a-zA-Z0-9_-]{{1,128}}$'"
        if (tool.get("input_schema") or {}).get("type") != "object":
            return f"tools.{k}.custom.input_schema.type: Input should be 'object'"
    if len(set(names)) != len(names):
        return "tools: Tool names must be unique."
    last = messages[-1].get("content")
    if isinstance(body.get("cache_control"), dict) and not (
        isinstance(last, list) and last and "cache_control" in last[-1]
    ):  # automatic caching takes a slot, unless the last block already has a breakpoint
        breakpoints += 1
    if breakpoints > 4:
        return f"A maximum of 4 blocks with cache_control may be provided. Found {breakpoints}."
    return _check_thinking(body, messages, max_tokens)


def _check_thinking(
    body: dict[str, Any], messages: list[dict[str, Any]], max_tokens: int
) -> str | None:
    thinking = body.get("thinking")
    if thinking is None or thinking.get("type") == "disabled":
        return None
    if thinking.get("type") == "enabled":
        budget = thinking.get("budget_tokens")
        if not isinstance(budget, int) or budget < 1024:
            return "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
        if budget >= max_tokens:
            return "`max_tokens` must be greater than `thinking.budget_tokens`."
    elif thinking.get("type") == "adaptive":
        # Adaptive thinking, "Validation changes": previous assistant turns need not start with
        # thinking blocks (the model may skip thinking at any step).
        return None
    else:
        return (
            f"thinking.type: Input tag {thinking.get('type')!r} does not match any of the expected "
            "tags"
        )
    # The current tool loop: what follows the last user message that holds no tool_result. A loop
    # is one assistant turn in one thinking mode (Extended thinking, "Toggling thinking modes in
    # conversations"); newer API versions disable thinking for such a request instead of refusing
    # it ("Graceful thinking degradation"), which would silently drop the thinking asked for and
    # the messages' cache: the fake refuses it, as the API did, so a test sees the mistake.
    start = 0
    for i, msg in enumerate(messages):
        content = msg["content"] if isinstance(msg["content"], list) else []
        if msg["role"] == "user" and not any(b.get("type") == "tool_result" for b in content):
            start = i + 1
    for i in range(start, len(messages)):
        msg = messages[i]
        if msg["role"] == "assistant":
            first = msg["content"][0].get("type") if isinstance(msg["content"], list) else "text"
            if first not in _THINKING_TYPES:
                return (
                    f"messages.{i}.content.0.type: Expected `thinking` or `redacted_thinking`, but "
                    f"found `{first}`. When `thinking` is enabled, a final `assistant` message "
                    "must start with a thinking block (preceeding the lastmost set of `tool_use` "
                    "and `tool_result` blocks). We recommend you include thinking blocks from "
                    "previous turns. To avoid this requirement, disable `thinking`."
                )
            break
    return None


def _check_base64(source: dict[str, Any], media_types: tuple[str, ...]) -> str | None:
    if source.get("type") != "base64":
        return "type: Input tag does not match the expected tags"
    if source.get("media_type") not in media_types:
        return f"media_type: Input should be {' or '.join(repr(t) for t in media_types)}"
    try:
        base64.b64decode(source.get("data", ""), validate=True)
    except (binascii.Error, ValueError):
        return "data: invalid base64 data"
    return None if source.get("data") else "data: String should have at least 1 character"
