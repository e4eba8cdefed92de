"""The provider-neutral intermediate representation (IR) every backend translates from.

A request is a system prompt, a list of :class:`LLMTurn` (user and assistant, strictly alternating)
and the tool specs. Backends map it to their wire format (``_build_native_input``) and their stream
back to :data:`LLMEvent` values (``_parse``). See ARCHITECTURE.md.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from enum import StrEnum
from typing import Any, Literal

import msgspec

from kesoku.vocab.model import Outcome, Usage
from kesoku.vocab.text import valid_data, valid_text


# The turns and blocks of a request are not tracked by the garbage collector (gc=False), as a
# Message is not: why no cycle can form is said in kesoku.vocab.model, above Metadata.
class TextBlock(msgspec.Struct, frozen=True, tag="text", gc=False):
    """Plain text from the user or the model."""

    text: str


class ThoughtBlock(msgspec.Struct, frozen=True, tag="thought", gc=False):
    """The model's visible reasoning.

    ``signature`` is the provider's opaque token, sent back as received.

    ``signed_by`` is the provider that made the signature: only that provider can verify it, so
    another backend (a fallback, a session's model switch) gets the thought without it (see
    :func:`without_foreign_signatures`).
    """

    text: str
    signature: bytes | None = None
    signed_by: str | None = None


class ImageBlock(msgspec.Struct, frozen=True, tag="image", gc=False):
    """An image attachment.

    ``data`` is loaded (off the event loop) just before the request is built.
    """

    path: str
    mime_type: str
    data: bytes = b""


class DocumentBlock(msgspec.Struct, frozen=True, tag="document", gc=False):
    """A non-image attachment (PDF, text); ``data`` as for :class:`ImageBlock`."""

    path: str
    mime_type: str
    filename: str = ""
    data: bytes = b""


class ToolCallBlock(msgspec.Struct, frozen=True, tag="tool_call", gc=False):
    """A request of the model to run a tool.

    Attributes:
        id: The provider's call id (Claude ``tool_use.id``, OpenAI ``tool_calls[].id``); for a call
            read back from the store without one, ``call_<message id>``.
        name: The tool's name.
        arguments: The arguments, decoded from the model's JSON.
        signature: Gemini's thought signature on this function-call part (Gemini API, "Thought
            signatures": it must be returned on the same part).
        signed_by: The provider that made ``signature``.
    """

    id: str
    name: str
    arguments: dict[str, Any]
    signature: bytes | None = None
    signed_by: str | None = None


class ToolResultBlock(msgspec.Struct, frozen=True, tag="tool_result", gc=False):
    """The result of one tool call; ``call_id`` is its :attr:`ToolCallBlock.id`."""

    call_id: str
    name: str
    content: str
    outcome: Outcome = Outcome.COMPLETED

    @property
    def is_error(self) -> bool:
        """True unless the tool completed."""
        return self.outcome is not Outcome.COMPLETED


LLMBlock = TextBlock | ThoughtBlock | ImageBlock | DocumentBlock | ToolCallBlock | ToolResultBlock


class LLMTurn(msgspec.Struct, frozen=True, gc=False):
    """One side's turn: a role and its blocks, in order."""

    role: Literal["user", "assistant"]
    blocks: tuple[LLMBlock, ...]


class ToolSpec(msgspec.Struct, frozen=True):
    """A tool as the model sees it.

    Attributes:
        name: The tool's name.
        description: What it does and when to use it.
        parameters: A JSON Schema object for its arguments.
    """

    name: str
    description: str
    parameters: dict[str, Any] = msgspec.field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )


class LLMRequest(msgspec.Struct, frozen=True):
    """Everything one model call is given: exactly what the turn log records as sent.

    ``max_output_tokens`` raises the backend's own output limit for this call (the retry after a
    reply cut at its limit, :meth:`~kesoku.llm.base.BaseLLM.larger_output_limit`); None: the
    backend's.
    """

    system: str
    turns: tuple[LLMTurn, ...]
    tools: tuple[ToolSpec, ...] = ()
    max_output_tokens: int | None = None


# -- streaming events -----------------------------------------------------------------------------


class TextDelta(msgspec.Struct, frozen=True, tag="text_delta"):
    """A chunk of visible answer text."""

    text: str


class ThoughtDelta(msgspec.Struct, frozen=True, tag="thought_delta"):
    """A chunk of reasoning text, or (with empty text) a signature that closes a thought."""

    text: str
    signature: bytes | None = None
    signed_by: str | None = None


class ToolCallEvent(msgspec.Struct, frozen=True, tag="tool_call"):
    """A complete tool call (backends assemble streamed argument fragments before emitting it)."""

    call: ToolCallBlock


class UsageEvent(msgspec.Struct, frozen=True, tag="usage"):
    """Token counts of the call so far; a later event replaces an earlier one."""

    usage: Usage


