"""Context windows: results capped to a share of the window, a turn that alone outgrows it, requests
never sent over it, the summary kept, and windows asked of the server (issue 18, item 4).

The self-hosted servers are the OpenAI wire fake in its llama.cpp, Ollama and vLLM dialects; as
llama.cpp does, its llama.cpp dialect refuses a prompt over ``n_ctx`` (counted its own way, not by
Kesoku's estimator). The tools are the real shell tool in the sandbox.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
from runtime_harness import serve_runtime
from sandboxing import sandbox_for
from test_compaction import SMALL_WINDOW, policy, seed, views

from kesoku.agent.compaction.compactor import CompactionPolicy
from kesoku.agent.compaction.tokens import DEFAULT_WINDOW, estimate_request
from kesoku.config.settings import SandboxConfig, ShellConfig
from kesoku.llm.openai import OpenAILLM
from kesoku.llm.windows import parse_window, server_root
from kesoku.testing import ScriptedLLM
from kesoku.testing.fakes.openai_api import Call, OpenAIFake, Reply, ServerKind, prompt_size
from kesoku.tools.base import Tool, ToolContext
from kesoku.tools.execute import WRAPPER_BYTES
from kesoku.tools.sandbox import Sandbox
from kesoku.tools.shell import shell_tool
from kesoku.vocab.ir import LLMRequest, ToolResultBlock
from kesoku.vocab.metrics import TurnState
from kesoku.vocab.model import Kind, Role

MODEL = "qwen3-8b-q4"

# As in test_openai: the SDK leaves its inner stream generators to the garbage collector.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:Async generator '(openai|httpx2|httpcore2)\.[\w.]+' "
    r"was garbage collected:ResourceWarning"
)


def shell(tmp_path: Path) -> Any:
    mode = "auto" if Sandbox(SandboxConfig()).probe().mechanism else "off"
    return shell_tool(ShellConfig(), sandbox_for(mode, tmp_path))


def shell_steps(steps: int) -> Any:
    """A model that runs ``seq N 30000`` (a ~170 KB output) ``steps`` times, then answers."""

    def handler(body: dict[str, Any]) -> Reply:
        done = sum(1 for m in body["messages"] if m["role"] == "tool")
        usage = {"prompt_tokens": prompt_size(body), "completion_tokens": 20}
        if done < steps:
            call = Call(f"call_{done}", "shell", {"command": f"seq {done + 1} 30000"})
            return Reply(calls=[call], usage=usage)
        return Reply(text=f"done: read {done} outputs", usage=usage)

    return handler


async def run_turn(tmp_path: Path, fake: OpenAIFake, text: str) -> tuple[Any, list[Any]]:
    async with fake.serve() as url:
        llm = OpenAILLM(model=MODEL, base_url=url, api_key=fake.api_key)
        async with serve_runtime(
            tmp_path, llm, tools=[shell(tmp_path)], compaction=CompactionPolicy()
        ) as h:
            await h.say(text)
            metrics = await h.turn_end()
            history = h.history()
        await llm.aclose()
    return metrics, history


# -- a turn larger than the window ----------------------------------------------------------------


async def test_a_big_shell_result_at_an_8k_window_completes(tmp_path: Path) -> None:
    # The finding: one capped 32 KB result made the next request ~10.3K tokens at 8K, and the turn
    # failed.
    fake = OpenAIFake(server="llama.cpp", window=8192)
    fake.handler = shell_steps(1)
    metrics, history = await run_turn(tmp_path, fake, "count to 30000")
    assert metrics.state is TurnState.DONE, history[-1].content
    assert history[-1].content == "done: read 1 outputs"
    assert fake.rejections == []
    assert max(fake.prompt_sizes) <= 8192
    (result,) = [m for m in history if m.kind is Kind.TOOL_RESULT]
    cap = CompactionPolicy().tool_result_share * 8192 * 4
    # A share of the window (the shell's command line and exit code around it), not the shell's 32
    # KB.
    assert len(result.content.encode()) <= cap + WRAPPER_BYTES < ShellConfig().max_output_bytes
    assert "bytes cut" in result.content and result.content.endswith("30000\n[exit code 0]")


async def test_a_twelve_step_task_at_7k_shortens_its_own_older_results(tmp_path: Path) -> None:
    fake = OpenAIFake(server="llama.cpp", window=7000)
    fake.handler = shell_steps(11)
    metrics, history = await run_turn(tmp_path, fake, "read eleven outputs")
    assert metrics.state is TurnState.DONE, history[-1].content
    assert history[-1].content == "done: read 11 outputs"
    assert fake.rejections == []
    assert len(fake.prompt_sizes) == 12 and max(fake.prompt_sizes) <= 7000
    last = fake.bodies[-1]["messages"]
    tool_texts = [m["content"] for m in last if m["role"] == "tool"]
    assert len(tool_texts) == 11  # every result is still there, none left out
    assert "characters cut here to fit the context window" in tool_texts[0]
    assert tool_texts[0].startswith("$ seq 1 30000\n1\n2\n3\n")  # the start is kept …
    assert tool_texts[0].endswith("30000\n[exit code 0]")  # … and the end
    assert "cut here" not in tool_texts[-1]  # the newest result is whole (as the tool capped it)
    stored = [m.content for m in history if m.kind is Kind.TOOL_RESULT]
    assert all("cut here" not in c for c in stored)  # the log keeps what the tool returned


# -- never sent over the window --------------------------------------------------------------------


async def test_a_request_over_the_window_is_not_sent(tmp_path: Path) -> None:
    llm = ScriptedLLM([{"text": "never"}], context_window=4000)
    async with serve_runtime(tmp_path, llm, compaction=CompactionPolicy()) as h:
        await h.say("x" * 40_000)  # ~10K tokens in the user's own message: nothing can shorten it
        metrics = await h.turn_end()
        notice = h.history()[-1]
    assert metrics.state is TurnState.FAILED
    assert llm.requests == []
    assert notice.role is Role.SYSTEM and "\n" not in notice.content
    assert notice.content.startswith("⚠ Not sent: the request would be about 10,")
    assert (
        "context window of 4,000" in notice.content
        and "[compaction.context_windows]" in notice.content
    )


async def test_the_providers_count_calibrates_the_next_requests_estimate(tmp_path: Path) -> None:
    # The provider counts 3x what the estimator says (a dense tokenizer): the next request, under
    # the window by the estimate alone, is over it by the calibrated one.
    llm = ScriptedLLM(
        [{"text": "ok", "usage": {"input_tokens": 9_000, "output_tokens": 1}}, {"text": "never"}],
        context_window=4000,
    )
    async with serve_runtime(tmp_path, llm, compaction=CompactionPolicy(enabled=False)) as h:
        await h.say("z" * 6_000)  # ~1,500 tokens by the estimate
        assert (await h.turn_end()).state is TurnState.DONE
        await h.say("and now?")
        metrics = await h.turn_end()
        notice = h.history()[-1]
    assert metrics.state is TurnState.FAILED and len(llm.requests) == 1
    assert estimate_request(llm.requests[0]) < 2_000
    sent = re.match(r"⚠ Not sent: the request would be about ([\d,]+) tokens", notice.content)
    assert sent is not None and int(sent[1].replace(",", "")) > 3 * 1_500, notice.content


async def test_compaction_off_still_never_sends_over_the_window(tmp_path: Path) -> None:
    llm = ScriptedLLM([{"text": "never"}], context_window=4000)
    async with serve_runtime(tmp_path, llm, compaction=CompactionPolicy(enabled=False)) as h:
        await h.say("y" * 40_000)
        metrics = await h.turn_end()
        notice = h.history()[-1]
    assert metrics.state is TurnState.FAILED and llm.requests == []
    assert "compaction is off" in notice.content


# -- the summary is kept --------------------------------------------------------------------------


async def test_the_summary_is_in_the_next_request(tmp_path: Path) -> None:
    summary = "## Notes\n- questions 0-159 were about notes/N.txt"
    llm = ScriptedLLM([{"text": summary}, {"text": "done"}])
    async with serve_runtime(tmp_path, llm, compaction=policy(SMALL_WINDOW)) as h:
        await seed(h, 160, result_chars=50, user_chars=100)
        # The active request alone fills most of the target, so the summarized view is still over
        # it.
        await h.say("latest: " + "z" * 19_000)
        metrics = await h.turn_end()
        view = views(h)
    assert metrics.state is TurnState.DONE
    assert view is not None and 3 in view.stages
    assert [a.kind for a in view.archives] == ["summary"] and view.dropped_turns == 0
    request = llm.requests[-1]
    assert "questions 0-159 were about" in repr(request.turns[0])
    assert "left out entirely" not in repr(request.turns[0])
    assert estimate_request(request) <= 0.85 * SMALL_WINDOW


# -- windows asked of the server ------------------------------------------------------------------


# the Modelfile's num_ctx first
@pytest.mark.parametrize(
    ("server", "window", "model_window", "expected", "asked"),
    [
        ("llama.cpp", 8192, None, 8192, ["GET /props"]),
        (
            "ollama",
            16384,
            40960,
            16384,
            ["GET /props", "POST /api/show"],
        ),
        ("ollama", None, 40960, 40960, ["GET /props", "POST /api/show"]),
        ("vllm", 32768, None, 32768, ["GET /props", "POST /api/show", "GET /v1/models"]),
    ],
)
async def test_the_window_is_asked_of_the_server(
    server: ServerKind,
    window: int | None,
    model_window: int | None,
    expected: int,
    asked: list[str],
) -> None:
    fake = OpenAIFake(server=server, window=window, model_window=model_window, model_id=MODEL)
    async with fake.serve() as url:
        llm = OpenAILLM(model=MODEL, base_url=url, api_key=fake.api_key)
        rules = CompactionPolicy()
        assert rules.window(llm) == DEFAULT_WINDOW  # not asked yet
        assert await rules.learn_window(llm) == expected
        assert await rules.learn_window(llm) == expected
        await llm.aclose()
    assert fake.probes == asked  # asked once per backend
    assert rules.window(llm) == expected
    assert rules.limit(llm) == int(expected * 0.85)


async def test_an_unknown_window_is_the_default_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = OpenAIFake(server="openai")  # its /v1/models has no window, /props and /api/show are 404
    async with fake.serve() as url:
        llm = OpenAILLM(model="mystery-model", base_url=url, api_key=fake.api_key)
        with caplog.at_level(logging.WARNING, logger="kesoku.agent.compaction.compactor"):
            assert await CompactionPolicy().learn_window(llm) == DEFAULT_WINDOW == 8192
            assert await CompactionPolicy().learn_window(llm) == 8192
        await llm.aclose()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert "'mystery-model'" in warnings[0] and "[compaction.context_windows]" in warnings[0]


async def test_known_and_configured_windows_are_not_asked() -> None:
    fake = OpenAIFake(server="llama.cpp", window=4096)
    async with fake.serve() as url:
        configured = OpenAILLM(model=MODEL, base_url=url, api_key=fake.api_key)
        rules = CompactionPolicy(windows=((MODEL, 12_000),))
        assert await rules.learn_window(configured) == 12_000
        table = OpenAILLM(model="gpt-4o-mini", base_url=url, api_key=fake.api_key)
        assert await CompactionPolicy().learn_window(table) == 128_000
        await configured.aclose()
        await table.aclose()
    assert fake.probes == []


def test_server_answers_that_are_not_windows_are_none() -> None:
    assert server_root("http://127.0.0.1:11434/v1") == "http://127.0.0.1:11434"
    assert server_root("http://host/proxy/v1/") == "http://host/proxy"
    odd: list[tuple[str, object]] = [
        ("llama.cpp", []),
        ("llama.cpp", {"default_generation_settings": {"n_ctx": "8192"}}),
        ("llama.cpp", {"default_generation_settings": {"n_ctx": True}}),
        ("ollama", {"parameters": "num_ctx lots", "model_info": {"general.architecture": "x"}}),
        ("ollama", {"model_info": {"general.architecture": 7}}),
        ("ollama", {"model_info": {"general.architecture": "qwen3", "qwen3.context_length": -1}}),
        (
            "vllm",
            {"data": [{"id": "a", "max_model_len": 4096}, {"id": "b", "max_model_len": 8192}]},
        ),
        ("vllm", {"data": "nope"}),
    ]
    for kind, data in odd:
        assert parse_window(kind, data, MODEL) is None, (kind, data)
    assert parse_window("vllm", {"data": [{"id": "other", "max_model_len": 4096}]}, MODEL) == 4096
    assert (
        parse_window("ollama", msgspec.json.decode(b'{"parameters": "num_ctx 2048"}'), MODEL)
        == 2048
    )


async def test_a_thirty_step_turn_cuts_its_oldest_results_again(tmp_path: Path) -> None:
    def step(request: LLMRequest) -> dict[str, Any]:
        done = sum(isinstance(b, ToolResultBlock) for t in request.turns for b in t.blocks)
        if done < 30:
            return {"tool_calls": [{"name": "dump", "arguments": {"n": done}}]}
        return {"text": f"read {done} outputs"}

    async def dump(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        await trio.lowlevel.checkpoint()
        return "\n".join(f"{i:06d} output of step {arguments['n']}" for i in range(4000))

    llm = ScriptedLLM(responder=step, context_window=7000)
    tool = Tool("dump", "Dump some output.", dump)
    async with serve_runtime(tmp_path, llm, tools=[tool], compaction=CompactionPolicy()) as h:
        await h.say("dump thirty times")
        metrics = await h.turn_end()
        answer = h.history()[-1].content
    assert metrics.state is TurnState.DONE and answer == "read 30 outputs"
    assert max(map(estimate_request, llm.requests)) <= 7000
    results = [
        b for t in llm.requests[-1].turns for b in t.blocks if isinstance(b, ToolResultBlock)
    ]
    assert len(results) == 30
    first, last = results[0].content, results[-1].content
    assert "characters cut here" in first and len(first) < 400  # the second, deeper cut
    assert first.startswith("000000 output of step 0") and first.endswith("003999 output of step 0")
    assert "characters cut here" not in last
