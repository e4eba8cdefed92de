"""kesoku.toml as frozen msgspec Structs: load once at startup, read anywhere with get_config().

Every key has a default, so an empty file (or none) is a valid config. Unknown keys are errors: a
misspelt key silently ignored is the costliest config bug. Sequences are tuples so a shared Config
cannot change by accident; mappings stay dicts (msgspec has no frozen mapping). Errors are one line:
``kesoku.toml:14: discord.channels[0].auto_thread: expected bool, got str`` (a ConfigError).
"""

from __future__ import annotations

import math
import os
import re
import stat
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import msgspec

from kesoku.config.explain import explain
from kesoku.vocab.errors import ConfigError

Backend = Literal["gemini", "claude", "openai", "local", "scripted"]
ThinkingLevel = Literal["minimal", "low", "medium", "high"]
AuthMode = Literal["api_key", "vertex"]


def _doc(text: str, **bounds: Any) -> msgspec.Meta:
    return msgspec.Meta(description=text, **bounds)


# Empty strings are rejected for secrets: `api_key = ""` would otherwise reach the API as a key.
Secret = Annotated[str, msgspec.Meta(min_length=1)]
Seconds = Annotated[float, msgspec.Meta(gt=0)]
PositiveInt = Annotated[int, msgspec.Meta(gt=0)]
Usd = Annotated[float, msgspec.Meta(ge=0)]
Tokens = Annotated[int, msgspec.Meta(ge=0)]


