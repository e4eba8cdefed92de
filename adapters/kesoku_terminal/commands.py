"""Slash commands of the interactive chat. Each says plainly when its feature is not built yet."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from kesoku.daemon import INTERACTIVE_ADAPTER
from kesoku.model import Role, Usage

if TYPE_CHECKING:
    from kesoku_terminal.interactive import ChatUI

SESSIONS_SHOWN = 20
"""``/sessions`` lists the most recent ones."""

Handler = Callable[["ChatUI", str], Awaitable[None]]


async def run_command(chat: ChatUI, line: str) -> None:
    """Run ``/name args``; an unknown name says how to list them."""
    name, _, args = line[1:].partition(" ")
    entry = COMMANDS.get(name.lower())
    if entry is None:
        chat.sink.notice(f"unknown command /{name}: /help lists them; start a line with // to send a '/'", "yellow")
        return
    await entry[0](chat, args.strip())


def new_terminal_session(chat: ChatUI) -> None:
    """Open a new terminal session and talk in it."""
    session = chat.rt.gateway.open_session(INTERACTIVE_ADAPTER, f"tty-{uuid.uuid4().hex}")
    chat.switch(session)


async def _help(chat: ChatUI, args: str) -> None:
    width = max(len(name) for name in COMMANDS)
    for name, (_, text) in COMMANDS.items():
        chat.sink.notice(f"/{name:<{width}}  {text}", "")
    chat.sink.notice(
        "Enter sends (during a turn it interrupts it) · Alt-Enter: newline · Ctrl-C stops a turn, twice kills "
        "its tools · Ctrl-D, or Ctrl-C on an empty line, exits"
    )


async def _stop(chat: ChatUI, args: str) -> None:
    chat.stop_turn()


async def _new(chat: ChatUI, args: str) -> None:
    if chat.busy:
        chat.sink.notice("a turn is running: /stop it first", "yellow")
        return
    old = chat.session.id
    new_terminal_session(chat)
    chat.sink.notice(f"new session {chat.session.id}; the previous one is kept: kesoku chat --session {old}")


async def _clear(chat: ChatUI, args: str) -> None:
    if chat.busy:
        chat.sink.notice("a turn is running: /stop it first", "yellow")
        return
    old = chat.session
    count = len(chat.rt.gateway.store.history(old.id))
    new_terminal_session(chat)
    await chat.rt.gateway.delete_session(old.id)
    chat.serving.discard(old.id)
    chat.sink.notice(f"deleted session {old.id} ({count} messages and its workspace); new session {chat.session.id}")


async def _compact(chat: ChatUI, args: str) -> None:
    chat.sink.notice(
        "compaction is not built yet: every turn sends the whole history; /new starts an empty session", "yellow"
    )


async def _usage(chat: ChatUI, args: str) -> None:
    store = chat.rt.gateway.store
    inputs = outputs = cached = thinking = calls = 0
    for message in store.history(chat.session.id):
        usage: Usage | None = message.metadata.usage
        if usage is not None:
            calls += 1
            inputs += usage.input_tokens
            outputs += usage.output_tokens
            cached += usage.cached_tokens
            thinking += usage.thinking_tokens
    turns = store.count_turns(chat.session.id)
    chat.sink.notice(
        f"session {chat.session.id}: {turns} turns · {calls} model calls reported usage · "
        f"{inputs:,} input tokens ({cached:,} cached) · {outputs:,} output tokens ({thinking:,} thinking)",
        "",
    )
    chat.sink.notice("cost is not tracked yet (there is no price table)")


async def _context(chat: ChatUI, args: str) -> None:
    session = chat.rt.gateway.store.get_session(chat.session.id) or chat.session  # the title is set later
    history = chat.rt.gateway.store.history(session.id)
    llm = chat.rt.llm_for(session)
    last_input = next((m.metadata.usage.input_tokens for m in reversed(history) if m.metadata.usage), 0)
    mine = sum(1 for m in history if m.role is Role.USER)
    tools = ", ".join(t.name for t in chat.rt.current_tools()) or "none"
    for line in (
        f"session {session.id} · {session.title or 'untitled'} · backend {llm.provider}/{llm.model}",
        f"history: {len(history)} messages ({mine} from you) · last model call read {last_input:,} input tokens",
        f"working folder {chat.rt.cwd(session)} · tools: {tools}",
    ):
        chat.sink.notice(line, "")
    sources = chat.rt.gateway.store.taint_sources(session.id)
    if sources:
        chat.sink.notice(f"tainted by {len(sources)} source(s); risky actions ask you first:", "yellow")
        for source in sources:
            chat.sink.notice(f"  {source.kind}: {source.label}", "yellow")
    else:
        chat.sink.notice("not tainted: no content from outside the workspace's trust has been read", "")
    chat.sink.notice("not built yet: compaction (the whole history is sent), the context view")


async def _sessions(chat: ChatUI, args: str) -> None:
    sessions = chat.rt.gateway.store.list_sessions(adapter=INTERACTIVE_ADAPTER)[-SESSIONS_SHOWN:]
    for session in sessions:
        mark = "*" if session.id == chat.session.id else " "
        when = dt.datetime.fromtimestamp(session.created_at).strftime("%Y-%m-%d %H:%M")
        chat.sink.notice(f"{mark} {session.id}  {when}  {session.title or 'untitled'}", "")
    chat.sink.notice("continue one with: kesoku chat --session ID")


async def _exit(chat: ChatUI, args: str) -> None:
    chat.exiting = True


COMMANDS: dict[str, tuple[Handler, str]] = {
    "help": (_help, "this list"),
    "stop": (_stop, "stop the running turn (again: kill its running tools)"),
    "new": (_new, "start a new session (the current one is kept)"),
    "clear": (_clear, "delete this session (messages and workspace) and start a new one"),
    "compact": (_compact, "compact the history (not built yet)"),
    "usage": (_usage, "tokens used in this session"),
    "context": (_context, "what the model works with: backend, history, folder, tools"),
    "sessions": (_sessions, "recent terminal sessions"),
    "exit": (_exit, "leave (Ctrl-D does the same)"),
}
