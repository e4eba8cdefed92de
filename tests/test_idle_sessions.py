"""Idle sessions shed their worker, listener and cached history, and resume from the store.

A session is idle once nothing waits for its worker (no turn, no queued message, no ``/compact``)
for ``agent.worker_idle_s``: the worker returns, its history stops following the gateway and is
freed, and the lock is released. What the worker's compactor learned (the calibration ratio, a
summary cooldown) is all the process keeps. The next message starts a new worker that reloads the
history, the compacted view and the taint from the store.
"""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import trio
from runtime_harness import echo, serve_runtime
from test_compaction import SMALL_WINDOW, policy, seed, views

from kesoku.agent.dispatcher import LEARNED_SESSIONS, Dispatcher
from kesoku.store.locks import SessionLocks
from kesoku.testing import ScriptedLLM
from kesoku.vocab.ir import LLMRequest, TextBlock, ToolCallBlock, ToolResultBlock
from kesoku.vocab.model import TaintSource

IDLE_S = 60.0


def one_round_trip(request: LLMRequest) -> dict[str, object]:
    """Call ``echo`` once per user message; answer when its result is in the request."""
    if any(isinstance(b, ToolResultBlock) for b in request.turns[-1].blocks):
        return {"text": "done.", "usage": {"input_tokens": 2 * 400, "output_tokens": 5}}
    return {"tool_calls": [{"name": "echo", "arguments": {"text": "hi"}}]}


def blocks(request: LLMRequest) -> list[str]:
    """The request's turns as ``role:kind`` of each block, in order."""
    names = {TextBlock: "text", ToolCallBlock: "tool_call", ToolResultBlock: "tool_result"}
    return [f"{t.role}:{names[type(b)]}" for t in request.turns for b in t.blocks]


async def wait_idle(dispatcher: Dispatcher) -> None:
    with trio.fail_after(IDLE_S * 10):
        while dispatcher.workers:  # noqa: ASYNC110 -- the workers return on their own
            await trio.sleep(1)


async def test_an_idle_session_sheds_its_worker_listener_history_and_lock_and_resumes_whole(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    llm = ScriptedLLM(responder=one_round_trip)
    async with serve_runtime(tmp_path, llm, tools=[echo()], worker_idle_s=IDLE_S) as h:
        sid = h.session.id
        await h.say("hello")
        await h.turn_end()
        worker = h.rt.dispatcher.workers[sid]
        learned = worker.compactor.calibration.ratio
        history = weakref.ref(worker.history)
        assert sid in h.gateway._by_session  # its history follows the session's posts
        assert not SessionLocks(tmp_path / "sessions" / ".locks").acquire(sid)
        del worker
        await trio.sleep(IDLE_S - 1)
        assert sid in h.rt.dispatcher.workers  # not idle long enough yet
        await trio.sleep(2)
        assert h.rt.dispatcher.workers == {}
        assert sid not in h.gateway._by_session
        assert h.gateway._fanout and all(  # only the dispatcher's own listener of every session
            ref() is not None and ref().filter.session_id is None  # type: ignore[union-attr]
            for ref in h.gateway._fanout
        )
        assert sid not in h.gateway.locks._held
        gc.collect()
        assert history() is None  # the cached messages and transcript are freed
        ((kept, (ratio, cooldown)),) = h.rt.dispatcher.learned.items()
        # the model counts more tokens than estimated; no cooldown runs
        assert kept == sid and ratio > 1.0 and cooldown == 0.0
        other = SessionLocks(tmp_path / "sessions" / ".locks")
        assert other.acquire(sid)  # another process could take the session now
        other.close()

        h.store.add_taint(sid, [TaintSource("url", "https://example.com")])
        await h.say("again")
        await h.turn_end()
        resumed = h.rt.dispatcher.workers[sid]
        assert resumed.guard.tainted  # reloaded from the store
        assert h.rt.dispatcher.learned == {}
        assert resumed.compactor.calibration.ratio == learned
    first_turn = ["user:text", "assistant:tool_call", "user:tool_result", "assistant:text"]
    assert blocks(llm.requests[-2]) == [*first_turn, "user:text"]
    assert llm.requests[-2].turns[0].blocks[0] == TextBlock("hello")
    assert blocks(llm.requests[-1]) == [*first_turn, *first_turn[:3]]


async def test_a_worker_with_work_left_is_not_idle(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    llm = ScriptedLLM(responder=one_round_trip)
    async with serve_runtime(tmp_path, llm, tools=[echo()], worker_idle_s=IDLE_S) as h:
        sid = h.session.id
        await h.say("hello")
        await h.turn_end()
        await trio.sleep(IDLE_S - 1)
        assert h.rt.dispatcher.compact(sid)  # /compact on the live worker restarts its idle time
        await trio.sleep(IDLE_S - 1)
        assert sid in h.rt.dispatcher.workers
        await wait_idle(h.rt.dispatcher)
        assert h.rt.dispatcher.compact(sid)  # ...and on a shed session starts a worker for it
        assert sid in h.rt.dispatcher.workers
        await wait_idle(h.rt.dispatcher)


async def test_a_compacted_view_and_a_summary_cooldown_outlive_the_worker(tmp_path: Path) -> None:
    llm = ScriptedLLM(
        [{"error": {"message": "overloaded", "status": 400}}, {"text": "done"}, {"text": "two"}]
    )
    async with serve_runtime(
        tmp_path, llm, compaction=policy(SMALL_WINDOW), worker_idle_s=0.2
    ) as h:
        await seed(h, 160, result_chars=50, user_chars=100)
        await h.say("latest")
        await h.turn_end()
        view = views(h)
        assert view is not None and 2 in view.stages  # the summary failed: a cooldown runs
        with trio.fail_after(30):
            while h.rt.dispatcher.workers:  # noqa: ASYNC110 -- the worker returns on its own
                await trio.sleep(0.05)
        _, cooldown = h.rt.dispatcher.learned[h.session.id]
        assert cooldown > trio.current_time()
        await h.say("again")
        await h.turn_end()
    # No second summary attempt during the cooldown, and the resumed request is under the view.
    assert len(llm.requests) == 3
    head = llm.requests[2].turns[0].blocks[0]
    assert isinstance(head, TextBlock) and head.text.startswith("[Compacted context")
    assert llm.requests[2].turns[-1].blocks[-1] == TextBlock("again")


def test_what_returned_workers_learned_is_bounded() -> None:
    keep = Dispatcher._keep_learned
    dispatcher = Dispatcher.__new__(Dispatcher)
    dispatcher.learned = {}
    for i in range(LEARNED_SESSIONS + 2):
        keep(dispatcher, f"s{i}", (1.5, 0.0))
    keep(dispatcher, "nothing learned", None)
    assert len(dispatcher.learned) == LEARNED_SESSIONS
    assert "s0" not in dispatcher.learned and "s1" not in dispatcher.learned  # the oldest went
    assert f"s{LEARNED_SESSIONS + 1}" in dispatcher.learned
