"""The built-in price table: what the models Kesoku knows cost, in US dollars per million tokens.

Keys are model ids or id prefixes; a model is priced by its exact id, else by the longest key it
starts with (``claude-sonnet-4-5`` prices ``claude-sonnet-4-5-20250929`` and the Vertex AI form
``claude-sonnet-4-5@20250929``). ``[pricing.models]`` in the config adds to this table and overrides
it. Where a provider prices a model in tiers by prompt length, the entry is the base tier (the
shorter prompts), so a longer prompt costs more than the estimate; each such entry says so.

Prices are the standard (not batch, flex or priority) paid rates for text. Checked 2026-12-02 from
stored copies of the providers' pages (the live pages could not be opened from here); the date
after each source is the date of the copy the figures were read from:

- Anthropic: https://platform.claude.com/docs/en/about-claude/pricing ("Model pricing"; an undated
  copy listing Claude Opus 4.8 and Opus 5, so from mid-2026 or later; the Sonnet and Haiku rows
  from its zh-CN copy, which lists the same figures). Cache reads are 0.1× the input price and
  5-minute cache writes 1.25×, the rates Kesoku's prompt caching pays; 1-hour writes (2×) are not
  distinguished.
- Google: https://ai.google.dev/gemini-api/docs/pricing (a full copy of 2026-03-30 for Gemini 3.1
  Pro Preview, 3.1 Flash-Lite, 3 Flash Preview and 2.5 Pro/Flash/Flash-Lite; quotes of the page
  of 2026-05-24 to 2026-10-01 for Gemini 3.5, 3.7 and 3.8 Flash and for the 2.5 rows, unchanged).
  The cached price is the "Context caching price" for text, images and video. Storage of a context
  cache (per million tokens per hour, $1.00 for Flash, $4.50 for Pro) is billed by time, not per
  token, and is not counted; writing a cache is billed as input, so no write price is set.
- OpenAI: https://developers.openai.com/api/docs/pricing (transcriptions of 2026-10-05 for GPT-5,
  5-mini, 5-nano, 5.1 to 5.6 and GPT-4.1; of 2026-08-17 for the -pro models; of 2026-05-24 for
  GPT-4o, o3 and o4-mini; the stored per-model page of GPT-5 nano agrees). These models have no
  cache-write charge (the model comparison page shows "Cache writes: -" for them), so no write
  price is set. Some of the newer GPT-5.x models (GPT-5.5 at least) charge more for prompts over
  272k tokens; their entries are the base tier.

Siblings that a prefix would otherwise price too low (``gpt-5`` would price ``gpt-5-pro``, ``o3``
would price ``o3-pro``) have entries of their own. Models not in the table (Claude 5.x, Gemini 3.6
Flash, GPT-6) are unpriced until added.
"""

from __future__ import annotations

from kesoku.config.settings import ModelPrice


def _price(
    input_usd: float, output_usd: float, *, cached: float | None = None, write: float | None = None
) -> ModelPrice:
    """A price in USD per million tokens; unset cached or write prices are the input price."""
    return ModelPrice(
        input_usd_per_mtok=input_usd,
        output_usd_per_mtok=output_usd,
        cached_input_usd_per_mtok=cached,
        cache_write_usd_per_mtok=write,
    )