class _Section(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Shared struct options; msgspec reads kw_only per class and mypy wants frozen repeated."""


class WorkspaceConfig(_Section, frozen=True, kw_only=True):
    """Where Kesoku keeps its state. Relative paths are relative to the config file's folder."""

    db_path: Annotated[str, _doc("SQLite database file (messages, sessions, cursors).")] = (
        "kesoku.db"
    )
    skills_dir: Annotated[str, _doc("Folder of skills, one sub-folder with a SKILL.md each.")] = (
        "skills"
    )
    sessions_dir: Annotated[str, _doc("Folder of per-session workspaces (sessions/<id>/).")] = (
        "sessions"
    )
    readable_roots: Annotated[
        tuple[str, ...], _doc("Folders every tool may read besides the workspace.")
    ] = ()
    shareable_roots: Annotated[
        tuple[str, ...],
        _doc("Folders [file: /abs/path] may send from besides the session workspace."),
    ] = ()


class AgentConfig(_Section, frozen=True, kw_only=True):
    """The agent loop: which model backend and how long a turn may run."""

    # Unset: the backends pick one from the API keys present, and 'local' (offline) when there is
    # none.
    llm: Annotated[
        Backend | None, _doc("Model backend. Unset: by API keys present, else 'local'.")
    ] = None
    persona: Annotated[str, _doc("Opening of the system prompt: who the agent is.")] = (
        "You are Kesoku, an autonomous agent: act with your tools, check your work, "
        "answer briefly and truthfully."
    )
    max_steps_per_turn: Annotated[
        int, _doc("Model calls allowed in one turn before it stops.", gt=0)
    ] = 50
    max_identical_calls: Annotated[
        int,
        _doc(
            "Runs of one identical tool call returning the same in a turn; then refused. 0: off.",
            ge=0,
        ),
    ] = 2
    fallback: Annotated[
        tuple[Backend, ...], _doc("Backends tried in order if the chosen one fails.")
    ] = ()
    project_dir: Annotated[
        str | None,
        _doc(
            "Working folder; its AGENTS.md/CLAUDE.md join the system prompt. Unset: the session's."
        ),
    ] = None
    worker_idle_s: Annotated[
        Seconds,
        _doc(
            "An idle session worker is stopped after this long (its history is reloaded from "
            "the database when the session speaks again)."
        ),
    ] = 60.0
    max_retries: Annotated[
        int,
        _doc(
            "Retries of a model call after a rate limit, overload, 5xx or dropped connection.", ge=0
        ),
    ] = 4
    retry_cap_s: Annotated[
        Seconds, _doc("Longest backoff between two retries (jittered, doubling).")
    ] = 30.0
    shutdown_grace_s: Annotated[
        Seconds, _doc("On SIGTERM, how long running tools may take to finish.")
    ] = 180.0
    question_timeout_s: Annotated[
        Seconds,
        _doc("How long a question to the user (Allow / Deny) waits; no answer counts as Deny."),
    ] = 300.0

    def __post_init__(self) -> None:
        for i, backend in enumerate(self.fallback):
            if backend == "scripted":
                # A replayed script answering for a failed real model would look like a working
                # agent.
                raise _invalid(
                    f"fallback[{i}]",
                    "'scripted' replays a scenario and is never a fallback; remove it",
                )


class ScriptedConfig(_Section, frozen=True, kw_only=True):
    """The scripted backend: replays a YAML scenario of model steps (tests, demos, bug reports)."""

    path: Annotated[
        str | None, _doc("Scenario file (YAML) replayed when a backend is 'scripted'.")
    ] = None


class GeminiConfig(_Section, frozen=True, kw_only=True):
    """Gemini (google-genai): an API key, or Vertex AI with Application Default Credentials."""

    model_name: Annotated[str, _doc("Gemini model id.")] = "gemini-2.5-flash"
    auth_mode: Annotated[AuthMode, _doc("Gemini API key, or Vertex AI (ADC).")] = "api_key"
    api_key: Annotated[
        Secret | None, _doc("API key; else GEMINI_API_KEY, then GOOGLE_API_KEY.")
    ] = None
    project_id: Annotated[
        str | None, _doc("GCP project for vertex; else GOOGLE_CLOUD_PROJECT.")
    ] = None
    location: Annotated[str, _doc("Vertex AI region; else GOOGLE_CLOUD_LOCATION.")] = "us-central1"
    # medium, not the seed sample's high: a chat daemon answers faster and cheaper; high is one key
    # away.
    thinking_level: Annotated[ThinkingLevel, _doc("Reasoning effort (a thinking budget).")] = (
        "medium"
    )
    base_url: Annotated[str | None, _doc("Override of the API endpoint (proxies, tests).")] = None

    def __post_init__(self) -> None:
        _check_url("base_url", self.base_url)

    context_caching_threshold: Annotated[
        int, _doc("Cache prompts from this many tokens.", gt=0)
    ] = 4096
    timeout_s: Annotated[Seconds, _doc("Timeout of one request, and of a stalled stream.")] = 120.0


class ClaudeConfig(_Section, frozen=True, kw_only=True):
    """Anthropic Claude: direct with an API key, or on Vertex AI."""

    model_name: Annotated[str, _doc("Model id (Vertex AI may want a dated form).")] = (
        "claude-sonnet-4-6"
    )
    auth_mode: Annotated[AuthMode | None, _doc("Unset: vertex if project_id and no api_key.")] = (
        None
    )
    api_key: Annotated[Secret | None, _doc("API key; else ANTHROPIC_API_KEY.")] = None
    project_id: Annotated[
        str | None, _doc("GCP project for Vertex AI; else GOOGLE_CLOUD_PROJECT.")
    ] = None
    location: Annotated[str, _doc("Vertex AI region; else GOOGLE_CLOUD_LOCATION.")] = "us-east5"
    thinking_level: Annotated[ThinkingLevel, _doc("Reasoning effort (a thinking budget).")] = (
        "medium"
    )
    max_output_tokens: Annotated[
        int, _doc("Output tokens of one call, thinking included.", gt=0)
    ] = 16384
    base_url: Annotated[str | None, _doc("Override of the API endpoint (proxies, tests).")] = None

    def __post_init__(self) -> None:
        _check_url("base_url", self.base_url)

    context_caching_threshold: Annotated[
        int, _doc("Cache prompts from this many tokens.", gt=0)
    ] = 1024
    timeout_s: Annotated[Seconds, _doc("Timeout of one request, and of a stalled stream.")] = 120.0

    @property
    def resolved_auth_mode(self) -> AuthMode:
        """auth_mode, or the automatic choice when it is unset."""
        if self.auth_mode is not None:
            return self.auth_mode
        return "vertex" if self.project_id and not self.api_key else "api_key"


class OpenAIConfig(_Section, frozen=True, kw_only=True):
    """Any OpenAI-compatible chat completions server: OpenAI, Ollama, vLLM, llama.cpp, LM Studio."""

    model_name: Annotated[str, _doc("Model id as the server knows it.")] = "gpt-5-mini"
    api_key: Annotated[Secret | None, _doc("API key; else OPENAI_API_KEY.")] = None
    base_url: Annotated[str | None, _doc("Server URL (Ollama: http://localhost:11434/v1).")] = None
    timeout_s: Annotated[Seconds, _doc("Timeout of one request, and of a stalled stream.")] = 120.0

    def __post_init__(self) -> None:
        _check_url("base_url", self.base_url)


class LocalConfig(_Section, frozen=True, kw_only=True):
    """The offline model run by llama-cpp-python (extra: kesoku[local])."""

    model_path: Annotated[
        str | None, _doc("GGUF file. Unset: the bundled SmolLM2-135M-Instruct.")
    ] = None
    n_ctx: Annotated[
        int,
        _doc(
            "Context window in tokens; memory grows with it (a larger window than the model was "
            "trained on only degrades its answers). At most 1,048,576.",
            gt=0,
            le=1_048_576,
        ),
    ] = 8192
    n_threads: Annotated[PositiveInt | None, _doc("CPU threads. Unset: llama.cpp decides.")] = None
    tools: Annotated[
        bool,
        _doc(
            "Offer the agent's tools (replies become grammar-constrained JSON). Off: plain chat, "
            "which the bundled 135M model answers better; it rarely makes a useful tool call."
        ),
    ] = False


class HeartbeatConfig(_Section, frozen=True, kw_only=True):
    """A periodic run that speaks only when something needs attention ([heartbeat])."""

    every: Annotated[str, _doc("Period (30m, 2h). Empty: no heartbeat.")] = ""
    target: Annotated[
        str, _doc("Where it runs: own, session:ID, discord:CHANNEL_ID or gchat:SPACE.")
    ] = "own"
    prompt: Annotated[str, _doc("What each run says. Default: act on HEARTBEAT.md.")] = (
        "Read HEARTBEAT.md in the working directory, if there is one, and do what it asks. "
        "If nothing needs the user's attention, answer exactly HEARTBEAT_OK and nothing else."
    )

    def __post_init__(self) -> None:
        if not self.every and self.target == "own":
            return  # the default: nothing to check, and no zoneinfo for every command's start
        # Checked here, so `kesoku config check` refuses what `kesoku start` would.
        from kesoku.vocab.schedule import ScheduleError, check_target, parse_duration

        try:
            if self.every:
                parse_duration(self.every)
            check_target(self.target)
        except ScheduleError as exc:
            key, _, problem = str(exc).partition(": ")
            raise _invalid(key, problem) from None


class BudgetConfig(_Section, frozen=True, kw_only=True):
    """Spend caps ([budget]), checked before every model call; 0 = no cap.

    A day is the daemon's local calendar day. Spend is read from the ledger in the database, so caps
    hold across restarts and count every process on it (ARCHITECTURE.md, "Spend caps").
    """

    session_usd: Annotated[float, _doc("US dollars one session may spend. 0: no cap.", ge=0)] = 0.0
    session_tokens: Annotated[
        int, _doc("Tokens (input + output) one session may use. 0: no cap.", ge=0)
    ] = 0
    day_usd: Annotated[float, _doc("US dollars all sessions may spend a day. 0: no cap.", ge=0)] = (
        0.0
    )
    day_tokens: Annotated[int, _doc("Tokens all sessions may use a day. 0: no cap.", ge=0)] = 0

    def __post_init__(self) -> None:
        _finite_usd(self)


class CapOverrides(_Section, frozen=True, kw_only=True):
    """Caps of an adapter or of some channels; an unset key keeps [budget]'s (0 = no cap).

    ``session_*`` replace [budget]'s for these sessions; ``day_*`` cap these sessions together, in
    addition to [budget]'s day caps.
    """

    session_usd: Annotated[Usd | None, _doc("US dollars one session may spend.")] = None
    session_tokens: Annotated[Tokens | None, _doc("Tokens one session may use.")] = None
    day_usd: Annotated[Usd | None, _doc("US dollars these sessions may spend a day.")] = None
    day_tokens: Annotated[Tokens | None, _doc("Tokens these sessions may use a day.")] = None

    def __post_init__(self) -> None:
        _finite_usd(self)


_HTTP = ("http", "https")
_WEBSOCKET = ("ws", "wss")


def _url_schema(schemes: tuple[str, ...]) -> dict[str, str]:
    # For editors: the JSON Schema's view of what _check_url enforces.
    return {"format": "uri", "pattern": f"^({'|'.join(schemes)})://[^/?#]"}


def _check_url(key: str, url: str | None, schemes: tuple[str, ...] = _HTTP) -> None:
    # An endpoint an SDK would choke on (a traceback at the first call) is refused here.
    if url is None:
        return
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
    except ValueError as exc:
        raise _invalid(key, f"{url!r} is not a URL ({exc})") from None
    if parts.scheme not in schemes or not parts.hostname:
        names = " or ".join(f"{scheme}://" for scheme in schemes)
        article = "an" if names.startswith("h") else "a"  # "an http://", "a ws://"
        raise _invalid(key, f"{url!r}: expected {article} {names} URL with a host")


def _finite_usd(caps: BudgetConfig | CapOverrides) -> None:
    # TOML has inf and nan; "no cap" is 0, and a cap must be a sum the ledger can reach.
    for key, value in (("session_usd", caps.session_usd), ("day_usd", caps.day_usd)):
        if value is not None and not math.isfinite(value):
            raise _invalid(key, f"expected a finite number of US dollars (0: no cap), not {value}")


DISCORD_API_BASE_URL = "https://discord.com/api/v10"
"""Discord's REST API root, as discord.py's ``discord.http.Route.BASE``."""
DISCORD_GATEWAY_URL = "wss://gateway.discord.gg/"
"""Discord's gateway, as discord.py's ``DiscordWebSocket.DEFAULT_GATEWAY``."""
CHAT_API_ENDPOINT = "https://chat.googleapis.com"
"""The Google Chat REST API."""
IAM_CREDENTIALS_ENDPOINT = "https://iamcredentials.googleapis.com"
"""The IAM Service Account Credentials API (``generateAccessToken`` for impersonation)."""


class DiscordChannel(_Section, frozen=True, kw_only=True):
    """Overrides for some channels; the first entry that names a channel wins."""

    channels: Annotated[tuple[str, ...], _doc("Channel ids or names.", min_length=1)]
    llm: Annotated[Backend | None, _doc("Backend for these channels. Unset: agent.llm.")] = None
    auto_thread: Annotated[
        bool, _doc("Open a thread per conversation; false answers in the channel.")
    ] = True
    budget: Annotated[CapOverrides, _doc("Spend caps of these channels.")] = msgspec.field(
        default_factory=CapOverrides
    )

    @property
    def label(self) -> str:
        """The entry's name in the spend ledger and in messages: its channels, comma-separated."""
        return ",".join(self.channels)


class DiscordConfig(_Section, frozen=True, kw_only=True):
    """The Discord bot (extra: kesoku[discord])."""

    enabled: Annotated[bool, _doc("Run the Discord adapter.")] = False
    bot_token: Annotated[Secret | None, _doc("Bot token; else DISCORD_TOKEN.")] = None
    chatbot_id: Annotated[str, _doc("Adapter name stored with each session.")] = "discord"
    user_allowlist: Annotated[tuple[str, ...], _doc("Users answered without a mention.")] = ()
    channels: Annotated[tuple[DiscordChannel, ...], _doc("Per-channel overrides.")] = ()
    budget: Annotated[CapOverrides, _doc("Spend caps of Discord sessions.")] = msgspec.field(
        default_factory=CapOverrides
    )
    api_base_url: Annotated[
        str,
        _doc(
            "REST API root, up to /api/v10 (a proxy, a test fake).",
            extra_json_schema=_url_schema(_HTTP),
        ),
    ] = DISCORD_API_BASE_URL
    gateway_url: Annotated[
        str,
        _doc(
            "Gateway websocket URL (a proxy, a test fake).",
            extra_json_schema=_url_schema(_WEBSOCKET),
        ),
    ] = DISCORD_GATEWAY_URL

    def __post_init__(self) -> None:
        _check_url("api_base_url", self.api_base_url, _HTTP)
        _check_url("gateway_url", self.gateway_url, _WEBSOCKET)


class GChatSpace(_Section, frozen=True, kw_only=True):
    """Overrides for some spaces; the first entry that names a space wins."""

    spaces: Annotated[
        tuple[str, ...], _doc("Space names (spaces/AAAA…) or display names.", min_length=1)
    ]
    llm: Annotated[Backend | None, _doc("Backend for these spaces. Unset: gchat.llm.")] = None
    budget: Annotated[CapOverrides, _doc("Spend caps of these spaces.")] = msgspec.field(
        default_factory=CapOverrides
    )

    @property
    def label(self) -> str:
        """The entry's name in the spend ledger and in messages: its spaces, comma-separated."""
        return ",".join(self.spaces)


class GChatConfig(_Section, frozen=True, kw_only=True):
    """The Google Chat app over a Pub/Sub pull subscription (extra: kesoku[gchat])."""

    enabled: Annotated[bool, _doc("Run the Google Chat adapter.")] = False
    chatbot_id: Annotated[str, _doc("Adapter name stored with each session.")] = "gchat"
    project_id: Annotated[
        str | None, _doc("GCP project of Pub/Sub; else GOOGLE_CLOUD_PROJECT.")
    ] = None
    subscription: Annotated[str | None, _doc("Pub/Sub subscription the Chat app publishes to.")] = (
        None
    )
    credentials_file: Annotated[str | None, _doc("Service-account key file.")] = None
    impersonate_service_account: Annotated[str | None, _doc("Service account to impersonate.")] = (
        None
    )
    reaction_emoji: Annotated[
        str | None, _doc("Emoji added to each incoming message (user ADC).")
    ] = None
    llm: Annotated[Backend | None, _doc("Backend for Google Chat. Unset: agent.llm.")] = None
    budget: Annotated[CapOverrides, _doc("Spend caps of Google Chat sessions.")] = msgspec.field(
        default_factory=CapOverrides
    )
    spaces: Annotated[tuple[GChatSpace, ...], _doc("Per-space overrides.")] = ()
    chat_api_endpoint: Annotated[
        str,
        _doc("Chat REST API root (a proxy, a test fake).", extra_json_schema=_url_schema(_HTTP)),
    ] = CHAT_API_ENDPOINT
    iam_endpoint: Annotated[
        str,
        _doc(
            "IAM Credentials API root, for impersonate_service_account (a proxy, a test fake).",
            extra_json_schema=_url_schema(_HTTP),
        ),
    ] = IAM_CREDENTIALS_ENDPOINT

    def __post_init__(self) -> None:
        _check_url("chat_api_endpoint", self.chat_api_endpoint, _HTTP)
        _check_url("iam_endpoint", self.iam_endpoint, _HTTP)


class ShellConfig(_Section, frozen=True, kw_only=True):
    """The shell tool and its command policy (regexes checked on every simple command)."""

    enabled: Annotated[bool, _doc("Offer the shell tool to the model.")] = True
    use_shell: Annotated[bool, _doc("Run through /bin/sh (pipes, redirects) instead of argv.")] = (
        True
    )
    mode: Annotated[Literal["allowlist", "blocklist"], _doc("Which pattern list applies.")] = (
        "blocklist"
    )
    allowlist_patterns: Annotated[
        tuple[str, ...], _doc("Regexes (re.match from the program on) of allowed commands.")
    ] = (r"^(echo|ls|pwd|cat|git|uv|grep|find|python|sed|awk)(\s|$)",)
    blocklist_patterns: Annotated[
        tuple[str, ...], _doc("Regexes (re.match from the program on) of refused commands.")
    ] = (r"(\b|^)(rm|sudo|shutdown|reboot|mkfs|dd|chmod|chown)(\b|\s|$)",)
    timeout_s: Annotated[Seconds, _doc("A command running longer is stopped.")] = 120.0
    max_output_bytes: Annotated[int, _doc("Output kept per command (head and tail).", gt=0)] = (
        32_000
    )

    def __post_init__(self) -> None:
        for key in ("allowlist_patterns", "blocklist_patterns"):
            for i, pattern in enumerate(getattr(self, key)):
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise _invalid(f"{key}[{i}]", f"invalid regex {pattern!r}: {exc}") from None


class RunCodeConfig(_Section, frozen=True, kw_only=True):
    """The run_code tool: a Python snippet run in a fresh temporary folder, in a subprocess."""

    enabled: Annotated[
        bool, _doc("Offer run_code. It can do anything Python can: off by default.")
    ] = False
    timeout_s: Annotated[Seconds, _doc("A snippet running longer is stopped.")] = 60.0
    max_output_bytes: Annotated[int, _doc("Output kept per run (head and tail).", gt=0)] = 32_000


SandboxMode = Literal["auto", "bwrap", "landlock", "off"]


class SandboxConfig(_Section, frozen=True, kw_only=True):
    """The OS sandbox around each process a tool starts (shell, run_code, sandboxed MCP servers)."""

    mode: Annotated[
        SandboxMode,
        _doc(
            "auto: bubblewrap, else Landlock; bwrap or landlock: only that one; "
            "off: none (warned at start)."
        ),
    ] = "auto"
    network: Annotated[
        bool, _doc("Let sandboxed processes reach the network (off: no network at all).")
    ] = False
    env: Annotated[
        tuple[Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], ...],
        _doc(
            "Environment variables passed to tools besides PATH, HOME, LANG, LC_*, TERM, TZ, USER …"
        ),
    ] = ()


