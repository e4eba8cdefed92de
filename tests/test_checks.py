"""The live checks of kesoku/host/checks.py against the loopback fakes and the Pub/Sub emulator.

Each check is run for real: the model backends' SDKs against the provider fakes (a refused key
included), the Discord REST fake, the Pub/Sub emulator (skipped, saying why, where it is not
installed), the sandbox probe of this machine.
"""

from __future__ import annotations

import importlib.util
import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from fakes.discord_api import BOT_ID, serve_discord
from test_gchat_emulator import emulator  # noqa: F401 (the session's emulator, a fixture)

from kesoku.config.settings import (
    AgentConfig,
    ClaudeConfig,
    Config,
    GeminiConfig,
    LocalConfig,
    OpenAIConfig,
    SandboxConfig,
)
from kesoku.host.checks import (
    PROBE_MAX_TOKENS,
    PROBE_PROMPT,
    Check,
    check_discord_token,
    check_gchat_subscription,
    check_model,
    check_sandbox,
    find_openai_servers,
    render_check,
)
from kesoku.testing.fakes.anthropic_api import AnthropicFake, Reply, Text, text_reply
from kesoku.testing.fakes.gemini_api import GeminiFake
from kesoku.testing.fakes.gemini_replies import answer
from kesoku.testing.fakes.openai_api import OpenAIFake
from kesoku.testing.fakes.server import serve_app
from kesoku.tools.sandbox import Sandbox

GOOD, BAD = "sk-ant-good-key-0123456789", "sk-ant-refused-key-9876543210"


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def claude(url: str, key: str | None, **agent: object) -> Config:
    return Config(
        agent=AgentConfig(llm="claude", **agent),  # type: ignore[arg-type]
        claude=ClaudeConfig(api_key=key, base_url=url),
    )


# -- the model ------------------------------------------------------------------------------------


async def test_a_refused_claude_key_says_why_and_which_variable_and_a_good_one_answers() -> None:
    fake = AnthropicFake(api_key=GOOD)
    fake.push(text_reply("OK"))
    async with fake.serve() as url:
        # a fallback that would answer must not hide the refusal
        refused = await check_model(claude(url, BAD, fallback=("local",)))
        good = await check_model(claude(url, GOOD))
    assert not refused.ok
    assert refused.what == "model claude/claude-sonnet-4-6"
    assert "HTTP 401" in refused.detail and "invalid x-api-key" in refused.detail
    assert "ANTHROPIC_API_KEY" in refused.fix and BAD not in refused.detail + refused.fix
    assert good.ok and good.detail.startswith("answered in ") and good.detail.endswith(" s")
    # one small call each, no retry
    sent = [r.headers["authorization"] for r in fake.log.requests]
    assert sent == [f"Bearer {BAD}", f"Bearer {GOOD}"]
    body = fake.bodies[-1]
    assert body["max_tokens"] == PROBE_MAX_TOKENS and "system" not in body and "tools" not in body
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": PROBE_PROMPT}]}
    ]


async def test_a_provider_message_quoting_the_key_is_masked() -> None:
    # OpenAI's 401 says "Incorrect API key provided: <the key>" (the fake quotes it whole)
    fake = OpenAIFake(api_key="sk-test-the-right-one")
    wrong = "sk-wrong-0123456789abcdef"
    async with fake.serve() as url:
        cfg = Config(
            agent=AgentConfig(llm="openai"),
            openai=OpenAIConfig(api_key=wrong, base_url=url, model_name="served-model"),
        )
        result = await check_model(cfg)
    assert not result.ok and "Incorrect API key provided" in result.detail
    assert wrong not in result.detail and "[redacted" in result.detail
    assert "OPENAI_API_KEY" in result.fix


async def test_a_refused_gemini_key_names_gemini_api_key() -> None:
    fake = GeminiFake([answer("OK")], api_keys=("AIza-good-0123456789",))
    async with serve_app(fake.app) as url:
        results = [
            await check_model(
                Config(
                    agent=AgentConfig(llm="gemini"),
                    gemini=GeminiConfig(api_key=key, base_url=url),
                )
            )
            for key in ("AIza-refused-0123456789", "AIza-good-0123456789")
        ]
    refused, good = results
    assert not refused.ok and "API key not valid" in refused.detail
    assert "GEMINI_API_KEY" in refused.fix and "AIza-refused" not in refused.detail
    assert good.ok and good.what == "model gemini/gemini-2.5-flash"


