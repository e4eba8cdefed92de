"""The keys file (~/.config/kesoku/kesoku.env): systemd's EnvironmentFile syntax, both ways."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kesoku.config.envfile import (
    apply_env_file,
    env_file_path,
    parse_env_file,
    render_env_file,
    update_env_file,
)
from kesoku.vocab.errors import ConfigError

NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True)
VALUES = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\r\n\x85"))


@given(st.dictionaries(NAMES, VALUES, max_size=6))
def test_what_is_rendered_reads_back_exactly(values: dict[str, str]) -> None:
    text = render_env_file(values, header="test")
    assert parse_env_file(text) == values


def test_systemd_forms_are_read_and_a_bad_line_names_file_and_line_not_value() -> None:
    text = "# c\n; c\n\nA=bare value \nB='it''s'\nC=\"a \\\"q\\\" \\$x\"\n  D=1\n"
    assert parse_env_file(text) == {"A": "bare value", "B": "it''s", "C": 'a "q" $x', "D": "1"}
    with pytest.raises(ConfigError, match=r"^keys\.env:2: expected NAME=VALUE") as bad:
        parse_env_file("A=1\nexport B=sk-secret\n", where="keys.env")
    assert "sk-secret" not in str(bad.value)
    with pytest.raises(ConfigError, match=r"^k:1: KEY: unclosed ' quote$"):
        parse_env_file("KEY='sk-secret\n", where="k")
    with pytest.raises(ConfigError, match="line break"):
        render_env_file({"A": "one\ntwo"}, header="h")


def test_update_keeps_other_variables_and_the_file_stays_private(tmp_path: Path) -> None:
    path = tmp_path / "kesoku" / "kesoku.env"
    path.parent.mkdir()
    path.write_text("MINE='kept'\nANTHROPIC_API_KEY='old'\n")
    path.chmod(0o644)  # looser than it should be: replaced, not reused
    merged = update_env_file(path, {"ANTHROPIC_API_KEY": "new"}, header="by a test")
    assert merged == {"MINE": "kept", "ANTHROPIC_API_KEY": "new"}
    assert parse_env_file(path.read_text()) == merged
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.write_text("broken line\n")
    with pytest.raises(ConfigError, match=r"kesoku\.env:1"):
        update_env_file(path, {"A": "1"}, header="h")
    assert path.read_text() == "broken line\n"  # nothing written over what could not be read


def test_the_shell_wins_and_an_empty_variable_counts_as_unset(tmp_path: Path) -> None:
    environ = {"XDG_CONFIG_HOME": str(tmp_path), "A": "shell", "B": ""}
    assert apply_env_file(environ) == []  # no file: nothing, no error
    path = env_file_path(environ)
    assert path == tmp_path / "kesoku" / "kesoku.env"
    path.parent.mkdir()
    path.write_text("A='file'\nB='file'\nC='file'\n")
    assert apply_env_file(environ) == ["B", "C"]
    assert environ == {"XDG_CONFIG_HOME": str(tmp_path), "A": "shell", "B": "file", "C": "file"}


def test_a_broken_keys_file_stops_any_command_in_one_line(tmp_path: Path) -> None:
    # That every command reads the file: tests/test_service.py (keys reach the service's unit).
    keys = tmp_path / "kesoku" / "kesoku.env"
    keys.parent.mkdir()
    keys.write_text("GEMINI_API_KEY='g-secret\n")
    env = os.environ | {"XDG_CONFIG_HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "kesoku", "config", "check", "-c", os.devnull],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr == f"kesoku: {keys}:1: GEMINI_API_KEY: unclosed ' quote\n"