class SubagentConfig(_Section, frozen=True, kw_only=True):
    """The subagent tool: a child turn loop with the parent's tools, for a self-contained task."""

    enabled: Annotated[bool, _doc("Offer the subagent tool.")] = True
    max_steps: Annotated[
        int, _doc("Model calls a subagent may make before it must conclude.", gt=0)
    ] = 20


class TurnLogsConfig(_Section, frozen=True, kw_only=True):
    """Each model call as YAML: sessions/<id>/llm-turn-{idx}.log.yaml (shown by `kesoku trace`)."""

    enabled: Annotated[bool, _doc("Write a turn log for every model call.")] = True
    max_mb_per_session: Annotated[
        float,
        _doc(
            "Megabytes of turn logs kept per session, oldest deleted first; 0 keeps all.",
            ge=0,
            le=1_000_000,
        ),
    ] = 256

    @property
    def max_bytes_per_session(self) -> int:
        """The cap in bytes; 0: no cap.

        A tiny positive cap is at least one byte (it keeps the newest log).
        """
        return math.ceil(self.max_mb_per_session * 1_000_000)


class CompactionConfig(_Section, frozen=True, kw_only=True):
    """Progressive compaction that keeps long sessions inside the context window."""

    enabled: Annotated[bool, _doc("Compact automatically (/compact works either way).")] = True
    threshold: Annotated[
        float, _doc("Compact above this fraction of the context window.", gt=0, le=1)
    ] = 0.85
    context_windows: Annotated[
        dict[str, PositiveInt], _doc("Tokens per model name (overrides).")
    ] = {}
    thresholds: Annotated[
        dict[str, Annotated[float, msgspec.Meta(gt=0, le=1)]],
        _doc("Per-model threshold (overrides)."),
    ] = {}
    tool_result_share: Annotated[
        float,
        _doc(
            "Most of the context window one tool result may fill (tools' own caps still apply).",
            gt=0,
            le=1,
        ),
    ] = 0.2


