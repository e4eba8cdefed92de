"""The Google Chat adapter end to end: the real SubscriberClient against an in-process gRPC fake of
Pub/Sub, the real Chat client (google-apps-chat, REST) against a loopback fake, the real runtime
with a scripted model. Each test checks what Chat received and what the log holds."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import msgspec
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
from kesoku.vocab.model import Kind, Message, Metadata, Role, Session, is_answer, user_text
from kesoku.vocab.schedule import SCHEDULE_KEY, new_schedule
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
            lambda: any(
                t.startswith("🛑") and t.endswith("(Interrupted)")
                for p in run.chat.patched(card)
                for t in texts(p.body)
            )
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


# -- turns no Chat message started (scheduled runs) ------------------------------------------------

REPORT = "Daily report\nList what changed since yesterday, briefly."
WEEKLY = "Weekly summary\nThe week in three lines."
SCHEDULED_THREAD = "spaces/AAAA/threads/T9"


async def post_scheduled(run: GChatRun, channel: str, prompt: str, planned: int) -> Message:
    """What the scheduler does: the space's (or thread's) session, the Scheduler's message."""
    gateway = run.h.gateway
    session = gateway.open_session("gchat", channel)
    return await gateway.post(
        user_text(session.id, prompt, sender="Scheduler", external_id=f"schedule:r:{planned}")
    )


async def turn_ended(run: GChatRun, root: Message) -> None:
    def done() -> bool:
        stored = run.h.gateway.get_message(root.id)
        return stored is not None and stored.status == "done"

    await run.until(done)


def assert_only_own_messages_touched(run: GChatRun) -> None:
    """No reaction, and no update of a Chat message the app did not create."""
    assert run.chat.reactions() == []
    for request in run.chat.patched():
        assert request.path.removeprefix("/v1/") in run.chat.placed, request.path


def final_texts(run: GChatRun, card_name: str) -> list[str]:
    """The text of a card's last update (none yet: empty)."""
    patches = run.chat.patched(card_name)
    return texts(patches[-1].body) if patches else []


async def test_a_scheduled_run_into_a_space_keeps_card_and_answer_in_one_thread_once(
    tmp_path: Path, pubsub: FakePubSub
) -> None:
    llm = ScriptedLLM(
        [
            {"text": "Nothing changed."},
            {"thought": "checking", "tool_calls": [{"name": "echo", "arguments": {"text": "w"}}]},
            {"text": "A quiet week."},
            {"text": "Still nothing."},
        ]
    )
    async with gchat_running(tmp_path, llm, tools=[echo()]) as run:
        chat = run.chat
        first = await post_scheduled(run, "spaces/AAAA", REPORT, 1)
        await chat.wait_for(lambda: len(chat.created()) >= 2)
        card, answer = chat.created()
        (session,) = run.sessions()
        key = f"kesoku-{session.id}-{first.id}"
        # The card starts the turn's own thread (keyed: the space has no message to answer), names
        # the schedule and the prompt's first line, and the answer follows it into that thread.
        assert card.body["thread"] == {"threadKey": key} == answer.body["thread"]
        assert card.query["messageReplyOption"] in ("REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD", "1")
        assert texts(card.body)[:2] == ["⏰ Scheduler: Daily report", "⏳ Working…"]
        assert card.body["fallbackText"] == "⏰ Scheduler: Daily report"
        assert texts(answer.body) == ["Nothing changed."]
        card_name, answer_name = chat.placed
        thread = chat.placed[card_name]
        assert chat.in_thread(thread) == [card_name, answer_name]
        await chat.wait_for(lambda: "⚡" in " ".join(final_texts(run, card_name)))
        trigger, metrics, *_ = final_texts(run, card_name)
        assert trigger == "⏰ Scheduler: Daily report" and metrics.startswith("⚡ turn 1 · ")
        # The adapter is down: the next run (a thought and a tool call) is answered all the same.
        await run.stop()
        weekly = await post_scheduled(run, "spaces/AAAA", WEEKLY, 2)
        await turn_ended(run, weekly)
        await run.start()
        await chat.wait_for(lambda: len(chat.created()) >= 4)
        card2, answer2 = chat.created()[2:4]
        assert card2.body["thread"] == {"threadKey": f"kesoku-{session.id}-{weekly.id}"}
        assert texts(card2.body)[:2] == [
            "⏰ Scheduler: Weekly summary",
            "☑️ Ended while the adapter was away",
        ]
        assert "buttonList" not in str(card2.body), "no stop button on a turn that is over"
        assert texts(answer2.body) == ["A quiet week."]
        card2_name, answer2_name = list(chat.placed)[2:4]
        thread2 = chat.placed[card2_name]
        assert thread2 != thread and chat.in_thread(thread2) == [card2_name, answer2_name]
        # Its card took the lines of its thought and call, then its final state.
        await chat.wait_for(lambda: len(final_texts(run, card2_name)) == 4)
        assert final_texts(run, card2_name)[2:] == [
            "💭 <i>checking</i>",
            "🛠️ <b>echo</b> <code>w</code> ✅",
        ]
        # A run with the adapter up again: run 1 was not sent again.
        await post_scheduled(run, "spaces/AAAA", REPORT, 3)
        await chat.wait_for(lambda: len(chat.created()) >= 6)
        await trio.sleep(0.3)
        shown = [texts(r.body)[0] for r in chat.created()]
        assert shown == [
            "⏰ Scheduler: Daily report",
            "Nothing changed.",
            "⏰ Scheduler: Weekly summary",
            "A quiet week.",
            "⏰ Scheduler: Daily report",
            "Still nothing.",
        ]
        assert not any("yesterday" in t for r in chat.log.requests if r.body for t in texts(r.body))
        assert_only_own_messages_touched(run)
        assert len(run.sessions()) == 1


