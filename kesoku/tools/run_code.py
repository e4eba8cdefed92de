"""The run_code tool: a Python snippet run in a fresh temporary folder, in the OS sandbox.

The snippet is written to ``main.py`` in a new folder under the system's temporary directory and run
with the daemon's own interpreter, unbuffered and isolated (``python -I -u``: no user site-packages,
no ``PYTHON*`` variables), in the shell tool's OS sandbox (:mod:`kesoku.tools.sandbox`: it may write
only that folder and the session's workspace, sees no secrets, no network unless allowed) and with
its machinery (:mod:`kesoku.tools.process`): its own process group killed whole on timeout or
forced stop, output capped head and tail. The folder is removed afterwards.

No command policy can judge what a Python program does, so run_code is off unless ``[run_code]
enabled = true``, and each call asks the user first when the shell is in allowlist mode (the
operator chose to vet commands) or when the session is tainted (untrusted content could be steering
the model).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import trio

from kesoku.tools.base import Tool, ToolContext
from kesoku.tools.paths import workspaces
from kesoku.tools.process import run_command
from kesoku.tools.schema import Check, tool_from_function
from kesoku.tools.shell import TIMEOUT_GRACE_S
from kesoku.vocab.errors import ToolError

if TYPE_CHECKING:
    from kesoku.config.settings import RunCodeConfig
    from kesoku.tools.sandbox import Sandbox

MAX_CODE_BYTES = 200_000
"""Longest snippet accepted; a longer program belongs in a file run with the shell."""
SHOWN_LINES = 12
"""Lines of the snippet shown in the question to the user."""
_Code = Annotated[
    str, Check("`code` must be a non-empty string: the Python program to run", str.strip)
]

DESCRIPTION = (
    "Run a Python 3 program in a fresh, empty temporary folder.\n"
    "For calculations, data processing and quick checks: print what you need to see. No stdin; "
    "stdout and stderr come interleaved. The folder is deleted afterwards: write files to keep "
    "into the workspace, by absolute path."
)


def run_code_tool(config: RunCodeConfig, sandbox: Sandbox, *, ask_always: bool) -> Tool:
    """The ``run_code`` tool.

    Args:
        config: ``[run_code]``: ``timeout_s`` and ``max_output_bytes``.
        sandbox: What confines the snippet (and its environment).
        ask_always: Ask the user before every run (the shell is in allowlist mode); otherwise only
            while the session is tainted.

    Returns:
        The tool; its ``timeout_s`` is ``config.timeout_s`` plus the shell's grace, so the snippet's
        own timeout fires first and reports the output so far.
    """

    async def run_code(ctx: ToolContext, code: _Code) -> str:
        """Run a Python snippet in a fresh folder, in the sandbox."""
        size = len(code.encode("utf-8", errors="surrogatepass"))
        if size > MAX_CODE_BYTES:
            raise ToolError(
                f"the snippet is {size} bytes (at most {MAX_CODE_BYTES}); "
                "write it to a file instead"
            )
        if ask_always or ctx.guard.tainted:
            await _confirm(code, ctx, ask_always=ask_always)
        folder = Path(
            await trio.to_thread.run_sync(lambda: tempfile.mkdtemp(prefix="kesoku-run-code-"))
        )
        try:
            await trio.to_thread.run_sync((folder / "main.py").write_text, code, "utf-8")
            argv = [sys.executable, "-I", "-u", "main.py"]  # -u: output interleaves as written
            writable = (folder, *workspaces(ctx))
            inside = replace(ctx, cwd=folder)
            async with sandbox.launch(argv, inside, writable=writable, shown="run_code") as launch:
                return await run_command(
                    launch.argv,
                    cwd=folder,
                    timeout_s=config.timeout_s,
                    max_output_bytes=ctx.output_cap(config.max_output_bytes),
                    env=launch.env,
                    shown="python main.py",
                )
        finally:
            # Shielded and bounded: a forced stop must not leave the snippet's folder behind.
            with trio.CancelScope(shield=True), trio.move_on_after(TIMEOUT_GRACE_S):
                await trio.to_thread.run_sync(shutil.rmtree, folder, True)

    return tool_from_function(
        run_code, description=DESCRIPTION, timeout_s=config.timeout_s + TIMEOUT_GRACE_S
    )


async def _confirm(code: str, ctx: ToolContext, *, ask_always: bool) -> None:
    lines = code.strip("\n").splitlines()
    shown = "\n".join(lines[:SHOWN_LINES]) + (
        f"\n… ({len(lines) - SHOWN_LINES} more lines)" if len(lines) > SHOWN_LINES else ""
    )
    if ask_always:
        why = "the shell is in allowlist mode, so every run is checked by you"
    else:
        sources = ", ".join(f"{s.kind} {s.label}" for s in ctx.guard.taint_sources()[:3])
        why = f"this session has read untrusted content ({sources})"
    approval = await ctx.confirm(
        f"run_code wants to run this Python snippet ({why}):\n{shown}\nAllow?"
    )
    if not approval.allowed:
        raise ToolError(
            f"not run: run_code needs the user's approval here ({why}), "
            f"and it was not allowed ({approval.note})"
        )