class ModelPrice(_Section, frozen=True, kw_only=True):
    """What a model costs, in US dollars per million tokens (the provider's price list)."""

    input_usd_per_mtok: Annotated[float, _doc("Input tokens (not cached).", ge=0)]
    output_usd_per_mtok: Annotated[float, _doc("Output tokens, thinking included.", ge=0)]
    cached_input_usd_per_mtok: Annotated[
        Usd | None, _doc("Cached input tokens. Unset: the input price.")
    ] = None
    cache_write_usd_per_mtok: Annotated[
        Usd | None, _doc("Input tokens written to the cache. Unset: the input price.")
    ] = None


class PricingConfig(_Section, frozen=True, kw_only=True):
    """Prices of models ([pricing.models."model-id"]), over the built-in table.

    The built-in table (:mod:`kesoku.config.prices`) prices the models Kesoku knows; an entry here
    adds a model or replaces its built-in price. A model id is priced by its exact entry, else by
    the longest entry it starts with.
    """

    models: Annotated[dict[str, ModelPrice], _doc("Price per model id.")] = {}


class _McpServer(_Section, frozen=True, kw_only=True, tag_field="transport"):
    """Fields every MCP server has; `transport` picks the kind."""

    name: Annotated[str, _doc("Unique name; tools appear as <name>__<tool>.", min_length=1)]
    enabled: Annotated[bool, _doc("Connect to this server.")] = True
    include_tools: Annotated[tuple[str, ...], _doc("Only these tools. Empty: all.")] = ()
    exclude_tools: Annotated[tuple[str, ...], _doc("Never these tools.")] = ()
    timeout_s: Annotated[Seconds, _doc("Timeout of one tool call.")] = 60.0