async def test_a_server_that_is_not_there_or_too_slow_is_one_line_with_the_base_url() -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    cfg = Config(agent=AgentConfig(llm="openai"), openai=OpenAIConfig(base_url=url))
    absent = await check_model(cfg)
    assert not absent.ok and "connect" in absent.detail.lower()
    assert absent.fix == f"is the server at {url} running? ([openai] base_url)"
    fake = AnthropicFake(api_key=GOOD)
    fake.push(Reply([Text("OK")], delay=(1, 60.0)))  # stalls after its first event
    async with fake.serve() as base:
        slow = await check_model(claude(base, GOOD), timeout_s=1.0)
    assert not slow.ok and slow.detail == "no answer within 1 s"
    assert base in slow.fix


async def test_a_backend_that_cannot_be_built_says_what_to_set() -> None:
    unset = await check_model(Config(agent=AgentConfig(llm="claude")))
    assert unset == Check(
        ok=False,
        what="model claude/claude-sonnet-4-6",
        detail="claude.api_key: not set (nor ANTHROPIC_API_KEY)",
        fix='set it, or use Vertex AI with claude.auth_mode = "vertex" and claude.project_id',
    )
    missing = Config(agent=AgentConfig(llm="local"), local=LocalConfig(model_path="/no/such.gguf"))
    result = await check_model(missing)
    assert not result.ok and result.what == "model local/such"
    assert "no such file" in result.detail or "not installed" in result.detail


@pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None, reason="needs the kesoku[local] extra"
)
async def test_the_bundled_model_answers_and_is_said_to_be_small() -> None:
    result = await check_model(Config(agent=AgentConfig(llm="local")), timeout_s=300)
    assert result.ok, render_check(result)
    assert result.what == "model local/SmolLM2-135M-Instruct"
    assert result.detail.startswith("the small offline model: short answers, no tools; answered in")


# -- Discord --------------------------------------------------------------------------------------


async def test_the_bot_token_is_checked_by_its_identity_and_intent() -> None:
    async with serve_discord() as fake:
        fake.token = "the-bot-token.abc"
        api = f"{fake.base_url}/api/v10"
        refused = await check_discord_token("a-wrong-token.xyz", api_base_url=api)
        no_intent = await check_discord_token("the-bot-token.abc", api_base_url=api)
        fake.app_flags = 1 << 19  # GATEWAY_MESSAGE_CONTENT_LIMITED
        good = await check_discord_token("the-bot-token.abc", api_base_url=api)
        sent = [r.headers.get("authorization") for r in fake.log.requests]
    assert not refused.ok and refused.detail == "401 Unauthorized: Discord refused the token"
    assert "DISCORD_TOKEN" in refused.fix and "a-wrong-token" not in refused.detail
    assert no_intent.ok and no_intent.detail == f"bot kesoku (id {BOT_ID})"
    assert "Message Content intent" in no_intent.fix
    assert good == Check(ok=True, what="Discord bot token", detail=f"bot kesoku (id {BOT_ID})")
    assert sent[0] == "Bot a-wrong-token.xyz" and set(sent[1:]) == {"Bot the-bot-token.abc"}


async def test_discord_out_of_reach_is_a_failed_check_not_an_error() -> None:
    api = f"http://127.0.0.1:{closed_port()}/api/v10"
    result = await check_discord_token("tok\nen", api_base_url=api)  # not even a header value
    assert not result.ok and result.what == "Discord bot token" and "tok\nen" not in result.detail
    result = await check_discord_token("token.abc", api_base_url=api)
    assert not result.ok and "ConnectError" in result.detail


# -- Google Chat ----------------------------------------------------------------------------------


