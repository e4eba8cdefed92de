"""The Claude backend over the real anthropic SDK against a wire-level fake of the Messages API."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing
from llm_streams import events_of, events_until_error
from runtime_harness import serve_runtime

from kesoku.config.settings import ClaudeConfig, Config
from kesoku.llm.claude import ClaudeLLM
from kesoku.llm.claude_convert import (
    cache_breakpoints,
    tool_loop_opens_with_thinking,
    uses_adaptive_thinking,
)
from kesoku.testing.fakes.anthropic_api import (
    AnthropicFake,
    Redacted,
    Reply,
    Text,
    Thinking,
    ToolUse,
    text_reply,
    validate,
)
from kesoku.tools.base import ToolContext
from kesoku.tools.schema import tool_from_function
from kesoku.vocab.errors import ConfigError
from kesoku.vocab.ir import (
    DocumentBlock,
    ImageBlock,
    LLMRequest,
    LLMTurn,
    TextBlock,
    TextDelta,
    ThoughtBlock,
    ThoughtDelta,
    ToolCallBlock,
    ToolCallEvent,
    ToolResultBlock,
    ToolSpec,
    UsageEvent,
)
from kesoku.vocab.model import Kind, Outcome, Usage

Clock = trio.testing.MockClock
SYSTEM = "You are a test."
WEATHER = ToolSpec(
    "weather",
    "Get the weather.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


def user(*blocks: Any) -> LLMTurn:
    return LLMTurn("user", tuple(blocks))


def assistant(*blocks: Any) -> LLMTurn:
    return LLMTurn("assistant", tuple(blocks))


def request(*turns: LLMTurn, system: str = SYSTEM, tools: tuple[ToolSpec, ...] = ()) -> LLMRequest:
    return LLMRequest(system=system, turns=turns or (user(TextBlock("hi")),), tools=tools)


@asynccontextmanager
async def claude(fake: AnthropicFake, **kwargs: Any) -> AsyncIterator[ClaudeLLM]:
    """A served fake and a backend pointed at it (the client made before the test's clock runs)."""
    async with fake.serve() as url:
        kwargs.setdefault("api_key", fake.api_key)
        kwargs.setdefault("thinking_level", "minimal")
        kwargs.setdefault("model", "claude-haiku-4-5")
        llm = ClaudeLLM(base_url=url, **kwargs)
        await llm.connect()
        try:
            yield llm
        finally:
            await llm.aclose()


# --- request bodies -------------------------------------------------------------------------------


async def test_the_request_body_maps_every_block_and_merges_turns() -> None:
    fake = AnthropicFake()
    fake.push(text_reply("ok"))
    failed = ToolResultBlock("toolu_2", "weather", "timed out", Outcome.TIMED_OUT)
    req = request(
        user(TextBlock("Weather in Paris and Rome?")),
        user(TextBlock("   ")),  # empty text is dropped; the second user turn merges into the first
        assistant(
            ThoughtBlock("unsigned, dropped"),
            TextBlock("Checking."),
            ToolCallBlock("toolu_1", "weather", {"city": "Paris"}),
            ToolCallBlock("toolu_2", "weather", {"city": "Rome"}),
        ),
        user(ToolResultBlock("toolu_1", "weather", "sunny"), failed),
        user(TextBlock("And tomorrow?")),
        tools=(WEATHER,),
    )
    async with claude(fake) as llm:
        assert await events_of(llm, req) == [
            TextDelta("ok"),
            UsageEvent(Usage(input_tokens=10, output_tokens=5)),
        ]
    (sent,) = fake.log.requests
    assert sent.path == "/v1/messages"
    assert (
        sent.headers["authorization"] == f"Bearer {fake.api_key}"
        and "anthropic-version" in sent.headers
    )
    assert sent.body == {
        "model": "claude-haiku-4-5",
        "max_tokens": 16384,
        "stream": True,
        "system": [{"type": "text", "text": SYSTEM}],
        "tools": [
            {
                "name": "weather",
                "description": "Get the weather.",
                "input_schema": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            }
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and Rome?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Checking."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "weather",
                        "input": {"city": "Paris"},
                    },
                    {
                        "type": "tool_use",
                        "id": "toolu_2",
                        "name": "weather",
                        "input": {"city": "Rome"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": "sunny",
                        "is_error": False,
                    },
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "content": "timed out",
                        "is_error": True,
                    },
                    {"type": "text", "text": "And tomorrow?"},
                ],
            },
        ],
    }


