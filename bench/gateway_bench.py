"""Gateway benchmark: post throughput and latency with 3 listeners, next to raw apsw commits.

Run: .venv/bin/python bench/gateway_bench.py [--posts N] [--rounds R] [--post-yield-ms MS]

Prints medians over R rounds. Targets: >= 25,000 durable posts/s with 3 listeners AND >= 0.65 of raw
apsw commits in the same run (issue 24; the last line says whether this run met both), p99 post <= 1
ms (issue 2), a message from another process delivered with p99 <= 5 ms (issue 24: woken, not
polled; bench/wakeup_bench.py measures it over more posts).

The store's own insert, without the gateway, is printed too: it is the ceiling of the gateway's rate
(the commit of a message writes 3 to 4 WAL frames, raw apsw's 2).

What a posting loop costs the other tasks: in a round of its own, a bystander task that only
yields measures how long it waits to run again while the loop posts (p99 and largest). A posting
loop yields every ``post_yield_s`` (``--post-yield-ms``, default the gateway's ``POST_YIELD_S``),
and the listeners it woke run before the bystander does.

Where the files are changes the ratio: on tmpfs (``TMPDIR=/dev/shm``) raw apsw's inline checkpoints
need no fsync and it commits ~3x faster than on disk, while the store checkpoints on its own thread
either way. 2026-12-03, 2 cores, 3 alternating runs of each, medians: tmpfs, raw 57-62k commits/s,
store alone 0.38-0.40 of it, gateway 0.26-0.28; disk (/tmp), raw 19-20k, store alone 0.87-0.98,
gateway 0.68-0.70. The store's commit writes 3 frames (table leaf, ``messages_history`` leaf,
``sqlite_sequence``), more on page splits: 3.9 on average against raw's 2.0.

Why ``POST_YIELD_S`` stays 0.5 ms (same runs, tmpfs; 0.5 / 1 / 2 ms): the bystander's wait p99
1.3 / 2.4 / 4.5 ms, post p99 151 / 218 / 253 µs, the gateway's rate within the noise (16.2k / 13.8k
/ 15.5k posts/s); the trio thread's CPU per post, lowest of 9 alternating rounds, 56.6 / 55.0 / 53.7
µs. A longer slice saves 3-5 % of a post's CPU and makes every other task wait 2-4x longer behind a
posting loop. The interrupt latency of bench/runtime_bench.py does not move (its posts are alone,
so each yields): post to new model call p99 2.1 / 2.3 / 2.1 ms.

Why a waiting listener parks its task with ``trio.lowlevel.wait_task_rescheduled`` (and a post
reschedules it) rather than waiting on a ``trio.Event`` made per wait: 2026-12-02, 2 cores, 3
alternating runs of each, medians: 9,816 posts/s and a p99 post of 250 µs parked, against 9,087
posts/s (-7%) and 271 µs with an Event.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import apsw
import trio
from kesoku.gateway import POLL_INTERVAL_S, POST_YIELD_S, Gateway, Listener
from kesoku.store import Store
from kesoku.vocab.model import Role, user_text

from _util import median, pct, report
from wakeup_bench import cross_process_delays


def file_system(path: Path) -> str:
    """The type of the file system holding path (``tmpfs``, ``ext4``...), from /proc/mounts."""
    try:
        with open("/proc/mounts", encoding="utf-8") as mounts:
            # "device mount-point type options 0 0"; the longest mount point above path holds it.
            found = [line.split()[1:3] for line in mounts]
    except OSError:
        return "unknown"
    above = [(mount, kind) for mount, kind in found if path.is_relative_to(mount)]
    return max(above, key=lambda item: len(item[0]))[1] if above else "unknown"


def raw_apsw_commits(path: Path, n: int) -> float:
    """Single-row autocommit INSERTs into a table shaped like messages; returns commits/s."""
    conn = apsw.Connection(str(path))
    conn.set_busy_timeout(5000)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute(
        "CREATE TABLE m (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT, role TEXT,"
        " kind TEXT, status TEXT, sender TEXT, content TEXT, root_id INTEGER, parent_id INTEGER,"
        " ts REAL, root_ts REAL, metadata BLOB, adapter TEXT, external_id TEXT)"
    )
    sql = (
        "INSERT INTO m VALUES (NULL, ?, 'user', 'text', 'pending', 'User', ?, 0, NULL, ?, ?, '{}', "
        "'bench', NULL)"
    )
    start = time.perf_counter()
    for i in range(n):
        now = time.time()
        conn.execute(sql, ("s", f"message {i}", now, now))
    elapsed = time.perf_counter() - start
    conn.close()
    return n / elapsed


def store_inserts(path: Path, n: int) -> float:
    """Store.insert_messages of n messages one by one, no gateway; returns inserts/s."""
    store = Store(path)
    session = store.create_session("bench", "c", workspace_root=path.parent / "sessions")
    messages = [(user_text(session.id, f"message {i}"),) for i in range(n)]
    start = time.perf_counter()
    for one in messages:
        store.insert_messages(one)
    elapsed = time.perf_counter() - start
    store.close()
    return n / elapsed


async def gateway_round(
    path: Path, n: int, post_yield_s: float, waits: list[float] | None = None
) -> tuple[float, list[float], int]:
    """Post n messages with 3 listeners consuming (and a bystander task when ``waits`` is a list).

    Returns (posts/s, post latencies in s, max buffered); the bystander's waits go into ``waits``,
    in s.
    """
    gateway = Gateway(Store(path), path.parent / "sessions", post_yield_s=post_yield_s)
    session = gateway.open_session("bench", "c")
    done = trio.Event()
    remaining = [3]

    async def consume(listener: Listener) -> None:
        count = 0
        async for _ in listener:
            count += 1
            if count == n:
                break
        remaining[0] -= 1
        if not remaining[0]:
            done.set()

    async def bystander(waits: list[float]) -> None:
        while not done.is_set():
            t0 = time.perf_counter()
            await trio.lowlevel.checkpoint()
            waits.append(time.perf_counter() - t0)

    listeners_filters: list[dict[str, Any]] = [{}, {"role": Role.USER}, {"session_id": session.id}]
    latencies: list[float] = []
    async with trio.open_nursery() as nursery:
        listeners = [gateway.listen(**filters) for filters in listeners_filters]
        for listener in listeners:
            nursery.start_soon(consume, listener)
        if waits is not None:
            nursery.start_soon(bystander, waits)
        messages = [user_text(session.id, f"message {i}") for i in range(n)]
        start = time.perf_counter()
        for msg in messages:
            t0 = time.perf_counter()
            await gateway.post(msg)
            latencies.append(time.perf_counter() - t0)
        await done.wait()
        elapsed = time.perf_counter() - start
    biggest = max(listener.max_buffered for listener in listeners)
    gateway.store.close()
    return n / elapsed, latencies, biggest


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--posts", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--post-yield-ms", type=float, default=POST_YIELD_S * 1e3, help="the gateway's post_yield_s"
    )
    args = parser.parse_args()
    post_yield_s = args.post_yield_ms / 1e3
    raw, alone, rates, p50s, p99s, buffered = [], [], [], [], [], []
    wait_p99s, wait_maxes = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            raw.append(raw_apsw_commits(Path(tmp) / f"raw{r}.db", args.posts))
            alone.append(store_inserts(Path(tmp) / f"st{r}" / "k.db", args.posts))
            rate, latencies, biggest = trio.run(
                gateway_round, Path(tmp) / f"gw{r}" / "k.db", args.posts, post_yield_s
            )
            waits: list[float] = []
            trio.run(
                gateway_round, Path(tmp) / f"by{r}" / "k.db", args.posts // 4, post_yield_s, waits
            )
            wait_p99s.append(pct(waits, 99))
            wait_maxes.append(max(waits))
            rates.append(rate)
            p50s.append(pct(latencies, 50))
            p99s.append(pct(latencies, 99))
            buffered.append(biggest)
        delays = trio.run(cross_process_delays, Path(tmp) / "xp" / "k.db", 300, POLL_INTERVAL_S)
        where = f"{tmp} ({file_system(Path(tmp).resolve())})"
    print(
        f"gateway benchmark: {args.posts:,} posts x {args.rounds} rounds, "
        f"post_yield_s {args.post_yield_ms:g} ms, files in {where}, "
        f"medians (Python {sys.version.split()[0]})"
    )
    report("raw apsw single-row commits (WAL, synchronous=NORMAL)", median(raw), "commits/s")
    report("store.insert_messages alone (no gateway)", median(alone), "inserts/s")
    report("  ratio to raw apsw commits", median(alone) / median(raw), "x")
    report(
        "gateway.post with 3 listeners receiving everything", median(rates), "posts/s", ">= 25,000"
    )
    ratio = median(rates) / median(raw)
    report("  ratio to raw apsw commits", ratio, "x", ">= 0.65")
    report("gateway.post latency p50", median(p50s) * 1e6, "µs")
    report("gateway.post latency p99", median(p99s) * 1e6, "µs", "<= 1,000 µs")
    report("largest listener buffer seen", max(buffered), "messages")
    report("a bystander task's wait behind the posting loop, p99", median(wait_p99s) * 1e6, "µs")
    report("a bystander task's wait behind the posting loop, max", median(wait_maxes) * 1e6, "µs")
    report("another process's post -> listener, p50", pct(delays, 50) * 1e3, "ms")
    report("another process's post -> listener, p99", pct(delays, 99) * 1e3, "ms", "<= 5 ms")
    both = median(rates) >= 25_000 and ratio >= 0.65
    print(f"both throughput goals (>= 25,000 posts/s and >= 0.65 of raw) in this run: {both}")


if __name__ == "__main__":
    main()
