"""The spend ledger: one row per model call (:mod:`kesoku.vocab.spend`), summed for caps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kesoku.store.base import StoreBase, writes
from kesoku.vocab.spend import SpendRecord, SpendTotals


class SpendTable(StoreBase):
    """The ``spend`` table's queries (a mixin of :class:`~kesoku.store.store.Store`)."""

    @writes
    def record_spend(self, record: SpendRecord) -> None:
        """Append one model call to the spend ledger (:mod:`kesoku.vocab.spend`)."""
        u = record.usage
        self._conn.execute(
            "INSERT INTO spend (ts, session_id, adapter, budget_group, kind, provider, model,"
            " input_tokens, output_tokens, cached_tokens, cache_write_tokens, thinking_tokens,"
            " cost_usd) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                record.ts,
                record.session_id,
                record.adapter,
                record.group,
                record.kind,
                record.provider,
                record.model,
                u.input_tokens,
                u.output_tokens,
                u.cached_tokens,
                u.cache_write_tokens,
                u.thinking_tokens,
                record.cost_usd,
            ),
        )

    def spend_totals(
        self,
        *,
        session_id: str | None = None,
        since: float | None = None,
        adapter: str | None = None,
        group: str | None = None,
    ) -> SpendTotals:
        """Sum the ledger's calls that match every filter given.

        Args:
            session_id: One session's calls.
            since: Calls that ended at or after this UNIX time.
            adapter: One adapter's calls.
            group: One channel entry's calls (with ``adapter``).
        """
        where, args = _spend_filter(session_id, since, adapter, group)
        row = self._conn.execute(f"SELECT {_SPEND_SUMS} FROM spend{where}", args).fetchone()
        return _spend_totals(row)

    def spend_breakdown(
        self, by: str, *, since: float | None = None, session_id: str | None = None
    ) -> list[tuple[str, SpendTotals]]:
        """Sum the ledger per value of one column, most expensive first.

        Args:
            by: ``day`` (local calendar day), ``session_id``, ``model``, ``adapter`` or ``kind``.
            since: Calls that ended at or after this UNIX time.
            session_id: One session's calls.
        """
        column = {"day": "date(ts, 'unixepoch', 'localtime')"}.get(by, by)
        if column not in ("session_id", "model", "adapter", "kind") and by != "day":
            raise ValueError(f"spend_breakdown: unknown column {by!r}")
        where, args = _spend_filter(session_id, since, None, None)
        order = "1 DESC" if by == "day" else "3 DESC, 1"
        rows = self._conn.execute(
            f"SELECT {column}, {_SPEND_SUMS} FROM spend{where} GROUP BY 1 ORDER BY {order}", args
        )
        return [(str(row[0]), _spend_totals(row[1:])) for row in rows]


_SPEND_SUMS = (
    "count(*), total(cost_usd), count(*) - count(cost_usd), total(input_tokens),"
    " total(output_tokens), total(cached_tokens), total(cache_write_tokens), total(thinking_tokens)"
)


def _spend_filter(
    session_id: str | None, since: float | None, adapter: str | None, group: str | None
) -> tuple[str, list[object]]:
    clauses: list[str] = []
    args: list[object] = []
    for clause, value in (
        ("session_id = ?", session_id),
        ("ts >= ?", since),
        ("adapter = ?", adapter),
        ("budget_group = ?", group),
    ):
        if value is not None:
            clauses.append(clause)
            args.append(value)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), args


def _spend_totals(row: Sequence[Any] | None) -> SpendTotals:
    if row is None:
        return SpendTotals()
    calls, usd, unpriced, inputs, outputs, cached, written, thinking = row
    return SpendTotals(
        calls=int(calls),
        usd=float(usd),
        unpriced_calls=int(unpriced),
        input_tokens=int(inputs),
        output_tokens=int(outputs),
        cached_tokens=int(cached),
        cache_write_tokens=int(written),
        thinking_tokens=int(thinking),
    )
