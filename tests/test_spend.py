"""Spend caps (kesoku.observe.spend): checked before every model call, kept in the ledger, shared by
every process on the database, and shown by /usage, the metrics line and ``kesoku usage``."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
from runtime_harness import echo, serve_runtime
from test_cli_chat import chat, kesoku

from kesoku.agent.subagent import Subagent
from kesoku.config.settings import (
    BudgetConfig,
    CapOverrides,
    Config,
    DiscordChannel,
    DiscordConfig,
    ModelPrice,
    PricingConfig,
    load_config,
)
from kesoku.observe.spend import Budget, call_cost_usd, day_bounds
from kesoku.observe.usage import usage_lines
from kesoku.store import Store
from kesoku.testing import ScriptedLLM
from kesoku.vocab.errors import ConfigError
from kesoku.vocab.metrics import TurnState
from kesoku.vocab.model import Kind, Role, Session, Usage
from kesoku.vocab.spend import BUDGET_GROUP_KEY, BudgetExceeded, SpendKind, SpendRecord
from kesoku.vocab.transcript import check_turns, missing_results, to_turns

PRELOADED = (Subagent,)  # the Runtime imports it inside the event loop, once per process


def caps(**fields: float) -> Callable[[Store], Budget]:
    return lambda store: Budget(store, caps=BudgetConfig(**fields))  # type: ignore[arg-type]


def step(calls: int, tokens: int) -> dict[str, object]:
    return {
        "tool_calls": [{"name": "echo", "arguments": {"text": str(n)}} for n in range(calls)],
        "usage": {"input_tokens": tokens, "output_tokens": 0},
    }


async def test_a_cap_reached_in_a_tool_loop_ends_the_turn_with_every_call_answered(
    tmp_path: Path,
) -> None:
    # 1,000 tokens a step against a 1,500-token session cap: the second step starts under the cap
    # (its three parallel calls run and are answered), the third is never made.
    llm = ScriptedLLM([step(2, 1000), step(3, 1000), {"text": "never"}])
    async with serve_runtime(tmp_path, llm, tools=[echo()], budget=caps(session_tokens=1500)) as h:
        await h.say("loop")
        metrics = await h.turn_end()
        history = h.history()
    assert metrics.state is TurnState.BUDGET and metrics.model_calls == 2
    assert llm.calls == 2
    assert missing_results(history) == []
    assert [m.kind for m in history].count(Kind.TOOL_RESULT) == 5
    assert not check_turns(to_turns(history))
    notice = history[-1]
    assert notice.role is Role.SYSTEM
    assert notice.content == (
        "Spend cap reached: this session has used 2,000 of 1,500 tokens (budget.session_tokens); "
        "a session cap does not reset: start a new session or raise the cap."
    )
    assert metrics.render().endswith("(Spend cap)")
    assert "133% of budget.session_tokens" in metrics.render()


async def test_a_capped_session_answers_a_new_message_without_a_model_call_even_after_a_restart(
    tmp_path: Path,
) -> None:
    llm = ScriptedLLM([{"text": "one", "usage": {"input_tokens": 900, "output_tokens": 200}}])
    async with serve_runtime(tmp_path, llm, budget=caps(session_tokens=1000)) as h:
        await h.say("first")
        assert (await h.turn_end()).state is TurnState.DONE
        await h.say("second")
        capped = await h.turn_end()
    assert capped.state is TurnState.BUDGET and capped.model_calls == 0 and llm.calls == 1
    # A new process on the same database: the cap is read from the ledger.
    fresh = ScriptedLLM([{"text": "must not be called"}])
    async with serve_runtime(tmp_path, fresh, budget=caps(session_tokens=1000)) as h:
        await h.say("third")
        metrics = await h.turn_end()
        last = h.history()[-1]
    assert metrics.state is TurnState.BUDGET and fresh.calls == 0
    assert last.content.startswith("Spend cap reached: this session has used 1,100 of 1,000")


async def test_subagent_and_compaction_calls_are_metered_by_kind(tmp_path: Path) -> None:
    # The subagent's own calls land in the ledger under its kind, priced like any call.
    llm = ScriptedLLM(
        [
            {
                "tool_calls": [{"name": "subagent", "arguments": {"task": "look"}}],
                "usage": {"input_tokens": 100, "output_tokens": 1},
            },
            {"text": "found it", "usage": {"input_tokens": 50, "output_tokens": 2}},
            {"text": "done", "usage": {"input_tokens": 200, "output_tokens": 3}},
        ]
    )
    async with serve_runtime(tmp_path, llm, subagent_max_steps=3) as h:
        await h.say("delegate")
        assert (await h.turn_end()).state is TurnState.DONE
        kinds = dict(h.store.spend_breakdown("kind", session_id=h.session.id))
        lines = usage_lines(h.rt.budget, h.session, turns=1)
    assert kinds[SpendKind.TURN].calls == 2 and kinds[SpendKind.SUBAGENT].calls == 1
    assert kinds[SpendKind.SUBAGENT].input_tokens == 50
    assert lines[0] == "1 turn · 3 model calls"
    assert lines[2] == "cost: $0.00"  # the scripted backend costs nothing


async def test_a_day_cap_is_shared_by_sessions_in_other_processes(tmp_path: Path) -> None:
    (tmp_path / "scenario.yaml").write_text(
        "steps:\n  - text: answered\n    usage: {input_tokens: 600, output_tokens: 10}\n"
    )
    (tmp_path / "kesoku.toml").write_text(
        '[agent]\nllm = "scripted"\n[scripted]\npath = "scenario.yaml"\n'
        "[budget]\nday_tokens = 1000\n"
    )
    first = await trio.to_thread.run_sync(chat, tmp_path, "first")
    second = await trio.to_thread.run_sync(chat, tmp_path, "second")
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    # a third session in a third process: 1,220 tokens were spent today
    third = await trio.to_thread.run_sync(chat, tmp_path, "third")
    assert third.returncode == 1 and "Traceback" not in third.stderr
    assert "answered" not in third.stdout
    assert "Spend cap reached: all sessions have used 1,220 of 1,000 tokens today " in third.stderr
    assert "(budget.day_tokens); it resets at midnight, in " in third.stderr
    # … and a session in this process is capped as well.
    llm = ScriptedLLM([{"text": "must not be called"}])
    async with serve_runtime(tmp_path, llm, budget=caps(day_tokens=1000)) as h:
        await h.say("fourth")
        assert (await h.turn_end()).state is TurnState.BUDGET
    assert llm.calls == 0
    report = await trio.to_thread.run_sync(kesoku, tmp_path, "usage")
    assert report.returncode == 0, report.stderr
    assert "2 model calls" in report.stdout and "budget.day_tokens: 1,220 of 1,000 tokens" in (
        report.stdout
    )


def record(store: Store, session: Session, ts: float, tokens: int, usd: float | None) -> None:
    store.record_spend(
        SpendRecord(
            ts=ts,
            session_id=session.id,
            adapter=session.adapter,
            group=str(session.metadata.get(BUDGET_GROUP_KEY, "")),
            kind=SpendKind.TURN,
            provider="claude",
            model="m",
            usage=Usage(input_tokens=tokens),
            cost_usd=usd,
        )
    )


def test_day_caps_count_today_only_and_channel_caps_their_own_sessions(tmp_path: Path) -> None:
    config = Config(
        budget=BudgetConfig(day_usd=10.0, session_usd=2.0),
        discord=DiscordConfig(
            budget=CapOverrides(day_usd=5.0),
            channels=(
                DiscordChannel(
                    channels=("general",), budget=CapOverrides(session_usd=0.5, day_usd=1.0)
                ),
            ),
        ),
    )
    store = Store(tmp_path / "kesoku.db")
    now = time.time()
    budget = Budget.from_config(config, store)
    budget.clock = lambda: now
    general = store.create_session(
        "discord", "t1", workspace_root=tmp_path, metadata={BUDGET_GROUP_KEY: "general"}
    )
    other = store.create_session("discord", "t2", workspace_root=tmp_path)
    terminal = store.create_session("terminal", "x", workspace_root=tmp_path)
    assert [c.key for c in budget.caps_for(general)] == [
        "discord.channels[general].budget.session_usd",
        "discord.channels[general].budget.day_usd",
        "discord.budget.day_usd",
        "budget.day_usd",
    ]
    assert [c.key for c in budget.caps_for(terminal)] == ["budget.session_usd", "budget.day_usd"]
    start, _ = day_bounds(now)
    record(store, other, start - 60, 10, 4.0)  # yesterday: counts for no day cap
    record(store, other, now, 10, 0.9)
    budget.check(general)  # its channel has spent nothing today
    record(store, general, now, 10, 0.3)
    budget.check(general)
    record(store, general, now, 10, 0.3)
    with pytest.raises(BudgetExceeded) as caught:
        budget.check(general)
    assert caught.value.cap == "discord.channels[general].budget.session_usd"
    assert str(caught.value).startswith("Spend cap reached: this session has used $0.60 of $0.50")
    with pytest.raises(BudgetExceeded, match=r"budget\.session_usd"):
        budget.check(other)  # $4.90 in all: a session cap counts every day
    second = store.create_session(
        "discord", "t3", workspace_root=tmp_path, metadata={BUDGET_GROUP_KEY: "general"}
    )
    record(store, second, now, 10, 0.45)
    with pytest.raises(BudgetExceeded) as caught:
        budget.check(second)
    assert str(caught.value).startswith(
        "Spend cap reached: the sessions of discord channel entry general have used $1.05 of "
        "$1.00 today "
        "(discord.channels[general].budget.day_usd); it resets at midnight, in "
    )
    budget.check(terminal)
    store.close()


def test_a_dollar_cap_must_be_finite(tmp_path: Path) -> None:
    path = tmp_path / "kesoku.toml"
    path.write_text("[budget]\nsession_usd = 1\n\n[gchat]\nbudget = { day_usd = inf }\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == (
        f"{path}:5: gchat.budget.day_usd: expected a finite number of US dollars (0: no cap), "
        "not inf"
    )


def test_cache_reads_and_writes_are_priced_as_the_provider_prices_them() -> None:
    price = ModelPrice(
        input_usd_per_mtok=3,
        output_usd_per_mtok=15,
        cached_input_usd_per_mtok=0.3,
        cache_write_usd_per_mtok=3.75,
    )
    usage = Usage(
        input_tokens=1_000_000,
        cached_tokens=500_000,
        cache_write_tokens=200_000,
        output_tokens=100_000,
    )
    # 300k plain x $3 + 500k read x $0.30 + 200k written x $3.75 + 100k output x $15
    assert call_cost_usd(usage, price) == pytest.approx(0.9 + 0.15 + 0.75 + 1.5)
    plain = ModelPrice(input_usd_per_mtok=3, output_usd_per_mtok=15)
    assert call_cost_usd(usage, plain) == pytest.approx(3.0 + 1.5)


def test_a_model_without_a_price_warns_once_and_counts_for_token_caps(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = Store(tmp_path / "kesoku.db")
    budget = Budget(store, caps=BudgetConfig(day_usd=1.0, day_tokens=100))
    session = store.create_session("terminal", "x", workspace_root=tmp_path)
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            budget.record(session, SpendKind.TURN, "openai", "my-model", Usage(input_tokens=60))
    warnings = [r.getMessage() for r in caplog.records if "no price" in r.getMessage()]
    assert warnings == [
        "no price for model my-model: the money caps cannot count its calls (token caps still "
        'apply); add [pricing.models."my-model"] to kesoku.toml'
    ]
    with pytest.raises(BudgetExceeded, match="120 of 100 tokens"):
        budget.check(session)
    # A price in the config applies from then on; the built-in table prices known models.
    priced = Budget(
        store,
        pricing=PricingConfig(
            models={"my-model": ModelPrice(input_usd_per_mtok=1, output_usd_per_mtok=1)}
        ),
    )
    assert priced.price("openai", "my-model") is not None
    assert priced.price("claude", "claude-sonnet-4-5-20250929") is not None
    assert priced.price("local", "anything") == ModelPrice(
        input_usd_per_mtok=0, output_usd_per_mtok=0
    )
    store.close()
