"""kesoku.config.settings: Structs, loading, env fallbacks, paths, errors, the committed files."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from kesoku.config import settings as config_module
from kesoku.config.settings import (
    ClaudeConfig,
    Config,
    config_json_schema,
    default_config_path,
    get_config,
    load_config,
    set_config,
)
from kesoku.vocab.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
BAD = sorted((DATA / "configs" / "bad").glob("*.toml"))
REGENERATE = ".venv/bin/kesoku config schema > schema/kesoku.schema.json"


def write(tmp_path: Path, text: str, name: str = "kesoku.toml") -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def error_of(path: Path | str, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, env=env or {})
    message = str(info.value)
    assert "\n" not in message
    return message


# --- defaults and structure -------------------------------------------------------------------


def test_an_empty_file_is_the_default_config(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, ""), env={})
    assert msgspec.structs.replace(cfg, workspace=Config().workspace) == Config()
    assert cfg.agent.llm is None
    assert cfg.agent.max_steps_per_turn == 50
    assert cfg.shell.mode == "blocklist"
    assert cfg.compaction.threshold == 0.85
    assert cfg.mcp.servers == ()


def test_config_is_frozen() -> None:
    cfg = Config()
    with pytest.raises(AttributeError):
        cfg.agent = cfg.agent  # type: ignore[misc]
    with pytest.raises(AttributeError):
        cfg.shell.mode = "allowlist"  # type: ignore[misc]


def test_post_init_errors_come_back_from_msgspec_with_the_section_path() -> None:
    # The error rewriting relies on this msgspec behaviour; an upgrade that changes it fails here.
    with pytest.raises(
        msgspec.ValidationError,
        match=r"^blocklist_patterns\[0\]: invalid regex .* - at `\$\.shell`$",
    ):
        msgspec.convert({"shell": {"blocklist_patterns": ["("]}}, Config)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://[::1", "'http://[::1' is not a URL (Invalid IPv6 URL)"),
        ("http://127.0.0.1:99999/v1", "is not a URL (Port out of range 0-65535)"),
        ("not a url", "'not a url': expected an http:// or https:// URL with a host"),
        ("ftp://x/v1", "'ftp://x/v1': expected an http:// or https:// URL with a host"),
    ],
)
def test_an_endpoint_a_model_sdk_would_choke_on_is_refused_in_one_line(
    tmp_path: Path, url: str, problem: str
) -> None:
    path = tmp_path / "kesoku.toml"
    path.write_text(f'[openai]\nbase_url = "{url}"\n')
    with pytest.raises(ConfigError, match=re.escape(problem)) as caught:
        load_config(path, env={})
    assert str(caught.value).startswith(f"{path}:2: openai.base_url: ")
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    with pytest.raises(ConfigError, match=re.escape(problem)) as caught:
        load_config(empty, env={"OPENAI_BASE_URL": url})
    assert str(caught.value).startswith("$OPENAI_BASE_URL (for openai.base_url): ")
    ok = load_config(empty, env={"OPENAI_BASE_URL": "http://127.0.0.1:11434/v1"})
    assert ok.openai.base_url == "http://127.0.0.1:11434/v1"


@pytest.mark.parametrize(
    ("key", "good", "bad", "expected"),
    [
        ("discord.api_base_url", "http://127.0.0.1:80/api/v10", "wss://x/", "an http:// or https"),
        ("discord.gateway_url", "ws://127.0.0.1:8000/", "https://x/api", "a ws:// or wss://"),
        ("gchat.chat_api_endpoint", "http://[::1]:8000", "chat.googleapis.com", "an http://"),
        ("gchat.iam_endpoint", "https://proxy.example/iam", "http:///v1", "an http://"),
    ],
)
def test_an_adapter_endpoint_is_a_url_of_its_kind_or_refused_in_one_line(
    tmp_path: Path, key: str, good: str, bad: str, expected: str
) -> None:
    section, name = key.split(".")
    path = tmp_path / "kesoku.toml"
    path.write_text(f'[{section}]\nenabled = false\n{name} = "{bad}"\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    assert str(caught.value).startswith(f"{path}:3: {key}: {bad!r}: expected {expected}")
    path.write_text(f'[{section}]\n{name} = "{good}"\n')
    assert getattr(getattr(load_config(path, env={}), section), name) == good


def test_claude_auth_mode_is_vertex_only_with_a_project_and_no_key() -> None:
    assert ClaudeConfig().resolved_auth_mode == "api_key"
    assert ClaudeConfig(project_id="p").resolved_auth_mode == "vertex"
    assert ClaudeConfig(project_id="p", api_key="k").resolved_auth_mode == "api_key"
    assert ClaudeConfig(auth_mode="vertex", api_key="k").resolved_auth_mode == "vertex"


def test_mcp_servers_are_a_tagged_union(tmp_path: Path) -> None:
    text = """