async def test_the_prompt_is_cached_above_the_threshold_only() -> None:
    fake = AnthropicFake()
    fake.push(text_reply("a"), text_reply("b"))
    short = request(tools=(WEATHER,))
    long = request(
        user(TextBlock("x" * 400)),
        assistant(ToolCallBlock("toolu_1", "weather", {"city": "Oslo"})),
        user(ToolResultBlock("toolu_1", "weather", "rain " * 100)),
        tools=(WEATHER,),
    )
    async with claude(fake, context_caching_threshold=200) as llm:
        await events_of(llm, short)
        await events_of(llm, long)
    below, above = fake.bodies
    assert "cache_control" not in str(below)
    assert above["system"] == [
        {"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}
    ]
    assert above["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    assert above["messages"][-1]["content"] == [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_1",
            "content": "rain " * 100,
            "is_error": False,
            "cache_control": {"type": "ephemeral"},
        }
    ]
    # The end of the previous request (the user message before the last assistant message): the
    # entry it wrote is read whatever the number of blocks the step added.
    assert above["messages"][0]["content"] == [
        {"type": "text", "text": "x" * 400, "cache_control": {"type": "ephemeral"}}
    ]
    assert "cache_control" not in str(above["messages"][1])
    assert fake.rejections == []


async def test_images_and_documents_go_as_base64_or_text_sources(tmp_path: Path) -> None:
    files = {
        "chart.png": b"\x89PNG\r\n\x1a\nfake",
        "paper.pdf": b"%PDF-1.4 fake",
        "notes.txt": "héllo notes".encode(),
        "scan.bmp": b"BMfake",
        "blob.bin": b"\xff\xfe\x00",
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    fake = AnthropicFake()
    fake.push(text_reply("seen"))
    async with claude(fake) as llm:
        req = await llm.request_from_turns(
            [
                user(
                    TextBlock("Look."),
                    ImageBlock(str(tmp_path / "chart.png"), "image/png"),
                    DocumentBlock(str(tmp_path / "paper.pdf"), "application/pdf", "paper.pdf"),
                    DocumentBlock(str(tmp_path / "notes.txt"), "text/plain", "notes.txt"),
                    ImageBlock(str(tmp_path / "scan.bmp"), "image/bmp"),
                    DocumentBlock(
                        str(tmp_path / "blob.bin"), "application/octet-stream", "blob.bin"
                    ),
                )
            ],
            system="",
        )
        await events_of(llm, req)
    (body,) = fake.bodies
    assert "system" not in body
    b64 = {name: base64.b64encode(data).decode() for name, data in files.items()}
    scan_note = (
        f"[attachment {tmp_path / 'scan.bmp'} (image/bmp): an image type Claude cannot read]"
    )
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look."},
                {
                    "type": "image",
                    "source": {
                        "type": "base64",
                        "media_type": "image/png",
                        "data": b64["chart.png"],
                    },
                },
                {
                    "type": "document",
                    "source": {
                        "type": "base64",
                        "media_type": "application/pdf",
                        "data": b64["paper.pdf"],
                    },
                    "title": "paper.pdf",
                },
                {
                    "type": "document",
                    "source": {"type": "text", "media_type": "text/plain", "data": "héllo notes"},
                    "title": "notes.txt",
                },
                {"type": "text", "text": scan_note},
                {
                    "type": "text",
                    "text": (
                        "[attachment blob.bin (application/octet-stream): "
                        "a file type Claude cannot read]"
                    ),
                },
            ],
        }
    ]


# --- streaming ------------------------------------------------------------------------------------


async def test_two_parallel_tool_calls_are_assembled_from_interleaved_json_deltas() -> None:
    fake = AnthropicFake()
    paris = {"city": "Paris", "units": "metric", "days": [1, 2, 3]}
    rome = {"city": "Rome", "note": 'quote " and ünïcode'}
    fake.push(
        Reply(
            [
                Text("Checking both.", chunks=2),
                ToolUse("toolu_a", "weather", paris, 5),
                ToolUse("toolu_b", "weather", rome, 3),
            ],
            usage={"input_tokens": 50, "output_tokens": 40},
            interleave_tools=True,
        )
    )
    async with claude(fake) as llm:
        events = await events_of(llm, request(tools=(WEATHER,)))
    assert events == [
        TextDelta("Checkin"),
        TextDelta("g both."),
        ToolCallEvent(ToolCallBlock("toolu_a", "weather", paris)),
        ToolCallEvent(ToolCallBlock("toolu_b", "weather", rome)),
        UsageEvent(Usage(input_tokens=50, output_tokens=40)),
    ]


