"""kesoku.config.redact: which secrets are masked and how, what ordinary text is left alone, which
values a config and an environment contribute, and the gateway and turn-log writer that apply it."""

from __future__ import annotations

import base64
import hashlib
import json
import struct
import uuid
import zlib
from pathlib import Path
from typing import Any

import msgspec
import pytest
from runtime_harness import close_store

from kesoku.config.redact import Redactor, configured_secrets
from kesoku.config.settings import load_config
from kesoku.gateway import Gateway
from kesoku.observe.turnlog import TurnLogEntry
from kesoku.observe.turnlog_writer import masked_entry
from kesoku.store import Store
from kesoku.vocab.ir import LLMRequest, LLMResponse, ThoughtBlock, ToolCallBlock
from kesoku.vocab.model import Kind, Metadata, Role, in_turn, user_text

GITHUB = "ghp_" + "aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dE3fG5"
FINE_GRAINED = "github_pat_11ABCDEFG0123456789abc_" + "x" * 59
OPENAI = "sk-proj-" + "Ab1_Cd2-Ef3Gh4Ij5Kl6Mn7Op8Qr9St0Uv1Wx2Yz3" * 2
OPENAI_LEGACY = "sk-" + "T3BlbkFJ" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
ANTHROPIC = "sk-ant-api03-" + "Zz9_Yy8-Xx7Ww6Vv5Uu4Tt3Ss2Rr1Qq0Pp9Oo8Nn7Mm6" + "AA"
GOOGLE_KEY = "AIza" + "SyD-1a2B3c4D5e6F7g8H9i0J1k2L3m4N5o6"
GOOGLE_OAUTH = "ya29.a0AfB_byC" + "1d2E3f4G5h6I7j8K9l0M1n2O3p4Q5r6S7t8U9v0W"
SLACK = "xoxb-123456789012-1234567890123-" + "AbCdEfGhIjKlMnOpQrStUvWx"
SLACK_HOOK = "https://hooks.slack.com/services/T00000000/B00000000/" + "X" * 24
AWS_ID = "AKIA" + "IOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFU"
PEM_BODY = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEA\nVJTUt9Us8cKjMzEfYyjiWA4R4/M2bS1G\n"
PEM = f"-----BEGIN PRIVATE KEY-----\n{PEM_BODY}-----END PRIVATE KEY-----"
ENCRYPTED = (
    PEM.replace("BEGIN ", "BEGIN RSA ")
    .replace("END ", "END RSA ")
    .replace("-----\n", "-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,0A1B2C\n\n", 1)
)
AWS_LINE = "aws_secret_access_key = "
DOTENV = "DB_PASSWORD=correct-horse\nAPI_TOKEN=abcdefghijkl"

SHAPES = [
    (f"token: {GITHUB}\n", "token: [redacted:github-token]\n"),
    (f"export GH={FINE_GRAINED}", "export GH=[redacted:github-token]"),
    (f"key {OPENAI} ok", "key [redacted:openai-key] ok"),
    (f"key {OPENAI_LEGACY}.", "key [redacted:openai-key]."),
    (f"'{ANTHROPIC}'", "'[redacted:anthropic-key]'"),
    (f"?key={GOOGLE_KEY}&x=1", "?key=[redacted:google-api-key]&x=1"),
    (f"access_token: {GOOGLE_OAUTH}", "access_token: [redacted:google-oauth-token]"),
    (f"bot {SLACK}", "bot [redacted:slack-token]"),
    (f"curl -d x {SLACK_HOOK}", "curl -d x [redacted:slack-webhook]"),
    (f"id={AWS_ID}", "id=[redacted:aws-access-key-id]"),
    (AWS_LINE + AWS_SECRET, AWS_LINE + "[redacted:aws-secret-access-key]"),
    (f'"SecretAccessKey": "{AWS_SECRET}"', '"SecretAccessKey": "[redacted:aws-secret-access-key]"'),
    (f"Cookie: jwt={JWT}; Path=/", "Cookie: jwt=[redacted:jwt]; Path=/"),
    (f"Authorization: Bearer {'q' * 30}Zz09", "Authorization: Bearer [redacted:bearer-token]"),
    (f"before\n{PEM}\nafter", "before\n[redacted:private-key]\nafter"),
    # A key file printed as JSON, and a block that an output cap cut before its END line.
    (json.dumps({"private_key": PEM + "\n"}), '{"private_key": "[redacted:private-key]\\n"}'),
    (f"-----BEGIN RSA PRIVATE KEY-----\n{PEM_BODY}(cut)", "[redacted:private-key](cut)"),
    (PEM.replace("\nVJT", "\n[… 9000 bytes cut …]\nVJT") + "\n.", "[redacted:private-key]\n."),
    (ENCRYPTED, "[redacted:private-key]"),
    ("postgres://app:hunter2@db:5432/app", "postgres://app:[redacted:password]@db:5432/app"),
    ("redis://:s3cr3t-pw@cache:6379/0", "redis://:[redacted:password]@cache:6379/0"),
    (DOTENV, "DB_PASSWORD=[redacted:password]\nAPI_TOKEN=[redacted:token]"),
    ("export STRIPE_SECRET_KEY=rk_live_51Habc", "export STRIPE_SECRET_KEY=[redacted:secret]"),
]