[[mcp.servers]]
name = "files"
transport = "stdio"
command = "mcp-files"
args = ["--root", "/srv"]
env = { LOG = "1" }

[[mcp.servers]]
name = "search"
transport = "http"
url = "http://localhost:9000/mcp"
headers = { Authorization = "Bearer t" }
include_tools = ["query"]
"""
    stdio, http = load_config(write(tmp_path, text), env={}).mcp.servers
    assert isinstance(stdio, config_module.McpStdioServer)
    assert (stdio.command, stdio.args, stdio.env) == ("mcp-files", ("--root", "/srv"), {"LOG": "1"})
    assert isinstance(http, config_module.McpHttpServer)
    assert (http.url, http.include_tools, http.timeout_s) == (
        "http://localhost:9000/mcp",
        ("query",),
        60.0,
    )


# --- the seed's sample and the reference kesoku.toml --------------------------------------------


def test_the_seed_sample_config_decodes_with_its_meaning() -> None:
    cfg = load_config(DATA / "seed_config.toml", env={})
    assert cfg.agent.llm == "gemini"
    assert cfg.gemini.api_key == "your-api-key"
    assert (cfg.gemini.auth_mode, cfg.gemini.thinking_level) == ("api_key", "high")
    assert (cfg.gemini.project_id, cfg.gemini.location) == ("gcp-project-id", "us-central1")
    assert cfg.claude.model_name == "claude-3-5-sonnet@20241022"
    assert cfg.claude.resolved_auth_mode == "vertex"
    assert cfg.discord.user_allowlist == ("allowed_username",)
    (channel,) = cfg.discord.channels
    assert (channel.channels, channel.llm, channel.auto_thread) == (
        ("channel_id_or_name",),
        "claude",
        False,
    )
    # The seed's patterns are the defaults, and they mean what they say.
    assert cfg.shell == Config().shell
    assert re.search(cfg.shell.blocklist_patterns[0], "sudo rm -rf /")
    assert re.search(cfg.shell.allowlist_patterns[0], "git status")


def test_reference_kesoku_toml_is_exactly_the_defaults() -> None:
    cfg = load_config(REPO / "kesoku.toml", env={})
    assert msgspec.structs.replace(cfg, workspace=Config().workspace) == Config()
    assert cfg.workspace.db_path == str(REPO / "kesoku.db")


def test_reference_kesoku_toml_starts_with_the_schema_directive() -> None:
    first = (REPO / "kesoku.toml").read_text(encoding="utf-8").splitlines()[0]
    assert first == "#:schema ./schema/kesoku.schema.json"


def test_reference_kesoku_toml_mentions_every_key() -> None:
    text = (REPO / "kesoku.toml").read_text(encoding="utf-8")
    structs: list[type[msgspec.Struct]] = [Config, config_module.DiscordChannel]
    structs += [config_module.McpStdioServer, config_module.McpHttpServer]
    structs += [type(getattr(Config(), f.name)) for f in msgspec.structs.fields(Config)]
    missing = [
        f"{struct.__name__}.{field.name}"
        for struct in structs
        for field in msgspec.structs.fields(struct)
        if not re.search(rf"(?m)^(# )?(\[+[a-z.]*)?{field.name}\b", text)
    ]
    assert not missing, f"kesoku.toml does not document: {', '.join(missing)}"


def test_reference_kesoku_toml_examples_are_valid_when_uncommented(tmp_path: Path) -> None:
    text = (REPO / "kesoku.toml").read_text(encoding="utf-8")
    uncommented = re.sub(r'(?m)^# ((?:\[|[a-z_"][\w":.]* =).*)$', r"\1", text)
    cfg = load_config(write(tmp_path, uncommented), env={})
    assert cfg.agent.llm == "gemini"
    assert cfg.discord.channels[0].auto_thread is False
    assert [s.name for s in cfg.mcp.servers] == ["files", "search"]
    assert cfg.compaction.context_windows == {"qwen3:8b": 40960}


# --- JSON Schema ----------------------------------------------------------------------------------


def test_committed_schema_is_current() -> None:
    expected = json.dumps(config_json_schema(), indent=2, sort_keys=True) + "\n"
    committed = (REPO / "schema" / "kesoku.schema.json").read_text(encoding="utf-8")
    assert committed == expected, f"schema/kesoku.schema.json is stale; regenerate it: {REGENERATE}"


def test_schema_describes_the_config() -> None:
    schema = config_json_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["title"] == "Kesoku configuration (kesoku.toml)"
    assert schema["additionalProperties"] is False
    assert set(schema["properties"]) == {f.name for f in msgspec.structs.fields(Config)}
    agent = schema["$defs"]["AgentConfig"]["properties"]
    assert agent["max_steps_per_turn"]["exclusiveMinimum"] == 0
    assert "description" in agent["llm"]


# --- errors ---------------------------------------------------------------------------------------


def test_the_bad_config_corpus_is_large_enough() -> None:
    assert len(BAD) >= 18


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_bad_config_gives_one_line_naming_file_line_and_key(path: Path) -> None:
    first = path.read_bytes().split(b"\n", 1)[0].decode("ascii")
    assert first.startswith("# expect: ")
    expect = first.removeprefix("# expect: ")
    assert re.match(r"\d+(:\d+)?: ", expect), "every corpus case names a line"
    message = error_of(path)
    assert message.startswith(f"{path}:{expect}"), message


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    assert error_of(path) == f"{path}: no such file"


def test_directory(tmp_path: Path) -> None:
    assert error_of(tmp_path) == f"{tmp_path}: is a directory, expected a TOML file"


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file(tmp_path: Path) -> None:
    path = write(tmp_path, "")
    path.chmod(0)
    try:
        assert error_of(path) == f"{path}: permission denied (cannot read the file)"
    finally:
        path.chmod(0o600)


def test_a_file_that_fails_to_read_is_one_line() -> None:
    # Kesoku targets Linux; this runs as root too (unlike the permission test): /proc/self/mem at
    # offset 0 is EIO.
    path = Path("/proc/self/mem")
    assert error_of(path) == f"{path}: cannot read: Input/output error"


def test_kesoku_config_pointing_nowhere_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "typo.toml"
    with pytest.raises(ConfigError, match=r"typo\.toml: no such file"):
        load_config(env={"KESOKU_CONFIG": str(path)})


# --- environment fallbacks ------------------------------------------------------------------------

ALL_ENV = {
    "GEMINI_API_KEY": "g-key",
    "GOOGLE_API_KEY": "google-key",
    "ANTHROPIC_API_KEY": "a-key",
    "OPENAI_API_KEY": "o-key",
    "OPENAI_BASE_URL": "http://localhost:11434/v1",
    "DISCORD_TOKEN": "d-token",
    "GOOGLE_APPLICATION_CREDENTIALS": "creds/sa.json",
    "GOOGLE_CLOUD_PROJECT": "proj",
    "GOOGLE_CLOUD_LOCATION": "europe-west4",
}


def test_environment_fills_unset_keys(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, ""), env=ALL_ENV)
    assert cfg.gemini.api_key == "g-key"
    assert cfg.claude.api_key == "a-key"
    assert (cfg.openai.api_key, cfg.openai.base_url) == ("o-key", "http://localhost:11434/v1")
    assert cfg.discord.bot_token == "d-token"
    # Taken as given: Google's libraries resolve it against the working directory too.
    assert cfg.gchat.credentials_file == "creds/sa.json"
    assert cfg.gemini.project_id == cfg.claude.project_id == cfg.gchat.project_id == "proj"
    assert cfg.gemini.location == cfg.claude.location == "europe-west4"


def test_google_api_key_is_the_second_choice_and_empty_counts_as_unset(tmp_path: Path) -> None:
    path = write(tmp_path, "")
    assert load_config(path, env={"GOOGLE_API_KEY": "google-key"}).gemini.api_key == "google-key"
    env = {"GEMINI_API_KEY": "", "GOOGLE_API_KEY": "google-key", "GOOGLE_CLOUD_LOCATION": ""}
    cfg = load_config(path, env=env)
    assert cfg.gemini.api_key == "google-key"
    assert cfg.gemini.location == "us-central1"


def test_the_file_wins_over_the_environment(tmp_path: Path) -> None:
    text = """
