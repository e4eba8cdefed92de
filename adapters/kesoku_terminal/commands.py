"""Slash commands of the interactive chat.

The chat's own (``/help``, ``/stop``, ``/new``, ``/clear``, ``/exit``) run here; the others need the
runtime serving the session and run there (:mod:`kesoku.host.chat_commands`: in this process, or
in the daemon), their lines shown as they come back.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from kesoku.host.chat_commands import CLEAR
from kesoku.host.chat_commands import COMMANDS as SESSION_COMMANDS

if TYPE_CHECKING:
    from kesoku_terminal.interactive import ChatUI

Handler = Callable[["ChatUI", str], Awaitable[None]]


async def run_command(chat: ChatUI, line: str) -> None:
    """Run ``/name args``; an unknown name says how to list them."""
    name, _, args = line[1:].partition(" ")
    name = name.lower()
    entry = COMMANDS.get(name)
    if entry is None:
        chat.sink.notice(
            f"unknown command /{name}: /help lists them; start a line with // to send a '/'",
            "yellow",
        )
        return
    await entry[0](chat, args.strip())


def _session_command(name: str) -> Handler:
    """The handler of a session command: run where the session runs, its lines shown here."""

    async def handler(chat: ChatUI, args: str) -> None:
        lines, posted = await chat.link.command(name, args, busy=chat.busy)
        for text, style in lines:
            chat.sink.notice(text, style)
        if posted:
            chat.posted(posted)

    return handler


async def _help(chat: ChatUI, args: str) -> None:
    width = max(len(name) for name in COMMANDS)
    for name, (_, text) in COMMANDS.items():
        chat.sink.notice(f"/{name:<{width}}  {text}", "")
    chat.sink.notice(
        "Enter sends (during a turn it interrupts it) · Alt-Enter: newline · "
        "Ctrl-C stops a turn, twice kills its tools · Ctrl-D, or Ctrl-C on an empty line, exits"
    )


async def _stop(chat: ChatUI, args: str) -> None:
    chat.stop_turn()


async def _new(chat: ChatUI, args: str) -> None:
    if chat.busy:
        chat.sink.notice("a turn is running: /stop it first", "yellow")
        return
    old = chat.link.session_id
    dropped = await chat.switch(delete=False)
    new = chat.link.session_id
    if dropped:
        chat.sink.notice(f"new session {new} (the previous one was empty: dropped)")
    else:
        kept = f"the previous one is kept: kesoku chat --session {old}"
        chat.sink.notice(f"new session {new}; {kept}")


async def _clear(chat: ChatUI, args: str) -> None:
    if chat.busy:
        chat.sink.notice("a turn is running: /stop it first", "yellow")
        return
    old, workspace = chat.link.session_id, chat.link.workspace
    lines, _ = await chat.link.command(CLEAR, "", busy=False)
    what = lines[0][0]  # "N messages and its workspace"

    async def clear() -> None:
        await chat.switch(delete=True)
        chat.sink.notice(f"deleted session {old} ({what}); new session {chat.link.session_id}")

    chat.confirm(
        f"delete session {old} ({what} {workspace})? It cannot be undone",
        clear,
        f"nothing deleted; still in session {old}",
    )


async def _exit(chat: ChatUI, args: str) -> None:
    chat.exiting = True


COMMANDS: dict[str, tuple[Handler, str]] = {
    "help": (_help, "this list"),
    "stop": (_stop, "stop the running turn (again: kill its running tools)"),
    "new": (_new, "start a new session (the current one is kept, unless nothing was said in it)"),
    "clear": (_clear, "delete this session (messages and workspace; asks first), start a new one"),
    **{
        name: (_session_command(name), text)
        for name, (_, text) in SESSION_COMMANDS.items()
        if name != CLEAR
    },
    "exit": (_exit, "leave (Ctrl-D does the same)"),
}
