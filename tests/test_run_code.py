"""run_code with real subprocesses: output, exit code, the temporary folder, timeout, questions."""

from __future__ import annotations

from pathlib import Path

import pytest

from kesoku.config import RunCodeConfig
from kesoku.errors import ToolError
from kesoku.model import Session, TaintSource
from kesoku.tools.base import StaticGuard, ToolContext
from kesoku.tools.run_code import run_code_tool

# The snippet prints its working directory, so the test can check the folder is gone afterwards.
WHERE = "import os, sys\nprint('cwd', os.getcwd())\nprint('to stderr', file=sys.stderr)\nsys.exit(3)\n"


def ctx_with(session: Session, cwd: Path, guard: StaticGuard) -> ToolContext:
    return ToolContext(session=session, cwd=cwd, call_id="c", guard=guard)


async def test_runs_in_a_fresh_folder_that_is_removed(session: Session, tmp_path: Path) -> None:
    tool = run_code_tool(RunCodeConfig(enabled=True), ask_always=False)
    guard = StaticGuard(allow=False)
    result = await tool.run({"code": WHERE}, ctx_with(session, tmp_path, guard))
    lines = result.splitlines()
    assert lines[0] == "$ python main.py"
    assert lines[1].startswith("cwd ") and "kesoku-run-code-" in lines[1]
    assert lines[2:] == ["to stderr", "[exit code 3]"]
    assert not Path(lines[1].removeprefix("cwd ")).exists()
    assert guard.questions == []  # an untainted session in blocklist mode is not asked


async def test_a_snippet_that_runs_too_long_is_killed(session: Session, tmp_path: Path) -> None:
    tool = run_code_tool(RunCodeConfig(enabled=True, timeout_s=0.5), ask_always=False)
    code = "import time\nprint('started', flush=True)\ntime.sleep(30)\n"
    result = await tool.run({"code": code}, ctx_with(session, tmp_path, StaticGuard()))
    assert "started" in result
    assert "timed out" in result.splitlines()[-1]


@pytest.mark.parametrize(
    ("ask_always", "sources", "why"),
    [
        (True, (), "the shell is in allowlist mode"),
        (False, (TaintSource("attachment", "report.pdf"),), "read untrusted content (attachment report.pdf)"),
    ],
)
async def test_asks_first_in_allowlist_mode_or_a_tainted_session(
    session: Session, tmp_path: Path, ask_always: bool, sources: tuple[TaintSource, ...], why: str
) -> None:
    tool = run_code_tool(RunCodeConfig(enabled=True), ask_always=ask_always)
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
    tool = run_code_tool(RunCodeConfig(enabled=True), ask_always=False)
    with pytest.raises(ToolError, match="`code` must be a non-empty string"):
        await tool.run({"code": code}, ctx_with(session, tmp_path, StaticGuard()))
