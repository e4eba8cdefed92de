"""The Discord adapter's pure rules:
answering, chunking, rendering, labels, the context prompt, /restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fakes.discord_api import components_problem
from hypothesis import given
from hypothesis import strategies as st
from kesoku_discord.convert import (
    Author,
    Place,
    button_label,
    channel_override,
    context_prompt,
    fit_buttons,
    grapheme_cut,
    question_content,
    render_thought,
    render_tool_call,
    render_tool_result,
    should_answer,
    split_message,
    strip_mention,
    thread_name,
)
from kesoku_discord.restart import restart_command, service_scope
from kesoku_discord.views import ChoiceButton, choice_views, header_view

from kesoku.config.settings import DiscordChannel
from kesoku.host.service import Scope
from kesoku.vocab.model import Kind, Message, Metadata, Outcome, Role


def author(**facts: object) -> Author:
    base: dict[str, object] = {
        "names": ("alice", "Alice", "1"),
        "is_bot": False,
        "mentions_bot": False,
        "mentions_others": False,
    }
    base.update(facts)
    return Author(**base)  # type: ignore[arg-type]


def test_who_is_answered() -> None:
    allow = ("ALICE",)
    assert should_answer(author(), allow), "allowlisted (case-insensitive), no mention needed"
    assert not should_answer(author(names=("bob", "Bob", "2")), allow), "unlisted without a mention"
    assert should_answer(author(names=("bob", "Bob", "2"), mentions_bot=True), allow)
    assert not should_answer(author(mentions_others=True), allow), "addressed to someone else"
    assert should_answer(author(mentions_others=True, mentions_bot=True), allow)
    assert not should_answer(author(is_bot=True, mentions_bot=True), allow), "bots never"
    assert should_answer(author(names=("x", "X", "1")), ("1",)), "an id on the allowlist"
    assert strip_mention("<@42> hi <@!42>", 42) == "hi"


def test_channel_overrides_by_id_or_name() -> None:
    quiet = DiscordChannel(channels=("#Quiet",), auto_thread=False)
    by_id = DiscordChannel(channels=("123",), llm="claude")
    assert channel_override((quiet, by_id), 123, "general") is by_id
    assert channel_override((quiet, by_id), 9, "quiet") is quiet
    assert channel_override((quiet, by_id), 9, "general") is None
    first = DiscordChannel(channels=("quiet",), llm="gemini")
    assert channel_override((first, quiet), 9, "quiet") is first, "the first entry wins"


def test_short_text_is_one_message_and_blank_text_none() -> None:
    assert split_message("hello") == ["hello"]
    assert split_message("  \n\n \t") == []
    assert split_message("\n\nhello\n\n") == ["hello"]


def test_long_text_splits_at_newlines() -> None:
    text = "\n".join(f"line {i:04d}" for i in range(500))
    chunks = split_message(text)
    assert all(len(c) <= 2000 for c in chunks)
    assert "\n".join(chunks) == text, "cut only at newlines: nothing lost or added"


def test_code_fences_are_closed_and_reopened() -> None:
    text = "Intro\n```python\n" + "\n".join(f"x_{i} = {i}" for i in range(400)) + "\n```\nOutro"
    chunks = split_message(text, 500)
    assert len(chunks) > 3
    for chunk in chunks:
        assert len(chunk) <= 500
        assert chunk.count("```") % 2 == 0, chunk
    assert all(c.startswith("```python") for c in chunks[1:-1])
    assert chunks[-1].endswith("Outro")


def test_a_long_line_is_cut_between_graphemes() -> None:
    family = "👨\u200d👩\u200d👧"  # one grapheme of five code points
    text = (family + "e\u0301" + "🇯🇵") * 300
    chunks = split_message(text, 200)
    assert "".join(chunks) == text
    for chunk in chunks:
        assert len(chunk) <= 200
        assert not chunk.startswith(("\u200d", "\u0301")), "never starts inside a cluster"
        assert chunk.count("\U0001f1ef") == chunk.count("\U0001f1f5"), "flags stay whole"


def test_grapheme_cut() -> None:
    assert grapheme_cut("abc", 10) == 3
    assert grapheme_cut("ae\u0301b", 2) == 1
    assert grapheme_cut("a👍🏽", 2) == 1
    assert grapheme_cut("🇯🇵🇫🇷", 3) == 2


PIECES = ["a", "word ", " ", "\n", "```", "```py\n", "é", "e\u0301", "👍🏽", "🇯🇵", "\u200d"]


@given(st.lists(st.sampled_from(PIECES), max_size=1500).map("".join))
def test_chunks_always_fit_and_are_never_blank(text: str) -> None:
    for chunk in split_message(text, 300):
        assert 0 < len(chunk) <= 300
        assert chunk.strip()


def _call(**args: object) -> Message:
    meta = Metadata(tool_name="shell", tool_arguments=dict(args))
    return Message(
        session_id="s", role=Role.ASSISTANT, kind=Kind.TOOL_CALL, sender="Kesoku", metadata=meta
    )


def test_rendering_thoughts_and_tools() -> None:
    assert render_thought("Step one.\n\nStep two.") == "💭 Step one.\n>\n> Step two."
    assert render_thought("  ") == ""
    assert render_thought("x" * 5000).endswith("…")
    call = render_tool_call(_call(command="ls ```"))
    assert call.startswith("🛠️ **shell**\n```\n") and call.count("```") == 2
    meta = Metadata(tool_name="shell", outcome=Outcome.TIMED_OUT)
    result = Message(
        session_id="s", role=Role.TOOL, kind=Kind.TOOL_RESULT, sender="shell", metadata=meta
    )
    assert render_tool_result(result) == "📥 **shell** (timed out)"
    long = Message(
        session_id="s",
        role=Role.TOOL,
        kind=Kind.TOOL_RESULT,
        sender="shell",
        content="y" * 4000,
        metadata=Metadata(tool_name="shell", outcome=Outcome.COMPLETED),
    )
    shown = render_tool_result(long)
    assert "(2500 more characters)" in shown and len(shown) < 2000


def test_labels_and_thread_names_fit() -> None:
    assert button_label("x" * 200) == "x" * 79 + "…"
    assert button_label("  a \n b ") == "a b"
    assert button_label("") == "…"
    assert thread_name("<@42> what is this?\nmore") == "what is this?"
    assert thread_name("<@42>") == "conversation"
    assert len(thread_name("w" * 300)) == 100


def test_context_prompt_lists_members_with_ids() -> None:
    place = Place(
        server="Guild",
        server_id=1,
        channel="general",
        channel_id=2,
        topic="chat",
        thread="Q",
        thread_id=3,
        bot=("kesoku", 4),
        members=(("Alice", "alice", 5),),
    )
    text = context_prompt(place)
    assert "- Server: Guild (id 1)" in text and "#general (id 2); topic: chat" in text
    assert "- Thread: Q (id 3)" in text and "You are kesoku (user id 4)" in text
    assert "Alice (@alice, id 5)" in text


def test_button_custom_ids_fit_discord() -> None:
    view = header_view("0123456789abcdef", 10**15, clear=True)
    ids = [item.custom_id for item in view.children]  # type: ignore[attr-defined]
    assert ids == [
        f"kesoku:trace:0123456789abcdef:{10**15}",
        f"kesoku:stop:0123456789abcdef:{10**15}",
        "kesoku:clear:0123456789abcdef",
    ]
    assert all(len(i) <= 100 for i in ids)
    assert not any("clear" in str(i.custom_id) for i in header_view("s", 1, clear=False).children)  # type: ignore[attr-defined]
    button = ChoiceButton(2**63, 24, 24, "z" * 300)
    assert len(button.item.custom_id or "") <= 100 and len(button.item.label or "") == 80


def test_restart_picks_the_service_scope(tmp_path: Path) -> None:
    assert service_scope({}) is None, "not started by systemd: exec in place"
    env = {"INVOCATION_ID": "x", "XDG_CONFIG_HOME": str(tmp_path), "HOME": str(tmp_path)}
    assert service_scope(env) == Scope(user=False)
    unit = Scope(user=True).unit_path(env)
    unit.parent.mkdir(parents=True)
    unit.write_text("[Unit]\n")
    assert service_scope(env) == Scope(user=True)
    restart = ["-P", "-m", "kesoku", "service", "restart", "--user"]  # -P: not the working folder's
    assert restart_command(Scope(user=True))[1:] == restart
    assert restart_command(Scope(user=False))[-1] == "--system"


@pytest.mark.parametrize("limit", [200, 2000])
def test_fence_chunks_fit(limit: int) -> None:
    text = "```\n" + ("a" * (limit * 3)) + "\n```"
    chunks = split_message(text, limit)
    assert all(len(c) <= limit for c in chunks)
    assert all(c.count("```") == 2 for c in chunks)


def test_the_entry_point_finds_the_adapter(tmp_path: Path) -> None:
    from kesoku.config.settings import Config, DiscordConfig
    from kesoku.host.adapters import Adapter, find_adapter, is_enabled

    entry = find_adapter("discord")
    adapter = entry.load()
    assert isinstance(adapter, Adapter)
    assert is_enabled(entry, adapter, Config(discord=DiscordConfig(enabled=True)))
    assert not is_enabled(entry, adapter, Config())


def _layout(choices: list[str], message_id: int = 2**63) -> list[list[dict[str, Any]]]:
    """The component rows of each message a question's choices take."""
    return [view.to_components() for view in choice_views(message_id, 7, choices)]


