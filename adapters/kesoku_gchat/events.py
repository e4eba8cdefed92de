"""Google Chat interaction events, as they arrive in Pub/Sub message data (pure: no Google imports).

A Chat app configured with a Pub/Sub connection gets each interaction event published to its topic
as the event's JSON (Chat API reference, ``Event``: ``type``, ``eventTime``, ``message``, ``user``,
``space``, ``action``, ``common``; the Pub/Sub quickstart "Build a Google Chat app behind a firewall
with Pub/Sub"). Only the fields Kesoku uses are read; anything else is ignored, so a newer event
format still parses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

MESSAGE = "MESSAGE"
"""A user wrote to the app (a direct message, an @mention, or a message in a thread it is in)."""
CARD_CLICKED = "CARD_CLICKED"
"""A user clicked a button of a card the app sent (Event.action, Event.common)."""

ANSWER_FUNCTION = "kesoku.answer"
"""``onClick.action.function`` of Allow/Deny buttons; parameters ``question_id`` and ``choice``."""
STOP_FUNCTION = "kesoku.stop"
"""``onClick.action.function`` of a turn card's stop button; parameter ``session_id``."""


class EventError(ValueError):
    """The Pub/Sub message is not a Chat event Kesoku can read (it is acked and dropped)."""


@dataclass(frozen=True, slots=True)
class ChatAttachment:
    """One ``Message.attachment[]`` entry (Chat API reference, ``Attachment``).

    Attributes:
        name: The attachment's resource name.
        content_name: The file name the user gave it.
        content_type: Its MIME type.
        resource_name: ``attachmentDataRef.resourceName``, the media API's id of uploaded content
            (``GET /v1/media/{resourceName}?alt=media``); empty for a Drive file.
        drive_file_id: ``driveDataRef.driveFileId`` for a Drive file (the app cannot download it).
    """

    name: str
    content_name: str
    content_type: str
    resource_name: str = ""
    drive_file_id: str = ""


@dataclass(frozen=True, slots=True)
class ChatEvent:
    """The parts of an interaction event Kesoku acts on.

    Attributes:
        type: ``MESSAGE``, ``CARD_CLICKED``, ``ADDED_TO_SPACE``, ...
        space: The space's resource name (``spaces/AAA``).
        space_display_name: The space's display name, or empty (a direct message has none).
        thread: The thread's resource name (``spaces/AAA/threads/BBB``), or empty.
        message_name: The message's resource name (``spaces/AAA/messages/CCC``): Kesoku's external
            id.
        text: What the user wrote, without the app's @mention (``argumentText``, else ``text``).
        sender: The user's display name (else their resource name).
        sender_type: ``HUMAN`` or ``BOT``.
        created_at: ``message.createTime`` (else ``eventTime``) as UNIX seconds; None when absent.
        attachments: The message's attachments.
        function: A card click's function (``common.invokedFunction`` /
            ``action.actionMethodName``).
        parameters: A card click's parameters (``common.parameters`` / ``action.parameters``).
    """

    type: str
    space: str = ""
    space_display_name: str = ""
    thread: str = ""
    message_name: str = ""
    text: str = ""
    sender: str = ""
    sender_type: str = "HUMAN"
    created_at: float | None = None
    attachments: tuple[ChatAttachment, ...] = ()
    function: str = ""
    parameters: dict[str, str] = field(default_factory=dict)

    @property
    def channel_id(self) -> str:
        """The conversation: the thread, or the space when the message has no thread."""
        return self.thread or self.space


def parse_event(data: bytes) -> ChatEvent:
    """Read a Pub/Sub message's data as a Chat interaction event.

    Args:
        data: The message's data: the event's JSON, UTF-8 (an invalid byte is read as U+FFFD).

    Returns:
        The event.

    Raises:
        EventError: Not JSON, not an object, or without a ``type``.
    """
    try:
        # Invalid UTF-8 becomes U+FFFD rather than losing the message (lone surrogates from \u
        # escapes are made valid where messages are stored: kesoku.vocab.text).
        raw = json.loads(data.decode("utf-8", errors="replace"))
    except ValueError as exc:
        raise EventError(f"not JSON: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
        raise EventError("not a Chat event (no 'type')")
    message = _obj(raw.get("message"))
    space = _obj(raw.get("space")) or _obj(message.get("space"))
    thread = _obj(message.get("thread"))
    user = _obj(raw.get("user")) or _obj(message.get("sender"))
    text = message.get("argumentText")
    if not isinstance(text, str) or not text.strip():
        text = message.get("text")
    function, parameters = _click(raw)
    return ChatEvent(
        type=raw["type"],
        space=_str(space.get("name")),
        space_display_name=_str(space.get("displayName")),
        thread=_str(thread.get("name")),
        message_name=_str(message.get("name")),
        text=text.strip() if isinstance(text, str) else "",
        sender=_str(user.get("displayName")) or _str(user.get("name")),
        sender_type=_str(user.get("type")) or "HUMAN",
        created_at=_timestamp(message.get("createTime")) or _timestamp(raw.get("eventTime")),
        attachments=tuple(
            _attachment(a) for a in message.get("attachment") or () if isinstance(a, dict)
        ),
        function=function,
        parameters=parameters,
    )


def _click(raw: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """A card click's function and parameters.

    ``common`` (CommonEventObject: ``invokedFunction``, ``parameters`` as a map) is the current
    form; ``action`` (FormAction: ``actionMethodName``, ``parameters`` as ``[{key, value}]``) the
    older one that Chat still sends. Either may be present.
    """
    common = _obj(raw.get("common"))
    action = _obj(raw.get("action"))
    function = _str(common.get("invokedFunction")) or _str(action.get("actionMethodName"))
    parameters: dict[str, str] = {}
    for item in action.get("parameters") or ():
        if isinstance(item, dict) and isinstance(item.get("key"), str):
            parameters[item["key"]] = _str(item.get("value"))
    for key, value in _obj(common.get("parameters")).items():
        parameters[str(key)] = _str(value)
    return function, parameters


def _attachment(raw: dict[str, Any]) -> ChatAttachment:
    return ChatAttachment(
        name=_str(raw.get("name")),
        content_name=_str(raw.get("contentName")) or "attachment",
        content_type=_str(raw.get("contentType")) or "application/octet-stream",
        resource_name=_str(_obj(raw.get("attachmentDataRef")).get("resourceName")),
        drive_file_id=_str(_obj(raw.get("driveDataRef")).get("driveFileId")),
    )


def _timestamp(value: object) -> float | None:
    """RFC 3339 (``2026-11-30T10:00:00.123456Z``) to UNIX seconds.

    None when absent or unreadable.
    """
    if not isinstance(value, str) or not value:
        return None
    text = value.replace("Z", "+00:00")
    # Chat sends up to nanoseconds; fromisoformat takes at most microseconds.
    head, dot, rest = text.partition(".")
    if dot:
        digits = rest[: len(rest) - len(rest.lstrip("0123456789"))]
        text = f"{head}.{digits[:6]}{rest[len(digits) :]}"
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def _obj(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""
