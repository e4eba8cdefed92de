"""Progressive compaction through the runtime, on long synthetic sessions in a real SQLite store.

The model is scripted; the context window is made small through the policy so a few hundred
messages are "long". Every test checks the request the model received (the active task verbatim,
the invariant) and what the store holds afterwards (the log untouched, one view state or none).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import msgspec
import trio
import trio.testing
from runtime_harness import Harness, close_store, echo, serve_runtime

from kesoku.agent.compaction.compactor import SHORTEN_MIN_CHARS, CompactionPolicy
from kesoku.agent.compaction.tokens import (
    DOCUMENT_TOKENS,
    IMAGE_TOKENS,
    TurnSizes,
    estimate_request,
    estimate_turns,
)
from kesoku.agent.turn import COMPACTION_RETRY_GROWTH
from kesoku.llm.claude import ClaudeLLM
from kesoku.testing import ScriptedLLM
from kesoku.testing.fakes.anthropic_api import AnthropicFake, ErrorReply, Reply, Text
from kesoku.vocab.events import Compacted, ToolStarted, TurnEnded
from kesoku.vocab.ir import (
    DocumentBlock,
    ImageBlock,
    LLMRequest,
    LLMTurn,
    TextBlock,
    ThoughtBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from kesoku.vocab.metrics import TurnState
from kesoku.vocab.model import Kind, Metadata, Outcome, Role, Status, in_turn, user_text
from kesoku.vocab.transcript import check_turns
from kesoku.vocab.view import ViewState

WINDOW = 20_000
"""Tokens of the scripted model's window in these tests (threshold 0.85: 17,000)."""


SMALL_WINDOW = 8_000
"""For the tests that need the archive lines themselves to be too long: fewer turns do it."""


def policy(window: int = WINDOW) -> CompactionPolicy:
    return CompactionPolicy(windows=(("scripted", window),))


async def seed(h: Harness, turns: int, *, result_chars: int = 3000, user_chars: int = 40) -> None:
    """Write ``turns`` finished turns: question, read_file call, its (long) result, answer."""
    for i in range(turns):
        root = await h.gateway.post(
            msgspec.structs.replace(
                user_text(h.session.id, f"question {i}: " + "q" * user_chars), status=Status.DONE
            )
        )
        meta = Metadata(
            tool_name="read_file", tool_arguments={"path": f"notes/{i}.txt"}, call_id=f"c{i}"
        )
        call = await h.gateway.post(
            in_turn(root, Role.ASSISTANT, Kind.TOOL_CALL, f"read_file {i}", metadata=meta)
        )
        result_meta = Metadata(tool_name="read_file", call_id=f"c{i}", outcome=Outcome.COMPLETED)
        body = f"result {i} " + "r" * result_chars
        await h.gateway.post(
            in_turn(
                root, Role.TOOL, Kind.TOOL_RESULT, body, parent_id=call.id, metadata=result_meta
            )
        )
        await h.gateway.post(in_turn(root, Role.ASSISTANT, Kind.TEXT, f"answer {i}"))


async def next_compacted(h: Harness) -> Compacted:
    async for event in h.events:
        if isinstance(event, Compacted):
            return event
    raise AssertionError("event stream closed")


async def requests_made(llm: ScriptedLLM, count: int) -> None:
    """Wait until the model has received ``count`` requests.

    Compaction plans in a worker thread; under the autojump clock virtual time jumps ahead while it
    runs, so a test waits for the call itself rather than for a virtual delay.
    """
    while len(llm.requests) < count:  # noqa: ASYNC110 -- the scripted model has no event to wait on
        await trio.sleep(0.01)


def tokens(request: LLMRequest) -> float:
    return estimate_request(request)


def views(h: Harness) -> ViewState | None:
    data = h.store.latest_view_state(h.session.id)
    return ViewState.decode(data) if data is not None else None