[gemini]
api_key = "file-key"
location = "us-central1"
[claude]
project_id = "file-proj"
[discord]
bot_token = "file-token"
"""
    cfg = load_config(write(tmp_path, text), env=ALL_ENV)
    assert cfg.gemini.api_key == "file-key"
    assert cfg.gemini.location == "us-central1"  # written in the file, though it is the default
    assert cfg.claude.project_id == "file-proj"
    assert cfg.discord.bot_token == "file-token"
    assert cfg.claude.location == "europe-west4"  # not in the file: the environment fills it


def test_kesoku_config_selects_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, '[agent]\nllm = "local"\n', name="elsewhere.toml")
    assert load_config(env={"KESOKU_CONFIG": str(path)}).agent.llm == "local"
    assert default_config_path({"KESOKU_CONFIG": str(path)}) == path


def test_default_path_is_local_kesoku_toml_then_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert default_config_path({"KESOKU_CONFIG": ""}) is None
    write(tmp_path, '[agent]\nllm = "openai"\n')
    assert default_config_path({}) == Path("kesoku.toml")
    assert load_config(env={}).agent.llm == "openai"


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda p: p.mkdir(), "is a directory"),
        (lambda p: p.symlink_to("gone.toml"), "no such file"),
        (lambda p: os.mkfifo(p), "not a regular file"),
    ],
    ids=["folder", "broken-link", "fifo"],
)
def test_a_local_kesoku_toml_that_is_no_file_is_reported_not_ignored(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    make: Callable[[Path], object],
    reason: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    make(tmp_path / "kesoku.toml")
    assert default_config_path({}) == Path("kesoku.toml")
    with pytest.raises(ConfigError, match=f"^kesoku.toml: {reason}"):
        load_config(env={})


# --- paths ----------------------------------------------------------------------------------------


def test_relative_paths_are_relative_to_the_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    text = """
[workspace]
db_path = "state/kesoku.db"
sessions_dir = "/var/lib/kesoku/sessions"
[gchat]
credentials_file = "sa.json"
[local]
model_path = "../models/m.gguf"
"""
    conf_dir = tmp_path / "etc"
    cfg = load_config(write(conf_dir, text), env={})
    assert cfg.workspace.db_path == str(conf_dir / "state" / "kesoku.db")
    assert cfg.workspace.skills_dir == str(conf_dir / "skills")
    assert cfg.workspace.sessions_dir == "/var/lib/kesoku/sessions"
    assert cfg.gchat.credentials_file == str(conf_dir / "sa.json")
    assert cfg.local.model_path == str(conf_dir / ".." / "models" / "m.gguf")


def test_a_relative_config_path_still_resolves_absolutely(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "conf", "")
    cfg = load_config("conf/kesoku.toml", env={})
    assert cfg.workspace.db_path == str(tmp_path / "conf" / "kesoku.db")


def test_without_a_file_paths_are_relative_to_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = load_config(env={})
    assert cfg.workspace.db_path == str(tmp_path / "kesoku.db")
    assert cfg.workspace.sessions_dir == str(tmp_path / "sessions")


# --- get_config / set_config ----------------------------------------------------------------------


def test_get_config_before_set_config_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config_module, "_current", None)
    with pytest.raises(RuntimeError, match=r"set_config\(load_config"):
        get_config()
    cfg = Config(agent=config_module.AgentConfig(llm="scripted"))
    set_config(cfg)
    assert get_config() is cfg


def test_readable_and_shareable_roots_resolve_and_reach_the_path_gates(tmp_path: Path) -> None:
    from kesoku.tools.paths import PathGates

    conf = tmp_path / "kesoku.toml"
    conf.write_text('[workspace]\nreadable_roots = ["docs"]\nshareable_roots = ["/srv/out"]\n')
    cfg = load_config(conf, env={})
    assert cfg.workspace.readable_roots == (str(tmp_path / "docs"),)
    assert cfg.workspace.shareable_roots == ("/srv/out",)
    gates = PathGates.from_config(cfg, config_file=conf)
    assert Path(tmp_path / "docs") in gates.readable_roots
    assert Path("/srv/out") in gates.shareable_roots


def test_an_mcp_servers_cwd_is_relative_to_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "kesoku.toml").write_text(
        '[[mcp.servers]]\nname = "a"\ntransport = "stdio"\ncommand = "x"\ncwd = "srv"\n'
        '[[mcp.servers]]\nname = "b"\ntransport = "stdio"\ncommand = "y"\n'
    )
    servers = load_config(tmp_path / "conf" / "kesoku.toml", env={}).mcp.servers
    assert [getattr(s, "cwd", None) for s in servers] == [str(tmp_path / "conf" / "srv"), None]
