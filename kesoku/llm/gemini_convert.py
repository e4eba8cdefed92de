"""Translation between Kesoku's IR and google-genai types, for the gemini backend.

Pure functions, no I/O: the IR request as ``types.Content`` values, tool specs as one
``types.Tool``, the thinking level as a budget, and a streamed ``GenerateContentResponse`` back to
IR events. Imported only by :mod:`kesoku.llm.gemini`, so google-genai is loaded only when the gemini
backend is built.

Wire facts used here, with their sources:

- Contents: roles ``user`` and ``model``; function responses answer a model turn's function calls in
  the next user content, one response per call, in call order (Gemini API, "Function calling",
  https://ai.google.dev/gemini-api/docs/function-calling, "Parallel function calling").
- ``FunctionResponse.response`` is a JSON object; ``error`` holds error details (google-genai
  ``types.FunctionResponse`` field description).
- Thought signatures: returned on the same part exactly as received; Gemini 3 rejects with 400 a
  current-turn step whose first function call lacks one; history the model did not produce may carry
  the documented placeholder ``skip_thought_signature_validator`` instead (Gemini API, "Thought
  signatures", https://ai.google.dev/gemini-api/docs/thought-signatures, and its FAQ).
- ``thinkingConfig.thinkingBudget``: 0 disables thinking, the ranges are model-dependent; 2.5 Pro
  cannot disable it and accepts 128 to 32768 (Gemini API, "Gemini thinking",
  https://ai.google.dev/gemini-api/docs/thinking, "Set budgets").
- ``usageMetadata``: ``promptTokenCount`` includes cached tokens, ``candidatesTokenCount`` excludes
  ``thoughtsTokenCount`` (Gemini API reference, "UsageMetadata",
  https://ai.google.dev/api/generate-content#UsageMetadata).
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgspec
import pydantic
from google.genai import types

from kesoku.vocab.errors import BackendError
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
    ToolSpec,
    UsageEvent,
)
from kesoku.vocab.ir import turn_tokens as ir_turn_tokens
from kesoku.vocab.model import Usage

THINKING_BUDGETS_TOKENS: dict[str, int] = {"minimal": 0, "low": 1024, "medium": 8192, "high": 24576}
"""Thinking budget per ``thinking_level``: minimal turns thinking off (where the model allows)."""
PRO_MIN_BUDGET_TOKENS = 128
"""The smallest budget of Pro models, which cannot turn thinking off.

"Gemini thinking", "Set budgets".
"""
PLACEHOLDER_SIGNATURE = b"skip_thought_signature_validator"
"""The documented signature of a function call Gemini did not make ("Thought signatures", FAQ)."""
ATTACHMENT_TOKENS = 258
"""Tokens of one image or document page; the estimate for a non-text attachment.