async def test_a_scheduled_run_into_a_thread_is_answered_in_the_thread_once_across_restarts(
    tmp_path: Path, pubsub: FakePubSub
) -> None:
    llm = ScriptedLLM([{"text": "Nothing changed."}], loop=True)
    async with gchat_running(tmp_path, llm) as run:
        chat = run.chat
        await post_scheduled(run, SCHEDULED_THREAD, REPORT, 1)
        await chat.wait_for(lambda: len(chat.created()) >= 2)
        card, answer = chat.created()
        assert card.body["thread"] == {"name": SCHEDULED_THREAD} == answer.body["thread"]
        assert texts(card.body)[:2] == ["⏰ Scheduler: Daily report", "⏳ Working…"]
        assert texts(answer.body) == ["Nothing changed."]
        card_name = next(iter(chat.placed))
        await chat.wait_for(lambda: "⚡" in " ".join(final_texts(run, card_name)))
        await run.stop()
        await run.start()  # resumes from its cursor
        await post_scheduled(run, SCHEDULED_THREAD, REPORT, 2)
        await chat.wait_for(lambda: len(chat.created()) >= 4)
        await trio.sleep(0.3)
        assert [texts(r.body)[0] for r in chat.created()] == [
            "⏰ Scheduler: Daily report",
            "Nothing changed.",
        ] * 2
        assert len(chat.in_thread(SCHEDULED_THREAD)) == 4
        assert_only_own_messages_touched(run)
        (session,) = run.sessions()
        assert isinstance(session, Session) and session.channel_id == SCHEDULED_THREAD


async def test_schedules_lists_the_conversations_schedules_without_a_turn(
    tmp_path: Path, pubsub: FakePubSub
) -> None:
    llm = ScriptedLLM([{"text": "hi"}])
    async with gchat_running(tmp_path, llm) as run:
        chat, store = run.chat, run.h.store
        pubsub.publish(message_event("hello there"))
        await chat.wait_for(lambda: len(chat.created()) >= 2)
        (session,) = run.sessions()
        now = time.time()
        for name, target, created_by in (
            ("standup", "new", session.id),  # made by this conversation, runs elsewhere
            ("check", f"gchat:{THREAD}", "cli"),  # runs in this thread
            ("space", "gchat:spaces/AAAA", "cli"),  # runs in the space
        ):
            every = new_schedule(name, prompt=f"{name} prompt", every="1h", target=target, now=now)
            store.put_schedule(msgspec.structs.replace(every, created_by=created_by))
        asked = pubsub.publish(message_event("/schedules", name="spaces/AAAA/messages/M2.M2"))
        await acked(pubsub, asked)
        reply = chat.created()[2]
        assert reply.body["thread"] == {"name": THREAD}
        lines = "\n".join(texts(reply.body)).split("\n")
        assert [line.split(" · ")[0] for line in lines] == ["check: every 1h", "standup: every 1h"]
        assert lines[0].endswith(' · "check prompt"') and " · next " in lines[0]
        # A new thread in the space is no conversation yet: the space's schedules.
        new_thread = {"name": "spaces/AAAA/threads/T2"}
        top = message_event("/schedules", name="spaces/AAAA/messages/M3.M3", thread=new_thread)
        await acked(pubsub, pubsub.publish(top))
        assert texts(chat.created()[3].body)[0].startswith("space: every 1h · next ")
        assert chat.created()[3].body["thread"] == new_thread
        store.delete_schedule("space")
        again = message_event("/schedules", name="spaces/AAAA/messages/M4.M4", thread=new_thread)
        await acked(pubsub, pubsub.publish(again))
        (empty,) = texts(chat.created()[4].body)
        assert empty.startswith("No schedules in this conversation. Ask me to make one")
        assert "kesoku schedule add NAME --to gchat:spaces/AAAA " in empty
        # None was a turn: no model call, no user message, no card, no reaction, no new session.
        await trio.sleep(0.3)
        assert llm.calls == 1 and len(chat.created()) == 5
        assert [m.content for m in run.user_messages()] == ["hello there"]
        assert len(chat.reactions()) == 1
        assert run.sessions() == [session]


