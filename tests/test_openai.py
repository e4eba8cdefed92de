"""The OpenAI-compatible backend: the real openai SDK against a wire-level Chat Completions fake."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from llm_streams import events_of, events_until_error
from runtime_harness import serve_runtime

from kesoku.config.settings import Config, OpenAIConfig
from kesoku.llm.openai import OpenAILLM, stream_error_is_retryable
from kesoku.llm.openai_convert import decode_arguments
from kesoku.testing.fakes.openai_api import (
    Call,
    OpenAIFake,
    Reply,
    text_reply,
    validate,
)
from kesoku.tools.base import ToolContext
from kesoku.tools.schema import tool_from_function
from kesoku.vocab.errors import ConfigError
from kesoku.vocab.ir import (
    LLMEvent,
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
from kesoku.vocab.model import Attachment, Kind, Message, Metadata, Outcome, Role, Usage

# openai 3.57 stops reading at `data: [DONE]` without closing its inner async generators; trio
# closes them at garbage collection and warns, which filterwarnings=error would turn into a failure.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:Async generator '(openai|httpx2|httpcore2)\.[\w.]+' "
    r"was garbage collected:ResourceWarning"
)

Clock = trio.testing.MockClock
SYSTEM = "You are a test."
MODEL = "gpt-5-mini"
WEATHER = ToolSpec(
    "weather",
    "Get the weather.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
STREAM = {"stream": True, "stream_options": {"include_usage": True}}


def user(*blocks: Any) -> LLMTurn:
    return LLMTurn("user", tuple(blocks))


def assistant(*blocks: Any) -> LLMTurn:
    return LLMTurn("assistant", tuple(blocks))


def request(*turns: LLMTurn, system: str = SYSTEM, tools: tuple[ToolSpec, ...] = ()) -> LLMRequest:
    return LLMRequest(system=system, turns=turns or (user(TextBlock("hi")),), tools=tools)


@asynccontextmanager
async def openai(fake: OpenAIFake, **kwargs: Any) -> AsyncIterator[OpenAILLM]:
    """A served fake and a backend pointed at it; the client is built before any deadline is pending
    (autojump_clock advances virtual time while a worker thread runs)."""
    async with fake.serve() as url:
        kwargs.setdefault("api_key", fake.api_key)
        llm = OpenAILLM(model=MODEL, base_url=url, **kwargs)
        await llm.client()
        try:
            yield llm
        finally:
            await llm.aclose()


def calls_of(events: list[LLMEvent]) -> list[ToolCallBlock]:
    return [e.call for e in events if isinstance(e, ToolCallEvent)]


def sent_call(call_id: str, arguments: str, name: str = "weather") -> dict[str, Any]:
    """A tool call as the request carries it."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def stored(id: int, role: Role, content: str, kind: Kind = Kind.TEXT, **fields: Any) -> Message:
    """A message as the store gives it back."""
    sender = {Role.USER: "User", Role.ASSISTANT: "Kesoku"}.get(role, "weather")
    return Message(
        id=id, session_id="s1", role=role, kind=kind, sender=sender, content=content, **fields
    )


# --- request bodies -------------------------------------------------------------------------------


