"""The Google Chat adapter end to end: the real SubscriberClient against an in-process gRPC fake of
Pub/Sub, the real Chat client (google-apps-chat, REST) against a loopback fake, the real runtime
with a scripted model. Each test checks what Chat received and what the log holds."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
import trio
from kesoku_gchat.events import ANSWER_FUNCTION, STOP_FUNCTION
from runtime_harness import echo
from test_gchat_support import (
    FakePubSub,
    GChatRun,
    click_event,
    gchat_running,
    message_event,
    texts,
)

from kesoku.config.settings import CapOverrides, GChatSpace
from kesoku.testing import ScriptedLLM
from kesoku.tools.base import Tool
from kesoku.tools.files import file_tools
from kesoku.tools.paths import PathGates
from kesoku.vocab.model import Kind, Role, is_answer
from kesoku.vocab.spend import BUDGET_GROUP_KEY

THREAD = "spaces/AAAA/threads/T1"


async def acked(pubsub: FakePubSub, message_id: str) -> None:
    await trio.to_thread.run_sync(pubsub.wait, lambda: message_id in pubsub.acked)
    assert message_id in pubsub.acked


async def test_a_message_gets_a_turn_card_an_answer_card_and_a_reaction(
    tmp_path: Path, pubsub: FakePubSub
) -> None:
    llm = ScriptedLLM(
        [
            {
                "thought": "list it",
                "tool_calls": [{"name": "list_dir", "arguments": {"path": "."}}],
            },
            {
                "text": "Here is **the answer**.\n[question: Which next? | Tests | Docs]",
                "usage": {"input_tokens": 2000},
            },
        ]
    )
    tools = file_tools(PathGates(home=tmp_path / "home"))
    async with gchat_running(tmp_path, llm, tools=tools) as run:
        message_id = pubsub.publish(message_event("hello there"))
        await run.chat.wait_for(lambda: len(run.chat.created()) >= 2)
        await acked(pubsub, message_id)
        # The user message is in the log once, with the Chat message name as its external id.
        (user,) = run.user_messages()
        assert user.content == "hello there" and user.sender == "Ana"
        assert user.external_id == "spaces/AAAA/messages/M1.M1"
        session = run.sessions()[0]
        assert session.channel_id == THREAD and session.adapter == "gchat"
        created = datetime(2026, 11, 30, 10, 0, 0, 123456, tzinfo=UTC).timestamp()
        assert session.created_at == pytest.approx(created)
        # The turn card went to the thread, with the reply option; the answer card after it.
        turn, answer = run.chat.created()[:2]
        assert turn.path == "/v1/spaces/AAAA/messages"
        assert turn.query["messageReplyOption"] in ("REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD", "1")
        assert turn.body["thread"] == {"name": THREAD}
        assert texts(turn.body)[0] == "⏳ Working…"
        assert texts(answer.body) == ["Here is **the answer**.", "**Which next?**\n- Tests\n- Docs"]
        paragraph = answer.body["cardsV2"][0]["card"]["sections"][0]["widgets"][0]["textParagraph"]
        assert paragraph["textSyntax"] in ("MARKDOWN", 2)  # the client sends enums as integers
        assert answer.body["thread"] == {"name": THREAD}
        # The card is patched until it shows the metrics; its folded section holds the thought and
        # the call.
        card_name = "spaces/AAAA/messages/m1"
        await run.chat.wait_for(
            lambda: any("⚡" in t for p in run.chat.patched(card_name) for t in texts(p.body))
        )
        final = run.chat.patched(card_name)[-1]
        assert final.query.get("updateMask") == "cardsV2"
        top, thoughts = final.body["cardsV2"][0]["card"]["sections"]
        assert texts({"cardsV2": [{"card": {"sections": [top]}}]}) == [
            "⚡ turn 1 · context 2K · 1 tool call · 2K tokens · "
            + texts(final.body)[0].split(" · ")[-1]
        ]
        assert "buttonList" not in str(top)  # no stop button once the turn is over
        assert thoughts["collapsible"] is True and thoughts["header"] == "Thoughts & Tools (2)"
        assert thoughts.get("uncollapsibleWidgetsCount", 0) == 0
        lines = texts({"cardsV2": [{"card": {"sections": [thoughts]}}]})
        assert lines == ["💭 <i>list it</i>", "🛠️ <b>list_dir</b> <code>.</code> ✅"]
        # The reaction, as the user.
        (reaction,) = run.chat.reactions()
        assert reaction.path == "/v1/spaces/AAAA/messages/M1.M1/reactions"
        assert reaction.body == {"emoji": {"unicode": "👀"}}


async def test_a_redelivered_event_is_posted_and_reacted_to_once(
    tmp_path: Path, pubsub: FakePubSub
) -> None:
    llm = ScriptedLLM([{"text": "once"}], loop=True)
    async with gchat_running(tmp_path, llm) as run:
        first = pubsub.publish(message_event("hi"))
        await acked(pubsub, first)
        second = pubsub.publish(message_event("hi"))  # Pub/Sub delivers at least once
        await acked(pubsub, second)
        await run.chat.wait_for(lambda: len(run.chat.created()) >= 2)
        await trio.sleep(0.3)
        assert len(run.user_messages()) == 1
        assert len(run.chat.reactions()) == 1
        assert [texts(r.body) for r in run.chat.created()][1:] == [["once"]]


async def test_an_event_not_yet_persisted_is_nacked_at_shutdown_and_posted_after_restart(
    tmp_path: Path, pubsub: FakePubSub
) -> None:
    llm = ScriptedLLM([{"text": "got it"}], loop=True)
    async with gchat_running(tmp_path, llm, reaction=None) as run:
        # the attachment download hangs: the event is not posted yet
        gate = run.chat.media_gate = trio.Event()
        run.chat.media["att-1"] = b"\x89PNG..."
        attachment = {
            "name": "spaces/AAAA/messages/M1.M1/attachments/A1",
            "contentName": "photo.png",
            "contentType": "image/png",
            "attachmentDataRef": {"resourceName": "att-1"},
            "source": "UPLOADED_CONTENT",
        }
        message_id = pubsub.publish(message_event("look", attachment=[attachment]))
        await run.chat.wait_for(
            lambda: any(r.path.startswith("/v1/media/") for r in run.chat.log.requests)
        )
        await run.stop()  # a crash or a restart before the message was persisted
        # Not acked: back in the queue (nacked, or its lease lost when the stream closed first).
        requeued = await trio.to_thread.run_sync(
            pubsub.wait, lambda: message_id in {m for m, _ in pubsub.ready}
        )
        assert requeued
        assert message_id not in pubsub.acked
        assert run.user_messages() == []
        gate.set()
        await run.start()
        await acked(pubsub, message_id)
        (user,) = run.user_messages()
        (saved,) = user.metadata.attachments
        assert saved.filename == "photo.png" and saved.mime_type == "image/png"
        assert Path(saved.path).read_bytes() == b"\x89PNG..."
        assert Path(saved.path).parent == Path(run.sessions()[0].workspace)
        assert user.content == f"look\n\n[attachment: photo.png → {saved.path}]"


async def test_attachments_the_app_cannot_read_are_noted_for_the_model_and_the_user(
    tmp_path: Path, pubsub: FakePubSub
) -> None:
    async with gchat_running(tmp_path, ScriptedLLM([{"text": "ok"}]), reaction=None) as run:
        run.chat.media_status = 403
        uploaded = {
            "contentName": "a.txt",
            "contentType": "text/plain",
            "attachmentDataRef": {"resourceName": "r1"},
        }
        drive = {
            "contentName": "doc",
            "contentType": "application/pdf",
            "driveDataRef": {"driveFileId": "d1"},
        }
        message_id = pubsub.publish(message_event("two files", attachment=[uploaded, drive]))
        await acked(pubsub, message_id)
        (user,) = run.user_messages()
        assert user.metadata.attachments == ()
        assert (
            "[attachment a.txt could not be downloaded (media.download: HTTP 403)]" in user.content
        )
        assert (
            "[attachment doc was not downloaded: a Google Drive file, which the app cannot read]"
            in user.content
        )
        await run.chat.wait_for(
            lambda: any("⚠️" in t for r in run.chat.created() for t in texts(r.body))
        )


def write_outside(target: Path) -> ScriptedLLM:
    call = {"name": "write_file", "arguments": {"path": str(target), "content": "hello\n"}}
    return ScriptedLLM([{"tool_calls": [call]}, {"text": "written"}])


def question_card(run: GChatRun) -> tuple[int, str]:
    """The question card's question id (from its Allow button) and its Chat message name."""
    for i, request in enumerate(run.chat.created()):
        for section in request.body["cardsV2"][0]["card"]["sections"]:
            for widget in section["widgets"]:
                if "buttonList" in widget:
                    button = widget["buttonList"]["buttons"][0]
                    if button["onClick"]["action"]["function"] == ANSWER_FUNCTION:
                        params = {
                            p["key"]: p["value"] for p in button["onClick"]["action"]["parameters"]
                        }
                        return int(params["question_id"]), f"spaces/AAAA/messages/m{i + 1}"
    raise AssertionError("no question card")