class StopReason(StrEnum):
    """Why the provider ended a reply, in the IR's terms."""

    END = "end"
    """The model finished: its answer, or its tool calls (OpenAI ``stop``/``tool_calls``, Claude
    ``end_turn``/``tool_use``/``stop_sequence``, Gemini ``STOP``)."""
    MAX_TOKENS = "max_tokens"
    """Cut at the output limit: OpenAI, Ollama and llama.cpp ``finish_reason: "length"``, Claude
    ``max_tokens`` (and ``model_context_window_exceeded``), Gemini ``MAX_TOKENS``. Its tool calls
    may be incomplete and are not run."""
    MALFORMED = "malformed"
    """The provider flagged the reply's function call as malformed (Gemini
    ``MALFORMED_FUNCTION_CALL``); its tool calls are not run."""
    OTHER = "other"
    """Ended for another reason the provider names (a content filter, a refusal, safety)."""


CUT_REPLIES = frozenset({StopReason.MAX_TOKENS, StopReason.MALFORMED})
"""Stop reasons after which a reply's tool calls are not run."""


class StopEvent(msgspec.Struct, frozen=True, tag="stop"):
    """Why the reply ended; ``detail`` is the provider's own value (``length``, ``MAX_TOKENS``)."""

    reason: StopReason
    detail: str = ""


LLMEvent = TextDelta | ThoughtDelta | ToolCallEvent | UsageEvent | StopEvent


class LLMResponse(msgspec.Struct, frozen=True, kw_only=True):
    """A whole model step, assembled from its events.

    Attributes:
        text: The visible answer text.
        thoughts: The reasoning text.
        thought_signature: The last signature of a thought (Gemini, Claude thinking).
        thought_blocks: The thoughts as the provider delimited them: a signature closes a block.
            Claude's interleaved thinking gives several signed blocks in one step, and each must go
            back with its own signature (Anthropic docs, "Extended thinking": thinking blocks are
            returned unmodified).
        tool_calls: The tool calls, in the order the model made them.
        usage: Token counts.
        stop_reason: Why the reply ended; None when the provider did not say (a cut stream).
        stop_detail: The provider's own stop reason, for messages (``length``, ``max_tokens``).
    """

    text: str = ""
    thoughts: str = ""
    thought_signature: bytes | None = None
    thought_blocks: tuple[ThoughtBlock, ...] = ()
    tool_calls: tuple[ToolCallBlock, ...] = ()
    usage: Usage = msgspec.field(default_factory=Usage)
    stop_reason: StopReason | None = None
    stop_detail: str = ""

    @property
    def cut(self) -> bool:
        """True when the reply ended at its output limit or was flagged malformed.

        Its calls are not run.
        """
        return self.stop_reason in CUT_REPLIES

    def cut_description(self, limit: int | None) -> str:
        """What cut the reply, for the model and the user.

        For example: ``cut at 4096 output tokens (its output limit)``.

        Args:
            limit: The output limit the request had, when the usage gives no output tokens.
        """
        if self.stop_reason is StopReason.MALFORMED:
            return f"flagged as malformed by the provider ({self.stop_detail})"
        tokens = self.usage.output_tokens or limit
        return (
            f"cut at {tokens} output tokens (its output limit)"
            if tokens
            else "cut at its output limit"
        )


class ResponseBuilder:
    """Accumulates a stream's events; :meth:`build` gives the response so far (also after a cut)."""

    def __init__(self) -> None:
        self._text: list[str] = []
        self._thoughts: list[str] = []
        self._signature: bytes | None = None
        self._blocks: list[ThoughtBlock] = []
        self._block_text: list[str] = []  # the open thought block's text
        self._calls: list[ToolCallBlock] = []
        self._usage = Usage()
        self._stop: StopEvent | None = None
        self.events = 0
        """How many events were added."""

    def add(self, event: LLMEvent) -> None:
        """Fold one event in."""
        self.events += 1
        if isinstance(event, TextDelta):
            self._text.append(event.text)
        elif isinstance(event, ThoughtDelta):
            self._thoughts.append(event.text)
            self._block_text.append(event.text)
            if event.signature is not None:
                self._signature = event.signature
                self._blocks.append(
                    ThoughtBlock("".join(self._block_text), event.signature, event.signed_by)
                )
                self._block_text = []
        elif isinstance(event, ToolCallEvent):
            self._calls.append(event.call)
        elif isinstance(event, StopEvent):
            self._stop = event
        else:
            self._usage = event.usage

    def build(self) -> LLMResponse:
        """Return the response assembled so far."""
        blocks = list(self._blocks)
        # an unsigned tail (a cut stream, or a provider without signatures)
        if "".join(self._block_text):
            blocks.append(ThoughtBlock("".join(self._block_text)))
        return LLMResponse(
            text="".join(self._text),
            thoughts="".join(self._thoughts),
            thought_signature=self._signature,
            thought_blocks=tuple(blocks),
            tool_calls=tuple(self._calls),
            usage=self._usage,
            stop_reason=None if self._stop is None else self._stop.reason,
            stop_detail="" if self._stop is None else self._stop.detail,
        )


