"""A session meter's running sums (kesoku.observe.spend.SessionMeter).

The ledger is summed once, not for every call, and every decision is the one :meth:`Budget.check`
makes from the ledger."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kesoku.config.settings import BudgetConfig, ModelPrice, PricingConfig
from kesoku.observe.spend import Budget, SessionMeter
from kesoku.store import Store
from kesoku.vocab.model import Session, Usage
from kesoku.vocab.spend import BudgetExceeded, SpendKind, SpendRecord, SpendTotals

# A tenth of a dollar a million input tokens: sums of such costs are where float rounding shows.
PRICES = PricingConfig(models={"m": ModelPrice(input_usd_per_mtok=0.1, output_usd_per_mtok=0.3)})


class CountingStore(Store):
    """A store that counts how often the ledger is summed."""

    sums = 0

    def spend_totals(
        self,
        *,
        session_id: str | None = None,
        since: float | None = None,
        adapter: str | None = None,
        group: str | None = None,
    ) -> SpendTotals:
        self.sums += 1
        return super().spend_totals(
            session_id=session_id, since=since, adapter=adapter, group=group
        )


def outcome(check: object) -> str:
    """What a check decided: ``ok`` or the notice of the cap it raised."""
    assert callable(check)
    try:
        check()
    except BudgetExceeded as exc:
        return f"{exc.cap}: {exc}"
    return "ok"


operations = st.lists(
    st.tuples(
        st.sampled_from(["meter", "sibling", "other session", "other process", "next day"]),
        st.integers(0, 400_000),
        st.integers(0, 50_000),
    ),
    max_size=25,
)
caps = st.fixed_dictionaries(
    {
        "session_tokens": st.sampled_from([0, 300_000, 1_000_000]),
        "session_usd": st.sampled_from([0.0, 0.1, 0.3]),
        "day_tokens": st.sampled_from([0, 500_000, 2_000_000]),
        "day_usd": st.sampled_from([0.0, 0.2, 0.5]),
    }
)


@settings(max_examples=60, deadline=None)
@given(caps=caps, ops=operations)
def test_a_meter_decides_as_the_ledger_after_any_write(
    caps: dict[str, float], ops: list[tuple[str, int, int]]
) -> None:
    # Writes through the meter, another meter of the session, another session's meter, another
    # connection (another process), and midnight: after each, the meter decides what the ledger
    # says.
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "kesoku.db")
        other = Store(Path(tmp) / "kesoku.db")
        now = [time.time()]
        config = BudgetConfig(**caps)  # type: ignore[arg-type]
        budget = Budget(store, caps=config, pricing=PRICES, clock=lambda: now[0])
        session = store.create_session("terminal", "a", workspace_root=Path(tmp))
        neighbour = store.create_session("terminal", "b", workspace_root=Path(tmp))
        meter = budget.meter(session)
        sibling = budget.meter(session, SpendKind.COMPACTION)
        elsewhere = budget.meter(neighbour)
        assert outcome(meter.check) == outcome(lambda: budget.check(session))
        for what, tokens, output in ops:
            usage = Usage(input_tokens=tokens, output_tokens=output)
            if what == "meter":
                meter.record("claude", "m", usage)
            elif what == "sibling":
                sibling.record("claude", "m", usage)
            elif what == "other session":
                elsewhere.record("claude", "m", usage)
            elif what == "other process":
                other.record_spend(
                    SpendRecord(
                        ts=now[0],
                        session_id=session.id,
                        adapter="terminal",
                        group="",
                        kind=SpendKind.TURN,
                        provider="claude",
                        model="m",
                        usage=usage,
                        cost_usd=tokens / 10_000_000,
                    )
                )
            else:
                now[0] += 86_400
            assert outcome(meter.check) == outcome(lambda: budget.check(session)), what
        other.close()
        store.close()


def test_a_meter_sums_the_ledger_once_while_only_it_writes(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "kesoku.db")
    budget = Budget(store, caps=BudgetConfig(session_tokens=10_000, day_usd=5.0), pricing=PRICES)
    session = store.create_session("terminal", "a", workspace_root=tmp_path)
    meter = budget.meter(session)
    for _ in range(9):
        meter.check()
        meter.record("claude", "m", Usage(input_tokens=1000))
    assert store.sums == 2  # the session's calls, and today's: once
    meter.check()  # 9,000 tokens: under the cap
    meter.record("claude", "m", Usage(input_tokens=1000))
    # At the cap the ledger decides, and its notice is the budget's.
    with pytest.raises(BudgetExceeded) as caught:
        meter.check()
    assert caught.value.cap == "budget.session_tokens"
    assert str(caught.value).startswith(
        "Spend cap reached: this session has used 10,000 of 10,000 "
    )
    assert store.sums > 2
    store.close()


def test_a_meter_without_caps_never_reads_the_ledger(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "kesoku.db")
    budget = Budget(store, pricing=PRICES)
    session = store.create_session("terminal", "a", workspace_root=tmp_path)
    meter = budget.meter(session)
    assert meter.caps == []
    meter.check()
    meter.record("claude", "m", Usage(input_tokens=1000))
    meter.check()
    assert store.sums == 0
    assert store.spend_totals(session_id=session.id).input_tokens == 1000
    store.close()


def test_a_meter_of_kind_counts_as_its_own(tmp_path: Path) -> None:
    store = Store(tmp_path / "kesoku.db")
    budget = Budget(store, caps=BudgetConfig(session_tokens=1500))
    session: Session = store.create_session("terminal", "a", workspace_root=tmp_path)
    meter = budget.meter(session)
    summary: SessionMeter = meter.of_kind(SpendKind.COMPACTION)
    meter.check()
    summary.check()
    summary.record("claude", "m", Usage(input_tokens=1000))
    meter.record("claude", "m", Usage(input_tokens=600))
    for each in (meter, summary):  # each sees the other's write
        with pytest.raises(BudgetExceeded, match=r"budget\.session_tokens"):
            each.check()
    store.close()
