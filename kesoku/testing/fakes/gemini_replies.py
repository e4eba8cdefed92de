"""Scripted answers for the Gemini API fake (:mod:`kesoku.testing.fakes.gemini_api`).

The replies and the JSON pieces they are built from: ``GenerateContentResponse`` chunks, usage
metadata, Google API error bodies.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kesoku.testing.backends import Failure
from kesoku.testing.backends import Reply as ContractReply


@dataclass
class Reply:
    """One scripted answer to a generate call.

    Attributes:
        chunks: ``GenerateContentResponse`` JSON objects, one SSE event each (an ``{"error": ...}``
            object is an error event mid-stream).
        status: The HTTP status; not 200: ``body`` is sent as JSON instead of a stream.
        body: The error body.
        headers: Extra response headers (``retry-after``).
        cut_after: Drop the connection after this many chunks (a stream cut).
        delay_s: A pause before each chunk.
    """

    chunks: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200
    body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    cut_after: int | None = None
    delay_s: float = 0.0


def b64(data: bytes) -> str:
    """Standard base64, as the API writes bytes."""
    return base64.b64encode(data).decode()


def unb64(value: str) -> bytes:
    """Decode proto JSON bytes: standard or URL-safe base64 (google-genai sends URL-safe)."""
    return base64.b64decode(value.replace("-", "+").replace("_", "/"), validate=True)


def text(value: str, *, signature: bytes | None = None) -> dict[str, Any]:
    """A text part."""
    part: dict[str, Any] = {"text": value}
    if signature is not None:
        part["thoughtSignature"] = b64(signature)
    return part


def thought(value: str, *, signature: bytes | None = None) -> dict[str, Any]:
    """A thought-summary part."""
    return {**text(value, signature=signature), "thought": True}


def call(
    name: str,
    args: dict[str, Any] | None = None,
    *,
    id: str | None = None,
    signature: bytes | None = None,
) -> dict[str, Any]:
    """A function-call part."""
    fc: dict[str, Any] = {"name": name, "args": args or {}}
    if id is not None:
        fc["id"] = id
    part: dict[str, Any] = {"functionCall": fc}
    if signature is not None:
        part["thoughtSignature"] = b64(signature)
    return part


def usage(prompt: int, candidates: int, *, cached: int = 0, thoughts: int = 0) -> dict[str, Any]:
    """A ``usageMetadata`` object."""
    meta = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": candidates,
        "totalTokenCount": prompt + candidates,
    }
    if cached:
        meta["cachedContentTokenCount"] = cached
    if thoughts:
        meta["thoughtsTokenCount"] = thoughts
        meta["totalTokenCount"] += thoughts
    return meta


def chunk(
    *parts: dict[str, Any], finish: str | None = None, usage_metadata: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One streamed ``GenerateContentResponse``."""
    candidate: dict[str, Any] = {"index": 0}
    if parts:
        candidate["content"] = {"role": "model", "parts": list(parts)}
    if finish is not None:
        candidate["finishReason"] = finish
    out: dict[str, Any] = {"candidates": [candidate], "modelVersion": "fake"}
    if usage_metadata is not None:
        out["usageMetadata"] = usage_metadata
    return out


def reply(*chunks: dict[str, Any], cut_after: int | None = None, delay_s: float = 0.0) -> Reply:
    """A streamed reply."""
    return Reply(chunks=list(chunks), cut_after=cut_after, delay_s=delay_s)


def answer(value: str, *, prompt_tokens: int = 10, output_tokens: int = 5) -> Reply:
    """A plain answer in one chunk, with usage and STOP."""
    return reply(
        chunk(text(value), finish="STOP", usage_metadata=usage(prompt_tokens, output_tokens))
    )


_STATUS_TEXT = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def error_body(
    code: int, message: str, *, status: str | None = None, details: Iterable[dict[str, Any]] = ()
) -> dict[str, Any]:
    """A Google API error body (AIP-193)."""
    err: dict[str, Any] = {
        "code": code,
        "message": message,
        "status": status or _STATUS_TEXT.get(code, "UNKNOWN"),
    }
    if details:
        err["details"] = list(details)
    return {"error": err}


def contract_reply(reply: ContractReply) -> Reply:
    """The fake's reply for a provider-neutral one of :mod:`kesoku.testing.backends`."""
    if isinstance(reply, Failure):
        retry_after = None if reply.retry_after_s is None else f"{reply.retry_after_s:g}"
        return error(reply.status, reply.message, retry_after=retry_after)
    chunks = [chunk(text(piece)) for piece in reply.text]
    if reply.tool_calls:
        chunks.append(chunk(*(call(c.name, dict(c.arguments), id=c.id) for c in reply.tool_calls)))
    finish = "MAX_TOKENS" if reply.stop == "max_tokens" else "STOP"
    tokens = usage(reply.usage.input_tokens, reply.usage.output_tokens)
    chunks.append(chunk(finish=finish, usage_metadata=tokens))
    return Reply(chunks=chunks, cut_after=reply.cut_after, delay_s=reply.stall_s)


def error(
    code: int,
    message: str,
    *,
    retry_after: str | None = None,
    retry_delay: str | None = None,
    reason: str | None = None,
) -> Reply:
    """An HTTP error reply.

    ``retry_after`` is sent as the ``retry-after`` header; ``retry_delay`` (``"7s"``) adds a
    ``google.rpc.RetryInfo``, ``reason`` an ErrorInfo.
    """
    details: list[dict[str, Any]] = []
    if retry_delay is not None:
        details.append(
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": retry_delay}
        )
    if reason is not None:
        details.append(
            {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": reason,
                "domain": "googleapis.com",
            }
        )
    headers = {"retry-after": retry_after} if retry_after is not None else {}
    return Reply(status=code, body=error_body(code, message, details=details), headers=headers)
