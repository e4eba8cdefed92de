"""The shell tool: one command line, checked by the policy, run in the session's working directory (DESIGN §8).

A line runs as ``/bin/sh -c LINE`` (``shell.use_shell = true``) or as the argv ``shlex.split`` makes of
it, with no shell (``false``); :mod:`kesoku.policy` checks it first either way, and a refusal is a
:class:`~kesoku.errors.ToolError` whose message is the policy's reason.

The command gets its own process group (``start_new_session``). Whatever ends it — its own exit, the
tool's timeout (``shell.timeout_s``), or a cancellation by the runtime (a forced stop, the tool bound)
— the whole group is killed with SIGKILL, so a backgrounded grandchild does not outlive the call. A
process that leaves the group on purpose (``setsid``, a daemon that forks twice) is out of reach; its
output is no longer waited for once the command itself has ended.

Standard output and standard error are read together, as they interleave, in bounded memory
(:class:`~kesoku.tools.output.CappedBuffer`): the model reads the head and the tail of a long output.
The child's environment has no credentials: variables whose names hold KEY, TOKEN, SECRET, PASSWORD,
PASSWD or CREDENTIAL (``GOOGLE_APPLICATION_CREDENTIALS`` among them), ``SSH_AUTH_SOCK``, and the
variables that make a shell run a file first (``BASH_ENV``, ``ENV``, exported functions).

Taint: a URL in a line marks the session tainted (what the command fetches is untrusted). In a tainted
session, under ``mode = "blocklist"``, a line the allowlist would refuse runs only if the user allows it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shlex
import signal
import subprocess
from collections.abc import Iterator, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from kesoku.errors import ToolError
from kesoku.tools.base import Tool, ToolContext
from kesoku.tools.output import CappedBuffer
from kesoku.tools.paths import PathGates, workspaces

if TYPE_CHECKING:
    from kesoku.config import ShellConfig
    from kesoku.policy import PolicyDecision

SHELL = "/bin/sh"
"""The shell of ``use_shell``; the policy parses bash's grammar, a superset of what sh accepts."""
TIMEOUT_GRACE_S = 10.0
"""The runtime's bound on the call exceeds ``shell.timeout_s`` by this much, so the tool's own timeout
fires first and reports the output so far."""
DRAIN_S = 0.5
"""After the command has ended, how long output still held open by an escaped process is read."""
READ_CHUNK_BYTES = 65_536
SHOWN_MAX_CHARS = 500
"""The command line is repeated at the top of the result up to this length."""

_URL = re.compile(r"\b(?:https?|ftp)://[^\s'\"<>|;&)]+")
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
_DROPPED = frozenset({"SSH_AUTH_SOCK", "BASH_ENV", "ENV"})

DESCRIPTION = """Run a shell command line in the working directory and return its output and exit code.
Standard output and error come interleaved; a long output keeps its head and tail. The command is checked by
the shell policy first; a refused command is not run and the reason says which part and which rule. Runs
without a terminal and without standard input; interactive programs fail. Background processes are stopped
when the command ends."""


