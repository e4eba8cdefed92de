"""The gemini backend end to end: the real google-genai SDK against a wire-level Gemini API fake."""

from __future__ import annotations

import base64
import datetime
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import google.oauth2.credentials
import httpx2
import pytest
import trio
import trio.testing
from runtime_harness import echo, serve_runtime

from kesoku.config.settings import Config, GeminiConfig
from kesoku.llm import gemini_convert as conv
from kesoku.llm.gemini import GeminiLLM
from kesoku.testing.fakes.gemini_api import PLACEHOLDER_SIGNATURE, GeminiFake
from kesoku.testing.fakes.gemini_replies import answer, call, chunk, reply, text, thought, usage
from kesoku.testing.fakes.server import serve_app
from kesoku.vocab.errors import BackendError, ConfigError
from kesoku.vocab.ir import (
    DocumentBlock,
    ImageBlock,
    LLMEvent,
    LLMRequest,
    LLMTurn,
    ResponseBuilder,
    StopEvent,
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
from kesoku.vocab.model import Kind, Outcome, Role, Usage

Clock = trio.testing.MockClock

MODEL = "gemini-2.5-flash"
GENERATE_PATH = f"/v1/models/{MODEL}:streamGenerateContent"
SHELL = ToolSpec(
    "shell",
    "Run a command.",
    {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
)
# Bytes whose standard base64 holds '+' and '/': the SDK sends the URL-safe alphabet, the fake must
# still recognise them, and they must come back byte for byte.
SIG_A = b"\xfb\xff\xbfsig-a\x00"
SIG_B = b"\xfa\xfe\xbesig-b"
THINKING = {"thinkingConfig": {"include_thoughts": True, "thinking_budget": 8192}}


def sig(data: bytes) -> str:
    """A signature as google-genai writes it in a request body."""
    return base64.urlsafe_b64encode(data).decode()


def user(*blocks: Any) -> LLMTurn:
    return LLMTurn("user", tuple(TextBlock(b) if isinstance(b, str) else b for b in blocks))


def model(*blocks: Any) -> LLMTurn:
    return LLMTurn("assistant", tuple(TextBlock(b) if isinstance(b, str) else b for b in blocks))


def request(
    *turns: LLMTurn, system: str = "Be brief.", tools: tuple[ToolSpec, ...] = (SHELL,)
) -> LLMRequest:
    return LLMRequest(system=system, turns=turns, tools=tools)


SYSTEM_JSON = {"parts": [{"text": "Be brief."}], "role": "user"}
TOOLS_JSON = [
    {
        "functionDeclarations": [
            {
                "name": "shell",
                "description": "Run a command.",
                "parameters_json_schema": SHELL.parameters,
            }
        ]
    }
]


@asynccontextmanager
async def served(fake: GeminiFake, **kwargs: Any) -> AsyncIterator[GeminiLLM]:
    async with serve_app(fake.app) as url:
        if not kwargs.get("vertex"):
            kwargs.setdefault("api_key", "test-key")
        kwargs.setdefault("context_caching_threshold", None)
        llm = GeminiLLM(base_url=url, timeout_s=30, **kwargs)
        try:
            # the client and the SDK's types are built in a thread, before any clock runs
            await llm.connect()
            yield llm
        finally:
            await llm.aclose()


async def collect(llm: GeminiLLM, req: LLMRequest, *, stops: bool = False) -> list[LLMEvent]:
    """A call's events; its stop reason only with ``stops`` (content tests compare whole lists)."""
    return [event async for event in llm.stream(req) if stops or not isinstance(event, StopEvent)]


async def fails(llm: GeminiLLM, req: LLMRequest) -> tuple[list[LLMEvent], BackendError]:
    events: list[LLMEvent] = []

    async def run() -> None:
        async for event in llm.stream(req):
            if not isinstance(event, StopEvent):
                events.append(event)

    with pytest.raises(BackendError) as caught:
        await run()
    return events, caught.value


# -- request bodies --------------------------------------------------------------------------------


async def test_the_request_body_maps_system_turns_attachments_results_signatures_and_tools() -> (
    None
):
    fake = GeminiFake([answer("ok")])
    fake.issue(SIG_A, SIG_B)
    turns = (
        user(
            "Look at these.",
            ImageBlock("a.png", "image/png", b"\x89PNG"),
            DocumentBlock("r.pdf", "application/pdf", "r.pdf", b"%PDF"),
        ),
        model(
            ThoughtBlock("Two commands at once.", SIG_A),
            "Running both.",
            ToolCallBlock("id-1", "shell", {"command": "date"}, SIG_B),
            ToolCallBlock("id-2", "shell", {"command": "false"}),
        ),
        user(
            ToolResultBlock("id-1", "shell", "Mon"),
            ToolResultBlock("id-2", "shell", "[failed] exit 1", Outcome.FAILED),
            "and hurry",
        ),
        model("Monday; the second failed."),
        user("Thanks"),
    )
    async with served(fake) as llm:
        events = await collect(llm, request(*turns))
    assert events == [TextDelta("ok"), UsageEvent(Usage(input_tokens=10, output_tokens=5))]
    (rec,) = fake.generate_calls
    assert (rec.method, rec.path, rec.query) == ("POST", GENERATE_PATH, {"alt": "sse"})
    assert rec.headers["x-goog-api-key"] == "test-key"
    assert rec.body == {
        "contents": [
            {
                "role": "user",
                "parts": [
                    {"text": "Look at these."},
                    {"inlineData": {"data": sig(b"\x89PNG"), "mime_type": "image/png"}},
                    {"inlineData": {"data": sig(b"%PDF"), "mime_type": "application/pdf"}},
                ],
            },
            {
                "role": "model",
                "parts": [
                    {
                        "text": "Two commands at once.",
                        "thought": True,
                        "thoughtSignature": sig(SIG_A),
                    },
                    {"text": "Running both."},
                    {
                        "functionCall": {
                            "id": "id-1",
                            "name": "shell",
                            "args": {"command": "date"},
                        },
                        "thoughtSignature": sig(SIG_B),
                    },
                    {"functionCall": {"id": "id-2", "name": "shell", "args": {"command": "false"}}},
                ],
            },
            {
                "role": "user",
                "parts": [
                    {
                        "functionResponse": {
                            "id": "id-1",
                            "name": "shell",
                            "response": {"result": "Mon"},
                        }
                    },
                    {
                        "functionResponse": {
                            "id": "id-2",
                            "name": "shell",
                            "response": {"error": "[failed] exit 1"},
                        }
                    },
                    {"text": "and hurry"},
                ],
            },
            {"role": "model", "parts": [{"text": "Monday; the second failed."}]},
            {"role": "user", "parts": [{"text": "Thanks"}]},
        ],
        "systemInstruction": SYSTEM_JSON,
        "tools": TOOLS_JSON,
        "generationConfig": THINKING,
    }


async def test_no_system_and_no_tools_are_left_out() -> None:
    fake = GeminiFake([answer("ok")])
    async with served(fake) as llm:
        await collect(llm, request(user("hi"), system="", tools=()))
    body = fake.generate_calls[0].body
    assert body == {
        "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
        "generationConfig": THINKING,
    }


@pytest.mark.parametrize(
    ("level", "model_id", "budget"),
    [
        ("minimal", MODEL, 0),
        ("low", MODEL, 1024),
        ("medium", MODEL, 8192),
        ("high", MODEL, 24576),
        ("minimal", "gemini-2.5-pro", 128),
    ],
)
async def test_thinking_levels_become_budgets(level: str, model_id: str, budget: int) -> None:
    fake = GeminiFake([answer("ok")])
    async with served(fake, thinking_level=level, model=model_id) as llm:
        await collect(llm, request(user("hi")))
    config = fake.generate_calls[0].body["generationConfig"]
    assert config == {"thinkingConfig": {"include_thoughts": True, "thinking_budget": budget}}


def test_an_assistant_turn_with_nothing_to_send_is_dropped_and_its_neighbours_merged() -> None:
    turns = [
        user("one"),
        model(ThoughtBlock("", SIG_A)),
        user("two", DocumentBlock("/w/empty.txt", "text/plain")),
    ]
    (content,) = conv.to_contents(turns)
    assert content.role == "user"
    assert [p.text for p in content.parts or ()] == ["one", "two", "[/w/empty.txt: empty file]"]


# -- streaming -------------------------------------------------------------------------------------


async def test_parallel_calls_without_ids_get_unique_ids_and_go_back_grouped_without_them() -> None:
    fake = GeminiFake(
        [
            reply(
                chunk(thought("Check both."), usage_metadata=usage(20, 0, thoughts=7)),
                chunk(
                    call("shell", {"command": "date"}, signature=SIG_A),
                    call("shell", {"command": "uptime"}),
                ),
                chunk(finish="STOP", usage_metadata=usage(20, 12, cached=4, thoughts=7)),
            ),
            answer("Both done."),
        ]
    )
    async with served(fake) as llm:
        first = request(user("date and uptime"))
        events = await collect(llm, first)
        builder = ResponseBuilder()
        for event in events:
            builder.add(event)
        response = builder.build()
        assert events[0] == ThoughtDelta("Check both.")
        assert [c.id for c in response.tool_calls] == ["gemini_1", "gemini_2"]
        assert [(c.arguments, c.signature) for c in response.tool_calls] == [
            ({"command": "date"}, SIG_A),
            ({"command": "uptime"}, None),
        ]
        assert response.usage == Usage(
            input_tokens=20, output_tokens=19, cached_tokens=4, thinking_tokens=7
        )
        results = user(
            *(ToolResultBlock(c.id, c.name, f"out {i}") for i, c in enumerate(response.tool_calls))
        )
        second = request(
            *first.turns, model(ThoughtBlock(response.thoughts), *response.tool_calls), results
        )
        await collect(llm, second)
    contents = fake.generate_calls[1].body["contents"]
    assert contents[1:] == [
        {
            "role": "model",
            "parts": [
                {"text": "Check both.", "thought": True},
                {
                    "functionCall": {"name": "shell", "args": {"command": "date"}},
                    "thoughtSignature": sig(SIG_A),
                },
                {"functionCall": {"name": "shell", "args": {"command": "uptime"}}},
            ],
        },
        {
            "role": "user",
            "parts": [
                {"functionResponse": {"name": "shell", "response": {"result": "out 0"}}},
                {"functionResponse": {"name": "shell", "response": {"result": "out 1"}}},
            ],
        },
    ]


async def test_calls_with_ids_keep_them_and_a_signature_on_text_is_kept_as_a_thought() -> None:
    fake = GeminiFake(
        [
            reply(
                chunk(text("Let me look.", signature=SIG_A)),
                chunk(call("shell", {"command": "ls"}, id="fc-9", signature=SIG_B)),
            ),
            answer("Nothing there."),
        ]
    )
    async with served(fake) as llm:
        events = await collect(llm, request(user("look")))
        assert events == [
            TextDelta("Let me look."),
            ThoughtDelta("", signature=SIG_A, signed_by="gemini"),
            ToolCallEvent(ToolCallBlock("fc-9", "shell", {"command": "ls"}, SIG_B, "gemini")),
        ]
        # As the runtime stores it: a thought message holding only the signature, the text, the
        # call.
        history = request(
            user("look"),
            model(
                ThoughtBlock("", SIG_A),
                "Let me look.",
                ToolCallBlock("fc-9", "shell", {"command": "ls"}, SIG_B),
            ),
            user(ToolResultBlock("fc-9", "shell", "(empty)")),
        )
        await collect(llm, history)
    assert fake.generate_calls[1].body["contents"][1:] == [
        {
            "role": "model",
            "parts": [
                {"text": "Let me look.", "thoughtSignature": sig(SIG_A)},
                {
                    "functionCall": {"id": "fc-9", "name": "shell", "args": {"command": "ls"}},
                    "thoughtSignature": sig(SIG_B),
                },
            ],
        },
        {
            "role": "user",
            "parts": [
                {
                    "functionResponse": {
                        "id": "fc-9",
                        "name": "shell",
                        "response": {"result": "(empty)"},
                    }
                }
            ],
        },
    ]


async def test_an_altered_signature_is_refused_like_the_real_api_and_not_retried() -> None:
    fake = GeminiFake([reply(chunk(call("shell", {"command": "ls"}, signature=SIG_A)))])
    async with served(fake) as llm:
        (event,) = await collect(llm, request(user("ls")))
        assert isinstance(event, ToolCallEvent) and event.call.signature == SIG_A
        forged = model(ToolCallBlock(event.call.id, "shell", {"command": "ls"}, SIG_A + b"!"))
        _, err = await fails(
            llm, request(user("ls"), forged, user(ToolResultBlock(event.call.id, "shell", "a")))
        )
    assert (err.status, err.retryable, err.auth) == (400, False, False)
    assert str(err) == "gemini: HTTP 400 INVALID_ARGUMENT: Corrupted thought signature."
    assert len(fake.generate_calls) == 2


def _contents(*contents: dict[str, Any]) -> dict[str, Any]:
    return {
        "contents": list(contents),
        "generationConfig": {"thinkingConfig": {"thinkingBudget": 1024}},
    }


U = {"role": "user", "parts": [{"text": "hi"}]}
CALL_PART = {"functionCall": {"name": "shell", "args": {"command": "ls"}}}
CALL = {"role": "model", "parts": [CALL_PART]}
RESULT = {
    "role": "user",
    "parts": [{"functionResponse": {"name": "shell", "response": {"result": "a"}}}],
}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"contents": []}, "contents is not specified"),
        (_contents({"role": "user", "parts": []}), "contents.parts must not be empty"),
        (_contents({"role": "user", "parts": [{"text": ""}]}), "required oneof field 'data'"),
        (
            _contents({"role": "assistant", "parts": [{"text": "x"}]}),
            "Please use a valid role: user, model.",
        ),
        (
            _contents(U, CALL, U),
            "number of function response parts is equal to the number of function call parts",
        ),
        (
            _contents(U, {**CALL, "parts": [CALL_PART, CALL_PART]}, RESULT),
            "number of function response parts",
        ),
        (
            _contents(U, RESULT),
            "function response turn comes immediately after a function call turn",
        ),
        (
            _contents(
                U,
                CALL,
                {**RESULT, "parts": [{"functionResponse": {"name": "cat", "response": {}}}]},
            ),
            "does not match",
        ),
        (
            _contents(U, CALL, RESULT),
            "Function call is missing a thought_signature in functionCall parts",
        ),
        (
            {**_contents(U), "cachedContent": "cachedContents/x", "tools": []},
            "CachedContent can not be used",
        ),
        ({**_contents(U), "cachedContent": "cachedContents/none"}, "CachedContent not found"),
    ],
)
async def test_the_fake_refuses_what_the_api_refuses(body: dict[str, Any], message: str) -> None:
    # no reply scripted: a request that passed the checks would fail differently
    fake = GeminiFake()
    # the fake made this call, with a signature
    fake.issue_for_call("shell", {"command": "ls"}, SIG_A)
    # it loads TLS certificates: off the loop
    http = await trio.to_thread.run_sync(httpx2.AsyncClient)
    async with serve_app(fake.app) as url, http:
        headers = {"x-goog-api-key": "test-key"}
        response = await http.post(
            url + GENERATE_PATH, params={"alt": "sse"}, json=body, headers=headers
        )
    assert response.status_code in (400, 403)
    error_json = response.json()["error"]
    assert error_json["code"] == response.status_code and message in error_json["message"]
    assert error_json["status"] == (
        "INVALID_ARGUMENT" if response.status_code == 400 else "PERMISSION_DENIED"
    )


