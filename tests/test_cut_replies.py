"""Cut and malformed replies run none of their tool calls; empty answers are failed calls.

Each backend's own stop reason is served by its wire fake to the real SDK on loopback, in a whole
turn with the real ``write_file`` tool: a reply cut at its output limit (OpenAI, llama.cpp and
Ollama ``finish_reason: "length"``, Claude ``stop_reason: "max_tokens"``, Gemini ``MAX_TOKENS``) or
flagged malformed (Gemini ``MALFORMED_FUNCTION_CALL``) must leave the file unwritten, store the call
with a ``truncated`` result that tells the model its reply was cut, and go on with the next step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from runtime_harness import Harness, serve_runtime
from test_claude import claude
from test_openai import openai, request

from kesoku.llm.base import BaseLLM
from kesoku.llm.gemini import GeminiLLM
from kesoku.testing import ScriptedLLM
from kesoku.testing.fakes.anthropic_api import AnthropicFake, ToolUse
from kesoku.testing.fakes.anthropic_api import Reply as ClaudeReply
from kesoku.testing.fakes.anthropic_api import text_reply as claude_text
from kesoku.testing.fakes.gemini_api import GeminiFake
from kesoku.testing.fakes.gemini_replies import answer, call, chunk, reply, usage
from kesoku.testing.fakes.openai_api import Call, OpenAIFake
from kesoku.testing.fakes.openai_api import Reply as OpenAIReply
from kesoku.testing.fakes.openai_api import text_reply as openai_text
from kesoku.testing.fakes.server import serve_app
from kesoku.tools.files import file_tools
from kesoku.tools.paths import PathGates
from kesoku.vocab.errors import BackendError
from kesoku.vocab.ir import StopReason, ToolResultBlock
from kesoku.vocab.metrics import TurnState
from kesoku.vocab.model import Kind, Message, Outcome, Role

pytestmark = pytest.mark.filterwarnings(
    r"ignore:Async generator '(openai|httpx2|httpcore2)\.[\w.]+' "
    r"was garbage collected:ResourceWarning"
)

WRITE = {"path": "out.txt", "content": "hello"}


async def write_turn(tmp_path: Path, llm: BaseLLM) -> tuple[Harness, list[Message], TurnState]:
    tools = file_tools(PathGates(home=tmp_path / "home"))
    async with serve_runtime(tmp_path, llm, tools=tools) as h:
        await h.say("write hello to out.txt")
        metrics = await h.turn_end()
        return h, h.history(), metrics.state


def the_result(history: list[Message]) -> Message:
    (result,) = [m for m in history if m.kind is Kind.TOOL_RESULT]
    return result


def assert_not_run(h: Harness, history: list[Message], cut: str) -> None:
    assert not (Path(h.session.workspace) / "out.txt").exists()
    result = the_result(history)
    assert result.metadata.outcome is Outcome.TRUNCATED
    assert result.content.startswith(f"[truncated] Not run: your reply was {cut}")
    assert history[-1].role is Role.ASSISTANT and history[-1].kind is Kind.TEXT  # the turn went on


# -- OpenAI-compatible: OpenAI, llama.cpp, Ollama --------------------------------------------------


# OpenAI / llama.cpp fragments; Ollama's whole calls
@pytest.mark.parametrize("style", ["split", "whole"])
async def test_openai_length_runs_no_call(tmp_path: Path, style: Any) -> None:
    fake = OpenAIFake()
    cut = OpenAIReply(
        calls=[Call("c1", "write_file", WRITE)],
        style=style,
        finish_reason="length",
        usage={"prompt_tokens": 50, "completion_tokens": 4096},
    )
    fake.push(cut, openai_text("I will write it in parts."))
    async with openai(fake) as llm:
        h, history, state = await write_turn(tmp_path, llm)
    assert state is TurnState.DONE
    # No max_tokens is sent: the server's own limit applies, which Kesoku cannot raise.
    assert_not_run(h, history, "cut at 4096 output tokens (its output limit)")
    assert "shorter" in the_result(history).content
    assert all("max_tokens" not in body for body in fake.bodies)
    last = fake.bodies[1]["messages"][-1]
    assert last["role"] == "tool" and last["content"].startswith("[truncated]")


async def test_openai_finished_call_runs(tmp_path: Path) -> None:
    fake = OpenAIFake()
    fake.push(OpenAIReply(calls=[Call("c1", "write_file", WRITE)]), openai_text("Done."))
    async with openai(fake) as llm:
        h, history, _ = await write_turn(tmp_path, llm)
    assert (Path(h.session.workspace) / "out.txt").read_text() == "hello"
    assert the_result(history).metadata.outcome is Outcome.COMPLETED


async def test_openai_finish_reasons_map_to_the_ir() -> None:
    mapping = [
        ("length", StopReason.MAX_TOKENS),
        ("stop", StopReason.END),
        ("tool_calls", StopReason.END),
        ("content_filter", StopReason.OTHER),
    ]
    for finish, reason in mapping:
        fake = OpenAIFake()
        fake.push(OpenAIReply(text="x", finish_reason=finish))
        async with openai(fake) as llm:
            response = await llm.generate(request())
        assert (response.stop_reason, response.stop_detail) == (reason, finish)


# -- Claude ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("cut_at", [None, 20])  # complete JSON, and JSON cut inside the block
async def test_claude_max_tokens_runs_no_call_and_the_retry_asks_for_more(
    tmp_path: Path, cut_at: int | None
) -> None:
    fake = AnthropicFake()
    usage_ = {"input_tokens": 40, "output_tokens": 16384}
    cut = ClaudeReply(
        blocks=[ToolUse("tu_1", "write_file", WRITE, cut_at=cut_at)], stop_reason="max_tokens"
    )
    cut.usage = usage_
    fake.push(cut, claude_text("I will write it in parts."))
    async with claude(fake) as llm:
        h, history, state = await write_turn(tmp_path, llm)
    assert state is TurnState.DONE
    assert_not_run(h, history, "cut at 16384 output tokens (its output limit)")
    assert "your next reply may use up to 32000 tokens" in the_result(history).content
    assert [body["max_tokens"] for body in fake.bodies] == [16384, 32000]
    if cut_at is not None:  # the cut JSON is kept as it came, never run
        (stored,) = [m for m in history if m.kind is Kind.TOOL_CALL]
        assert stored.metadata.tool_arguments == {"_raw": '{"path":"out.txt","c'}


async def test_claude_input_that_is_not_json_without_max_tokens_is_an_error() -> None:
    fake = AnthropicFake()
    fake.push(
        ClaudeReply(
            blocks=[ToolUse("tu_1", "write_file", WRITE, cut_at=12)], stop_reason="tool_use"
        )
    )
    async with claude(fake) as llm:
        with pytest.raises(BackendError, match="'write_file' are not a JSON object"):
            await llm.generate(request())


# -- Gemini ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("finish", "cut"),
    [
        ("MAX_TOKENS", "cut at 7 output tokens (its output limit)"),
        (
            "MALFORMED_FUNCTION_CALL",
            "flagged as malformed by the provider (MALFORMED_FUNCTION_CALL)",
        ),
    ],
)
async def test_gemini_cut_or_malformed_runs_no_call(tmp_path: Path, finish: str, cut: str) -> None:
    fake = GeminiFake(
        [
            reply(chunk(call("write_file", WRITE), finish=finish, usage_metadata=usage(30, 7))),
            answer("I will try again."),
        ]
    )
    async with serve_app(fake.app) as url:
        llm = GeminiLLM(
            model="gemini-2.5-flash",
            api_key="test-key",
            base_url=url,
            context_caching_threshold=None,
        )
        await llm.connect()
        try:
            h, history, state = await write_turn(tmp_path, llm)
        finally:
            await llm.aclose()
    assert state is TurnState.DONE
    assert_not_run(h, history, cut)
    # Gemini's limit is the model's own (no maxOutputTokens is sent): nothing to raise.
    assert all("maxOutputTokens" not in str(r.body) for r in fake.generate_calls)


# -- the turn without a wire ----------------------------------------------------------------------


async def test_an_empty_cut_reply_is_asked_again_with_the_larger_limit(tmp_path: Path) -> None:
    llm = ScriptedLLM(
        [{"stop": "max_tokens"}, {"text": "the answer"}], output_limit=512, max_output_limit=4096
    )
    async with serve_runtime(tmp_path, llm) as h:
        await h.say("think hard")
        assert (await h.turn_end()).state is TurnState.DONE
        history = h.history()
    assert [r.max_output_tokens for r in llm.requests] == [None, 1024]
    assert [m.content for m in history[1:]] == ["the answer"]


async def test_a_cut_answer_is_kept_and_the_user_told(tmp_path: Path) -> None:
    llm = ScriptedLLM(
        [{"text": "The first half", "stop": "max_tokens", "usage": {"output_tokens": 512}}]
    )
    async with serve_runtime(tmp_path, llm) as h:
        await h.say("write a lot")
        assert (await h.turn_end()).state is TurnState.DONE
        history = h.history()
    assert [m.content for m in history[1:]] == [
        "The first half",
        "⚠ The answer was cut at 512 output tokens (its output limit).",
    ]


async def test_the_stop_reason_reaches_the_turn_log_and_the_model_reads_the_result(
    tmp_path: Path,
) -> None:
    llm = ScriptedLLM(
        [
            {"tool_calls": [{"name": "write_file", "arguments": WRITE}], "stop": "max_tokens"},
            {"text": "ok"},
        ]
    )
    h, history, _ = await write_turn(tmp_path, llm)
    assert_not_run(h, history, "cut at its output limit")
    result = llm.requests[1].turns[-1].blocks[-1]
    assert isinstance(result, ToolResultBlock) and result.outcome is Outcome.TRUNCATED


async def test_a_subagent_runs_no_call_of_a_cut_reply(tmp_path: Path) -> None:
    delegate = {
        "tool_calls": [{"name": "subagent", "arguments": {"task": "write hello to out.txt"}}]
    }
    cut = {"tool_calls": [{"name": "write_file", "arguments": WRITE}], "stop": "max_tokens"}
    llm = ScriptedLLM(
        [delegate, cut, {"text": "could not write it"}, {"text": "The subagent could not."}]
    )
    tools = file_tools(PathGates(home=tmp_path / "home"))
    async with serve_runtime(tmp_path, llm, tools=tools, subagent_max_steps=5) as h:
        await h.say("delegate it")
        await h.turn_end()
        workspace = Path(h.session.workspace)
    assert not (workspace / "out.txt").exists()
    result = llm.requests[2].turns[-1].blocks[-1]  # what the child read after its cut reply
    assert isinstance(result, ToolResultBlock) and result.outcome is Outcome.TRUNCATED
    assert result.content.startswith("[truncated] Not run: your reply was cut at its output limit")


async def test_a_subagent_asks_an_empty_cut_reply_again_with_the_larger_limit(
    tmp_path: Path,
) -> None:
    # The turn's step loop (kesoku.agent.loop) is the subagent's too: the same retry with a larger
    # limit.
    delegate: dict[str, Any] = {
        "tool_calls": [{"name": "subagent", "arguments": {"task": "think hard"}}]
    }
    steps = [delegate, {"stop": "max_tokens"}, {"text": "the conclusion"}, {"text": "Done."}]
    llm = ScriptedLLM(steps, output_limit=512, max_output_limit=4096)
    async with serve_runtime(tmp_path, llm, subagent_max_steps=5) as h:
        await h.say("delegate it")
        assert (await h.turn_end()).state is TurnState.DONE
        history = h.history()
    assert [r.max_output_tokens for r in llm.requests] == [None, None, 1024, None]
    [result] = [m for m in history if m.kind is Kind.TOOL_RESULT]
    assert result.content == "the conclusion"


async def test_a_model_whose_every_reply_is_cut_with_the_same_call_ends_repeating(
    tmp_path: Path,
) -> None:
    # A server that always answers at its limit: the same cut call is refused as a repeat, then the
    # turn ends, instead of running to agent.max_steps_per_turn (50 billed calls).
    cut = {"tool_calls": [{"name": "write_file", "arguments": WRITE}], "stop": "max_tokens"}
    llm = ScriptedLLM([cut] * 50)
    h, history, state = await write_turn(tmp_path, llm)
    assert state is TurnState.REPEATING
    assert len(llm.requests) == 4  # two cut, the third refused as a repeat, the fourth ends it
    assert not (Path(h.session.workspace) / "out.txt").exists()
    results = [m for m in history if m.kind is Kind.TOOL_RESULT]
    assert {m.metadata.outcome for m in results} == {Outcome.TRUNCATED}
    assert "[repeated] Not run" in results[-1].content
