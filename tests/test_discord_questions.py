"""``[question: … | …]`` on Discord with more choices, or longer ones, than buttons hold.

The real discord.py client against the loopback fake of Discord (tests/fakes/discord_api.py), which
refuses components Discord would refuse (rows, buttons per row, options per menu, label lengths).
Every choice must be shown in full and be choosable; the choice reaches the model as its full text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fakes.discord_api import FakeDiscord
from test_discord_adapter import ALICE, Bot, custom_ids, discord_bot, running_adapter

from kesoku.testing import Step
from kesoku.vocab.model import Role

LONG = "an option whose text runs well past what a button or a menu option can show: " + "x" * 90


def components(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for row in message.get("components") or [] for c in row["components"]]


def last_user_text(bot: Bot) -> str:
    (session,) = bot.sessions()
    return [m.content for m in bot.h.history(session) if m.role is Role.USER][-1]


def question(text: str, choices: list[str]) -> Step:
    return Step(text=f"[question: {text} | " + " | ".join(choices) + "]")


async def ask(bot: Bot, first_line: str) -> tuple[int, list[dict[str, Any]]]:
    """Say "pick one"; the thread, and the bot's messages from the question's on (its first line
    is ``first_line``)."""
    thread = int(bot.fake.user_says(bot.general, bot.alice, "pick one")["id"])
    messages = await bot.reply_in(thread)
    start = next(i for i, m in enumerate(messages) if m["content"].startswith(first_line))
    return thread, messages[start:]


def menu_holding(messages: list[dict[str, Any]], value: str) -> tuple[dict[str, Any], str]:
    """The message and the custom id of the menu with the option of ``value``."""
    for message in messages:
        for item in components(message):
            if any(o["value"] == value for o in item.get("options") or ()):
                return message, item["custom_id"]
    raise AssertionError(f"no menu offers {value}")


async def chosen(bot: Bot, thread: int, text: str) -> None:
    """Wait for the choice's announcement and the turn it started."""
    await bot.reply_in(thread, 2)
    await bot.fake.wait_for(
        lambda: (
            f"<@{ALICE}> selected: **{text}**"
            in [m["content"] for m in bot.fake.bot_messages(thread)]
        )
    )


async def test_thirty_choices_are_listed_in_full_and_the_thirtieth_is_chosen_from_a_menu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    choices = [f"choice {n}" for n in range(1, 30)] + [LONG]
    table = {
        "pick": question("Which one?", choices),
        LONG: Step(text="The long one."),
    }
    async with discord_bot(tmp_path, monkeypatch, table) as bot:
        fake = bot.fake
        thread, (asked,) = await ask(bot, "Which one?")
        # Every choice in full in the text, numbered.
        listed = asked["content"].split("\n")
        assert listed == ["Which one?"] + [f"{n}. {c}" for n, c in enumerate(choices, 1)]
        # Two menus (25 + 5), every choice once, numbered labels within 100 characters.
        menus = components(asked)
        assert [m["type"] for m in menus] == [3, 3]
        options = [o for m in menus for o in m["options"]]
        assert [o["value"] for o in options] == [str(i) for i in range(30)]
        assert options[0]["label"] == "1. choice 1"
        assert options[29]["label"].startswith("30. an option") and len(options[29]["label"]) == 100
        message, menu = menu_holding([asked], "29")
        fake.select(int(message["id"]), menu, ["29"], bot.alice)
        await chosen(bot, thread, LONG)
        assert last_user_text(bot) == LONG
        assert "The long one." in [m["content"] for m in fake.bot_messages(thread)]
        # The menus are disabled, the choice shown as selected.
        edited = components(fake.messages[int(asked["id"])])
        assert all(m.get("disabled") for m in edited)
        assert [o["value"] for m in edited for o in m["options"] if o.get("default")] == ["29"]


async def test_a_choice_too_long_for_its_button_is_numbered_and_shown_in_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = {
        "pick": question("Which?", ["Short", LONG]),
        LONG: Step(text="Long it is."),
    }
    async with discord_bot(tmp_path, monkeypatch, table) as bot:
        fake = bot.fake
        thread, (asked,) = await ask(bot, "Which?")
        assert asked["content"] == f"Which?\n1. Short\n2. {LONG}"
        labels = [c["label"] for c in components(asked)]
        assert labels[0] == "1. Short"
        assert labels[1].startswith("2. an option") and labels[1].endswith("…")
        assert len(labels[1]) == 80
        fake.click(int(asked["id"]), custom_ids(asked)[1], bot.alice)
        await chosen(bot, thread, LONG)
        assert last_user_text(bot) == LONG


async def test_more_than_125_choices_continue_in_a_second_message_of_menus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    choices = [f"c{n}" for n in range(1, 131)]
    table = {"pick": question("Many?", choices)}
    async with discord_bot(tmp_path, monkeypatch, table) as bot:
        fake = bot.fake
        thread, (first, second) = await ask(bot, "Many?")
        assert first["content"].split("\n") == ["Many?"] + [
            f"{n}. {c}" for n, c in enumerate(choices, 1)
        ]
        assert [len(m["options"]) for m in components(first)] == [25] * 5
        assert second["content"] == "… more choices:"
        assert [len(m["options"]) for m in components(second)] == [5]
        values = [o["value"] for m in (first, second) for c in components(m) for o in c["options"]]
        assert values == [str(i) for i in range(130)]
        message, menu = menu_holding([first, second], "129")
        fake.select(int(message["id"]), menu, ["129"], bot.alice)
        await chosen(bot, thread, "c130")
        assert last_user_text(bot) == "c130"


async def test_a_menu_value_that_is_no_choice_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = {"pick": question("Which?", [f"c{n}" for n in range(1, 31)])}
    async with discord_bot(tmp_path, monkeypatch, table) as bot:
        _, (asked,) = await ask(bot, "Which?")
        fake: FakeDiscord = bot.fake
        menu = components(asked)[0]["custom_id"]
        replies = len(fake.interaction_replies)
        fake.select(int(asked["id"]), menu, ["-1"], bot.alice)
        fake.select(int(asked["id"]), menu, ["30"], bot.alice)
        await fake.wait_for(lambda: len(fake.interaction_replies) >= replies + 2)
        said = [r["data"]["content"] for r in fake.interaction_replies[replies:]]
        assert sorted(said) == [
            "That is not one of the question's choices.",
            "This question is gone.",
        ]
        assert last_user_text(bot) == "pick one"
        assert not any(m.get("disabled") for m in components(fake.messages[int(asked["id"])]))


async def test_a_menu_chooses_after_the_adapter_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    choices = [f"c{n}" for n in range(1, 31)]
    table = {"pick": question("Which?", choices), "c30": Step(text="Thirty.")}
    async with discord_bot(tmp_path, monkeypatch, table, adapter=False) as bot:
        assert bot.config is not None
        async with running_adapter(bot, bot.config):
            thread, (asked,) = await ask(bot, "Which?")
        async with running_adapter(bot, bot.config):
            message, menu = menu_holding([asked], "29")
            bot.fake.select(int(message["id"]), menu, ["29"], bot.alice)
            await chosen(bot, thread, "c30")
            assert last_user_text(bot) == "c30"