@pytest.mark.parametrize(("text", "masked"), SHAPES)
def test_each_shape_is_masked_with_its_kind(text: str, masked: str) -> None:
    assert Redactor().mask(text) == masked


def _png() -> bytes:
    """A real 8×8 RGB PNG, as a tool might print one base64-encoded."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    pixels = [bytes(v for x in range(8) for v in (x * 32, y * 32, (x ^ y) * 16)) for y in range(8)]
    rows = b"".join(b"\x00" + row for row in pixels)
    header = chunk(b"IHDR", struct.pack(">IIBBBBB", 8, 8, 8, 2, 0, 0, 0))
    return b"\x89PNG\r\n\x1a\n" + header + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


ORDINARY = [
    "commit 3f2a9c1d8e7b6a5f4e3d2c1b0a9f8e7d6c5b4a39\nAuthor: Ann <ann@example.com>\n",
    f"{uuid.UUID(int=0x123E4567E89B12D3A456426614174000)} {uuid.uuid4()} {uuid.uuid4().hex}",
    hashlib.sha256(b"kesoku").hexdigest() + "  kesoku.tar.gz\n",
    hashlib.sha512(b"x").hexdigest().upper(),
    base64.b64encode(_png()).decode(),
    base64.b64encode(hashlib.sha256(b"y").digest() * 40).decode(),
    "Reset your password in the settings; the password must have 12 characters. Passwords: none.",
    "password: see the vault (ask the task-force lead); SECRET_KEY is read from the environment",
    "https://example.com:8443/docs?user=ann&page=2 http://[::1]:8080/x git@github.com:org/repo.git",
    "mailto:ann@example.com ssh://git@host:22/repo https://ann@example.com/profile",
    "-rw-r--r-- 1 ann staff  4096 Jan 12 10:03 risk-assessment-framework-document-v2.md\n",
    'def login(user, password):\n    token = session.get("token")\n    return check(password)\n',
    "DATABASE_URL=postgres://app:${DB_PASSWORD}@db/app PASSWORD=$PW TOKEN=<token>",
    "API_KEY=[redacted:openai-key] ask-anthropic-support skeleton-key-for-tests",
    "ghp_short sk-tiny AKIA1234 eyJhbGciOi.eyJzdWIi",
]


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_text_comes_back_as_the_same_object(text: str) -> None:
    redactor = Redactor({"Vk3q9ZpL2m": "$DEPLOY_TOKEN"})
    assert redactor.mask(text) is text


def test_masked_text_is_a_fixed_point() -> None:
    redactor = Redactor({"Vk3q9ZpL2mX": "$DEPLOY_TOKEN"})
    text = f"{GITHUB} postgres://app:pw12345@db/x DB_PASSWORD=hunter2hunter2 Vk3q9ZpL2mX {PEM}"
    once = redactor.mask(text)
    assert once == (
        "[redacted:github-token] postgres://app:[redacted:password]@db/x"
        " DB_PASSWORD=[redacted:password] [redacted:$DEPLOY_TOKEN] [redacted:private-key]"
    )
    assert redactor.mask(once) is once


def test_literal_values_are_masked_wherever_they_appear_longest_first() -> None:
    redactor = Redactor({"hunter2hunter2": "$DB_PASS", "hunter2hunter2-and-more": "gemini.api_key"})
    text = "a=hunter2hunter2-and-more b=xhunter2hunter2x c=hunter2hunter2"
    masked = "a=[redacted:gemini.api_key] b=x[redacted:$DB_PASS]x c=[redacted:$DB_PASS]"
    assert redactor.mask(text) == masked


def test_a_message_is_masked_in_its_content_and_tool_arguments_only() -> None:
    redactor = Redactor()
    command = f"curl -H 'x: {GITHUB}'"
    arguments: dict[str, Any] = {"command": command, "env": [{"k": OPENAI}], "n": 3}
    meta = Metadata(tool_name="sh", tool_arguments=arguments, call_id="c1", thought_signature=b"s")
    root = msgspec.structs.replace(user_text("s1", "hi"), id=1)
    call = in_turn(root, Role.ASSISTANT, Kind.TOOL_CALL, f"shell({GITHUB})", metadata=meta)
    call = msgspec.structs.replace(call, external_id="ext-1")
    masked = redactor.mask_message(call)
    assert masked.content == "shell([redacted:github-token])"
    assert masked.metadata.tool_arguments == {
        "command": "curl -H 'x: [redacted:github-token]'",
        "env": [{"k": "[redacted:openai-key]"}],
        "n": 3,
    }
    kept = (masked.metadata.thought_signature, masked.metadata.call_id, masked.external_id)
    assert kept == (b"s", "c1", "ext-1")
    assert arguments == {"command": command, "env": [{"k": OPENAI}], "n": 3}  # never mutated
    clean = msgspec.structs.replace(call, content="ls", metadata=Metadata(tool_name="shell"))
    assert redactor.mask_message(clean) is clean
    nested = Metadata(tool_name="x", tool_arguments={"a": ["b", {"c": 1}]})
    listed = msgspec.structs.replace(clean, metadata=nested)
    assert redactor.mask_message(listed) is listed


# -- what a config and an environment hold ---------------------------------------------------------

CONFIG = """
[openai]
api_key = "local-openai-key-1"
[gchat]
credentials_file = "sa.json"
[[mcp.servers]]
name = "files"
transport = "stdio"
command = "mcp-files"
env = { FILES_API_TOKEN = "files-token-123", LOG_LEVEL = "debug-verbose" }
[[mcp.servers]]
name = "web"
transport = "http"
url = "https://mcp.example.com"
headers = { Authorization = "Bearer web-bearer-xyz", Accept = "application/json" }
"""
CREDENTIALS = {
    "type": "service_account",
    "private_key_id": "0123456789abcdef0123",
    "private_key": PEM + "\n",
    "client_email": "bot@proj.iam.gserviceaccount.com",
    "token_uri": "https://oauth2.googleapis.com/token",
}
ENV = {
    "DISCORD_TOKEN": "discord-token-abc",  # fills [discord] bot_token, which names it
    "DEPLOY_TOKEN": "deploy-Zq9xVw7L",
    "GOOGLE_APPLICATION_CREDENTIALS": "/etc/gcp/key.json",  # a path: it names the secret
    "SSO_TOKEN_URL": "https://sso.example.com/token",  # a URL without a password
    "TOKENIZERS_PARALLELISM": "false",  # under the length floor
    "HOME": "/home/ann-with-a-long-name",  # not a secret's name
    "PGPASSWORD": "  pg-pass-0001\n",
}


def test_configured_secrets_come_from_the_config_the_environment_and_the_key_file(
    tmp_path: Path,
) -> None:
    (tmp_path / "sa.json").write_text(json.dumps(CREDENTIALS))
    (tmp_path / "kesoku.toml").write_text(CONFIG)
    config = load_config(tmp_path / "kesoku.toml", env=ENV)
    key = "gchat.credentials_file.private_key"
    assert configured_secrets(config, ENV) == {
        "local-openai-key-1": "openai.api_key",
        "discord-token-abc": "discord.bot_token",
        "0123456789abcdef0123": "gchat.credentials_file.private_key_id",
        PEM: key,
        PEM.replace("\n", "\\n"): key,  # as `cat sa.json` shows it
        "files-token-123": "mcp.files.env.FILES_API_TOKEN",
        "Bearer web-bearer-xyz": "mcp.web.headers.Authorization",
        "web-bearer-xyz": "mcp.web.headers.Authorization",
        "deploy-Zq9xVw7L": "$DEPLOY_TOKEN",
        "pg-pass-0001": "$PGPASSWORD",
    }
    redactor = Redactor.from_config(config, ENV)
    masked = "psql with [redacted:$PGPASSWORD] as [redacted:$DEPLOY_TOKEN]"
    assert redactor.mask("psql with pg-pass-0001 as deploy-Zq9xVw7L") == masked
    named = "see /etc/gcp/key.json and https://sso.example.com/token"
    assert redactor.mask(named) is named


def test_an_unreadable_credentials_file_contributes_nothing(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    for name in ("bad.json", "missing.json"):
        (tmp_path / "kesoku.toml").write_text(f'[gchat]\ncredentials_file = "{name}"\n')
        assert configured_secrets(load_config(tmp_path / "kesoku.toml", env={}), {}) == {}


# -- where it is applied ---------------------------------------------------------------------------


async def test_the_gateway_stores_and_delivers_the_masked_message(tmp_path: Path) -> None:
    store = Store(tmp_path / "kesoku.db")
    redactor = Redactor({"Vk3q9ZpL2m": "$DEPLOY_TOKEN"})
    try:
        gateway = Gateway(store, tmp_path / "sessions", redactor=redactor)
        session = gateway.open_session("terminal", "t")
        with gateway.listen(session_id=session.id) as listener:
            clean = user_text(session.id, "what is in the log?")
            (stored_clean,) = await gateway.post_many([clean])
            stored = await gateway.post(user_text(session.id, f"use Vk3q9ZpL2m and {GITHUB}"))
            delivered = listener.take_ready()
        assert stored.content == "use [redacted:$DEPLOY_TOKEN] and [redacted:github-token]"
        assert [m.content for m in delivered] == [clean.content, stored.content]
        assert [m.content for m in store.history(session.id)] == [clean.content, stored.content]
        # Nothing to mask: the message is stored as posted (the store only fills in its ids).
        assert msgspec.structs.replace(stored_clean, id=0, root_id=0) == clean
    finally:
        await close_store(store)
    data = (tmp_path / "kesoku.db").read_bytes()
    assert b"Vk3q9ZpL2m" not in data and GITHUB.encode() not in data


def test_the_turn_log_gets_the_masked_response_and_error() -> None:
    redactor = Redactor()
    signature = b"opaque \x00 bytes"
    call = ToolCallBlock("c1", "shell", {"command": f"echo {ANTHROPIC}"}, signature)
    response = LLMResponse(
        text=f"the key is {OPENAI}",
        thoughts=f"I saw {GITHUB}",
        thought_blocks=(ThoughtBlock(f"I saw {GITHUB}", signature, "claude"),),
        tool_calls=(call,),
    )
    entry = TurnLogEntry(
        folder="/tmp/x",
        session_id="s",
        provider="claude",
        model="m",
        started_at=0.0,
        duration_s=0.1,
        request=LLMRequest(system="", turns=()),
        response=response,
        error=f"401: bad key {OPENAI}",
    )
    masked = masked_entry(redactor, entry).response
    assert masked is not None
    assert masked.text == "the key is [redacted:openai-key]"
    assert masked.thoughts == "I saw [redacted:github-token]"
    assert masked.thought_blocks == (ThoughtBlock(masked.thoughts, signature, "claude"),)
    arguments = {"command": "echo [redacted:anthropic-key]"}
    assert masked.tool_calls == (msgspec.structs.replace(call, arguments=arguments),)
    assert masked_entry(redactor, entry).error == "401: bad key [redacted:openai-key]"
    clean = msgspec.structs.replace(entry, response=LLMResponse(text="fine"), error=None)
    assert masked_entry(redactor, clean) is clean
