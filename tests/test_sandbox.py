"""The sandbox's choices: which mechanism, what it hides, how mounts are ordered, and what happens
where none works (a chat session is refused, the terminal asks once per session).

The confinement itself is tried with real processes in tests/test_sandbox_corpus.py.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
from sandboxing import CONFINED, sandbox_for

from kesoku.config.settings import Config, SandboxConfig, ShellConfig
from kesoku.host.build import default_tools
from kesoku.tools.base import StaticGuard, ToolContext
from kesoku.tools.paths import PathGates
from kesoku.tools.sandbox import Sandbox
from kesoku.tools.shell import shell_tool
from kesoku.vocab.errors import ToolError
from kesoku.vocab.model import Session


def nothing_works(tmp_path: Path, *, ask: bool) -> Sandbox:
    """A sandbox asking for bubblewrap where its program does not exist."""
    gates = PathGates(home=tmp_path / "home")
    return Sandbox(
        SandboxConfig(mode="bwrap"), gates, ask_unsandboxed=ask, bwrap="/nonexistent/bwrap"
    )


def test_the_probe_says_what_works_and_why_not(tmp_path: Path) -> None:
    off = sandbox_for("off", tmp_path).probe()
    assert (off.mechanism, off.detail) == (
        "off",
        'off ([sandbox] mode = "off"): tools run with Kesoku\'s own access',
    )
    missing = nothing_works(tmp_path, ask=False)
    assert missing.probe().mechanism is None
    assert missing.probe().detail == "bubblewrap is not installed (Debian: apt install bubblewrap)"
    assert missing.describe() == (
        "sandbox: none works here (bubblewrap is not installed (Debian: apt install bubblewrap))"
    )
    broken = Sandbox(SandboxConfig(mode="bwrap"), bwrap="/bin/false")
    assert broken.probe().mechanism is None
    assert broken.probe().detail.startswith("bubblewrap cannot make its namespaces: ")


@pytest.mark.parametrize("mode", CONFINED)
def test_a_working_mechanism_is_named_in_one_line(tmp_path: Path, mode: str) -> None:
    line = sandbox_for(mode, tmp_path).describe()
    assert line.startswith("sandbox: ")
    assert line.endswith("tools write only their workspace, no network")
    assert ("bubblewrap" in line) if mode == "bwrap" else ("Landlock ABI" in line)
    assert sandbox_for(mode, tmp_path, network=True).describe().endswith(", network on")


def test_hidden_finds_the_secret_places_that_exist(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".netrc").write_text("machine x")
    (home / ".env").write_text("A=1")
    work = tmp_path / "work"
    (work / "deep" / "er").mkdir(parents=True)
    (work / "deep" / "er" / ".env.local").write_text("B=2")
    (work / "node_modules").mkdir()
    (work / "node_modules" / ".env").write_text("skipped: a dependency's folder")
    (work / ".envrc").write_text("not a .env file")
    config, db = tmp_path / "etc" / "kesoku.toml", tmp_path / "kesoku.db"
    config.parent.mkdir()
    config.write_text("")
    db.write_text("")
    (tmp_path / "kesoku.db-wal").write_text("")
    (tmp_path / "kesoku.db-wake").mkdir()  # the wake-up pipes
    with socket.socket(socket.AF_UNIX) as control:  # the daemon's control socket
        control.bind(str(tmp_path / "kesoku.db.sock"))
    (config.parent / ".env.production").write_text("C=3")
    gates = PathGates(home=home, protected_files=(config, db))
    folders, files = Sandbox(SandboxConfig(), gates).hidden([work])
    assert str(home / ".ssh") in folders
    assert str(tmp_path / "kesoku.db-wake") in folders
    assert str(tmp_path / "kesoku.db.sock") in files
    assert set(files) >= {
        str(home / ".netrc"),
        str(home / ".env"),
        str(work / "deep" / "er" / ".env.local"),
        str(config),
        str(db),
        str(tmp_path / "kesoku.db-wal"),
        str(config.parent / ".env.production"),
    }
    assert str(work / "node_modules" / ".env") not in files
    assert str(work / ".envrc") not in files


def test_bwrap_mounts_land_in_order_of_depth(tmp_path: Path) -> None:
    # A project folder holding the sessions folder and the config: the project is bound, the
    # sessions folder emptied over it, the session's own folder bound back, the config masked last.
    project = tmp_path / "project"
    session = project / "sessions" / "s1"
    session.mkdir(parents=True)
    (project / "sessions" / "s2").mkdir()
    config = project / "kesoku.toml"
    config.write_text("")
    gates = PathGates(home=tmp_path / "home", protected_files=(config,))
    sandbox = Sandbox(
        SandboxConfig(), gates, sessions_dir=project / "sessions", bwrap="bwrap", private_roots=()
    )
    argv = sandbox.bwrap_argv(["true"], writable=[project, session], cwd=project)
    mounts = [
        argv[i : i + 3] for i, a in enumerate(argv) if a in ("--bind", "--tmpfs", "--ro-bind")
    ]
    mounts = [m[:2] if m[0] == "--tmpfs" else m for m in mounts]
    mounts = [m for m in mounts if str(tmp_path) in m[-1]]  # not the system's own secrets
    assert mounts == [
        ["--bind", str(project), str(project)],
        ["--tmpfs", str(project / "sessions")],
        ["--ro-bind", "/dev/null", str(config)],
        ["--bind", str(session), str(session)],
    ]
    assert argv[argv.index("--chdir") + 1] == str(project)
    assert "--unshare-all" in argv and "--die-with-parent" in argv and "--share-net" not in argv
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    assert argv[-2:] == ["--", "true"]
    server = sandbox.bwrap_argv(["srv"], writable=[], cwd=Path("/"), die_with_parent=False)
    assert "--die-with-parent" not in server


async def test_a_chat_session_gets_no_unsandboxed_tool(session: Session, tmp_path: Path) -> None:
    tool = shell_tool(ShellConfig(), nothing_works(tmp_path, ask=False))
    guard = StaticGuard(allow=True)
    ctx = ToolContext(session=session, cwd=tmp_path, call_id="c", guard=guard)
    with pytest.raises(
        ToolError, match=r"no OS sandbox works on this machine \(bubblewrap is not installed"
    ):
        await tool.run({"command": "touch marker"}, ctx)
    assert not (tmp_path / "marker").exists()
    assert guard.questions == []  # nobody is asked on a chat server


async def test_the_terminal_asks_once_per_session_before_running_unsandboxed(
    session: Session, tmp_path: Path
) -> None:
    sandbox = nothing_works(tmp_path, ask=True)
    tool = shell_tool(ShellConfig(), sandbox)
    denied = StaticGuard(allow=False)
    ctx = ToolContext(session=session, cwd=tmp_path, call_id="c", guard=denied)
    with pytest.raises(ToolError, match="would run without an OS sandbox, which was not allowed"):
        await tool.run({"command": "touch marker"}, ctx)
    assert not (tmp_path / "marker").exists()
    allowed = StaticGuard(allow=True)
    ctx = ToolContext(session=session, cwd=tmp_path, call_id="c", guard=allowed)
    await tool.run({"command": "touch marker"}, ctx)
    await tool.run({"command": "touch marker2"}, ctx)
    assert (tmp_path / "marker").exists() and (tmp_path / "marker2").exists()
    assert len(allowed.questions) == 1
    assert allowed.questions[0].startswith(
        "No OS sandbox works on this machine (bubblewrap is not installed"
    )
    assert (
        "`touch marker` and the tool calls after it in this session would run with your own"
        in allowed.questions[0]
    )


def test_where_nothing_works_the_daemon_offers_no_shell_or_run_code(tmp_path: Path) -> None:
    config = Config()
    run_code = Config(run_code=config.run_code.__class__(enabled=True))
    offered = [t.name for t in default_tools(run_code, sandbox=nothing_works(tmp_path, ask=False))]
    assert "shell" not in offered and "run_code" not in offered and "read_file" in offered
    asked = [t.name for t in default_tools(run_code, sandbox=nothing_works(tmp_path, ask=True))]
    assert "shell" in asked and "run_code" in asked
    off = [t.name for t in default_tools(run_code, sandbox=sandbox_for("off", tmp_path))]
    assert "shell" in off and "run_code" in off


@pytest.mark.parametrize("mode", CONFINED)
async def test_a_missing_program_is_named_whatever_the_mechanism(
    session: Session, tmp_path: Path, mode: str
) -> None:
    tool = shell_tool(ShellConfig(use_shell=False), sandbox_for(mode, tmp_path))
    ctx = ToolContext(session=session, cwd=tmp_path, call_id="c")
    with pytest.raises(
        ToolError, match=f"cannot start 'no-such-program-kesoku' in {tmp_path}: no such program"
    ):
        await tool.run({"command": "no-such-program-kesoku --help"}, ctx)
    with pytest.raises(ToolError, match=r"cannot start './missing.sh'"):
        await tool.run({"command": "./missing.sh"}, ctx)


@pytest.mark.parametrize("mode", CONFINED)
async def test_skills_and_kesoku_stay_readable_inside_a_private_tmp(
    session: Session, tmp_path: Path, mode: str
) -> None:
    # tmp_path lies in /tmp, which the sandbox empties: a skills folder there is bound back, its
    # .env still hidden, and this interpreter (run_code's) still runs.
    skills = tmp_path / "skills"
    (skills / "hello").mkdir(parents=True)
    (skills / "hello" / "run.sh").write_text("echo hello from the skill\n")
    (skills / ".env").write_text("TOKEN=CANARY-SKILLS")
    gates = PathGates(home=tmp_path / "home", trusted_roots=(skills,))
    sandbox = sandbox_for(mode, tmp_path, gates=gates)
    assert str(skills) in sandbox.readable()
    tool = shell_tool(ShellConfig(), sandbox)
    work = tmp_path / "work"
    work.mkdir()
    ctx = ToolContext(session=session, cwd=work, call_id="c")
    line = f"sh {skills}/hello/run.sh; cat {skills}/.env; {sys.executable} -c 'print(40 + 2)'"
    result = await tool.run({"command": line}, ctx)
    assert "hello from the skill" in result and "\n42\n" in result
    assert "CANARY" not in result
