"""What model calls spend, and the port through which every call is metered.

Every model call of any kind (a turn's step, a retry, a subagent's step, a compaction summary) asks
its :class:`Meter` first and reports its usage after, so a spend cap is checked before each call and
the ledger in SQLite holds every call (ARCHITECTURE.md, "Spend caps"). The backends see only this
port; the caps and prices behind it are :mod:`kesoku.observe.spend`.
"""

from __future__ import annotations

from typing import Protocol

import msgspec

from kesoku.vocab.errors import KesokuError
from kesoku.vocab.model import Usage

BUDGET_GROUP_KEY = "budget_group"
"""``session.metadata`` key an adapter sets when it opens a session: the ``label`` of the channel
entry (``[[discord.channels]]``, ``[[gchat.spaces]]``) whose caps apply to it."""


class SpendKind:
    """What a model call was made for (the ledger's ``kind``)."""

    TURN = "turn"
    SUBAGENT = "subagent"
    COMPACTION = "compaction"


class SpendRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One model call in the ledger.

    Attributes:
        ts: When the call ended, UNIX seconds.
        session_id: The session it was made for.
        adapter: The session's adapter (its chatbot id).
        group: The channel entry whose caps apply to the session (``discord.channels`` or
            ``gchat.spaces``), or empty.
        kind: A :class:`SpendKind` value.
        provider: The backend that made the call (a fallback chain's member, not the chain).
        model: The model id.
        usage: Its tokens, as the provider reported them.
        cost_usd: Its price in US dollars; None when no price is known for the model.
    """

    ts: float
    session_id: str
    adapter: str
    group: str
    kind: str
    provider: str
    model: str
    usage: Usage
    cost_usd: float | None


class SpendTotals(msgspec.Struct, frozen=True, kw_only=True):
    """Spend summed over some calls of the ledger.

    Attributes:
        calls: Calls counted.
        usd: Their price, US dollars (the priced calls only).
        unpriced_calls: Calls whose model had no price.
        input_tokens: Input tokens, cached and cache-written ones included.
        output_tokens: Output tokens, thinking included.
        cached_tokens: Input read from a cache.
        cache_write_tokens: Input written to a cache.
        thinking_tokens: Output spent thinking.
    """

    calls: int = 0
    usd: float = 0.0
    unpriced_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    thinking_tokens: int = 0

    @property
    def tokens(self) -> int:
        """Input plus output tokens: what a token cap counts."""
        return self.input_tokens + self.output_tokens


class BudgetExceeded(KesokuError):
    """A spend cap is reached: the model call was not made.

    The message is the one line the user sees: the cap, what was spent, when it resets.

    Attributes:
        cap: The config key of the cap (``budget.day_usd``).
        resets_at: When a day cap resets (local midnight, UNIX seconds); None for a session cap.
    """

    def __init__(self, notice: str, *, cap: str, resets_at: float | None = None) -> None:
        super().__init__(notice)
        self.cap = cap
        self.resets_at = resets_at


class Meter(Protocol):
    """The spend port of one session's model calls (:class:`kesoku.observe.spend.SessionMeter`)."""

    def check(self) -> None:
        """Raise :class:`BudgetExceeded` when a cap forbids the next call; else return."""
        ...

    def record(self, provider: str, model: str, usage: Usage) -> None:
        """Keep one call's usage in the ledger (called once per attempt that reported usage)."""
        ...
