"""Token totals in the spend ledger, prices and the context estimate (kesoku.observe.usage), and
/usage and /context in a real chat."""

from __future__ import annotations

from pathlib import Path

import msgspec
import trio
import trio.testing
from runtime_harness import echo, serve_runtime
from test_cli_chat import Terminal, kesoku, setup

from kesoku.config.settings import ModelPrice
from kesoku.observe.spend import Budget, find_price
from kesoku.observe.usage import context_lines, context_parts, usage_lines
from kesoku.store import Store
from kesoku.testing import ScriptedLLM
from kesoku.vocab.ir import ToolSpec
from kesoku.vocab.metrics import TurnState
from kesoku.vocab.model import Kind, Message, Metadata, Role, Usage
from kesoku.vocab.view import Archive, ViewState, key


def answer(usage: Usage | None) -> Message:
    return Message(
        session_id="s",
        role=Role.ASSISTANT,
        sender="Kesoku",
        content="x",
        metadata=Metadata(usage=usage),
    )


def tokens(store: Store, session_id: str) -> tuple[int, int, int, int, int]:
    """(calls, input, cached, output, thinking) of a session in the ledger."""
    t = store.spend_totals(session_id=session_id)
    return (t.calls, t.input_tokens, t.cached_tokens, t.output_tokens, t.thinking_tokens)


async def test_the_usage_of_tool_call_only_steps_is_counted_once_each(tmp_path: Path) -> None:
    # Three steps that only call a tool, then the answer: each model call's usage must reach the
    # store.
    usages = [
        {"input_tokens": 1000, "output_tokens": 11, "cached_tokens": 100},
        {"input_tokens": 1100, "output_tokens": 12, "cached_tokens": 200, "thinking_tokens": 5},
        {"input_tokens": 1200, "output_tokens": 13},
        {"input_tokens": 1300, "output_tokens": 14, "thinking_tokens": 7},
    ]
    steps: list[dict[str, object]] = [
        {"tool_calls": [{"name": "echo", "arguments": {"text": str(n)}}], "usage": usage}
        for n, usage in enumerate(usages[:3])
    ]
    steps.append({"text": "done", "usage": usages[3]})
    async with serve_runtime(tmp_path, ScriptedLLM(steps), tools=[echo()]) as h:
        await h.say("echo three times")
        metrics = await h.turn_end()
        history = h.history()
        assert tokens(h.store, h.session.id) == (4, 4600, 300, 50, 12)
        lines = usage_lines(h.rt.budget, h.session, turns=1)
    assert metrics.state is TurnState.DONE and metrics.model_calls == 4
    assert metrics.turn_tokens == 4600 + 50
    carriers = [m.kind for m in history if m.metadata.usage is not None]
    assert carriers == [Kind.TOOL_CALL, Kind.TOOL_CALL, Kind.TOOL_CALL, Kind.TEXT]
    assert lines == [
        "1 turn · 4 model calls",
        "input 4,600 tokens (300 read from cache, 0 written to it) · "
        "output 50 tokens (12 thinking)",
        "cost: $0.00",
    ]


async def test_a_step_with_several_outputs_carries_its_usage_on_one_message(tmp_path: Path) -> None:
    # Thought, text and two tool calls in one step are one model call.
    llm = ScriptedLLM(
        [
            {
                "thought": "both",
                "text": "Echoing.",
                "tool_calls": [{"name": "echo", "arguments": {"text": t}} for t in ("a", "b")],
                "usage": {"input_tokens": 500, "output_tokens": 40},
            },
            {"text": "a and b", "usage": {"input_tokens": 600, "output_tokens": 5}},
        ]
    )
    async with serve_runtime(tmp_path, llm, tools=[echo()]) as h:
        await h.say("echo twice")
        await h.turn_end()
        assert tokens(h.store, h.session.id) == (2, 1100, 0, 45, 0)
        carriers = [m.metadata.usage for m in h.history() if m.metadata.usage is not None]
    assert len(carriers) == 2