async def test_evicting_long_results_is_enough_and_the_active_task_stays(tmp_path: Path) -> None:
    llm = ScriptedLLM([{"text": "done"}])
    async with serve_runtime(tmp_path, llm, compaction=policy()) as h:
        # ~50 × 390 tokens, mostly results under 2,000 chars: stubs
        await seed(h, 50, result_chars=1500)
        count = len(h.history())
        await h.say("the new request, verbatim")
        metrics = await h.turn_end()
        view = views(h)
        assert len(h.history()) == count + 2  # the log is only appended to
    assert metrics.state is TurnState.DONE
    assert view is not None and view.stages == (1,)
    assert view.tokens_before > 17_000 > view.tokens_after
    request = llm.requests[0]
    assert tokens(request) < 0.85 * WINDOW
    assert check_turns(request.turns) == []
    assert request.turns[-1].blocks[-1] == TextBlock("the new request, verbatim")
    text = repr(request.turns)
    assert "[evicted to save context" in text
    assert "result 49 " + "r" * 100 in text  # the newest turns keep their results whole


async def test_archive_lines_then_a_model_summary(tmp_path: Path) -> None:
    llm = ScriptedLLM(
        [{"text": "## Notes\n- questions 0-159 were about notes/N.txt"}, {"text": "done"}]
    )
    async with serve_runtime(tmp_path, llm, compaction=policy(SMALL_WINDOW)) as h:
        # many small turns: only a summary is small enough
        await seed(h, 160, result_chars=50, user_chars=100)
        await h.say("latest")
        await h.turn_end()
        view = views(h)
    assert view is not None and view.stages == (1, 2, 3)
    assert [a.kind for a in view.archives] == ["summary"]
    summary_request, request = llm.requests
    assert summary_request.tools == ()
    assert "Turn 1: intent=question 0: qqq" in summary_request.turns[0].blocks[0].text  # type: ignore[union-attr]
    assert "files=notes/0.txt" in summary_request.turns[0].blocks[0].text  # type: ignore[union-attr]
    head = request.turns[0].blocks[0]
    assert isinstance(head, TextBlock) and head.text.startswith("[Compacted context")
    assert "questions 0-159 were about" in head.text
    # the newest 50 stay listed
    assert "Files read earlier: " in head.text and "notes/110.txt" in head.text
    assert check_turns(request.turns) == []
    assert tokens(request) < 0.85 * SMALL_WINDOW
    assert request.turns[-1].blocks[-1] == TextBlock("latest")


async def test_a_failed_summary_falls_back_to_the_archive_and_cools_down(tmp_path: Path) -> None:
    llm = ScriptedLLM(
        [{"error": {"message": "overloaded", "status": 400}}, {"text": "done"}, {"text": "two"}]
    )
    async with serve_runtime(tmp_path, llm, compaction=policy(SMALL_WINDOW)) as h:
        await seed(h, 160, result_chars=50, user_chars=100)
        await h.say("latest")
        await h.turn_end()
        view = views(h)
        assert view is not None and 3 not in view.stages and 2 in view.stages
        # Stage 4 left the oldest archive out if the lines alone were too long; either way it fits.
        assert check_turns(llm.requests[1].turns) == []
        assert tokens(llm.requests[1]) < 0.85 * SMALL_WINDOW
        worker = h.rt.dispatcher.workers[h.session.id]
        assert worker.compactor.cooldown_until > trio.current_time() - 1
        await h.say("again")
        await h.turn_end()
    assert len(llm.requests) == 3  # no second summary attempt during the cooldown


async def test_a_context_overflow_error_compacts_and_retries_once(tmp_path: Path) -> None:
    overflow = {
        "error": {"message": "prompt is too long: 250000 tokens > 200000 maximum", "status": 400}
    }
    llm = ScriptedLLM([overflow, {"text": "fits now"}])
    # The window is large, so only the provider's refusal can trigger this compaction.
    async with serve_runtime(tmp_path, llm, compaction=CompactionPolicy()) as h:
        await seed(h, 20)
        await h.say("go on")
        metrics = await h.turn_end()
        view = views(h)
        answer = h.history()[-1]
    assert metrics.state is TurnState.DONE
    assert answer.content == "fits now"
    assert view is not None and view.reason == "context overflow"
    assert len(llm.requests) == 2
    assert tokens(llm.requests[1]) < tokens(llm.requests[0])


async def test_a_compaction_that_saves_nothing_says_so(tmp_path: Path) -> None:
    # The finding: "🗜 compacted (/compact): 2.1K → 2.1K tokens; evicted old tool results", old
    # results ("hi") being shorter than the stubs that stand in for them.
    llm = ScriptedLLM([{"text": "done"}])
    async with serve_runtime(tmp_path, llm, compaction=policy(SMALL_WINDOW)) as h:
        await seed(h, 6, result_chars=0, user_chars=400)
        assert h.rt.dispatcher.compact(h.session.id)
        event = await next_compacted(h)
    assert event.view is not None and event.view.tokens_after >= event.view.tokens_before
    after = event.view.tokens_after
    assert event.render().startswith(
        f"🗜 nothing saved by compacting (/compact): the next request holds ~{after:,} tokens"
    )


