"""Context benchmark: the first request of a new worker over a long session.

Run: .venv/bin/python bench/context_bench.py [--messages N] [--rounds R]

A worker that starts on a session (the daemon restarted, or the worker was idle and returned) reads
the whole history once and builds its first request: this is the path of
:class:`kesoku.agent.turn.Turn` before its first model call, on a real SQLite file:

1. ``SessionHistory(gateway, session_id)`` and ``sync()`` twice (``Turn._heal``, then
   ``Turn._turns``): the first reads the session in history order (``Store.history``), the second
   asks the listener that follows it for anything newer;
2. ``history.turns(root)``: the :class:`~kesoku.vocab.transcript.Transcript` of the whole history;
3. ``checker.check(turns)``: the transcript invariant
   (:class:`~kesoku.vocab.transcript.TurnChecker`);
4. ``compactor.estimate(turns, fixed)``: the request's size, to decide on compaction.

Target (issue 24): steps 1-4 <= 30 ms for 10,000 messages (median). Two bare store reads are printed
for reference: ``Store.history`` (step 1's query and row conversion alone) and the listener's replay
from message 0 (``Store.messages_after`` in batches of ``listener_buffer``, each batch sorted by
SQLite), which is how the history read the session before.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from kesoku.agent.compaction.compactor import CompactionPolicy, Compactor
from kesoku.agent.history import SessionHistory
from kesoku.gateway import Gateway
from kesoku.store import Store
from kesoku.store.filters import MessageFilter
from kesoku.vocab.model import Role

from _util import median, report
from history_bench import built, options


def first_request(gateway: Gateway, session_id: str) -> tuple[float, float, float, float, int]:
    """Build a new worker's first request; returns the seconds of each step and the turn count."""
    t0 = time.perf_counter()
    history = SessionHistory(gateway, session_id)
    history.sync()  # Turn._heal
    history.unanswered()
    history.sync()  # Turn._turns
    t1 = time.perf_counter()
    root = next(m for m in reversed(history.messages) if m.role is Role.USER)
    turns = history.turns(root)
    t2 = time.perf_counter()
    problems = history.checker.check(turns)
    t3 = time.perf_counter()
    Compactor(gateway.store, CompactionPolicy()).estimate(turns, 1000.0)
    t4 = time.perf_counter()
    history.close()
    if problems:
        raise AssertionError(problems)
    return t1 - t0, t2 - t1, t3 - t2, t4 - t3, len(turns)


def history_read(store: Store, session_id: str) -> float:
    """The bare read of the session in history order, as Messages."""
    t0 = time.perf_counter()
    store.history(session_id)
    return time.perf_counter() - t0


def replay_read(store: Store, session_id: str, batch: int) -> float:
    """The bare read a listener does from cursor 0: every row of the session, as Messages."""
    flt = MessageFilter.from_kwargs({"session_id": session_id})
    t0 = time.perf_counter()
    after = 0
    while rows := store.messages_after(after, flt, limit=batch):
        after = rows[-1].id
    return time.perf_counter() - t0


def main() -> None:
    args = options(__doc__)
    with tempfile.TemporaryDirectory() as tmp:
        _, session_id, store = built(tmp, args.messages)
        gateway = Gateway(store, Path(tmp) / "sessions")
        reads: list[float] = []
        replays: list[float] = []
        steps: list[tuple[float, float, float, float]] = []
        turns = 0
        for _ in range(args.rounds):
            reads.append(history_read(store, session_id))
            replays.append(replay_read(store, session_id, gateway.listener_buffer))
            *split, turns = first_request(gateway, session_id)
            steps.append((split[0], split[1], split[2], split[3]))
        store.close()
    sync, transcript, check, estimate = (median(list(s)) * 1e3 for s in zip(*steps, strict=True))
    total = median([sum(s) for s in steps]) * 1e3
    print(
        f"context benchmark: first request of a new worker, {args.messages:,} messages "
        f"({turns:,} turns), medians of {args.rounds}"
    )
    report("bare store read: Store.history -> Message", median(reads) * 1e3, "ms")
    report("bare store read: listener replay from 0 -> Message", median(replays) * 1e3, "ms")
    report("first request, total", total, "ms", "<= 30 ms")
    report("  1. history sync (store read, history order, open calls)", sync, "ms")
    report("  2. transcript (history.turns)", transcript, "ms")
    report("  3. checker (TurnChecker.check)", check, "ms")
    report("  4. size estimate (Compactor.estimate)", estimate, "ms")


if __name__ == "__main__":
    main()
