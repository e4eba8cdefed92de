"""Translation between Kesoku's IR and Chat Completions JSON, for the openai backend.

Pure functions and the stream assembler, no I/O: the IR request as ``messages`` and ``tools``, and
the streamed ``chat.completion.chunk`` objects (SDK models or plain dicts) back to IR events. Used
by :mod:`kesoku.llm.openai`; it does not import the ``openai`` SDK. Wire facts come from the Chat
Completions reference (https://platform.openai.com/docs/api-reference/chat/create) and its
streaming chunk object (https://platform.openai.com/docs/api-reference/chat-streaming).

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
import uuid
from collections.abc import Sequence
from typing import Any

import msgspec

from kesoku.vocab.ir import (
    DocumentBlock,
    ImageBlock,
    LLMEvent,
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


__all__ = ["build_messages", "decode_arguments", "stop_reason_of"]