def child_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a command runs with: the daemon's, without credentials and start-up hooks.

    Args:
        environ: The environment to start from; None: ``os.environ``.

    Returns:
        A copy without API keys, tokens, passwords and credentials files, ``SSH_AUTH_SOCK``,
        ``BASH_ENV``, ``ENV`` and exported shell functions (``BASH_FUNC_*``).
    """
    source = os.environ if environ is None else environ
    return {
        name: value
        for name, value in source.items()
        if not _SECRET_NAME.search(name) and name not in _DROPPED and not name.startswith("BASH_FUNC_")
    }


def shell_tool(config: ShellConfig, *, gates: PathGates | None = None) -> Tool:
    """The ``shell`` tool.

    Args:
        config: ``[shell]``: ``use_shell``, the policy (``mode`` and its patterns), ``timeout_s`` and
            ``max_output_bytes``.
        gates: Kesoku's own files and the home folder, for the policy's secret-path rules.

    Returns:
        The tool; its ``timeout_s`` is ``config.timeout_s`` plus :data:`TIMEOUT_GRACE_S`.
    """
    gates = gates if gates is not None else PathGates()

    async def run(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        line = arguments.get("command")
        if not isinstance(line, str) or not line.strip():
            raise ToolError("`command` must be a non-empty string: the command line to run")
        timeout_s = _timeout(arguments.get("timeout_s"), config.timeout_s)
        if config.use_shell:
            argv = [SHELL, "-c", line]
        else:
            try:
                argv = shlex.split(line)
            except ValueError as exc:
                raise ToolError(f"the command cannot be split into words: {exc}") from None
        decision = await trio.to_thread.run_sync(_check, line, argv, config, ctx, gates)
        if not decision.allowed:
            raise ToolError(decision.reason)
        if ctx.guard.tainted and config.mode == "blocklist":
            await _confirm_outside_allowlist(line, argv, config, ctx, gates)
        for url in _URL.findall(line):
            ctx.guard.add_taint("url", url)  # what the command fetches is outside the workspace's trust
        return await run_command(
            argv, cwd=ctx.cwd, timeout_s=timeout_s, max_output_bytes=config.max_output_bytes, shown=line
        )

    parameters = {
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The command line to run."},
            "timeout_s": {
                "type": "number",
                "description": f"Stop the command after this many seconds (at most {config.timeout_s:g}).",
            },
        },
        "required": ["command"],
    }
    return Tool("shell", DESCRIPTION, run, parameters, timeout_s=config.timeout_s + TIMEOUT_GRACE_S)


def _timeout(value: object, limit_s: float) -> float:
    if value is None:
        return limit_s
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ToolError(f"`timeout_s` must be a positive number of seconds, got {value!r}")
    return min(float(value), limit_s)


async def _confirm_outside_allowlist(
    line: str, argv: list[str], config: ShellConfig, ctx: ToolContext, gates: PathGates
) -> None:
    """In a tainted session, a line the allowlist would refuse runs only if the user allows it."""
    strict = msgspec.structs.replace(config, mode="allowlist")
    decision = await trio.to_thread.run_sync(_check, line, argv, strict, ctx, gates)
    if decision.allowed:
        return
    sources = ", ".join(f"{s.kind} {s.label}" for s in ctx.guard.taint_sources()[:3])
    shown = line if len(line) <= SHOWN_MAX_CHARS else line[: SHOWN_MAX_CHARS - 1] + "…"
    approval = await ctx.confirm(
        f"shell wants to run `{shown}`. It is outside the allowlist ({decision.reason}) and this session "
        f"has read untrusted content ({sources}). Allow?"
    )
    if not approval.allowed:
        raise ToolError(
            f"not run: this session holds untrusted content ({sources}), so a command outside the allowlist "
            f"needs the user's approval, and it was not allowed ({approval.note})"
        )


def _check(line: str, argv: list[str], config: ShellConfig, ctx: ToolContext, gates: PathGates) -> PolicyDecision:
    """The policy's decision (reads the file system: run it in a thread)."""
    # Imported here, in the worker thread: bashlex rebuilds its parse tables at import (~200 ms), which
    # must stay off `kesoku chat`'s start-up and off the event loop.
    from kesoku.policy import check_argv, check_command

    folders = workspaces(ctx)
    if config.use_shell:
        return check_command(line, config, cwd=ctx.cwd, workspace=folders, gates=gates)
    return check_argv(argv, config, cwd=ctx.cwd, workspace=folders, gates=gates)


def _kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (start_new_session made the child its leader)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError as exc:
        if exc.errno not in (errno.ESRCH, errno.EPERM):  # already gone (EPERM: a zombie leader on macOS)
            raise