async def test_slash_compact_between_turns_and_its_event(tmp_path: Path) -> None:
    llm = ScriptedLLM([{"text": "summary"}, {"text": "after"}])
    async with serve_runtime(tmp_path, llm, compaction=CompactionPolicy()) as h:
        await seed(h, 12)
        assert h.rt.dispatcher.compact(h.session.id)
        event = await next_compacted(h)
        assert event.view is not None and event.reason == "/compact"
        assert event.render().startswith("🗜 compacted (/compact): ~")
        # the estimates, as they are: the request did get smaller
        before, after = event.view.tokens_before, event.view.tokens_after
        assert before > after and f"~{before:,} → ~{after:,} tokens; " in event.render()
        await h.say("next")
        await h.turn_end()
        assert not h.rt.dispatcher.compact("no-such-session")
    request = llm.requests[-1]
    assert check_turns(request.turns) == []
    assert "[evicted to save context" in repr(request.turns)


async def test_a_cancelled_compaction_stores_nothing(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    slow_summary = {"text": "never used", "delay_s": 60}
    llm = ScriptedLLM([slow_summary, {"text": "done"}])
    async with serve_runtime(tmp_path, llm, compaction=policy(SMALL_WINDOW)) as h:
        await seed(h, 160, result_chars=50, user_chars=100)
        await h.say("latest")
        await requests_made(llm, 1)
        await trio.sleep(5)  # inside the summary call
        assert len(llm.requests) == 1
    # serve_runtime cancelled the runtime (a shutdown) in the middle of the compaction.
    h.store.__init__(tmp_path / "kesoku.db")  # type: ignore[misc]
    try:
        assert h.store.latest_view_state(h.session.id) is None
        assert [m.status for m in h.store.history(h.session.id) if m.content == "latest"] == [
            Status.PROCESSING
        ]
    finally:
        await close_store(h.store)


async def test_a_message_during_compaction_waits_and_is_answered(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    llm = ScriptedLLM([{"text": "summary", "delay_s": 2}, {"text": "first"}, {"text": "second"}])
    async with serve_runtime(tmp_path, llm, compaction=policy(SMALL_WINDOW)) as h:
        await seed(h, 160, result_chars=50, user_chars=100)
        await h.say("latest")
        await requests_made(llm, 1)
        await trio.sleep(1)  # the summary is being written
        assert len(llm.requests) == 1
        await h.say("meanwhile")
        first = await h.turn_end()
        second = await h.turn_end()
        history = h.history()
    # The compaction finished (atomic, not cut by the message); the interrupted turn then pivoted.
    assert first.state is TurnState.INTERRUPTED
    assert second.state is TurnState.DONE
    assert [m.content for m in history if m.role is Role.ASSISTANT][-1] in ("first", "second")
    assert "meanwhile" in repr(llm.requests[-1].turns)
    results = [
        b for t in llm.requests[-1].turns for b in t.blocks if isinstance(b, ToolResultBlock)
    ]
    assert all(b.outcome is Outcome.COMPLETED for b in results)


async def test_mid_turn_compaction_keeps_the_turns_own_tool_pairs(tmp_path: Path) -> None:
    big = "e" * 12_000  # one echo result that pushes the request over the threshold
    llm = ScriptedLLM(
        [
            {"tool_calls": [{"name": "echo", "arguments": {"text": big}}]},
            {"text": "done"},
        ]
    )
    async with serve_runtime(tmp_path, llm, tools=[echo()], compaction=policy()) as h:
        await seed(h, 45, result_chars=1200)  # just under the threshold
        await h.say("echo a lot")
        await h.turn_end()
        view = views(h)
    first, second = llm.requests
    assert view is not None and view.reason == "auto"
    # the first step fitted; the echo result tipped the second over
    assert tokens(first) < 0.85 * WINDOW
    results = [
        b
        for t in second.turns
        for b in t.blocks
        if isinstance(b, ToolResultBlock) and b.name == "echo"
    ]
    assert [b.content for b in results] == [big]  # the active turn's pair is whole
    assert check_turns(second.turns) == []
    assert tokens(second) < 0.85 * WINDOW


async def test_a_long_turn_with_nothing_old_tries_compaction_again_only_as_it_grows(
    tmp_path: Path,
) -> None:
    # Each step adds about 600 tokens, in results too short to shorten (SHORTEN_MIN_CHARS): the turn
    # alone outgrows the threshold, and compaction finds nothing to do, until it nears the window.
    # Each call differs (identical ones would be refused by the repeat guard).
    steps = 32
    texts = [f"{i:02d} " + "w" * (SHORTEN_MIN_CHARS - 3) for i in range(steps)]
    calls = [{"tool_calls": [{"name": "echo", "arguments": {"text": text}}]} for text in texts]
    llm = ScriptedLLM([*calls, {"text": "done"}])
    async with serve_runtime(tmp_path, llm, tools=[echo()], compaction=policy()) as h:
        await h.say("echo on and on")
        tries: list[int] = []  # the model calls made before each compaction attempt
        steps = (
            0  # counted in the event stream, which is in the turn's order (llm.requests runs ahead)
        )
        async for event in h.events:
            if isinstance(event, ToolStarted):
                steps += 1
            if isinstance(event, Compacted):
                assert event.view is None  # nothing before this turn: nothing to compact
                tries.append(steps)
            if isinstance(event, TurnEnded):
                break
    limit = 0.85 * WINDOW
    over = [i for i, request in enumerate(llm.requests) if tokens(request) > limit]
    assert len(over) >= 5 and len(tries) < len(over)  # not once per step over the threshold
    grown = [
        tokens(llm.requests[b]) - tokens(llm.requests[a]) for a, b in itertools.pairwise(tries)
    ]
    assert all(g >= COMPACTION_RETRY_GROWTH * limit * 0.9 for g in grown)
    assert llm.requests[-1].turns[-1].blocks  # the turn ran to its end
    assert max(map(tokens, llm.requests)) <= WINDOW


async def test_claude_over_the_wire_refuses_a_long_prompt_and_the_compacted_retry_goes_through(
    tmp_path: Path,
) -> None:
    fake = AnthropicFake()
    too_long = "prompt is too long: 212345 tokens > 200000 maximum"
    fake.push(ErrorReply(400, "invalid_request_error", too_long), Reply([Text("It fits now.")]))
    async with fake.serve() as url:
        llm = ClaudeLLM(
            base_url=url, api_key=fake.api_key, model="claude-haiku-4-5", thinking_level="minimal"
        )
        await llm.connect()
        try:
            async with serve_runtime(tmp_path, llm, compaction=CompactionPolicy()) as h:
                await seed(h, 20)
                await h.say("the task in progress")
                metrics = await h.turn_end()
                view = views(h)
                answer = h.history()[-1]
        finally:
            await llm.aclose()
    assert metrics.state is TurnState.DONE
    assert answer.content == "It fits now."
    assert view is not None and view.reason == "context overflow"
    refused, retried = fake.bodies
    assert len(str(retried["messages"])) < len(str(refused["messages"]))
    assert "[evicted to save context" in str(retried["messages"])
    # the active request, verbatim
    assert "the task in progress" in str(retried["messages"][-1]["content"])


def test_each_kind_of_block_is_measured() -> None:
    model = LLMTurn(
        "assistant",
        (TextBlock("a" * 9), ThoughtBlock("b" * 4), ToolCallBlock("c1", "sh", {"cmd": "ls"})),
    )
    user = LLMTurn(
        "user",
        (
            ToolResultBlock("c1", "sh", "x" * 40),
            ImageBlock("a.png", "image/png"),
            DocumentBlock("a.pdf", "application/pdf"),
            DocumentBlock("a.txt", "text/plain", data=b"y" * 20),
        ),
    )
    # 4 characters a token, rounded up: text 3, thought 1, the call's name 1 and its JSON
    # arguments ({"cmd":"ls"}, 12 bytes) 3; the result 10, a text document by its size 5.
    expected = (3 + 1 + 1 + 3) + (10 + IMAGE_TOKENS + DOCUMENT_TOKENS + 5)
    assert estimate_turns([model, user]) == expected
    assert TurnSizes().estimate([model, user]) == expected
