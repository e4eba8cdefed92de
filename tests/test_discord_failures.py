"""The Discord adapter against hostile input: it refuses what it must, says why, keeps answering.

The real discord.py client logs into the loopback fake (tests/fakes/discord_api.py), as in
test_discord_adapter.py; each test ends by checking that the next message is still answered.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import kesoku_discord.inbound
import pytest
from kesoku_discord.delivery import Delivery
from kesoku_discord.inbound import Inbound
from test_discord_adapter import Bot, discord_bot

from kesoku.testing import Step
from kesoku.tools.attachments import save_attachment
from kesoku.vocab.model import Message, Role, Session

EMOJI_NAME = "😀" * 70 + ".txt"  # 284 bytes: over a file name's 255


def texts(bot: Bot, thread: int) -> list[str]:
    return [m["content"] for m in bot.fake.bot_messages(thread)]


async def still_answers(bot: Bot, thread: int, turns: int) -> None:
    """The adapter answers the next message in the same thread (its turn number ``turns``)."""
    bot.fake.user_says(thread, bot.alice, "still there?")
    await bot.reply_in(thread, turns)
    assert "you said: still there?" in texts(bot, thread)


def user_messages(bot: Bot) -> list[Message]:
    (session,) = bot.sessions()
    return [m for m in bot.h.history(session) if m.role is Role.USER]


async def test_the_config_its_database_and_secrets_are_refused_whatever_shareable_roots_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_file = tmp_path / "kesoku.toml"
    config_file.write_text('[discord]\nbot_token = "MTIz.secret-token"\n')
    (tmp_path / ".env").write_text("DISCORD_TOKEN=MTIz.secret-token\n")
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "fine.txt").write_text("shareable")
    reply = (
        f"[file: {config_file}]\n[file: {tmp_path / 'kesoku.db'}]\n"
        f"[file: {tmp_path / 'kesoku.db-wal'}]\n[file: {tmp_path / '.env'}]\n"
        f"[file: {tmp_path / 'shared' / 'fine.txt'}]"
    )
    table = {"config": Step(text=reply)}
    async with discord_bot(
        tmp_path, monkeypatch, table, shared=tmp_path, config_file=config_file
    ) as bot:
        assert bot.h.rt.gates.shareable_roots == (tmp_path,)  # the config's folder is shared
        thread = int(bot.fake.user_says(bot.general, bot.alice, "send me the config")["id"])
        messages = await bot.reply_in(thread)
        configuration = "holds Kesoku's configuration and credentials."
        assert [m["content"] for m in messages][1:5] == [
            f"⚠️ I can't share `kesoku.toml`: Kesoku's own file kesoku.toml {configuration}",
            f"⚠️ I can't share `kesoku.db`: Kesoku's own file kesoku.db {configuration}",
            f"⚠️ I can't share `kesoku.db-wal`: Kesoku's own file kesoku.db-wal {configuration}",
            "⚠️ I can't share `.env`: .env files hold secrets.",
        ]
        # Only the shareable file went up; no upload holds the token.
        uploads = [file for files in bot.fake.uploads.values() for file in files]
        assert uploads == [("fine.txt", b"shareable")]
        assert not any("secret-token" in m["content"] for m in bot.fake.bot_messages(thread))
        await still_answers(bot, thread, 2)


async def test_hostile_file_markers_are_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "loop").symlink_to("loop")
    loop = tmp_path / "shared" / "loop"
    reply = f"[file: /{'a' * 300}]\n[file: {loop}]\n[file: /{'b/' * 2100}x]\nDone."
    async with discord_bot(tmp_path, monkeypatch, {"hostile": Step(text=reply)}) as bot:
        thread = int(bot.fake.user_says(bot.general, bot.alice, "hostile files")["id"])
        shown = [m["content"] for m in await bot.reply_in(thread)][1:]
        assert shown == [
            f"⚠️ I can't share `{'a' * 79}…`: a name in it is too long (300 bytes; at most 255).",
            "⚠️ I can't share `loop`: it is a symlink loop (too many levels of symbolic links).",
            "⚠️ I can't share `x`: it is too long (4,202 bytes; at most 4,095).",
            "Done.",
        ]
        await still_answers(bot, thread, 2)


async def test_hostile_attachment_names_are_saved_under_safe_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with discord_bot(tmp_path, monkeypatch) as bot:
        files = (
            (EMOJI_NAME, b"emoji", "text/plain"),
            ("bad\ud800name.txt", b"surrogate", "text/plain"),
            ("--help.txt", b"dash", "text/plain"),
        )
        # The fake sends JSON with \ud800 escapes: discord.py decodes them to lone surrogates.
        thread = int(
            bot.fake.user_says(bot.general, bot.alice, "files \ud800 here", attachments=files)["id"]
        )
        await bot.reply_in(thread)
        (root,) = user_messages(bot)
        saved = root.metadata.attachments
        assert [a.filename for a in saved] == ["😀" * 62 + ".txt", "badname.txt", "help.txt"]
        assert [Path(a.path).read_bytes() for a in saved] == [b"emoji", b"surrogate", b"dash"]
        assert root.content.startswith("files \ufffd here")
        await still_answers(bot, thread, 2)


async def test_an_attachment_that_cannot_be_had_is_told_to_the_user_and_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full_disk(folder: Path, filename: str, data: bytes) -> Path:
        if filename == "big.bin":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return save_attachment(folder, filename, data)

    monkeypatch.setattr(kesoku_discord.inbound, "save_attachment", full_disk)
    async with discord_bot(tmp_path, monkeypatch) as bot:
        fake = bot.fake
        files = (
            ("big.bin", b"x" * 64, "application/octet-stream"),
            ("gone.txt", b"y", "text/plain"),
        )
        message = fake.user_says(bot.general, bot.alice, "two files", attachments=files)
        gone = message["attachments"][1]["url"].rsplit("/", 1)[1]
        del fake.attachments[gone]  # the CDN lost it before the adapter downloads it
        thread = int(message["id"])
        await bot.reply_in(thread)
        (root,) = user_messages(bot)
        assert root.metadata.attachments == ()
        notes = [
            "attachment big.bin could not be saved (No space left on device)",
            "attachment gone.txt could not be downloaded (404  (error code: 0): asset not found)",
        ]
        assert root.content == "two files\n\n" + "\n".join(f"[{note}]" for note in notes)
        notice = next(t for t in texts(bot, thread) if t.startswith("⚠️ attachment"))
        assert notice.splitlines() == [f"⚠️ {note}" for note in notes]
        await still_answers(bot, thread, 2)


async def test_a_message_that_breaks_the_inbound_side_is_told_and_the_next_is_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    take_in = Inbound.take_in

    async def broken(self: Inbound, message: Any) -> None:
        if "boom" in message.content:
            raise RuntimeError("a bug in taking this message in")
        await take_in(self, message)

    monkeypatch.setattr(Inbound, "take_in", broken)
    async with discord_bot(tmp_path, monkeypatch) as bot:
        fake = bot.fake
        asked = fake.user_says(bot.quiet, bot.alice, "boom")
        await fake.wait_for(
            lambda: any(t.startswith("⚠️ I could not take") for t in texts(bot, bot.quiet))
        )
        assert texts(bot, bot.quiet) == [
            "⚠️ I could not take this message in (RuntimeError); please send it again."
        ]
        logged = [r for r in caplog.records if r.name == "kesoku_discord.inbound" and r.exc_info]
        assert [r.getMessage() for r in logged] == [f"discord: message {asked['id']} not taken in"]
        fake.user_says(bot.quiet, bot.alice, "and then")
        assert "you said: and then" in [m["content"] for m in await bot.reply_in(bot.quiet)]


async def test_a_reply_that_breaks_delivery_is_told_and_the_cursor_moves_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    send_answer = Delivery.send_answer

    async def broken(self: Delivery, session: Session, channel: Any, message: Message) -> None:
        if "explode" in message.content:
            raise ValueError("a bug in showing this reply")
        await send_answer(self, session, channel, message)

    monkeypatch.setattr(Delivery, "send_answer", broken)
    async with discord_bot(
        tmp_path, monkeypatch, {"explode": Step(text="this will explode")}
    ) as bot:
        thread = int(bot.fake.user_says(bot.general, bot.alice, "explode please")["id"])
        shown = [m["content"] for m in await bot.reply_in(thread)][1:]
        assert shown == ["⚠️ Part of this reply could not be shown (ValueError)."]
        (session,) = bot.sessions()
        answer = next(m for m in bot.h.history(session) if m.role is Role.ASSISTANT)
        logged = [
            r.getMessage()
            for r in caplog.records
            if r.name == "kesoku_discord.delivery" and r.exc_info
        ]
        assert logged == [f"discord: message {answer.id} not delivered"]
        delivery = bot.adapter.delivery
        assert delivery is not None and delivery.cursor.position >= answer.id
        await still_answers(bot, thread, 2)