@pytest.fixture
def subscription(emulator: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:  # noqa: F811
    """A fresh topic and subscription in the emulator; yields the project and the short name."""
    from google.cloud import pubsub_v1  # type: ignore[import-untyped]

    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", emulator)
    project, name = "kesoku-checks", f"kesoku-{uuid.uuid4().hex[:12]}"
    publisher = pubsub_v1.PublisherClient()
    subscriber = pubsub_v1.SubscriberClient()
    topic = publisher.topic_path(project, f"chat-{name}")
    path = subscriber.subscription_path(project, name)
    publisher.create_topic(name=topic)
    subscriber.create_subscription(name=path, topic=topic)
    yield project, name
    subscriber.delete_subscription(subscription=path)
    publisher.delete_topic(topic=topic)
    subscriber.close()
    publisher.transport.close()


async def test_the_subscription_is_found_in_the_emulator_and_a_missing_one_is_not(
    subscription: tuple[str, str],
) -> None:
    project, name = subscription
    found = await check_gchat_subscription(project, name, None)
    full = await check_gchat_subscription(
        "ignored", f"projects/{project}/subscriptions/{name}", None
    )
    missing = await check_gchat_subscription(project, "no-such-subscription", None)
    path = f"projects/{project}/subscriptions/{name}"
    assert found == Check(
        ok=True,
        what="Google Chat subscription",
        detail=f"{path} exists (topic projects/{project}/topics/chat-{name})",
    )
    assert full == found
    assert not missing.ok and missing.detail.endswith("/no-such-subscription does not exist")
    assert "gcloud pubsub subscriptions create" in missing.fix


async def test_an_unreadable_credentials_file_or_a_missing_extra_is_a_failed_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PUBSUB_EMULATOR_HOST", raising=False)
    absent = await check_gchat_subscription("p", "s", str(tmp_path / "key.json"))
    assert not absent.ok and absent.detail.startswith(f"credentials file {tmp_path / 'key.json'}")
    (tmp_path / "key.json").write_text("{}")
    broken = await check_gchat_subscription("p", "s", str(tmp_path / "key.json"))
    assert not broken.ok and "service-account key file" in broken.fix
    import google.cloud

    # as if it were not installed: `from google.cloud import pubsub_v1` raises ImportError
    monkeypatch.delattr(google.cloud, "pubsub_v1", raising=False)
    monkeypatch.setitem(sys.modules, "google.cloud.pubsub_v1", None)
    result = await check_gchat_subscription("p", "s", None)
    assert not result.ok and result.fix == "pip install 'kesoku[gchat]'"


# -- servers on this machine, the sandbox ---------------------------------------------------------


async def test_openai_compatible_servers_are_found_with_their_models() -> None:
    openai, other = OpenAIFake(model_id="llama3.2"), AnthropicFake()
    async with openai.serve() as url, other.serve() as not_openai:
        nothing = f"http://127.0.0.1:{closed_port()}/v1"
        found = await find_openai_servers([nothing, f"{not_openai}/v1", url], timeout_s=5)
    assert found == [(url, ["llama3.2"])]


def test_the_sandbox_check_follows_the_probe_and_names_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here = check_sandbox(Config())
    works = Sandbox(SandboxConfig()).probe().mechanism is not None
    assert here.what == "sandbox" and here.ok is works, render_check(here)
    off = check_sandbox(Config(sandbox=SandboxConfig(mode="off")))
    assert off.ok and off.fix == '[sandbox] mode = "auto"'
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap to be found
    absent = check_sandbox(Config(sandbox=SandboxConfig(mode="bwrap")))
    assert not absent.ok and "bubblewrap is not installed" in absent.detail
    assert absent.fix.startswith("apt install bubblewrap")


def test_a_check_is_one_line_and_its_fix_the_next() -> None:
    assert render_check(Check(ok=True, what="a", detail="b")) == "✓ a: b"
    assert render_check(Check(ok=True, what="a", detail="b", fix="c")) == "⚠ a: b\n  fix: c"
    assert render_check(Check(ok=False, what="a", detail="b", fix="c")) == "✗ a: b\n  fix: c"
    assert msgspec.json.decode(
        msgspec.json.encode(Check(ok=False, what="a", detail="b")), type=Check
    )