Gemini API, "Image understanding": 258 tokens per image up to 384 px a side.
"""

# Finish reasons after which an empty answer is normal: the stream simply ends.
_QUIET_FINISH = frozenset(
    {None, types.FinishReason.FINISH_REASON_UNSPECIFIED, types.FinishReason.STOP}
)
# Ids this backend (gemini_<n>) or the transcript (call_<message id>, a "_<id>" suffix when an id
# was reused) made up: Gemini never saw them, so they are not sent.
_SYNTHETIC_ID = re.compile(r"(gemini|call)_\d+(_\d+)*")


def thinking_budget_tokens(level: str, model: str) -> int:
    """Return the thinking budget for ``thinking_level`` on ``model``.

    Args:
        level: ``minimal``, ``low``, ``medium`` or ``high``.
        model: The model id; Pro models get at least :data:`PRO_MIN_BUDGET_TOKENS`.

    Returns:
        The budget in tokens (0: thinking off).
    """
    budget = THINKING_BUDGETS_TOKENS[level]
    if "pro" in model.lower():
        budget = max(budget, PRO_MIN_BUDGET_TOKENS)
    return budget


def is_synthetic_id(call_id: str) -> bool:
    """True for a call id made up by Kesoku rather than issued by Gemini."""
    return _SYNTHETIC_ID.fullmatch(call_id) is not None


def to_content(turn: LLMTurn) -> types.Content | None:
    """Translate one IR turn to a Content; None when nothing in it can be sent (never empty parts).

    User turns: function responses, text, inline attachments, in the turn's order (the transcript
    puts the results first). Assistant turns: thoughts, text, then function calls with their
    signatures. A thought without text lends its signature to the next text part of the turn (it
    came from a text part: see :func:`events_of`); with no text part after it the signature is
    dropped, which the API allows for text parts ("Thought signatures": only function-call
    signatures are validated).
    """
    parts: list[types.Part] = []
    pending_signature: bytes | None = None
    first_call = True
    for block in turn.blocks:
        if isinstance(block, TextBlock):
            if block.text:
                parts.append(types.Part(text=block.text, thought_signature=pending_signature))
                pending_signature = None
        elif isinstance(block, ThoughtBlock):
            if block.text:
                parts.append(
                    types.Part(text=block.text, thought=True, thought_signature=block.signature)
                )
            elif block.signature is not None:
                pending_signature = block.signature
        elif isinstance(block, ImageBlock | DocumentBlock):
            if block.data:
                parts.append(types.Part.from_bytes(data=block.data, mime_type=block.mime_type))
            else:  # the API refuses inline data without bytes
                parts.append(types.Part(text=f"[{block.path}: empty file]"))
        elif isinstance(block, ToolCallBlock):
            signature = block.signature
            if signature is None and first_call:
                signature = PLACEHOLDER_SIGNATURE
            first_call = False
            call = types.FunctionCall(
                id=None if is_synthetic_id(block.id) else block.id,
                name=block.name,
                args=block.arguments,
            )
            parts.append(types.Part(function_call=call, thought_signature=signature))
        else:
            key = "error" if block.is_error else "result"
            response = types.FunctionResponse(
                id=None if is_synthetic_id(block.call_id) else block.call_id,
                name=block.name,
                response={key: block.content},
            )
            parts.append(types.Part(function_response=response))
    if not parts:
        return None
    return types.Content(role="model" if turn.role == "assistant" else "user", parts=parts)


def merge_contents(contents: Iterable[types.Content | None]) -> list[types.Content]:
    """Join per-turn contents: a turn with nothing to send is left out and its neighbours merged.

    Only an assistant turn holding nothing but a bare signature can come out empty; its neighbours
    are user turns, merged so roles still alternate.
    """
    out: list[types.Content] = []
    for content in contents:
        if content is None:
            continue
        if out and out[-1].role == content.role:
            out[-1] = types.Content(
                role=content.role, parts=[*(out[-1].parts or ()), *(content.parts or ())]
            )
        else:
            out.append(content)
    return out


def to_contents(turns: Sequence[LLMTurn]) -> list[types.Content]:
    """Translate turns to contents (see :func:`merge_contents`)."""
    return merge_contents(to_content(t) for t in turns)


def to_tools(specs: Sequence[ToolSpec]) -> list[types.Tool]:
    """All tool specs as one Tool of function declarations, schemas as ``parametersJsonSchema``.

    ``parametersJsonSchema`` takes a JSON Schema as is (Gemini API reference,
    "FunctionDeclaration", https://ai.google.dev/api/caching#FunctionDeclaration), so no conversion
    to the OpenAPI subset of ``parameters`` is needed.
    """
    if not specs:
        return []
    declarations = [
        types.FunctionDeclaration(
            name=s.name, description=s.description, parameters_json_schema=s.parameters
        )
        for s in specs
    ]
    return [types.Tool(function_declarations=declarations)]


def turn_tokens(turn: LLMTurn) -> int:
    """Estimate a turn's tokens.

    As :func:`kesoku.vocab.ir.turn_tokens`, every attachment at one image's cost.
    """
    return ir_turn_tokens(turn, image_tokens=ATTACHMENT_TOKENS, document_tokens=ATTACHMENT_TOKENS)


def turn_digest(turn: LLMTurn) -> bytes:
    """A digest of everything a turn sends (its signatures and attachment bytes included)."""
    return hashlib.blake2b(msgspec.json.encode(turn), digest_size=16).digest()


def prefix_keys(
    model: str, system: str, tools: Sequence[ToolSpec], digests: Iterable[bytes]
) -> list[bytes]:
    """Chained digests of the request prefixes.

    ``keys[k]`` names the model, system, tools and the first ``k`` turns.

    Args:
        model: The model id (a cache belongs to one model).
        system: The system instruction.
        tools: The tool specs.
        digests: :func:`turn_digest` of each turn.

    Returns:
        One key more than there are turns. Two requests with equal ``keys[k]`` send the same first
        ``k`` contents with the same system and tools, so a context cache of that prefix serves
        both.
    """
    key = hashlib.blake2b(msgspec.json.encode([model, system, tools]), digest_size=16).digest()
    keys = [key]
    for digest in digests:
        key = hashlib.blake2b(key + digest, digest_size=16).digest()
        keys.append(key)
    return keys


def to_usage(meta: types.GenerateContentResponseUsageMetadata) -> Usage:
    """Map ``usageMetadata`` to Usage.

    Output counts thinking; input counts the cached and the tool-use prompt tokens.
    """
    thoughts = meta.thoughts_token_count or 0
    return Usage(
        input_tokens=(meta.prompt_token_count or 0) + (meta.tool_use_prompt_token_count or 0),
        output_tokens=(meta.candidates_token_count or 0) + thoughts,
        cached_tokens=meta.cached_content_token_count or 0,
        thinking_tokens=thoughts,
    )


def events_of(chunk: types.GenerateContentResponse, new_id: Callable[[], str]) -> list[LLMEvent]:
    """The events in one streamed chunk.

    Args:
        chunk: One ``GenerateContentResponse`` of the stream.
        new_id: Makes an id for a function call Gemini sent without one.

    Returns:
        Thought parts as ThoughtDelta, text as TextDelta (a signature on a text part follows as a
        ThoughtDelta with empty text, so it is stored), function calls as ToolCallEvent with the
        part's signature, the usage when the chunk has it, and the stop reason when the
        candidate has a finish reason (see :func:`stop_reason_of`).
    """
    events: list[LLMEvent] = []
    candidate = chunk.candidates[0] if chunk.candidates else None
    parts = (
        candidate.content.parts if candidate is not None and candidate.content is not None else None
    )
    for part in parts or ():
        signature = part.thought_signature
        if part.function_call is not None:
            call = part.function_call
            block = ToolCallBlock(
                id=call.id or new_id(),
                name=call.name or "",
                arguments=dict(call.args or {}),
                signature=signature,
            )
            events.append(ToolCallEvent(block))
        elif part.thought:
            if part.text or signature is not None:
                events.append(ThoughtDelta(part.text or "", signature=signature))
        else:
            if part.text:
                events.append(TextDelta(part.text))
            if signature is not None:
                events.append(ThoughtDelta("", signature=signature))
    if chunk.usage_metadata is not None:
        events.append(UsageEvent(to_usage(chunk.usage_metadata)))
    reason = candidate.finish_reason if candidate is not None else None
    if reason is not None and reason != types.FinishReason.FINISH_REASON_UNSPECIFIED:
        name = reason.value if isinstance(reason, types.FinishReason) else str(reason)
        events.append(StopEvent(stop_reason_of(name), name))
    return events


def stop_reason_of(finish_reason: str) -> StopReason:
    """The IR's stop reason for a Gemini ``FinishReason`` name.

    ``STOP``: finished; ``MAX_TOKENS``: cut at ``maxOutputTokens`` (the model's own limit: Kesoku
    sends none); ``MALFORMED_FUNCTION_CALL`` (and ``UNEXPECTED_TOOL_CALL``): the function call is
    not valid; any other (SAFETY, RECITATION, ...): other (Gemini API reference, "FinishReason",
    https://ai.google.dev/api/generate-content#FinishReason).
    """
    if finish_reason == "STOP":
        return StopReason.END
    if finish_reason == "MAX_TOKENS":
        return StopReason.MAX_TOKENS
    if finish_reason in ("MALFORMED_FUNCTION_CALL", "UNEXPECTED_TOOL_CALL"):
        return StopReason.MALFORMED
    return StopReason.OTHER


def has_answer(chunk: types.GenerateContentResponse) -> bool:
    """True when the chunk holds answer text or a function call (thoughts do not count)."""
    candidate = chunk.candidates[0] if chunk.candidates else None
    if candidate is None or candidate.content is None:
        return False
    return any(
        (p.text and not p.thought) or p.function_call is not None
        for p in candidate.content.parts or ()
    )


def check_refusal(chunk: types.GenerateContentResponse, answered: bool) -> None:
    """Raise when the prompt was blocked, or the model stopped with no answer for a non-STOP reason.

    Args:
        chunk: One streamed chunk.
        answered: Whether answer text or a function call arrived earlier in the stream or in
            ``chunk``.

    Raises:
        BackendError: Not retryable: ``promptFeedback.blockReason`` is set, or the finish reason is
            SAFETY, RECITATION, MALFORMED_FUNCTION_CALL, MAX_TOKENS, ... and no answer arrived
            (Gemini API reference, "FinishReason" and "PromptFeedback",
            https://ai.google.dev/api/generate-content#FinishReason).
    """
    feedback = chunk.prompt_feedback
    if feedback is not None and feedback.block_reason is not None:
        detail = (
            f": {one_line(feedback.block_reason_message)}" if feedback.block_reason_message else ""
        )
        raise BackendError(
            f"gemini: the prompt was blocked ({feedback.block_reason.value}){detail}"
        )
    candidate = chunk.candidates[0] if chunk.candidates else None
    if candidate is None or answered:
        return
    reason = candidate.finish_reason
    if reason in _QUIET_FINISH or reason == types.FinishReason.CONTINUATION:
        return
    name = reason.value if isinstance(reason, types.FinishReason) else str(reason)
    detail = f": {one_line(candidate.finish_message)}" if candidate.finish_message else ""
    raise BackendError(
        f"gemini: the model stopped without an answer (finish reason {name}){detail}"
    )


def one_line(text: object, limit: int = 500) -> str:
    """Collapse whitespace so a provider message fits the one-line error rule; cut at ``limit``."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def retry_delay_s(details: Any) -> float | None:
    """Read ``google.rpc.RetryInfo.retryDelay`` (``"7s"``, ``"0.5s"``) from an error body's details.

    The Gemini API sends the wait of a 429 there rather than in a ``retry-after`` header (Google
    AIP-193, "Errors", https://google.aip.dev/193, ``RetryInfo``).
    """
    error = details.get("error", details) if isinstance(details, dict) else None
    if not isinstance(error, dict):
        return None
    for item in error.get("details") or ():
        if isinstance(item, dict) and str(item.get("@type", "")).endswith("google.rpc.RetryInfo"):
            match = re.fullmatch(r"(\d+(?:\.\d+)?)s", str(item.get("retryDelay", "")))
            if match:
                return float(match.group(1))
    return None


def error_reasons(details: Any) -> set[str]:
    """The ``google.rpc.ErrorInfo.reason`` values of an error body (``API_KEY_INVALID``, ...)."""
    error = details.get("error", details) if isinstance(details, dict) else None
    if not isinstance(error, dict):
        return set()
    return {
        str(item.get("reason"))
        for item in error.get("details") or ()
        if isinstance(item, dict) and str(item.get("@type", "")).endswith("google.rpc.ErrorInfo")
    }


_sdk_types_built = False
_sdk_types_lock = threading.Lock()  # two backends may build their clients in two threads at once


def sdk_types_built() -> bool:
    """True once :func:`build_sdk_types` ran in this process."""
    return _sdk_types_built


def build_sdk_types() -> None:
    """Build google-genai's pydantic models now, in the calling (worker) thread.

    The SDK declares them with ``defer_build``, so each is built at its first use: about 0.3 s of
    CPU in all, which would otherwise land on the event loop during the first request (measured:
    60 ms in one step).
    """
    global _sdk_types_built
    with _sdk_types_lock:
        if _sdk_types_built:
            return
        for value in vars(types).values():
            if (
                isinstance(value, type)
                and issubclass(value, pydantic.BaseModel)
                and value.__module__ == types.__name__
            ):
                value.model_rebuild()
        _sdk_types_built = True