async def _deliver_cancel(process: trio.Process) -> None:
    """trio.run_process's cancellation hook: the whole group dies, not only the shell."""
    _kill_group(process.pid)
    await trio.lowlevel.checkpoint()


async def _read(stream: trio.abc.ReceiveStream, buffer: CappedBuffer, done: trio.Event) -> None:
    async with stream:
        while chunk := await stream.receive_some(READ_CHUNK_BYTES):
            buffer.add(chunk)
    done.set()


async def run_command(
    argv: list[str],
    *,
    cwd: os.PathLike[str] | str,
    timeout_s: float,
    max_output_bytes: int,
    shown: str | None = None,
    env: Mapping[str, str] | None = None,
) -> str:
    """Run a command in its own process group and report its output and exit code.

    The policy is not checked here: callers check first (the shell tool, run_code).

    Args:
        argv: The program and its arguments.
        cwd: Where it runs.
        timeout_s: After this long the process group is killed and the result says so.
        max_output_bytes: The cap of the output kept (head and tail).
        shown: The command as the result names it; None: ``shlex.join(argv)``.
        env: Its environment; None: :func:`child_environment` of the daemon's.

    Returns:
        The output (capped), then a line with the exit code, or saying it timed out.

    Raises:
        ToolError: The program cannot be started (not found, not executable, no such folder).

    Cancellation:
        The process group is killed with SIGKILL, the process is reaped, and Cancelled propagates.
    """
    buffer = CappedBuffer(max_output_bytes)
    start = partial(
        trio.run_process,
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        check=False,
        cwd=cwd,
        env=child_environment() if env is None else dict(env),
        start_new_session=True,
        deliver_cancel=_deliver_cancel,
    )
    returncode: int | None = None
    start_error: OSError | None = None
    with trio.move_on_after(timeout_s), _bare_cancelled():
        async with trio.open_nursery() as nursery:
            try:
                process: trio.Process = await nursery.start(start)
            except OSError as exc:
                # Kept, not raised here: raised in a nursery's body, it would leave as an ExceptionGroup.
                start_error = exc
            else:
                assert process.stdout is not None
                read_done = trio.Event()
                nursery.start_soon(_read, process.stdout, buffer, read_done)
                returncode = await process.wait()
                # The command has ended: its leftover background jobs go with it, and output still held
                # open by a process that left the group is not waited for.
                _kill_group(process.pid)
                with trio.move_on_after(DRAIN_S):
                    await read_done.wait()
                nursery.cancel_scope.cancel()
    if start_error is not None:
        raise ToolError(f"cannot start {argv[0]!r} in {os.fspath(cwd)}: {start_error.strerror or start_error}")
    output = buffer.text() or "(no output)"
    if not output.endswith("\n"):
        output += "\n"
    if returncode is None:
        status = f"[timed out after {timeout_s:g} s: the command and its process group were killed]"
    elif returncode < 0:
        status = f"[killed by signal {_signal_name(-returncode)}]"
    else:
        status = f"[exit code {returncode}]"
    line = shown if shown is not None else shlex.join(argv)
    if len(line) > SHOWN_MAX_CHARS:
        line = line[: SHOWN_MAX_CHARS - 1] + "…"
    return f"$ {line}\n{output}{status}"


@contextlib.contextmanager
def _bare_cancelled() -> Iterator[None]:
    """Let a cancellation leave as one ``trio.Cancelled``, not as the group a nursery makes of them.

    The runtime tells a killed tool by catching ``trio.Cancelled`` around ``run`` (kesoku.turn), and
    a nursery with strict exception groups wraps even a lone cancellation.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        cancelled, rest = group.split(trio.Cancelled)
        if cancelled is None or rest is not None:
            raise
        leaf: BaseException = cancelled
        while isinstance(leaf, BaseExceptionGroup):
            leaf = leaf.exceptions[0]
        raise leaf from None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


__all__ = ["DESCRIPTION", "SHELL", "TIMEOUT_GRACE_S", "child_environment", "run_command", "shell_tool"]
