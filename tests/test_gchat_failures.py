"""The Google Chat adapter against hostile input: it refuses what it must, says why, goes on.

The real SubscriberClient pulls from the in-process Pub/Sub fake and the real Chat client talks to
the loopback Chat fake, as in test_gchat_adapter.py; each test ends by checking that the next
message is still answered.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import kesoku_gchat.inbound
import pytest
from kesoku_gchat.delivery import Delivery
from kesoku_gchat.events import ChatEvent
from kesoku_gchat.inbound import EVENT_TRIES, Inbound
from test_gchat_support import FakePubSub, GChatRun, gchat_running, message_event, texts

from kesoku.config.settings import Config, WorkspaceConfig
from kesoku.testing import ScriptedLLM, Step
from kesoku.tools.attachments import save_attachment
from kesoku.tools.paths import PathGates
from kesoku.vocab.ir import LLMRequest, TextBlock
from kesoku.vocab.model import Message, Session

EMOJI_NAME = "😀" * 70 + ".txt"  # 284 bytes: over a file name's 255


def shown(run: GChatRun) -> list[str]:
    """Every text paragraph the app created, in order (turn cards included)."""
    return [t for r in run.chat.created() for t in texts(r.body)]


async def still_answers(run: GChatRun, pubsub: FakePubSub) -> None:
    pubsub.publish(message_event("still there?", name="spaces/AAAA/messages/M9.M9"))
    await run.chat.wait_for(lambda: "you said: still there?" in shown(run))


def echo() -> ScriptedLLM:
    """A model that answers ``you said: <the user's last text>``."""

    def respond(request: LLMRequest) -> Step:
        block = request.turns[-1].blocks[-1]
        text = block.text if isinstance(block, TextBlock) else ""
        return Step(text="you said: " + text.split(": ", 1)[-1])

    return ScriptedLLM(responder=respond)


def attachment(name: str, resource: str) -> dict[str, object]:
    return {
        "contentName": name,
        "contentType": "text/plain",
        "attachmentDataRef": {"resourceName": resource},
    }


async def test_hostile_attachment_names_and_text_are_taken_in(
    tmp_path: Path, pubsub: FakePubSub
) -> None:
    async with gchat_running(tmp_path, echo(), reaction=None) as run:
        run.chat.media.update({"r1": b"emoji", "r2": b"surrogate", "r3": b"dash"})
        files = [
            attachment(EMOJI_NAME, "r1"),
            attachment("bad\ud800name.txt", "r2"),
            attachment("-rf", "r3"),
        ]
        # json.dumps writes \ud800 escapes: the event decodes to lone surrogates.
        first = pubsub.publish(message_event("files \ud800 here", attachment=files))
        await run.until(lambda: first in pubsub.acked)
        (user,) = run.user_messages()
        assert [a.filename for a in user.metadata.attachments] == [
            "😀" * 62 + ".txt",
            "badname.txt",
            "rf",
        ]
        assert [Path(a.path).read_bytes() for a in user.metadata.attachments] == [
            b"emoji",
            b"surrogate",
            b"dash",
        ]
        assert user.content.startswith("files \ufffd here")
        # Pub/Sub data that is not UTF-8: each invalid byte is read as U+FFFD and the message
        # answered.
        data = message_event("bytes XX", name="spaces/AAAA/messages/M2.M2").replace(
            b"XX", b"\xff\xfe"
        )
        invalid = pubsub.publish(data)
        await run.until(lambda: invalid in pubsub.acked)
        await run.chat.wait_for(lambda: "you said: bytes \ufffd\ufffd" in shown(run))
        assert run.user_messages()[-1].content.endswith("bytes \ufffd\ufffd")
        await still_answers(run, pubsub)


