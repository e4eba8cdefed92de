"""One Discord channel answering 503 holds up only its own replies (the delivery lanes).

The real discord.py client against the loopback fake (tests/fakes/discord_api.py), a real runtime
and SQLite file. discord.py raises a 503 at once, and the adapter's ``send`` retries it (1 s, then
2 s, …): the channel's lane waits, the other channel's replies go out meanwhile.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_discord_adapter import REPORT, WEEKLY, discord_bot, post_scheduled, running_adapter

from kesoku.testing import Step

LANES_LOG = "kesoku.delivery_lanes"


async def test_a_channel_answering_503_holds_up_only_its_own_replies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    table = {"Daily report": Step(text="Nothing changed."), "Weekly": Step(text="A quiet week.")}
    async with discord_bot(tmp_path, monkeypatch, table, adapter=False) as bot:
        fake, store, config = bot.fake, bot.h.store, bot.config
        assert config is not None

        def lane_lines(text: str) -> list[str]:
            return [
                r.getMessage()
                for r in caplog.records
                if r.name == LANES_LOG and text in r.getMessage()
            ]

        async with running_adapter(bot, config) as adapter:
            assert adapter.delivery is not None
            adapter.delivery.lanes.stuck_after_s = 0.2
            fake.unavailable.add(bot.quiet)
            await post_scheduled(bot, bot.quiet, REPORT, 1)
            await fake.wait_for(lambda: bot.quiet in fake.unavailable_answers)
            await post_scheduled(bot, bot.general, WEEKLY, 2)
            header, answer = await bot.reply_in(bot.general)
            # The other channel's turn went out whole while the first still answers 503.
            assert header["content"].startswith(
                "⏰ Scheduler: Weekly summary <@5002>\n⚡ turn 1 · "
            )
            assert answer["content"] == "A quiet week."
            assert fake.bot_messages(bot.quiet) == []
            await fake.wait_for(lambda: lane_lines("still on its way"))
            assert lane_lines("still on its way") == [
                f"discord: a reply to channel {bot.quiet} is still on its way after 0.2 s; "
                "later replies there wait, other channels go on"
            ]

            fake.unavailable.discard(bot.quiet)
            messages = await bot.reply_in(bot.quiet)
            texts = [m["content"] for m in messages]
            assert texts[0].startswith("⏰ Scheduler: Daily report\n⚡ turn 1 · "), texts
            assert re.fullmatch(r"⏳ Replies here were delayed by \d+s\.", texts[1]), texts
            assert texts[2:] == ["Nothing changed."]
            assert len(lane_lines("still on its way")) == 1
            assert lane_lines(f"channel {bot.quiet} reached again")
        # Stopped: the cursor is past every message, with nothing held above it.
        assert store.get_cursor("adapter:discord") == store.last_message_id()
        assert store.cursor_done("adapter:discord") == []
        assert [m["content"] for m in fake.bot_messages(bot.quiet)] == texts, "nothing more"