async def test_a_call_gemini_did_not_make_gets_the_documented_placeholder_signature() -> None:
    # A model switch: Claude made the call; Gemini 3 validates the current turn's first call of each
    # step.
    fake = GeminiFake([answer("ok")])
    history = request(
        user("list files"),
        model(
            ToolCallBlock("toolu_01", "shell", {"command": "ls"}),
            ToolCallBlock("toolu_02", "shell", {"command": "pwd"}),
        ),
        user(ToolResultBlock("toolu_01", "shell", "a"), ToolResultBlock("toolu_02", "shell", "/")),
    )
    async with served(fake, model="gemini-3-flash-preview") as llm:
        await collect(llm, history)
    parts = fake.generate_calls[0].body["contents"][1]["parts"]
    assert [p.get("thoughtSignature") for p in parts] == [sig(PLACEHOLDER_SIGNATURE), None]


@pytest.mark.parametrize("reason", ["SAFETY", "MALFORMED_FUNCTION_CALL", "RECITATION"])
async def test_a_stop_without_an_answer_is_a_clear_error_that_is_not_retried(reason: str) -> None:
    fake = GeminiFake([reply(chunk(finish=reason, usage_metadata=usage(5, 0)))])
    async with served(fake) as llm:
        _, err = await fails(llm, request(user("hi")))
    assert (
        not err.retryable
        and f"finish reason {reason}" in str(err)
        and len(fake.generate_calls) == 1
    )


