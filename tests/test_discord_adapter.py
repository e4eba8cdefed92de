"""The Discord adapter end to end: the real discord.py client against the loopback fake of Discord.

A real runtime (SQLite file, scripted model) serves the adapter; the fake speaks Discord's REST API
and gateway websocket (tests/fakes/discord_api.py). Nothing is mocked.
"""

from __future__ import annotations

import functools
import os
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
from fakes.discord_api import BOT_ID, FakeDiscord, FakeUser, serve_discord, snowflake_time
from kesoku_discord._compat import discord
from kesoku_discord.adapter import DiscordAdapter
from runtime_harness import Harness, echo, serve_runtime

from kesoku.config.settings import (
    CapOverrides,
    Config,
    DiscordChannel,
    DiscordConfig,
    WorkspaceConfig,
)
from kesoku.host.adapters import AdapterContext
from kesoku.observe.spend import Budget
from kesoku.testing import ScriptedLLM, Step, StepToolCall, StepUsage
from kesoku.tools.base import Tool, ToolContext
from kesoku.tools.paths import PathGates
from kesoku.vocab.ir import LLMRequest, TextBlock, ToolResultBlock
from kesoku.vocab.model import Message, Metadata, Role, Session, user_text
from kesoku.vocab.schedule import SCHEDULE_KEY, new_schedule
from kesoku.vocab.spend import BUDGET_GROUP_KEY

ALICE, BOB, CAROL = 5001, 5002, 5003


def last_user_text(request: LLMRequest) -> str:
    for turn in reversed(request.turns):
        if turn.role == "user":
            texts = [b.text for b in turn.blocks if isinstance(b, TextBlock)]
            if texts:  # the transcript writes "sender: text"
                return re.sub(r"^[\w-]+: ", "", texts[-1])
    return ""


def tool_results(request: LLMRequest) -> list[ToolResultBlock]:
    return [b for t in request.turns for b in t.blocks if isinstance(b, ToolResultBlock)]


def answers(
    table: Mapping[str, Callable[[LLMRequest], Step] | Step],
) -> Callable[[LLMRequest], Step]:
    """A responder: the first key found in the last user text picks the step; else an echo."""

    def respond(request: LLMRequest) -> Step:
        text = last_user_text(request)
        for key, step in table.items():
            if key in text:
                return step(request) if callable(step) else step
        return Step(text=f"you said: {text}")

    return respond


@dataclass
class Bot:
    fake: FakeDiscord
    h: Harness
    adapter: DiscordAdapter
    general: int
    quiet: int
    alice: FakeUser
    bob: FakeUser
    carol: FakeUser
    llm: ScriptedLLM
    restarts: list[int] = field(default_factory=list)
    config: Config | None = None

    def sessions(self) -> list[Session]:
        return self.h.store.list_sessions(adapter="discord")

    async def reply_in(self, channel_id: int, count: int = 1) -> list[dict[str, Any]]:
        """Wait for the turn's header to show metrics, then return the bot's messages there."""
        try:
            await self.fake.wait_for(lambda: len(self.headers_done(channel_id)) >= count)
        except trio.TooSlowError:
            shown = [m["content"][:80] for m in self.fake.bot_messages(channel_id)]
            logged = [
                (m.role, m.kind, m.content[:80]) for s in self.sessions() for m in self.h.history(s)
            ]
            raise AssertionError(
                f"no finished turn in {channel_id}: {shown}; log: {logged}"
            ) from None
        return self.fake.bot_messages(channel_id)

    def headers_done(self, channel_id: int) -> list[dict[str, Any]]:
        """Finished headers: their last line (the first names a scheduled prompt) is the metrics."""
        return [
            m
            for m in self.fake.bot_messages(channel_id)
            if m["content"].rpartition("\n")[2].startswith(("⚡", "🛑", "⚠ turn"))
        ]


def custom_ids(message: dict[str, Any]) -> list[str]:
    return [c["custom_id"] for row in message.get("components") or [] for c in row["components"]]


def config_for(tmp_path: Path, *, shared: Path | None = None, **discord_options: Any) -> Config:
    options: dict[str, Any] = {
        "enabled": True,
        "bot_token": "test-token",
        "user_allowlist": ("alice",),
        "channels": (DiscordChannel(channels=("quiet",), auto_thread=False),),
    }
    options.update(discord_options)
    workspace = WorkspaceConfig(
        db_path=str(tmp_path / "kesoku.db"),
        sessions_dir=str(tmp_path / "sessions"),
        shareable_roots=(str(shared or tmp_path / "shared"),),
    )
    return Config(workspace=workspace, discord=DiscordConfig(**options))


