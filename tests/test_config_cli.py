"""`kesoku config check`, `kesoku config schema`: the real console entry point in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kesoku.config.settings import config_json_schema

REPO = Path(__file__).resolve().parent.parent
BAD = Path(__file__).resolve().parent / "data" / "configs" / "bad"
# Variables that would change what the command reads; the tests set what they need.
CLEARED = (
    "KESOKU_CONFIG",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "ANTHROPIC_API_KEY",
    "OPENAI_API_KEY",
    "DISCORD_TOKEN",
)


def kesoku(*args: str, cwd: Path = REPO, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in CLEARED} | env
    return subprocess.run(
        [sys.executable, "-m", "kesoku", *args],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def assert_operator_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_check_bad_config_prints_one_line_and_exits_2() -> None:
    path = BAD / "wrong_type_bool.toml"
    line = assert_operator_error(kesoku("config", "check", "-c", str(path)))
    assert line == f"kesoku: {path}:4: discord.channels[0].auto_thread: expected bool, got str"


def test_check_invalid_toml_and_missing_file(tmp_path: Path) -> None:
    line = assert_operator_error(
        kesoku("config", "check", "--config", str(BAD / "invalid_toml.toml"))
    )
    assert line.endswith("invalid_toml.toml:3:7: invalid TOML: Invalid value")
    missing = tmp_path / "missing.toml"
    assert (
        assert_operator_error(kesoku("config", "check", "-c", str(missing)))
        == f"kesoku: {missing}: no such file"
    )


def test_check_reads_kesoku_config_from_the_environment() -> None:
    path = BAD / "unknown_key_nested.toml"
    line = assert_operator_error(kesoku("config", "check", KESOKU_CONFIG=str(path)))
    assert line.startswith(f"kesoku: {path}:3: agent.lm: unknown key; did you mean 'llm'?")


def test_an_unknown_key_with_nothing_close_lists_the_known_ones() -> None:
    path = BAD / "unknown_key_nothing_close.toml"
    line = assert_operator_error(kesoku("config", "check", "-c", str(path)))
    assert line == (
        f"kesoku: {path}:3: agent.zzzzqqq: unknown key (known: llm, persona, max_steps_per_turn, "
        "max_identical_calls, fallback, project_dir, worker_idle_s, max_retries, retry_cap_s, "
        "shutdown_grace_s, question_timeout_s)"
    )


def test_check_reference_config_ok() -> None:
    result = kesoku("config", "check", "-c", "kesoku.toml")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout.startswith(
        f"ok: {REPO / 'kesoku.toml'} (sections set: agent, budget, claude, compaction,"
    )


def test_check_without_any_file_uses_defaults(tmp_path: Path) -> None:
    result = kesoku("config", "check", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (
        result.stdout
        == f"ok: no kesoku.toml and no $KESOKU_CONFIG; all defaults, db {tmp_path / 'kesoku.db'}\n"
    )


def test_check_never_prints_secrets(tmp_path: Path) -> None:
    path = tmp_path / "kesoku.toml"
    path.write_text(
        '[gemini]\napi_key = "sk-XYZZY-file"\n[discord]\nbot_token = "tok-XYZZY-file"\n'
    )
    for result in (
        kesoku("config", "check", "-c", str(path), ANTHROPIC_API_KEY="sk-XYZZY-env"),
        kesoku("config", "check", cwd=tmp_path, DISCORD_TOKEN="tok-XYZZY-env"),
    ):
        assert result.returncode == 0, result.stderr
        assert "XYZZY" not in result.stdout + result.stderr
        assert result.stdout == f"ok: {path} (sections set: discord, gemini)\n"


def test_usage_error_exits_non_zero_without_traceback() -> None:
    for args in (
        ("config", "check", "--bogus"),
        ("config", "check", "extra-positional"),
        ("config", "nope"),
    ):
        result = kesoku(*args)
        assert result.returncode not in (0, None), args
        assert "Traceback" not in result.stderr + result.stdout, args


def test_schema_prints_the_committed_schema() -> None:
    result = kesoku("config", "schema")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == config_json_schema()
    assert result.stdout == (REPO / "schema" / "kesoku.schema.json").read_text(encoding="utf-8")
