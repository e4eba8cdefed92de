"""The shell tool: one command line, checked by the policy, run in the OS sandbox.

A line runs as ``/bin/sh -c LINE`` (``shell.use_shell = true``) or as the argv ``shlex.split``
makes of it, with no shell (``false``). :mod:`kesoku.tools.policy.check` checks it first either way
(the operator's intent: which programs), and a refusal is a :class:`~kesoku.vocab.errors.ToolError`
whose message is the policy's reason. The sandbox (:mod:`kesoku.tools.sandbox`) then decides what
the command can touch: it may write only the working directory and the session workspace, sees no
secrets, and has no network unless ``[sandbox] network = true``.
:func:`~kesoku.tools.process.run_command` runs it, kills its whole process group when it ends, times
out or is stopped, and keeps the head and tail of its output.

Taint: a URL in a line marks the session tainted (what the command fetches is untrusted). In a
tainted session, under ``mode = "blocklist"``, a line the allowlist would refuse runs only if the
user allows it.
"""

from __future__ import annotations

import re
import shlex
from typing import TYPE_CHECKING, Annotated

import msgspec
import trio

from kesoku.tools.base import Tool, ToolContext
from kesoku.tools.paths import workspaces
from kesoku.tools.process import SHOWN_MAX_CHARS, run_command
from kesoku.tools.schema import Check, tool_from_function
from kesoku.vocab.errors import ToolError

if TYPE_CHECKING:
    from kesoku.config.settings import ShellConfig
    from kesoku.tools.policy.check import PolicyDecision
    from kesoku.tools.sandbox import Sandbox

SHELL = "/bin/sh"
"""The shell of ``use_shell``; the policy parses bash's grammar, a superset of what sh accepts."""
TIMEOUT_GRACE_S = 10.0
"""The runtime's bound on the call exceeds ``shell.timeout_s`` by this much, so the tool's own
timeout fires first and reports the output so far."""

_URL = re.compile(r"\b(?:https?|ftp)://[^\s'\"<>|;&)]+")
_Command = Annotated[
    str, Check("`command` must be a non-empty string: the command line to run", str.strip)
]
_Seconds = Annotated[
    float,
    Check("`timeout_s` must be a positive number of seconds, got {value!r}", lambda s: s > 0),
]

DESCRIPTION = (
    "Run a command line in the working directory.\n"
    "No terminal or stdin; stdout and stderr come interleaved; background processes are stopped "
    "when it ends."
)
SANDBOXED = (
    " Sandboxed: only the working directory and a private /tmp are writable, secrets are hidden, "
    "{network}."
)


def description(sandboxed: bool, network: bool) -> str:
    """The shell tool's description, saying what the sandbox allows when there is one."""
    if not sandboxed:
        return DESCRIPTION
    network_text = "network allowed" if network else "no network"
    return DESCRIPTION + SANDBOXED.format(network=network_text)


def shell_tool(config: ShellConfig, sandbox: Sandbox) -> Tool:
    """The ``shell`` tool.

    Args:
        config: ``[shell]``: ``use_shell``, the policy (``mode`` and its patterns),
            ``timeout_s`` and ``max_output_bytes``.
        sandbox: What confines the command (and its environment).

    Returns:
        The tool; its ``timeout_s`` is ``config.timeout_s`` plus :data:`TIMEOUT_GRACE_S`.
    """

    # The Args texts go to the model with every call: only those that add to the name and type.
    async def shell(  # noqa: D417
        ctx: ToolContext, command: _Command, timeout_s: _Seconds = config.timeout_s
    ) -> str:
        """Run a command line: checked by the policy, confined by the sandbox.

        Args:
            timeout_s: At most {limit}.
        """
        if config.use_shell:
            argv = [SHELL, "-c", command]
        else:
            try:
                argv = shlex.split(command)
            except ValueError as exc:
                raise ToolError(f"the command cannot be split into words: {exc}") from None
        decision = await trio.to_thread.run_sync(_check, command, argv, config)
        if not decision.allowed:
            raise ToolError(decision.reason)
        if ctx.guard.tainted and config.mode == "blocklist":
            await _confirm_outside_allowlist(command, argv, config, ctx)
        for url in _URL.findall(command):
            ctx.guard.add_taint("url", url)  # what the command fetches is outside the trust
        async with sandbox.launch(argv, ctx, writable=workspaces(ctx), shown=command) as launch:
            return await run_command(
                launch.argv,
                cwd=ctx.cwd,
                timeout_s=min(timeout_s, config.timeout_s),
                max_output_bytes=ctx.output_cap(config.max_output_bytes),
                env=launch.env,
                shown=command,
            )

    return tool_from_function(
        shell,
        description=description(sandbox.config.mode != "off", sandbox.config.network),
        doc_values={"limit": f"{config.timeout_s:g}"},
        timeout_s=config.timeout_s + TIMEOUT_GRACE_S,
    )


async def _confirm_outside_allowlist(
    line: str, argv: list[str], config: ShellConfig, ctx: ToolContext
) -> None:
    """In a tainted session, a line the allowlist would refuse runs only if the user allows it."""
    strict = msgspec.structs.replace(config, mode="allowlist")
    decision = await trio.to_thread.run_sync(_check, line, argv, strict)
    if decision.allowed:
        return
    sources = ", ".join(f"{s.kind} {s.label}" for s in ctx.guard.taint_sources()[:3])
    shown = line if len(line) <= SHOWN_MAX_CHARS else line[: SHOWN_MAX_CHARS - 1] + "…"
    approval = await ctx.confirm(
        f"shell wants to run `{shown}`. It is outside the allowlist ({decision.reason}) and this "
        f"session has read untrusted content ({sources}). Allow?"
    )
    if not approval.allowed:
        raise ToolError(
            f"not run: this session holds untrusted content ({sources}), so a command outside the "
            f"allowlist needs the user's approval, and it was not allowed ({approval.note})"
        )


def _check(line: str, argv: list[str], config: ShellConfig) -> PolicyDecision:
    """The policy's decision (parsing a long line takes a while: run it in a thread)."""
    # Imported here, in the worker thread: bashlex's parser import stays off `kesoku chat`'s
    # start-up and off the event loop.
    from kesoku.tools.policy.check import check_argv, check_command

    if config.use_shell:
        return check_command(line, config)
    return check_argv(argv, config)


__all__ = ["DESCRIPTION", "SHELL", "TIMEOUT_GRACE_S", "description", "shell_tool"]
