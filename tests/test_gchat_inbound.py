"""Google Chat inbound, through the Pub/Sub fake: an event's wait between receipt and storage is
logged past a threshold; an attachment that could not be saved is told to the model, not only the
user; a malformed add-on event is one warning and acked."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import kesoku_gchat.inbound
import msgspec
import pytest
import trio
from test_gchat_support import FakePubSub, addon_event, gchat_running, message_event, texts

from kesoku.testing import ScriptedLLM


async def acked(pubsub: FakePubSub, *message_ids: str) -> None:
    assert await trio.to_thread.run_sync(
        pubsub.wait, lambda: set(message_ids) <= set(pubsub.acked)
    ), f"not acked: {set(message_ids) - set(pubsub.acked)}"


def uploaded(resource: str) -> dict[str, object]:
    return {
        "name": "spaces/AAAA/messages/M9.M9/attachments/A1",
        "contentName": "photo.png",
        "contentType": "image/png",
        "attachmentDataRef": {"resourceName": resource},
    }


def waits_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "after it was received" in r.getMessage()]


async def test_an_event_that_waited_behind_a_slow_one_is_logged_once_with_its_wait_and_id(
    tmp_path: Path,
    pubsub: FakePubSub,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.WARNING, logger="kesoku_gchat.inbound")
    async with gchat_running(tmp_path, ScriptedLLM([{"text": "ok"}], loop=True)) as run:
        # An event taken in at once is not logged (the default threshold).
        fast = pubsub.publish(message_event("first", name="spaces/AAAA/messages/F.F"))
        await acked(pubsub, fast)
        assert waits_logged(caplog) == []
        # The first event's attachment download hangs; the second waits behind it.
        monkeypatch.setattr(kesoku_gchat.inbound, "EVENT_WAIT_WARN_S", 0.2)
        gate = run.chat.media_gate = trio.Event()
        run.chat.media["att-1"] = b"\x89PNG..."
        slow = pubsub.publish(
            message_event("look", name="spaces/AAAA/messages/S.S", attachment=[uploaded("att-1")])
        )
        await run.chat.wait_for(
            lambda: any(r.path.startswith("/v1/media/") for r in run.chat.log.requests)
        )
        queued = pubsub.publish(message_event("and this", name="spaces/AAAA/messages/Q.Q"))
        assert await trio.to_thread.run_sync(pubsub.wait, lambda: queued in pubsub.deliveries)
        await trio.sleep(0.5)
        gate.set()
        await acked(pubsub, slow, queued)
    logged = waits_logged(caplog)
    assert [line.split()[3] for line in logged] == [slow, queued]
    assert "(spaces/AAAA/messages/Q.Q) handled " in logged[1]


async def test_an_attachment_that_could_not_be_saved_is_told_to_the_model_and_the_user(
    tmp_path: Path, pubsub: FakePubSub, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_full(folder: Path, filename: str, data: bytes) -> Path:
        # A full disk cannot be made here for real; everything else in the path is real.
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(kesoku_gchat.inbound, "save_attachment", disk_full)
    llm = ScriptedLLM([{"text": "ok"}], loop=True)
    async with gchat_running(tmp_path, llm, reaction=None) as run:
        run.chat.media["att-1"] = b"\x89PNG..."
        message_id = pubsub.publish(
            message_event("look", name="spaces/AAAA/messages/M9.M9", attachment=[uploaded("att-1")])
        )
        await acked(pubsub, message_id)
        note = "attachment photo.png could not be saved ("
        (user,) = run.user_messages()
        assert user.metadata.attachments == ()
        assert user.content.startswith(f"look\n\n[{note}")
        # The model's own request carries the note, not only the stored message.
        await run.until(lambda: any(note in msgspec.json.encode(r).decode() for r in llm.requests))
        await run.chat.wait_for(
            lambda: any(
                t.startswith(f"⚠️ {note}") for r in run.chat.created() for t in texts(r.body)
            )
        )


async def test_a_malformed_addon_event_is_one_warning_and_acked(
    tmp_path: Path, pubsub: FakePubSub, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="kesoku_gchat.inbound")
    async with gchat_running(tmp_path, ScriptedLLM([{"text": "ok"}], loop=True)) as run:
        bad = pubsub.publish(b'{"commonEventObject": {"hostApp": "CHAT"}, "chat": {"user": 1}}')
        good = pubsub.publish(addon_event("still here", name="spaces/AAAA/messages/G.G"))
        await acked(pubsub, bad, good)
        assert [m.content for m in run.user_messages()] == ["still here"]
    (line,) = [r.getMessage() for r in caplog.records if f"message {bad} " in r.getMessage()]
    assert line.endswith(
        "dropped: a Workspace add-on event without a Chat payload ('chat.*Payload')"
    )