async def test_a_blocked_prompt_is_a_clear_error_and_a_stop_after_text_keeps_the_text() -> None:
    blocked = {
        "promptFeedback": {"blockReason": "PROHIBITED_CONTENT"},
        "usageMetadata": usage(5, 0),
    }
    fake = GeminiFake([reply(blocked), reply(chunk(text("Part")), chunk(finish="SAFETY"))])
    async with served(fake) as llm:
        _, err = await fails(llm, request(user("hi")))
        assert "prompt was blocked (PROHIBITED_CONTENT)" in str(err) and not err.retryable
        assert await collect(llm, request(user("hi"))) == [TextDelta("Part")]


# -- long conversations (the context-caching tests and Vertex AI) ---------------------------------

LONG = "The quick brown fox jumps over the lazy dog. " * 10  # about 110 estimated tokens
OK_EVENTS = [TextDelta("ok"), UsageEvent(Usage(input_tokens=10, output_tokens=5))]


def conversation(steps: int) -> list[LLMTurn]:
    """user, model, user, ... ending with the user: ``steps`` exchanges before the last question."""
    turns = [user(f"question 0: {LONG}")]
    for i in range(1, steps + 1):
        turns += [model(f"answer {i - 1}"), user(f"question {i}")]
    return turns


def content_json(turn: LLMTurn) -> dict[str, Any]:
    role = "model" if turn.role == "assistant" else "user"
    return {
        "role": role,
        "parts": [{"text": b.text} for b in turn.blocks if isinstance(b, TextBlock)],
    }


