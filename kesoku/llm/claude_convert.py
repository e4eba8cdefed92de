"""Translation between Kesoku's IR and the Messages API's JSON, for the claude backend.

Pure functions and stream decoders, no I/O: the IR turns as ``messages``, tool specs as ``tools``,
a model id's thinking form, and the streamed server-sent events back to IR events. Used by
:mod:`kesoku.llm.claude`; it does not import the ``anthropic`` SDK. Wire facts below come from the
Messages API reference (https://docs.claude.com/en/api/messages), "Streaming Messages"
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
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from typing import Any

import msgspec

from kesoku.vocab.errors import BackendError
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

ADAPTIVE_SINCE = (4, 6)
"""First model version whose thinking is adaptive.

Adaptive thinking: Opus 4.6, Sonnet 4.6 and later.
"""
IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
"""Media types of a base64 image source (Messages API, ``Base64ImageSource.media_type``)."""
MAX_BREAKPOINTS = 4
"""Blocks with ``cache_control`` a request may have (Prompt caching, "When to use multiple
breakpoints")."""
REDACTED_PREFIX = b"redacted_thinking:"
"""Marks a ThoughtBlock signature that carries a ``redacted_thinking`` block's data."""


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
    """Whether manual thinking may be on: true unless the current tool loop opened without it.

    The loop is what follows the last user message without ``tool_result`` blocks: one assistant
    turn, which "must operate in a single thinking mode" (Extended thinking, "Toggling thinking
    modes in conversations"). With ``{"type": "enabled"}`` its first assistant message must start
    with a ``thinking`` or ``redacted_thinking`` block: the API answers 400 "a final assistant
    message must start with a thinking block", or in its newer versions silently disables thinking
    for the request. Adaptive thinking has no such rule (Adaptive thinking, "Validation changes":
    earlier assistant turns need not start with thinking blocks).
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


def cache_breakpoints(
    system: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]],
    messages: Sequence[dict[str, Any]],
) -> list[dict[str, Any]]:
    """The blocks to mark with ``cache_control``: at most 4, the API's limit, most useful first.

    Prompt caching ("How automatic prefix checking works") writes an entry only at a breakpoint,
    and a read looks for an earlier write at most 20 blocks back from each breakpoint. A session's
    requests grow by whole steps, so the breakpoints are:

    1. the last block: the entry the next request reads;
    2. the end of the previous request (the user message before the last assistant message): the
       entry that request wrote, read here whatever the number of blocks the step added (a step of
       ten parallel calls adds 21 blocks or more, past the lookback of breakpoint 1);
    3. the end of the system prompt (else of the tools): tools and system stay cached when the
       messages part changes (another session, a compacted history);
    4. the end of the last user message before the final one that is not only tool results (the
       opening of the previous turn, or of the current tool loop): models that drop the thinking
       blocks of earlier turns from the context (before Opus 4.5 and Sonnet 4.6, every Haiku;
       "Extended thinking", "Thinking block context removal") change the prefix after it when a
       new turn starts, and this is the last entry still shared;

    then the end of the tools, if a slot is left. Each is the last block of its part: user messages
    never hold thinking blocks, which cannot carry ``cache_control``.
    """
    candidates: list[dict[str, Any]] = []
    if messages and messages[-1]["content"]:
        candidates.append(messages[-1]["content"][-1])
    if len(messages) >= 3 and messages[-3]["content"]:
        candidates.append(messages[-3]["content"][-1])
    if system:
        candidates.append(system[-1])
    elif tools:
        candidates.append(tools[-1])
    for msg in reversed(messages[:-1]):
        if msg["role"] == "user" and any(b["type"] != "tool_result" for b in msg["content"]):
            candidates.append(msg["content"][-1])
            break
    if tools:
        candidates.append(tools[-1])
    chosen: list[dict[str, Any]] = []
    for block in candidates:
        if len(chosen) < MAX_BREAKPOINTS and all(block is not c for c in chosen):
            chosen.append(block)
    return chosen


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
        cache_write = u.get("cache_creation_input_tokens") or 0
        details = u.get("output_tokens_details") or {}
        return Usage(
            input_tokens=(u.get("input_tokens") or 0) + cache_read + cache_write,
            output_tokens=u.get("output_tokens") or 0,
            cached_tokens=cache_read,
            thinking_tokens=details.get("thinking_tokens") or 0,
            cache_write_tokens=cache_write,
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


def _one_line(text: str) -> str:
    return " ".join(text.split())


__all__ = [
    "cache_breakpoints",
    "stop_reason_of",
    "tool_loop_opens_with_thinking",
    "uses_adaptive_thinking",
]
