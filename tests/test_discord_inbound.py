"""The Discord inbound side: a message taken in once, conversations where threads are refused, and
attachments that cannot be had told to the user and the model.

The real discord.py client logs into the loopback fake (tests/fakes/discord_api.py), as in
test_discord_adapter.py, whose fixture this reuses; the runtime is real (SQLite file, scripted
model).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeGuard

import pytest
from fakes.discord_api import FakeDiscord
from kesoku_discord.inbound import THREADS_REFUSED, channel_of_key, conversation_key
from test_discord_adapter import Bot, discord_bot, running_adapter

from kesoku.vocab.errors import StoreError
from kesoku.vocab.ir import TextBlock
from kesoku.vocab.model import Message, Role, Session

THREADS = r"/api/v10/channels/\d+/messages/\d+/threads"
"""Start Thread from Message."""
SEVEN = tuple((f"part {n}.txt", f"part {n} of 7".encode(), "text/plain") for n in range(1, 8))


def thread_requests(fake: FakeDiscord) -> int:
    return len(fake.requests("POST", THREADS))


def user_messages(bot: Bot, session: Session) -> list[Message]:
    return [m for m in bot.h.history(session) if m.role is Role.USER]


def texts(bot: Bot, channel_id: int) -> list[str]:
    return [m["content"] for m in bot.fake.bot_messages(channel_id)]


def is_text(block: object) -> TypeGuard[TextBlock]:
    return isinstance(block, TextBlock)


def files_in(session: Session) -> list[str]:
    return sorted(os.listdir(session.workspace))


async def test_a_message_replayed_after_a_restart_has_its_effects_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with discord_bot(tmp_path, monkeypatch, adapter=False) as bot:
        fake, config = bot.fake, bot.config
        assert config is not None
        async with running_adapter(bot, config):
            asked = fake.user_says(bot.general, bot.alice, "seven parts", attachments=SEVEN)
            thread = int(asked["id"])
            await bot.reply_in(thread)
        (session,) = bot.sessions()
        saved = files_in(session)
        assert saved == [f"part {n}.txt" for n in range(1, 8)]
        assert thread_requests(fake) == 1
        downloads = len(fake.requests("GET", r"/attachments/\d+"))
        async with running_adapter(bot, config):
            fake.replay(asked)  # Discord delivers it again to the new connection
            # Taken in after the replay (one inbound loop, in order): its answer means the replay
            # was handled.
            fake.user_says(thread, bot.alice, "after the restart")
            await bot.reply_in(thread, 2)
        assert len(fake.requests("GET", r"/attachments/\d+")) > downloads, "the replay was seen"
        assert thread_requests(fake) == 1, "no second thread"
        assert files_in(session) == saved, "no second copy of the files"
        assert bot.sessions() == [session]
        assert [m.content.split("\n")[0] for m in user_messages(bot, session)] == [
            "seven parts",
            "after the restart",
        ]
        answers = [t.split("\n")[0] for t in texts(bot, thread)[1::2]]
        assert answers == ["you said: seven parts", "you said: after the restart"]


async def test_a_message_not_stored_is_taken_in_when_replayed_reusing_its_thread_and_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash between the effects and the post: the replay stores it, repeating no effect."""
    async with discord_bot(tmp_path, monkeypatch, adapter=False) as bot:
        fake, config, gateway = bot.fake, bot.config, bot.h.gateway
        assert config is not None
        post = gateway.post
        refused: list[Message] = []

        async def locked_once(message: Message) -> Message:
            if not refused:
                refused.append(message)
                raise StoreError("the database stayed locked for 30 s; the message was not stored")
            return await post(message)

        monkeypatch.setattr(gateway, "post", locked_once)
        async with running_adapter(bot, config):
            asked = fake.user_says(bot.general, bot.alice, "seven parts", attachments=SEVEN)
            thread = int(asked["id"])
            await fake.wait_for(lambda: texts(bot, bot.general))
            assert texts(bot, bot.general) == [
                "⚠️ I could not take this message in (StoreError); please send it again."
            ]
        (session,) = bot.sessions()
        assert user_messages(bot, session) == []
        saved = files_in(session)
        assert len(saved) == 7
        async with running_adapter(bot, config):
            fake.replay(asked)
            await bot.reply_in(thread)
        (root,) = user_messages(bot, session)
        assert root.content.startswith("seven parts")
        assert sorted(Path(a.path).name for a in root.metadata.attachments) == saved
        assert files_in(session) == saved
        assert thread_requests(fake) == 1


