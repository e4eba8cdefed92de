"""Spend caps: what each model call costs, the ledger it goes to, and the caps checked before it.

Every model call passes a :class:`SessionMeter` to its backend (:class:`kesoku.vocab.spend.Meter`):
the backend asks :meth:`SessionMeter.check` before each attempt (retries included) and reports
each attempt's usage, which becomes one row of the ledger in SQLite priced at that call's model.
Caps are sums over the ledger, so they survive restarts and count every process on the database:

- ``[budget]``: ``session_*`` per session, ``day_*`` for all sessions together;
- ``[discord.budget]`` and ``[gchat.budget]``: ``session_*`` replace [budget]'s for the adapter's
  sessions, ``day_*`` cap them together;
- ``budget`` of a ``[[discord.channels]]`` or ``[[gchat.spaces]]`` entry: the same for the sessions
  of those channels. The adapter names the entry in ``session.metadata["budget_group"]`` when it
  opens the session (as it sets the entry's ``llm``).

A day is the daemon's local calendar day. A call that would start at or over a cap is not made
(:class:`~kesoku.vocab.spend.BudgetExceeded`); a call that starts under it may end over it.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

from kesoku.config.prices import BUILTIN_PRICES
from kesoku.config.settings import BudgetConfig, CapOverrides, Config, ModelPrice, PricingConfig
from kesoku.vocab.model import Session, Usage
from kesoku.vocab.spend import BUDGET_GROUP_KEY, BudgetExceeded, SpendKind, SpendRecord, SpendTotals

if TYPE_CHECKING:
    from kesoku.store import Store

log = logging.getLogger(__name__)

FREE_PROVIDERS = frozenset({"local", "scripted"})
"""Backends that cost nothing: the bundled model and recorded scenarios."""
_FREE = ModelPrice(input_usd_per_mtok=0.0, output_usd_per_mtok=0.0)
NEAR_CAP = 1e-6
"""A meter's running tally within this fraction of a cap (or over it) is not trusted: the ledger
is summed again (:meth:`SessionMeter.check`), so float rounding never decides a cap."""

_Scope = tuple[bool, str | None, str | None]
"""What a cap sums: (daily, adapter, group), as :meth:`Cap.scope`."""
_LEDGER_WRITES: weakref.WeakKeyDictionary[Store, int] = weakref.WeakKeyDictionary()
"""Ledger rows this process wrote through a :class:`Budget`, per store: its own connection's
writes, which ``PRAGMA data_version`` does not count."""


def find_price(model: str, models: Mapping[str, ModelPrice]) -> tuple[str, ModelPrice] | None:
    """The price of a model: its exact id, else the longest priced id it starts with.

    The prefix rule lets ``claude-sonnet-4-5`` price ``claude-sonnet-4-5-20250929``.

    Returns:
        ``(priced id, price)``, or None when the table has no entry for it.
    """
    price = models.get(model)
    if price is not None:
        return model, price
    prefixes = [key for key in models if model.startswith(key)]
    if not prefixes:
        return None
    key = max(prefixes, key=len)
    return key, models[key]


def call_cost_usd(usage: Usage, price: ModelPrice) -> float:
    """What one call's tokens cost at this price, in US dollars.

    Input tokens include the cached and cache-written ones (:class:`~kesoku.vocab.model.Usage`),
    each priced as the provider prices it; an unset cached or cache-write price is the input price.
    """
    read = price.cached_input_usd_per_mtok
    write = price.cache_write_usd_per_mtok
    plain = max(usage.input_tokens - usage.cached_tokens - usage.cache_write_tokens, 0)
    micro = (
        plain * price.input_usd_per_mtok
        + usage.cached_tokens * (price.input_usd_per_mtok if read is None else read)
        + usage.cache_write_tokens * (price.input_usd_per_mtok if write is None else write)
        + usage.output_tokens * price.output_usd_per_mtok
    )
    return micro / 1_000_000


def day_bounds(now: float) -> tuple[float, float]:
    """The local calendar day holding ``now``: its first second and the next day's, UNIX seconds.

    ``time.mktime`` with ``isdst=-1`` lets the C library place midnight on a day the clocks change.
    """
    today = dt.date.fromtimestamp(now)
    tomorrow = today + dt.timedelta(days=1)
    start = time.mktime((today.year, today.month, today.day, 0, 0, 0, 0, 0, -1))
    end = time.mktime((tomorrow.year, tomorrow.month, tomorrow.day, 0, 0, 0, 0, 0, -1))
    return start, end


class Cap(NamedTuple):
    """One cap that applies to a session.

    Attributes:
        key: Its config key, for messages (``budget.day_usd``).
        who: Whose spend it counts, for messages (``this session``, ``all sessions``).
        usd: True for dollars, False for tokens.
        limit: The cap.
        daily: True: spend since local midnight; False: the session's whole spend.
        adapter: Count only this adapter's calls.
        group: Count only this channel entry's calls.
    """

    key: str
    who: str
    usd: bool
    limit: float
    daily: bool
    adapter: str | None = None
    group: str | None = None

    @property
    def scope(self) -> _Scope:
        """What the cap sums: caps of one scope share one query of the ledger."""
        return self.daily, self.adapter, self.group

    def spent(self, totals: SpendTotals) -> float:
        """The part of ``totals`` this cap counts."""
        return totals.usd if self.usd else totals.tokens


class _Level(NamedTuple):
    key: str  # "discord.budget", "discord.channels[general].budget"
    who: str
    caps: CapOverrides
    group: str | None


class _AdapterCaps(NamedTuple):
    section: str  # "discord" or "gchat", for keys
    entries: str  # "channels" or "spaces"
    caps: CapOverrides
    groups: Mapping[str, CapOverrides]

    def levels(self, groups: Iterable[str]) -> list[_Level]:
        """The adapter's level, then those of the named channel entries that exist."""
        out = [_Level(f"{self.section}.budget", f"{self.section} sessions", self.caps, None)]
        for group in groups:
            if group in self.groups:
                key = f"{self.section}.{self.entries}[{group}].budget"
                label = f"the sessions of {self.section} {self.entries[:-1]} entry {group}"
                out.append(_Level(key, label, self.groups[group], group))
        return out

    def day_caps(self, adapter: str, levels: Sequence[_Level]) -> list[Cap]:
        """The day caps of these levels, narrowest first."""
        caps = []
        for level in reversed(levels):
            over = level.caps
            for unit, limit in (("usd", over.day_usd), ("tokens", over.day_tokens)):
                if limit:
                    key = f"{level.key}.day_{unit}"
                    caps.append(
                        Cap(key, level.who, unit == "usd", limit, True, adapter, level.group)
                    )
        return caps