async def test_thinking_streams_with_its_signature_and_goes_back_signed() -> None:
    fake = AnthropicFake()
    fake.push(
        Reply(
            [
                Thinking("Paris first.", "c2lnLTE="),
                ToolUse("toolu_1", "weather", {"city": "Paris"}),
            ],
            usage={"input_tokens": 30, "output_tokens": 200, "thinking_tokens": 150},
        ),
        text_reply("Sunny."),
    )
    async with claude(fake, thinking_level="low") as llm:
        first = await events_of(llm, request(tools=(WEATHER,)))
        assert first == [
            ThoughtDelta("Paris first."),
            ThoughtDelta("", signature=b"c2lnLTE=", signed_by="claude"),
            ToolCallEvent(ToolCallBlock("toolu_1", "weather", {"city": "Paris"})),
            UsageEvent(Usage(input_tokens=30, output_tokens=200, thinking_tokens=150)),
        ]
        follow_up = request(
            user(TextBlock("hi")),
            assistant(
                ThoughtBlock("Paris first.", b"c2lnLTE="),
                ToolCallBlock("toolu_1", "weather", {"city": "Paris"}),
            ),
            user(ToolResultBlock("toolu_1", "weather", "sunny")),
            tools=(WEATHER,),
        )
        assert (await events_of(llm, follow_up))[0] == TextDelta("Sunny.")
    assert fake.bodies[0]["thinking"] == {"type": "enabled", "budget_tokens": 4096}
    second = fake.bodies[1]
    assert second["thinking"] == {"type": "enabled", "budget_tokens": 4096}
    assert second["messages"][1]["content"][0] == {
        "type": "thinking",
        "thinking": "Paris first.",
        "signature": "c2lnLTE=",
    }
    assert fake.rejections == []


async def test_redacted_thinking_round_trips_as_the_same_block() -> None:
    fake = AnthropicFake()
    fake.push(
        Reply([Redacted("EncryptedBlob=="), ToolUse("toolu_1", "weather", {"city": "Oslo"})]),
        text_reply("ok"),
    )
    async with claude(fake, thinking_level="medium") as llm:
        first = await events_of(llm, request(tools=(WEATHER,)))
        assert first[0] == ThoughtDelta(
            "", signature=b"redacted_thinking:EncryptedBlob==", signed_by="claude"
        )
        follow_up = request(
            user(TextBlock("hi")),
            assistant(
                ThoughtBlock("", b"redacted_thinking:EncryptedBlob=="),
                ToolCallBlock("toolu_1", "weather", {"city": "Oslo"}),
            ),
            user(ToolResultBlock("toolu_1", "weather", "snow")),
            tools=(WEATHER,),
        )
        await events_of(llm, follow_up)
    assert fake.bodies[1]["messages"][1]["content"][0] == {
        "type": "redacted_thinking",
        "data": "EncryptedBlob==",
    }
    assert fake.bodies[1]["thinking"] == {"type": "enabled", "budget_tokens": 10_000}
    assert fake.rejections == []


async def test_thinking_is_left_off_in_a_tool_loop_that_opened_without_signed_thinking() -> None:
    fake = AnthropicFake()
    fake.push(text_reply("ok"), text_reply("ok"))
    loop = request(
        user(TextBlock("hi")),
        assistant(ThoughtBlock("unsigned"), ToolCallBlock("toolu_1", "weather", {"city": "Oslo"})),
        user(ToolResultBlock("toolu_1", "weather", "snow")),
        tools=(WEATHER,),
    )
    closed = request(
        *loop.turns, assistant(TextBlock("Snow in Oslo.")), user(TextBlock("Thanks. And Bergen?"))
    )
    async with claude(fake, thinking_level="high") as llm:
        await events_of(llm, loop)
        await events_of(llm, closed)
    in_loop, after_loop = fake.bodies
    assert "thinking" not in in_loop  # else the API answers 400: the loop must open with thinking
    assert in_loop["messages"][1]["content"] == [
        {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}}
    ]
    # 24000 capped to 16384 - 1024
    assert after_loop["thinking"] == {
        "type": "enabled",
        "budget_tokens": 15_360,
    }
    assert fake.rejections == []