def signed(event: LLMEvent, provider: str) -> LLMEvent:
    """The event with ``signed_by`` set on its signature.

    For a backend's events, as its stream yields them.
    """
    if isinstance(event, ThoughtDelta) and event.signature is not None:
        return msgspec.structs.replace(event, signed_by=provider)
    if isinstance(event, ToolCallEvent) and event.call.signature is not None:
        return ToolCallEvent(msgspec.structs.replace(event.call, signed_by=provider))
    return event


def valid_event(event: LLMEvent) -> LLMEvent:
    r"""The event with its text, tool name, call id and arguments made encodable as UTF-8.

    A provider's JSON may carry a lone surrogate (an escape such as ``\ud800``, or an escaped pair
    cut by the stream) which every consumer of the event would fail on: the store, the live events
    an adapter prints, the turn log. Applied to every event a backend parses (:class:`BaseLLM
    <kesoku.llm.base.BaseLLM>`), it replaces them with U+FFFD (:mod:`kesoku.vocab.text`). Returns
    ``event`` itself when nothing changes.
    """
    if isinstance(event, TextDelta | ThoughtDelta):
        text = valid_text(event.text)
        return event if text is event.text else msgspec.structs.replace(event, text=text)
    if isinstance(event, ToolCallEvent):
        call = event.call
        id_, name = valid_text(call.id), valid_text(call.name)
        arguments = valid_data(call.arguments)
        if id_ is call.id and name is call.name and arguments is call.arguments:
            return event
        return ToolCallEvent(msgspec.structs.replace(call, id=id_, name=name, arguments=arguments))
    return event


def without_foreign_signatures(request: LLMRequest, provider: str) -> LLMRequest:
    """The request with every signature another provider made removed.

    A signature only its maker can verify: Gemini rejects a foreign ``thought_signature`` and Claude
    a foreign thinking ``signature`` (both with 400), so a thought or call made by one backend and
    sent to another goes without it. A signature of unknown origin (``signed_by`` None: written
    before Kesoku recorded it) is kept. Returns ``request`` itself when nothing changes.
    """
    turns = tuple(own_signatures(turn, provider) for turn in request.turns)
    changed = any(map(operator.is_not, turns, request.turns))
    return msgspec.structs.replace(request, turns=turns) if changed else request


def own_signatures(turn: LLMTurn, provider: str) -> LLMTurn:
    """The turn without signatures another provider made (the same object when it has none)."""
    if turn.role == "user":  # signatures are only on the model's own blocks
        return turn
    blocks = [
        msgspec.structs.replace(block, signature=None, signed_by=None)
        if isinstance(block, ThoughtBlock | ToolCallBlock)
        and block.signature is not None
        and block.signed_by not in (None, provider)
        else block
        for block in turn.blocks
    ]
    return (
        turn if all(map(operator.is_, blocks, turn.blocks)) else LLMTurn(turn.role, tuple(blocks))
    )


_encode = msgspec.json.Encoder().encode


def estimate_tokens(text: str) -> int:
    """A provider-free token estimate: about four characters per token for English and code."""
    return (len(text) + 3) // 4


def turn_tokens(turn: LLMTurn, *, image_tokens: int, document_tokens: int) -> int:
    """Estimate a turn's tokens: its text at four characters a token, attachments at a fixed cost.

    Text documents count by their size; images and other documents by what the provider bills for
    one (``image_tokens``, ``document_tokens``).
    """
    # A worker's first request measures every turn of its session: the blocks are told apart by
    # their exact type (the block types have no subclass) and the four-characters rule is written
    # out: half the time of isinstance and a call per block.
    total = 0
    for block in turn.blocks:
        if type(block) is TextBlock or type(block) is ThoughtBlock:
            total += (len(block.text) + 3) // 4
        elif type(block) is ToolResultBlock:
            total += (len(block.content) + 3) // 4
        elif type(block) is ToolCallBlock:
            total += (len(block.name) + 3) // 4 + (len(_encode(block.arguments)) + 3) // 4
        elif type(block) is DocumentBlock and block.mime_type.startswith("text/"):
            total += (len(block.data) + 3) // 4
        else:
            total += image_tokens if type(block) is ImageBlock else document_tokens
    return total


def head_tokens(system: str, tools: Sequence[ToolSpec]) -> int:
    """Estimate the tokens of a system prompt and the tool schemas."""
    return estimate_tokens(system) + (len(msgspec.json.encode(tools)) + 3) // 4
