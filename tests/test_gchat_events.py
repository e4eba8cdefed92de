"""Google Workspace add-on events (the newer Chat event format) read into the same ChatEvent as the
classic format; malformed add-on events refused with one EventError, never another exception."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from kesoku_gchat.events import (
    ANSWER_FUNCTION,
    APP_COMMAND,
    CARD_CLICKED,
    MESSAGE,
    ChatEvent,
    EventError,
    parse_event,
)
from test_gchat_support import addon_event, event, message_event


def parsed(raw: dict[str, Any]) -> ChatEvent:
    return parse_event(json.dumps(raw).encode())


def test_an_addon_message_reads_as_the_classic_message_does() -> None:
    attachment = {"contentName": "photo.png", "attachmentDataRef": {"resourceName": "res-1"}}
    classic = parse_event(message_event("hello there", attachment=[attachment]))
    addon = parse_event(addon_event("hello there", attachment=[attachment]))
    assert addon == classic
    assert addon.type == MESSAGE and addon.text == "hello there"
    assert addon.channel_id == "spaces/AAAA/threads/T1"
    assert addon.message_name == "spaces/AAAA/messages/M1.M1"
    assert (addon.sender, addon.space_display_name) == ("Ana", "Kesoku test")
    assert addon.attachments[0].resource_name == "res-1"


def test_an_addon_message_without_a_create_time_is_dated_by_the_events_time() -> None:
    raw = json.loads(addon_event("hi"))
    del raw["chat"]["messagePayload"]["message"]["createTime"]
    when = datetime(2026, 11, 30, 10, 0, 0, 250000, tzinfo=UTC).timestamp()
    assert parsed(raw).created_at == when


def test_an_addon_button_click_reads_its_function_from_the_common_event_object() -> None:
    raw = {
        "commonEventObject": {
            "hostApp": "CHAT",
            "invokedFunction": ANSWER_FUNCTION,
            "parameters": {"question_id": "7", "choice": "Allow"},
        },
        "chat": {
            "user": {"name": "users/111", "displayName": "Ana", "type": "HUMAN"},
            "eventTime": "2026-11-30T10:00:05Z",
            "buttonClickedPayload": {
                "space": {"name": "spaces/AAAA", "type": "ROOM"},
                "message": {
                    "name": "spaces/AAAA/messages/Q1",
                    "sender": {"name": "users/app", "type": "BOT"},
                    "thread": {"name": "spaces/AAAA/threads/T1"},
                },
            },
        },
    }
    click = parsed(raw)
    assert click.type == CARD_CLICKED and click.function == ANSWER_FUNCTION
    assert click.parameters == {"question_id": "7", "choice": "Allow"}
    assert (click.space, click.thread) == ("spaces/AAAA", "spaces/AAAA/threads/T1")
    # The clicking user, not the card's sender (the app).
    assert (click.sender, click.sender_type) == ("Ana", "HUMAN")


@pytest.mark.parametrize(
    ("payload", "kind"),
    [("addedToSpacePayload", "ADDED_TO_SPACE"), ("removedFromSpacePayload", "REMOVED_FROM_SPACE")],
)
def test_addon_space_membership_events_name_their_space(payload: str, kind: str) -> None:
    raw = {
        "commonEventObject": {"hostApp": "CHAT"},
        "chat": {
            "user": {"name": "users/111", "displayName": "Ana"},
            "eventTime": "2026-11-30T10:00:00Z",
            payload: {"space": {"name": "spaces/BBBB", "displayName": "Ops"}},
        },
    }
    got = parsed(raw)
    assert (got.type, got.space, got.space_display_name) == (kind, "spaces/BBBB", "Ops")
    assert got.message_name == ""


def app_command(command_type: str) -> dict[str, Any]:
    message = json.loads(addon_event("/schedules"))["chat"]["messagePayload"]["message"]
    message.update(text="/schedules", argumentText="")
    return {
        "commonEventObject": {"hostApp": "CHAT"},
        "chat": {
            "user": {"name": "users/111", "displayName": "Ana"},
            "appCommandPayload": {
                "appCommandMetadata": {"appCommandId": 1, "appCommandType": command_type},
                "space": {"name": "spaces/AAAA"},
                "message": message,
            },
        },
    }


def test_an_addon_slash_command_is_a_message_as_in_the_classic_format() -> None:
    got = parsed(app_command("SLASH_COMMAND"))
    assert (got.type, got.text, got.space) == (MESSAGE, "/schedules", "spaces/AAAA")


def test_an_addon_quick_command_is_an_app_command() -> None:
    assert parsed(app_command("QUICK_COMMAND")).type == APP_COMMAND


def test_an_addon_payload_kesoku_does_not_know_keeps_its_name_as_the_type() -> None:
    raw = {"chat": {"linkPreviewPayload": {"space": {"name": "spaces/AAAA"}}}}
    assert parsed(raw).type == "linkPreviewPayload"


@pytest.mark.parametrize(
    "raw",
    [
        {"chat": {}},
        {"chat": {"user": {"name": "users/1"}}},
        {"chat": {"messagePayload": "text"}},
        {"chat": ["messagePayload"]},
        {"commonEventObject": {"hostApp": "CHAT"}},
    ],
)
def test_an_addon_event_without_a_payload_is_refused(raw: dict[str, Any]) -> None:
    with pytest.raises(EventError):
        parsed(raw)


@pytest.mark.parametrize(
    "chat",
    [
        {"messagePayload": {"message": {"attachment": 5, "thread": "T", "text": 3}}},
        {"messagePayload": {"message": [], "space": 7}, "user": "Ana", "eventTime": 12},
        {"messagePayload": {"message": {"attachment": [1, "x", {"contentName": 2}]}}},
        {"buttonClickedPayload": {}, "eventTime": "yesterday"},
    ],
)
def test_wrongly_typed_addon_fields_read_as_absent(chat: dict[str, Any]) -> None:
    got = parsed({"chat": chat, "commonEventObject": {"parameters": ["not", "a", "map"]}})
    assert got.text == "" and got.thread == "" and got.created_at is None


def test_wrongly_typed_classic_fields_read_as_absent() -> None:
    raw = event()
    raw["message"]["attachment"] = 5
    raw["action"] = {"parameters": 3}
    got = parsed(raw)
    assert got.attachments == () and got.parameters == {}
