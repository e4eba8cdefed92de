"""The shell tool with real, benign subprocesses in the OS sandbox, always in pytest's tmp_path.

Only echo, printf, sleep, sh -c '… sleep … & wait', env and python -c run here. Refused commands are
chosen so that, if the policy ever let one through, it would only create a marker file in tmp_path.
The process-group tests run under each mechanism (bubblewrap, Landlock, none) and find the processes
by a unique ``sleep`` duration: inside bubblewrap's pid namespace ``$!`` is not a host pid.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from pathlib import Path

import pytest
import trio
from runtime_harness import serve_runtime
from sandboxing import MECHANISMS, marker, sandbox_for, wait_gone, wait_running

from kesoku.config.settings import SandboxConfig, ShellConfig
from kesoku.testing import ScriptedLLM
from kesoku.tools.base import StaticGuard, ToolContext
from kesoku.tools.sandbox import BASE_ENV, Sandbox, environment
from kesoku.tools.shell import TIMEOUT_GRACE_S, shell_tool
from kesoku.vocab.errors import ToolError
from kesoku.vocab.model import Kind, Outcome, Session, TaintSource

PY = shlex.quote(sys.executable)


def grandchild(mark: str) -> str:
    """A shell whose grandchild sleeps while the shell waits on it:
    the process group has two members."""
    return f"sh -c 'sleep {mark} & wait'"


@pytest.fixture
def ctx(session: Session, tmp_path: Path) -> ToolContext:
    return ToolContext(session=session, cwd=tmp_path, call_id="call-1")


@pytest.fixture(params=MECHANISMS)
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    """The best mechanism here (tests of the tool itself, not of the confinement)."""
    return (
        sandbox_for("auto", tmp_path)
        if Sandbox(SandboxConfig()).probe().mechanism
        else sandbox_for("off", tmp_path)
    )


async def test_output_and_exit_code(ctx: ToolContext, sandbox: Sandbox) -> None:
    tool = shell_tool(ShellConfig(), sandbox)
    result = await tool.run({"command": "echo out; echo err >&2; exit 3"}, ctx)
    assert result == "$ echo out; echo err >&2; exit 3\nout\nerr\n[exit code 3]"
    assert (await tool.run({"command": "true"}, ctx)) == "$ true\n(no output)\n[exit code 0]"
    assert tool.name == "shell"
    assert tool.timeout_s == 120.0 + TIMEOUT_GRACE_S
    assert tool.parameters["required"] == ["command"]


async def test_it_runs_in_the_working_directory(
    ctx: ToolContext, sandbox: Sandbox, tmp_path: Path
) -> None:
    tool = shell_tool(ShellConfig(), sandbox)
    result = await tool.run({"command": "pwd; printf made > made.txt"}, ctx)
    assert f"\n{tmp_path}\n" in result
    assert (tmp_path / "made.txt").read_text() == "made"


async def test_use_shell_off_runs_argv_without_a_shell(ctx: ToolContext, sandbox: Sandbox) -> None:
    tool = shell_tool(ShellConfig(use_shell=False), sandbox)
    result = await tool.run({"command": "printf '%s|%s\\n' 'a b' '$HOME;x'"}, ctx)
    # nothing expanded, nothing split
    assert result.splitlines()[1:] == [
        "a b|$HOME;x",
        "[exit code 0]",
    ]
    literal = await tool.run({"command": "echo a;b | c"}, ctx)
    assert literal.splitlines()[1] == "a;b | c"
    with pytest.raises(ToolError, match="cannot be split into words: No closing quotation"):
        await tool.run({"command": "echo 'open"}, ctx)
    with pytest.raises(ToolError, match="cannot start 'no-such-program-kesoku' in "):
        await tool.run({"command": "no-such-program-kesoku --help"}, ctx)


async def test_use_shell_on_has_pipes_and_expansion(ctx: ToolContext, sandbox: Sandbox) -> None:
    tool = shell_tool(ShellConfig(use_shell=True), sandbox)
    result = await tool.run(
        {"command": "printf 'b\\na\\n' | sort | tr a-z A-Z; echo $((2 + 3))"}, ctx
    )
    assert result.splitlines()[1:] == ["A", "B", "5", "[exit code 0]"]


async def test_the_timeout_kills_the_whole_process_group(
    ctx: ToolContext, mode: str, tmp_path: Path
) -> None:
    tool = shell_tool(ShellConfig(timeout_s=30), sandbox_for(mode, tmp_path))
    mark = marker()
    started = trio.current_time()
    result = await tool.run({"command": f"echo before; {grandchild(mark)}", "timeout_s": 1}, ctx)
    assert trio.current_time() - started < 10
    assert result.startswith("$ echo before;")
    assert result.endswith(
        "before\n[timed out after 1 s: the command and its process group were killed]"
    )
    await wait_gone(mark)


async def test_background_jobs_do_not_outlive_the_command(
    ctx: ToolContext, mode: str, tmp_path: Path
) -> None:
    tool = shell_tool(ShellConfig(), sandbox_for(mode, tmp_path))
    mark = marker()
    with trio.fail_after(10):  # the job holds the output pipe open: the tool must not wait for it
        result = await tool.run({"command": f"sleep {mark} & echo started"}, ctx)
    assert result.endswith("started\n[exit code 0]")
    await wait_gone(mark)


async def test_a_command_outlives_the_thread_that_started_it(
    ctx: ToolContext, mode: str, tmp_path: Path
) -> None:
    # bwrap's --die-with-parent and the launcher's parent-death signal follow the starting thread:
    # trio's worker threads end after 10 s idle, so a command started from one would die at 10 s.
    tool = shell_tool(ShellConfig(), sandbox_for(mode, tmp_path))
    result = await tool.run({"command": "sleep 12; echo finished"}, ctx)
    assert result.endswith("finished\n[exit code 0]")


async def test_cancellation_kills_the_group_and_propagates(
    ctx: ToolContext, mode: str, tmp_path: Path
) -> None:
    tool = shell_tool(ShellConfig(), sandbox_for(mode, tmp_path))
    mark = marker()
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tool.run, {"command": grandchild(mark)}, ctx)
            await wait_running(mark)
            scope.cancel()
    assert scope.cancelled_caught
    await wait_gone(mark)


async def test_a_forced_stop_through_the_runtime_kills_the_command(
    mode: str, tmp_path: Path
) -> None:
    shell = shell_tool(ShellConfig(), sandbox_for(mode, tmp_path))
    mark = marker()
    llm = ScriptedLLM(
        [{"tool_calls": [{"name": "shell", "arguments": {"command": grandchild(mark)}}]}]
    )
    async with serve_runtime(tmp_path, llm, tools=[shell], project_dir=tmp_path) as h:
        await h.say("run it")
        await wait_running(mark)
        assert h.gateway.stop(h.session.id, force=True)
        await h.turn_end()
        result = h.history()[-1]
        assert result.kind is Kind.TOOL_RESULT
        assert result.metadata.outcome is Outcome.KILLED
        assert (
            result.content
            == "[killed] shell was killed: the user stopped the turn and killed its tools."
        )
        await wait_gone(mark)


async def test_the_tools_own_timeout_reports_through_the_runtime(
    tmp_path: Path, sandbox: Sandbox
) -> None:
    # The tool's own timeout fires first and its result keeps the output; the outcome stays
    # completed.
    shell = shell_tool(ShellConfig(timeout_s=1), sandbox)
    mark = marker()
    llm = ScriptedLLM(
        [
            {
                "tool_calls": [
                    {"name": "shell", "arguments": {"command": f"echo hi; {grandchild(mark)}"}}
                ]
            },
            {"text": "ok"},
        ]
    )
    async with serve_runtime(tmp_path, llm, tools=[shell], project_dir=tmp_path) as h:
        await h.say("run it")
        await h.turn_end()
        result = next(m for m in h.history() if m.kind is Kind.TOOL_RESULT)
        assert result.metadata.outcome is Outcome.COMPLETED
        assert "hi\n[timed out after 1 s" in result.content
        await wait_gone(mark)


async def test_the_runtime_bound_cancels_the_tool_and_the_group(
    tmp_path: Path, sandbox: Sandbox
) -> None:
    # A runtime bound shorter than the tool's own timeout: the runtime cancels run(), the group
    # dies.
    shell = dataclasses.replace(shell_tool(ShellConfig(), sandbox), timeout_s=1)
    mark = marker()
    calls = [{"name": "shell", "arguments": {"command": grandchild(mark)}}]
    llm = ScriptedLLM([{"tool_calls": calls}, {"text": "ok"}])
    async with serve_runtime(tmp_path, llm, tools=[shell], project_dir=tmp_path) as h:
        await h.say("run it")
        await h.turn_end()
        result = next(m for m in h.history() if m.kind is Kind.TOOL_RESULT)
        assert result.metadata.outcome is Outcome.TIMED_OUT
        assert result.content == "[timed_out] shell ran longer than 1 s and was cancelled."
        await wait_gone(mark)


async def test_long_output_keeps_head_and_tail(ctx: ToolContext, sandbox: Sandbox) -> None:
    tool = shell_tool(ShellConfig(max_output_bytes=1000), sandbox)
    command = f"{PY} -c \"print('HEAD' + 'x' * 200000 + 'TAIL')\""
    result = await tool.run({"command": command}, ctx)
    body = result.split("\n", 1)[1].rsplit("\n[exit code", 1)[0]
    assert body.startswith("HEAD")
    assert body.rstrip("\n").endswith("TAIL")
    assert "bytes cut …]" in body
    assert len(body.encode()) <= 1001
    assert result.endswith("[exit code 0]")


async def test_a_refused_command_is_a_tool_error_and_does_not_run(
    ctx: ToolContext, sandbox: Sandbox, tmp_path: Path
) -> None:
    tool = shell_tool(ShellConfig(mode="allowlist", allowlist_patterns=(r"^echo(\s|$)",)), sandbox)
    assert (await tool.run({"command": "echo ok"}, ctx)).endswith("ok\n[exit code 0]")
    with pytest.raises(ToolError) as refused:
        await tool.run({"command": "echo ok && touch marker.txt"}, ctx)
    assert str(refused.value) == (
        "refused by the shell policy (allowlist mode): `touch marker.txt` matches none of "
        "shell.allowlist_patterns"
    )
    argv_tool = shell_tool(
        ShellConfig(mode="allowlist", use_shell=False, allowlist_patterns=(r"^echo\b",)), sandbox
    )
    with pytest.raises(ToolError, match=r"`touch marker\.txt` matches none"):
        await argv_tool.run({"command": "touch marker.txt"}, ctx)
    assert not (tmp_path / "marker.txt").exists()


async def test_a_refusal_reaches_the_model_as_a_failed_result(
    tmp_path: Path, sandbox: Sandbox
) -> None:
    shell = shell_tool(ShellConfig(mode="allowlist", allowlist_patterns=(r"^echo\b",)), sandbox)
    calls = [{"name": "shell", "arguments": {"command": "echo $(touch marker.txt)"}}]
    llm = ScriptedLLM([{"tool_calls": calls}, {"text": "ok"}])
    async with serve_runtime(tmp_path, llm, tools=[shell], project_dir=tmp_path) as h:
        await h.say("try")
        await h.turn_end()
        result = next(m for m in h.history() if m.kind is Kind.TOOL_RESULT)
        assert result.metadata.outcome is Outcome.FAILED
        assert result.content == (
            "[failed] refused by the shell policy (allowlist mode): `touch marker.txt` matches "
            "none of shell.allowlist_patterns"
        )
    assert not (tmp_path / "marker.txt").exists()


async def test_bad_arguments_are_tool_errors(ctx: ToolContext, sandbox: Sandbox) -> None:
    tool = shell_tool(ShellConfig(), sandbox)
    for arguments in ({}, {"command": "  "}, {"command": 3}):
        with pytest.raises(ToolError, match="`command` must be a non-empty string"):
            await tool.run(arguments, ctx)
    for timeout in (0, -1, "soon", True):
        with pytest.raises(ToolError, match="`timeout_s` must be a positive number"):
            await tool.run({"command": "echo x", "timeout_s": timeout}, ctx)


async def test_only_allowlisted_variables_reach_the_command(
    ctx: ToolContext, mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secrets = {
        "OPENAI_API_KEY": "sk-secret-1",
        "GITHUB_TOKEN": "ghp-secret-2",
        "DB_PASSWORD": "secret-3",
        "DATABASE_URL": "postgres://app:secret-4@db/app",
        "HF_AUTH": "hf_secret5",
        "GOOGLE_APPLICATION_CREDENTIALS": "/keys/secret-6.json",
        "SSH_AUTH_SOCK": "/tmp/agent-secret-7",
        "BASH_ENV": "/tmp/secret-8.sh",
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("KESOKU_VISIBLE", "plain-value")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    tool = shell_tool(ShellConfig(), sandbox_for(mode, tmp_path, env=("KESOKU_VISIBLE",)))
    result = await tool.run(
        {"command": f'{PY} -c "import os; print(sorted(os.environ.items()))"'}, ctx
    )
    assert "plain-value" in result and "'LC_ALL', 'C.UTF-8'" in result
    for name, value in secrets.items():
        assert name not in result and value not in result


def test_the_environment_is_an_allowlist() -> None:
    environ = {
        "PATH": "/bin",
        "HOME": "/h",
        "API_KEY": "k",
        "DATABASE_URL": "u",
        "LC_TIME": "C",
        "X": "1",
    }
    assert environment(environ=environ) == {"PATH": "/bin", "HOME": "/h", "LC_TIME": "C"}
    assert environment(["X"], environ) == {"PATH": "/bin", "HOME": "/h", "LC_TIME": "C", "X": "1"}
    assert "PATH" in BASE_ENV and "PATH" in environment()


# -- taint -----------------------------------------------------------------------------------------


async def test_a_tainted_session_asks_before_a_line_outside_the_allowlist(
    session: Session, tmp_path: Path, sandbox: Sandbox
) -> None:
    tool = shell_tool(ShellConfig(), sandbox)  # blocklist mode: `touch` is not blocklisted
    tainted = (TaintSource("url", "https://example.com/payload"),)
    denied = StaticGuard(allow=False, sources=tainted)
    ctx = ToolContext(session=session, cwd=tmp_path, call_id="c", guard=denied)
    with pytest.raises(
        ToolError, match=r"holds untrusted content \(url https://example.com/payload\)"
    ):
        await tool.run({"command": "echo ok && touch marker.txt"}, ctx)
    assert not (tmp_path / "marker.txt").exists()
    assert len(denied.questions) == 1
    assert denied.questions[0].startswith(
        "shell wants to run `echo ok && touch marker.txt`. It is outside the"
    )
    # A line the allowlist accepts runs without a question.
    assert (await tool.run({"command": "echo fine"}, ctx)).startswith("$ echo fine\nfine")
    assert len(denied.questions) == 1
    allowed = StaticGuard(allow=True, sources=tainted)
    ctx = ToolContext(session=session, cwd=tmp_path, call_id="c", guard=allowed)
    await tool.run({"command": "touch marker.txt"}, ctx)
    assert (tmp_path / "marker.txt").exists()
    assert len(allowed.questions) == 1


async def test_an_untainted_session_is_not_asked_and_a_url_taints_it(
    session: Session, tmp_path: Path, sandbox: Sandbox
) -> None:
    tool = shell_tool(ShellConfig(), sandbox)
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
