"""The shell tool with real, benign subprocesses, always in pytest's tmp_path.

Only echo, printf, sleep, sh -c '… sleep … & wait', env and python -c run here. Refused commands are
chosen so that, if the policy ever let one through, it would only create a marker file in tmp_path.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
from pathlib import Path

import pytest
import trio
from runtime_harness import serve_runtime

from kesoku.config import ShellConfig
from kesoku.errors import ToolError
from kesoku.model import Kind, Outcome, Session, TaintSource
from kesoku.testing import ScriptedLLM
from kesoku.tools.base import StaticGuard, ToolContext
from kesoku.tools.paths import PathGates
from kesoku.tools.shell import TIMEOUT_GRACE_S, child_environment, shell_tool

PY = shlex.quote(sys.executable)
# A shell whose grandchild sleep writes its pid, then waits on it: the process group has two members.
GRANDCHILD = "sh -c 'sleep 30 & echo $! > grandchild.pid; wait'"


@pytest.fixture
def ctx(session: Session, tmp_path: Path) -> ToolContext:
    return ToolContext(session=session, cwd=tmp_path, call_id="call-1")


@pytest.fixture
def gates(tmp_path: Path) -> PathGates:
    return PathGates(home=tmp_path / "home")


def alive(pid: int) -> bool:
    """Whether a process runs (a zombie waiting for a reaper counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


async def wait_for_file(path: Path, timeout_s: float = 10.0) -> str:
    with trio.fail_after(timeout_s):
        while not (path.exists() and path.read_text().strip()):  # noqa: ASYNC110 (another process writes it)
            await trio.sleep(0.02)
    return path.read_text().strip()


async def wait_gone(pid: int, timeout_s: float = 5.0) -> None:
    with trio.fail_after(timeout_s):
        while alive(pid):  # noqa: ASYNC110 (the kernel ends it; there is nothing to wait on)
            await trio.sleep(0.02)


async def test_output_and_exit_code(ctx: ToolContext, gates: PathGates) -> None:
    tool = shell_tool(ShellConfig(), gates=gates)
    result = await tool.run({"command": "echo out; echo err >&2; exit 3"}, ctx)
    assert result == "$ echo out; echo err >&2; exit 3\nout\nerr\n[exit code 3]"
    assert (await tool.run({"command": "true"}, ctx)) == "$ true\n(no output)\n[exit code 0]"
    assert tool.name == "shell"
    assert tool.timeout_s == 120.0 + TIMEOUT_GRACE_S
    assert tool.parameters["required"] == ["command"]


async def test_it_runs_in_the_working_directory(ctx: ToolContext, gates: PathGates, tmp_path: Path) -> None:
    tool = shell_tool(ShellConfig(), gates=gates)
    result = await tool.run({"command": "pwd; printf made > made.txt"}, ctx)
    assert f"\n{tmp_path}\n" in result
    assert (tmp_path / "made.txt").read_text() == "made"


async def test_use_shell_off_runs_argv_without_a_shell(ctx: ToolContext, gates: PathGates) -> None:
    tool = shell_tool(ShellConfig(use_shell=False), gates=gates)
    result = await tool.run({"command": "printf '%s|%s\\n' 'a b' '$HOME;x'"}, ctx)
    assert result.splitlines()[1:] == ["a b|$HOME;x", "[exit code 0]"]  # nothing expanded, nothing split
    literal = await tool.run({"command": "echo a;b | c"}, ctx)
    assert literal.splitlines()[1] == "a;b | c"
    with pytest.raises(ToolError, match="cannot be split into words: No closing quotation"):
        await tool.run({"command": "echo 'open"}, ctx)
    with pytest.raises(ToolError, match="cannot start 'no-such-program-kesoku' in "):
        await tool.run({"command": "no-such-program-kesoku --help"}, ctx)


async def test_use_shell_on_has_pipes_and_expansion(ctx: ToolContext, gates: PathGates) -> None:
    tool = shell_tool(ShellConfig(use_shell=True), gates=gates)
    result = await tool.run({"command": "printf 'b\\na\\n' | sort | tr a-z A-Z; echo $((2 + 3))"}, ctx)
    assert result.splitlines()[1:] == ["A", "B", "5", "[exit code 0]"]


async def test_the_timeout_kills_the_whole_process_group(ctx: ToolContext, gates: PathGates, tmp_path: Path) -> None:
    tool = shell_tool(ShellConfig(timeout_s=30), gates=gates)
    started = trio.current_time()
    result = await tool.run({"command": f"echo before; {GRANDCHILD}", "timeout_s": 1}, ctx)
    assert trio.current_time() - started < 10
    assert result.startswith("$ echo before;")
    assert result.endswith("before\n[timed out after 1 s: the command and its process group were killed]")
    grandchild = int((tmp_path / "grandchild.pid").read_text())
    await wait_gone(grandchild)


async def test_background_jobs_do_not_outlive_the_command(ctx: ToolContext, gates: PathGates, tmp_path: Path) -> None:
    tool = shell_tool(ShellConfig(), gates=gates)
    with trio.fail_after(10):  # the job holds the output pipe open: the tool must not wait for it
        result = await tool.run({"command": "sleep 30 & echo $! > job.pid; echo started"}, ctx)
    assert result.endswith("started\n[exit code 0]")
    await wait_gone(int((tmp_path / "job.pid").read_text()))


async def test_cancellation_kills_the_group_and_propagates(ctx: ToolContext, gates: PathGates, tmp_path: Path) -> None:
    tool = shell_tool(ShellConfig(), gates=gates)
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tool.run, {"command": GRANDCHILD}, ctx)
            await wait_for_file(tmp_path / "grandchild.pid")
            scope.cancel()
    assert scope.cancelled_caught
    await wait_gone(int((tmp_path / "grandchild.pid").read_text()))


