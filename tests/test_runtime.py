"""The runtime end to end over a real SQLite file:
turns, tools, interruption, stop, failures, recovery."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
import yaml
from runtime_harness import close_store, echo, serve_runtime, sleeper

from kesoku.agent.runtime import Runtime
from kesoku.agent.turn import Turn
from kesoku.agent.worker import make_title
from kesoku.gateway import Gateway
from kesoku.llm.base import BaseLLM
from kesoku.observe.turnlog_writer import TurnLogWriter
from kesoku.store import Store
from kesoku.testing import ScriptedLLM
from kesoku.tools.base import Tool, ToolContext
from kesoku.vocab.errors import ToolError
from kesoku.vocab.events import TurnEnded
from kesoku.vocab.ir import TextBlock, ThoughtBlock, ToolResultBlock
from kesoku.vocab.metrics import TurnState
from kesoku.vocab.model import (
    Kind,
    Message,
    Metadata,
    Outcome,
    Role,
    Session,
    Status,
    in_turn,
    user_text,
)
from kesoku.vocab.transcript import INTERRUPTED_SUFFIX, check_turns

Clock = trio.testing.MockClock


def kinds(history: list[Message]) -> list[tuple[str, str, str]]:
    return [(m.role.value, m.kind.value, m.status.value) for m in history]


async def test_a_message_gets_an_answer_a_title_and_metrics(tmp_path: Path) -> None:
    llm = ScriptedLLM(
        [{"text": ["Hel", "lo!"], "usage": {"input_tokens": 1500, "output_tokens": 20}}]
    )
    async with serve_runtime(tmp_path, llm) as h:
        root = await h.say("Say hello to the whole team, please, in a friendly tone and quickly")
        metrics = await h.turn_end()
        history = h.history()
        assert kinds(history) == [("user", "text", "done"), ("assistant", "text", "done")]
        answer = history[1]
        assert answer.content == "Hello!"
        assert (answer.root_id, answer.root_ts) == (root.id, root.ts)
        assert answer.metadata.usage is not None
        assert answer.metadata.usage.input_tokens == 1500
        assert metrics.state is TurnState.DONE
        assert (metrics.session_turns, metrics.context_tokens, metrics.turn_tokens) == (
            1,
            1500,
            1520,
        )
        assert metrics.render().startswith("⚡ turn 1 · context 2K · 0 tool calls · 2K tokens")
        session = h.store.get_session(h.session.id)
        assert session is not None
        assert session.title == "Say hello to the whole team, please, in a…"
        (request,) = llm.requests
        assert [t.role for t in request.turns] == ["user"]
        assert "You are Kesoku" in request.system
        assert f"Working directory: {h.session.workspace}" in request.system


def test_make_title() -> None:
    assert make_title("  \n  fix   the\tbuild \n more") == "fix the build"
    assert make_title("") == "Untitled"
    assert len(make_title("word " * 40)) <= 48


async def test_parallel_tool_calls_are_posted_as_batches(tmp_path: Path) -> None:
    llm = ScriptedLLM(
        [
            {
                "thought": "two at once",
                "tool_calls": [{"name": "echo", "arguments": {"text": t}} for t in ("a", "b")],
            },
            {"text": "a and b"},
        ]
    )
    async with serve_runtime(tmp_path, llm, tools=[echo()]) as h:
        with h.rt.hub.subscribe(h.session.id) as events:
            await h.say("echo twice")
            seen = []
            async for event in events:
                seen.append(type(event).__name__)
                if isinstance(event, TurnEnded):
                    assert event.metrics.tool_calls == 2
                    break
        history = h.history()
        assert kinds(history) == [
            ("user", "text", "done"),
            ("assistant", "thought", "done"),
            ("assistant", "tool_call", "done"),
            ("assistant", "tool_call", "done"),
            ("tool", "tool_result", "done"),
            ("tool", "tool_result", "done"),
            ("assistant", "text", "done"),
        ]
        calls, results = history[2:4], history[4:6]
        assert [c.id for c in calls] == [calls[0].id, calls[0].id + 1]  # one post: consecutive ids
        assert [r.parent_id for r in results] == [c.id for c in calls]
        assert [r.content for r in results] == ["a", "b"]
        assert all(r.metadata.outcome is Outcome.COMPLETED and r.sender == "echo" for r in results)
        second = llm.requests[1]
        assert check_turns(second.turns) == []
        assert [b.content for b in second.turns[-1].blocks if isinstance(b, ToolResultBlock)] == [
            "a",
            "b",
        ]
        assert seen[0] == "TurnStarted"
        assert {"ModelDelta", "ToolStarted", "ToolFinished"} <= set(seen)


async def test_a_new_message_interrupts_the_stream_and_the_worker_pivots(
    tmp_path: Path, autojump_clock: Clock
) -> None:
    llm = ScriptedLLM(
        [{"text": ["one ", "two ", "three"], "delay_s": 10}, {"text": "Answer to the second"}]
    )
    async with serve_runtime(tmp_path, llm) as h:
        first = await h.say("first")
        await trio.sleep(15)  # "one " streamed, "two " pending
        second = await h.say("second")
        interrupted = await h.turn_end()
        done = await h.turn_end()
        assert interrupted.state is TurnState.INTERRUPTED
        assert done.state is TurnState.DONE
        assert interrupted.render().endswith("(Interrupted)")
        assert interrupted.badge == "🛑"
        history = h.history()
        assert kinds(history) == [
            ("user", "text", "interrupted"),
            ("assistant", "text", "interrupted"),
            ("user", "text", "done"),
            ("assistant", "text", "done"),
        ]
        assert history[1].content == "one "
        assert history[1].root_id == first.id
        assert history[3].root_id == second.id
        pivot = llm.requests[1]
        assert [b for t in pivot.turns for b in t.blocks] == [
            TextBlock("first"),
            TextBlock("one " + INTERRUPTED_SUFFIX),
            TextBlock("second"),
        ]


async def test_a_message_during_tools_lets_them_finish_then_pivots(
    tmp_path: Path, autojump_clock: Clock
) -> None:
    llm = ScriptedLLM(
        [
            {"tool_calls": [{"name": "sleep", "arguments": {"seconds": 30}}]},
            {"text": "about the second"},
        ]
    )
    async with serve_runtime(tmp_path, llm, tools=[sleeper()]) as h:
        await h.say("first")
        await trio.sleep(10)  # the tool is running
        await h.say("second")
        first, second = await h.turn_end(), await h.turn_end()
        assert (first.state, second.state) == (TurnState.INTERRUPTED, TurnState.DONE)
        assert first.turn_s == pytest.approx(30, abs=1)
        history = h.history()
        assert kinds(history) == [
            ("user", "text", "interrupted"),
            ("assistant", "tool_call", "done"),
            ("tool", "tool_result", "done"),
            ("user", "text", "done"),
            ("assistant", "text", "done"),
        ]
        assert history[2].metadata.outcome is Outcome.COMPLETED
        assert history[2].content == "slept 30 s"
        # written after the second message, sorted with its turn
        assert history[2].id > history[3].id
        assert check_turns(llm.requests[1].turns) == []


async def test_stop_cuts_the_stream_without_pivot(tmp_path: Path, autojump_clock: Clock) -> None:
    llm = ScriptedLLM([{"thought": "hmm", "text": ["a", "b", "c"], "delay_s": 5}])
    async with serve_runtime(tmp_path, llm) as h:
        assert not h.gateway.stop(h.session.id)  # nothing runs yet
        await h.say("go")
        await trio.sleep(12)
        assert h.gateway.stop(h.session.id)
        metrics = await h.turn_end()
        assert metrics.state is TurnState.STOPPED
        # The design labels a stopped turn as an interrupted one; the state still tells them apart.
        assert metrics.render().startswith("🛑") and metrics.render().endswith("(Interrupted)")
        assert kinds(h.history()) == [
            ("user", "text", "interrupted"),
            ("assistant", "thought", "interrupted"),
            ("assistant", "text", "interrupted"),
        ]
        assert len(llm.requests) == 1
        await trio.sleep(100)
        assert len(llm.requests) == 1  # no pivot, no retry


async def test_first_stop_lets_the_tool_finish_second_kills_it(
    tmp_path: Path, autojump_clock: Clock
) -> None:
    log: list[str] = []
    llm = ScriptedLLM([{"tool_calls": [{"name": "sleep", "arguments": {"seconds": 100}}]}] * 2)
    async with serve_runtime(tmp_path, llm, tools=[sleeper(log=log)]) as h:
        await h.say("one")
        await trio.sleep(10)
        assert h.gateway.stop(h.session.id)
        metrics = await h.turn_end()
        assert metrics.state is TurnState.STOPPED
        assert metrics.turn_s == pytest.approx(100, abs=1)
        assert h.history()[-1].metadata.outcome is Outcome.COMPLETED
        assert len(llm.requests) == 1

        await h.say("two")
        await trio.sleep(10)
        h.gateway.stop(h.session.id)
        await trio.sleep(10)
        h.gateway.stop(h.session.id)  # the second stop kills
        metrics = await h.turn_end()
        assert metrics.turn_s == pytest.approx(20, abs=1)
        result = h.history()[-1]
        assert result.metadata.outcome is Outcome.KILLED
        assert result.content.startswith("[killed]")
        assert log[-1].startswith("start")  # the tool never reached its end


async def test_tool_failures_are_typed_outcomes(tmp_path: Path, autojump_clock: Clock) -> None:
    async def refuse(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        raise ToolError("no such file: x.txt")

    async def crash(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        raise RuntimeError("bug")

    tools = [
        Tool("refuse", "Refuses.", refuse),
        Tool("crash", "Crashes.", crash),
        sleeper(timeout_s=5),
    ]
    calls = [{"name": n, "arguments": {"seconds": 9}} for n in ("refuse", "crash", "sleep", "nope")]
    llm = ScriptedLLM([{"tool_calls": calls}, {"text": "ok"}])
    async with serve_runtime(tmp_path, llm, tools=tools) as h:
        await h.say("try")
        assert (await h.turn_end()).state is TurnState.DONE
        results = [m for m in h.history() if m.kind is Kind.TOOL_RESULT]
        assert [(r.sender, r.metadata.outcome) for r in results] == [
            ("refuse", Outcome.FAILED),
            ("crash", Outcome.FAILED),
            ("sleep", Outcome.TIMED_OUT),
            ("nope", Outcome.FAILED),
        ]
        assert results[0].content == "[failed] no such file: x.txt"
        assert "RuntimeError: bug" in results[1].content
        assert "longer than 5 s" in results[2].content
        assert "no tool named 'nope'" in results[3].content


async def test_unstarted_calls_are_skipped(gateway: Gateway, session: Session) -> None:
    llm = ScriptedLLM([])
    rt = Runtime(gateway, llm, tools=[echo()])  # not served: this test drives one turn by hand
    root = await gateway.post(user_text(session.id, "x"))
    turn = Turn(rt, session, [root], llm)
    meta = Metadata(tool_name="echo", tool_arguments={})
    (posted,) = await gateway.post_many(
        [in_turn(root, Role.ASSISTANT, Kind.TOOL_CALL, "echo()", metadata=meta)]
    )
    turn.interrupt()
    await turn._run_batch([posted])
    result = gateway.store.history(session.id)[-1]
    assert result.metadata.outcome is Outcome.SKIPPED
    assert result.parent_id == posted.id
    assert result.content.startswith("[skipped]")


async def test_the_step_cap_ends_a_runaway_loop(tmp_path: Path) -> None:
    llm = ScriptedLLM(
        [{"tool_calls": [{"name": "echo", "arguments": {"text": "again"}}]}], loop=True
    )
    async with serve_runtime(tmp_path, llm, tools=[echo()], max_steps_per_turn=3) as h:
        root = await h.say("loop")
        metrics = await h.turn_end()
        assert metrics.state is TurnState.STEP_LIMIT
        assert metrics.model_calls == 3
        last = h.history()[-1]
        assert last.role is Role.SYSTEM
        assert "agent.max_steps_per_turn = 3" in last.content
        assert h.store.get_message(root.id).status is Status.DONE  # type: ignore[union-attr]


async def test_a_failed_model_call_tells_the_user_and_the_worker_goes_on(tmp_path: Path) -> None:
    llm = ScriptedLLM([{"error": {"message": "invalid api key", "status": 401}}, {"text": "back"}])
    async with serve_runtime(tmp_path, llm) as h:
        root = await h.say("hi")
        assert (await h.turn_end()).state is TurnState.FAILED
        note = h.history()[-1]
        assert note.role is Role.SYSTEM
        assert "The model call failed" in note.content
        assert "invalid api key" in note.content
        assert h.store.get_message(root.id).status is Status.FAILED  # type: ignore[union-attr]
        await h.say("again")
        assert (await h.turn_end()).state is TurnState.DONE


async def test_a_crashing_worker_fails_its_turn_and_spares_the_process(tmp_path: Path) -> None:
    good = ScriptedLLM([{"text": "fine"}])

    def llm_for(session: Session) -> ScriptedLLM:
        if session.channel_id == "chan-1":
            raise RuntimeError("boom")
        return good

    async with serve_runtime(tmp_path, good) as h:
        h.rt._llm = llm_for
        root = await h.say("crash please")
        metrics = await h.turn_end()
        assert metrics.state is TurnState.FAILED
        assert h.rt.dispatcher.crashes == 1
        assert h.store.get_message(root.id).status is Status.FAILED  # type: ignore[union-attr]
        assert "internal error" in h.history()[-1].content
        other = h.gateway.open_session("terminal", "chan-2")
        await h.say("hello", other)
        assert (await h.turn_end()).state is TurnState.DONE
        assert h.history(other)[-1].content == "fine"


async def test_idle_workers_are_reaped(tmp_path: Path, autojump_clock: Clock) -> None:
    llm = ScriptedLLM([{"text": "a"}, {"text": "b"}])
    async with serve_runtime(tmp_path, llm, worker_idle_s=60) as h:
        await h.say("x")
        await h.turn_end()
        assert h.session.id in h.rt.dispatcher.workers
        await trio.sleep(61)
        assert h.session.id not in h.rt.dispatcher.workers
        await h.say("y")
        await h.turn_end()
        assert h.history()[-1].content == "b"


async def test_project_notes_and_tools_reach_the_system_prompt(tmp_path: Path) -> None:
    llm = ScriptedLLM([{"text": "ok"}])
    async with serve_runtime(tmp_path, llm, tools=[echo()], persona="You are Testy.") as h:
        Path(h.session.workspace, "AGENTS.md").write_text("Always run the tests.")
        await h.say("x")
        await h.turn_end()
        system = llm.requests[0].system
        assert system.startswith("You are Testy.")
        assert "- echo: Repeat the text." in system
        assert "<AGENTS.md>\nAlways run the tests.\n</AGENTS.md>" in system
        assert [t.name for t in llm.requests[0].tools] == ["echo"]


async def test_every_model_call_gets_a_turn_log(tmp_path: Path) -> None:
    writer = TurnLogWriter()
    llm = ScriptedLLM(
        [{"tool_calls": [{"name": "echo", "arguments": {"text": "hi"}}]}, {"text": "done"}]
    )
    async with serve_runtime(tmp_path, llm, tools=[echo()], turnlog=writer) as h:
        await h.say("log me")
        await h.turn_end()
        with trio.fail_after(10):
            while writer.written < 2:  # noqa: ASYNC110 - the writer is a worker thread's counter
                await trio.sleep(0.01)
        folder = Path(h.session.workspace)
    files = sorted(p.name for p in folder.glob("llm-turn-*.log.yaml"))
    assert files == ["llm-turn-1.log.yaml", "llm-turn-2.log.yaml"]
    second = yaml.safe_load((folder / "llm-turn-2.log.yaml").read_text())
    assert second["metadata"]["provider"] == "scripted"
    assert second["metadata"]["idx"] == 2
    blocks = [b for t in second["request"]["turns"] for b in t["blocks"]]
    assert [b["type"] for b in blocks] == ["text", "tool_call", "tool_result"]
    assert blocks[2]["content"] == "hi"
    assert second["tools"][0]["name"] == "echo"
    assert second["response"]["text"] == "done"


async def test_a_runtime_from_the_config_file(tmp_path: Path) -> None:
    from kesoku.config.settings import load_config

    (tmp_path / "demo.yaml").write_text("steps: [{text: configured}]\n")
    conf = tmp_path / "kesoku.toml"
    conf.write_text(
        '[agent]\nllm = "scripted"\npersona = "You are Conf."\n[scripted]\npath = "demo.yaml"\n'
    )

    def start_up() -> tuple[Store, Gateway, Runtime]:
        # What `kesoku start` does before it serves: blocking file reads and imports, off the loop.
        config = load_config(conf, env={})
        store = Store(config.workspace.db_path)
        gateway = Gateway(store, config.workspace.sessions_dir)
        return store, gateway, Runtime.from_config(config, gateway)

    store, gateway, rt = await trio.to_thread.run_sync(start_up)
    session = gateway.open_session("terminal", "c")
    async with trio.open_nursery() as nursery:
        with rt.hub.subscribe(session.id) as events:
            await nursery.start(rt.serve)
            await gateway.post(user_text(session.id, "hi"))
            async for event in events:
                if isinstance(event, TurnEnded):
                    break
        nursery.cancel_scope.cancel()
    assert store.history(session.id)[-1].content == "configured"
    assert rt.persona == "You are Conf."
    assert rt.turnlog is not None  # from_config turns the turn logs on
    await close_store(store)


async def test_a_forced_stop_kills_a_tool_that_runs_a_nursery(
    tmp_path: Path, autojump_clock: Clock
) -> None:
    async def fan_out(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        async with trio.open_nursery() as nursery:  # its Cancelled arrives wrapped in a group
            nursery.start_soon(trio.sleep, 100)
            nursery.start_soon(trio.sleep, 100)
        return "never"

    llm = ScriptedLLM([{"tool_calls": [{"name": "fan_out"}]}])
    async with serve_runtime(tmp_path, llm, tools=[Tool("fan_out", "Waits twice.", fan_out)]) as h:
        await h.say("go")
        await trio.sleep(5)
        assert h.gateway.stop(h.session.id, force=True)
        assert (await h.turn_end()).state is TurnState.STOPPED
        assert h.history()[-1].metadata.outcome is Outcome.KILLED


async def test_each_signed_thought_block_is_kept_with_its_own_signature(tmp_path: Path) -> None:
    from kesoku.vocab.ir import ThoughtBlock

    step = {
        "events": [
            {"thought": "first ", "signature": "czE="},  # base64 "s1"
            {"thought": "second", "signature": "czI="},  # base64 "s2"
            {"tool_call": {"name": "echo", "arguments": {"text": "x"}}},
        ]
    }
    llm = ScriptedLLM([step, {"text": "done"}])
    async with serve_runtime(tmp_path, llm, tools=[echo()]) as h:
        await h.say("think twice")
        await h.turn_end()
        thoughts = [m for m in h.history() if m.kind is Kind.THOUGHT]
        assert [(t.content, t.metadata.thought_signature) for t in thoughts] == [
            ("first ", b"s1"),
            ("second", b"s2"),
        ]
        assistant = llm.requests[1].turns[1]
        assert [b for b in assistant.blocks if isinstance(b, ThoughtBlock)] == [
            ThoughtBlock("first ", b"s1", "scripted"),
            ThoughtBlock("second", b"s2", "scripted"),
        ]


class OtherScripted(ScriptedLLM):
    """A scripted backend standing in for another provider (a fallback, a model switch)."""

    provider = "other"


async def test_a_signature_goes_back_only_to_the_provider_that_made_it(tmp_path: Path) -> None:
    first = ScriptedLLM(
        [
            {
                "thought": "plan",
                "signature": "c2ln",
                "tool_calls": [{"name": "echo", "arguments": {"text": "x"}}],
            },
            {"text": "one"},
            {"text": "three"},
        ]
    )
    second = OtherScripted([{"text": "two"}])
    chosen: list[BaseLLM] = [first]
    async with serve_runtime(tmp_path, lambda session: chosen[0], tools=[echo()]) as h:
        await h.say("go")
        await h.turn_end()
        stored = [m for m in h.history() if m.kind in (Kind.THOUGHT, Kind.TOOL_CALL)]
        assert [m.metadata.signed_by for m in stored] == ["scripted", None]
        chosen[0] = second
        await h.say("and now?")
        await h.turn_end()
        chosen[0] = first
        await h.say("back")
        await h.turn_end()
    foreign = second.requests[0].turns[1].blocks[0]
    # the other provider never sees the signature
    assert foreign == ThoughtBlock("plan", None, None)
    own = first.requests[2].turns[1].blocks[0]
    assert own == ThoughtBlock("plan", b"sig", "scripted")  # the maker gets it back


async def test_a_session_opened_elsewhere_gets_its_workspace_before_its_tools_run(
    tmp_path: Path,
) -> None:
    seen: list[bool] = []

    async def look(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        seen.append(ctx.cwd.is_dir())
        return "looked"

    llm = ScriptedLLM([{"tool_calls": [{"name": "look", "arguments": {}}]}, {"text": "done"}])
    async with serve_runtime(tmp_path, llm, tools=[Tool("look", "Look around.", look)]) as h:
        # Another process created this session through the store alone: no folder was made for it.
        other = h.store.create_session("test", "elsewhere", workspace_root=tmp_path / "sessions")
        assert not Path(other.workspace).exists()
        await h.say("look", other)
        await h.turn_end()
    assert seen == [True]