class McpStdioServer(_McpServer, frozen=True, kw_only=True, tag="stdio"):
    """An MCP server started as a subprocess speaking over stdin/stdout."""

    command: Annotated[str, _doc("Program to run.", min_length=1)]
    args: Annotated[tuple[str, ...], _doc("Its arguments.")] = ()
    env: Annotated[dict[str, str], _doc("Extra environment variables.")] = {}
    cwd: Annotated[
        str | None, _doc("Working directory, relative to the config file. Unset: Kesoku's.")
    ] = None
    sandbox: Annotated[
        bool,
        _doc(
            "Run the server in the OS sandbox of [sandbox]; "
            "it may write only its cwd and a private /tmp."
        ),
    ] = False


class McpHttpServer(_McpServer, frozen=True, kw_only=True, tag="http"):
    """An MCP server reached over Streamable HTTP."""

    url: Annotated[str, _doc("Endpoint URL.", min_length=1)]
    headers: Annotated[dict[str, str], _doc("Extra HTTP headers (e.g. Authorization).")] = {}


class McpConfig(_Section, frozen=True, kw_only=True):
    """MCP servers whose tools the agent may use ([[mcp.servers]])."""

    servers: tuple[McpStdioServer | McpHttpServer, ...] = ()

    def __post_init__(self) -> None:
        first: dict[str, int] = {}
        for i, server in enumerate(self.servers):
            if server.name in first:
                problem = (
                    f"duplicate server name {server.name!r} (also servers[{first[server.name]}])"
                )
                raise _invalid(f"servers[{i}].name", problem)
            first[server.name] = i


