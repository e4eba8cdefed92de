"""Idle sessions: memory per conversation while 1,000 are held live, and once they went idle.

Run: .venv/bin/python bench/idle_bench.py [--sessions N] [--rounds R] [--owners]

One process, a real SQLite file, the runtime as the daemon builds it (its dispatcher scoped by
:func:`kesoku.host.build.daemon_serves`; no adapters, no turn logs).
Every conversation does one turn of one tool round trip (user message → the model calls ``echo``
→ the tool answers → the model answers; the scripted model decides from the request, keeping no
copy of it). Then:

1. **held**: all N conversations answered, every worker still live (``agent.worker_idle_s`` not
   yet passed): a worker task, its session history (messages, transcript, listener), its compactor,
   its guard and the lock.
2. **idle**: the trio clock jumps past ``worker_idle_s``: the workers return and shed what they
   held. What remains is what every conversation that ever spoke costs the process.
3. **resumed**: every conversation speaks again; its worker reloads its history from the store. The
   bench checks the model's request holds the first turn (user, tool call, tool result, answer),
   then times the resume against the first turn.

Memory per conversation is measured two ways, each against a baseline taken after a warm-up round
(the same cycle on other sessions, so caches filled once are not counted), after ``gc.collect()``:

- **tracemalloc**: bytes Python allocated and still holds (``get_traced_memory()[0]``). The goal
  (<= 2 KB per idle conversation, 1,000 held) is measured by this figure: it counts only what the
  process keeps, and it is the same from run to run.
- **RSS**: ``/proc/self/statm``'s resident pages. It includes SQLite's page cache and allocator
  slack; CPython keeps freed small objects in its arenas, so RSS rarely drops when conversations go
  idle, and later rounds reuse what earlier ones freed: the first round's figure is printed.

With ``--owners`` the idle state's memory is broken down by the kesoku (or trio) line that
allocated it (tracemalloc with 30 frames: slower, so the timings of that run are not comparable).
Several rounds (``--rounds``) print each figure's median.

Last, the latency of one session's next message by history length (``--history``): post to model
call with its worker live, then after it went idle (the history read again). These run with
tracemalloc off: on, it slows every allocation several-fold (a 4,000-message resume 120 ms, not 20).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import trio
import trio.testing
from kesoku.agent.runtime import Runtime
from kesoku.gateway import Gateway
from kesoku.host.build import ScopedDispatcher, daemon_serves
from kesoku.llm.scripted import ScriptedLLM
from kesoku.store import Store
from kesoku.tools.base import Tool, ToolContext
from kesoku.vocab.ir import LLMRequest, TextBlock, ToolResultBlock
from kesoku.vocab.model import Kind, Metadata, Outcome, Role, Session, Status, in_turn, user_text

from _util import median, report

IDLE_S = 600.0
"""``agent.worker_idle_s`` of the bench's runtime (its default)."""
WARMUP = 50
"""Conversations run through a whole cycle before the baseline."""
_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    """Resident bytes of this process."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def traced() -> int:
    """Bytes tracemalloc sees held, after a full collection."""
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


class Model:
    """Calls ``echo`` once per user message, answers once its result is in; keeps no request.

    Attributes:
        resumed_turns: For each call answering "again" (a resumed conversation's), the number of
            turns in its request: 5 when the first turn was reloaded whole.
    """

    def __init__(self) -> None:
        self.resumed_turns: list[int] = []
        self.called_at = 0.0
        """perf_counter() at the last call."""

    def __call__(self, request: LLMRequest) -> Mapping[str, Any]:
        self.called_at = time.perf_counter()
        last = request.turns[-1]
        if any(isinstance(b, ToolResultBlock) for b in last.blocks):
            return {"text": "done.", "usage": {"input_tokens": 100, "output_tokens": 5}}
        if any(isinstance(b, TextBlock) and b.text == "again" for b in last.blocks):
            self.resumed_turns.append(len(request.turns))
        return {"tool_calls": [{"name": "echo", "arguments": {"text": "hi"}}]}


def echo_tool() -> Tool:
    async def run(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        await trio.lowlevel.checkpoint()
        return str(arguments.get("text", ""))

    return Tool("echo", "Repeat the text.", run)


class Bench:
    def __init__(self, folder: Path, clock: trio.testing.MockClock) -> None:
        self.clock = clock
        self.store = Store(folder / "kesoku.db")
        self.gateway = Gateway(self.store, folder / "sessions")
        self.model = Model()
        self.llm = ScriptedLLM(responder=self.model, record_requests=False)
        self.rt = Runtime(self.gateway, self.llm, tools=[echo_tool()], worker_idle_s=IDLE_S)
        self.rt.dispatcher = ScopedDispatcher(self.rt, daemon_serves(self.store))

    async def speak(self, sessions: list[Session], text: str) -> float:
        """Post one message to each session; wait until every turn ended; the seconds it took."""
        started = time.perf_counter()
        posted = [await self.gateway.post(user_text(session.id, text)) for session in sessions]
        # Polled, not counted from the hub: a subscriber's bounded buffer drops events in a burst.
        # Each posted message by its id: a scan of the table (or of a session's index) here held
        # the trio thread, and so the worker timed, several ms at 10,000 messages.
        workers = self.rt.dispatcher.workers
        open_ = (Status.PENDING, Status.PROCESSING)
        while any(  # noqa: ASYNC110
            (m := self.store.get_message(p.id)) is not None and m.status in open_ for p in posted
        ) or any(w.turn is not None or w.pending for w in workers.values()):
            await trio.sleep(0.001)
        return time.perf_counter() - started

    async def idle(self) -> None:
        """Let ``worker_idle_s`` pass; wait until every worker has returned."""
        self.clock.jump(IDLE_S + 1)
        while self.rt.dispatcher.workers:  # noqa: ASYNC110 -- the workers return on their own
            await trio.sleep(0.01)

    def open_sessions(self, count: int, prefix: str) -> list[Session]:
        return [self.gateway.open_session("bench", f"{prefix}{i}") for i in range(count)]


async def one_round(folder: Path, sessions: int, owners: bool) -> dict[str, float]:
    figures: dict[str, float] = {}
    clock = trio.lowlevel.current_clock()  # main() runs trio with a MockClock, to jump idle time
    assert isinstance(clock, trio.testing.MockClock)
    bench = Bench(folder, clock)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(bench.rt.serve)
            warm = bench.open_sessions(WARMUP, "warm")
            await bench.speak(warm, "hello")
            await bench.idle()
            await bench.speak(warm, "again")
            await bench.idle()
            convs = bench.open_sessions(sessions, "c")
            del warm
            base_t, base_r = traced(), rss()
            base = tracemalloc.take_snapshot() if owners else None
            first_s = await bench.speak(convs, "hello")
            held_t, held_r = traced(), rss()
            if base is not None:
                print_owners("held", tracemalloc.take_snapshot(), base, sessions)
            await bench.idle()
            idle_t, idle_r = traced(), rss()
            if base is not None:
                print_owners("idle", tracemalloc.take_snapshot(), base, sessions)
            resume_s = await bench.speak(convs, "again")
            check_resumed(bench, convs)
            await bench.idle()
            again_t = traced()
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(bench.store.close)
    n = sessions
    figures["held, tracemalloc"] = (held_t - base_t) / n
    figures["idle, tracemalloc"] = (idle_t - base_t) / n
    figures["idle after a second turn, tracemalloc"] = (again_t - base_t) / n
    figures["held, RSS"] = (held_r - base_r) / n
    figures["idle, RSS"] = (idle_r - base_r) / n
    figures["first turn, per conversation"] = first_s / n * 1000
    figures["resumed turn (history reloaded), per conversation"] = resume_s / n * 1000
    return figures


def seed_history(store: Store, session: Session, rounds: int) -> None:
    """``rounds`` answered turns of one tool round trip each, written to the store directly."""
    for i in range(rounds):
        user = store.insert_messages([user_text(session.id, f"question {i} " + "x" * 80)])
        root = user[0].message
        store.set_status([root.id], Status.DONE)
        meta = Metadata(tool_name="echo", tool_arguments={"text": "hi"}, call_id=f"call_{i}")
        call = store.insert_messages(
            [in_turn(root, Role.ASSISTANT, Kind.TOOL_CALL, "echo(text='hi')", metadata=meta)]
        )[0].message
        result = in_turn(
            root,
            Role.TOOL,
            Kind.TOOL_RESULT,
            "hi " * 100,
            parent_id=call.id,
            metadata=Metadata(tool_name="echo", call_id=f"call_{i}", outcome=Outcome.COMPLETED),
        )
        store.insert_messages([result, in_turn(root, Role.ASSISTANT, Kind.TEXT, "done. " * 30)])


async def resume_latency(folder: Path, rounds: int) -> tuple[float, float]:
    """Post → model call of a session of ``4 * rounds`` messages: live worker, then resumed (ms)."""
    clock = trio.lowlevel.current_clock()
    assert isinstance(clock, trio.testing.MockClock)
    bench = Bench(folder, clock)
    session = bench.open_sessions(1, "long")[0]
    seed_history(bench.store, session, rounds)
    figures: list[float] = []
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(bench.rt.serve)
            await bench.speak([session], "warm")  # the worker loads the history once
            for _ in range(2):
                posted = time.perf_counter()
                await bench.speak([session], "again")
                figures.append((bench.model.called_at - posted) * 1000)
                await bench.idle()  # the second post finds no worker: it resumes
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(bench.store.close)
    return figures[0], figures[1]


def check_resumed(bench: Bench, convs: list[Session]) -> None:
    """Every resumed conversation's request held its first turn; both turns are in the store."""
    calls = bench.model.resumed_turns[-len(convs) :]
    if len(calls) != len(convs) or set(calls) != {5}:
        raise SystemExit(f"the resumed requests' turns: {sorted(set(calls))} (5 expected)")
    for session in convs:
        history = bench.store.history(session.id)
        # user, tool call, tool result, answer; twice
        if len(history) != 8 or history[3].content != "done." or history[7].content != "done.":
            raise SystemExit(f"session {session.id}: history after resuming: {history!r}")


def print_owners(
    state: str, snapshot: tracemalloc.Snapshot, base: tracemalloc.Snapshot, n: int
) -> None:
    """Memory grown since the baseline, by the deepest kesoku or trio line that allocated it."""
    by_owner: dict[str, int] = {}
    for stat in snapshot.compare_to(base, "traceback"):
        frames = [f for f in stat.traceback if "/kesoku/" in f.filename or "/trio/" in f.filename]
        frame = frames[-1] if frames else stat.traceback[-1]
        where = f"{frame.filename.split('site-packages/')[-1].split('/main/')[-1]}:{frame.lineno}"
        by_owner[where] = by_owner.get(where, 0) + stat.size_diff
    total = sum(by_owner.values())
    print(f"{state}: {total / n:,.0f} bytes per conversation; the largest owners:")
    for where, size in sorted(by_owner.items(), key=lambda kv: -abs(kv[1]))[:20]:
        print(f"  {size / n:>10,.1f}  {where}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--owners", action="store_true", help="break the idle memory down")
    parser.add_argument(
        "--history",
        type=int,
        nargs="*",
        default=[4, 400, 4000],
        help="history lengths (messages) to time a resume at",
    )
    args = parser.parse_args()
    tracemalloc.start(30 if args.owners else 1)
    rounds: list[dict[str, float]] = []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="kesoku-idle-bench-") as tmp:
            clock = trio.testing.MockClock(rate=1.0)
            rounds.append(trio.run(one_round, Path(tmp), args.sessions, args.owners, clock=clock))
    print(
        f"{args.sessions:,} conversations, one tool round trip each, worker_idle_s {IDLE_S:g}; "
        f"medians of {args.rounds} round(s)"
    )
    for name in rounds[0]:
        unit = "ms" if "turn" in name and "tracemalloc" not in name else "bytes"
        target = "<= 2,048" if name == "idle, tracemalloc" else ""
        # RSS: the first round's only; later rounds reuse the memory earlier ones freed.
        value = rounds[0][name] if "RSS" in name else median([r[name] for r in rounds])
        report(name, value, unit, target)
    # tracemalloc slows every allocation several-fold: a 4,000-message resume read ~120 ms with it
    # on, ~20 ms without
    tracemalloc.stop()
    print("post → model call, one session, by history length (live worker / resumed):")
    for length in args.history:
        runs = []
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory(prefix="kesoku-idle-bench-") as tmp:
                clock = trio.testing.MockClock(rate=1.0)
                runs.append(trio.run(resume_latency, Path(tmp), length // 4, clock=clock))
        report(f"  {length:,} messages, live worker", median([r[0] for r in runs]), "ms")
        report(f"  {length:,} messages, resumed", median([r[1] for r in runs]), "ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