async def test_two_equal_attachments_of_one_message_stay_two_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with discord_bot(tmp_path, monkeypatch) as bot:
        twice = (("same.txt", b"same", "text/plain"),) * 2
        thread = int(bot.fake.user_says(bot.general, bot.alice, "twice", attachments=twice)["id"])
        await bot.reply_in(thread)
        (session,) = bot.sessions()
        (root,) = user_messages(bot, session)
        assert [a.filename for a in root.metadata.attachments] == ["same.txt", "same (1).txt"]
        # The same file sent again later is the file already there, unchanged.
        bot.fake.user_says(thread, bot.alice, "again", attachments=twice[:1])
        await bot.reply_in(thread, 2)
        again = user_messages(bot, session)[1]
        assert [a.path for a in again.metadata.attachments] == [root.metadata.attachments[0].path]
        assert files_in(session) == ["same (1).txt", "same.txt"]


def session_of(bot: Bot, key: str) -> Session | None:
    return bot.h.gateway.find_session("discord", key)


def said(bot: Bot, key: str) -> list[str]:
    session = session_of(bot, key)
    return [] if session is None else [m.content for m in user_messages(bot, session)]


async def test_where_threads_are_refused_each_conversation_keeps_its_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with discord_bot(tmp_path, monkeypatch, adapter=False) as bot:
        fake, general, config = bot.fake, bot.general, bot.config
        assert config is not None
        fake.refuse_threads = True  # 403 Missing Permissions (no Create Public Threads)
        notice = THREADS_REFUSED.format(why="403 Missing Permissions")

        def notices() -> list[str]:
            return [t for t in texts(bot, general) if t.startswith("⚠️")]

        async def says(text: str, reply_to: dict[str, Any] | None = None) -> dict[str, Any]:
            """Alice writes in the channel; returns the message once it is stored."""
            to = None if reply_to is None else int(reply_to["id"])
            sent = fake.user_says(general, bot.alice, text, reply_to=to)
            await fake.wait_for(
                lambda: any(text in said(bot, s.channel_id) for s in bot.sessions())
            )
            return sent

        async with running_adapter(bot, config):
            first = await says("first topic")
            second = await says("second topic")
            follow = await says("more on the first", reply_to=first)
            # Up the chain: a reply to a reply (in the event) to the first message.
            deeper = await says("and more", reply_to=follow)
            # Three up: the reply's reply is fetched (GET /channels/{id}/messages/{id}).
            await says("deepest", reply_to=deeper)
            assert fake.requests("GET", rf"/api/v10/channels/{general}/messages/{follow['id']}")
            one = conversation_key(general, int(first["id"]))
            two = conversation_key(general, int(second["id"]))
            assert said(bot, one) == ["first topic", "more on the first", "and more", "deepest"]
            assert said(bot, two) == ["second topic"]
            assert sorted(s.channel_id for s in bot.sessions()) == sorted([one, two])
            assert channel_of_key(one) == (general, int(first["id"]))
            # Told once in the channel, not for every conversation; a reply tries no thread.
            assert notices() == [notice]
            assert thread_requests(fake) == 2
            # /schedules in reply: that conversation's, named as a schedule's target.
            fake.user_says(general, bot.alice, "/schedules", reply_to=int(follow["id"]))
            listed = await fake.wait_for(
                lambda: [t for t in texts(bot, general) if t.startswith("No schedules")]
            )
            assert f"--to discord:{one} " in listed[0]
        async with running_adapter(bot, config):
            # The first message again after a restart: its conversation, no thread tried.
            fake.replay(first)
            await says("third topic")  # taken in after the replay: a new conversation
            assert said(bot, one) == ["first topic", "more on the first", "and more", "deepest"]
            assert thread_requests(fake) == 3
            assert len(bot.sessions()) == 3
            # Once per channel while the adapter runs: the restarted one says it again, once.
            assert notices() == [notice, notice]


