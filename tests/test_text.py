"""Valid text at the boundary: a lone surrogate or an invalid byte from a model, a tool, a file or a
chat platform is replaced with U+FFFD where it enters, and the turn completes.

Surrogates reach Python strings from JSON escapes (``"\\ud800"``: what a provider's SSE, a chat
platform or an MCP server may send) and from ``surrogateescape`` decoding of OS data (a file name
with the byte 0xFF lists as ``"\\udcff"``). The runtime tests go through the real store (SQLite),
the turn-log writer process (YAML) and the trace page; the backend tests through the real SDKs
against the wire fakes; the CLI test through ``kesoku chat`` in a subprocess.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import yaml
from hypothesis import given
from hypothesis import strategies as st
from llm_streams import events_of
from runtime_harness import echo, serve_runtime
from test_claude import claude
from test_cli_chat import chat, history, kesoku, setup
from test_discord_adapter import discord_bot
from test_gemini import served
from test_mcp import call as mcp_call
from test_mcp import manager, serving
from test_openai import openai

from kesoku.config.settings import McpStdioServer
from kesoku.llm.openai_convert import decode_arguments
from kesoku.observe.trace import render_trace
from kesoku.observe.turnlog_writer import TurnLogWriter
from kesoku.testing import ScriptedLLM
from kesoku.testing.fakes.anthropic_api import AnthropicFake, Text, ToolUse
from kesoku.testing.fakes.anthropic_api import Reply as ClaudeReply
from kesoku.testing.fakes.gemini_api import GeminiFake
from kesoku.testing.fakes.gemini_replies import call, chunk, reply
from kesoku.testing.fakes.gemini_replies import text as text_part
from kesoku.testing.fakes.openai_api import Call, OpenAIFake, Reply
from kesoku.tools.base import Tool, ToolContext
from kesoku.tools.files import file_tools
from kesoku.tools.paths import PathGates
from kesoku.vocab.errors import BackendError
from kesoku.vocab.ir import (
    LLMRequest,
    LLMTurn,
    TextBlock,
    TextDelta,
    ToolCallBlock,
    ToolCallEvent,
    ToolResultBlock,
    ToolSpec,
    valid_event,
)
from kesoku.vocab.metrics import TurnState
from kesoku.vocab.model import Kind, Message, Metadata, Outcome, Role, Session, valid_message
from kesoku.vocab.text import REPLACEMENT, decode_json, valid_data, valid_text

pytestmark = pytest.mark.filterwarnings(
    r"ignore:Async generator '(openai|httpx2|httpcore2)\.[\w.]+' "
    r"was garbage collected:ResourceWarning"
)

LONE = "\ud800"  # a high surrogate without its low half
ESCAPED_BYTE = "\udcff"  # the byte 0xFF as surrogateescape decodes it
FFFD = REPLACEMENT


def encodable(value: object) -> bool:
    """Every encoder downstream takes it: msgspec JSON (metadata) and msgpack (turn-log jobs)."""
    try:
        msgspec.json.encode(value)
        msgspec.msgpack.encode(value)
    except UnicodeEncodeError:
        return False
    return True


# -- kesoku.vocab.text ----------------------------------------------------------------------------


def test_valid_text_replaces_lone_surrogates_and_joins_pairs() -> None:
    assert valid_text(f"a{LONE}b{ESCAPED_BYTE}") == f"a{FFFD}b{FFFD}"
    # a low alone, a high at the end
    assert valid_text("\udc00 then \ud83d") == f"{FFFD} then {FFFD}"
    # an escaped pair that arrived as two code points
    assert valid_text("\ud83d\ude00 ok") == "😀 ok"
    assert valid_text("\ud83d\ud83d\ude00") == f"{FFFD}😀"


def test_valid_text_returns_valid_text_itself() -> None:
    for text in ("plain ascii", "naïve café", "😀 and 中文", ""):
        assert valid_text(text) is text


def test_valid_data_cleans_keys_and_values_at_any_depth_and_keeps_clean_values() -> None:
    data = {"path": f"x{LONE}", f"k{LONE}": [1, {"deep": (ESCAPED_BYTE, None, 2.5)}], "ok": True}
    assert valid_data(data) == {
        "path": f"x{FFFD}",
        f"k{FFFD}": [1, {"deep": (FFFD, None, 2.5)}],
        "ok": True,
    }
    clean = {"a": ["b", {"c": 1}], "d": "é"}
    assert valid_data(clean) is clean


def test_decode_json_keeps_text_with_escaped_or_raw_lone_surrogates() -> None:
    # msgspec alone refuses both: "Input data was truncated", and UnicodeEncodeError for the str.
    assert decode_json('{"text": "a\\ud800b"}') == {"text": f"a{FFFD}b"}
    assert decode_json(b'{"text": "\\udcff"}') == {"text": FFFD}
    assert decode_json(f'{{"text": "a{LONE}b"}}') == {"text": f"a{FFFD}b"}
    assert decode_json('{"emoji": "\\ud83d\\ude00"}') == {"emoji": "😀"}
    with pytest.raises(msgspec.DecodeError):
        decode_json('{"text": "cut')
    with pytest.raises(msgspec.DecodeError):
        decode_json(b'{"text": "\xff"}')  # invalid UTF-8 bytes are not JSON text


def test_openai_arguments_with_lone_surrogates_are_decoded() -> None:
    assert decode_arguments('{"path": "a\\ud800.txt"}') == {"path": f"a{FFFD}.txt"}
    assert decode_arguments(f'{{"path": "a{LONE}.txt"}}') == {"path": f"a{FFFD}.txt"}
    assert decode_arguments('"{\\"path\\": \\"\\\\ud800\\"}"') == {"path": FFFD}  # encoded twice


def test_valid_message_cleans_every_text_field_and_keeps_a_clean_message() -> None:
    meta = Metadata(
        tool_name="shell",
        tool_arguments={"command": f"echo {LONE}"},
        call_id=f"c{LONE}",
        extra={"note": [ESCAPED_BYTE]},
    )
    msg = Message(
        session_id="s",
        role=Role.ASSISTANT,
        kind=Kind.TOOL_CALL,
        sender="Kesoku",
        content=LONE,
        metadata=meta,
    )
    cleaned = valid_message(msg)
    assert cleaned.content == FFFD
    assert cleaned.metadata.tool_arguments == {"command": f"echo {FFFD}"}
    assert (cleaned.metadata.call_id, cleaned.metadata.extra) == (f"c{FFFD}", {"note": [FFFD]})
    assert encodable(cleaned.metadata)
    ok = Message(session_id="s", role=Role.USER, sender="Zoë", content="ça va 😀")
    assert valid_message(ok) is ok


def test_valid_event_cleans_text_and_tool_calls() -> None:
    assert valid_event(TextDelta(f"hi{LONE}")) == TextDelta(f"hi{FFFD}")
    event = ToolCallEvent(ToolCallBlock(f"id{LONE}", f"name{LONE}", {f"k{LONE}": LONE}))
    assert valid_event(event) == ToolCallEvent(
        ToolCallBlock(f"id{FFFD}", f"name{FFFD}", {f"k{FFFD}": FFFD})
    )
    same = TextDelta("fine")
    assert valid_event(same) is same


def test_backend_errors_and_tool_descriptions_are_made_valid() -> None:
    assert str(BackendError(f"openai: HTTP 400: bad {LONE}")) == f"openai: HTTP 400: bad {FFFD}"

    async def run(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        return ""

    # An MCP server's description and schema: JSON from outside.
    tool = Tool(
        "mcp__x",
        f"Does {LONE}.",
        run,
        {"type": "object", "properties": {"a": {"description": LONE}}},
    )
    assert encodable(tool.spec) and tool.spec.description == f"Does {FFFD}."


_ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()))  # surrogates included


@given(_ANY_TEXT)
def test_property_valid_text_is_encodable_idempotent_and_keeps_valid_text(text: str) -> None:
    cleaned = valid_text(text)
    cleaned.encode("utf-8")  # never raises
    assert valid_text(cleaned) == cleaned
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # replaced, or a pair joined
        assert FFFD in cleaned or any(ord(c) > 0xFFFF for c in cleaned)
    else:
        assert cleaned is text


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | _ANY_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_ANY_TEXT, inner, max_size=4),
    max_leaves=12,
)


@given(st.dictionaries(_ANY_TEXT, _JSON, max_size=4))
def test_property_any_arguments_become_storable(arguments: dict[str, Any]) -> None:
    cleaned = valid_data(arguments)
    assert encodable(cleaned)
    assert decode_json(msgspec.json.encode(cleaned)) == cleaned  # stored and read back unchanged
    if encodable(arguments):
        assert cleaned is arguments


@given(_ANY_TEXT)
def test_property_json_escapes_of_any_text_decode_to_valid_text(text: str) -> None:
    # ensure_ascii: surrogates as \\u escapes (\\ud800)
    decoded = decode_json(json.dumps({"t": text}))
    assert decoded == {"t": valid_text(text)}


# -- a turn, end to end -------------------------------------------------------------------------


async def wait_logs(writer: TurnLogWriter, count: int) -> None:
    with trio.fail_after(10):
        while writer.written < count:  # noqa: ASYNC110 - the writer process's answers, counted
            await trio.sleep(0.01)


def logs_of(folder: Path) -> list[dict[str, Any]]:
    return [yaml.safe_load(p.read_text()) for p in sorted(folder.glob("llm-turn-*.log.yaml"))]


async def test_lone_surrogates_from_the_model_end_as_fffd_and_the_turn_completes(
    tmp_path: Path,
) -> None:
    # Before: the tool call's arguments made the store's metadata JSON raise UnicodeEncodeError,
    # which crashed the session worker; the answer's text made the SQLite insert raise.
    writer = TurnLogWriter()
    llm = ScriptedLLM(
        [
            {
                "thought": f"think{LONE}",
                "tool_calls": [{"name": "echo", "arguments": {"text": f"a{LONE}b"}}],
            },
            {"text": ["The answer: ", f"x{ESCAPED_BYTE}y"]},
        ]
    )
    async with serve_runtime(tmp_path, llm, tools=[echo()], turnlog=writer) as h:
        await h.say("go")
        metrics = await h.turn_end()
        await wait_logs(writer, 2)
        history = h.history()
        trace = await trio.to_thread.run_sync(render_trace, h.store, h.session.id)
        folder = Path(h.session.workspace)
    assert metrics.state is TurnState.DONE
    thought, call, result, answer = history[1:]
    assert thought.content == f"think{FFFD}"
    assert call.metadata.tool_arguments == {"text": f"a{FFFD}b"}
    assert result.content == f"a{FFFD}b"  # the tool got the valid text
    assert answer.content == f"The answer: x{FFFD}y"
    second = logs_of(folder)[1]
    assert second["response"]["text"] == f"The answer: x{FFFD}y"
    assert f"x{FFFD}y" in trace
    (_, request) = llm.requests
    assert encodable(request)


def odd_tool() -> Tool:
    """A tool whose output holds a lone surrogate (as an MCP server's JSON escape would give it)."""

    async def run(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        await trio.lowlevel.checkpoint()
        return f"made {LONE} by a server"

    return Tool("odd", "Odd output.", run)


async def test_a_lone_surrogate_in_a_tool_result_ends_as_fffd(tmp_path: Path) -> None:
    writer = TurnLogWriter()
    llm = ScriptedLLM([{"tool_calls": [{"name": "odd", "arguments": {}}]}, {"text": "done"}])
    async with serve_runtime(tmp_path, llm, tools=[odd_tool()], turnlog=writer) as h:
        await h.say("go")
        metrics = await h.turn_end()
        await wait_logs(writer, 2)
        history = h.history()
        trace = await trio.to_thread.run_sync(render_trace, h.store, h.session.id)
        folder = Path(h.session.workspace)
    assert metrics.state is TurnState.DONE
    assert history[2].content == f"made {FFFD} by a server"
    blocks = [b for t in logs_of(folder)[1]["request"]["turns"] for b in t["blocks"]]
    assert blocks[-1]["content"] == f"made {FFFD} by a server"
    assert f"made {FFFD} by a server" in trace


async def test_a_file_name_that_is_not_utf8_is_listed_with_fffd(tmp_path: Path) -> None:
    # os.scandir gives b"bad\xff.txt" as "bad\udcff.txt" (surrogateescape): the listing held it.
    llm = ScriptedLLM(
        [{"tool_calls": [{"name": "list_dir", "arguments": {"path": "."}}]}, {"text": "ok"}]
    )
    gates = PathGates(home=tmp_path / "home")
    async with serve_runtime(tmp_path, llm, tools=file_tools(gates)) as h:
        (Path(h.session.workspace) / os.fsdecode(b"bad\xff.txt")).write_bytes(b"x")
        await h.say("list")
        metrics = await h.turn_end()
        result = h.history()[2]
    assert metrics.state is TurnState.DONE
    assert f"bad{FFFD}.txt" in result.content


async def test_a_provider_error_with_a_lone_surrogate_is_told_and_logged(tmp_path: Path) -> None:
    writer = TurnLogWriter()
    llm = ScriptedLLM([{"error": {"message": f"bad request {LONE}", "status": 400}}])
    async with serve_runtime(tmp_path, llm, turnlog=writer) as h:
        await h.say("go")
        metrics = await h.turn_end()
        await wait_logs(writer, 1)
        notice = h.history()[-1]
        folder = Path(h.session.workspace)
    assert metrics.state is TurnState.FAILED
    assert notice.content.endswith(f"bad request {FFFD}")
    assert logs_of(folder)[0]["metadata"]["error"].endswith(f"bad request {FFFD}")


async def test_a_subagents_tool_result_with_a_lone_surrogate_reaches_its_model_valid(
    tmp_path: Path,
) -> None:
    # The child's history is in memory: its tool results reach its model without passing the store.
    llm = ScriptedLLM(
        [
            {"tool_calls": [{"name": "subagent", "arguments": {"task": "look"}}]},
            {"tool_calls": [{"name": "odd", "arguments": {}}]},  # the child
            {"text": "the child saw it"},  # the child's conclusion
            {"text": "parent done"},
        ]
    )
    async with serve_runtime(tmp_path, llm, tools=[odd_tool()], subagent_max_steps=5) as h:
        await h.say("delegate")
        metrics = await h.turn_end()
    assert metrics.state is TurnState.DONE
    child_2 = llm.requests[2]
    last = child_2.turns[-1].blocks[-1]
    assert isinstance(last, ToolResultBlock) and last.content == f"made {FFFD} by a server"
    assert all(encodable(r) for r in llm.requests)


# -- the backends, over the real SDKs against the wire fakes ------------------------------------


def request(tools: bool = False) -> LLMRequest:
    specs = (
        (ToolSpec("write_file", "Write a file.", {"type": "object", "properties": {}}),)
        if tools
        else ()
    )
    return LLMRequest(system="s", turns=(LLMTurn("user", (TextBlock("hi"),)),), tools=specs)


async def test_openai_lone_surrogates_in_text_and_arguments_are_replaced() -> None:
    fake = OpenAIFake()
    # The fake sends what json.dumps makes of a lone surrogate: a \ud800 escape.
    # escaped inside the arguments
    fake.push(
        Reply(
            text=f"answer {LONE}",
            calls=[
                Call("c1", "write_file", {"path": f"a{LONE}.txt", "content": "x"}),
                Call("c2", "write_file", '{"path": "b\\ud800.txt"}'),
            ],
        )
    )
    async with openai(fake) as llm:
        events = await events_of(llm, request(tools=True))
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    calls = [e.call for e in events if isinstance(e, ToolCallEvent)]
    assert text == f"answer {FFFD}"
    assert [c.arguments for c in calls] == [
        {"path": f"a{FFFD}.txt", "content": "x"},
        {"path": f"b{FFFD}.txt"},
    ]


async def test_claude_lone_surrogates_in_text_and_tool_input_are_replaced() -> None:
    # Before: msgspec refused the event ("a malformed stream event"), retried until the call failed.
    fake = AnthropicFake()
    fake.push(
        ClaudeReply(
            [Text(f"answer {LONE}"), ToolUse("toolu_1", "write_file", {"path": f"a{LONE}.txt"})]
        )
    )
    async with claude(fake) as llm:
        events = await events_of(llm, request(tools=True))
    assert len(fake.log.requests) == 1
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    (call,) = [e.call for e in events if isinstance(e, ToolCallEvent)]
    assert text == f"answer {FFFD}"
    assert call.arguments == {"path": f"a{FFFD}.txt"}


async def test_gemini_lone_surrogates_in_text_and_function_args_are_replaced() -> None:
    fake = GeminiFake(
        [reply(chunk(text_part(f"answer {LONE}"), call("write_file", {"path": f"a{LONE}.txt"})))]
    )
    async with served(fake) as llm:
        events = await events_of(llm, request(tools=True))
    text_out = "".join(e.text for e in events if isinstance(e, TextDelta))
    (call_out,) = [e.call for e in events if isinstance(e, ToolCallEvent)]
    assert text_out == f"answer {FFFD}"
    assert call_out.arguments == {"path": f"a{FFFD}.txt"}


# -- kesoku chat ----------------------------------------------------------------------------------


def test_kesoku_chat_prints_an_answer_with_a_lone_surrogate(tmp_path: Path) -> None:
    # Before: storing or printing the answer raised UnicodeEncodeError: exit 1, the answer lost.
    scenario = tmp_path / "lone.yaml"
    # YAML's escape: a lone surrogate
    scenario.write_text('steps:\n  - text: "caf\\u00e9 \\ud800 done"\n')
    setup(tmp_path, scenario)
    done = chat(tmp_path, "hi")
    assert (done.returncode, done.stdout) == (0, f"café {FFFD} done\n"), done.stderr
    (session, *_), answer = history(tmp_path)[0], history(tmp_path)[-1]
    assert answer[1:] == (Role.ASSISTANT, Kind.TEXT, f"café {FFFD} done")
    traced = kesoku(tmp_path, "trace", session, "-o", "-")
    assert traced.returncode == 0 and f"café {FFFD} done" in traced.stdout


# -- MCP ------------------------------------------------------------------------------------------


async def test_an_mcp_result_with_an_escaped_lone_surrogate_is_read(tmp_path: Path) -> None:
    # Before: the SDK could not parse the line; the call waited for its answer until it timed out.
    raw = Path(__file__).parent / "data" / "mcp" / "raw_server.py"
    server = McpStdioServer(name="raw", command=sys.executable, args=(str(raw),), timeout_s=10.0)
    session = Session(
        id="s", adapter="terminal", channel_id="c", created_at=0.0, workspace=str(tmp_path)
    )
    mgr = manager(server)
    async with serving(mgr):
        with trio.fail_after(30):
            while not mgr.tools():  # noqa: ASYNC110 - the manager's state has no event to wait on
                await trio.sleep(0.05)
        text_out, outcome, _ = await mcp_call(mgr, session, "raw__lone")
    assert (text_out, outcome) == (f"made {FFFD} here", Outcome.COMPLETED)


# -- a chat platform ------------------------------------------------------------------------------


async def test_a_discord_message_and_member_name_with_lone_surrogates_are_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fake sends JSON with \ud800 escapes: discord.py decodes them to lone surrogates, in the
    # message and in the member's name that goes into the session's context prompt.
    async with discord_bot(tmp_path, monkeypatch, user_allowlist=("alice", "4242")) as bot:
        zoe = bot.fake.add_user(4242, f"zo{LONE}")
        thread = int(bot.fake.user_says(bot.general, zoe, f"hi {LONE} there")["id"])
        messages = await bot.reply_in(thread)
        (session,) = bot.sessions()
        history = bot.h.history(session)
        trace = await trio.to_thread.run_sync(render_trace, bot.h.store, session.id)
    answer = messages[-1]["content"]  # the model reads "<name>: <text>" in a shared channel
    assert answer == f"you said: zo{FFFD}: hi {FFFD} there"
    assert [(m.sender, m.content) for m in history] == [
        (f"zo{FFFD}", f"hi {FFFD} there"),
        ("Kesoku", answer),
    ]
    assert f"zo{FFFD}" in session.metadata["context"]
    assert f"zo{FFFD}" in bot.llm.requests[-1].system
    assert f"hi {FFFD} there" in trace
