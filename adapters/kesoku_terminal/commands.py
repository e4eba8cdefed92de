"""Slash commands of the interactive chat. Each says plainly when its feature is not built yet."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from kesoku.host.build import INTERACTIVE_ADAPTER
from kesoku.host.chat_sessions import hold
from kesoku.vocab.text import plural
from kesoku_terminal.mcp_commands import USAGE as MCP_USAGE
from kesoku_terminal.mcp_commands import mcp_command

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
        chat.sink.notice(
            f"unknown command /{name}: /help lists them; start a line with // to send a '/'",
            "yellow",
        )
        return
    await entry[0](chat, args.strip())


def new_terminal_session(chat: ChatUI) -> bool:
    """Open a new terminal session and talk in it.

    Returns:
        True when the previous session was deleted: this chat opened it and nothing was said in it.
    """
    gateway = chat.rt.gateway
    session = hold(gateway, gateway.open_session(INTERACTIVE_ADAPTER, f"tty-{uuid.uuid4().hex}"))
    chat.created[session.id] = session
    previous = chat.session
    chat.switch(session)
    gateway.locks.release(previous.id)  # its worker, if still running, holds it until it ends
    return chat.drop_if_empty(previous)


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
    old = chat.session.id
    if new_terminal_session(chat):
        chat.sink.notice(f"new session {chat.session.id} (the previous one was empty: dropped)")
    else:
        chat.sink.notice(
            f"new session {chat.session.id}; the previous one is kept: kesoku chat --session {old}"
        )


async def _clear(chat: ChatUI, args: str) -> None:
    if chat.busy:
        chat.sink.notice("a turn is running: /stop it first", "yellow")
        return
    old = chat.session
    what = f"{plural(len(chat.rt.store.history(old.id)), 'message')} and its workspace"

    async def clear() -> None:
        new_terminal_session(chat)
        await chat.rt.gateway.delete_session(old.id)
        chat.serving.discard(old.id)
        chat.sink.notice(f"deleted session {old.id} ({what}); new session {chat.session.id}")

    chat.confirm(
        f"delete session {old.id} ({what} {old.workspace})? It cannot be undone",
        clear,
        f"nothing deleted; still in session {old.id}",
    )


async def _compact(chat: ChatUI, args: str) -> None:
    # The worker compacts once no turn runs; the Compacted event shows the outcome in the chat.
    if not chat.rt.dispatcher.compact(chat.session.id):
        chat.sink.notice("this session no longer exists", "yellow")
    elif chat.busy:
        chat.sink.notice("a turn is running: the history is compacted when it ends")
    else:
        chat.sink.notice("compacting the history…")


async def _usage(chat: ChatUI, args: str) -> None:
    from kesoku.observe.usage import usage_lines

    store = chat.rt.store
    session = store.get_session(chat.session.id) or chat.session
    lines = usage_lines(chat.rt.budget, session, turns=store.count_turns(session.id))
    chat.sink.notice(f"session {session.id}: {lines[0]}", "")
    for line in lines[1:]:
        chat.sink.notice(line, "")


async def _schedules(chat: ChatUI, args: str) -> None:
    import time

    from kesoku.vocab.schedule import schedule_lines

    lines = schedule_lines(chat.rt.gateway.schedules_of(chat.session), now=time.time())
    for line in lines:
        chat.sink.notice(line, "")
    if not lines:
        chat.sink.notice(
            "No schedules in this conversation. Make one with: kesoku schedule add NAME "
            f'--session {chat.session.id} --every 1h --prompt "…" (kesoku start runs them)',
            "",
        )


async def _context(chat: ChatUI, args: str) -> None:
    from kesoku.agent.turn import system_prompt  # loaded already: the runtime runs turns
    from kesoku.observe.usage import context_lines, context_parts

    store = chat.rt.store
    session = store.get_session(chat.session.id) or chat.session  # the title is set later
    history = store.history(session.id)
    llm = chat.rt.llm_for(session)
    tools = chat.rt.current_tools()
    cwd = chat.rt.cwd(session)
    # What the backend really sends of the prompt and tools the next turn would build: the local
    # model sends a short prompt of its own, and no tools unless [local] tools is on.
    kesoku_system = system_prompt(chat.rt, session)
    system, specs = llm.sent_head(kesoku_system, [t.spec for t in tools])
    parts = context_parts(
        system=system,
        tools=specs,
        history=history,
        view_state=store.latest_view_state(session.id),
    )
    last_input = next(
        (m.metadata.usage.input_tokens for m in reversed(history) if m.metadata.usage), 0
    )
    chat.sink.notice(
        f"session {session.id} · {session.title or 'untitled'} · "
        f"backend {llm.provider}/{llm.model}",
        "",
    )
    withheld = "none (withheld from this backend)" if tools else "none"
    names = ", ".join(t.name for t in specs) or withheld
    chat.sink.notice(f"working folder {cwd} · tools: {names}", "")
    if system != kesoku_system:
        chat.sink.notice(f"this backend sends its own system prompt: {system!r}", "")
    chat.sink.notice("the next request holds:", "")
    for line in context_lines(parts, last_input_tokens=last_input):
        chat.sink.notice(f"  {line}", "")
    sources = store.taint_sources(session.id)
    if sources:
        chat.sink.notice(
            f"tainted by {len(sources)} source(s); risky actions ask you first:", "yellow"
        )
        for source in sources:
            chat.sink.notice(f"  {source.kind}: {source.label}", "yellow")
    else:
        chat.sink.notice(
            "not tainted: no content from outside the workspace's trust has been read", ""
        )


async def _sessions(chat: ChatUI, args: str) -> None:
    sessions = chat.rt.store.list_sessions(adapter=INTERACTIVE_ADAPTER)[-SESSIONS_SHOWN:]
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
    "new": (_new, "start a new session (the current one is kept, unless nothing was said in it)"),
    "clear": (_clear, "delete this session (messages and workspace; asks first), start a new one"),
    "compact": (_compact, "compact the history now (old tool results, then old turns)"),
    "usage": (_usage, "this session's model calls, tokens, cost and spend caps"),
    "schedules": (_schedules, "the schedules this session made or that run in it"),
    "context": (_context, "what the model works with: backend, history, folder, tools"),
    "sessions": (_sessions, "recent terminal sessions"),
    "mcp": (mcp_command, f"MCP servers' prompts; one is sent as your message: {MCP_USAGE}"),
    "exit": (_exit, "leave (Ctrl-D does the same)"),
}