def test_up_to_25_short_choices_are_buttons_and_the_text_is_only_the_question() -> None:
    choices = [f"option {n}" for n in range(25)]
    (rows,) = _layout(choices)
    assert components_problem(rows) == ""
    buttons = [c for row in rows for c in row["components"]]
    assert [b["label"] for b in buttons] == choices
    assert [b["custom_id"] for b in buttons][-1] == f"kesoku:q:{2**63}:7:24"
    assert fit_buttons(choices) and question_content("Which?", choices) == "Which?"
    assert question_content("", ["a"]) == "❓"


@pytest.mark.parametrize(
    ("count", "menus"),
    [(26, [[25, 1]]), (30, [[25, 5]]), (125, [[25] * 5]), (126, [[25] * 5, [1]])],
)
def test_more_than_25_choices_are_menus_of_25_five_per_message(
    count: int, menus: list[list[int]]
) -> None:
    choices = [f"c{n}" for n in range(count)]
    layout = _layout(choices)
    values: list[str] = []
    for rows in layout:
        assert components_problem(rows) == "", rows
        values += [o["value"] for row in rows for c in row["components"] for o in c["options"]]
    assert [[len(row["components"][0]["options"]) for row in rows] for rows in layout] == menus
    assert values == [str(i) for i in range(count)], "every choice once, in order"
    assert not fit_buttons(choices)
    assert question_content("Q", choices).split("\n") == ["Q"] + [
        f"{n}. c{n - 1}" for n in range(1, count + 1)
    ]


