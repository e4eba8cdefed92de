"""What a session has used and what its next request holds: /usage and /context for every adapter.

The numbers come from the store alone (messages' ``metadata.usage``, the latest view state) plus
what the caller knows about the next request (system prompt, tool specs), so the terminal, Discord
and Google Chat print the same figures with :func:`usage_lines` and :func:`context_lines`.

Costs use ``[pricing.models."model-id"]`` of kesoku.toml
(:class:`kesoku.config.settings.PricingConfig`). Input tokens as providers report them include the
cached ones, and output tokens include thinking (see :class:`kesoku.vocab.model.Usage`), so the cost
is ``(input - cached) * input price + cached * cached price + output * output price``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from kesoku.config.settings import ModelPrice, PricingConfig
from kesoku.vocab.ir import ToolSpec
from kesoku.vocab.model import Message
from kesoku.vocab.transcript import to_turns
from kesoku.vocab.view import ViewState, archive_start
from kesoku.vocab.view import key as view_key

CHARS_PER_TOKEN = 4
"""The rough ratio behind every token *estimate* here.

It fits English text and JSON; real tokenizers vary.
"""


class TokenTotals(msgspec.Struct, frozen=True, kw_only=True):
    """A session's token counts by kind, summed over the model calls that reported usage.

    Attributes:
        calls: Model calls whose usage is stored.
        input_tokens: Input tokens, cached ones included.
        cached_tokens: The part of the input read from the provider's cache.
        output_tokens: Output tokens, thinking included.
        thinking_tokens: The part of the output spent thinking.
    """

    calls: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    thinking_tokens: int = 0


def session_tokens(history: Iterable[Message]) -> TokenTotals:
    """Sum the usage stored on a session's messages (one message per model call carries it).

    A subagent's calls are not counted: only its conclusion is stored.
    """
    calls = inputs = cached = outputs = thinking = 0
    for message in history:
        usage = message.metadata.usage
        if usage is not None:
            calls += 1
            inputs += usage.input_tokens
            cached += usage.cached_tokens
            outputs += usage.output_tokens
            thinking += usage.thinking_tokens
    return TokenTotals(
        calls=calls,
        input_tokens=inputs,
        cached_tokens=cached,
        output_tokens=outputs,
        thinking_tokens=thinking,
    )


def find_price(model: str, pricing: PricingConfig) -> tuple[str, ModelPrice] | None:
    """The price of a model: its exact id, else the longest priced id it starts with.

    The prefix rule lets ``claude-sonnet-4-5`` price ``claude-sonnet-4-5-20250929``.

    Returns:
        ``(priced id, price)``, or None when the table has no entry for it.
    """
    price = pricing.models.get(model)
    if price is not None:
        return model, price
    prefixes = [key for key in pricing.models if model.startswith(key)]
    if not prefixes:
        return None
    key = max(prefixes, key=len)
    return key, pricing.models[key]


def cost_usd(tokens: TokenTotals, price: ModelPrice) -> float:
    """The cost of the tokens at this price, in US dollars."""
    cached_price = price.cached_input_usd_per_mtok
    if cached_price is None:
        cached_price = price.input_usd_per_mtok
    uncached = max(tokens.input_tokens - tokens.cached_tokens, 0)
    micro = (
        uncached * price.input_usd_per_mtok
        + tokens.cached_tokens * cached_price
        + tokens.output_tokens * price.output_usd_per_mtok
    )
    return micro / 1_000_000


def usage_lines(
    history: Sequence[Message], *, turns: int, model: str, pricing: PricingConfig
) -> list[str]:
    """What /usage prints: a session's tokens by kind, then the cost estimate or why there is none.

    Args:
        history: The session's messages.
        turns: Turns processed (:meth:`kesoku.store.Store.count_turns`).
        model: The model id the session uses now; every call is priced as this model.
        pricing: The price table.
    """
    t = session_tokens(history)
    lines = [
        f"{turns} turns · {t.calls} model calls reported usage",
        f"input {t.input_tokens:,} tokens ({t.cached_tokens:,} cached) · "
        f"output {t.output_tokens:,} tokens ({t.thinking_tokens:,} thinking)",
    ]
    found = find_price(model, pricing)
    if found is None:
        lines.append(f'cost: no price for {model}; add [pricing.models."{model}"] to kesoku.toml')
    else:
        key, price = found
        lines.append(f"cost: about ${cost_usd(t, price):,.4f} (every call priced as {key})")
    return lines


# -- the next request -----------------------------------------------------------------------------


class ContextPart(msgspec.Struct, frozen=True):
    """One part of the next request and its size.

    Attributes:
        name: ``system prompt``, ``tools``, ``history`` or ``archives``.
        chars: Its length: the text, or the JSON the parts are sent as.
        detail: What it holds (``12 tools``, ``40 messages in 9 turns``).
    """

    name: str
    chars: int
    detail: str

    @property
    def tokens_estimate(self) -> int:
        """``chars / 4``: an estimate, not the provider's count."""
        return -(-self.chars // CHARS_PER_TOKEN)


def context_parts(
    *, system: str, tools: Sequence[ToolSpec], history: Sequence[Message], view_state: bytes | None
) -> list[ContextPart]:
    """Estimate what the next request holds, part by part.

    Under a compaction view the history is what the view still sends (evicted tool results as their
    stubs) and the archives are the text that stands in for the archived turns
    (:mod:`kesoku.vocab.view`).

    Args:
        system: The system prompt as the next turn would build it.
        tools: The tool specs it would offer.
        history: The session's messages (the transcript the request is built from).
        view_state: The latest compaction view (:meth:`kesoku.store.Store.latest_view_state`), or
            None.

    Returns:
        The system prompt, the tools, the history and the archives, in request order. Attachments
        count as their JSON without the file bytes (they are loaded only when the request is built).
    """
    encode = msgspec.json.encode
    view = ViewState.decode(view_state) if view_state else None
    start = archive_start(history, [view_key(m) for m in history], view)
    sent = list(history[start:]) if view is None else [view.shown(m) for m in history[start:]]
    evicted = sum(1 for m, s in zip(history[start:], sent, strict=True) if s is not m)
    turns = to_turns(sent)
    head = view.head_text() if view is not None else None
    detail = f"{len(sent)} of {len(history)} messages in {len(turns)} request turns"
    if evicted:
        detail += f", {evicted} tool results evicted"
    archives = "none (nothing compacted)"
    if view is not None and view.archives:
        archives = (
            f"{len(view.archives)} archives of turns "
            f"{view.archives[0].first_turn}–{view.archives[-1].last_turn}"
        )
    elif head:
        archives = "files and dropped turns of the compacted part"
    return [
        ContextPart("system prompt", len(system), f"{system.count(chr(10)) + 1} lines"),
        ContextPart("tools", len(encode(list(tools))), f"{len(tools)} tools"),
        ContextPart("history", len(encode(turns)), detail),
        ContextPart("archives", len(head or ""), archives),
    ]


def context_lines(parts: Sequence[ContextPart], *, last_input_tokens: int) -> list[str]:
    """What /context prints of the next request: each part, the total and the last measured size."""
    width = max(len(p.name) for p in parts)
    lines = [f"{p.name:<{width}}  ~{p.tokens_estimate:>9,} tokens  {p.detail}" for p in parts]
    total = sum(p.tokens_estimate for p in parts)
    lines.append(
        f"{'total':<{width}}  ~{total:>9,} tokens  (estimate: characters / {CHARS_PER_TOKEN})"
    )
    if last_input_tokens:
        lines.append(
            f"the last model call read {last_input_tokens:,} input tokens (the provider's count)"
        )
    return lines