async def test_the_request_body_maps_every_block() -> None:
    fake = OpenAIFake()
    fake.push(text_reply("ok"))
    timed_out = ToolResultBlock(
        "call_2", "weather", "[timed_out] weather ran too long.", Outcome.TIMED_OUT
    )
    req = request(
        user(TextBlock("Weather in Paris and Rome?")),
        assistant(
            ThoughtBlock("Two cities: two calls."),
            TextBlock("Checking."),
            ToolCallBlock("call_1", "weather", {"city": "Paris", "note": "ünï"}),
            ToolCallBlock("call_2", "weather", {"city": "Rome"}),
        ),
        user(ToolResultBlock("call_1", "weather", "sunny"), timed_out, TextBlock("And tomorrow?")),
        assistant(ToolCallBlock("call_3", "weather", {})),
        user(ToolResultBlock("call_3", "weather", "")),
        tools=(WEATHER,),
    )
    async with openai(fake) as llm:
        assert await events_of(llm, req) == [
            TextDelta("ok"),
            UsageEvent(Usage(input_tokens=10, output_tokens=5)),
        ]
    (sent,) = fake.log.requests
    assert sent.path == "/v1/chat/completions" and sent.headers["authorization"] == "Bearer sk-test"
    assert sent.body == {
        "model": MODEL,
        **STREAM,
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "weather",
                    "description": "Get the weather.",
                    "parameters": WEATHER.parameters,
                },
            }
        ],
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {
                "role": "assistant",
                "content": "Checking.",
                "tool_calls": [
                    sent_call("call_1", '{"city":"Paris","note":"ünï"}'),
                    sent_call("call_2", '{"city":"Rome"}'),
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {
                "role": "tool",
                "tool_call_id": "call_2",
                "content": "[timed_out] weather ran too long.",
            },
            {"role": "user", "content": "And tomorrow?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [sent_call("call_3", "{}")],
            },
            {"role": "tool", "tool_call_id": "call_3", "content": "(no output)"},
        ],
    }
    assert fake.rejections == []


async def test_no_tools_key_and_no_system_message_when_empty() -> None:
    fake = OpenAIFake()
    fake.push(text_reply("hello"))
    async with openai(fake) as llm:
        await events_of(llm, request(user(TextBlock("hi")), system="  "))
    assert fake.bodies == [
        {"model": MODEL, **STREAM, "messages": [{"role": "user", "content": "hi"}]}
    ]


async def test_a_request_from_stored_history_with_attachment_files(tmp_path: Path) -> None:
    files = {
        "chart.png": b"\x89PNG\r\n\x1a\nfake",
        "notes.txt": "héllo notes".encode(),
        "data.json": b'{"a": 1}',
        "paper.pdf": b"%PDF-1.4 fake",
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    attachments = (
        Attachment(path=str(tmp_path / "chart.png"), mime_type="image/png", filename="chart.png"),
        Attachment(path=str(tmp_path / "notes.txt"), mime_type="text/plain", filename="notes.txt"),
        Attachment(
            path=str(tmp_path / "data.json"), mime_type="application/json", filename="data.json"
        ),
        Attachment(
            path=str(tmp_path / "paper.pdf"), mime_type="application/pdf", filename="paper.pdf"
        ),
    )
    call = Metadata(tool_name="weather", tool_arguments={"city": "Oslo"}, call_id="call_w")
    result = Metadata(tool_name="weather", outcome=Outcome.COMPLETED)
    history = [
        stored(1, Role.USER, "Look.", metadata=Metadata(attachments=attachments)),
        stored(2, Role.ASSISTANT, "Hmm.", Kind.THOUGHT),
        stored(3, Role.ASSISTANT, "Let me check Oslo."),
        stored(4, Role.ASSISTANT, "weather", Kind.TOOL_CALL, metadata=call),
        stored(5, Role.TOOL, "snow", Kind.TOOL_RESULT, parent_id=4, metadata=result),
        stored(6, Role.USER, "Thanks."),
    ]
    fake = OpenAIFake()
    fake.push(text_reply("seen"))
    async with openai(fake) as llm:
        req = await llm.build_request(history, system=SYSTEM, tools=[WEATHER])
        await events_of(llm, req)
    (body,) = fake.bodies
    png = base64.b64encode(files["chart.png"]).decode()
    assert body["messages"][1:] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look."},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
                {
                    "type": "text",
                    "text": "[attachment notes.txt (text/plain)]\nhéllo notes\n[end of notes.txt]",
                },
                {
                    "type": "text",
                    "text": (
                        '[attachment data.json (application/json)]\n{"a": 1}\n[end of data.json]'
                    ),
                },
                {
                    "type": "text",
                    "text": (
                        "[attachment paper.pdf (application/pdf): "
                        "not sent (this backend sends images and text files only)]"
                    ),
                },
            ],
        },
        {
            "role": "assistant",
            "content": "Let me check Oslo.",
            "tool_calls": [sent_call("call_w", '{"city":"Oslo"}')],
        },
        {"role": "tool", "tool_call_id": "call_w", "content": "snow"},
        {"role": "user", "content": "Thanks."},
    ]
    assert fake.rejections == []


