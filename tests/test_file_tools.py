"""File tools and path gates: traversal, absolute paths, symlink and hard-link escapes, secrets,
caps, attachment names and [file:] shareability. Everything lives in pytest's tmp_path, with a fake
home."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from kesoku.config.settings import load_config
from kesoku.tools.attachments import safe_attachment_name
from kesoku.tools.base import StaticGuard, Tool, ToolContext
from kesoku.tools.files import file_tools, glob_regex
from kesoku.tools.paths import (
    NeedsApproval,
    PathGates,
    check_read,
    check_share,
    check_write,
    require_write,
    secret_reason,
)
from kesoku.vocab.errors import ToolError
from kesoku.vocab.model import Session, TaintSource


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("PRIVATE KEY\n")
    (home / ".aws").mkdir()
    (home / ".aws" / "credentials").write_text("aws_secret_access_key = KEY\n")
    (home / "notes.txt").write_text("home notes\n")
    return home


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "src" / "pkg").mkdir(parents=True)
    (ws / "src" / "main.py").write_text("import pkg\nprint('hello')\n")
    (ws / "src" / "pkg" / "mod.py").write_text("def hello():\n    return 'Hello'\n")
    (ws / "README.md").write_text("# Title\nhello world\n")
    (ws / ".env").write_text("API_KEY=hello-secret\n")
    (ws / "kesoku.db").write_bytes(b"SQLite format 3\x00")
    (ws / ".git" / "hooks").mkdir(parents=True)
    (ws / ".git" / "config").write_text("[core]\nhello = 1\n")
    return ws


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    out = tmp_path / "outside"
    out.mkdir()
    (out / "private.txt").write_text("hello from outside\n")
    return out


@pytest.fixture
def gates(tmp_path: Path, home: Path, ws: Path) -> PathGates:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text("the guide\n")
    (tmp_path / "share").mkdir()
    (tmp_path / "kesoku.toml").write_text("[shell]\n")
    return PathGates(
        readable_roots=(tmp_path / "docs",),
        shareable_roots=(tmp_path / "share",),
        protected_files=(ws / "kesoku.db", tmp_path / "kesoku.toml"),
        home=home,
    )


@pytest.fixture
def ctx(session: Session, ws: Path) -> ToolContext:
    return ToolContext(session=session, cwd=ws, call_id="call-1")


@pytest.fixture
def tools(gates: PathGates) -> dict[str, Tool]:
    return {t.name: t for t in file_tools(gates, max_output_bytes=4000)}


async def call(tools: dict[str, Tool], name: str, ctx: ToolContext, **arguments: Any) -> str:
    arguments_: Mapping[str, Any] = arguments
    return await tools[name].run(arguments_, ctx)


async def refused(tools: dict[str, Tool], name: str, ctx: ToolContext, **arguments: Any) -> str:
    with pytest.raises(ToolError) as info:
        await call(tools, name, ctx, **arguments)
    return str(info.value)


# -- read_file ------------------------------------------------------------------------------------


async def test_read_file_numbers_lines_and_reads_ranges(
    tools: dict[str, Tool], ctx: ToolContext, ws: Path
) -> None:
    (ws / "long.txt").write_text("".join(f"line {i}\n" for i in range(1, 101)))
    assert await call(tools, "read_file", ctx, path="src/main.py") == (
        "src/main.py (lines 1-2):\n1\timport pkg\n2\tprint('hello')"
    )
    part = await call(tools, "read_file", ctx, path="long.txt", start_line=10, max_lines=3)
    assert (
        part == "long.txt (lines 10-12):\n10\tline 10\n11\tline 11\n12\tline 12\n"
        "[more lines follow: read on with start_line=13]"
    )
    assert (
        await call(tools, "read_file", ctx, path=str(ws / "long.txt"), start_line=100)
    ).endswith("100\tline 100")
    assert "past the end" in await refused(tools, "read_file", ctx, path="long.txt", start_line=101)
    (ws / "empty.txt").write_text("")
    assert await call(tools, "read_file", ctx, path="empty.txt") == "empty.txt is empty"


async def test_read_file_caps(tools: dict[str, Tool], ctx: ToolContext, ws: Path) -> None:
    (ws / "big.txt").write_text("".join(f"{i:05d} " + "x" * 90 + "\n" for i in range(1000)))
    result = await call(tools, "read_file", ctx, path="big.txt")
    assert len(result.encode()) < 4000 + 200
    assert result.endswith("[output cap reached: read on with start_line=41]")
    (ws / "wide.txt").write_text("y" * 10_000 + "\n")
    assert "… [line cut: 10000 characters]" in await call(tools, "read_file", ctx, path="wide.txt")
    (ws / "blob.bin").write_bytes(b"\x00\x01" * 100)
    assert "is a binary file (200 bytes)" in await refused(tools, "read_file", ctx, path="blob.bin")
    assert "is a folder: use list_dir" in await refused(tools, "read_file", ctx, path="src")
    assert "no such file" in await refused(tools, "read_file", ctx, path="missing.txt")
    os.mkfifo(ws / "pipe")  # neither read nor write may wait forever on a FIFO
    assert "is not a regular file" in await refused(tools, "read_file", ctx, path="pipe")
    assert "cannot open" in await refused(tools, "write_file", ctx, path="pipe", content="x")
    assert "`start_line` must be a positive integer" in await refused(
        tools, "read_file", ctx, path="big.txt", start_line=0
    )
    assert "`path` must be a non-empty string" in await refused(tools, "read_file", ctx)


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("../outside/private.txt", "outside the workspace"),
        ("src/../../outside/private.txt", "outside the workspace"),
        ("{outside}/private.txt", "outside the workspace"),
        ("/etc/hostname", "outside the workspace"),
        ("~/notes.txt", "outside the workspace"),
        ("~/.ssh/id_rsa", "~/.ssh is a secret location"),
        ("{home}/.aws/credentials", "~/.aws is a secret location"),
        (".env", ".env files hold secrets"),
        ("src/.env.local", ".env files hold secrets"),
        ("kesoku.db", "Kesoku's own file kesoku.db holds Kesoku's configuration and credentials"),
        ("kesoku.db-wal", "Kesoku's own file kesoku.db-wal"),
        ("kesoku.db.sock", "Kesoku's own file kesoku.db.sock"),
        ("../kesoku.toml", "Kesoku's own file kesoku.toml"),
        ("/proc/self/environ", "a process environment holds credentials"),
    ],
)
async def test_reads_outside_or_of_secrets_are_refused(
    tools: dict[str, Tool], ctx: ToolContext, path: str, reason: str, home: Path, outside: Path
) -> None:
    path = path.format(home=home, outside=outside)
    message = await refused(tools, "read_file", ctx, path=path)
    assert reason in message
    assert "denied" in message


async def test_symlink_escapes_are_judged_by_their_target(
    tools: dict[str, Tool], ctx: ToolContext, ws: Path, outside: Path, home: Path
) -> None:
    (ws / "link.txt").symlink_to(outside / "private.txt")
    (ws / "outdir").symlink_to(outside)
    (ws / "keys").symlink_to(home / ".ssh")
    (ws / "inner.md").symlink_to(ws / "README.md")
    assert "outside the workspace" in await refused(tools, "read_file", ctx, path="link.txt")
    assert "outside the workspace" in await refused(
        tools, "read_file", ctx, path="outdir/private.txt"
    )
    assert "~/.ssh is a secret location" in await refused(
        tools, "read_file", ctx, path="keys/id_rsa"
    )
    assert "outside the workspace" in await refused(tools, "list_dir", ctx, path="outdir")
    assert (await call(tools, "read_file", ctx, path="inner.md")).startswith(
        "README.md (lines 1-2)"
    )
    # `dir/..` after a symlink climbs from the link's target, as the OS does.
    assert "outside the workspace" in await refused(
        tools, "read_file", ctx, path="outdir/../outside/private.txt"
    )


async def test_a_hard_link_to_a_secret_is_refused(
    tools: dict[str, Tool], ctx: ToolContext, ws: Path, home: Path
) -> None:
    os.link(home / ".ssh" / "id_rsa", ws / "innocent.txt")
    assert "hard link to a secret file" in await refused(
        tools, "read_file", ctx, path="innocent.txt"
    )
    assert "innocent.txt" not in await call(tools, "glob", ctx, pattern="*.txt")
    assert await call(tools, "grep", ctx, pattern="PRIVATE") == "no matches for 'PRIVATE'"


async def test_readable_roots_are_readable_but_not_writable(
    tools: dict[str, Tool], ctx: ToolContext, tmp_path: Path
) -> None:
    guide = tmp_path / "docs" / "guide.md"
    assert (await call(tools, "read_file", ctx, path=str(guide))).endswith("1\tthe guide")
    message = await refused(tools, "write_file", ctx, path=str(guide), content="changed")
    assert "needs the user's approval" in message
    assert guide.read_text() == "the guide\n"


# -- write_file and edit_file ---------------------------------------------------------------------


async def test_write_file_creates_and_overwrites(
    tools: dict[str, Tool], ctx: ToolContext, ws: Path
) -> None:
    assert await call(tools, "write_file", ctx, path="new/dir/a.txt", content="one\ntwo\n") == (
        "created new/dir/a.txt: 8 bytes, 2 lines"
    )
    assert await call(tools, "write_file", ctx, path="new/dir/a.txt", content="x") == (
        "overwrote new/dir/a.txt: 1 bytes, 1 lines"
    )
    assert (ws / "new" / "dir" / "a.txt").read_text() == "x"
    session_ws = Path(ctx.session.workspace)
    await call(
        tools,
        "write_file",
        ctx,
        path=str(session_ws / "out.txt"),
        content="in the session workspace",
    )
    assert (session_ws / "out.txt").exists()


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("../outside/new.txt", "is outside the workspace"),
        ("/tmp/kesoku-test-never-written.txt", "is outside the workspace"),
        ("~/.bashrc", "is outside the workspace"),
        (".git/hooks/pre-commit", "can make git run commands"),
        (".git/config", "can make git run commands"),
        ("outdir/new.txt", "is outside the workspace"),
        ("dangling.txt", "is outside the workspace"),
    ],
)
async def test_writes_outside_the_workspace_need_approval(
    tools: dict[str, Tool], ctx: ToolContext, ws: Path, outside: Path, path: str, reason: str
) -> None:
    (ws / "outdir").symlink_to(outside)
    (ws / "dangling.txt").symlink_to(outside / "not-yet.txt")
    before = sorted(p.name for p in outside.iterdir())
    message = await refused(tools, "write_file", ctx, path=path, content="x")
    assert reason in message
    assert "needs the user's approval" in message
    assert "was not allowed (no one can be asked here); the file was not written" in message
    assert sorted(p.name for p in outside.iterdir()) == before
    assert not Path("/tmp/kesoku-test-never-written.txt").exists()
    assert (ws / ".git" / "config").read_text() == "[core]\nhello = 1\n"


async def test_a_write_outside_asks_the_user_and_an_allowed_one_happens(
    tools: dict[str, Tool], session: Session, ws: Path, outside: Path
) -> None:
    guard = StaticGuard(allow=True)
    ctx = ToolContext(session=session, cwd=ws, call_id="c", guard=guard)
    result = await call(
        tools, "write_file", ctx, path=str(outside / "new.txt"), content="approved\n"
    )
    assert result == f"created {outside / 'new.txt'}: 9 bytes, 1 lines"
    assert (outside / "new.txt").read_text() == "approved\n"
    assert guard.questions == [
        f"write_file wants to write {outside / 'new.txt'} ({outside / 'new.txt'} is outside the "
        "workspace). Allow?"
    ]
    await call(
        tools,
        "edit_file",
        ctx,
        path=str(outside / "new.txt"),
        old_text="approved",
        new_text="edited",
    )
    assert (outside / "new.txt").read_text() == "edited\n"
    assert len(guard.questions) == 2
    # Inside the workspace nothing is asked.
    await call(tools, "write_file", ctx, path="inside.txt", content="x")
    assert len(guard.questions) == 2


async def test_a_denied_write_outside_is_not_written(
    tools: dict[str, Tool], session: Session, ws: Path, outside: Path
) -> None:
    guard = StaticGuard(allow=False)
    ctx = ToolContext(session=session, cwd=ws, call_id="c", guard=guard)
    message = await refused(
        tools, "write_file", ctx, path=str(outside / "private.txt"), content="overwritten"
    )
    assert "was not allowed (denied); the file was not written" in message
    assert (outside / "private.txt").read_text() == "hello from outside\n"
    assert len(guard.questions) == 1


async def test_approval_is_for_the_path_asked_about(
    ctx: ToolContext, gates: PathGates, outside: Path
) -> None:
    # What was approved is one resolved path: another outside path is still refused.
    with pytest.raises(ToolError, match="needs the user's approval"):
        require_write(outside / "other.txt", ctx, gates, approved=outside / "new.txt")
    assert (
        require_write(outside / "new.txt", ctx, gates, approved=outside / "new.txt")
        == outside / "new.txt"
    )


async def test_reading_a_readable_root_taints_the_session(
    tools: dict[str, Tool], session: Session, ws: Path, tmp_path: Path
) -> None:
    guard = StaticGuard()
    ctx = ToolContext(session=session, cwd=ws, call_id="c", guard=guard)
    await call(tools, "read_file", ctx, path="README.md")
    assert not guard.tainted
    await call(tools, "read_file", ctx, path=str(tmp_path / "docs" / "guide.md"))
    await call(tools, "grep", ctx, pattern="guide", path=str(tmp_path / "docs"))
    assert guard.taint_sources() == (
        TaintSource("file", str(tmp_path / "docs" / "guide.md")),
        TaintSource("file", str(tmp_path / "docs")),
    )


async def test_check_write_returns_the_approval_request(
    ctx: ToolContext, gates: PathGates, outside: Path
) -> None:
    decision = check_write(outside / "x.txt", ctx, gates)
    assert decision == NeedsApproval(
        outside / "x.txt", f"{outside / 'x.txt'} is outside the workspace"
    )
    assert check_write("inside.txt", ctx, gates) == ctx.cwd / "inside.txt"


@pytest.mark.parametrize(
    "path", [".env", "sub/.env.production", "kesoku.db", "kesoku.db-journal", "~/.ssh/config"]
)
async def test_secrets_are_never_written(
    tools: dict[str, Tool], ctx: ToolContext, ws: Path, path: str
) -> None:
    message = await refused(tools, "write_file", ctx, path=path, content="x")
    assert message.startswith(f"writing {path} is denied: ")
    assert (ws / ".env").read_text() == "API_KEY=hello-secret\n"


async def test_edit_file_replaces_exactly_one_match(
    tools: dict[str, Tool], ctx: ToolContext, ws: Path
) -> None:
    target = ws / "src" / "pkg" / "mod.py"
    assert await call(
        tools, "edit_file", ctx, path="src/pkg/mod.py", old_text="'Hello'", new_text="'Hi'\n"
    ) == ("edited src/pkg/mod.py at line 2: 1 line(s) replaced by 2")
    assert target.read_text() == "def hello():\n    return 'Hi'\n\n"
    (ws / "twice.txt").write_text("a\nb\na\n")
    assert "old_text matches 2 times in twice.txt" in await refused(
        tools, "edit_file", ctx, path="twice.txt", old_text="a", new_text="c"
    )
    assert "was not found in twice.txt" in await refused(
        tools, "edit_file", ctx, path="twice.txt", old_text="zzz", new_text="c"
    )
    assert (ws / "twice.txt").read_text() == "a\nb\na\n"
    assert await call(tools, "edit_file", ctx, path="twice.txt", old_text="a\nb", new_text="") == (
        "edited twice.txt at line 1: 2 line(s) replaced by 1"
    )
    assert (ws / "twice.txt").read_text() == "\na\n"
    (ws / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    assert "is not UTF-8 text" in await refused(
        tools, "edit_file", ctx, path="latin1.txt", old_text="caf", new_text="x"
    )
    assert "denied" in await refused(
        tools, "edit_file", ctx, path=".env", old_text="API", new_text="X"
    )
    assert "`old_text` must be a non-empty string" in await refused(
        tools, "edit_file", ctx, path="twice.txt", old_text="", new_text="x"
    )
    # new_text may be empty (above): its refusal must not say otherwise.
    assert await refused(tools, "edit_file", ctx, path="twice.txt", old_text="a", new_text=5) == (
        "`new_text` must be a string (it may be empty)"
    )


# -- list_dir, glob, grep -------------------------------------------------------------------------


async def test_list_dir(tools: dict[str, Tool], ctx: ToolContext, ws: Path, outside: Path) -> None:
    (ws / "outdir").symlink_to(outside)
    listing = await call(tools, "list_dir", ctx)
    lines = listing.splitlines()
    assert lines[0] == "./ (6 entries)"
    assert ".git/" in lines and "src/" in lines
    assert f"outdir -> {outside}" in lines
    assert "README.md  20 bytes" in lines
    assert "~/.ssh is a secret location" in await refused(tools, "list_dir", ctx, path="~/.ssh")
    assert "outside the workspace" in await refused(tools, "list_dir", ctx, path="..")
    assert "is not a folder" in await refused(tools, "list_dir", ctx, path="README.md")


async def test_glob(tools: dict[str, Tool], ctx: ToolContext, ws: Path, outside: Path) -> None:
    (ws / "outdir").symlink_to(outside)
    (outside / "evil.py").write_text("")
    assert await call(tools, "glob", ctx, pattern="**/*.py") == (
        "2 match(es) for '**/*.py' in .:\nsrc/main.py\nsrc/pkg/mod.py"
    )
    assert (await call(tools, "glob", ctx, pattern="*.py", path="src")).splitlines()[1:] == [
        "main.py"
    ]
    assert "no files match" in await call(tools, "glob", ctx, pattern="*.rs")
    hidden = await call(tools, "glob", ctx, pattern="**/.*")
    assert ".git/" in hidden and ".env" not in hidden.splitlines()
    for pattern in ("/etc/*", "../*", "src/../../*", "~/.ssh/*"):
        assert "must be relative and must not use .." in await refused(
            tools, "glob", ctx, pattern=pattern
        )
    assert "outside the workspace" in await refused(
        tools, "glob", ctx, pattern="*", path=str(outside)
    )


async def test_grep(tools: dict[str, Tool], ctx: ToolContext, ws: Path, outside: Path) -> None:
    (ws / "outdir").symlink_to(outside)
    (ws / "src" / "link.py").symlink_to(outside / "private.txt")
    result = await call(tools, "grep", ctx, pattern="hello")
    # not .env, .git/config, the db, nor what the symlinks point to
    assert result.splitlines() == [
        "README.md:2: hello world",
        "src/main.py:2: print('hello')",
        "src/pkg/mod.py:1: def hello():",
    ]
    assert "src/pkg/mod.py:2:     return 'Hello'" in await call(
        tools, "grep", ctx, pattern="HELLO", ignore_case=True
    )
    assert (
        await call(tools, "grep", ctx, pattern="hello", glob="*.md")
    ) == "README.md:2: hello world"
    assert (
        await call(tools, "grep", ctx, pattern="hel+o", path="src/main.py")
    ) == "src/main.py:2: print('hello')"
    assert (
        await call(tools, "grep", ctx, pattern="nothing-matches-this")
        == "no matches for 'nothing-matches-this'"
    )
    assert "invalid regular expression" in await refused(tools, "grep", ctx, pattern="(")
    assert ".env files hold secrets" in await refused(
        tools, "grep", ctx, pattern="KEY", path=".env"
    )
    assert "outside the workspace" in await refused(
        tools, "grep", ctx, pattern="hello", path=str(outside)
    )


async def test_grep_caps_its_matches(tools: dict[str, Tool], ctx: ToolContext, ws: Path) -> None:
    (ws / "many.txt").write_text("match\n" * 1000)
    result = await call(tools, "grep", ctx, pattern="match", path="many.txt")
    lines = result.splitlines()
    assert len(lines) == 201
    assert lines[-1] == "[stopped at 200 matches: narrow the pattern, `path` or `glob`]"


def test_glob_regex() -> None:
    assert glob_regex("**/*.py").match("a/b/c.py")
    assert glob_regex("**/*.py").match("c.py")
    assert not glob_regex("*.py").match("a/c.py")
    assert glob_regex("src/**").match("src/a/b")
    assert glob_regex("file[0-9].t?t").match("file3.txt")
    assert not glob_regex("file[!0-9].txt").match("file3.txt")
    assert glob_regex("a+b(c).txt").match("a+b(c).txt")


# -- the gates as functions -----------------------------------------------------------------------


def test_check_read_and_secret_reason(
    ctx: ToolContext, gates: PathGates, ws: Path, home: Path
) -> None:
    assert check_read("src/../README.md", ctx, gates) == ws / "README.md"
    assert secret_reason("~/.ssh", ws, gates) == "~/.ssh is a secret location"
    assert (
        secret_reason(home / ".ssh" / ".." / ".ssh" / "id_rsa", ws, gates)
        == "~/.ssh is a secret location"
    )
    assert secret_reason("notes.txt", ws, gates) is None
    assert secret_reason(".ENV", ws, gates) == ".env files hold secrets"
    with pytest.raises(ToolError, match="it holds a NUL character"):
        check_read("a\x00b", ctx, gates)


def test_gates_from_the_config_protect_its_files(tmp_path: Path) -> None:
    config_file = tmp_path / "conf" / "kesoku.toml"
    config_file.parent.mkdir()
    config_file.write_text('[workspace]\ndb_path = "state/k.db"\n')
    gates = PathGates.from_config(load_config(config_file, env={}), config_file=config_file)
    folder = config_file.parent
    assert gates.protected_files == (folder / "state" / "k.db", config_file)
    assert gates.readable_roots == ()
    # skills are read by absolute path, without taint
    assert gates.trusted_roots == (folder / "skills",)
    assert secret_reason(folder / "state" / "k.db-shm", tmp_path, gates) is not None
    assert secret_reason(config_file, tmp_path, gates) is not None


def test_attachment_name_collisions(tmp_path: Path) -> None:
    folder = tmp_path / "att"
    folder.mkdir()
    names = []
    for _ in range(3):
        name = safe_attachment_name("report.pdf", folder)
        (folder / name).write_text("x")
        names.append(name)
    assert names == ["report.pdf", "report (1).pdf", "report (2).pdf"]
    (folder / "link").symlink_to(tmp_path / "nowhere")
    assert safe_attachment_name("link", folder) == "link (1)"  # a dangling symlink is taken too


def test_file_markers_share_only_workspace_and_shareable_files(
    gates: PathGates, ws: Path, tmp_path: Path, outside: Path, home: Path
) -> None:
    (tmp_path / "share" / "chart.png").write_bytes(b"png")
    (ws / "out.txt").write_text("result")
    (ws / "leak.txt").symlink_to(outside / "private.txt")
    os.link(home / ".ssh" / "id_rsa", ws / "key-copy.txt")
    assert check_share(ws / "out.txt", ws, gates) == ws / "out.txt"
    chart = tmp_path / "share" / "chart.png"
    assert check_share(chart, ws, gates) == chart
    assert check_share(str(ws / "src" / ".." / "out.txt"), ws, gates) == ws / "out.txt"
    for path in (
        "out.txt",  # relative
        "~/notes.txt",
        outside / "private.txt",
        ws / "leak.txt",
        ws / ".env",
        ws / "kesoku.db",
        ws / "key-copy.txt",
        ws / "missing.txt",
        ws / "src",
        home / ".ssh" / "id_rsa",
        "",
        "/x\x00y",
    ):
        assert isinstance(check_share(path, ws, gates), str), path


async def test_trusted_roots_are_read_without_taint(
    session: Session, ws: Path, tmp_path: Path
) -> None:
    skills = tmp_path / "skills" / "demo"
    skills.mkdir(parents=True)
    (skills / "SKILL.md").write_text("---\nname: demo\ndescription: d\n---\nbody\n")
    gates = PathGates(trusted_roots=(tmp_path / "skills",), home=tmp_path / "home")
    guard = StaticGuard()
    ctx = ToolContext(session=session, cwd=ws, call_id="c", guard=guard)
    tools = {t.name: t for t in file_tools(gates)}
    assert "body" in await tools["read_file"].run({"path": str(skills / "SKILL.md")}, ctx)
    assert not guard.tainted


def test_default_tools_follow_the_config(tmp_path: Path) -> None:
    from kesoku.host.build import default_tools

    (tmp_path / "kesoku.toml").write_text("[run_code]\nenabled = true\n[shell]\nenabled = false\n")
    names = [t.name for t in default_tools(load_config(tmp_path / "kesoku.toml", env={}))]
    assert names == [
        "read_file",
        "write_file",
        "edit_file",
        "list_dir",
        "glob",
        "grep",
        "run_code",
        "list_skills",
        "use_skill",
    ]
    (tmp_path / "kesoku.toml").write_text("")
    names = [t.name for t in default_tools(load_config(tmp_path / "kesoku.toml", env={}))]
    assert "run_code" not in names and "shell" in names
