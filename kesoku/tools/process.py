"""Run one tool process to its end: started on the event loop's thread, output capped, group killed.

The shell tool and run_code run their commands here, already wrapped by the sandbox
(:mod:`kesoku.tools.sandbox`). The process is started with :class:`subprocess.Popen` on the event
loop's own thread rather than through ``trio.run_process``, which starts it from a worker thread:
bubblewrap's ``--die-with-parent`` and the Landlock launcher's parent-death signal fire when the
starting *thread* ends, and trio's idle worker threads end after 10 s, which would kill any command
running longer. Starting a process costs about 2 ms of the loop (``vfork``).

The command gets its own process group (``start_new_session``). Whatever ends it — its own exit,
the timeout, a cancellation by the runtime (a forced stop, the tool bound) — the whole group is
killed with SIGKILL, so a backgrounded grandchild does not outlive the call. Inside the sandbox the
pid namespace (bubblewrap) or the launcher (Landlock) also reach processes that left the group.

Standard output and standard error are read together, as they interleave, in bounded memory
(:class:`~kesoku.tools.output.CappedBuffer`): the model reads the head and tail of a long output.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import signal
import subprocess
from collections.abc import Iterator, Mapping

import trio

from kesoku.tools.output import CappedBuffer
from kesoku.vocab.errors import ToolError

DRAIN_S = 0.5
"""After the command has ended, how long output still held open by an escaped process is read."""
REAP_S = 5.0
"""After a SIGKILL, how long the process may take to be reaped (a process stuck in the kernel)."""
POLL_S = 0.05
"""Where the kernel has no pidfd (not Linux), how often the process is checked for its exit."""
READ_CHUNK_BYTES = 65_536
SHOWN_MAX_CHARS = 500
"""The command line is repeated at the top of the result up to this length."""


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (``start_new_session`` made it the leader)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError as exc:
        # already gone (EPERM: a zombie leader on macOS)
        if exc.errno not in (errno.ESRCH, errno.EPERM):
            raise


async def _exited(process: subprocess.Popen[bytes]) -> int:
    """Wait for the process to end without a thread, and reap it."""
    if hasattr(os, "pidfd_open"):
        fd = os.pidfd_open(process.pid)
        try:
            await trio.lowlevel.wait_readable(fd)
        finally:
            os.close(fd)
    else:  # pragma: no cover - macOS
        while process.poll() is None:  # noqa: ASYNC110 - no event tells of a child's exit here
            await trio.sleep(POLL_S)
    return process.wait()


async def _read(stream: trio.lowlevel.FdStream, buffer: CappedBuffer, done: trio.Event) -> None:
    async with stream:
        while chunk := await stream.receive_some(READ_CHUNK_BYTES):
            buffer.add(chunk)
    done.set()


def _start(
    argv: list[str], cwd: os.PathLike[str] | str, env: Mapping[str, str]
) -> tuple[subprocess.Popen[bytes], int]:
    """Start the process with its output on a new pipe; returns it and the pipe's read end."""
    read_end, write_end = os.pipe()
    try:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=write_end,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=dict(env),
            start_new_session=True,
        )
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    return process, read_end


async def run_command(
    argv: list[str],
    *,
    cwd: os.PathLike[str] | str,
    timeout_s: float,
    max_output_bytes: int,
    env: Mapping[str, str],
    shown: str | None = None,
) -> str:
    """Run a command in its own process group and report its output and exit code.

    Nothing is checked here: callers check the policy and wrap the command in the sandbox first.

    Args:
        argv: The program and its arguments.
        cwd: Where it runs.
        timeout_s: After this long the process group is killed and the result says so.
        max_output_bytes: The cap of the output kept (head and tail).
        env: Its whole environment.
        shown: The command as the result names it; None: ``shlex.join(argv)``.

    Returns:
        The output (capped), then a line with the exit code, or saying it timed out.

    Raises:
        ToolError: The program cannot be started (not found, not executable, no such folder).

    Cancellation:
        The process group is killed with SIGKILL, the process is reaped (bounded by
        :data:`REAP_S`), and Cancelled propagates.
    """
    buffer = CappedBuffer(max_output_bytes)
    try:
        process, read_end = _start(argv, cwd, env)
    except OSError as exc:
        raise ToolError(
            f"cannot start {argv[0]!r} in {os.fspath(cwd)}: {exc.strerror or exc}"
        ) from None
    returncode: int | None = None
    try:
        with trio.move_on_after(timeout_s), _bare_cancelled():
            async with trio.open_nursery() as nursery:
                read_done = trio.Event()
                nursery.start_soon(_read, trio.lowlevel.FdStream(read_end), buffer, read_done)
                returncode = await _exited(process)
                # The command has ended: its leftover background jobs go with it, and output
                # still held open by a process that left the group is not waited for.
                kill_group(process.pid)
                with trio.move_on_after(DRAIN_S):
                    await read_done.wait()
                nursery.cancel_scope.cancel()
    finally:
        if returncode is None:
            kill_group(process.pid)
            # Shielded and bounded: a killed process is reaped even when the call was cancelled.
            with trio.CancelScope(shield=True), trio.move_on_after(REAP_S):
                await _exited(process)
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

    The runtime tells a killed tool by catching ``trio.Cancelled`` around ``run``
    (kesoku.agent.turn), and a nursery with strict exception groups wraps even a lone cancellation.
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


__all__ = ["kill_group", "run_command"]