DEEPSEEK_LOOP = request(
    user(TextBlock("Weather in Oslo?")),
    assistant(ThoughtBlock("Need the tool."), ToolCallBlock("call_1", "weather", {"city": "Oslo"})),
    user(ToolResultBlock("call_1", "weather", "snow")),
    assistant(ThoughtBlock("Answer now."), TextBlock("Snow.")),
    user(TextBlock("And Bergen?")),
    assistant(ToolCallBlock("call_2", "weather", {"city": "Bergen"})),
    user(ToolResultBlock("call_2", "weather", "rain")),
    tools=(WEATHER,),
)


async def test_deepseek_thinking_needs_reasoning_back_on_tool_call_messages_only() -> None:
    fake = OpenAIFake(deepseek_thinking=True)
    fake.push(text_reply("Rain."))
    async with openai(fake) as llm:
        assert llm.send_reasoning is False  # a loopback host is not DeepSeek: thoughts stay home
        _, error = await events_until_error(llm, DEEPSEEK_LOOP)
        llm.send_reasoning = True
        await events_of(llm, DEEPSEEK_LOOP)
    assert str(error) == (
        "openai: HTTP 400 invalid_request_error: The reasoning_content in the thinking mode must "
        "be passed back to the API."
    )
    assert (error.status, error.retryable, error.auth) == (400, False, False) and llm.calls == 2
    without, with_reasoning = fake.bodies
    assert "reasoning_content" not in str(without)
    assistants = [m for m in with_reasoning["messages"] if m["role"] == "assistant"]
    assert [m.get("reasoning_content") for m in assistants] == ["Need the tool.", None, ""]
    assert "reasoning_content" not in assistants[1] and len(fake.rejections) == 1


def test_send_reasoning_is_on_by_default_only_for_deepseek() -> None:
    assert OpenAILLM(
        model="deepseek-chat", api_key="k", base_url="https://api.deepseek.com"
    ).send_reasoning
    assert OpenAILLM(model="m", api_key="k", base_url="https://api.deepseek.com/v1").send_reasoning
    assert not OpenAILLM(model="m", api_key="k").send_reasoning
    assert not OpenAILLM(model="m", base_url="http://notdeepseek.com.example/v1").send_reasoning
    assert not OpenAILLM(
        model="m", api_key="k", base_url="https://api.deepseek.com", send_reasoning=False
    ).send_reasoning


# --- streaming ------------------------------------------------------------------------------------


async def test_reasoning_and_text_stream_as_thoughts_and_text() -> None:
    fake = OpenAIFake()
    fake.push(
        Reply("The answer is 42.", chunks=3, reasoning="Think."),
        Reply("ok", reasoning="Via reasoning.", reasoning_key="reasoning"),
        Reply("ok", reasoning="Once.", reasoning_key="both"),
    )
    async with openai(fake) as llm:
        first = await events_of(llm, request())
        second = await events_of(llm, request())
        third = await events_of(llm, request())
    assert first[:4] == [
        ThoughtDelta("Think."),
        TextDelta("The an"),
        TextDelta("swer i"),
        TextDelta("s 42."),
    ]
    assert second[0] == ThoughtDelta("Via reasoning.")
    assert [e for e in third if isinstance(e, ThoughtDelta)] == [ThoughtDelta("Once.")]


async def test_interleaved_tool_call_fragments_are_assembled_by_index() -> None:
    fake = OpenAIFake()
    paris = {"city": "Paris", "units": "metric", "days": [1, 2, 3]}
    rome = {"city": "Rome", "note": 'quote " and ünïcode'}
    calls = [Call("call_a", "weather", paris, 5), Call("call_b", "weather", rome, 4)]
    fake.push(Reply("Checking both.", calls=calls, style="interleaved"))
    async with openai(fake) as llm:
        events = await events_of(llm, request(tools=(WEATHER,)))
    assert events == [
        TextDelta("Checking both."),
        ToolCallEvent(ToolCallBlock("call_a", "weather", paris)),
        ToolCallEvent(ToolCallBlock("call_b", "weather", rome)),
        UsageEvent(Usage(input_tokens=10, output_tokens=5)),
    ]


