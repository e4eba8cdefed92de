"""History benchmark: read a 10,000-message session in logical order, next to the raw apsw query.

Run: .venv/bin/python bench/history_bench.py [--messages N] [--rounds R]

Target (issue 2): store.history() of 10,000 messages <= 30 ms (median).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import apsw
from kesoku.store import Store
from kesoku.vocab.model import Kind, Metadata, Outcome, Role, in_turn, user_text

from _util import median, report


def build(path: Path, n: int) -> str:
    """Write n messages as turns of user text, a tool call with arguments and its result."""
    store = Store(path)
    session = store.create_session("bench", "c", workspace_root=path.parent)
    written = 0
    while written < n:
        [root] = [
            i.message for i in store.insert_messages([user_text(session.id, f"question {written}")])
        ]
        call = in_turn(
            root,
            Role.ASSISTANT,
            Kind.TOOL_CALL,
            "",
            metadata=Metadata(tool_name="sh", tool_arguments={"cmd": "ls"}),
        )
        [call] = [i.message for i in store.insert_messages([call])]
        meta = Metadata(tool_name="sh", outcome=Outcome.COMPLETED)
        store.insert_messages(
            [
                in_turn(
                    root,
                    Role.TOOL,
                    Kind.TOOL_RESULT,
                    "a.txt\nb.txt",
                    parent_id=call.id,
                    metadata=meta,
                )
            ]
        )
        written += 3
    store.close()
    return session.id


def built(tmp: str, messages: int) -> tuple[Path, str, Store]:
    """A database in ``tmp`` with one session of ``messages`` messages (:func:`build`), opened.

    Returns:
        (its path, the session's id, the store).
    """
    path = Path(tmp) / "k.db"
    session_id = build(path, messages)
    return path, session_id, Store(path)


def options(doc: str | None) -> argparse.Namespace:
    """``--messages`` (10,000) and ``--rounds`` (21), for a benchmark over one long session."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=21)
    return parser.parse_args()


def main() -> None:
    args = options(__doc__)
    with tempfile.TemporaryDirectory() as tmp:
        path, session_id, store = built(tmp, args.messages)
        raw = apsw.Connection(str(path))
        ours, bare = [], []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            history = store.history(session_id)
            ours.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            rows = raw.execute(
                "SELECT * FROM messages WHERE session_id = ? ORDER BY root_ts, ts, id",
                (session_id,),
            ).fetchall()
            bare.append(time.perf_counter() - t0)
        print(
            f"history benchmark: {len(history):,} messages ({len(rows):,} raw rows), "
            f"medians of {args.rounds}"
        )
    report("raw apsw SELECT in (root_ts, ts, id) order", median(bare) * 1e3, "ms")
    report("store.history() -> Message structs", median(ours) * 1e3, "ms", "<= 30 ms")
    report("  ratio to raw", median(ours) / median(bare), "x")


if __name__ == "__main__":
    main()
