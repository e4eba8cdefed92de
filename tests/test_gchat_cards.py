"""Cards v2 JSON and Chat event parsing: pure functions, checked with the official client's types.

Every body is decoded with ``google.apps.chat_v1.Message.from_json``, which refuses a field name the
Chat API does not define (Cards v2 field names: Chat API REST reference, ``Card``).
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from google.apps import card_v1, chat_v1
from google.protobuf import json_format  # type: ignore[import-untyped]
from kesoku_gchat import cards
from kesoku_gchat.events import ANSWER_FUNCTION, CARD_CLICKED, MESSAGE, EventError, parse_event
from test_gchat_support import click_event, event, message_event

from kesoku.vocab.markup import parse_reply


def decoded(body: dict[str, Any]) -> Any:
    return chat_v1.Message.from_json(json.dumps(body))


def test_the_client_refuses_a_field_the_chat_api_does_not_define() -> None:
    with pytest.raises(json_format.ParseError, match="sectionz"):
        decoded({"cardsV2": [{"cardId": "x", "card": {"sectionz": []}}]})


def test_the_turn_card_folds_thoughts_and_tools_and_keeps_the_status_and_stop_button_outside() -> (
    None
):
    entries = [
        cards.thought_entry("I should <look> first"),
        cards.tool_entry("shell", {"command": "ls  -la\n/tmp"}, "✅"),
        cards.tool_entry("write_file", {"path": "/a", "content": "x"}),
        cards.system_entry("❓ write_file wants to write /a. Allow?"),
    ]
    body = cards.turn_card(status=cards.WORKING, entries=entries, session_id="s1")
    message = decoded(body)
    top, folded = message.cards_v2[0].card.sections
    assert top.widgets[0].text_paragraph.text == "⏳ Working…"
    (stop,) = top.widgets[1].button_list.buttons
    assert stop.on_click.action.function == "kesoku.stop"
    assert [(p.key, p.value) for p in stop.on_click.action.parameters] == [("session_id", "s1")]
    assert folded.collapsible and folded.uncollapsible_widgets_count == 0
    assert folded.header == "Thoughts & Tools (4)"
    assert [w.text_paragraph.text for w in folded.widgets] == [
        "💭 <i>I should &lt;look&gt; first</i>",
        "🛠️ <b>shell</b> <code>ls -la /tmp</code> ✅",
        '🛠️ <b>write_file</b> <code>path="/a", content="x"</code>',
        "ℹ️ ❓ write_file wants to write /a. Allow?",
    ]
    assert body["fallbackText"] == "⏳ Working…"


def test_a_finished_turn_card_has_no_stop_button_and_counts_lines_it_left_out() -> None:
    body = cards.turn_card(
        status="⚡ turn 1 · …", entries=["a"], hidden=3, session_id="s1", running=False
    )
    top, folded = decoded(body).cards_v2[0].card.sections
    assert len(top.widgets) == 1
    assert folded.widgets[0].text_paragraph.text == "<i>… 3 earlier lines</i>"
    assert folded.header == "Thoughts & Tools (4)"


def test_an_answer_is_markdown_with_questions_as_lists_and_files_as_notes() -> None:
    parts = parse_reply("**Done.**\n\n[question: Which next? | Tests | Docs]\n[file: /tmp/out.txt]")
    (body,) = cards.answer_bodies(parts, file_note="📎 {name}")
    widgets = decoded(body).cards_v2[0].card.sections[0].widgets
    assert [w.text_paragraph.text for w in widgets] == [
        "**Done.**",
        "**Which next?**\n- Tests\n- Docs",
        "📎 /tmp/out.txt",
    ]
    assert {w.text_paragraph.text_syntax for w in widgets} == {
        card_v1.TextParagraph.TextSyntax.MARKDOWN
    }
    assert (
        body["cardsV2"][0]["card"]["sections"][0]["widgets"][0]["textParagraph"]["textSyntax"]
        == "MARKDOWN"
    )
    assert body["fallbackText"] == "**Done.**"


def test_an_answer_of_many_parts_keeps_every_card_within_100_widgets() -> None:
    text = "\n\n".join(f"part {n}\n[question: Q{n}? | a | b]" for n in range(120))
    bodies = cards.answer_bodies(parse_reply(text))
    widgets = [body["cardsV2"][0]["card"]["sections"][0]["widgets"] for body in bodies]
    assert [len(w) for w in widgets] == [cards.MAX_WIDGETS, cards.MAX_WIDGETS, 40]
    shown = [w["textParagraph"]["text"] for card in widgets for w in card]
    assert shown[0] == "part 0" and shown[-1] == "**Q119?**\n- a\n- b" and len(shown) == 240
    for body in bodies:
        decoded(body)


def test_a_question_lists_every_choice_in_full_however_many() -> None:
    choices = [f"choice {n} " + "y" * 200 for n in range(1, 131)]
    bodies = cards.answer_bodies(parse_reply("[question: Which? | " + " | ".join(choices) + "]"))
    assert len(bodies) == 2, "27 KB of choices: two messages, split between two lines"
    sections = [decoded(body).cards_v2[0].card.sections[0] for body in bodies]
    pieces = [w.text_paragraph.text for section in sections for w in section.widgets]
    assert "\n".join(pieces) == "**Which?**\n" + "\n".join(f"- {c}" for c in choices)


def test_a_long_answer_is_split_within_the_message_limit_and_fences_stay_closed() -> None:
    code = "\n".join(f"line {i} {'x' * 60}" for i in range(600))
    text = "Intro\n\n```python\n" + code + '\n```\nOutro "quoted" \\ end\n' + "é" * 20_000
    bodies = cards.answer_bodies(parse_reply(text))
    assert len(bodies) >= 3
    pieces = []
    for body in bodies:
        assert cards.body_bytes(body) < cards.MAX_MESSAGE_BYTES
        decoded(body)
        pieces += [
            w["textParagraph"]["text"] for w in body["cardsV2"][0]["card"]["sections"][0]["widgets"]
        ]
    for piece in pieces:
        assert piece.count("```") % 2 == 0, piece[:80]
    joined = "".join(pieces)
    assert "line 599" in joined and joined.count("é") == 20_000 and "Outro" in joined


def test_a_tool_question_has_one_button_per_choice_and_the_typed_alternative() -> None:
    body = cards.question_body(42, "❓ run `rm`?", ["Allow", "Deny"])
    widgets = decoded(body).cards_v2[0].card.sections[0].widgets
    assert widgets[0].text_paragraph.text == "❓ run `rm`?"
    buttons = widgets[1].button_list.buttons
    assert [b.text for b in buttons] == ["Allow", "Deny"]
    assert {b.on_click.action.function for b in buttons} == {ANSWER_FUNCTION}
    assert [{p.key: p.value for p in b.on_click.action.parameters} for b in buttons] == [
        {"question_id": "42", "choice": "Allow"},
        {"question_id": "42", "choice": "Deny"},
    ]
    assert widgets[2].text_paragraph.text == "<i>or reply allow / deny</i>"
    answered = decoded(cards.answered_body(42, "❓ run `rm`?", "Deny", "denied by Ana"))
    assert [w.text_paragraph.text for w in answered.cards_v2[0].card.sections[0].widgets] == [
        "❓ run `rm`?",
        "✘ **Deny** — denied by Ana",
    ]


def test_a_message_event_reads_the_thread_sender_text_time_and_attachments() -> None:
    attachment = {
        "name": "spaces/AAAA/messages/M1.M1/attachments/A1",
        "contentName": "photo.png",
        "contentType": "image/png",
        "attachmentDataRef": {"resourceName": "res-1"},
    }
    parsed = parse_event(message_event("hello there", attachment=[attachment]))
    assert parsed.type == MESSAGE
    assert parsed.channel_id == parsed.thread == "spaces/AAAA/threads/T1"
    assert parsed.space == "spaces/AAAA" and parsed.message_name == "spaces/AAAA/messages/M1.M1"
    assert parsed.text == "hello there" and parsed.sender == "Ana" and parsed.sender_type == "HUMAN"
    assert parsed.created_at is not None and parsed.created_at % 1 == pytest.approx(
        0.123456, abs=1e-5
    )
    (att,) = parsed.attachments
    assert (att.content_name, att.content_type, att.resource_name) == (
        "photo.png",
        "image/png",
        "res-1",
    )


def test_a_threadless_message_belongs_to_its_space() -> None:
    raw = event()
    del raw["message"]["thread"]
    assert parse_event(json.dumps(raw).encode()).channel_id == "spaces/AAAA"


def test_a_card_click_reads_common_and_action_parameters() -> None:
    parsed = parse_event(click_event(ANSWER_FUNCTION, question_id="7", choice="Allow"))
    assert parsed.type == CARD_CLICKED and parsed.function == ANSWER_FUNCTION
    assert parsed.parameters == {"question_id": "7", "choice": "Allow"}
    older = event("card_clicked")
    del older["common"]  # the FormAction form alone
    assert parse_event(json.dumps(older).encode()).parameters == {
        "question_id": "0",
        "choice": "Allow",
    }


@pytest.mark.parametrize("data", [b"not json", b"[1, 2]", b'{"message": {}}', b"\xff\xfe"])
def test_what_is_not_a_chat_event_is_refused(data: bytes) -> None:
    with pytest.raises(EventError):
        parse_event(data)


def test_a_late_tool_started_event_does_not_undo_the_outcome_on_the_turn_card() -> None:
    from kesoku_gchat.delivery import RUNNING_MARK, TurnCard

    from kesoku.vocab.model import Kind, Metadata, Role, in_turn, user_text

    root = msgspec.structs.replace(user_text("s", "go"), id=1)
    call = msgspec.structs.replace(
        in_turn(root, Role.ASSISTANT, Kind.TOOL_CALL, "", metadata=Metadata(tool_name="shell")),
        id=2,
    )
    card = TurnCard("s", 1, "spaces/A", "")
    card.calls[call.id] = (card.add(cards.tool_entry("shell", None)), call)
    card.mark_call(call.id, RUNNING_MARK)
    assert card.entries[0].endswith(RUNNING_MARK)
    card.mark_call(call.id, cards.OUTCOME_MARKS["completed"])
    card.mark_call(call.id, RUNNING_MARK)  # the tool-started event, delivered after the result
    assert card.entries[0].endswith("✅")