# -- heartbeat runs --------------------------------------------------------------------------------


async def post_heartbeat(run: GChatRun, channel: str, prompt: str, planned: int) -> Message:
    """What the scheduler does for ``[heartbeat]``: a run of the schedule named heartbeat."""
    gateway = run.h.gateway
    session = gateway.open_session("gchat", channel)
    message = user_text(
        session.id, prompt, sender="Scheduler", external_id=f"schedule:heartbeat:{planned}"
    )
    extra = {SCHEDULE_KEY: {"name": "heartbeat", "planned": planned, "manual": False}}
    return await gateway.post(msgspec.structs.replace(message, metadata=Metadata(extra=extra)))


async def test_a_heartbeat_run_is_shown_only_when_it_has_something_to_say(
    tmp_path: Path, pubsub: FakePubSub
) -> None:
    quiet: list[dict[str, object]] = [
        {"thought": "checking", "tool_calls": [{"name": "echo", "arguments": {"text": "list"}}]},
        {"text": " HEARTBEAT_OK\n"},
    ]
    alert = {"text": "The disk is 95% full."}
    llm = ScriptedLLM([*quiet, alert, *quiet, alert])
    async with gchat_running(tmp_path, llm, tools=[echo()]) as run:
        chat = run.chat
        await turn_ended(run, await post_heartbeat(run, SCHEDULED_THREAD, "All quiet?", 1))
        await post_heartbeat(run, SCHEDULED_THREAD, "Disk full?", 2)
        await chat.wait_for(lambda: len(chat.created()) >= 2)
        card, answer = chat.created()
        assert card.body["thread"] == {"name": SCHEDULED_THREAD} == answer.body["thread"]
        assert texts(card.body)[0] == "⏰ Scheduler: Disk full?"
        assert texts(answer.body) == ["The disk is 95% full."]
        card_name = next(iter(chat.placed))
        await chat.wait_for(lambda: "⚡" in " ".join(final_texts(run, card_name)))
        assert final_texts(run, card_name)[1].startswith("⚡ turn 2 · ")
        # The adapter is away while both kinds run; they had ended when it reads them.
        await run.stop()
        await turn_ended(run, await post_heartbeat(run, SCHEDULED_THREAD, "All quiet?", 3))
        await turn_ended(run, await post_heartbeat(run, SCHEDULED_THREAD, "Disk full?", 4))
        await run.start()
        await chat.wait_for(lambda: len(chat.created()) >= 4)
        card2_name = list(chat.placed)[2]
        await chat.wait_for(lambda: "Ended" in " ".join(final_texts(run, card2_name)))
        assert final_texts(run, card2_name)[:2] == [
            "⏰ Scheduler: Disk full?",
            "☑️ Ended while the adapter was away",
        ]
        await trio.sleep(0.3)
        assert [texts(r.body)[0] for r in chat.created()] == [
            "⏰ Scheduler: Disk full?",
            "The disk is 95% full.",
        ] * 2
        sent = [t for r in chat.log.requests if r.body for t in texts(r.body)]
        assert not any("HEARTBEAT_OK" in t or "checking" in t or "echo" in t for t in sent)
        assert_only_own_messages_touched(run)
        history = run.h.store.history(run.session_id())
        assert [m.content for m in history if m.kind is Kind.TEXT].count(" HEARTBEAT_OK\n") == 2
