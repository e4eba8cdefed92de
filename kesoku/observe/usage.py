"""What a session has used and what its next request holds: /usage and /context for every adapter.

The figures of /usage come from the spend ledger (:mod:`kesoku.observe.spend`): every model call of
the session, its subagents' and compaction summaries' included, each priced at its own model. Those
of /context come from the store (the latest view state) plus what the caller knows about the next
request (system prompt, tool specs), so the terminal, Discord and Google Chat print the same figures
with :func:`usage_lines` and :func:`context_lines`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec

from kesoku.observe.spend import usd
from kesoku.vocab.ir import ToolSpec
from kesoku.vocab.model import Message, Session
from kesoku.vocab.text import plural
from kesoku.vocab.transcript import to_turns
from kesoku.vocab.view import ViewState, archive_start

if TYPE_CHECKING:
    from kesoku.observe.spend import Budget, Cap

CHARS_PER_TOKEN = 4
"""The rough ratio behind every token *estimate* here.

It fits English text and JSON; real tokenizers vary.
"""


def usage_lines(budget: Budget, session: Session, *, turns: int) -> list[str]:
    """What /usage prints: a session's calls and tokens by kind, its cost, and each cap it is under.

    Args:
        budget: The process's budget (its ledger, prices and caps).
        session: The session.
        turns: Turns processed (:meth:`kesoku.store.Store.count_turns`).
    """
    store = budget.store
    t = store.spend_totals(session_id=session.id)
    lines = [
        f"{plural(turns, 'turn')} · {plural(t.calls, 'model call')}",
        f"input {t.input_tokens:,} tokens ({t.cached_tokens:,} read from cache, "
        f"{t.cache_write_tokens:,} written to it) · "
        f"output {t.output_tokens:,} tokens ({t.thinking_tokens:,} thinking)",
    ]
    cost = f"cost: {usd(t.usd)}"
    if t.unpriced_calls:
        models = [
            m or "unknown (before the ledger)"
            for m, sums in store.spend_breakdown("model", session_id=session.id)
            if sums.unpriced_calls
        ]
        cost += (
            f" + {plural(t.unpriced_calls, 'call')} without a price ({', '.join(models)}); "
            'add [pricing.models."<model>"] to kesoku.toml'
        )
    lines.append(cost)
    lines.extend(cap_lines(budget.status(session)))
    return lines


def cap_lines(statuses: Sequence[tuple[Cap, float]]) -> list[str]:
    """One line per cap and its spend (:meth:`~kesoku.observe.spend.Budget.status`).

    ``cap budget.day_usd: $1.20 of $5.00 (today, all sessions)``.
    """
    lines = []
    for cap, spent in statuses:
        if cap.usd:
            amount = f"{usd(spent)} of {usd(cap.limit)}"
        else:
            amount = f"{spent:,.0f} of {cap.limit:,.0f} tokens"
        when = f"today, {cap.who}" if cap.daily else cap.who
        lines.append(f"cap {cap.key}: {amount} ({when})")
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
    start = archive_start(history, view)
    sent = list(history[start:]) if view is None else [view.shown(m) for m in history[start:]]
    evicted = sum(1 for m, s in zip(history[start:], sent, strict=True) if s is not m)
    turns = to_turns(sent)
    head = view.head_text() if view is not None else None
    detail = (
        f"{len(sent):,} of {plural(len(history), 'message')} in "
        f"{plural(len(turns), 'request turn')}"
    )
    if evicted:
        detail += f", {plural(evicted, 'tool result')} evicted"
    archives = "none (nothing compacted)"
    if view is not None and view.archives:
        archives = (
            f"{plural(len(view.archives), 'archive')} of turns "
            f"{view.archives[0].first_turn}–{view.archives[-1].last_turn}"
        )
    elif head:
        archives = "files and dropped turns of the compacted part"
    return [
        ContextPart("system prompt", len(system), plural(system.count(chr(10)) + 1, "line")),
        ContextPart("tools", len(encode(list(tools))), plural(len(tools), "tool")),
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