async def test_a_forced_stop_through_the_runtime_kills_the_command(tmp_path: Path) -> None:
    shell = shell_tool(ShellConfig(), gates=PathGates(home=tmp_path / "home"))
    llm = ScriptedLLM([{"tool_calls": [{"name": "shell", "arguments": {"command": GRANDCHILD}}]}])
    async with serve_runtime(tmp_path, llm, tools=[shell], project_dir=tmp_path) as h:
        await h.say("run it")
        grandchild = int(await wait_for_file(tmp_path / "grandchild.pid"))
        assert alive(grandchild)
        assert h.gateway.stop(h.session.id, force=True)
        await h.turn_end()
        result = h.history()[-1]
        assert result.kind is Kind.TOOL_RESULT
        assert result.metadata.outcome is Outcome.KILLED
        assert result.content == "[killed] shell was stopped by the user."
        await wait_gone(grandchild)


async def test_the_tools_own_timeout_reports_through_the_runtime(tmp_path: Path) -> None:
    # The tool's own timeout fires first and its result keeps the output; the outcome stays completed.
    shell = shell_tool(ShellConfig(timeout_s=1), gates=PathGates(home=tmp_path / "home"))
    llm = ScriptedLLM(
        [{"tool_calls": [{"name": "shell", "arguments": {"command": f"echo hi; {GRANDCHILD}"}}]}, {"text": "ok"}]
    )
    async with serve_runtime(tmp_path, llm, tools=[shell], project_dir=tmp_path) as h:
        await h.say("run it")
        await h.turn_end()
        result = next(m for m in h.history() if m.kind is Kind.TOOL_RESULT)
        assert result.metadata.outcome is Outcome.COMPLETED
        assert "hi\n[timed out after 1 s" in result.content
        await wait_gone(int((tmp_path / "grandchild.pid").read_text()))