async def test_the_usage_of_a_failed_call_is_counted(tmp_path: Path) -> None:
    # A mid-stream failure after the usage was reported: the failure notice carries it.
    failed = {"events": [{"text": "Let me"}, {"usage": {"input_tokens": 700, "output_tokens": 3}}]}
    failed["events"].append({"error": {"message": "dropped", "retryable": True}})
    llm = ScriptedLLM(
        [
            {"tool_calls": [{"name": "echo", "arguments": {}}], "usage": {"input_tokens": 600}},
            failed,
        ]
    )
    async with serve_runtime(tmp_path, llm, tools=[echo()]) as h:
        await h.say("echo")
        metrics = await h.turn_end()
        history = h.history()
        assert tokens(h.store, h.session.id) == (2, 1300, 0, 3, 0)
    assert metrics.state is TurnState.FAILED and metrics.model_calls == 2
    assert sum(m.metadata.usage.input_tokens for m in history if m.metadata.usage) == 1300
    assert history[-1].role is Role.SYSTEM and history[-1].content.startswith(
        "⚠ The model call failed"
    )


async def test_the_partial_usage_of_an_interrupted_call_is_counted_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # Cut after the thought, the text and a usage report: the interrupted output carries that usage
    # once.
    cut = {
        "events": [
            {"thought": "hm"},
            {"text": "Part"},
            {"usage": {"input_tokens": 800, "output_tokens": 2}},
            {"sleep_s": 60},
            {"text": " never"},
        ]
    }
    llm = ScriptedLLM([cut, {"text": "Second", "usage": {"input_tokens": 900, "output_tokens": 1}}])
    async with serve_runtime(tmp_path, llm) as h:
        await h.say("first")
        await trio.sleep(10)
        await h.say("second")
        assert (await h.turn_end()).state is TurnState.INTERRUPTED
        assert (await h.turn_end()).state is TurnState.DONE
        history = h.history()
        assert tokens(h.store, h.session.id) == (2, 1700, 0, 3, 0)
    assert sum(m.metadata.usage.input_tokens for m in history if m.metadata.usage) == 1700


def test_a_price_is_found_by_exact_id_else_the_longest_prefix() -> None:
    sonnet = ModelPrice(input_usd_per_mtok=3, output_usd_per_mtok=15, cached_input_usd_per_mtok=0.3)
    models = {
        "claude": ModelPrice(input_usd_per_mtok=1, output_usd_per_mtok=1),
        "claude-sonnet-4-5": sonnet,
    }
    assert find_price("claude-sonnet-4-5", models) == ("claude-sonnet-4-5", sonnet)
    assert find_price("claude-sonnet-4-5-20250929", models) == ("claude-sonnet-4-5", sonnet)
    assert find_price("gemini-2.5-pro", models) is None


def test_usage_lines_say_how_to_add_a_missing_price(tmp_path: Path) -> None:
    store = Store(tmp_path / "kesoku.db")
    budget = Budget(store)
    session = store.create_session("terminal", "x", workspace_root=tmp_path)
    budget.record(session, "turn", "openai", "m-1", Usage(input_tokens=10, output_tokens=2))
    budget.record(session, "turn", "claude", "claude-haiku-4-5", Usage(input_tokens=1_000_000))
    lines = usage_lines(budget, session, turns=1)
    store.close()
    assert lines[-1] == (
        'cost: $1.00 + 1 call without a price (m-1); add [pricing.models."<model>"] to kesoku.toml'
    )