async def test_adaptive_thinking_for_models_from_4_6() -> None:
    fake = AnthropicFake()
    fake.push(text_reply("a"), text_reply("b"))
    async with claude(fake, model="claude-opus-4-6", thinking_level="minimal") as llm:
        await events_of(llm, request())
    async with claude(fake, model="claude-sonnet-5", thinking_level="high") as llm:
        await events_of(llm, request())
    low, high = fake.bodies
    assert (low["thinking"], low["output_config"]) == ({"type": "adaptive"}, {"effort": "low"})
    assert (high["thinking"], high["output_config"]) == ({"type": "adaptive"}, {"effort": "high"})


async def test_adaptive_thinking_stays_on_in_a_loop_that_opened_without_thinking() -> None:
    # Adaptive thinking may skip thinking at a step; the next requests of the turn keep the same
    # parameters (a change would drop the messages' prompt cache), which the API accepts: earlier
    # assistant turns need not start with a thinking block in adaptive mode.
    fake = AnthropicFake()
    fake.push(text_reply("ok"), text_reply("ok"))
    opening = request(user(TextBlock("hi")), tools=(WEATHER,))
    loop = request(
        user(TextBlock("hi")),
        assistant(ToolCallBlock("toolu_1", "weather", {"city": "Oslo"})),
        user(ToolResultBlock("toolu_1", "weather", "snow")),
        tools=(WEATHER,),
    )
    async with claude(fake, model="claude-sonnet-4-6", thinking_level="medium") as llm:
        await events_of(llm, opening)
        await events_of(llm, loop)
    first, second = fake.bodies
    params = [(b["thinking"], b["output_config"]) for b in fake.bodies]
    assert params == [({"type": "adaptive"}, {"effort": "medium"})] * 2
    assert second["messages"][1]["content"][0]["type"] == "tool_use"
    assert fake.rejections == [] and first["thinking"] == second["thinking"]


async def test_the_budget_stays_when_a_cut_reply_raises_max_tokens() -> None:
    fake = AnthropicFake()
    fake.push(text_reply("a"), text_reply("b"))
    async with claude(fake, model="claude-sonnet-4-5", thinking_level="high") as llm:
        await events_of(llm, request())
        grown = msgspec.structs.replace(request(), max_output_tokens=32_000)
        await events_of(llm, grown)
    # 24000 capped to 16384 - 1024 for the whole turn, not 24000 once max_tokens is 32000.
    assert [(b["max_tokens"], b["thinking"]["budget_tokens"]) for b in fake.bodies] == [
        (16384, 15_360),
        (32_000, 15_360),
    ]
    small = ClaudeLLM(model="claude-sonnet-4-5", api_key="k", thinking_level="high")
    capped = small._build_native_input(msgspec.structs.replace(request(), max_output_tokens=4000))
    assert capped["thinking"] == {"type": "enabled", "budget_tokens": 2976}  # below max_tokens


def test_the_breakpoints_mark_the_previous_request_and_the_turn_opening() -> None:
    def text(t: str) -> dict[str, Any]:
        return {"type": "text", "text": t}

    def results(n: int) -> list[dict[str, Any]]:
        return [{"type": "tool_result", "tool_use_id": f"t{k}", "content": "r"} for k in range(n)]

    def calls(n: int) -> list[dict[str, Any]]:
        return [{"type": "tool_use", "id": f"t{k}", "name": "n", "input": {}} for k in range(n)]

    system, tools = [text("sys")], [{"name": "a"}, {"name": "b"}]
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [text("q0")]},
        {"role": "assistant", "content": [text("a0")]},
        {"role": "user", "content": [text("q1")]},
        {"role": "assistant", "content": [text("thinking about it"), *calls(12)]},
        {"role": "user", "content": results(12)},
    ]
    marked = cache_breakpoints(system, tools, messages)
    # The last block; the end of the previous request (q1, 25 blocks back: past the lookback); the
    # system prompt; the opening of the turn is q1 again, so the tools take the last slot.
    last, q1 = messages[-1]["content"][-1], messages[2]["content"][-1]
    assert [id(b) for b in marked] == [id(last), id(q1), id(system[-1]), id(tools[-1])]
    # The next turn: its message, the loop's last results, the system prompt, q1.
    messages += [
        {"role": "assistant", "content": [text("a1")]},
        {"role": "user", "content": [text("q2")]},
    ]
    marked = cache_breakpoints(system, tools, messages)
    assert [id(b) for b in marked] == [
        id(messages[-1]["content"][-1]),
        id(last),
        id(system[-1]),
        id(q1),
    ]
    assert cache_breakpoints([], [], [{"role": "user", "content": [text("q")]}]) == [text("q")]


