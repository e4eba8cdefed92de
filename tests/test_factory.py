"""The backend factory: the default choice, unknown names, retries from config, model fallback."""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path

import pytest

from kesoku.config.settings import (
    AgentConfig,
    ClaudeConfig,
    Config,
    GeminiConfig,
    OpenAIConfig,
    ScriptedConfig,
)
from kesoku.llm.factory import create_llm, default_backend
from kesoku.llm.fallback import FallbackLLM
from kesoku.testing import ScriptedLLM
from kesoku.vocab.errors import BackendError, ConfigError, OperatorError
from kesoku.vocab.ir import LLMRequest, LLMTurn, StopEvent, StopReason, TextBlock, TextDelta

REQUEST = LLMRequest(system="s", turns=(LLMTurn("user", (TextBlock("hi"),)),))


def test_the_default_follows_the_credentials_present() -> None:
    assert default_backend(Config())[0] == "local"
    assert default_backend(Config(gemini=GeminiConfig(api_key="k")))[0] == "gemini"
    assert default_backend(Config(claude=ClaudeConfig(api_key="k")))[0] == "claude"
    assert default_backend(Config(claude=ClaudeConfig(project_id="p")))[0] == "claude"  # vertex
    assert (
        default_backend(Config(openai=OpenAIConfig(base_url="http://localhost:11434/v1")))[0]
        == "openai"
    )
    _name, reason = default_backend(Config())
    assert "offline" in reason


def test_an_unknown_backend_is_one_clear_line() -> None:
    with pytest.raises(
        OperatorError, match=r"^agent\.llm: unknown backend 'gpt' \(known: gemini, claude"
    ):
        create_llm("gpt", Config())


def test_the_scripted_backend_needs_its_scenario(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^scripted\.path: not set"):
        create_llm("scripted", Config())
    scenario = tmp_path / "s.yaml"
    scenario.write_text("model: from-file\nsteps: [{text: hi}]\n")
    cfg = Config(
        agent=AgentConfig(llm="gemini", max_retries=7, retry_cap_s=2.5),
        scripted=ScriptedConfig(path=str(scenario)),
    )
    # a name given explicitly (a session's override) wins over agent.llm
    llm = create_llm("scripted", cfg)
    assert isinstance(llm, ScriptedLLM)
    assert (llm.model, llm.source) == ("from-file", str(scenario))
    assert (llm.max_retries, llm.backoff_cap_s) == (7, 2.5)


async def collect(llm: FallbackLLM) -> list[object]:
    async with aclosing(llm.stream(REQUEST)) as events:
        return [e async for e in events]


async def test_fallback_tries_the_next_backend_after_one_gives_up() -> None:
    first = ScriptedLLM([{"error": {"message": "overloaded", "status": 529}}])
    second = ScriptedLLM([{"text": "from the second"}])
    chain = FallbackLLM([first, second])
    assert await collect(chain) == [TextDelta("from the second"), StopEvent(StopReason.END, "end")]
    assert chain.used == "scripted"
    assert (first.calls, second.calls) == (1, 1)


async def test_fallback_never_switches_mid_answer_and_reports_the_last_error() -> None:
    first = ScriptedLLM([{"text": "half", "error": {"message": "cut", "retryable": True}}])
    second = ScriptedLLM([{"text": "never"}])
    with pytest.raises(BackendError, match="cut"):
        await collect(FallbackLLM([first, second]))
    assert second.calls == 0
    a = ScriptedLLM([{"error": {"message": "a failed"}}])
    b = ScriptedLLM([{"error": {"message": "b failed"}}])
    with pytest.raises(BackendError, match="b failed"):
        await collect(FallbackLLM([a, b]))
    with pytest.raises(ValueError, match="at least one"):
        FallbackLLM([])