def has_question(run: GChatRun) -> bool:
    try:
        question_card(run)
    except AssertionError:
        return False
    return True


@pytest.fixture
def tools(tmp_path: Path) -> tuple[Tool, ...]:
    return file_tools(PathGates(home=tmp_path / "home"))


async def test_a_click_on_allow_answers_the_tools_question(
    tmp_path: Path, pubsub: FakePubSub, tools: tuple[Tool, ...]
) -> None:
    target = tmp_path / "outside" / "note.txt"
    async with gchat_running(tmp_path, write_outside(target), tools=tools, reaction=None) as run:
        pubsub.publish(message_event("write the note"))
        await run.chat.wait_for(lambda: has_question(run))
        question_id, card = question_card(run)
        assert run.h.rt.questions.open_questions(run.session_id())[0].id == question_id
        click = pubsub.publish(
            click_event(ANSWER_FUNCTION, question_id=str(question_id), choice="Allow")
        )
        await acked(pubsub, click)
        await run.chat.wait_for(
            lambda: any("✔ **Allow**" in t for p in run.chat.patched(card) for t in texts(p.body))
        )
        # The tool's result, not the file's existence: the file exists before its content is
        # written.
        await run.until(
            lambda: any(m.kind is Kind.TOOL_RESULT for m in run.h.store.history(run.session_id()))
        )
        assert target.read_text() == "hello\n"
        answer = next(m for m in run.h.store.history(run.session_id()) if is_answer(m))
        assert answer.content == "✔ Allow: allowed by Ana"


