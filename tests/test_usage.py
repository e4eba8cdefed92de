"""Token totals, prices and the context estimate (kesoku.usage), and /usage and /context in a real chat."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from test_cli_chat import Terminal, setup

from kesoku.compaction.view import Archive, ViewState, key
from kesoku.config import ModelPrice, PricingConfig
from kesoku.llm.ir import ToolSpec
from kesoku.model import Message, Metadata, Role, Usage
from kesoku.usage import TokenTotals, context_lines, context_parts, cost_usd, find_price, session_tokens, usage_lines


def answer(usage: Usage | None) -> Message:
    return Message(session_id="s", role=Role.ASSISTANT, sender="Kesoku", content="x", metadata=Metadata(usage=usage))


def test_tokens_are_summed_by_kind_over_the_calls_that_reported_them() -> None:
    history = [
        answer(Usage(input_tokens=1000, cached_tokens=600, output_tokens=50, thinking_tokens=20)),
        answer(None),
        answer(Usage(input_tokens=2000, cached_tokens=0, output_tokens=10)),
    ]
    assert session_tokens(history) == TokenTotals(
        calls=2, input_tokens=3000, cached_tokens=600, output_tokens=60, thinking_tokens=20
    )


def test_a_price_is_found_by_exact_id_else_the_longest_prefix() -> None:
    sonnet = ModelPrice(input_usd_per_mtok=3, output_usd_per_mtok=15, cached_input_usd_per_mtok=0.3)
    pricing = PricingConfig(
        models={"claude": ModelPrice(input_usd_per_mtok=1, output_usd_per_mtok=1), "claude-sonnet-4-5": sonnet}
    )
    assert find_price("claude-sonnet-4-5", pricing) == ("claude-sonnet-4-5", sonnet)
    assert find_price("claude-sonnet-4-5-20250929", pricing) == ("claude-sonnet-4-5", sonnet)
    assert find_price("gemini-2.5-pro", pricing) is None


def test_cached_input_is_billed_at_its_own_price_else_at_the_input_price() -> None:
    tokens = TokenTotals(calls=1, input_tokens=1_000_000, cached_tokens=400_000, output_tokens=100_000)
    with_cache = ModelPrice(input_usd_per_mtok=3, output_usd_per_mtok=15, cached_input_usd_per_mtok=0.3)
    # 600k uncached x $3 + 400k cached x $0.30 + 100k output x $15
    assert cost_usd(tokens, with_cache) == pytest.approx(1.8 + 0.12 + 1.5)
    without = ModelPrice(input_usd_per_mtok=3, output_usd_per_mtok=15)
    assert cost_usd(tokens, without) == pytest.approx(3.0 + 1.5)


def test_usage_lines_say_how_to_add_a_missing_price() -> None:
    lines = usage_lines(
        [answer(Usage(input_tokens=10, output_tokens=2))], turns=1, model="m-1", pricing=PricingConfig()
    )
    assert lines[-1] == 'cost: no price for m-1; add [pricing.models."m-1"] to kesoku.toml'


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
        root = Message(session_id="s", role=Role.USER, sender="User", content=f"q{n}", id=2 * n, root_id=2 * n, ts=n)
        reply = Message(session_id="s", role=Role.ASSISTANT, sender="Kesoku", content="a" * 800, id=2 * n + 1, ts=n)
        return [msgspec.structs.replace(m, root_ts=float(n), root_id=2 * n) for m in (root, reply)]

    history = turn(1) + turn(2)
    view = ViewState(archive_before=key(history[2]), archives=(Archive(1, 1, "Turn 1: intent=q1"),))
    (whole,) = [p for p in context_parts(system="", tools=[], history=history, view_state=None) if p.name == "history"]
    parts = {p.name: p for p in context_parts(system="", tools=[], history=history, view_state=view.encode())}
    assert parts["history"].detail.startswith("2 of 4 messages in ")
    assert parts["history"].chars < whole.chars - 800
    assert parts["archives"].detail == "1 archives of turns 1–1" and parts["archives"].chars > 0


def test_usage_and_context_in_the_interactive_chat(tmp_path: Path) -> None:
    config = setup(tmp_path, "answer.yaml")
    prices = '\n[pricing.models."capital-demo"]\ninput_usd_per_mtok = 3.0\noutput_usd_per_mtok = 15.0\n'
    config.write_text(config.read_text() + prices)
    term = Terminal(tmp_path)
    try:
        term.wait_for("Ctrl-D to exit")
        term.wait_for("›")
        term.type("What is the capital of France?\r")
        term.wait_for("⚡ turn 1")
        term.type("/usage\r")
        term.wait_for("input 2,100 tokens (0 cached) · output 50 tokens (0 thinking)")
        # 2,100 x $3 + 50 x $15 per million: $0.00705
        term.wait_for("cost: about $0.0070 (every call priced as capital-demo)")
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
