"""Delivery once across Discord's reconnects (replays); the token.

Delivery once across adapter restarts (the saved cursor) is the adapter contract's
(test_adapter_contract.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kesoku_discord.adapter import bot_token
from test_discord_adapter import config_for, discord_bot

from kesoku.vocab.errors import OperatorError
from kesoku.vocab.model import Role


async def test_a_reconnect_resumes_and_replayed_messages_are_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with discord_bot(tmp_path, monkeypatch) as bot:
        fake = bot.fake
        first = fake.user_says(bot.quiet, bot.alice, "first")
        await bot.reply_in(bot.quiet)
        fake.ask_reconnect()
        await fake.wait_for(lambda: fake.resumes == 1)
        fake.replay(first)  # Discord may send an event again around a reconnect
        fake.user_says(bot.quiet, bot.alice, "second")
        await bot.reply_in(bot.quiet, 2)
        (session,) = bot.sessions()
        assert [m.content for m in bot.h.history(session) if m.role is Role.USER] == [
            "first",
            "second",
        ]
        assert fake.identifies == 1, "resumed, not a new session"
        answers = [
            m["content"]
            for m in fake.bot_messages(bot.quiet)
            if m["content"].startswith("you said")
        ]
        assert answers == ["you said: first", "you said: second"]


async def test_the_token_falls_back_to_discord_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISCORD_TOKEN", "from-the-environment")
    async with discord_bot(tmp_path, monkeypatch, bot_token=None) as bot:
        login = bot.fake.log.requests[0]
        assert login.path == "/api/v10/users/@me"
        assert login.headers["authorization"] == "Bot from-the-environment"


def test_no_token_is_an_operator_error(tmp_path: Path) -> None:
    config = config_for(tmp_path, bot_token=None)
    with pytest.raises(OperatorError, match="DISCORD_TOKEN"):
        bot_token(config, {})
    assert bot_token(config, {"DISCORD_TOKEN": "t"}) == "t"
    assert bot_token(config_for(tmp_path), {"DISCORD_TOKEN": "t"}) == "test-token", (
        "the config wins"
    )