class Config(_Section, frozen=True, kw_only=True):
    """The whole of kesoku.toml."""

    workspace: WorkspaceConfig = msgspec.field(default_factory=WorkspaceConfig)
    agent: AgentConfig = msgspec.field(default_factory=AgentConfig)
    gemini: GeminiConfig = msgspec.field(default_factory=GeminiConfig)
    claude: ClaudeConfig = msgspec.field(default_factory=ClaudeConfig)
    openai: OpenAIConfig = msgspec.field(default_factory=OpenAIConfig)
    local: LocalConfig = msgspec.field(default_factory=LocalConfig)
    scripted: ScriptedConfig = msgspec.field(default_factory=ScriptedConfig)
    discord: DiscordConfig = msgspec.field(default_factory=DiscordConfig)
    gchat: GChatConfig = msgspec.field(default_factory=GChatConfig)
    shell: ShellConfig = msgspec.field(default_factory=ShellConfig)
    run_code: RunCodeConfig = msgspec.field(default_factory=RunCodeConfig)
    sandbox: SandboxConfig = msgspec.field(default_factory=SandboxConfig)
    subagent: SubagentConfig = msgspec.field(default_factory=SubagentConfig)
    compaction: CompactionConfig = msgspec.field(default_factory=CompactionConfig)
    turn_logs: TurnLogsConfig = msgspec.field(default_factory=TurnLogsConfig)
    pricing: PricingConfig = msgspec.field(default_factory=PricingConfig)
    budget: BudgetConfig = msgspec.field(default_factory=BudgetConfig)
    heartbeat: HeartbeatConfig = msgspec.field(default_factory=HeartbeatConfig)
    mcp: McpConfig = msgspec.field(default_factory=McpConfig)