# -- Vertex AI -------------------------------------------------------------------------------------


async def test_vertex_mode_calls_the_vertex_paths_with_a_bearer_token() -> None:
    fake = GeminiFake([answer("ok")])
    credentials = google.oauth2.credentials.Credentials(token="test")  # type: ignore[no-untyped-call]
    vertex = {
        "vertex": True,
        "project": "proj",
        "location": "europe-west4",
        "credentials": credentials,
    }
    async with served(fake, context_caching_threshold=100, **vertex) as llm:
        await collect(llm, request(*conversation(1)))
    prefix = "/v1beta1/projects/proj/locations/europe-west4"
    create, delete = fake.cache_calls
    assert (create.method, create.path) == ("POST", f"{prefix}/cachedContents")
    assert (
        create.body["model"]
        == f"projects/proj/locations/europe-west4/publishers/google/models/{MODEL}"
    )
    (generate,) = fake.generate_calls
    assert generate.path == f"{prefix}/publishers/google/models/{MODEL}:streamGenerateContent"
    assert (
        generate.headers["authorization"] == "Bearer test"
        and "x-goog-api-key" not in generate.headers
    )
    assert (
        generate.body["cachedContent"]
        == "projects/proj/locations/europe-west4/cachedContents/fake1"
    )
    assert (delete.method, delete.path) == ("DELETE", f"{prefix}/cachedContents/fake1")


