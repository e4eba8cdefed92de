"""Questions to the user through the runtime: a write outside the workspace asks, waits and obeys.

The model is scripted; write_file is the real file tool; the answer comes through
``rt.questions.answer`` as an adapter would send it. Every test checks the file system and the log.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing
from runtime_harness import Harness, serve_runtime

from kesoku.agent.questions import Questions
from kesoku.testing import ScriptedLLM
from kesoku.tools.base import Tool
from kesoku.tools.files import file_tools
from kesoku.tools.paths import PathGates
from kesoku.vocab.events import QuestionAsked
from kesoku.vocab.metrics import TurnState
from kesoku.vocab.model import Kind, Message, Outcome, Role, is_answer, is_question, parse_answer


def write_outside(target: Path, *, then: str = "done") -> ScriptedLLM:
    call = {"name": "write_file", "arguments": {"path": str(target), "content": "hello\n"}}
    return ScriptedLLM([{"tool_calls": [call]}, {"text": then}])


async def next_question(h: Harness) -> Message:
    async for event in h.events:
        if isinstance(event, QuestionAsked):
            return event.question
    raise AssertionError("event stream closed")


def result_of(h: Harness) -> Message:
    return next(m for m in h.history() if m.kind is Kind.TOOL_RESULT)


@pytest.fixture
def tools(tmp_path: Path) -> tuple[Tool, ...]:
    return file_tools(PathGates(home=tmp_path / "home"))


async def test_an_allowed_write_outside_happens_and_the_model_never_sees_the_question(
    tmp_path: Path,
    tools: tuple[Tool, ...],
) -> None:
    target = tmp_path / "outside" / "note.txt"
    llm = write_outside(target)
    async with serve_runtime(tmp_path, llm, tools=tools) as h:
        await h.say("write the note")
        question = await next_question(h)
        assert question.role is Role.SYSTEM and is_question(question)
        assert (
            question.content
            == f"❓ write_file wants to write {target} ({target} is outside the workspace). Allow?"
        )
        assert h.rt.questions.open_questions(h.session.id) == [question]
        assert h.rt.questions.answer(question.id, "allow", by="Ana")
        assert not h.rt.questions.answer(question.id, "deny")  # answered already
        metrics = await h.turn_end()
        assert metrics.state is TurnState.DONE
        assert target.read_text() == "hello\n"
        result = result_of(h)
        assert result.metadata.outcome is Outcome.COMPLETED
        answer = next(m for m in h.history() if is_answer(m))
        assert answer.content == "✔ Allow: allowed by Ana"
        assert answer.metadata.extra == {"answer_to": question.id, "choice": "Allow"}
        assert answer.root_id == question.root_id == result.root_id
        # The second model call saw the call and its result, and nothing of the question or its
        # answer.
        seen = repr(llm.requests[1].turns)
        assert "Allow" not in seen and "❓" not in seen
        assert "created" in seen


async def test_a_denied_write_is_not_made_and_the_model_reads_why(
    tmp_path: Path, tools: tuple[Tool, ...]
) -> None:
    target = tmp_path / "outside" / "note.txt"
    async with serve_runtime(tmp_path, write_outside(target), tools=tools) as h:
        await h.say("write the note")
        question = await next_question(h)
        assert h.rt.questions.answer(question.id, "n", by="Ana")
        await h.turn_end()
        assert not target.exists()
        result = result_of(h)
        assert result.metadata.outcome is Outcome.FAILED
        assert "was not allowed (denied by Ana); the file was not written" in result.content


async def test_no_answer_counts_as_deny_and_the_wait_does_not_time_the_tool_out(
    tmp_path: Path,
    tools: tuple[Tool, ...],
    autojump_clock: trio.testing.MockClock,
) -> None:
    target = tmp_path / "outside" / "note.txt"
    # 300 s of waiting is far past write_file's own 60 s timeout: the wait must not count against
    # it.
    async with serve_runtime(
        tmp_path, write_outside(target), tools=tools, question_timeout_s=300.0
    ) as h:
        await h.say("write the note")
        await next_question(h)
        started = trio.current_time()
        await h.turn_end()
        waited = trio.current_time() - started
        assert 300.0 <= waited < 301.0
        result = result_of(h)
        assert result.metadata.outcome is Outcome.FAILED
        assert "(no answer within 300 s)" in result.content
        assert not target.exists()
        assert h.rt.questions.open_questions(h.session.id) == []


async def test_a_stop_denies_the_open_question(tmp_path: Path, tools: tuple[Tool, ...]) -> None:
    target = tmp_path / "outside" / "note.txt"
    async with serve_runtime(tmp_path, write_outside(target), tools=tools) as h:
        await h.say("write the note")
        await next_question(h)
        assert h.gateway.stop(h.session.id)
        metrics = await h.turn_end()
        assert metrics.state is TurnState.STOPPED
        assert not target.exists()
        assert "(the turn was stopped)" in result_of(h).content
        assert [m.content for m in h.history() if is_answer(m)] == ["✘ Deny: the turn was stopped"]


async def test_a_new_message_denies_the_question_and_the_worker_pivots(
    tmp_path: Path, tools: tuple[Tool, ...]
) -> None:
    target = tmp_path / "outside" / "note.txt"
    llm = ScriptedLLM(
        [
            {
                "tool_calls": [
                    {"name": "write_file", "arguments": {"path": str(target), "content": "x"}}
                ]
            },
            {"text": "answer to the second message"},
        ]
    )
    async with serve_runtime(tmp_path, llm, tools=tools) as h:
        await h.say("write the note")
        await next_question(h)
        await h.say("never mind, what time is it?")
        first = await h.turn_end()
        second = await h.turn_end()
        assert first.state is TurnState.INTERRUPTED
        assert second.state is TurnState.DONE
        assert not target.exists()
        assert "the user sent a new message instead of answering" in result_of(h).content
        assert h.history()[-1].content == "answer to the second message"


async def test_a_forced_stop_while_asking_kills_the_call_and_closes_the_question(
    tmp_path: Path, tools: tuple[Tool, ...]
) -> None:
    target = tmp_path / "outside" / "note.txt"
    async with serve_runtime(tmp_path, write_outside(target), tools=tools) as h:
        await h.say("write the note")
        await next_question(h)
        assert h.gateway.stop(h.session.id, force=True)
        metrics = await h.turn_end()
        assert metrics.state is TurnState.STOPPED
        assert not target.exists()
        # The forced stop denies the question first (stop() dismisses before it kills), so the tool
        # ends with its refusal or as killed; either way nothing was written and the question is
        # closed.
        assert result_of(h).metadata.outcome in (Outcome.FAILED, Outcome.KILLED)
        assert h.rt.questions.open_questions(h.session.id) == []
        assert len([m for m in h.history() if is_answer(m)]) == 1


def test_typed_answers() -> None:
    assert [
        parse_answer(t) for t in ("y", "Yes", "allow", " A ", "no", "N", "deny", "Deny.", "maybe")
    ] == [
        "Allow",
        "Allow",
        "Allow",
        "Allow",
        "Deny",
        "Deny",
        "Deny",
        "Deny",
        None,
    ]


async def test_answering_an_unknown_question_or_with_a_bad_choice(tmp_path: Path) -> None:
    async with serve_runtime(tmp_path, ScriptedLLM([])) as h:
        questions: Questions = h.rt.questions
        assert not questions.answer(12345, "allow")
        with pytest.raises(ValueError, match="an answer is 'Allow' or 'Deny', not 'perhaps'"):
            questions.answer(12345, "perhaps")