async def test_attachments_that_cannot_be_had_are_told_to_the_user_and_the_model_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    unwritable = Path("/sys/kernel")  # no one may create files there, root included
    if not unwritable.is_dir():
        pytest.skip("needs Linux's /sys/kernel as a folder no one can write")
    async with discord_bot(tmp_path, monkeypatch, adapter=False) as bot:
        fake, config = bot.fake, bot.config
        assert config is not None
        async with running_adapter(bot, config):
            thread = int(fake.user_says(bot.general, bot.alice, "hello")["id"])
            await bot.reply_in(thread)
            (session,) = bot.sessions()
            # The workspace becomes a folder that cannot be written (as a full disk or a lost
            # permission would make it).
            os.rmdir(session.workspace)
            os.symlink(unwritable, session.workspace)
            files = (
                ("notes.txt", b"notes", "text/plain"),
                ("flaky.bin", b"flaky", "application/octet-stream"),
            )
            sent = fake.user_says(thread, bot.alice, "two files", attachments=files)
            flaky = sent["attachments"][1]["url"].rsplit("/", 1)[1]
            fake.attachment_status[flaky] = 500  # the CDN fails (discord.py retries no CDN 5xx)
            await bot.reply_in(thread, 2)
        root = user_messages(bot, session)[1]
        assert root.metadata.attachments == ()
        notes = [
            "attachment notes.txt could not be saved (permission denied)",
            "attachment flaky.bin could not be downloaded "
            "(500  (error code: 0): failed to get asset)",
        ]
        assert root.content == "two files\n\n" + "\n".join(f"[{note}]" for note in notes)
        told = [t for t in texts(bot, thread) if t.startswith("⚠️ attachment")]
        assert [t.splitlines() for t in told] == [[f"⚠️ {note}" for note in notes]]
        seen = [b.text for r in bot.llm.requests for t in r.turns for b in t.blocks if is_text(b)]
        assert any(f"[{notes[0]}]" in text and f"[{notes[1]}]" in text for text in seen)
        # Replayed after a restart: stored once, told once.
        async with running_adapter(bot, config):
            fake.replay(sent)
            fake.user_says(thread, bot.alice, "still there?")
            await bot.reply_in(thread, 3)
        assert [m.content.split("\n")[0] for m in user_messages(bot, session)] == [
            "hello",
            "two files",
            "still there?",
        ]
        assert len([t for t in texts(bot, thread) if t.startswith("⚠️ attachment")]) == 1


async def test_where_threads_are_refused_the_bot_answers_in_the_channel_and_replies_continue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with discord_bot(tmp_path, monkeypatch) as bot:
        fake, general = bot.fake, bot.general
        fake.refuse_threads = True
        first = fake.user_says(general, bot.alice, "first topic")
        await bot.reply_in(general)
        second = fake.user_says(general, bot.alice, "second topic")
        await bot.reply_in(general, 2)
        one = conversation_key(general, int(first["id"]))
        two = conversation_key(general, int(second["id"]))

        def answer(text: str) -> dict[str, Any]:
            return next(m for m in fake.bot_messages(general) if m["content"] == text)

        # Every message of a conversation replies to its first message.
        for text, root in (("you said: first topic", first), ("you said: second topic", second)):
            assert answer(text)["message_reference"]["message_id"] == root["id"]
        fake.user_says(
            general, bot.alice, "more", reply_to=int(answer("you said: first topic")["id"])
        )
        await bot.reply_in(general, 3)
        assert said(bot, one) == ["first topic", "more"]
        assert said(bot, two) == ["second topic"]
        assert answer("you said: more")["message_reference"]["message_id"] == first["id"]
        notice = THREADS_REFUSED.format(why="403 Missing Permissions")
        assert [t for t in texts(bot, general) if t.startswith("⚠️")] == [notice]
        assert len(bot.sessions()) == 2