def _invalid(subpath: str, problem: str) -> ValueError:
    # msgspec appends " - at `$.section`" to a ValueError from __post_init__; the leading
    # "subpath: " is how config_errors.explain() extends that path down to the offending key.
    return ValueError(f"{subpath}: {problem}")


# --------------------------------------------------------------------------------------------------
# Loading

# (section, key, environment variables in order of preference); a key present in the file wins.
_ENV_FALLBACKS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("gemini", "api_key", ("GEMINI_API_KEY", "GOOGLE_API_KEY")),
    ("claude", "api_key", ("ANTHROPIC_API_KEY",)),
    ("openai", "api_key", ("OPENAI_API_KEY",)),
    ("openai", "base_url", ("OPENAI_BASE_URL",)),
    ("discord", "bot_token", ("DISCORD_TOKEN",)),
    ("gchat", "credentials_file", ("GOOGLE_APPLICATION_CREDENTIALS",)),
    *(
        (section, "project_id", ("GOOGLE_CLOUD_PROJECT",))
        for section in ("gemini", "claude", "gchat")
    ),
    *((section, "location", ("GOOGLE_CLOUD_LOCATION",)) for section in ("gemini", "claude")),
)

# Paths in the file are relative to the file: the systemd unit runs `kesoku start -c` from anywhere.
_PATH_KEYS: tuple[tuple[str, str], ...] = (
    *(("workspace", key) for key in ("db_path", "skills_dir", "sessions_dir")),
    ("local", "model_path"),
    ("gchat", "credentials_file"),
    ("agent", "project_dir"),
    ("scripted", "path"),
)

_OS_ERRORS: dict[type[OSError], str] = {
    FileNotFoundError: "no such file",
    IsADirectoryError: "is a directory, expected a TOML file",
    PermissionError: "permission denied (cannot read the file)",
}

_current: Config | None = None


def default_config_path(env: Mapping[str, str] | None = None) -> Path | None:
    """Return the config file Kesoku reads when none is given.

    Args:
        env: Environment to read ``KESOKU_CONFIG`` from; ``os.environ`` when None.

    Returns:
        ``$KESOKU_CONFIG`` when set (even if it does not exist, so a typo is reported), else
        ``./kesoku.toml`` when anything has that name (a folder, a broken link: loading it then
        says what is wrong), else None (all defaults).
    """
    env = os.environ if env is None else env
    if env.get("KESOKU_CONFIG"):
        return Path(env["KESOKU_CONFIG"])
    local = Path("kesoku.toml")
    return local if os.path.lexists(local) else None


def load_config(
    path: str | os.PathLike[str] | None = None, *, env: Mapping[str, str] | None = None
) -> Config:
    """Read, validate and complete a config file.

    Args:
        path: The TOML file; None means :func:`default_config_path`.
        env: Environment for the fallbacks (API keys, tokens, GCP project and location) and
            ``KESOKU_CONFIG``; ``os.environ`` when None. An empty variable counts as unset.

    Returns:
        The Config, its file paths (workspace, agent.project_dir, local.model_path, scripted.path,
        gchat.credentials_file) absolute:
        relative to the file's folder, or to the current directory when there is no file; ``~``
        expanded. Keys the file does not set are filled from the environment.

    Raises:
        ConfigError: The file is missing or unreadable, is not UTF-8 TOML, or holds an unknown key
            or a wrong value. The message is one line: ``file:line: key.path: what was expected``.
    """
    env = os.environ if env is None else env
    file = Path(path) if path is not None else default_config_path(env)
    if file is None:
        data: dict[str, Any] = {}
        text, base = "", Path.cwd()
    else:
        data, text = _read_toml(file)
        base = file.resolve().parent
    try:
        cfg = msgspec.convert(data, Config)
    except msgspec.ValidationError as exc:
        raise ConfigError(
            explain(str(exc), data, os.fspath(file or "kesoku.toml"), text, Config)
        ) from None
    _check_scripted(cfg, os.fspath(file or "kesoku.toml"), text)
    return _apply_env(_resolve_paths(cfg, base), data, env)


def _check_scripted(cfg: Config, name: str, text: str) -> None:
    """A backend set to 'scripted' needs the scenario it replays.

    Checked at load, not at the first message.
    """
    chosen = [("agent.llm", cfg.agent.llm), ("gchat.llm", cfg.gchat.llm)]
    chosen += [(f"discord.channels[{i}].llm", c.llm) for i, c in enumerate(cfg.discord.channels)]
    for key, backend in chosen:
        if backend == "scripted" and cfg.scripted.path is None:
            line = next(
                (n for n, ln in enumerate(text.splitlines(), 1) if ln.strip().startswith("llm")),
                None,
            )
            where = f"{name}:{line}" if line else name
            raise ConfigError(
                f"{where}: scripted.path: required when {key} = 'scripted' "
                "(the scenario file to replay)"
            )


def set_config(cfg: Config) -> None:
    """Make ``cfg`` the config every module sees through :func:`get_config`.

    Args:
        cfg: The loaded config (see :func:`load_config`).
    """
    global _current
    _current = cfg


