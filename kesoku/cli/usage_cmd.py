"""``kesoku usage``: what model calls cost, per day, session and model, from the spend ledger."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated

from cyclopts import Parameter

from kesoku.cli.sessions_cmd import ConfigOption, no_database, open_store
from kesoku.observe.spend import Budget, day_bounds, usd
from kesoku.observe.usage import cap_lines
from kesoku.vocab.errors import OperatorError
from kesoku.vocab.text import plural

if TYPE_CHECKING:
    from kesoku.vocab.spend import SpendTotals


MAX_DAYS = 3660
"""The furthest ``--days`` looks back (ten years)."""


def usage(
    *,
    days: Annotated[int, Parameter(name="--days")] = 7,
    top: Annotated[int, Parameter(name="--top")] = 10,
    config: ConfigOption = None,
) -> None:
    """Print what the model calls spent: per day, per session and per model, and the day caps.

    Every model call is in the ledger (turn steps, retries, subagents, compaction summaries), each
    priced at its own model: the built-in prices and [pricing.models]. Calls of a model without a
    price count their tokens only. The figures are what the providers reported; the bill is theirs.

    Args:
        days: How many local calendar days back, today included.
        top: Sessions shown, the most expensive first.
        config: The TOML file. Default: $KESOKU_CONFIG, else ./kesoku.toml, else built-in defaults.
    """
    if not 1 <= days <= MAX_DAYS:
        raise OperatorError(f"usage: --days {days}: from 1 to {MAX_DAYS}")
    if top < 0:
        raise OperatorError(f"usage: --top {top}: 0 or more")

    missing = no_database(config)
    if missing is not None:
        print(f"no model calls yet (no database at {missing})")
        return
    with open_store(config) as (cfg, store):
        budget = Budget.from_config(cfg, store)
        start = day_bounds(time.time() - max(days - 1, 0) * 86_400)[0]
        first = dt.date.fromtimestamp(start).isoformat()
        total = store.spend_totals(since=start)
        if not total.calls:
            print(f"no model calls since {first} (kesoku usage --days N looks further back)")
        else:
            print(f"since {first}: {plural(total.calls, 'model call')}, {_cost(total)}")
            _table("DAY", store.spend_breakdown("day", since=start))
            sessions = store.spend_breakdown("session_id", since=start)
            titles = {s.id: s.title or "untitled" for s in store.list_sessions()}
            named = [
                (f"{sid}  {titles.get(sid, '(deleted)')[:40]}", sums) for sid, sums in sessions
            ]
            _table("SESSION", named[:top])
            if len(named) > top:
                print(f"  … and {plural(len(named) - top, 'more session')} (--top)")
            models = store.spend_breakdown("model", since=start)
            _table("MODEL", [(m or "unknown (before the ledger)", t) for m, t in models])
        lines = cap_lines(budget.day_status())
        print("\n" + ("\n".join(lines) if lines else "no day caps ([budget] in kesoku.toml)"))


def _cost(totals: SpendTotals) -> str:
    text = usd(totals.usd)
    if totals.unpriced_calls:
        text += f" + {plural(totals.unpriced_calls, 'call')} without a price"
    return text


def _table(head: str, rows: Sequence[tuple[str, SpendTotals]]) -> None:
    table = [(head, "CALLS", "INPUT", "CACHED", "OUTPUT", "COST")]
    table += [
        (
            name,
            f"{t.calls:,}",
            f"{t.input_tokens:,}",
            f"{t.cached_tokens:,}",
            f"{t.output_tokens:,}",
            _cost(t),
        )
        for name, t in rows
    ]
    widths = [max(len(r[i]) for r in table) for i in range(5)]
    print()
    for r in table:
        numbers = [c.rjust(w) for c, w in zip(r[1:5], widths[1:], strict=True)]
        cells = [r[0].ljust(widths[0]), *numbers]
        print("  ".join(cells) + "  " + r[5])
