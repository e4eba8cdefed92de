"""The shared vocabulary: messages, sessions, their enums, sender rules and typed tool outcomes.

Everything that crosses a module boundary (the gateway, the store, the runtime, the adapters) speaks
in these frozen msgspec Structs (ARCHITECTURE.md, "Messages and sessions"). Metadata is stored as
msgspec JSON.
"""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Any

import msgspec

from kesoku.vocab.text import valid_data, valid_text


class Role(StrEnum):
    """Who a message speaks for."""

    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"
    SYSTEM = "system"


class Kind(StrEnum):
    """What a message holds."""

    TEXT = "text"
    THOUGHT = "thought"
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"


class Status(StrEnum):
    """Where a message is in its lifecycle.

    A user message goes pending → processing → done (or interrupted / failed); model output is
    written done, or interrupted when a new user message or a stop cut its stream.
    """

    PENDING = "pending"
    PROCESSING = "processing"
    DONE = "done"
    INTERRUPTED = "interrupted"
    FAILED = "failed"


class Outcome(StrEnum):
    """How a tool call ended; shown truthfully to the model and the user."""

    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    SKIPPED = "skipped"
    """Never started: the turn was interrupted or stopped first."""
    KILLED = "killed"
    """Its process group was killed by a forced stop."""
    LOST = "lost"
    """The daemon died while it ran; its effect is unknown."""
    REPEATED = "repeated"
    """Not run: the same call already ran in the turn and returned the same each time
    (kesoku.agent.repeat)."""
    TRUNCATED = "truncated"
    """Not run: the reply that made it was cut at its output limit or flagged malformed by the
    provider."""


ASSISTANT_SENDER = "Kesoku"
"""The sender of assistant text, thoughts and tool calls."""
SYSTEM_SENDER = "System"
"""The sender of system notifications."""
DEFAULT_USER_SENDER = "User"
"""The sender of user input when the platform gives no name."""

# The kinds each role may carry; anything else is refused before it reaches the store.
_ROLE_KINDS: dict[Role, frozenset[Kind]] = {
    Role.USER: frozenset({Kind.TEXT}),
    Role.ASSISTANT: frozenset({Kind.TEXT, Kind.THOUGHT, Kind.TOOL_CALL}),
    Role.TOOL: frozenset({Kind.TOOL_RESULT}),
    Role.SYSTEM: frozenset({Kind.TEXT}),
}


class Attachment(msgspec.Struct, frozen=True, kw_only=True):
    """A file received with a user message and saved in the session workspace.

    Attributes:
        path: Absolute path of the saved file.
        mime_type: Its MIME type, for example ``image/png``.
        filename: The name the user gave it (made safe).
    """

    path: str
    mime_type: str
    filename: str


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """Token counts of one model call, as the provider reported them.

    Attributes:
        input_tokens: The whole input, cached and cache-written tokens included.
        output_tokens: The whole output, thinking included.
        cached_tokens: The part of the input read from the provider's cache.
        thinking_tokens: The part of the output spent thinking.
        cache_write_tokens: The part of the input written to the provider's cache (Claude's
            ``cache_creation_input_tokens``; priced apart by Anthropic).
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    thinking_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens (cached and thinking tokens are already inside them)."""
        return self.input_tokens + self.output_tokens