def test_a_long_choice_is_cut_on_its_control_and_whole_in_the_text() -> None:
    long = "w" * 150
    (rows,) = _layout(["short", long])
    labels = [c["label"] for row in rows for c in row["components"]]
    assert labels == ["1. short", "2. " + "w" * 76 + "…"]
    assert question_content("Q", ["short", long]) == f"Q\n1. short\n2. {long}"
    (rows,) = _layout([long] + [f"c{n}" for n in range(30)])
    first = rows[0]["components"][0]["options"][0]
    assert len(first["label"]) == 100 and first["label"].startswith("1. www")


def test_the_fake_refuses_what_discord_refuses() -> None:
    button = {"type": 2, "style": 1, "label": "x", "custom_id": "a"}
    assert components_problem([{"type": 1, "components": [button]}] * 6)
    assert components_problem([{"type": 1, "components": [button] * 6}])
    assert components_problem([{"type": 1, "components": [{**button, "label": "x" * 81}]}])
    options = [{"label": str(i), "value": str(i)} for i in range(26)]
    menu = {"type": 3, "custom_id": "m", "options": options}
    assert components_problem([{"type": 1, "components": [menu]}])
    two = [{**menu, "options": options[:2]}, button]
    assert components_problem([{"type": 1, "components": two}]), "a menu shares no row"