def test_the_fake_holds_manual_thinking_to_the_loop_rule_and_cache_limits() -> None:
    think = {"type": "thinking", "thinking": "t", "signature": "s"}
    call = {"type": "tool_use", "id": "t1", "name": "weather", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "r"}
    hi = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    unsigned_loop = [
        hi,
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [result]},
    ]
    base = {"model": "claude-sonnet-4-6", "max_tokens": 4096, "messages": unsigned_loop}
    enabled = {**base, "thinking": {"type": "enabled", "budget_tokens": 2048}}
    assert "must start with a thinking block" in str(validate(enabled, vertex=False))
    assert validate({**base, "thinking": {"type": "adaptive"}}, vertex=False) is None
    cached_thinking = [
        hi,
        {"role": "assistant", "content": [{**think, "cache_control": {"type": "ephemeral"}}, call]},
        {"role": "user", "content": [result]},
    ]
    assert "cannot be cached" in str(validate({**base, "messages": cached_thinking}, vertex=False))
    four = [
        {"type": "text", "text": f"q{k}", "cache_control": {"type": "ephemeral"}} for k in range(4)
    ]
    full = {**base, "messages": [{"role": "user", "content": four}]}
    assert validate(full, vertex=False) is None
    automatic = {
        **full,
        "messages": [{"role": "user", "content": [*four, {"type": "text", "text": "x"}]}],
    }
    assert "A maximum of 4 blocks" in str(
        validate({**automatic, "cache_control": {"type": "ephemeral"}}, vertex=False)
    )


def test_model_versions_choose_the_thinking_form() -> None:
    adaptive = [
        "claude-opus-4-6",
        "claude-sonnet-4-6",
        "claude-opus-4-7@20260101",
        "claude-sonnet-5",
        "claude-fable-5-1",
    ]
    budget = [
        "claude-sonnet-4-5",
        "claude-haiku-4-5-20251001",
        "claude-3-7-sonnet-20250219",
        "claude-opus-4-20250514",
    ]
    assert [uses_adaptive_thinking(m) for m in adaptive] == [True] * len(adaptive)
    assert [uses_adaptive_thinking(m) for m in budget] == [False] * len(budget)
    assert uses_adaptive_thinking("my-proxy-model") is False


def test_budget_thinking_is_off_when_max_tokens_leave_no_room() -> None:
    llm = ClaudeLLM(
        model="claude-haiku-4-5", api_key="k", thinking_level="low", max_output_tokens=2000
    )
    assert "thinking" not in llm._build_native_input(request())
    llm = ClaudeLLM(
        model="claude-haiku-4-5", api_key="k", thinking_level="low", max_output_tokens=3000
    )
    assert llm._build_native_input(request())["thinking"] == {
        "type": "enabled",
        "budget_tokens": 1976,
    }


def test_the_tool_loop_rule() -> None:
    think = {"type": "thinking", "thinking": "t", "signature": "s"}
    call = {"type": "tool_use", "id": "t1", "name": "n", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "r"}
    hi: dict[str, Any] = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    signed: list[dict[str, Any]] = [
        hi,
        {"role": "assistant", "content": [think, call]},
        {"role": "user", "content": [result]},
    ]
    unsigned: list[dict[str, Any]] = [
        hi,
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [result]},
    ]
    assert tool_loop_opens_with_thinking([hi])
    assert tool_loop_opens_with_thinking(signed)
    assert not tool_loop_opens_with_thinking(unsigned)
    assert tool_loop_opens_with_thinking([*unsigned, {"role": "assistant", "content": [think]}, hi])


# --- Vertex AI ------------------------------------------------------------------------------------


async def test_vertex_calls_stream_raw_predict_with_the_access_token() -> None:
    fake = AnthropicFake()
    fake.push(text_reply("from vertex"))
    async with fake.serve() as url:
        llm = ClaudeLLM(
            model="claude-haiku-4-5@20251001",
            vertex=True,
            project_id=fake.project,
            location=fake.location,
            access_token=fake.access_token,
            base_url=f"{url}/v1",
            thinking_level="minimal",
        )
        try:
            events = await events_of(llm, request())
        finally:
            await llm.aclose()
    assert events[0] == TextDelta("from vertex")
    (sent,) = fake.log.requests
    assert sent.path == (
        f"/v1/projects/{fake.project}/locations/{fake.location}/publishers/anthropic/models/"
        "claude-haiku-4-5@20251001:streamRawPredict"
    )
    assert sent.headers["authorization"] == f"Bearer {fake.access_token}"
    assert (
        "model" not in sent.body
        and "anthropic_version" in sent.body
        and sent.body["stream"] is True
    )