def get_config() -> Config:
    """Return the config set at startup.

    Returns:
        The Config passed to :func:`set_config`.

    Raises:
        RuntimeError: Nothing was set yet (a test or entry point forgot
            ``set_config(load_config())``).
    """
    if _current is None:
        raise RuntimeError(
            "no config loaded: call kesoku.config.settings.set_config(load_config(...)) at startup"
        )
    return _current


def config_json_schema() -> dict[str, Any]:
    """Return the JSON Schema of kesoku.toml.

    For editors (``#:schema``) and for schema/kesoku.schema.json.

    Returns:
        A JSON Schema (draft 2020-12) whose root is the Config object.
    """
    schema = msgspec.json.schema(Config)
    defs = schema["$defs"]
    # Config inlined at the root: some editors do not follow a root "$ref".
    root = defs.pop("Config")
    root["title"] = "Kesoku configuration (kesoku.toml)"
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **root, "$defs": defs}
    # Round trip: plain JSON types (tuple defaults become lists), equal to what `config schema`
    # prints.
    return typing.cast(dict[str, Any], msgspec.json.decode(msgspec.json.encode(schema)))


def _read_toml(file: Path) -> tuple[dict[str, Any], str]:
    name = os.fspath(file)
    try:
        # A FIFO or a device would block the read, or never end it
        if not stat.S_ISREG(file.stat().st_mode) and not file.is_dir():
            raise ConfigError(f"{name}: not a regular file, expected a TOML file")
        raw = file.read_bytes()
    except OSError as exc:
        reason = _OS_ERRORS.get(type(exc), f"cannot read: {exc.strerror or exc}")
        raise ConfigError(f"{name}: {reason}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"{name}:{line}: not UTF-8 (byte 0x{raw[exc.start]:02x}); save as UTF-8"
        ) from None
    try:
        return tomllib.loads(text), text
    except tomllib.TOMLDecodeError as exc:
        # Python 3.11's TOMLDecodeError has no lineno attribute: the position is only in the text.
        msg, where = str(exc), ""
        if m := re.fullmatch(r"(.*) \(at line (\d+), column (\d+)\)", msg):
            msg, where = m[1], f"{m[2]}:{m[3]}:"
        elif m := re.fullmatch(r"(.*) \(at end of document\)", msg):
            msg, where = m[1], f"{max(1, len(text.splitlines()))}:"
        raise ConfigError(f"{name}:{where} invalid TOML: {msg}") from None


def _resolve_paths(cfg: Config, base: Path) -> Config:
    for section, key in _PATH_KEYS:
        value = getattr(getattr(cfg, section), key)
        if value is not None:
            cfg = _replace(cfg, section, key, os.fspath(base / Path(value).expanduser()))
    for key in ("readable_roots", "shareable_roots"):
        roots = getattr(cfg.workspace, key)
        cfg = _replace(
            cfg, "workspace", key, tuple(os.fspath(base / Path(r).expanduser()) for r in roots)
        )
    servers = tuple(
        msgspec.structs.replace(s, cwd=os.fspath(base / Path(s.cwd).expanduser()))
        if isinstance(s, McpStdioServer) and s.cwd is not None
        else s
        for s in cfg.mcp.servers
    )
    return _replace(cfg, "mcp", "servers", servers)


def _apply_env(cfg: Config, data: Mapping[str, Any], env: Mapping[str, str]) -> Config:
    for section, key, names in _ENV_FALLBACKS:
        name = next((n for n in names if env.get(n)), None)
        if name is not None and key not in data.get(section, {}):
            try:
                cfg = _replace(cfg, section, key, env[name])
            except ValueError as exc:  # a check of the section's (__post_init__)
                raise ConfigError(f"${name} (for {section}.{key}): {exc}") from None
    return cfg


def shadowed_variables(from_file: Config, env: Mapping[str, str]) -> list[tuple[str, str]]:
    """The secrets a config file sets whose environment variable is set too, to another value.

    The file's value is the one used (a key present in the file wins), which surprises whoever just
    exported a new key.

    Args:
        from_file: The config loaded with ``env={}`` (what the file itself holds).
        env: The environment the commands run with.

    Returns:
        ``(config key, variable)`` pairs, such as ``("claude.api_key", "ANTHROPIC_API_KEY")``.
    """
    pairs = []
    for section, key, names in _ENV_FALLBACKS:
        value = getattr(getattr(from_file, section), key)
        name = next((n for n in names if env.get(n)), None)
        if key in ("api_key", "bot_token") and value and name and env[name] != str(value):
            pairs.append((f"{section}.{key}", name))
    return pairs


def _replace(cfg: Config, section: str, key: str, value: object) -> Config:
    part = msgspec.structs.replace(getattr(cfg, section), **{key: value})
    return msgspec.structs.replace(cfg, **{section: part})
