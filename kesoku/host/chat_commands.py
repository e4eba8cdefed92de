"""What an interactive ``kesoku chat`` asks of the runtime that serves its session.

The chat's own commands (``/help``, ``/new``, ``/exit``...) live in the terminal; the ones here need
the runtime: they run in the chat's process when it runs its own, and in the daemon when it serves
the chat (the control socket's ``Command`` and ``Say`` frames), so the two ways show the same lines.
A command's output is a list of lines (text, style), shown by the terminal as they come back.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from kesoku.host.build import INTERACTIVE_ADAPTER
from kesoku.host.mcp_commands import USAGE as MCP_USAGE
from kesoku.host.mcp_commands import mcp_command
from kesoku.vocab.model import parse_answer, user_text
from kesoku.vocab.text import plural

if TYPE_CHECKING:
    from kesoku.agent.runtime import Runtime
    from kesoku.vocab.model import Session

SESSIONS_SHOWN = 20
"""``/sessions`` lists the most recent ones."""
CLEAR = "clear"
"""The command that says what ``/clear`` would delete (the terminal asks, then switches)."""


class CommandRun:
    """One command's run: what it may use, and what it produced.

    Args:
        rt: The runtime serving the session.
        session: The chat's session.
        busy: A turn of the chat's is running (``/compact`` then waits for it).

    Attributes:
        lines: ``(text, style)`` to show, in order; style is a rich style ("" plain).
        posted: The id of the user message the command posted (``/mcp`` sends a prompt), else 0.
    """

    def __init__(self, rt: Runtime, session: Session, *, busy: bool) -> None:
        self.rt = rt
        self.session = session
        self.busy = busy
        self.lines: list[tuple[str, str]] = []
        self.posted = 0

    def notice(self, text: str, style: str = "dim") -> None:
        """Add a line to show."""
        self.lines.append((text, style))

    async def send(self, text: str) -> None:
        """Post ``text`` as the user's message to the session (its turn starts)."""
        self.posted = (await self.rt.gateway.post(user_text(self.session.id, text))).id


Handler = Callable[[CommandRun, str], Awaitable[None]]


async def run_command(
    rt: Runtime, session: Session, name: str, args: str, *, busy: bool
) -> CommandRun:
    """Run the session command ``name`` (a key of :data:`COMMANDS`) with ``args``.

    An unknown name yields one line saying so (a client of another version may send one).
    """
    run = CommandRun(rt, session, busy=busy)
    entry = COMMANDS.get(name)
    if entry is None:
        run.notice(f"unknown command /{name}: /help lists them", "yellow")
    else:
        await entry[0](run, args)
    return run


async def say(rt: Runtime, session_id: str, text: str, by: str) -> int:
    """A line the user typed: the answer to the session's oldest open question, or a message.

    It answers when a question is open and the line is an answer (``y``, ``n``...:
    :func:`~kesoku.vocab.model.parse_answer`); anything else is posted, and a question still open
    is then denied by the turn the message interrupts.

    Returns:
        The posted message's id; 0 when the line answered a question.
    """
    waiting = rt.questions.open_questions(session_id)
    if waiting and (choice := parse_answer(text.strip())) is not None:
        rt.questions.answer(waiting[0].id, choice, by=by)
        return 0
    return (await rt.gateway.post(user_text(session_id, text))).id


async def _clear(run: CommandRun, args: str) -> None:
    count = len(run.rt.store.history(run.session.id))
    run.notice(f"{plural(count, 'message')} and its workspace", "")


async def _compact(run: CommandRun, args: str) -> None:
    # The worker compacts once no turn runs; the Compacted event shows the outcome in the chat.
    if not run.rt.dispatcher.compact(run.session.id):
        run.notice("this session no longer exists", "yellow")
    elif run.busy:
        run.notice("a turn is running: the history is compacted when it ends")
    else:
        run.notice("compacting the history…")


async def _usage(run: CommandRun, args: str) -> None:
    from kesoku.observe.usage import usage_lines

    store = run.rt.store
    session = store.get_session(run.session.id) or run.session
    lines = usage_lines(run.rt.budget, session, turns=store.count_turns(session.id))
    run.notice(f"session {session.id}: {lines[0]}", "")
    for line in lines[1:]:
        run.notice(line, "")


async def _schedules(run: CommandRun, args: str) -> None:
    from kesoku.vocab.schedule import schedule_lines

    lines = schedule_lines(run.rt.gateway.schedules_of(run.session), now=time.time())
    for line in lines:
        run.notice(line, "")
    if not lines:
        run.notice(
            "No schedules in this conversation. Make one with: kesoku schedule add NAME "
            f'--session {run.session.id} --every 1h --prompt "…" (kesoku start runs them)',
            "",
        )


async def _context(run: CommandRun, args: str) -> None:
    from kesoku.agent.turn import system_prompt  # loaded already: the runtime runs turns
    from kesoku.observe.usage import context_lines, context_parts

    rt = run.rt
    store = rt.store
    session = store.get_session(run.session.id) or run.session  # the title is set later
    history = store.history(session.id)
    llm = rt.llm_for(session)
    tools = rt.current_tools()
    cwd = rt.cwd(session)
    # What the backend really sends of the prompt and tools the next turn would build: the local
    # model sends a short prompt of its own, and no tools unless [local] tools is on.
    kesoku_system = system_prompt(rt, session)
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
    run.notice(
        f"session {session.id} · {session.title or 'untitled'} · "
        f"backend {llm.provider}/{llm.model}",
        "",
    )
    withheld = "none (withheld from this backend)" if tools else "none"
    names = ", ".join(t.name for t in specs) or withheld
    run.notice(f"working folder {cwd} · tools: {names}", "")
    if system != kesoku_system:
        run.notice(f"this backend sends its own system prompt: {system!r}", "")
    run.notice("the next request holds:", "")
    for line in context_lines(parts, last_input_tokens=last_input):
        run.notice(f"  {line}", "")
    sources = store.taint_sources(session.id)
    if sources:
        run.notice(f"tainted by {len(sources)} source(s); risky actions ask you first:", "yellow")
        for source in sources:
            run.notice(f"  {source.kind}: {source.label}", "yellow")
    else:
        run.notice("not tainted: no content from outside the workspace's trust has been read", "")


async def _sessions(run: CommandRun, args: str) -> None:
    sessions = run.rt.store.list_sessions(adapter=INTERACTIVE_ADAPTER)[-SESSIONS_SHOWN:]
    for session in sessions:
        mark = "*" if session.id == run.session.id else " "
        when = dt.datetime.fromtimestamp(session.created_at).strftime("%Y-%m-%d %H:%M")
        run.notice(f"{mark} {session.id}  {when}  {session.title or 'untitled'}", "")
    run.notice("continue one with: kesoku chat --session ID")


COMMANDS: dict[str, tuple[Handler, str]] = {
    "compact": (_compact, "compact the history now (old tool results, then old turns)"),
    "usage": (_usage, "this session's model calls, tokens, cost and spend caps"),
    "schedules": (_schedules, "the schedules this session made or that run in it"),
    "context": (_context, "what the model works with: backend, history, folder, tools"),
    "sessions": (_sessions, "recent terminal sessions"),
    "mcp": (mcp_command, f"MCP servers' prompts; one is sent as your message: {MCP_USAGE}"),
    CLEAR: (_clear, ""),  # not listed: /clear in the terminal asks, then switches
}
"""The session commands: name → (handler, its line in ``/help``)."""