@asynccontextmanager
async def running_adapter(bot: Bot, config: Config) -> AsyncIterator[DiscordAdapter]:
    async def restart() -> None:
        bot.restarts.append(1)
        await trio.lowlevel.checkpoint()

    adapter = DiscordAdapter(
        AdapterContext.of(bot.h.rt), config, restart=restart, guild_ready_timeout=0.05
    )

    async with trio.open_nursery() as nursery:
        await nursery.start(adapter.serve)
        bot.adapter = adapter
        yield adapter
        nursery.cancel_scope.cancel()


def restore_endpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    """Put discord.py's endpoints back after the test.

    The adapter points discord.py at ``[discord] api_base_url`` and ``gateway_url`` process-wide
    (``kesoku_discord.client.use_endpoints``).
    """
    monkeypatch.setattr(discord.http.Route, "BASE", discord.http.Route.BASE)
    gateway = discord.gateway.DiscordWebSocket
    monkeypatch.setattr(gateway, "DEFAULT_GATEWAY", gateway.DEFAULT_GATEWAY)


@asynccontextmanager
async def discord_bot(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    table: Mapping[str, Callable[[LLMRequest], Step] | Step] | None = None,
    *,
    tools: Sequence[Tool] = (),
    shared: Path | None = None,
    config_file: Path | None = None,
    adapter: bool = True,
    **discord_options: Any,
) -> AsyncIterator[Bot]:
    """A runtime with the scripted model, the Discord fake, and the adapter logged into it.

    The adapter reaches the fake through ``[discord] api_base_url`` and ``gateway_url``. The
    runtime's path gates are the daemon's (:meth:`PathGates.from_config`): ``shared`` is the
    shareable root (default ``tmp_path/shared``), ``config_file`` the protected config file. With
    ``adapter=False`` the test runs the adapter itself (``running_adapter(bot, bot.config)``, as
    often as it restarts it).
    """
    (tmp_path / "shared").mkdir(exist_ok=True)
    restore_endpoints(monkeypatch)
    async with serve_discord() as fake:
        discord_options.setdefault("api_base_url", f"{fake.base_url}/api/v10")
        discord_options.setdefault("gateway_url", fake.ws_url)
        general = fake.add_channel("general")
        quiet = fake.add_channel("quiet")
        users = (
            fake.add_user(ALICE, "alice"),
            fake.add_user(BOB, "bob"),
            fake.add_user(CAROL, "carol"),
        )
        llm = ScriptedLLM(responder=answers(table or {}))
        config = config_for(tmp_path, shared=shared, **discord_options)
        gates = PathGates.from_config(config, config_file=config_file)
        budget = functools.partial(Budget.from_config, config)  # the daemon's caps
        async with serve_runtime(tmp_path, llm, tools=tools, gates=gates, budget=budget) as h:
            no_adapter: Any = None  # set by running_adapter
            bot = Bot(fake, h, no_adapter, general, quiet, *users, llm, config=config)
            if not adapter:
                yield bot
                return
            async with running_adapter(bot, config):
                yield bot


def mention(user_id: int) -> str:
    return f"<@{user_id}>"


async def test_a_conversation_gets_its_own_thread_dated_by_the_first_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with discord_bot(tmp_path, monkeypatch) as bot:
        fake = bot.fake
        asked = fake.user_says(bot.general, bot.alice, "hello there")
        thread = int(asked["id"])  # a thread opened from a message takes the message's id
        messages = await bot.reply_in(thread)
        assert fake.channels[thread]["parent_id"] == str(bot.general)
        assert [m["content"] for m in messages] == [messages[0]["content"], "you said: hello there"]
        header = messages[0]
        assert header["content"].startswith("⚡ turn 1 · context")
        assert any(i.startswith("kesoku:trace:") for i in custom_ids(header))
        assert not any(i.startswith("kesoku:clear:") for i in custom_ids(header)), (
            "no ♻️ inside a thread"
        )
        assert thread in fake.typing
        delivery = bot.adapter.delivery
        assert delivery is not None
        await fake.wait_for(lambda: not delivery.typing.scopes)  # typing ends with the turn
        (session,) = bot.sessions()
        assert session.channel_id == str(thread)
        assert session.created_at == pytest.approx(snowflake_time(thread))
        # The context prompt: server, channel, the bot and the active members with their ids.
        system = bot.llm.requests[-1].system
        assert "Server: Test Guild" in system and "#general" in system
        assert f"alice (@alice, id {ALICE})" in system and f"user id {BOT_ID}" in system
        # A follow-up in the thread continues the same session.
        fake.user_says(thread, bot.alice, "and again")
        await bot.reply_in(thread, 2)
        assert len(bot.sessions()) == 1
        assert [m.content for m in bot.h.history(session) if m.role is Role.USER] == [
            "hello there",
            "and again",
        ]


