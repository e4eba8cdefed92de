"""``/mcp``: the prompts of MCP servers as chat commands.

``/mcp`` lists the servers and their prompts; ``/mcp SERVER`` one server's prompts and their
arguments; ``/mcp SERVER PROMPT [ARGS]`` renders the prompt on the server and sends its text as the
user's message. Arguments are ``name=value`` pairs, or bare values filling the prompt's arguments in
order; quote a value with spaces (shell-style: ``/mcp files review code="x = 1"``).

The rendered prompt comes from the server, outside the workspace's trust: it taints the session
(``mcp: SERVER``) before it is posted, like an MCP tool result.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kesoku.vocab.model import TaintSource
from kesoku.vocab.text import plural

if TYPE_CHECKING:
    from kesoku.agent.runtime import Runtime
    from kesoku.host.chat_commands import CommandRun
    from kesoku.mcp.manager import McpManager, ServerStatus

USAGE = "/mcp [SERVER [PROMPT [NAME=VALUE | VALUE ...]]]"
"""The command's synopsis."""


def find_manager(rt: Runtime) -> McpManager | None:
    """The runtime's MCP tool source (None when no server is enabled)."""
    from kesoku.mcp.manager import McpManager

    return next((s for s in rt.tool_sources if isinstance(s, McpManager)), None)


def bind_arguments(spec: Sequence[tuple[str, bool]], words: Sequence[str]) -> dict[str, str]:
    """Match ``name=value`` and positional words to a prompt's arguments.

    Args:
        spec: ``(name, required)`` of the prompt's arguments, in order.
        words: What followed the prompt's name.

    Returns:
        ``{name: value}``.

    Raises:
        ValueError: An unknown name, a value given twice, too many values, or a required one
            missing.
    """
    names = [name for name, _ in spec]
    out: dict[str, str] = {}
    positional: list[str] = []
    for word in words:
        name, eq, value = word.partition("=")
        if eq and name in names:
            if name in out:
                raise ValueError(f"{name} is given twice")
            out[name] = value
        elif eq and name.isidentifier():
            raise ValueError(f"unknown argument {name!r} (arguments: {', '.join(names) or 'none'})")
        else:
            positional.append(word)
    free = [name for name in names if name not in out]
    if len(positional) > len(free):
        raise ValueError(f"too many values: the prompt takes {', '.join(names) or 'no arguments'}")
    out.update(zip(free, positional, strict=False))
    missing = [name for name, required in spec if required and name not in out]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")
    return out


def _signature(status: ServerStatus, prompt: str, spec: Sequence[tuple[str, bool]]) -> str:
    args = " ".join(name if required else f"[{name}]" for name, required in spec)
    quoted = shlex.quote(status.name)
    return f"/mcp {quoted} {prompt} {args}".rstrip()


def _list(run: CommandRun, statuses: Sequence[ServerStatus]) -> None:
    for status in statuses:
        detail = (
            plural(len(status.tools), "tool")
            if status.state == "connected"
            else (status.error or "")
        )
        run.notice(f"{status.name} ({status.state}){': ' + detail if detail else ''}", "")
        for name, text, spec in status.prompts:
            run.notice(f"  {_signature(status, name, spec)}{'  ' + text if text else ''}", "")
    run.notice(f"usage: {USAGE}")


def _taint(run: CommandRun, server: str) -> None:
    """Record ``mcp: server`` on the session.

    Through its worker's guard when it has one (it caches).
    """
    worker = run.rt.dispatcher.workers.get(run.session.id)
    if worker is not None:
        worker.guard.add_taint("mcp", server)
        worker.guard.flush()
    else:
        run.rt.store.add_taint(run.session.id, [TaintSource("mcp", server)])


async def mcp_command(run: CommandRun, args: str) -> None:
    """``/mcp``: list servers and prompts, or send a server's prompt as the user's message."""
    manager = find_manager(run.rt)
    if manager is None:
        run.notice("no MCP server is enabled: add a [[mcp.servers]] table to kesoku.toml", "yellow")
        return
    try:
        words = shlex.split(args)
    except ValueError as exc:
        run.notice(f"/mcp: {exc}; usage: {USAGE}", "yellow")
        return
    statuses = manager.statuses()
    if not words:
        _list(run, statuses)
        return
    status = next((s for s in statuses if s.name == words[0]), None)
    if status is None:
        known = ", ".join(s.name for s in statuses)
        run.notice(f"/mcp: no server named {words[0]!r} (servers: {known})", "yellow")
        return
    if len(words) == 1:
        _list(run, [status])
        return
    spec = next((s for name, _, s in status.prompts if name == words[1]), None)
    if spec is None:
        known = ", ".join(name for name, _, _ in status.prompts) or "none"
        run.notice(f"/mcp: {status.name} has no prompt {words[1]!r} (prompts: {known})", "yellow")
        return
    try:
        arguments = bind_arguments(spec, words[2:])
    except ValueError as exc:
        run.notice(f"/mcp: {exc}; usage: {_signature(status, words[1], spec)}", "yellow")
        return
    try:
        text = await manager.get_prompt(status.name, words[1], arguments)
    except TimeoutError:
        run.notice(f"/mcp: {status.name} did not render {words[1]} in time", "yellow")
        return
    except LookupError as exc:
        run.notice(f"/mcp: {exc}", "yellow")
        return
    _taint(run, status.name)
    run.notice(
        f"sending {status.name}'s prompt {words[1]} ({len(text):,} characters) as your message"
    )
    await run.send(text)