@pytest.mark.parametrize("style", ["split", "whole", "repeated_id", "index_zero"])
async def test_every_tool_call_style_gives_the_same_calls(style: Any) -> None:
    fake = OpenAIFake()
    calls = [
        Call("call_a", "weather", {"city": "Oslo"}),
        Call("call_b", "weather", {"city": "Rome"}),
    ]
    fake.push(Reply(calls=calls, style=style))
    async with openai(fake) as llm:
        events = await events_of(llm, request(tools=(WEATHER,)))
    assert calls_of(events) == [
        ToolCallBlock("call_a", "weather", {"city": "Oslo"}),
        ToolCallBlock("call_b", "weather", {"city": "Rome"}),
    ]


async def test_missing_ids_are_generated_and_whole_calls_without_index_stay_apart() -> None:
    fake = OpenAIFake()
    no_index = [
        {
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city":"Oslo"}'},
                }
            ]
        },
        {
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city":"Rome"}'},
                }
            ]
        },
    ]
    fake.push(
        Reply(
            calls=[Call(None, "weather", {"city": "Oslo"}), Call(None, "weather", {"city": "Rome"})]
        ),
        Reply(deltas=no_index, finish_reason="stop"),
    )
    async with openai(fake) as llm:
        split = calls_of(await events_of(llm, request(tools=(WEATHER,))))
        whole = calls_of(await events_of(llm, request(tools=(WEATHER,))))
    for calls in (split, whole):
        assert [(c.name, c.arguments) for c in calls] == [
            ("weather", {"city": "Oslo"}),
            ("weather", {"city": "Rome"}),
        ]
        assert all(c.id.startswith("call_") for c in calls) and calls[0].id != calls[1].id
    assert len({c.id for c in split + whole}) == 4


async def test_calls_are_emitted_at_the_last_delta_or_at_the_end_without_a_finish_reason() -> None:
    fake = OpenAIFake()
    call = Call("call_a", "weather", {"city": "Oslo"})
    fake.push(
        Reply(calls=[call], finish_on_last_delta=True), Reply(calls=[call], finish_reason=None)
    )
    async with openai(fake) as llm:
        on_last = await events_of(llm, request(tools=(WEATHER,)))
        at_end = await events_of(llm, request(tools=(WEATHER,)))
    expected = ToolCallEvent(ToolCallBlock("call_a", "weather", {"city": "Oslo"}))
    assert on_last[0] == expected and isinstance(on_last[1], UsageEvent)
    assert at_end == [UsageEvent(Usage(input_tokens=10, output_tokens=5)), expected]


async def test_bad_empty_and_double_encoded_arguments() -> None:
    fake = OpenAIFake()
    fake.push(
        Reply(
            calls=[
                Call("c1", "weather", '{"city": "Os'),
                Call("c2", "weather", ""),
                Call("c3", "weather", '"{\\"city\\": \\"Oslo\\"}"'),
            ]
        )
    )
    async with openai(fake) as llm:
        calls = calls_of(await events_of(llm, request(tools=(WEATHER,))))
    assert [c.arguments for c in calls] == [{"_raw": '{"city": "Os'}, {}, {"city": "Oslo"}]
    assert decode_arguments("[1, 2]") == {"_raw": "[1, 2]"} and decode_arguments("null") == {}


async def test_usage_maps_cached_and_reasoning_tokens() -> None:
    fake = OpenAIFake()
    usage = {
        "prompt_tokens": 3000,
        "completion_tokens": 400,
        "cached_tokens": 2048,
        "reasoning_tokens": 256,
    }
    fake.push(Reply("hi", usage=usage))
    async with openai(fake) as llm:
        events = await events_of(llm, request())
    assert events[-1] == UsageEvent(
        Usage(input_tokens=3000, output_tokens=400, cached_tokens=2048, thinking_tokens=256)
    )