BUILTIN_PRICES: dict[str, ModelPrice] = {
    # Anthropic: input, output, cache hits, 5-minute cache writes.
    "claude-opus-4-8": _price(5.00, 25.00, cached=0.50, write=6.25),
    "claude-opus-4-7": _price(5.00, 25.00, cached=0.50, write=6.25),
    "claude-opus-4-6": _price(5.00, 25.00, cached=0.50, write=6.25),
    "claude-opus-4-5": _price(5.00, 25.00, cached=0.50, write=6.25),
    "claude-opus-4-1": _price(15.00, 75.00, cached=1.50, write=18.75),
    # claude-opus-4-20250514 and its alias claude-opus-4-0.
    "claude-opus-4": _price(15.00, 75.00, cached=1.50, write=18.75),
    "claude-sonnet-4-6": _price(3.00, 15.00, cached=0.30, write=3.75),
    # Sonnet 4.5 and 4 with the 1M-token context beta: prompts over 200k tokens cost $6 / $22.50;
    # base tier here. Sonnet 4.6 and Opus 4.6 and later bill the whole 1M window at these rates.
    "claude-sonnet-4-5": _price(3.00, 15.00, cached=0.30, write=3.75),
    "claude-sonnet-4": _price(3.00, 15.00, cached=0.30, write=3.75),
    "claude-3-7-sonnet": _price(3.00, 15.00, cached=0.30, write=3.75),
    "claude-haiku-4-5": _price(1.00, 5.00, cached=0.10, write=1.25),
    "claude-3-5-haiku": _price(0.80, 4.00, cached=0.08, write=1.00),
    # Google Gemini: input, output, cached input.
    # Gemini 3.8 and 3.7 Flash cost half this ($0.75 / $3.75, cached $0.075) through 2026-12-31
    # as an introductory price; these are the standard prices from 2027-01-01, so until then the
    # estimate is twice the charge (a cap stops early rather than late).
    "gemini-3.8-flash": _price(1.50, 7.50, cached=0.15),
    "gemini-3.7-flash": _price(1.50, 7.50, cached=0.15),
    "gemini-3.5-flash": _price(1.50, 9.00, cached=0.15),
    # Prompts over 200k tokens: $4.00 / $18.00, cached $0.40; base tier here.
    "gemini-3.1-pro": _price(2.00, 12.00, cached=0.20),
    "gemini-3.1-flash-lite": _price(0.25, 1.50, cached=0.025),
    "gemini-3-flash": _price(0.50, 3.00, cached=0.05),
    # gemini-3-pro-preview is not on the page of 2026-03-30 (3.1 Pro replaced it); this is its
    # price in a transcription of the page of January 2026, not checked on Google's own copy.
    # Over 200k tokens: $4.00 / $18.00, cached $0.40; base tier here.
    "gemini-3-pro": _price(2.00, 12.00, cached=0.20),
    # Prompts over 200k tokens: $2.50 / $15.00, cached $0.25; base tier here.
    "gemini-2.5-pro": _price(1.25, 10.00, cached=0.125),
    "gemini-2.5-flash": _price(0.30, 2.50, cached=0.03),
    "gemini-2.5-flash-lite": _price(0.10, 0.40, cached=0.01),
    # OpenAI: input, output, cached input. "-pro" models have no cached price (input price).
    "gpt-5": _price(1.25, 10.00, cached=0.125),
    "gpt-5-mini": _price(0.25, 2.00, cached=0.025),
    "gpt-5-nano": _price(0.05, 0.40, cached=0.005),
    "gpt-5-pro": _price(15.00, 120.00),
    "gpt-5.1": _price(1.25, 10.00, cached=0.125),
    "gpt-5.2": _price(1.75, 14.00, cached=0.175),
    "gpt-5.2-pro": _price(21.00, 168.00),
    "gpt-5.3-codex": _price(1.75, 14.00, cached=0.175),
    "gpt-5.4": _price(2.50, 15.00, cached=0.25),
    "gpt-5.4-mini": _price(0.75, 4.50, cached=0.075),
    "gpt-5.4-nano": _price(0.20, 1.25, cached=0.02),
    "gpt-5.4-pro": _price(30.00, 180.00),
    "gpt-5.5": _price(5.00, 30.00, cached=0.50),
    "gpt-5.5-pro": _price(30.00, 180.00),
    # GPT-5.6 Sol: $5 / $30 on 2026-08-17, then a promotional $4 / $20 (cached $0.40) "at least
    # through November 21, 2026"; its price after that could not be verified, so the higher one.
    "gpt-5.6-sol": _price(5.00, 30.00, cached=0.50),
    "gpt-5.6-terra": _price(2.00, 12.00, cached=0.20),
    "gpt-5.6-luna": _price(0.20, 1.20, cached=0.02),
    "gpt-4.1": _price(2.00, 8.00, cached=0.50),
    "gpt-4.1-mini": _price(0.40, 1.60, cached=0.10),
    "gpt-4.1-nano": _price(0.10, 0.40, cached=0.025),
    "gpt-4o": _price(2.50, 10.00, cached=1.25),
    # The first GPT-4o snapshot kept its launch price; from a transcription of 2025-06-03, not
    # checked on a 2026 copy of the page.
    "gpt-4o-2024-05-13": _price(5.00, 15.00),
    "gpt-4o-mini": _price(0.15, 0.60, cached=0.075),
    "o3": _price(2.00, 8.00, cached=0.50),
    "o3-pro": _price(20.00, 80.00),
    "o3-mini": _price(1.10, 4.40, cached=0.55),
    # The deep-research models: from a transcription of 2025-09-21, not checked on a 2026 copy.
    "o3-deep-research": _price(10.00, 40.00, cached=2.50),
    "o4-mini-deep-research": _price(2.00, 8.00, cached=0.50),
    "o4-mini": _price(1.10, 4.40, cached=0.275),
}
