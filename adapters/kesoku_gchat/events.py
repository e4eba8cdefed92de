"""Google Chat interaction events, as they arrive in Pub/Sub message data (pure: no Google imports).

A Chat app configured with a Pub/Sub connection gets each interaction event published to its topic
as the event's JSON, in one of two formats:

- classic (Chat API reference, ``Event``): ``type``, ``eventTime``, ``message``, ``user``,
  ``space``, ``action``, ``common`` (the Pub/Sub quickstart "Build a Google Chat app behind a
  firewall with Pub/Sub");
- Google Workspace add-on (add-ons reference, "Chat event object"): no ``type``; ``chat`` carries
  ``user``, ``eventTime`` and one payload naming the interaction (``messagePayload``,
  ``addedToSpacePayload``, ``removedFromSpacePayload``, ``buttonClickedPayload``,
  ``widgetUpdatedPayload``, ``appCommandPayload``) with its ``space`` and ``message``; a click's
  function and parameters are in ``commonEventObject``.

Both become the same :class:`ChatEvent`. Only the fields Kesoku uses are read; anything else is
ignored, so a newer event still parses, and a field of the wrong JSON type reads as absent.
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
APP_COMMAND = "APP_COMMAND"
"""A user ran one of the app's quick commands (ignored: Kesoku declares none)."""

ADDON_PAYLOADS = {
    "messagePayload": MESSAGE,
    "addedToSpacePayload": "ADDED_TO_SPACE",
    "removedFromSpacePayload": "REMOVED_FROM_SPACE",
    "buttonClickedPayload": CARD_CLICKED,
    "widgetUpdatedPayload": "WIDGET_UPDATED",
    "appCommandPayload": APP_COMMAND,
}
"""An add-on event's ``chat.*Payload`` → the classic ``type`` it stands for."""
SLASH_COMMAND = "SLASH_COMMAND"
"""``appCommandMetadata.appCommandType`` of a slash command: a message, as in the classic format."""

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
    """Read a Pub/Sub message's data as a Chat interaction event (classic or add-on format).

    Args:
        data: The message's data: the event's JSON, UTF-8 (an invalid byte is read as U+FFFD).

    Returns:
        The event.

    Raises:
        EventError: Not JSON, not an object, or neither a classic event (a ``type``) nor an add-on
            one (a ``chat`` object with a ``*Payload``).
    """
    try:
        # Invalid UTF-8 becomes U+FFFD rather than losing the message (lone surrogates from \u
        # escapes are made valid where messages are stored: kesoku.vocab.text).
        raw = json.loads(data.decode("utf-8", errors="replace"))
    except ValueError as exc:
        raise EventError(f"not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise EventError("not a Chat event (not a JSON object)")
    if isinstance(raw.get("type"), str):
        message = _obj(raw.get("message"))
        return _event(
            raw["type"],
            message,
            space=_obj(raw.get("space")) or _obj(message.get("space")),
            user=_obj(raw.get("user")),
            event_time=raw.get("eventTime"),
            common=_obj(raw.get("common")),
            action=_obj(raw.get("action")),
        )
    chat = raw.get("chat")
    if isinstance(chat, dict):
        return _addon_event(chat, _obj(raw.get("commonEventObject")))
    raise EventError("not a Chat event (no 'type', and no 'chat' of a Workspace add-on event)")


def _addon_event(chat: dict[str, Any], common: dict[str, Any]) -> ChatEvent:
    """A Google Workspace add-on event: ``chat.<kind>Payload`` names the interaction.

    A slash command (``appCommandPayload`` of type ``SLASH_COMMAND``) is a ``MESSAGE``, as the
    classic format sends it; a payload Kesoku does not know keeps its key as the type (ignored).
    """
    found = [key for key in chat if key.endswith("Payload") and isinstance(chat[key], dict)]
    if not found:
        raise EventError("a Workspace add-on event without a Chat payload ('chat.*Payload')")
    key = next((k for k in found if k in ADDON_PAYLOADS), found[0])
    payload: dict[str, Any] = chat[key]
    kind = ADDON_PAYLOADS.get(key, key)
    message = _obj(payload.get("message"))
    metadata = _obj(payload.get("appCommandMetadata"))
    if kind == APP_COMMAND and message and metadata.get("appCommandType") == SLASH_COMMAND:
        kind = MESSAGE
    return _event(
        kind,
        message,
        space=_obj(payload.get("space")) or _obj(chat.get("space")) or _obj(message.get("space")),
        user=_obj(chat.get("user")),
        event_time=chat.get("eventTime"),
        common=common,
        action={},
    )


def _event(
    kind: str,
    message: dict[str, Any],
    *,
    space: dict[str, Any],
    user: dict[str, Any],
    event_time: object,
    common: dict[str, Any],
    action: dict[str, Any],
) -> ChatEvent:
    """The :class:`ChatEvent` of either format, from its parts (each ``{}`` when absent)."""
    user = user or _obj(message.get("sender"))
    text = message.get("argumentText")
    if not isinstance(text, str) or not text.strip():
        text = message.get("text")
    function, parameters = _click(common, action)
    return ChatEvent(
        type=kind,
        space=_str(space.get("name")),
        space_display_name=_str(space.get("displayName")),
        thread=_str(_obj(message.get("thread")).get("name")),
        message_name=_str(message.get("name")),
        text=text.strip() if isinstance(text, str) else "",
        sender=_str(user.get("displayName")) or _str(user.get("name")),
        sender_type=_str(user.get("type")) or "HUMAN",
        created_at=_timestamp(message.get("createTime")) or _timestamp(event_time),
        attachments=tuple(
            _attachment(a) for a in _list(message.get("attachment")) if isinstance(a, dict)
        ),
        function=function,
        parameters=parameters,
    )


def _click(common: dict[str, Any], action: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """A card click's function and parameters.

    ``common`` (CommonEventObject, the add-on format's ``commonEventObject``: ``invokedFunction``,
    ``parameters`` as a map) is the current form; ``action`` (FormAction: ``actionMethodName``,
    ``parameters`` as ``[{key, value}]``) the older one that classic events still carry. Either
    may be present.
    """
    function = _str(common.get("invokedFunction")) or _str(action.get("actionMethodName"))
    parameters: dict[str, str] = {}
    for item in _list(action.get("parameters")):
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


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""