async def test_concurrent_streams_keep_their_calls_apart() -> None:
    fake = OpenAIFake()

    def handler(body: dict[str, Any]) -> Reply:
        city = body["messages"][-1]["content"]
        calls = [
            Call(f"call_{city}_{n}", "weather", {"city": city, "n": n}, pieces=6) for n in range(3)
        ]
        return Reply(calls=calls, style="interleaved")

    fake.handler = handler
    results: dict[str, list[ToolCallBlock]] = {}
    async with openai(fake) as llm:

        async def one(city: str) -> None:
            results[city] = calls_of(
                await events_of(llm, request(user(TextBlock(city)), tools=(WEATHER,)))
            )

        async with trio.open_nursery() as nursery:
            for city in ("Oslo", "Rome", "Lima"):
                nursery.start_soon(one, city)
    assert len(results) == 3
    for city, calls in results.items():
        assert calls == [
            ToolCallBlock(f"call_{city}_{n}", "weather", {"city": city, "n": n}) for n in range(3)
        ]


async def test_the_fake_also_answers_plain_json() -> None:
    fake = OpenAIFake()
    fake.push(Reply("plain", calls=[Call("call_a", "weather", {"city": "Oslo"})]))
    async with openai(fake) as llm:
        client = await llm.client()
        completion = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}]
        )
    (choice,) = completion.choices
    assert choice.message.content == "plain" and choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None and choice.message.tool_calls[0].id == "call_a"
    assert completion.usage is not None and completion.usage.total_tokens == 15


# --- configuration --------------------------------------------------------------------------------


async def test_no_key_with_a_base_url_sends_a_placeholder() -> None:
    fake = OpenAIFake(api_key=None)
    fake.push(text_reply("local"))
    async with fake.serve() as url:
        llm = OpenAILLM(model="llama3.2", base_url=url)
        try:
            assert (await events_of(llm, request()))[0] == TextDelta("local")
        finally:
            await llm.aclose()
    assert fake.log.requests[0].headers["authorization"] == "Bearer not-needed"


async def test_the_default_url_ignores_the_environment_and_aclose_closes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    llm = OpenAILLM(model=MODEL, api_key="sk-x")
    client = await llm.client()
    assert str(client.base_url) == "https://api.openai.com/v1/"
    assert (client.max_retries, client.timeout) == (0, 120.0)
    assert await llm.client() is client
    await llm.aclose()
    assert client.is_closed()


def test_error_events_name_what_is_retryable() -> None:
    retryable = [
        ("server_error", "boom"),
        (None, "Internal server error"),
        ("503", "x"),
        (None, "Model overloaded"),
    ]
    final = [
        ("invalid_request_error", "Input exceeds 512 tokens"),
        (None, "Invalid prompt"),
        ("400", "bad"),
    ]
    assert [stream_error_is_retryable(k, m) for k, m in retryable] == [True] * len(retryable)
    assert [stream_error_is_retryable(k, m) for k, m in final] == [False] * len(final)
    assert stream_error_is_retryable("rate_limit_exceeded", "slow down")


def test_from_config_and_the_missing_key_error() -> None:
    section = OpenAIConfig(api_key="sk-x", model_name="gpt-5-mini", timeout_s=30)
    llm = OpenAILLM.from_config(Config(openai=section))
    assert (llm.model, llm.api_key, llm.base_url) == (
        "gpt-5-mini",
        "sk-x",
        "https://api.openai.com/v1",
    )
    assert llm.timeout_s == llm.stall_timeout_s == 30
    local = OpenAILLM.from_config(Config(openai=OpenAIConfig(base_url="http://localhost:11434/v1")))
    assert (local.api_key, local.base_url, local.provider) == (
        "not-needed",
        "http://localhost:11434/v1",
        "openai",
    )
    with pytest.raises(ConfigError, match=r"^openai\.api_key: not set") as info:
        OpenAILLM.from_config(Config(openai=OpenAIConfig()))
    assert "\n" not in str(info.value)


