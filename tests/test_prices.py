"""The built-in price table (issue 20): sane prices, Anthropic's cache rates, and every model family
Kesoku knows a context window for priced, the backends' default models included."""

from __future__ import annotations

import math

import pytest

from kesoku.agent.compaction.tokens import _WINDOWS
from kesoku.config.prices import BUILTIN_PRICES
from kesoku.config.settings import ClaudeConfig, GeminiConfig, ModelPrice, OpenAIConfig


def lookup(model: str) -> tuple[str, ModelPrice] | None:
    """The table's rule: the exact id, else the longest key the id starts with."""
    if model in BUILTIN_PRICES:
        return model, BUILTIN_PRICES[model]
    keys = [key for key in BUILTIN_PRICES if model.startswith(key)]
    if not keys:
        return None
    key = max(keys, key=len)
    return key, BUILTIN_PRICES[key]


def cached(price: ModelPrice) -> float:
    read = price.cached_input_usd_per_mtok
    return price.input_usd_per_mtok if read is None else read


def written(price: ModelPrice) -> float:
    write = price.cache_write_usd_per_mtok
    return price.input_usd_per_mtok if write is None else write


ANTHROPIC = sorted(key for key in BUILTIN_PRICES if key.startswith("claude-"))


@pytest.mark.parametrize("key", sorted(BUILTIN_PRICES))
def test_prices_are_non_negative_and_ordered(key: str) -> None:
    price = BUILTIN_PRICES[key]
    fields = (
        price.input_usd_per_mtok,
        price.output_usd_per_mtok,
        price.cached_input_usd_per_mtok,
        price.cache_write_usd_per_mtok,
    )
    assert all(value is None or value >= 0 for value in fields)
    # Every provider here prices a cache hit at most as input, and input at most as output.
    assert cached(price) <= price.input_usd_per_mtok <= price.output_usd_per_mtok


@pytest.mark.parametrize("key", ANTHROPIC)
def test_anthropic_cache_rates(key: str) -> None:
    price = BUILTIN_PRICES[key]
    assert price.cached_input_usd_per_mtok is not None
    assert price.cache_write_usd_per_mtok is not None
    assert math.isclose(price.cached_input_usd_per_mtok, 0.1 * price.input_usd_per_mtok)
    assert math.isclose(price.cache_write_usd_per_mtok, 1.25 * price.input_usd_per_mtok)


def test_only_anthropic_prices_cache_writes() -> None:
    # Gemini bills a cache write as input and OpenAI charges none: both leave the write unset.
    others = [key for key in BUILTIN_PRICES if not key.startswith("claude-")]
    assert others
    assert all(
        written(BUILTIN_PRICES[key]) == BUILTIN_PRICES[key].input_usd_per_mtok for key in others
    )


@pytest.mark.parametrize("prefix", [prefix for prefix, _ in _WINDOWS])
def test_every_window_family_is_priced(prefix: str) -> None:
    # A bare family prefix ("claude-") names no model, so the table has no catch-all for it: a
    # guessed price for an unknown model would be worse than none. Each family has entries.
    assert any(key.startswith(prefix) for key in BUILTIN_PRICES), prefix


@pytest.mark.parametrize(
    ("model", "key"),
    [
        # Claude: dated ids, aliases and the Vertex AI form.
        ("claude-opus-4-8", "claude-opus-4-8"),
        ("claude-opus-4-5-20251101", "claude-opus-4-5"),
        ("claude-opus-4-1-20250805", "claude-opus-4-1"),
        ("claude-opus-4-20250514", "claude-opus-4"),
        ("claude-opus-4-0", "claude-opus-4"),
        ("claude-sonnet-4-5-20250929", "claude-sonnet-4-5"),
        ("claude-sonnet-4-5@20250929", "claude-sonnet-4-5"),
        ("claude-sonnet-4-20250514", "claude-sonnet-4"),
        ("claude-3-7-sonnet-20250219", "claude-3-7-sonnet"),
        ("claude-haiku-4-5-20251001", "claude-haiku-4-5"),
        ("claude-3-5-haiku-20241022", "claude-3-5-haiku"),
        # Gemini: preview ids take their family's price, Flash-Lite is not priced as Flash.
        ("gemini-2.5-flash-lite", "gemini-2.5-flash-lite"),
        ("gemini-2.5-flash-lite-preview-09-2025", "gemini-2.5-flash-lite"),
        ("gemini-2.5-flash-preview-09-2025", "gemini-2.5-flash"),
        ("gemini-3.1-pro-preview", "gemini-3.1-pro"),
        ("gemini-3.1-flash-lite-preview", "gemini-3.1-flash-lite"),
        ("gemini-3-flash-preview", "gemini-3-flash"),
        # OpenAI: dated snapshots, and the dearer siblings a shorter prefix would underprice.
        ("gpt-5-2025-08-07", "gpt-5"),
        ("gpt-5-mini-2025-08-07", "gpt-5-mini"),
        ("gpt-5-pro-2025-10-06", "gpt-5-pro"),
        ("gpt-5.1-codex", "gpt-5.1"),
        ("gpt-5.5-pro", "gpt-5.5-pro"),
        ("gpt-4.1-2025-04-14", "gpt-4.1"),
        ("gpt-4.1-nano-2025-04-14", "gpt-4.1-nano"),
        ("gpt-4o-2024-08-06", "gpt-4o"),
        ("gpt-4o-2024-05-13", "gpt-4o-2024-05-13"),
        ("gpt-4o-mini-2024-07-18", "gpt-4o-mini"),
        ("o3-2025-04-16", "o3"),
        ("o3-pro-2025-06-10", "o3-pro"),
        ("o4-mini-2025-04-16", "o4-mini"),
    ],
)
def test_model_ids_find_their_entry(model: str, key: str) -> None:
    found = lookup(model)
    assert found is not None, model
    assert found[0] == key


@pytest.mark.parametrize(
    "model",
    [ClaudeConfig().model_name, GeminiConfig().model_name, OpenAIConfig().model_name],
)
def test_default_models_are_priced(model: str) -> None:
    found = lookup(model)
    assert found is not None, model
    # Priced by an entry of its own family, not by a shorter cousin.
    assert model.startswith(found[0])
    assert any(model.startswith(prefix) for prefix, _ in _WINDOWS)


def test_unknown_models_stay_unpriced() -> None:
    assert lookup("qwen3-8b-q4") is None
    assert lookup("claude-") is None
