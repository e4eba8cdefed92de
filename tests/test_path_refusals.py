"""Hostile paths and names: every path decision is a refusal with a reason, never an exception.

The file tools, ``[file: …]`` sharing, ``--output`` of the CLI and the attachment-name sanitizer all
meet names an attacker chose: too long, with a NUL, with a lone surrogate, a symlink loop, a leading
dash. Each case here checks the reason given, through the same call the component makes.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kesoku.config.settings import load_config
from kesoku.tools.attachments import display_name, safe_attachment_name, save_attachment
from kesoku.tools.base import Tool, ToolContext
from kesoku.tools.execute import run_tool
from kesoku.tools.files import file_tools
from kesoku.tools.paths import (
    NAME_MAX_BYTES,
    PathGates,
    PathProblem,
    check_share,
    path_problem,
    protected_reason,
    read_shared,
    resolve,
)
from kesoku.vocab.model import Outcome, Session

LONG_NAME = "a" * 300
EMOJI_NAME = "😀" * 70 + ".txt"  # 284 bytes of UTF-8


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "loop-a").symlink_to("loop-b")
    (ws / "loop-b").symlink_to("loop-a")
    (ws / "out.txt").write_text("result")
    return ws


@pytest.fixture
def gates(tmp_path: Path) -> PathGates:
    config = tmp_path / "conf" / "kesoku.toml"
    config.parent.mkdir()
    config.write_text(
        f'[workspace]\ndb_path = "{tmp_path / "conf" / "kesoku.db"}"\nshareable_roots = ["."]\n'
    )
    cfg = load_config(config, env={})
    return PathGates.from_config(cfg, config_file=config)


@pytest.fixture
def tools(gates: PathGates) -> dict[str, Tool]:
    return {t.name: t for t in file_tools(gates)}


HOSTILE = [
    (f"/{LONG_NAME}", "a name in it is too long (300 bytes; at most 255)"),
    ("/" + "abcdefgh/" * 500, "it is too long (4,501 bytes; at most 4,095)"),
    ("bad\ud800name.txt", "it is not valid text (a lone surrogate at character 4)"),
    ("nul\x00byte.txt", "it holds a NUL character"),
    ("loop-a", "it is a symlink loop (too many levels of symbolic links)"),
    ("loop-a/inside.txt", "it is a symlink loop (too many levels of symbolic links)"),
]


@pytest.mark.parametrize(("path", "reason"), HOSTILE)
@pytest.mark.parametrize(
    "tool", ["read_file", "write_file", "edit_file", "list_dir", "grep", "glob"]
)
async def test_a_file_tool_refuses_a_hostile_path_with_its_reason(
    tools: dict[str, Tool], session: Session, ws: Path, tool: str, path: str, reason: str
) -> None:
    arguments = {
        "read_file": {"path": path},
        "write_file": {"path": path, "content": "x"},
        "edit_file": {"path": path, "old_text": "a", "new_text": "b"},
        "list_dir": {"path": path},
        "grep": {"path": path, "pattern": "x"},
        "glob": {"path": path, "pattern": "*"},
    }[tool]
    ctx = ToolContext(session=session, cwd=ws, call_id="c")
    text, outcome = await run_tool(tools[tool], tool, arguments, ctx, known=tools)
    assert outcome is Outcome.FAILED
    assert "internal error" not in text
    assert text.endswith(f": {reason}"), text
    assert len(text) < 300  # the 4,500-byte path is not repeated whole
    assert not any(0xD800 <= ord(c) <= 0xDFFF for c in text)  # the result can be stored


async def test_an_os_error_in_a_file_tool_is_a_refusal_naming_it(
    tools: dict[str, Tool], session: Session, ws: Path
) -> None:
    (ws / "blocker").write_text("a file where a folder should be")
    ctx = ToolContext(session=session, cwd=ws, call_id="c")
    arguments = {"path": "blocker/inner/new.txt", "content": "x"}
    text, outcome = await run_tool(tools["write_file"], "write_file", arguments, ctx, known=tools)
    assert outcome is Outcome.FAILED and "internal error" not in text
    assert text == f"[failed] cannot make the folder {ws / 'blocker' / 'inner'}: Not a directory"


def test_path_problem_names_each_reason_and_passes_a_normal_path() -> None:
    assert path_problem("/srv/files/report.pdf") is None
    assert path_problem("/" + "é" * 127) is None  # 254 bytes: within a name's limit
    assert path_problem("/" + "é" * 128) == "a name in it is too long (256 bytes; at most 255)"
    assert path_problem("") == "it is empty"
    # a raw byte of a non-UTF-8 name on disk: the OS takes it
    assert path_problem("caf\udce9") is None


def test_resolve_raises_a_path_problem_not_an_os_error(ws: Path) -> None:
    for path, reason in HOSTILE:
        with pytest.raises(PathProblem) as info:
            resolve(path, ws)
        assert info.value.reason == reason
        assert str(info.value).startswith("invalid path ")


# -- [file: …] sharing -----------------------------------------------------------------------------


def test_share_refusals_say_why_and_the_protected_set_wins_over_shareable_roots(
    gates: PathGates, tmp_path: Path, ws: Path
) -> None:
    conf = tmp_path / "conf"
    (conf / "kesoku.db").write_bytes(b"SQLite format 3\x00")
    (conf / ".env").write_text("KEY=1\n")
    (conf / "chart.png").write_bytes(b"png")
    assert gates.shareable_roots == (conf,)  # the config's folder is shared ...
    assert check_share(conf / "chart.png", ws, gates) == conf / "chart.png"
    assert check_share(ws / "out.txt", ws, gates) == ws / "out.txt"
    # ... but never the config, its database or a secret in it.
    assert check_share(conf / "kesoku.toml", ws, gates) == (
        "Kesoku's own file kesoku.toml holds Kesoku's configuration and credentials"
    )
    assert check_share(conf / "kesoku.db-wal", ws, gates) == (
        "Kesoku's own file kesoku.db-wal holds Kesoku's configuration and credentials"
    )
    assert check_share(conf / ".env", ws, gates) == ".env files hold secrets"
    (ws / "cfg-link").symlink_to(conf / "kesoku.toml")
    assert "Kesoku's configuration" in str(check_share(ws / "cfg-link", ws, gates))
    assert check_share(tmp_path / "elsewhere.txt", ws, gates) == (
        "it is outside the session folder and the shared folders"
    )
    assert check_share(ws / "missing.txt", ws, gates) == "it does not exist"
    assert check_share(ws, ws, gates) == "it is not a regular file"
    assert check_share("out.txt", ws, gates) == "the path must be absolute"
    for path, reason in HOSTILE:
        absolute = path if path.startswith("/") else f"{ws}/{path}"
        assert check_share(absolute, ws, gates) == (path_problem(absolute) or reason)


def test_read_shared_reads_or_gives_the_size(ws: Path) -> None:
    assert read_shared(ws / "out.txt", 100) == b"result"
    assert read_shared(ws / "out.txt", 3) == 6
    (ws / "swapped").symlink_to(ws / "out.txt")
    # O_NOFOLLOW: a link is not read
    with pytest.raises(OSError, match="Too many levels of symbolic links"):
        read_shared(ws / "swapped", 100)


def test_cli_outputs_may_not_overwrite_the_config_or_the_database(
    gates: PathGates, tmp_path: Path
) -> None:
    conf = tmp_path / "conf"
    assert "Kesoku's configuration" in str(protected_reason(conf / "kesoku.toml", tmp_path, gates))
    assert "Kesoku's configuration" in str(protected_reason("conf/kesoku.db", tmp_path, gates))
    assert (
        protected_reason(f"/{LONG_NAME}", tmp_path, gates)
        == "a name in it is too long (300 bytes; at most 255)"
    )
    assert protected_reason(tmp_path / "trace.html", tmp_path, gates) is None


# -- attachment names ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("photo.png", "photo.png"),
        ("../../etc/passwd", "_._etc_passwd"),
        ("/etc/shadow", "_etc_shadow"),
        ("..", "attachment"),
        ("", "attachment"),
        (".bashrc", "bashrc"),
        ("-rf", "rf"),
        ("--help.txt", "help.txt"),
        (" -. -x", "x"),
        ("a\x00b\r\n.txt", "ab.txt"),
        ("evil\u202egnp.exe", "evilgnp.exe"),
        ("zero\u200bwidth.txt", "zerowidth.txt"),
        ("line\u2028break.txt", "linebreak.txt"),
        ("bad\ud800name\udcff.txt", "badname.txt"),
        ('C:\\Users\\x:y"z|.doc', "C__Users_x_y_z_.doc"),
        ("CON.txt", "_CON.txt"),
        ("lpt1.tar.gz", "_lpt1.tar.gz"),
        ("nul .txt", "_nul .txt"),
        ("report.final.pdf", "report.final.pdf"),
        ("trailing. . ", "trailing"),
        ("e\u0301te\u0301.txt", "été.txt"),  # NFC
        ("x" * 300 + ".tar.gz", "x" * 252 + ".gz"),
        (EMOJI_NAME, "😀" * 62 + ".txt"),  # 248 + 4 bytes: cut on a character, extension kept
        ("é" * 200, "é" * 127),  # 254 bytes: a two-byte character is never split
    ],
)
def test_safe_attachment_name(tmp_path: Path, given: str, expected: str) -> None:
    name = safe_attachment_name(given, tmp_path)
    assert name == expected
    assert len(name.encode("utf-8")) <= NAME_MAX_BYTES
    assert "/" not in name and "\\" not in name and not name.startswith(("-", "."))


def test_long_names_stay_within_the_limit_when_numbered(tmp_path: Path) -> None:
    paths = [save_attachment(tmp_path, EMOJI_NAME, f"copy {i}".encode()) for i in range(3)]
    names = [p.name for p in paths]
    assert names[0] == "😀" * 62 + ".txt"
    assert names[1] == "😀" * 61 + " (1).txt" and names[2] == "😀" * 61 + " (2).txt"
    assert all(len(n.encode()) <= NAME_MAX_BYTES for n in names)
    assert [p.read_bytes() for p in paths] == [b"copy 0", b"copy 1", b"copy 2"]


def test_a_save_that_cannot_be_made_raises_os_error(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("a file, not a folder")
    with pytest.raises(OSError, match="Not a directory"):
        save_attachment(tmp_path / "taken" / "ws", "a.txt", b"x")
    assert os.listdir(tmp_path) == ["taken"]


def test_display_name_is_short_printable_and_code_span_safe() -> None:
    assert display_name("report.pdf") == "report.pdf"
    assert display_name("a`b\x00c\ud800d\u202e  e") == "abcd e"
    assert display_name("x" * 300) == "x" * 79 + "…"
    assert display_name("\x00") == "?"