async def test_a_typed_deny_answers_the_question_instead_of_being_posted(
    tmp_path: Path, pubsub: FakePubSub, tools: tuple[Tool, ...]
) -> None:
    target = tmp_path / "outside" / "note.txt"
    async with gchat_running(tmp_path, write_outside(target), tools=tools, reaction=None) as run:
        pubsub.publish(message_event("write the note"))
        await run.chat.wait_for(lambda: has_question(run))
        reply = pubsub.publish(message_event("deny", name="spaces/AAAA/messages/M2.M2"))
        await acked(pubsub, reply)
        await run.until(lambda: any(is_answer(m) for m in run.h.store.history(run.session_id())))
        assert [m.content for m in run.user_messages()] == ["write the note"]
        answer = next(m for m in run.h.store.history(run.session_id()) if is_answer(m))
        assert answer.content == "✘ Deny: denied by Ana"
        assert not target.exists()


async def test_a_click_from_another_thread_answers_nothing(
    tmp_path: Path, pubsub: FakePubSub, tools: tuple[Tool, ...]
) -> None:
    target = tmp_path / "outside" / "note.txt"
    async with gchat_running(tmp_path, write_outside(target), tools=tools, reaction=None) as run:
        pubsub.publish(message_event("write the note"))
        await run.chat.wait_for(lambda: has_question(run))
        question_id, _ = question_card(run)
        raw = click_event(ANSWER_FUNCTION, question_id=str(question_id), choice="Allow")
        elsewhere = raw.replace(THREAD.encode(), b"spaces/AAAA/threads/OTHER")
        await acked(pubsub, pubsub.publish(elsewhere))
        assert run.h.rt.questions.open_questions(run.session_id())[0].id == question_id
        assert run.h.rt.questions.answer(question_id, "Deny")  # let the turn end before teardown