def test_the_fake_refuses_what_the_api_refuses() -> None:
    hi = {"role": "user", "content": "hi"}
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "n", "arguments": "{}"}}
        ],
    }
    result = {"role": "tool", "tool_call_id": "t1", "content": "r"}
    ok = {
        "model": "m",
        "messages": [hi, call, result],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert validate(ok) is None
    object_args = dict(
        call,
        tool_calls=[{"id": "t1", "type": "function", "function": {"name": "n", "arguments": {}}}],
    )
    bad_tool = {"type": "function", "function": {"name": "a b"}}
    bad_image = {
        "role": "user",
        "content": [{"type": "image_url", "image_url": {"url": "file:///x.png"}}],
    }
    cases: dict[str, dict[str, Any]] = {
        "you must provide a model parameter": {"messages": [hi]},
        "Unrecognized request argument supplied: thinking": ok | {"thinking": {}},
        "Invalid 'messages': empty array": {"model": "m", "messages": []},
        "Invalid value: 'bot'": {"model": "m", "messages": [{"role": "bot", "content": "x"}]},
        "Missing required parameter: 'messages[0].content'": {
            "model": "m",
            "messages": [{"role": "user"}],
        },
        "Expected a valid URL or a base64-encoded data URL": {
            "model": "m",
            "messages": [bad_image],
        },
        "needs content or tool_calls": {
            "model": "m",
            "messages": [hi, {"role": "assistant", "content": None}],
        },
        "expected a string, but got dict": {"model": "m", "messages": [hi, object_args, result]},
        "must be a response to a preceeding message": {"model": "m", "messages": [hi, result]},
        "did not have response messages: t1": {"model": "m", "messages": [hi, call, hi]},
        "Invalid 'tools': empty array": {"model": "m", "messages": [hi], "tools": []},
        "does not match pattern": {"model": "m", "messages": [hi], "tools": [bad_tool]},
        "only allowed when 'stream' is enabled": {
            "model": "m",
            "messages": [hi],
            "stream_options": {},
        },
    }
    for expected, body in cases.items():
        problem = validate(body)
        assert problem is not None and expected in problem.message, (expected, problem)
    deepseek = validate(ok, deepseek_thinking=True)
    assert deepseek is not None and "reasoning_content" in deepseek.message


# --- a whole turn through the runtime -------------------------------------------------------------


async def echo(ctx: ToolContext, text: str) -> str:
    """Repeat the text.

    Args:
        text: What to repeat.
    """
    await trio.lowlevel.checkpoint()
    return f"{text} (from {ctx.call_id})"


async def test_a_runtime_turn_with_a_tool_round_trip(tmp_path: Path) -> None:
    fake = OpenAIFake()

    def handler(body: dict[str, Any]) -> Reply:
        last = body["messages"][-1]
        if last["role"] == "tool":
            return Reply(
                f"The echo said: {last['content']}",
                usage={"prompt_tokens": 80, "completion_tokens": 9},
            )
        return Reply(
            "Echoing.",
            reasoning="Echo it.",
            calls=[Call("call_echo", "echo", {"text": "pong"})],
            usage={"prompt_tokens": 60, "completion_tokens": 30},
        )

    fake.handler = handler
    tools = [tool_from_function(echo)]
    async with openai(fake) as llm, serve_runtime(tmp_path, llm, tools=tools) as h:
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
    assert history[-1].content == "The echo said: pong (from call_echo)"
    assert metrics.tool_calls == 1 and fake.rejections == []
    first, second = fake.bodies
    (tool,) = first["tools"]
    assert tool["function"]["name"] == "echo" and tool["function"]["parameters"]["required"] == [
        "text"
    ]
    assert second["messages"][2:] == [
        {
            "role": "assistant",
            "content": "Echoing.",
            "tool_calls": [sent_call("call_echo", '{"text":"pong"}', "echo")],
        },
        {"role": "tool", "tool_call_id": "call_echo", "content": "pong (from call_echo)"},
    ]