async def test_an_attachment_that_cannot_be_saved_is_told_to_the_user_and_the_model(
    tmp_path: Path, pubsub: FakePubSub, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full_disk(folder: Path, filename: str, data: bytes) -> Path:
        if filename == "big.bin":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return save_attachment(folder, filename, data)

    monkeypatch.setattr(kesoku_gchat.inbound, "save_attachment", full_disk)
    async with gchat_running(tmp_path, echo(), reaction=None) as run:
        run.chat.media["r1"] = b"x" * 64
        message_id = pubsub.publish(
            message_event("a big file", attachment=[attachment("big.bin", "r1")])
        )
        await run.until(lambda: message_id in pubsub.acked)
        (user,) = run.user_messages()
        note = "attachment big.bin could not be saved (No space left on device)"
        assert user.content == f"a big file\n\n[{note}]" and user.metadata.attachments == ()
        await run.chat.wait_for(lambda: f"⚠️ {note}" in shown(run))
        await still_answers(run, pubsub)


async def test_file_notes_follow_the_sharing_rule(tmp_path: Path, pubsub: FakePubSub) -> None:
    config_file = tmp_path / "kesoku.toml"
    config_file.write_text('[gchat]\ncredentials_file = "key.json"\n')
    (tmp_path / "fine.txt").write_text("shareable")
    config = Config(
        workspace=WorkspaceConfig(
            db_path=str(tmp_path / "kesoku.db"), shareable_roots=(str(tmp_path),)
        )
    )
    gates = PathGates.from_config(config, config_file=config_file)
    fine = tmp_path / "fine.txt"
    reply = f"[file: {config_file}]\n[file: /{'a' * 300}]\n[file: {fine}]\n[file: /etc/passwd]"
    llm = ScriptedLLM([{"text": reply}, {"text": "you said: still there?"}])
    async with gchat_running(tmp_path, llm, reaction=None, gates=gates) as run:
        pubsub.publish(message_event("send the files"))
        await run.chat.wait_for(
            lambda: any(t.startswith("⚠️ I can't share `kesoku.toml`") for t in shown(run))
        )
        answer = next(
            r for r in run.chat.created() if any("kesoku.toml" in t for t in texts(r.body))
        )
        assert texts(answer.body) == [
            "⚠️ I can't share `kesoku.toml`: Kesoku's own file kesoku.toml holds Kesoku's "
            "configuration and credentials.",
            f"⚠️ I can't share `{'a' * 79}…`: a name in it is too long (300 bytes; at most 255).",
            "📎 `fine.txt` (files are not sent to Google Chat; it stays in the session folder)",
            "⚠️ I can't share `passwd`: it is outside the session folder and the shared folders.",
        ]
        await still_answers(run, pubsub)


async def test_an_event_that_keeps_failing_is_retried_then_dropped_and_told(
    tmp_path: Path,
    pubsub: FakePubSub,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    message = Inbound.message

    async def broken(self: Inbound, event: ChatEvent) -> None:
        if "boom" in event.text:
            raise RuntimeError("a bug in taking this event in")
        await message(self, event)

    monkeypatch.setattr(Inbound, "message", broken)
    async with gchat_running(tmp_path, echo(), reaction=None) as run:
        poison = pubsub.publish(message_event("boom"))
        await run.until(lambda: poison in pubsub.acked)
        assert pubsub.nacked.count(poison) == EVENT_TRIES - 1
        assert pubsub.deliveries.count(poison) == EVENT_TRIES
        await run.chat.wait_for(lambda: bool(run.chat.created()))
        (notice,) = run.chat.created()
        assert texts(notice.body) == [
            "⚠️ I could not take this message in (RuntimeError); please send it again."
        ]
        assert notice.body["thread"] == {"name": "spaces/AAAA/threads/T1"}
        dropped = [r for r in caplog.records if r.exc_info and r.name == "kesoku_gchat.inbound"]
        assert [r.getMessage() for r in dropped] == [
            f"gchat: Pub/Sub message {poison} (spaces/AAAA/messages/M1.M1) dropped after 3 tries"
        ]
        await still_answers(run, pubsub)


async def test_a_reply_that_breaks_delivery_is_told_and_the_cursor_moves_on(
    tmp_path: Path, pubsub: FakePubSub, monkeypatch: pytest.MonkeyPatch
) -> None:
    send_answer = Delivery.send_answer

    async def broken(self: Delivery, session: Session, message: Message) -> None:
        if "explode" in message.content:
            raise ValueError("a bug in showing this reply")
        await send_answer(self, session, message)

    monkeypatch.setattr(Delivery, "send_answer", broken)
    llm = ScriptedLLM([{"text": "this will explode"}, {"text": "you said: still there?"}])
    async with gchat_running(tmp_path, llm, reaction=None) as run:
        pubsub.publish(message_event("explode please"))
        await run.chat.wait_for(
            lambda: "⚠️ Part of this reply could not be shown (ValueError)." in shown(run)
        )
        await still_answers(run, pubsub)
        assert not any("explode" in t for t in shown(run))