# Metadata and Message (and the request's turns and blocks, kesoku.vocab.ir) are not tracked by the
# cyclic garbage collector (msgspec gc=False): a worker holds one of each per message of its
# session, and collections that scanned them all for nothing cost a long session's first request
# several ms. A cycle through an untracked struct would never be freed, and none can form: they are
# frozen (their fields set once, to objects made before them) and their only mutable fields are
# dicts of JSON data (decoded from the store, or a model's arguments), which hold no cycle and no
# Kesoku object. tests/test_vocab_gc.py checks the fields every untracked struct can reach.
class Metadata(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """Structured fields of a message; stored as msgspec JSON with defaults omitted.

    Unknown fields are tolerated on decode so a database written by a newer Kesoku stays readable.

    Attributes:
        tool_name: The tool of a tool_call or tool_result.
        tool_arguments: The arguments of a tool_call, as the model sent them.
        call_id: The provider's id of a tool call (Claude ``tool_use.id``, OpenAI
            ``tool_calls[].id``, Gemini ``function_call.id``), sent back with its result; empty when
            the provider gave none.
        thought_signature: The provider's opaque signature on a thought or a function-call part,
            sent back exactly as received (Gemini API, "Thought signatures"; Anthropic, "Extended
            thinking").
        signed_by: The provider that made ``thought_signature`` (only it can verify it).
        attachments: Files that came with a user message.
        usage: Token counts of the model call that produced this message; only the first message a
            call posts carries them, whatever its kind (a tool call; the notice of a failed call),
            so each call counts once. Older sessions have them on a call's last thought or text:
            also once.
        outcome: How a tool call ended (tool_result only).
        extra: Adapter- or backend-specific fields that have no home above.
    """

    tool_name: str | None = None
    tool_arguments: dict[str, Any] | None = None
    call_id: str | None = None
    thought_signature: bytes | None = None
    signed_by: str | None = None
    attachments: tuple[Attachment, ...] = ()
    usage: Usage | None = None
    outcome: Outcome | None = None
    extra: dict[str, Any] = msgspec.field(default_factory=dict)


EMPTY_METADATA = Metadata()


class TaintSource(msgspec.Struct, frozen=True):
    """Content from outside the workspace's trust that entered a session.

    Deduplicated by kind and label.

    Attributes:
        kind: ``file`` (read outside the workspace), ``attachment``, ``url`` or ``mcp``.
        label: The path, file name, URL or server name.
    """

    kind: str
    label: str


class Message(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One entry of a session's durable log.

    ``id`` is 0 until the gateway persists the message and assigns the store's monotonic id; ids are
    never reused, so a listener's cursor is just the last id it saw.

    Attributes:
        id: Monotonic id from the store (0 before it is posted).
        session_id: The session the message belongs to.
        role: Who speaks.
        kind: What it holds.
        status: Where it is in its lifecycle.
        sender: The user's name, ``Kesoku``, the tool's name, or ``System`` (see
            :func:`check_message`).
        content: The text, thought, tool call summary or tool output.
        root_id: The user message that opened the turn (its own id for that message, filled in by
            the store when left 0).
        parent_id: A tool_result's tool_call.
        ts: When it was written, UNIX seconds.
        root_ts: ``ts`` of the turn's root message: history is ordered by (root_ts, ts, id) so a
            turn's messages stay together.
        metadata: Structured fields.
        external_id: The chat platform's id of the message, unique per adapter (deduplication).
    """

    session_id: str
    role: Role
    kind: Kind = Kind.TEXT
    status: Status = Status.DONE
    sender: str
    content: str = ""
    id: int = 0
    root_id: int = 0
    parent_id: int | None = None
    ts: float = 0.0
    root_ts: float = 0.0
    metadata: Metadata = EMPTY_METADATA
    external_id: str | None = None


class Session(msgspec.Struct, frozen=True, kw_only=True):
    """One conversation: a Discord thread, a Google Chat thread or space, a terminal session.

    Attributes:
        id: Kesoku's id of the session.
        adapter: The chatbot id of the adapter that owns it (``discord``, ``gchat``, ``terminal``).
        channel_id: The platform's thread or space id.
        created_at: UNIX seconds, synced to the first platform message when known.
        title: A short generated title.
        llm: A backend override for this session.
        workspace: Absolute path of the session's folder (``sessions/<id>/``).
        parent_id: The session this one was forked from.
        metadata: Free-form adapter fields.
    """

    id: str
    adapter: str
    channel_id: str
    created_at: float
    workspace: str
    title: str | None = None
    llm: str | None = None
    parent_id: str | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)


QUESTION_KEY = "question"
"""``metadata.extra`` key of a question to the user (kesoku.agent.questions):
``{"options": ["Allow", "Deny"]}``."""
ANSWER_KEY = "answer_to"
"""``metadata.extra`` key of the record of an answer: the question's message id (with
``choice``)."""

ALLOW = "Allow"
"""The choice on a tool's question that lets the tool run."""
DENY = "Deny"
"""The choice that refuses it; no answer in time counts as this."""

_ANSWER_WORDS = {
    "allow": ALLOW,
    "a": ALLOW,
    "y": ALLOW,
    "yes": ALLOW,
    "deny": DENY,
    "d": DENY,
    "n": DENY,
    "no": DENY,
}


def parse_answer(text: str) -> str | None:
    """``Allow`` or ``Deny`` for a typed answer, else None.

    Typed answers: ``y``, ``yes``, ``allow``, ``n``, ``no``, ``deny``.
    """
    return _ANSWER_WORDS.get(text.strip().lower().rstrip(".!"))


def is_question(message: Message) -> bool:
    """True for a question a tool asked the user (a system message; never shown to the model)."""
    return message.role is Role.SYSTEM and QUESTION_KEY in message.metadata.extra


def is_answer(message: Message) -> bool:
    """True for the record of a question's answer (a system message; never shown to the model)."""
    return message.role is Role.SYSTEM and ANSWER_KEY in message.metadata.extra


class MessageError(ValueError):
    """A message breaks the role, kind or sender rules; raised before anything is written."""


def check_message(msg: Message) -> None:
    """Check the role, kind and sender rules of ARCHITECTURE.md, "Messages and sessions".

    - user: text, any non-empty sender (the platform's user name, or ``User``);
    - assistant: text, thought or tool_call, sender ``Kesoku``; a tool_call names its tool;
    - tool: tool_result, sender = the tool's name, with ``parent_id`` (its tool_call) and an
      outcome;
    - system: text, sender ``System``.

    Args:
        msg: The message about to be posted.

    Raises:
        MessageError: Naming the rule that was broken.
    """
    if msg.kind not in _ROLE_KINDS[msg.role]:
        raise MessageError(f"a {msg.role} message cannot be a {msg.kind}")
    if not msg.session_id:
        raise MessageError("a message needs a session_id")
    meta = msg.metadata
    if msg.role is Role.USER:
        if not msg.sender:
            raise MessageError("a user message needs a sender (the user's name, or 'User')")
    elif msg.role is Role.ASSISTANT:
        if msg.sender != ASSISTANT_SENDER:
            raise MessageError(
                f"assistant messages are sent by {ASSISTANT_SENDER!r}, not {msg.sender!r}"
            )
        if msg.kind is Kind.TOOL_CALL and not meta.tool_name:
            raise MessageError("a tool_call needs metadata.tool_name")
    elif msg.role is Role.TOOL:
        if not meta.tool_name or msg.sender != meta.tool_name:
            raise MessageError(
                "a tool_result is sent by its tool: sender must equal metadata.tool_name"
            )
        if msg.parent_id is None:
            raise MessageError("a tool_result needs parent_id (its tool_call)")
        if meta.outcome is None:
            raise MessageError("a tool_result needs metadata.outcome")
    elif msg.sender != SYSTEM_SENDER:
        raise MessageError(f"system messages are sent by {SYSTEM_SENDER!r}, not {msg.sender!r}")


def valid_message(msg: Message) -> Message:
    """The message with every text field made encodable as UTF-8.

    The store applies it to each message it writes, so no lone surrogate from a platform, a tool or
    a model reaches SQLite, the metadata JSON or a listener. Returns ``msg`` itself when nothing
    changes (almost always; about a µs, bench/text_bench.py). Each text field goes through
    :func:`kesoku.vocab.text.valid_text`.
    """
    content, sender = valid_text(msg.content), valid_text(msg.sender)
    external_id = msg.external_id and valid_text(msg.external_id)
    meta = msg.metadata if msg.metadata is EMPTY_METADATA else _valid_metadata(msg.metadata)
    same = content is msg.content and sender is msg.sender and external_id is msg.external_id
    if same and meta is msg.metadata:
        return msg
    return msgspec.structs.replace(
        msg, content=content, sender=sender, external_id=external_id, metadata=meta
    )


def _valid_metadata(meta: Metadata) -> Metadata:
    tool_name = meta.tool_name and valid_text(meta.tool_name)
    arguments = valid_data(meta.tool_arguments)
    call_id = meta.call_id and valid_text(meta.call_id)
    signed_by = meta.signed_by and valid_text(meta.signed_by)
    extra = valid_data(meta.extra)
    if (
        tool_name is meta.tool_name
        and arguments is meta.tool_arguments
        and call_id is meta.call_id
        and signed_by is meta.signed_by
        and extra is meta.extra
    ):
        return meta
    return msgspec.structs.replace(
        meta,
        tool_name=tool_name,
        tool_arguments=arguments,
        call_id=call_id,
        signed_by=signed_by,
        extra=extra,
    )


def user_text(
    session_id: str,
    content: str,
    *,
    sender: str = DEFAULT_USER_SENDER,
    external_id: str | None = None,
    attachments: tuple[Attachment, ...] = (),
    ts: float | None = None,
) -> Message:
    """Build a pending user message (it opens a turn: its root is itself).

    Args:
        session_id: The session.
        content: What the user wrote.
        sender: The platform's user name.
        external_id: The platform's message id, for deduplication.
        attachments: Files saved in the session workspace.
        ts: UNIX seconds; now when None.

    Returns:
        The message, not yet posted.
    """
    now = time.time() if ts is None else ts
    meta = Metadata(attachments=attachments) if attachments else EMPTY_METADATA
    return Message(
        session_id=session_id,
        role=Role.USER,
        kind=Kind.TEXT,
        status=Status.PENDING,
        sender=sender,
        content=content,
        ts=now,
        root_ts=now,
        metadata=meta,
        external_id=external_id,
    )


def system_text(session_id: str, content: str, *, ts: float | None = None) -> Message:
    """Build a system notification, a turn of its own.

    Args:
        session_id: The session.
        content: The notification.
        ts: UNIX seconds; now when None.

    Returns:
        The message, not yet posted.
    """
    now = time.time() if ts is None else ts
    return Message(
        session_id=session_id,
        role=Role.SYSTEM,
        sender=SYSTEM_SENDER,
        content=content,
        ts=now,
        root_ts=now,
    )


def in_turn(
    root: Message,
    role: Role,
    kind: Kind,
    content: str,
    *,
    status: Status = Status.DONE,
    parent_id: int | None = None,
    metadata: Metadata = EMPTY_METADATA,
    ts: float | None = None,
) -> Message:
    """Build a message inside the turn opened by ``root`` (same root id and root_ts).

    The sender follows from the role: ``Kesoku`` for the assistant, the tool's name for a tool
    result, ``System`` for the system.

    Args:
        root: The posted user message that opened the turn.
        role: ASSISTANT, TOOL or SYSTEM.
        kind: A kind the role allows.
        content: The text.
        status: Lifecycle status.
        parent_id: A tool_result's tool_call id.
        metadata: Structured fields.
        ts: UNIX seconds; now when None.

    Returns:
        The message, not yet posted.

    Raises:
        MessageError: When ``root`` has not been posted, or the role is USER.
    """
    if root.id == 0:
        raise MessageError("the root message must be posted before messages of its turn")
    if role is Role.USER:
        raise MessageError("a user message opens its own turn: use user_text()")
    if role is Role.ASSISTANT:
        sender = ASSISTANT_SENDER
    elif role is Role.TOOL:
        sender = metadata.tool_name or ""
    else:
        sender = SYSTEM_SENDER
    return Message(
        session_id=root.session_id,
        role=role,
        kind=kind,
        status=status,
        sender=sender,
        content=content,
        root_id=root.root_id or root.id,
        root_ts=root.root_ts,
        parent_id=parent_id,
        ts=time.time() if ts is None else ts,
        metadata=metadata,
    )