async def test_the_stop_button_stops_the_turn_and_the_card_says_so(
    tmp_path: Path, pubsub: FakePubSub
) -> None:
    llm = ScriptedLLM([{"thought": "thinking", "text": ["a", "b", "c"], "delay_s": 2}])
    async with gchat_running(tmp_path, llm, reaction=None) as run:
        pubsub.publish(message_event("take your time"))
        await run.chat.wait_for(lambda: len(run.chat.created()) >= 1)
        await trio.sleep(0.5)
        click = pubsub.publish(click_event(STOP_FUNCTION, session_id=run.session_id()))
        await acked(pubsub, click)
        card = "spaces/AAAA/messages/m1"
        await run.chat.wait_for(
            lambda: any("(Stopped)" in t for p in run.chat.patched(card) for t in texts(p.body))
        )
        assert not any(
            m.role is Role.ASSISTANT and m.kind is Kind.TEXT and m.content == "abc"
            for m in run.h.history()
        )


async def test_turn_card_updates_are_throttled_and_the_last_one_holds_every_step(
    tmp_path: Path, pubsub: FakePubSub
) -> None:
    steps: list[dict[str, object]] = [
        {"tool_calls": [{"name": "echo", "arguments": {"text": f"step {i}"}}]} for i in range(8)
    ]
    llm = ScriptedLLM([*steps, {"text": "all done"}])
    async with gchat_running(
        tmp_path, llm, tools=[echo()], reaction=None, card_interval_s=0.5
    ) as run:
        pubsub.publish(message_event("go"))
        card = "spaces/AAAA/messages/m1"
        await run.chat.wait_for(
            lambda: any("⚡" in t for p in run.chat.patched(card) for t in texts(p.body))
        )
        patches = run.chat.patched(card)
        assert len(patches) <= 4  # 17 changes (8 calls, 8 results, the end) in a handful of writes
        lines = texts(patches[-1].body)[1:]
        assert lines == [f"🛠️ <b>echo</b> <code>step {i}</code> ✅" for i in range(8)]


async def test_a_chat_503_is_retried_and_the_card_still_arrives(
    tmp_path: Path, pubsub: FakePubSub
) -> None:
    async with gchat_running(tmp_path, ScriptedLLM([{"text": "fine"}]), reaction=None) as run:
        run.chat.fail_next.append(503)
        pubsub.publish(message_event("hello"))
        await run.chat.wait_for(lambda: len(run.chat.created()) >= 3)
        first, retried, answer = run.chat.created()[:3]
        assert first.body == retried.body and texts(retried.body) == [
            "⏳ Working…",
            "<i>nothing yet</i>",
        ]
        assert texts(answer.body) == ["fine"]


async def test_a_space_spend_cap_stops_the_agent_there_and_the_card_says_so(
    tmp_path: Path, pubsub: FakePubSub
) -> None:
    llm = ScriptedLLM([{"text": "a costly answer", "usage": {"input_tokens": 150}}])
    capped = GChatSpace(spaces=("Kesoku test",), budget=CapOverrides(session_tokens=100))
    async with gchat_running(tmp_path, llm, spaces=(capped,)) as run:
        pubsub.publish(message_event("costly question"))
        await run.chat.wait_for(lambda: len(run.chat.created()) >= 2)
        (session,) = run.sessions()
        assert session.metadata[BUDGET_GROUP_KEY] == "Kesoku test"
        pubsub.publish(message_event("and another", name="spaces/AAAA/messages/M2.M2"))
        await run.chat.wait_for(
            lambda: any("(Spend cap)" in t for p in run.chat.patched() for t in texts(p.body))
        )
        sent = [*run.chat.created(), *run.chat.patched()]
        bodies = [t for c in sent for t in texts(c.body)]
    assert llm.calls == 1
    assert any(
        "Spend cap reached: this session has used 150 of 100 tokens " in t
        and "(gchat.spaces[Kesoku test].budget.session_tokens)" in t
        for t in bodies
    ), bodies
