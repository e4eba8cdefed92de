"""Run one tool call and type its outcome.

The one place a tool's failures become results the model reads. Used by the turn loop
(kesoku.agent.turn) and by subagents (kesoku.agent.subagent), so both report a timeout, a refusal
or a bug in a tool the same way.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping

import trio

from kesoku.tools.base import Tool, ToolContext
from kesoku.tools.output import cap_output
from kesoku.vocab.errors import ToolError
from kesoku.vocab.model import Outcome
from kesoku.vocab.text import valid_text

log = logging.getLogger("kesoku.agent.turn")

WRAPPER_BYTES = 512
"""What a tool may add around output it capped itself.

For the shell: its ``$ command`` and exit code line.
"""


async def run_tool(
    tool: Tool | None,
    name: str,
    arguments: Mapping[str, object],
    ctx: ToolContext,
    *,
    known: Iterable[str],
) -> tuple[str, Outcome]:
    """Run a tool call within its ``timeout_s`` and return ``(result text, outcome)``.

    Args:
        tool: The tool, or None when the model named a tool that does not exist.
        name: The name the model used.
        arguments: The call's arguments.
        ctx: The call's context; its ``deadline`` is set here to the timeout's scope.
        known: The names of the tools that exist (for the error about an unknown one).

    Returns:
        ``completed`` with the tool's text (capped at ``ctx.max_output_bytes``); ``timed_out`` after
        ``timeout_s``; ``failed`` for a :class:`~kesoku.vocab.errors.ToolError` (its message) or any
        other exception (a bug, logged with its traceback). The text is valid UTF-8
        (:func:`kesoku.vocab.text.valid_text`): a file name the OS decoded with ``surrogateescape``,
        an MCP server's JSON or an exception's message may hold a lone surrogate, and a subagent's
        result goes to the model without passing the store.

    Raises:
        trio.Cancelled: The call was cancelled from outside (a forced stop, a bound); a tool with a
            nursery inside raises a group holding only Cancelled. The caller types the outcome.
    """
    content, outcome = await _run(tool, name, arguments, ctx, known)
    return valid_text(content), outcome


async def _run(
    tool: Tool | None,
    name: str,
    arguments: Mapping[str, object],
    ctx: ToolContext,
    known: Iterable[str],
) -> tuple[str, Outcome]:
    try:
        if tool is None:
            raise ToolError(
                f"there is no tool named {name!r} (tools: {', '.join(sorted(known)) or 'none'})"
            )
        with trio.move_on_after(tool.timeout_s) as deadline:
            content = await tool.run(arguments, dataclasses.replace(ctx, deadline=deadline))
        if deadline.cancelled_caught:
            return (
                f"[timed_out] {name} ran longer than {tool.timeout_s:g} s and was cancelled.",
                Outcome.TIMED_OUT,
            )
        if ctx.max_output_bytes is not None:
            # The built-in tools cap their output with ctx.output_cap (the shell adds its command
            # line and exit code around it, hence the slack); this bounds any other tool (MCP,
            # skills).
            content = cap_output(content, ctx.max_output_bytes + WRAPPER_BYTES)
        return content, Outcome.COMPLETED
    except ToolError as exc:
        return f"[failed] {exc}", Outcome.FAILED
    except BaseExceptionGroup as group:
        cancelled, rest = group.split(trio.Cancelled)
        if rest is None or cancelled is not None or not isinstance(rest, ExceptionGroup):
            raise
        log.error("tool %s failed in session %s", name, ctx.session.id, exc_info=group)
        return f"[failed] internal error in {name}: {group!r}", Outcome.FAILED
    except Exception as exc:
        log.exception("tool %s failed in session %s", name, ctx.session.id)
        return f"[failed] internal error in {name}: {type(exc).__name__}: {exc}", Outcome.FAILED