async def test_expired_vertex_credentials_are_refreshed_before_the_call() -> None:
    fake = GeminiFake([answer("ok")])
    async with serve_app(fake.app) as url:
        credentials = google.oauth2.credentials.Credentials(  # type: ignore[no-untyped-call]
            token="stale",
            refresh_token="refresh",
            token_uri=f"{url}/token",
            client_id="client",
            client_secret="secret",
            expiry=datetime.datetime(2000, 1, 1),
        )
        llm = GeminiLLM(
            vertex=True,
            project="proj",
            credentials=credentials,
            base_url=url,
            context_caching_threshold=None,
        )
        try:
            await llm.connect()
            await collect(llm, request(user("hi")))
        finally:
            await llm.aclose()
    token_request, generate = fake.log.requests
    assert (
        token_request.path == "/token"
        and generate.headers["authorization"] == "Bearer fresh-token-1"
    )


async def test_missing_application_default_credentials_are_an_auth_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    llm = GeminiLLM(vertex=True, project="proj", base_url="http://127.0.0.1:9")
    with pytest.raises(BackendError) as caught:
        await llm.connect()
    assert caught.value.auth and not caught.value.retryable
    assert str(caught.value).startswith("gemini: Vertex AI credentials: File ")


# -- configuration ---------------------------------------------------------------------------------