async def test_the_runtime_bound_cancels_the_tool_and_the_group(tmp_path: Path) -> None:
    # A runtime bound shorter than the tool's own timeout: the runtime cancels run(), the group dies.
    shell = dataclasses.replace(shell_tool(ShellConfig(), gates=PathGates(home=tmp_path / "home")), timeout_s=1)
    llm = ScriptedLLM([{"tool_calls": [{"name": "shell", "arguments": {"command": GRANDCHILD}}]}, {"text": "ok"}])
    async with serve_runtime(tmp_path, llm, tools=[shell], project_dir=tmp_path) as h:
        await h.say("run it")
        await h.turn_end()
        result = next(m for m in h.history() if m.kind is Kind.TOOL_RESULT)
        assert result.metadata.outcome is Outcome.TIMED_OUT
        assert result.content == "[timed_out] shell ran longer than 1 s and was cancelled."
        await wait_gone(int((tmp_path / "grandchild.pid").read_text()))


async def test_long_output_keeps_head_and_tail(ctx: ToolContext, gates: PathGates) -> None:
    tool = shell_tool(ShellConfig(max_output_bytes=1000), gates=gates)
    command = f"{PY} -c \"print('HEAD' + 'x' * 200000 + 'TAIL')\""
    result = await tool.run({"command": command}, ctx)
    body = result.split("\n", 1)[1].rsplit("\n[exit code", 1)[0]
    assert body.startswith("HEAD")
    assert body.rstrip("\n").endswith("TAIL")
    assert "bytes cut …]" in body
    assert len(body.encode()) <= 1001
    assert result.endswith("[exit code 0]")


async def test_a_refused_command_is_a_tool_error_and_does_not_run(
    ctx: ToolContext, gates: PathGates, tmp_path: Path
) -> None:
    tool = shell_tool(ShellConfig(mode="allowlist", allowlist_patterns=(r"^echo(\s|$)",)), gates=gates)
    assert (await tool.run({"command": "echo ok"}, ctx)).endswith("ok\n[exit code 0]")
    with pytest.raises(ToolError) as refused:
        await tool.run({"command": "echo ok && touch marker.txt"}, ctx)
    assert str(refused.value) == (
        "refused by the shell policy (allowlist mode): `touch marker.txt` matches none of shell.allowlist_patterns"
    )
    argv_tool = shell_tool(ShellConfig(mode="allowlist", use_shell=False, allowlist_patterns=(r"^echo\b",)))
    with pytest.raises(ToolError, match=r"`touch marker\.txt` matches none"):
        await argv_tool.run({"command": "touch marker.txt"}, ctx)
    assert not (tmp_path / "marker.txt").exists()


async def test_a_refusal_reaches_the_model_as_a_failed_result(tmp_path: Path) -> None:
    shell = shell_tool(ShellConfig(mode="allowlist", allowlist_patterns=(r"^echo\b",)))
    calls = [{"name": "shell", "arguments": {"command": "echo $(touch marker.txt)"}}]
    llm = ScriptedLLM([{"tool_calls": calls}, {"text": "ok"}])
    async with serve_runtime(tmp_path, llm, tools=[shell], project_dir=tmp_path) as h:
        await h.say("try")
        await h.turn_end()
        result = next(m for m in h.history() if m.kind is Kind.TOOL_RESULT)
        assert result.metadata.outcome is Outcome.FAILED
        assert result.content == (
            "[failed] refused by the shell policy (allowlist mode): `touch marker.txt` matches none of "
            "shell.allowlist_patterns"
        )
    assert not (tmp_path / "marker.txt").exists()


async def test_bad_arguments_are_tool_errors(ctx: ToolContext, gates: PathGates) -> None:
    tool = shell_tool(ShellConfig(), gates=gates)
    for arguments in ({}, {"command": "  "}, {"command": 3}):
        with pytest.raises(ToolError, match="`command` must be a non-empty string"):
            await tool.run(arguments, ctx)
    for timeout in (0, -1, "soon", True):
        with pytest.raises(ToolError, match="`timeout_s` must be a positive number"):
            await tool.run({"command": "echo x", "timeout_s": timeout}, ctx)