class Budget:
    """The caps and prices of one process; hands a :class:`SessionMeter` to each model call.

    Args:
        store: The store whose ledger is read and written.
        caps: ``[budget]``.
        pricing: ``[pricing]``: prices over the built-in table (:mod:`kesoku.config.prices`).
        adapters: Per adapter chatbot id, its section's caps and its channel entries' (from
            :meth:`from_config`).
        clock: UNIX time now (tests move it).
    """

    def __init__(
        self,
        store: Store,
        *,
        caps: BudgetConfig | None = None,
        pricing: PricingConfig | None = None,
        adapters: Mapping[str, _AdapterCaps] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.caps = caps if caps is not None else BudgetConfig()
        self.prices = {**BUILTIN_PRICES, **(pricing.models if pricing is not None else {})}
        self.adapters = dict(adapters or {})
        self.clock = clock
        self._unpriced_warned: set[str] = set()
        self._prices: dict[tuple[str, str], ModelPrice | None] = {}
        self._day = (0.0, 0.0)  # the last day_bounds: a day's calls need not redo the C calls
        self.money_capped = (
            self.caps.session_usd > 0
            or self.caps.day_usd > 0
            or any(
                (o.session_usd or o.day_usd)
                for a in self.adapters.values()
                for o in (a.caps, *a.groups.values())
            )
        )

    @classmethod
    def from_config(cls, config: Config, store: Store) -> Budget:
        """The budget kesoku.toml describes, over ``store``'s ledger."""
        adapters = {
            config.discord.chatbot_id: _AdapterCaps(
                "discord",
                "channels",
                config.discord.budget,
                {c.label: c.budget for c in config.discord.channels},
            ),
            config.gchat.chatbot_id: _AdapterCaps(
                "gchat",
                "spaces",
                config.gchat.budget,
                {s.label: s.budget for s in config.gchat.spaces},
            ),
        }
        return cls(store, caps=config.budget, pricing=config.pricing, adapters=adapters)

    def meter(self, session: Session, kind: str = SpendKind.TURN) -> SessionMeter:
        """The meter of one session's calls of one kind."""
        return SessionMeter(self, session, kind)

    # -- prices -----------------------------------------------------------------------------------

    def price(self, provider: str, model: str) -> ModelPrice | None:
        """The price of a model; None if unknown.

        The local and scripted backends cost nothing unless a price names their model.
        """
        # Once per model: an unknown id is matched by prefix against the whole table.
        key = (provider, model)
        if key not in self._prices:
            found = find_price(model, self.prices)
            if found is None and provider in FREE_PROVIDERS:
                self._prices[key] = _FREE
            else:
                self._prices[key] = None if found is None else found[1]
        return self._prices[key]

    def record(
        self, session: Session, kind: str, provider: str, model: str, usage: Usage
    ) -> SpendRecord:
        """Append one call to the ledger, priced at its model; returns the row written."""
        price = self.price(provider, model)
        if price is None and self.money_capped and model not in self._unpriced_warned:
            self._unpriced_warned.add(model)
            log.warning(
                "no price for model %s: the money caps cannot count its calls (token caps still "
                'apply); add [pricing.models."%s"] to kesoku.toml',
                model,
                model,
            )
        record = SpendRecord(
            ts=self.clock(),
            session_id=session.id,
            adapter=session.adapter,
            group=_group(session),
            kind=kind,
            provider=provider,
            model=model,
            usage=usage,
            cost_usd=None if price is None else call_cost_usd(usage, price),
        )
        self.store.record_spend(record)
        _LEDGER_WRITES[self.store] = self.ledger_writes() + 1
        return record

    def ledger_writes(self) -> int:
        """Ledger rows written through any :class:`Budget` of this process on this store."""
        return _LEDGER_WRITES.get(self.store, 0)

    def today(self, now: float) -> tuple[float, float]:
        """:func:`day_bounds` of ``now``, kept for the day's later calls."""
        start, end = self._day
        if not start <= now < end:
            start, end = self._day = day_bounds(now)
        return start, end

    # -- caps -------------------------------------------------------------------------------------

    def caps_for(self, session: Session) -> list[Cap]:
        """The caps that apply to a session: its own, then the day caps, narrowest first."""
        base = self.caps
        own = {"usd": (base.session_usd, "budget"), "tokens": (base.session_tokens, "budget")}
        caps: list[Cap] = []
        found = self.adapters.get(session.adapter)
        if found is not None:
            group = _group(session)
            levels = found.levels([group] if group else [])
            for level in levels:
                if level.caps.session_usd is not None:
                    own["usd"] = (level.caps.session_usd, level.key)
                if level.caps.session_tokens is not None:
                    own["tokens"] = (level.caps.session_tokens, level.key)
            caps = found.day_caps(session.adapter, levels)
        session_caps = [
            Cap(f"{key}.session_{unit}", "this session", unit == "usd", limit, False)
            for unit, (limit, key) in own.items()
        ]
        caps = [*session_caps, *caps, *self._global_day_caps()]
        return [c for c in caps if c.limit > 0]

    def _global_day_caps(self) -> list[Cap]:
        return [
            Cap("budget.day_usd", "all sessions", True, self.caps.day_usd, True),
            Cap("budget.day_tokens", "all sessions", False, self.caps.day_tokens, True),
        ]

    def status(self, session: Session) -> list[tuple[Cap, float]]:
        """Each cap of a session with what it has counted so far."""
        caps = self.caps_for(session)
        if not caps:
            return []
        sums = self.sums(session, caps, self.today(self.clock())[0])
        return [(cap, cap.spent(sums[cap.scope])) for cap in caps]

    def sums(
        self, session: Session, caps: Iterable[Cap], day_start: float
    ) -> dict[_Scope, SpendTotals]:
        """What the ledger holds for each scope of ``caps`` (one query a scope).

        Args:
            session: The session whose caps these are (a session cap sums its calls).
            caps: From :meth:`caps_for`.
            day_start: Local midnight, UNIX seconds: where day caps start counting.
        """
        sums: dict[_Scope, SpendTotals] = {}
        for cap in caps:
            if cap.scope not in sums:
                sums[cap.scope] = (
                    self.store.spend_totals(since=day_start, adapter=cap.adapter, group=cap.group)
                    if cap.daily
                    else self.store.spend_totals(session_id=session.id)
                )
        return sums

    def day_status(self) -> list[tuple[Cap, float]]:
        """Every day cap of the config (global, adapters, channel entries) with today's spend."""
        caps = [
            cap
            for adapter, found in self.adapters.items()
            for cap in found.day_caps(adapter, found.levels(found.groups))
        ]
        start, _ = self.today(self.clock())
        return [
            (c, c.spent(self.store.spend_totals(since=start, adapter=c.adapter, group=c.group)))
            for c in [*caps, *self._global_day_caps()]
            if c.limit > 0
        ]

    def check(self, session: Session) -> None:
        """Refuse the next call of a session when one of its caps is reached.

        Raises:
            BudgetExceeded: The first cap reached; its message is the line the user sees.
        """
        for cap, spent in self.status(session):
            if spent >= cap.limit:
                resets_at = self.today(self.clock())[1] if cap.daily else None
                raise BudgetExceeded(self._notice(cap, spent), cap=cap.key, resets_at=resets_at)

    def summary(self, session: Session) -> str:
        """The session's spend for a turn's metrics line: ``$0.042`` or ``$0.042 · 61% of a cap``.

        Empty when nothing was spent in dollars (a free or unpriced model) and no cap applies.
        """
        totals = self.store.spend_totals(session_id=session.id)
        statuses = self.status(session)
        text = usd(totals.usd) if totals.usd else ""
        if statuses:
            cap, spent = max(statuses, key=lambda s: s[1] / s[0].limit)
            share = f"{spent / cap.limit:.0%} of {cap.key}"
            text = f"{text} · {share}" if text else share
        return text

    def _notice(self, cap: Cap, spent: float) -> str:
        if cap.usd:
            amount = f"{usd(spent)} of {usd(cap.limit)}"
        else:
            amount = f"{spent:,.0f} of {cap.limit:,.0f} tokens"
        if not cap.daily:
            return (
                f"Spend cap reached: this session has used {amount} ({cap.key}); a session cap "
                "does not reset: start a new session or raise the cap."
            )
        now = self.clock()
        left = int(self.today(now)[1] - now)
        return (
            f"Spend cap reached: {cap.who} have used {amount} today ({cap.key}); it resets at "
            f"midnight, in {left // 3600} h {left % 3600 // 60:02d} min."
        )


class SessionMeter:
    """The meter of one session's calls of one kind (:class:`kesoku.vocab.spend.Meter`).

    Its caps are worked out once (:meth:`Budget.caps_for`: the budget's caps and the session's
    adapter and channel entry), and it keeps running sums of them: the ledger is summed at the first
    :meth:`check`, then again only when something else may have changed it (see :meth:`check`).

    Args:
        budget: The process's budget.
        session: The session the calls are made for.
        kind: A :class:`~kesoku.vocab.spend.SpendKind` value.

    Attributes:
        caps: The caps that apply to the session (empty: a check reads nothing).
    """

    def __init__(self, budget: Budget, session: Session, kind: str) -> None:
        self.budget = budget
        self.session = session
        self.kind = kind
        self.caps = budget.caps_for(session)
        self._tally: _Tally | None = None

    def of_kind(self, kind: str) -> SessionMeter:
        """The same session's meter for calls of another kind (a subagent's, a summary)."""
        return SessionMeter(self.budget, self.session, kind)

    def check(self) -> None:
        """Raise :class:`~kesoku.vocab.spend.BudgetExceeded` when a cap forbids the next call.

        Decides as :meth:`Budget.check` does, without summing the ledger for every call: its
        running sums (the ledger's, plus the calls this meter recorded since) are trusted while no
        other connection wrote to the database (``PRAGMA data_version``), no other meter of this
        process wrote to the ledger, the day is the same, and every sum is under its cap by more
        than :data:`NEAR_CAP`. Otherwise :meth:`Budget.check` sums the ledger and decides.

        Raises:
            BudgetExceeded: The first cap reached; its message is the line the user sees.
        """
        if not self.caps:
            return
        budget = self.budget
        day_start = budget.today(budget.clock())[0]
        tally = self._tally
        if tally is None or not tally.current(budget, day_start):
            tally = self._tally = self._read(day_start)
        for cap in self.caps:
            usd, tokens = tally.spent[cap.scope]
            if (usd if cap.usd else tokens) >= cap.limit * (1 - NEAR_CAP):
                self._tally = None  # near or over: the ledger decides, as it did before any tally
                budget.check(self.session)
                return

    def record(self, provider: str, model: str, usage: Usage) -> None:
        """Append one call to the ledger."""
        tally = self._tally
        if tally is not None and tally.writes != self.budget.ledger_writes():
            tally = self._tally = None  # another meter wrote: the next check sums the ledger
        record = self.budget.record(self.session, self.kind, provider, model, usage)
        if tally is not None:
            # The row counts for every cap of this session: its own, its adapter's and entry's.
            tally.add(record.cost_usd or 0.0, usage.input_tokens + usage.output_tokens)
            tally.writes += 1

    def _read(self, day_start: float) -> _Tally:
        budget = self.budget
        # Read before the sums: a write during them shows at the next check, which sums again.
        version, writes = budget.store.data_version(), budget.ledger_writes()
        sums = budget.sums(self.session, self.caps, day_start)
        spent = {scope: [totals.usd, float(totals.tokens)] for scope, totals in sums.items()}
        return _Tally(day_start, version, writes, spent)


class _Tally:
    """A meter's sums of its caps' scopes and what they were read at."""

    __slots__ = ("data_version", "day_start", "spent", "writes")

    def __init__(
        self, day_start: float, data_version: int, writes: int, spent: dict[_Scope, list[float]]
    ) -> None:
        self.day_start = day_start
        self.data_version = data_version
        self.writes = writes
        """:meth:`Budget.ledger_writes` these sums include."""
        self.spent = spent
        """``[usd, tokens]`` of each scope."""

    def current(self, budget: Budget, day_start: float) -> bool:
        """Whether the ledger can hold nothing the sums do not count."""
        return (
            day_start == self.day_start
            and self.writes == budget.ledger_writes()
            and self.data_version == budget.store.data_version()
        )

    def add(self, usd: float, tokens: int) -> None:
        """Count one call of the session in every scope."""
        for spent in self.spent.values():
            spent[0] += usd
            spent[1] += tokens


def usd(amount: float) -> str:
    """Dollars for people: ``$1.24``, and four places below a cent (``$0.0042``)."""
    return f"${amount:,.2f}" if amount >= 0.01 or amount == 0 else f"${amount:.4f}"


def _group(session: Session) -> str:
    group = session.metadata.get(BUDGET_GROUP_KEY)
    return group if isinstance(group, str) else ""