def test_kesoku_usage_puts_each_count_with_the_noun_that_agrees(tmp_path: Path) -> None:
    setup(tmp_path, "echo.yaml")
    store = Store(tmp_path / "kesoku.db")
    try:
        budget = Budget(store)
        for n in range(3):
            session = store.create_session("terminal", f"x{n}", workspace_root=tmp_path)
            # one call each, of a model without a price
            budget.record(session, "turn", "openai", "m-1", Usage(input_tokens=10 + n))
    finally:
        store.close()
    report = kesoku(tmp_path, "usage", "--top", "2")
    assert report.returncode == 0, report.stderr
    lines = report.stdout.splitlines()
    assert lines[0].endswith(": 3 model calls, $0.00 + 3 calls without a price")
    assert "  … and 1 more session (--top)" in lines
    one = [line for line in lines if line.startswith("m-1 ")]
    assert one and one[0].endswith("$0.00 + 3 calls without a price")
    assert any(line.endswith("$0.00 + 1 call without a price") for line in lines)  # a session


def test_the_context_estimate_counts_each_part_of_the_request() -> None:
    history = [
        Message(session_id="s", role=Role.USER, sender="User", content="a" * 400, id=1, root_id=1),
        answer(None),
    ]
    tools = [ToolSpec("echo", "Repeat.", {"type": "object"})]
    parts = context_parts(system="s" * 4000, tools=tools, history=history, view_state=None)
    assert [p.name for p in parts] == ["system prompt", "tools", "history", "archives"]
    assert parts[0].tokens_estimate == 1000
    assert parts[2].tokens_estimate > 100  # the user's 400 characters and the JSON around them
    assert parts[3].tokens_estimate == 0 and parts[3].detail == "none (nothing compacted)"
    lines = context_lines(parts, last_input_tokens=1234)
    assert lines[-2].startswith("total") and "estimate: characters / 4" in lines[-2]
    assert lines[-1] == "the last model call read 1,234 input tokens (the provider's count)"


def test_under_a_compaction_view_the_archives_stand_in_for_the_archived_turns() -> None:
    def turn(n: int) -> list[Message]:
        root = Message(
            session_id="s",
            role=Role.USER,
            sender="User",
            content=f"q{n}",
            id=2 * n,
            root_id=2 * n,
            ts=n,
        )
        reply = Message(
            session_id="s",
            role=Role.ASSISTANT,
            sender="Kesoku",
            content="a" * 800,
            id=2 * n + 1,
            ts=n,
        )
        return [msgspec.structs.replace(m, root_ts=float(n), root_id=2 * n) for m in (root, reply)]

    history = turn(1) + turn(2)
    view = ViewState(archive_before=key(history[2]), archives=(Archive(1, 1, "Turn 1: intent=q1"),))
    (whole,) = [
        p
        for p in context_parts(system="", tools=[], history=history, view_state=None)
        if p.name == "history"
    ]
    parts = {
        p.name: p
        for p in context_parts(system="", tools=[], history=history, view_state=view.encode())
    }
    assert parts["history"].detail.startswith("2 of 4 messages in ")
    assert parts["history"].chars < whole.chars - 800
    assert parts["archives"].detail == "1 archive of turns 1–1" and parts["archives"].chars > 0


def test_usage_and_context_in_the_interactive_chat(tmp_path: Path) -> None:
    config = setup(tmp_path, "answer.yaml")
    prices = (
        '\n[pricing.models."capital-demo"]\ninput_usd_per_mtok = 3.0\noutput_usd_per_mtok = 15.0\n'
    )
    config.write_text(config.read_text() + prices)
    term = Terminal(tmp_path)
    try:
        term.wait_for("Ctrl-D to exit")
        term.wait_for("›")
        term.type("What is the capital of France?\r")
        term.wait_for("⚡ turn 1")
        term.type("/usage\r")
        term.wait_for("input 2,100 tokens (0 read from cache, 0 written to it) · output 50 tokens")
        # 2,100 x $3 + 50 x $15 per million: $0.00705
        term.wait_for("cost: $0.0070")
        term.type("/context\r")
        term.wait_for("the next request holds:")
        for part in ("system prompt", "tools", "history", "archives", "estimate: characters / 4"):
            term.wait_for(part)
        term.wait_for("the last model call read 1,200 input tokens")
        term.wait_for("not tainted")
        term.type("\x04")
        assert term.wait_exit() == 0
    finally:
        term.kill()