async def test_secrets_stay_out_of_the_child_environment(
    ctx: ToolContext, gates: PathGates, monkeypatch: pytest.MonkeyPatch
) -> None:
    secrets = {
        "OPENAI_API_KEY": "sk-secret-1",
        "GITHUB_TOKEN": "ghp-secret-2",
        "DB_PASSWORD": "secret-3",
        "aws_secret_access_key": "secret-4",
        "GOOGLE_APPLICATION_CREDENTIALS": "/keys/secret-5.json",
        "SSH_AUTH_SOCK": "/tmp/agent-secret-6",
        "BASH_ENV": "/tmp/secret-7.sh",
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("KESOKU_VISIBLE", "plain-value")
    tool = shell_tool(ShellConfig(), gates=gates)
    result = await tool.run({"command": f'{PY} -c "import os; print(sorted(os.environ.items()))"'}, ctx)
    assert "plain-value" in result
    for name, value in secrets.items():
        assert name not in result and value not in result


def test_child_environment_filter() -> None:
    environ = {"PATH": "/bin", "HOME": "/h", "API_KEY": "k", "Slack_Token": "t", "BASH_FUNC_ls%%": "() { :; }"}
    assert child_environment(environ) == {"PATH": "/bin", "HOME": "/h"}
    assert "PATH" in child_environment()
    assert all("TOKEN" not in name.upper() for name in child_environment(dict(os.environ)))


# -- taint -----------------------------------------------------------------------------------------


async def test_a_tainted_session_asks_before_a_line_outside_the_allowlist(
    session: Session, tmp_path: Path, gates: PathGates
) -> None:
    tool = shell_tool(ShellConfig(), gates=gates)  # blocklist mode: `touch` is not blocklisted
    tainted = (TaintSource("url", "https://example.com/payload"),)
    denied = StaticGuard(allow=False, sources=tainted)
    ctx = ToolContext(session=session, cwd=tmp_path, call_id="c", guard=denied)
    with pytest.raises(ToolError, match=r"holds untrusted content \(url https://example.com/payload\)"):
        await tool.run({"command": "echo ok && touch marker.txt"}, ctx)
    assert not (tmp_path / "marker.txt").exists()
    assert len(denied.questions) == 1
    assert denied.questions[0].startswith("shell wants to run `echo ok && touch marker.txt`. It is outside the")
    # A line the allowlist accepts runs without a question.
    assert (await tool.run({"command": "echo fine"}, ctx)).startswith("$ echo fine\nfine")
    assert len(denied.questions) == 1
    allowed = StaticGuard(allow=True, sources=tainted)
    ctx = ToolContext(session=session, cwd=tmp_path, call_id="c", guard=allowed)
    await tool.run({"command": "touch marker.txt"}, ctx)
    assert (tmp_path / "marker.txt").exists()
    assert len(allowed.questions) == 1


async def test_an_untainted_session_is_not_asked_and_a_url_taints_it(
    session: Session, tmp_path: Path, gates: PathGates
) -> None:
    tool = shell_tool(ShellConfig(), gates=gates)
    guard = StaticGuard(allow=False)
    ctx = ToolContext(session=session, cwd=tmp_path, call_id="c", guard=guard)
    await tool.run({"command": "touch first.txt"}, ctx)
    assert (tmp_path / "first.txt").exists()
    await tool.run({"command": "echo 'https://example.com/a?b=1' http://x.test/y"}, ctx)
    assert guard.taint_sources() == (
        TaintSource("url", "https://example.com/a?b=1"),
        TaintSource("url", "http://x.test/y"),
    )
    with pytest.raises(ToolError, match="needs the user's approval"):
        await tool.run({"command": "touch second.txt"}, ctx)
    assert not (tmp_path / "second.txt").exists()