def test_from_config_reads_the_gemini_section() -> None:
    section = GeminiConfig(
        api_key="k",
        model_name="gemini-2.5-pro",
        thinking_level="low",
        timeout_s=30,
        base_url="http://localhost:1",
    )
    llm = GeminiLLM.from_config(Config(gemini=section))
    assert (llm.provider, llm.model, llm.api_key, llm.base_url) == (
        "gemini",
        "gemini-2.5-pro",
        "k",
        "http://localhost:1",
    )
    assert (llm.thinking_budget_tokens, llm.stall_timeout_s, llm.timeout_s, llm.vertex) == (
        1024,
        30,
        30,
        False,
    )
    assert llm.context_caching_threshold == 4096
    vertex_section = GeminiConfig(auth_mode="vertex", project_id="p", location="asia-east1")
    vertex = GeminiLLM.from_config(Config(gemini=vertex_section))
    assert (vertex.vertex, vertex.project, vertex.location, vertex.api_key) == (
        True,
        "p",
        "asia-east1",
        None,
    )
    with pytest.raises(ConfigError, match=r"^gemini\.api_key: not set"):
        GeminiLLM.from_config(Config())


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="an API key is needed"):
        GeminiLLM()
    with pytest.raises(ValueError, match="unknown thinking level 'max'"):
        GeminiLLM(api_key="k", thinking_level="max")


# -- a whole turn ----------------------------------------------------------------------------------


async def test_a_runtime_turn_with_a_tool_round_trip(tmp_path: Path) -> None:
    fake = GeminiFake(
        [
            reply(
                chunk(thought("The user wants an echo.")),
                chunk(
                    call("echo", {"text": "hi there"}, signature=SIG_A),
                    usage_metadata=usage(900, 12, thoughts=30),
                ),
            ),
            reply(
                chunk(text("It said: "), text("hi there")),
                chunk(finish="STOP", usage_metadata=usage(960, 6)),
            ),
        ]
    )
    async with serve_app(fake.app) as url:
        llm = GeminiLLM(
            model="gemini-3-flash-preview",
            api_key="test-key",
            base_url=url,
            context_caching_threshold=None,
        )
        await llm.connect()
        try:
            async with serve_runtime(tmp_path, llm, tools=[echo()]) as h:
                await h.say("Please echo 'hi there'.")
                metrics = await h.turn_end()
                history = h.history()
        finally:
            await llm.aclose()
    assert metrics.tool_calls == 1
    assert [(m.role, m.kind) for m in history] == [
        (Role.USER, Kind.TEXT),
        (Role.ASSISTANT, Kind.THOUGHT),
        (Role.ASSISTANT, Kind.TOOL_CALL),
        (Role.TOOL, Kind.TOOL_RESULT),
        (Role.ASSISTANT, Kind.TEXT),
    ]
    call_message = history[2]
    assert (
        call_message.metadata.thought_signature == SIG_A
        and call_message.metadata.call_id == "gemini_1"
    )
    assert history[3].content == "hi there" and history[4].content == "It said: hi there"
    first, second = fake.generate_calls
    assert [d["name"] for d in first.body["tools"][0]["functionDeclarations"]] == ["echo"]
    assert second.body["contents"] == [
        {"role": "user", "parts": [{"text": "Please echo 'hi there'."}]},
        {
            "role": "model",
            "parts": [
                {"text": "The user wants an echo.", "thought": True},
                {
                    "functionCall": {"name": "echo", "args": {"text": "hi there"}},
                    "thoughtSignature": sig(SIG_A),
                },
            ],
        },
        {
            "role": "user",
            "parts": [{"functionResponse": {"name": "echo", "response": {"result": "hi there"}}}],
        },
    ]
    assert second.body["systemInstruction"] == first.body["systemInstruction"]
