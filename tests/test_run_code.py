"""run_code with real subprocesses in the OS sandbox: output, exit code, the temporary folder,
timeout, questions, and what the sandbox lets a snippet touch."""

from __future__ import annotations

from pathlib import Path

import pytest
from sandboxing import CONFINED, MECHANISMS, sandbox_for

from kesoku.config.settings import RunCodeConfig
from kesoku.tools.base import StaticGuard, ToolContext
from kesoku.tools.run_code import run_code_tool
from kesoku.vocab.errors import ToolError
from kesoku.vocab.model import Session, TaintSource

# The snippet prints its working directory, so the test can check the folder is gone afterwards.
WHERE = (
    "import os, sys\nprint('cwd', os.getcwd())\nprint('to stderr', file=sys.stderr)\nsys.exit(3)\n"
)


def ctx_with(session: Session, cwd: Path, guard: StaticGuard) -> ToolContext:
    return ToolContext(session=session, cwd=cwd, call_id="c", guard=guard)


@pytest.fixture(params=MECHANISMS)
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_runs_in_a_fresh_folder_that_is_removed(
    session: Session, tmp_path: Path, mode: str
) -> None:
    tool = run_code_tool(RunCodeConfig(enabled=True), sandbox_for(mode, tmp_path), ask_always=False)
    guard = StaticGuard(allow=False)
    result = await tool.run({"code": WHERE}, ctx_with(session, tmp_path, guard))
    lines = result.splitlines()
    assert lines[0] == "$ python main.py"
    assert lines[1].startswith("cwd ") and "kesoku-run-code-" in lines[1]
    assert lines[2:] == ["to stderr", "[exit code 3]"]
    assert not Path(lines[1].removeprefix("cwd ")).exists()
    assert guard.questions == []  # an untainted session in blocklist mode is not asked


async def test_a_snippet_that_runs_too_long_is_killed(
    session: Session, tmp_path: Path, mode: str
) -> None:
    tool = run_code_tool(
        RunCodeConfig(enabled=True, timeout_s=0.5), sandbox_for(mode, tmp_path), ask_always=False
    )
    code = "import time\nprint('started', flush=True)\ntime.sleep(30)\n"
    result = await tool.run({"code": code}, ctx_with(session, tmp_path, StaticGuard()))
    assert "started" in result
    assert "timed out" in result.splitlines()[-1]


@pytest.mark.parametrize(
    ("ask_always", "sources", "why"),
    [
        (True, (), "the shell is in allowlist mode"),
        (
            False,
            (TaintSource("attachment", "report.pdf"),),
            "read untrusted content (attachment report.pdf)",
        ),
    ],
)
async def test_asks_first_in_allowlist_mode_or_a_tainted_session(
    session: Session, tmp_path: Path, ask_always: bool, sources: tuple[TaintSource, ...], why: str
) -> None:
    tool = run_code_tool(
        RunCodeConfig(enabled=True), sandbox_for("off", tmp_path), ask_always=ask_always
    )
    marker = tmp_path / "marker.txt"
    code = f"open({str(marker)!r}, 'w').write('ran')\nprint('done')\n"
    denied = StaticGuard(allow=False, sources=sources)
    with pytest.raises(ToolError, match="not run: run_code needs the user's approval"):
        await tool.run({"code": code}, ctx_with(session, tmp_path, denied))
    assert not marker.exists()
    assert len(denied.questions) == 1 and why in denied.questions[0]
    assert f"open({str(marker)!r}, 'w')" in denied.questions[0]  # the user sees the code
    allowed = StaticGuard(allow=True, sources=sources)
    assert "done" in await tool.run({"code": code}, ctx_with(session, tmp_path, allowed))
    assert marker.read_text() == "ran"


@pytest.mark.parametrize("code", ["", "   \n", None, 42])
async def test_bad_code_argument(session: Session, tmp_path: Path, code: object) -> None:
    tool = run_code_tool(
        RunCodeConfig(enabled=True), sandbox_for("off", tmp_path), ask_always=False
    )
    with pytest.raises(ToolError, match="`code` must be a non-empty string"):
        await tool.run({"code": code}, ctx_with(session, tmp_path, StaticGuard()))


@pytest.mark.parametrize("mode", CONFINED)
async def test_a_snippet_writes_only_its_folder_and_the_workspace(
    session: Session, tmp_path: Path, mode: str
) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("CANARY-KEY")
    outside = tmp_path / "outside"
    outside.mkdir()
    workspace = tmp_path / "work"
    workspace.mkdir()
    code = f"""
import pathlib
for target in ({str(outside / "x")!r}, {str(workspace / "kept.txt")!r}, 'scratch.txt'):
    try:
        pathlib.Path(target).write_text('made')
        print('wrote', target)
    except OSError as exc:
        print('refused', target, exc.strerror)
try:
    print(pathlib.Path({str(home / ".ssh" / "id_ed25519")!r}).read_text())
except OSError as exc:
    print('unreadable', exc.strerror)
"""
    tool = run_code_tool(RunCodeConfig(enabled=True), sandbox_for(mode, tmp_path), ask_always=False)
    result = await tool.run({"code": code}, ctx_with(session, workspace, StaticGuard()))
    assert "CANARY-KEY" not in result and "unreadable" in result
    assert f"refused {outside / 'x'}" in result
    assert not (outside / "x").exists()
    assert (workspace / "kept.txt").read_text() == "made"
    assert "wrote scratch.txt" in result
