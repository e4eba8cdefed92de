"""The repeat guard: identical calls that keep returning the same are refused, then the turn ends.

Scripted models repeat one call the way the bundled small model did (28 identical ``list_skills()``
calls, 50 identical failing ``grep`` calls); before the guard every one of them ran.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st
from runtime_harness import serve_runtime

from kesoku.agent.repeat import EXCERPT_CHARS, RepeatGuard, call_key
from kesoku.testing import ScriptedLLM
from kesoku.tools.base import Tool, ToolContext
from kesoku.vocab.errors import ToolError
from kesoku.vocab.ir import ToolResultBlock
from kesoku.vocab.metrics import TurnState
from kesoku.vocab.model import Kind, Outcome, Role, Status


def counting(runs: list[Mapping[str, Any]], *, fail: bool = False, changing: bool = False) -> Tool:
    """A tool that records each run; it fails, or returns a new text each time, when asked to."""

    async def run(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        runs.append(dict(arguments))
        if fail:
            raise ToolError("grep: no such file")
        return f"run {len(runs)}" if changing else "skills: none"

    return Tool("probe", "Probe something.", run)


def call(**arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": "probe", "arguments": arguments}]}


def results(history: list[Any]) -> list[Any]:
    return [m for m in history if m.kind is Kind.TOOL_RESULT]


async def test_a_repeated_call_is_refused_and_the_turn_ends_repeating(tmp_path: Path) -> None:
    runs: list[Mapping[str, Any]] = []
    # Argument order differs between the calls: the key is canonical JSON.
    steps = [call(a=1, b=2), call(b=2, a=1)] + [call(a=1, b=2)] * 48
    llm = ScriptedLLM(steps)
    async with serve_runtime(tmp_path, llm, tools=[counting(runs)]) as h:
        root = await h.say("Name three primary colors.")
        metrics = await h.turn_end()
        history = h.history()
        root_status = h.store.get_message(root.id).status  # type: ignore[union-attr]
    assert len(runs) == 2  # the default agent.max_identical_calls
    assert metrics.state is TurnState.REPEATING
    assert metrics.model_calls == 4
    outcomes = [m.metadata.outcome for m in results(history)]
    assert outcomes == [Outcome.COMPLETED, Outcome.COMPLETED, Outcome.REPEATED, Outcome.REPEATED]
    refused = results(history)[2]
    assert refused.content.startswith(
        "[repeated] Not run: this call (probe with the same arguments) already ran 2"
    )
    assert "skills: none" in refused.content  # what the earlier runs returned
    notice = history[-1]
    assert notice.role is Role.SYSTEM
    assert notice.content == (
        "Stopped: the model kept calling probe with the same arguments after being told it repeats "
        "(agent.max_identical_calls). Send a message to let it continue."
    )
    assert "\n" not in notice.content
    assert metrics.render().endswith("(Repeating)")
    assert root_status is Status.DONE
    # The model read the refusal: the request after it holds the result.
    last = llm.requests[3].turns[-1].blocks[-1]
    assert isinstance(last, ToolResultBlock) and last.outcome is Outcome.REPEATED


async def test_the_same_failing_call_is_refused(tmp_path: Path) -> None:
    runs: list[Mapping[str, Any]] = []
    llm = ScriptedLLM([call(pattern="python")] * 50)
    async with serve_runtime(tmp_path, llm, tools=[counting(runs, fail=True)]) as h:
        await h.say("Which Python version is installed here?")
        metrics = await h.turn_end()
        history = h.history()
    assert len(runs) == 2
    assert metrics.state is TurnState.REPEATING
    refused = results(history)[2]
    assert refused.metadata.outcome is Outcome.REPEATED
    assert "failed the same each time: [failed] grep: no such file" in refused.content


async def test_a_call_whose_result_changes_runs_again(tmp_path: Path) -> None:
    runs: list[Mapping[str, Any]] = []
    llm = ScriptedLLM([call(a=1)] * 5 + [{"text": "done"}])
    async with serve_runtime(tmp_path, llm, tools=[counting(runs, changing=True)]) as h:
        await h.say("poll until done")
        metrics = await h.turn_end()
    assert len(runs) == 5
    assert metrics.state is TurnState.DONE


async def test_zero_turns_the_guard_off(tmp_path: Path) -> None:
    runs: list[Mapping[str, Any]] = []
    llm = ScriptedLLM([call(a=1)] * 6 + [{"text": "done"}])
    async with serve_runtime(tmp_path, llm, tools=[counting(runs)], max_identical_calls=0) as h:
        await h.say("go")
        assert (await h.turn_end()).state is TurnState.DONE
    assert len(runs) == 6


async def test_a_subagent_gets_the_guard(tmp_path: Path) -> None:
    runs: list[Mapping[str, Any]] = []
    delegate = {"tool_calls": [{"name": "subagent", "arguments": {"task": "probe"}}]}
    child = {"text": "probing", "tool_calls": [{"name": "probe", "arguments": {"a": 1}}]}
    llm = ScriptedLLM([delegate, child, child, child, child, {"text": "the subagent got stuck"}])
    async with serve_runtime(tmp_path, llm, tools=[counting(runs)], subagent_max_steps=20) as h:
        await h.say("go")
        metrics = await h.turn_end()
        history = h.history()
    assert len(runs) == 2
    assert metrics.state is TurnState.DONE
    (result,) = results(history)
    assert result.content == (
        "[repeating] The subagent kept calling probe with the same arguments after being told it "
        "repeats (agent.max_identical_calls), and was stopped. Its last words: probing"
    )
    assert len(llm.requests) == 6


def test_call_key_is_canonical_and_survives_bad_text() -> None:
    assert call_key("x", {"a": 1, "b": [1, 2]}) == call_key("x", {"b": [1, 2], "a": 1})
    assert call_key("x", {"a": 1}) != call_key("y", {"a": 1})
    guard = RepeatGuard(1)
    bad = {"path": "\ud800"}  # a lone surrogate JSON cannot encode
    guard.record("read", bad, "same", Outcome.COMPLETED)
    assert guard.refusals([("read", bad)]) != [None]


def test_two_identical_calls_in_one_step_are_refused_without_ending_the_turn() -> None:
    guard = RepeatGuard(1)
    guard.record("probe", {"a": 1}, "same", Outcome.COMPLETED)
    first, second = guard.refusals([("probe", {"a": 1}), ("probe", {"a": 1})])
    assert first is not None and second is not None
    assert guard.stuck is None  # the model has not read the refusal yet
    assert guard.refusals([("probe", {"a": 1})]) != [None]
    assert guard.stuck == "probe"


async def test_a_check_after_an_edit_runs_again(tmp_path: Path) -> None:
    """Edit, run the tests, edit, run them again: the same test call returned the same twice, but
    an edit came between, so it runs again (and sees the fix)."""
    state = {"text": ""}
    checks: list[str] = []

    async def edit(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        state["text"] = str(arguments["text"])
        return "written"

    async def check(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        checks.append(result := "1" if "fixed" in state["text"] else "0")
        return result

    steps: list[dict[str, Any]] = []
    for text in ("try1", "try2", "fixed"):
        steps.append({"tool_calls": [{"name": "edit", "arguments": {"text": text}}]})
        steps.append({"tool_calls": [{"name": "check", "arguments": {}}]})
    llm = ScriptedLLM([*steps, {"text": "fixed it"}])
    tools = [Tool("edit", "Edit the file.", edit), Tool("check", "Run the tests.", check)]
    async with serve_runtime(tmp_path, llm, tools=tools) as h:
        await h.say("fix it")
        metrics = await h.turn_end()
        history = h.history()
    assert checks == ["0", "0", "1"]
    assert metrics.state is TurnState.DONE
    assert Outcome.REPEATED not in [m.metadata.outcome for m in results(history)]


def test_a_loop_of_calls_that_all_return_the_same_is_refused() -> None:
    """a, b, a, b…: each returns what it did before, so nothing new happens; the loop is refused."""
    guard = RepeatGuard(2)
    ran: list[str] = []
    for _ in range(10):
        for name in ("a", "b"):
            if guard.refusals([(name, {})]) == [None]:
                ran.append(name)
                guard.record(name, {}, f"{name} says the same", Outcome.COMPLETED)
    assert ran == ["a", "b", "a", "b", "a"]  # b's runs count from its first; a's from b's first
    assert guard.stuck == "b"


def test_one_run_reads_once() -> None:
    guard = RepeatGuard(1)
    guard.record("probe", {}, "same", Outcome.COMPLETED)
    (refusal,) = guard.refusals([("probe", {})])
    assert refusal is not None and "already ran once in this turn" in refusal


def test_capped_outputs_that_differ_only_in_the_bytes_cut_are_the_same() -> None:
    guard = RepeatGuard(2)
    listing = {"command": "ls -laR /usr/lib"}
    for cut in (6292858, 6293396):  # the listing grew between the runs; head and tail are the same
        guard.record(
            "shell", listing, f"total 1\n[… {cut} bytes cut …]\nlast line\n", Outcome.COMPLETED
        )
    [refusal] = guard.refusals([("shell", listing)])
    assert refusal is not None and refusal.startswith("[repeated] Not run")


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.text(alphabet="ab …é", min_size=1, max_size=40),
            st.text(alphabet=" \n\t\r\x0b\x1c\u3000", min_size=1, max_size=30),
        ),
        max_size=120,
    )
)
@example(["a" * 200, " " * 600, "b"])  # the head's words are just the excerpt: the whole is longer
@example(["a" * 200, " " * 600])
@example(["a" * 150, " " * 600, "b" * 100])
def test_a_refusal_quotes_the_flattened_head_of_any_result(parts: list[str]) -> None:
    content = "".join(parts)
    guard = RepeatGuard(1)
    guard.record("read", {}, content, Outcome.COMPLETED)
    [refusal] = guard.refusals([("read", {})])
    flat = " ".join(content.split())  # what the excerpt is: the whole, flattened, then cut
    excerpt = flat if len(flat) <= EXCERPT_CHARS else flat[: EXCERPT_CHARS - 1] + "…"
    assert refusal is not None and f"the same each time: {excerpt} — running" in refusal