async def test_who_gets_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with discord_bot(tmp_path, monkeypatch) as bot:
        fake = bot.fake
        fake.user_says(bot.quiet, bot.bob, "unlisted, no mention")
        fake.user_says(
            bot.quiet, bot.alice, f"{mention(CAROL)} this is for carol", mentions=(bot.carol,)
        )
        robot = fake.add_user(7777, "other-bot", bot=True)
        fake.user_says(bot.quiet, robot, f"{mention(BOT_ID)} from a bot", mentions=(fake.bot,))
        fake.user_says(bot.quiet, bot.bob, f"{mention(BOT_ID)} bob asks", mentions=(fake.bot,))
        messages = await bot.reply_in(bot.quiet)
        texts = [m["content"] for m in messages]
        assert "you said: @kesoku bob asks" in texts
        (session,) = bot.sessions()
        users = [(m.sender, m.content) for m in bot.h.history(session) if m.role is Role.USER]
        assert users == [("bob", "@kesoku bob asks")]
        # Its own messages come back through the gateway too: never answered.
        assert all(not m.content.startswith("you said: you said") for m in bot.h.history(session))


async def test_a_channel_override_answers_in_the_channel_and_offers_clear(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with discord_bot(tmp_path, monkeypatch) as bot:
        fake = bot.fake
        fake.user_says(bot.quiet, bot.alice, "no thread here")
        messages = await bot.reply_in(bot.quiet)
        assert not [c for c in fake.channels.values() if c["type"] == 11]
        (session,) = bot.sessions()
        assert session.channel_id == str(bot.quiet)
        header = messages[0]
        clear = next(i for i in custom_ids(header) if i.startswith("kesoku:clear:"))
        workspace = Path(session.workspace)
        assert workspace.is_dir()
        fake.click(int(header["id"]), clear, bot.alice)
        await fake.wait_for(
            lambda: "Session cleared" in fake.messages[int(header["id"])]["content"]
        )
        assert bot.sessions() == []
        assert not workspace.exists()
        # The next message starts a new session.
        fake.user_says(bot.quiet, bot.alice, "fresh start")
        await fake.wait_for(lambda: len(bot.sessions()) == 1)
        assert bot.sessions()[0].id != session.id


async def test_a_thread_the_user_started_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with discord_bot(tmp_path, monkeypatch) as bot:
        fake = bot.fake
        thread = fake.start_thread(bot.general, "alice's thread", owner=ALICE)
        fake.user_says(thread, bot.alice, "in my thread")
        await bot.reply_in(thread)
        (session,) = bot.sessions()
        assert session.channel_id == str(thread)
        assert not [r for r in fake.log.requests if r.path.endswith("/threads")], (
            "no thread was created"
        )


async def test_a_peer_bot_wins_the_thread_race(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with discord_bot(tmp_path, monkeypatch) as bot:
        fake = bot.fake
        fake.peer_wins_thread_race = True
        asked = fake.user_says(bot.general, bot.alice, "two bots hear this")
        thread = int(asked["id"])
        await bot.reply_in(thread)
        assert fake.channels[thread]["owner_id"] != str(BOT_ID)
        assert fake.channels[thread].get("joined") is True
        (session,) = bot.sessions()
        assert session.channel_id == str(thread)


def _long_answer() -> str:
    code = "\n".join(f"line_{i} = {i}" for i in range(300))
    return "Intro.\n\n```python\n" + code + "\n```\n\nThe end. @everyone @here <@&42>"


async def test_rendering_thoughts_tools_long_answers_and_mentions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def step(request: LLMRequest) -> Step:
        if tool_results(request):
            return Step(text=_long_answer())
        return Step(
            thought="Let me echo it.",
            tool_calls=(StepToolCall(name="echo", arguments={"text": "echoed"}),),
        )

    async with discord_bot(tmp_path, monkeypatch, {"render": step}, tools=[echo()]) as bot:
        fake = bot.fake
        thread = int(fake.user_says(bot.general, bot.alice, "render please")["id"])
        messages = await bot.reply_in(thread)
        texts = [m["content"] for m in messages]
        assert texts[1].startswith("💭 Let me echo it.")
        assert texts[2].startswith("🛠️ **echo**") and "text='echoed'" in texts[2]
        assert texts[3].startswith("📥 **echo**") and "echoed" in texts[3]
        answer = texts[4:]
        assert len(answer) >= 3 and all(0 < len(t) <= 2000 and t.strip() for t in answer)
        assert all(t.count("```") % 2 == 0 for t in answer), "every chunk closes its code fence"
        assert answer[1].startswith("```python")
        assert "".join(answer).count("line_") == 300
        for m in messages:
            assert "everyone" not in (m["allowed_mentions"] or {}).get("parse", [])
            assert "roles" not in (m["allowed_mentions"] or {}).get("parse", [])


async def test_files_are_uploaded_under_the_sharing_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "report.txt").write_text("the report")
    (shared / "huge.bin").touch()
    # sparse: over the guild's 10 MiB upload limit
    os.truncate(shared / "huge.bin", 11 * 1024 * 1024)
    text = (
        f"Here it is:\n[file: {shared / 'report.txt'}]\nand\n[file: /etc/passwd]\n"
        f"[file: {shared / 'missing.txt'}]\n[file: {shared / 'huge.bin'}]\nDone."
    )
    async with discord_bot(tmp_path, monkeypatch, {"file": Step(text=text)}) as bot:
        fake = bot.fake
        thread = int(fake.user_says(bot.general, bot.alice, "file please")["id"])
        messages = await bot.reply_in(thread)
        texts = [m["content"] for m in messages][1:]
        assert texts[0] == "Here it is:"
        upload = messages[2]
        assert fake.uploads[int(upload["id"])] == [("report.txt", b"the report")]
        assert texts[2] == "and"
        assert texts[3].startswith("⚠️ I can't share `passwd`")
        assert texts[4].startswith("⚠️ I can't share `missing.txt`")
        assert texts[5].startswith("⚠️ `huge.bin` is 11.0 MiB, over Discord's upload limit")
        assert texts[6] == "Done."


async def test_stop_deletes_progress_and_marks_the_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def step(request: LLMRequest) -> Step:
        if tool_results(request):
            return Step(text="this takes a while", delay_s=30)
        return Step(tool_calls=(StepToolCall(name="echo", arguments={"text": "x"}),))

    async with discord_bot(tmp_path, monkeypatch, {"slow": step}, tools=[echo()]) as bot:
        fake = bot.fake
        thread = int(fake.user_says(bot.general, bot.alice, "slow one")["id"])
        await fake.wait_for(
            lambda: any(m["content"].startswith("📥") for m in fake.bot_messages(thread))
        )
        progress = [
            int(m["id"]) for m in fake.bot_messages(thread) if m["content"][:1] in ("🛠", "📥")
        ]
        header = fake.bot_messages(thread)[0]
        stop = next(i for i in custom_ids(header) if i.startswith("kesoku:stop:"))
        fake.click(int(header["id"]), stop, bot.alice)
        await bot.reply_in(thread)
        await fake.wait_for(lambda: set(progress) <= set(fake.deleted))
        (after,) = fake.bot_messages(thread)
        assert after["content"].startswith("🛑") and after["content"].endswith("(Interrupted)")
        assert not any(i.startswith("kesoku:stop:") for i in custom_ids(after))
        (session,) = bot.sessions()
        root = next(m for m in bot.h.history(session) if m.role is Role.USER)
        assert root.status == "interrupted"


async def test_question_buttons_post_the_choice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = {
        "pick": Step(text="Choose:\n[question: Which colour? | Red | Blue]"),
        "Blue": Step(text="Blue it is."),
    }
    async with discord_bot(tmp_path, monkeypatch, table) as bot:
        fake = bot.fake
        thread = int(fake.user_says(bot.general, bot.alice, "pick one")["id"])
        messages = await bot.reply_in(thread)
        question = next(m for m in messages if m["content"] == "Which colour?")
        labels = [c["label"] for row in question["components"] for c in row["components"]]
        assert labels == ["Red", "Blue"]
        fake.click(int(question["id"]), custom_ids(question)[1], bot.alice)
        await bot.reply_in(thread, 2)
        edited = fake.messages[int(question["id"])]
        assert all(c.get("disabled") for row in edited["components"] for c in row["components"])
        texts = [m["content"] for m in fake.bot_messages(thread)]
        assert f"<@{ALICE}> selected: **Blue**" in texts
        assert "Blue it is." in texts
        (session,) = bot.sessions()
        assert [(m.sender, m.content) for m in bot.h.history(session) if m.role is Role.USER][
            -1
        ] == ("alice", "Blue")


def confirming_tool() -> Tool:
    async def run(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        approval = await ctx.confirm("Write the file? Allow?")
        return "written" if approval.allowed else f"not written: {approval.note}"

    return Tool("write_it", "Write a file after asking.", run)


async def test_a_tool_question_is_answered_through_the_questions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def step(request: LLMRequest) -> Step:
        results = [str(b) for b in tool_results(request)]
        if results:
            return Step(
                text="result: "
                + ("written" if "written" in results[-1] and "not" not in results[-1] else "no")
            )
        return Step(tool_calls=(StepToolCall(name="write_it"),))

    async with discord_bot(
        tmp_path, monkeypatch, {"write": step}, tools=[confirming_tool()]
    ) as bot:
        fake = bot.fake
        thread = int(fake.user_says(bot.general, bot.alice, "write it")["id"])
        question = await fake.wait_for(
            lambda: next((m for m in fake.bot_messages(thread) if "Allow?" in m["content"]), None)
        )
        assert [c["label"] for row in question["components"] for c in row["components"]] == [
            "Allow",
            "Deny",
        ]
        fake.click(int(question["id"]), custom_ids(question)[0], bot.alice)
        texts = [m["content"] for m in await bot.reply_in(thread)]
        assert "result: written" in texts
        assert f"<@{ALICE}> selected: **Allow**" in texts
        (session,) = bot.sessions()
        assert [m.content for m in bot.h.history(session) if m.role is Role.USER] == ["write it"]


async def test_attachments_are_saved_in_the_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with discord_bot(tmp_path, monkeypatch) as bot:
        fake = bot.fake
        png = b"\x89PNG\r\n\x1a\n" + b"\0" * 64
        files = (("../photo.png", png, "image/png"), ("../photo.png", b"second", "image/png"))
        thread = int(fake.user_says(bot.general, bot.alice, "look", attachments=files)["id"])
        await bot.reply_in(thread)
        (session,) = bot.sessions()
        root = next(m for m in bot.h.history(session) if m.role is Role.USER)
        first, second = root.metadata.attachments
        assert Path(first.path).parent == Path(session.workspace)
        assert first.mime_type == "image/png" and Path(first.path).read_bytes() == png
        assert Path(second.path).read_bytes() == b"second" and second.path != first.path
        assert f"[attachment: {first.filename} → {first.path}]" in root.content


async def test_trace_button_sends_the_turn_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with discord_bot(tmp_path, monkeypatch) as bot:
        fake = bot.fake
        thread = int(fake.user_says(bot.general, bot.alice, "trace me")["id"])
        header = (await bot.reply_in(thread))[0]
        trace = next(i for i in custom_ids(header) if i.startswith("kesoku:trace:"))
        fake.click(int(header["id"]), trace, bot.alice)
        reply = await fake.wait_for(
            lambda: next((r for r in fake.interaction_replies if r.get("files")), None)
        )
        ((name, page),) = reply["files"]
        assert name.endswith("-turn-1.html")
        assert b"<html" in page.lower() and b"trace me" in page


async def test_restart_replies_closes_and_restarts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with discord_bot(tmp_path, monkeypatch) as bot:
        fake = bot.fake
        assert [c["name"] for c in fake.commands] == ["restart"]
        fake.slash(bot.quiet, "restart", bot.alice)
        await fake.wait_for(lambda: bot.restarts)
        (reply,) = fake.interaction_replies
        assert reply["type"] == 4 and reply["data"]["flags"] & 64, "an ephemeral message"
        assert "Restarting" in reply["data"]["content"]
        await fake.wait_for(
            lambda: all(s.conn is None or s.conn.closed for s in fake.sessions.values())
        )


async def test_a_channel_spend_cap_stops_the_agent_there_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    capped = DiscordChannel(
        channels=("quiet",), auto_thread=False, budget=CapOverrides(session_tokens=100)
    )
    costly = Step(text="a costly answer", usage=StepUsage(input_tokens=150, output_tokens=5))
    async with discord_bot(tmp_path, monkeypatch, {"costly": costly}, channels=(capped,)) as bot:
        fake = bot.fake
        fake.user_says(bot.quiet, bot.alice, "costly question")
        await bot.reply_in(bot.quiet)
        (session,) = bot.sessions()
        assert session.metadata[BUDGET_GROUP_KEY] == "quiet"
        fake.user_says(bot.quiet, bot.alice, "and another")
        messages = await bot.reply_in(bot.quiet, count=2)
        texts = [m["content"] for m in messages]
    assert bot.llm.calls == 1
    assert (
        "Spend cap reached: this session has used 155 of 100 tokens "
        "(discord.channels[quiet].budget.session_tokens); a session cap does not reset: start a "
        "new session or raise the cap." in texts
    )
    header = bot.headers_done(bot.quiet)[-1]["content"]
    assert header.startswith("🛑") and header.endswith("(Spend cap)")
    assert "155% of discord.channels[quiet].budget.session_tokens" in header


# -- turns no Discord message started (scheduled runs) ---------------------------------------------

REPORT = "Daily report\nList what changed since yesterday, briefly."
WEEKLY = "Weekly summary <@5002>\nThe week in three lines."


async def post_scheduled(bot: Bot, channel_id: int, prompt: str, planned: int) -> Message:
    """What the scheduler does: the channel's session, the prompt as the Scheduler's message."""
    gateway = bot.h.gateway
    session = gateway.open_session("discord", str(channel_id))
    return await gateway.post(
        user_text(session.id, prompt, sender="Scheduler", external_id=f"schedule:r:{planned}")
    )


def assert_only_own_messages_touched(fake: FakeDiscord) -> None:
    """No call names a Discord message the bot did not send (a reply, reaction, edit, thread)."""
    own = {int(m["id"]) for m in fake.messages.values() if m["author"]["id"] == str(BOT_ID)}
    own |= set(fake.deleted)
    for request in fake.log.requests:
        found = re.match(r"/api/v10/channels/\d+/messages/(\d+)", request.path)
        assert found is None or int(found[1]) in own, request.path
        assert not request.path.endswith(("/threads", "/reactions")), request.path
        if isinstance(request.body, dict):
            assert "message_reference" not in request.body, request.body


async def ended(bot: Bot, root: Message) -> None:
    """Wait until the runtime has ended the turn of ``root`` (no adapter needed)."""

    def done() -> bool:
        stored = bot.h.gateway.get_message(root.id)
        return stored is not None and stored.status == "done"

    await bot.fake.wait_for(done)


async def test_a_scheduled_run_into_a_text_channel_is_answered_there_once_across_restarts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = {
        "Daily report": Step(text="Nothing changed."),
        "Weekly summary": Step(text="A quiet week."),
    }
    async with discord_bot(tmp_path, monkeypatch, table, adapter=False) as bot:
        fake, general, config = bot.fake, bot.general, bot.config
        assert config is not None
        async with running_adapter(bot, config):
            await post_scheduled(bot, general, REPORT, 1)
            header, answer = await bot.reply_in(general)
            # In the channel itself (auto_thread is on there, but there is no message to open a
            # thread on): the header names the schedule and the prompt's first line, then the
            # metrics; the prompt is not echoed.
            trigger, metrics = header["content"].split("\n")
            assert trigger == "⏰ Scheduler: Daily report"
            assert metrics.startswith("⚡ turn 1 · ")
            assert header["allowed_mentions"]["parse"] == []
            assert [i.split(":")[1] for i in custom_ids(header)] == ["trace", "clear"]
            assert answer["content"] == "Nothing changed."
            assert general in fake.typing
            assert not [c for c in fake.channels.values() if c["type"] == 11], "no thread"
            (session,) = bot.sessions()
            assert session.channel_id == str(general)
        # The adapter is down: the next run is answered by the runtime all the same.
        weekly = await post_scheduled(bot, general, WEEKLY, 2)
        await ended(bot, weekly)
        async with running_adapter(bot, config):
            await fake.wait_for(
                lambda: any(m["content"] == "A quiet week." for m in fake.bot_messages(general))
            )
            # A third run with the adapter up again: the usual header, after the earlier ones.
            await post_scheduled(bot, general, REPORT, 3)
            messages = await bot.reply_in(general, 2)
        texts = [m["content"] for m in messages]
        assert texts[:2] == [header["content"], "Nothing changed."], "run 1 was not sent again"
        # Run 2 ended while the adapter was away: its header says so, without figures it never
        # saw; its mention quoted from the prompt notifies no one.
        assert texts[2] == (
            "⏰ Scheduler: Weekly summary <@5002>\n☑️ ended while the adapter was away"
        )
        assert messages[2]["allowed_mentions"]["parse"] == []
        assert not any(i.startswith("kesoku:stop:") for i in custom_ids(messages[2]))
        assert texts[3] == "A quiet week."
        assert texts[4].startswith("⏰ Scheduler: Daily report\n⚡ turn 3 · ")
        assert texts[5:] == ["Nothing changed."]
        assert not any("yesterday" in t or "three lines" in t for t in texts)
        assert_only_own_messages_touched(fake)
        assert len(bot.sessions()) == 1


async def test_a_scheduled_run_into_a_thread_is_answered_in_the_thread_once_across_restarts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with discord_bot(
        tmp_path, monkeypatch, {"Daily report": Step(text="Nothing changed.")}, adapter=False
    ) as bot:
        fake, config = bot.fake, bot.config
        assert config is not None
        thread = fake.start_thread(bot.general, "reports", owner=ALICE)
        async with running_adapter(bot, config):
            await post_scheduled(bot, thread, REPORT, 1)
            header, answer = await bot.reply_in(thread)
            assert header["content"].startswith("⏰ Scheduler: Daily report\n⚡ turn 1 · ")
            assert [i.split(":")[1] for i in custom_ids(header)] == ["trace"], "no ♻️ in a thread"
            assert answer["content"] == "Nothing changed."
        async with running_adapter(bot, config):  # restarted: resumes from its cursor
            await post_scheduled(bot, thread, REPORT, 2)
            messages = await bot.reply_in(thread, 2)
        texts = [m["content"] for m in messages]
        assert texts[:2] == [header["content"], "Nothing changed."], "run 1 was not sent again"
        assert texts[2].startswith("⏰ Scheduler: Daily report\n⚡ turn 2 · ")
        assert texts[3:] == ["Nothing changed."]
        assert fake.bot_messages(bot.general) == [], "nothing in the thread's channel"
        assert_only_own_messages_touched(fake)
        (session,) = bot.sessions()
        assert session.channel_id == str(thread)


async def test_schedules_lists_the_conversations_schedules_without_a_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with discord_bot(tmp_path, monkeypatch) as bot:
        fake, store = bot.fake, bot.h.store
        thread = int(fake.user_says(bot.general, bot.alice, "hello there")["id"])
        await bot.reply_in(thread)
        (session,) = bot.sessions()
        now = time.time()
        for name, target, created_by in (
            ("standup", "new", session.id),  # made by this conversation, runs elsewhere
            ("check", f"discord:{thread}", "cli"),  # runs in this thread
            ("elsewhere", f"discord:{bot.general}", "cli"),
        ):
            every = new_schedule(name, prompt=f"{name} prompt", every="1h", target=target, now=now)
            store.put_schedule(msgspec.structs.replace(every, created_by=created_by))
        calls = bot.llm.calls
        fake.user_says(thread, bot.alice, "/schedules")
        reply = await fake.wait_for(
            lambda: next(
                (m for m in fake.bot_messages(thread) if m["content"].startswith("check: ")), None
            )
        )
        lines = reply["content"].split("\n")
        assert [line.split(" · ")[0] for line in lines] == ["check: every 1h", "standup: every 1h"]
        assert lines[0].endswith(' · "check prompt"') and " · next " in lines[0]
        assert reply["allowed_mentions"]["parse"] == []
        # With the bot's mention, in a channel that answers without threads: no session there.
        fake.user_says(bot.quiet, bot.bob, f"{mention(BOT_ID)} /schedules", mentions=(fake.bot,))
        (empty,) = await fake.wait_for(lambda: fake.bot_messages(bot.quiet))
        assert empty["content"].startswith("No schedules in this conversation. Ask me to make one")
        assert f"kesoku schedule add NAME --to discord:{bot.quiet} " in empty["content"]
        # Neither was a turn: no model call, no user message, no header, no new session.
        await trio.sleep(0.3)
        assert bot.llm.calls == calls
        assert [m.content for m in bot.h.history(session) if m.role is Role.USER] == ["hello there"]
        assert len(fake.bot_messages(thread)) == 3 and len(fake.bot_messages(bot.quiet)) == 1
        assert bot.sessions() == [session]


# -- heartbeat runs --------------------------------------------------------------------------------


async def post_heartbeat(bot: Bot, channel_id: int, prompt: str, planned: int) -> Message:
    """What the scheduler does for ``[heartbeat]``: a run of the schedule named heartbeat."""
    gateway = bot.h.gateway
    session = gateway.open_session("discord", str(channel_id))
    run = user_text(
        session.id, prompt, sender="Scheduler", external_id=f"schedule:heartbeat:{planned}"
    )
    extra = {SCHEDULE_KEY: {"name": "heartbeat", "planned": planned, "manual": False}}
    return await gateway.post(msgspec.structs.replace(run, metadata=Metadata(extra=extra)))


def checks_then_answers(answer: str) -> Callable[[LLMRequest], Step]:
    """A heartbeat that thinks and calls a tool first, then answers ``answer``."""

    def step(request: LLMRequest) -> Step:
        if tool_results(request):
            return Step(text=answer)
        call = StepToolCall(name="echo", arguments={"text": "HEARTBEAT.md"})
        return Step(thought="checking the list", tool_calls=(call,))

    return step


async def test_a_heartbeat_run_is_shown_only_when_it_has_something_to_say(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table: dict[str, Callable[[LLMRequest], Step] | Step] = {
        "All quiet?": checks_then_answers(" HEARTBEAT_OK\n"),
        "Disk full?": Step(text="The disk is 95% full."),
    }
    async with discord_bot(tmp_path, monkeypatch, table, tools=[echo()], adapter=False) as bot:
        fake, general, config = bot.fake, bot.general, bot.config
        assert config is not None
        async with running_adapter(bot, config):
            quiet = await post_heartbeat(bot, general, "All quiet?", 1)
            await ended(bot, quiet)
            await post_heartbeat(bot, general, "Disk full?", 2)
            await fake.wait_for(lambda: len(fake.bot_messages(general)) >= 2)
            header, answer = fake.bot_messages(general)
            # Shown once it ended: the header with its figures, then the answer.
            assert header["content"].startswith("⏰ Scheduler: Disk full?\n⚡ turn 2 · ")
            assert answer["content"] == "The disk is 95% full."
        # The adapter is away while both kinds run; they had ended when it reads them.
        await ended(bot, await post_heartbeat(bot, general, "All quiet?", 3))
        await ended(bot, await post_heartbeat(bot, general, "Disk full?", 4))
        async with running_adapter(bot, config):
            await fake.wait_for(lambda: len(fake.bot_messages(general)) >= 4)
            await trio.sleep(0.3)
        texts = [m["content"] for m in fake.bot_messages(general)]
        assert texts == [
            header["content"],
            "The disk is 95% full.",
            "⏰ Scheduler: Disk full?\n☑️ ended while the adapter was away",
            "The disk is 95% full.",
        ]
        # Nothing of the quiet runs, not even a typing indicator or a message deleted after.
        assert general not in fake.typing and fake.deleted == []
        assert not any(r.path.endswith("/typing") for r in fake.log.requests)
        (session,) = bot.sessions()
        answers = [m.content for m in bot.h.history(session) if m.role is Role.ASSISTANT]
        assert answers.count(" HEARTBEAT_OK\n") == 2  # they ran, thought and called the tool


async def test_a_heartbeat_run_that_asks_a_question_is_shown_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def step(request: LLMRequest) -> Step:
        if tool_results(request):
            return Step(text="HEARTBEAT_OK")
        return Step(thought="a file to write", tool_calls=(StepToolCall(name="write_it"),))

    async with discord_bot(
        tmp_path, monkeypatch, {"Anything?": step}, tools=[confirming_tool()]
    ) as bot:
        fake, general = bot.fake, bot.general
        await post_heartbeat(bot, general, "Anything?", 1)
        question = await fake.wait_for(
            lambda: next((m for m in fake.bot_messages(general) if "Allow?" in m["content"]), None)
        )
        header, *progress, _ = fake.bot_messages(general)
        assert header["content"] == "⏰ Scheduler: Anything?\n⏳ working…"
        assert progress and "a file to write" in progress[0]["content"]
        assert general in fake.typing
        fake.click(int(question["id"]), custom_ids(question)[1], bot.alice)  # Deny
        texts = [m["content"] for m in await bot.reply_in(general)]
        # Shown from the question on, it is shown to its end, whatever the answer.
        assert texts[0].startswith("⏰ Scheduler: Anything?\n⚡ turn 1 · ")
        assert texts[-1] == "HEARTBEAT_OK"