async def test_vertex_rejecting_the_token_is_an_auth_error() -> None:
    fake = AnthropicFake()
    async with fake.serve() as url:
        llm = ClaudeLLM(
            model="claude-haiku-4-5@20251001",
            vertex=True,
            project_id=fake.project,
            location=fake.location,
            access_token="expired",
            base_url=f"{url}/v1",
        )
        try:
            _, error = await events_until_error(llm, request())
        finally:
            await llm.aclose()
    assert (
        str(error) == "claude (vertex): HTTP 401: Request had invalid authentication credentials."
    )
    assert error.auth and not error.retryable


def test_from_config() -> None:
    section = ClaudeConfig(api_key="sk-ant-x", model_name="claude-haiku-4-5", timeout_s=30)
    direct = ClaudeLLM.from_config(Config(claude=section))
    assert (direct.vertex, direct.model, direct.stall_timeout_s, direct.timeout_s) == (
        False,
        "claude-haiku-4-5",
        30,
        30,
    )
    vertex = ClaudeLLM.from_config(
        Config(claude=ClaudeConfig(project_id="p", location="europe-west1"))
    )
    assert (vertex.vertex, vertex.project_id, vertex.location) == (True, "p", "europe-west1")
    with pytest.raises(ConfigError, match=r"^claude.api_key: not set"):
        ClaudeLLM.from_config(Config(claude=ClaudeConfig(auth_mode="api_key")))


# --- a whole turn through the runtime -------------------------------------------------------------


async def echo(ctx: ToolContext, text: str) -> str:
    """Repeat the text.

    Args:
        text: What to repeat.
    """
    await trio.lowlevel.checkpoint()
    return f"{text} (from {ctx.call_id})"


async def test_a_runtime_turn_with_a_tool_round_trip(tmp_path: Path) -> None:
    fake = AnthropicFake()

    def handler(body: dict[str, Any]) -> Reply:
        last = body["messages"][-1]["content"]
        results = [b for b in last if b["type"] == "tool_result"]
        if results:
            return Reply(
                [Text(f"The echo said: {results[0]['content']}")],
                usage={"input_tokens": 80, "output_tokens": 9},
            )
        return Reply(
            [
                Thinking("Echo it.", "c2lnLWVjaG8="),
                Text("Echoing."),
                ToolUse("toolu_echo", "echo", {"text": "pong"}),
            ],
            usage={"input_tokens": 60, "output_tokens": 30},
        )

    fake.handler = handler
    tools = [tool_from_function(echo)]
    async with (
        claude(fake, thinking_level="low") as llm,
        serve_runtime(tmp_path, llm, tools=tools) as h,
    ):
        await h.say("Echo pong, please.")
        metrics = await h.turn_end()
        history = h.history()
    assert [(m.role.value, m.kind) for m in history] == [
        ("user", Kind.TEXT),
        ("assistant", Kind.THOUGHT),
        ("assistant", Kind.TEXT),
        ("assistant", Kind.TOOL_CALL),
        ("tool", Kind.TOOL_RESULT),
        ("assistant", Kind.TEXT),
    ]
    assert history[-1].content == "The echo said: pong (from toolu_echo)"
    assert metrics.tool_calls == 1
    assert fake.rejections == []
    first, second = fake.bodies
    assert first["tools"] == [
        {
            "name": "echo",
            "description": "Repeat the text.",
            "input_schema": {
                "type": "object",
                "properties": {"text": {"type": "string", "description": "What to repeat."}},
                "required": ["text"],
            },
        }
    ]
    assert second["messages"][1:] == [
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Echo it.", "signature": "c2lnLWVjaG8="},
                {"type": "text", "text": "Echoing."},
                {"type": "tool_use", "id": "toolu_echo", "name": "echo", "input": {"text": "pong"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_echo",
                    "content": "pong (from toolu_echo)",
                    "is_error": False,
                }
            ],
        },
    ]
    assert second["thinking"] == {"type": "enabled", "budget_tokens": 4096}
