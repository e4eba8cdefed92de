"""``kesoku chat`` without a prompt: a conversation in the terminal.

The session runs in the daemon serving the database when one does, else in this process: the chat
talks to either through a :class:`~kesoku_terminal.links.ChatLink`, and shows the same either way.
The trio thread serves the link, follows the session (:class:`~kesoku_terminal.view.Follower`) and
prints through :class:`~kesoku_terminal.prompt.AboveOutput`, so output appears above the input line;
the input runs in a worker thread (:mod:`kesoku_terminal.prompt`). Keys:

- Enter sends the line. During a turn that interrupts it (the runtime pivots to the new message).
- Ctrl-C during a turn stops it (``gateway.stop``); a second Ctrl-C in the same turn kills running
  tools. Ctrl-C on an empty prompt, or Ctrl-D, exits (a running turn is stopped first); so does a
  Ctrl-C before the prompt is up (exit 130).
- Alt-Enter inserts a newline; a pasted block is one message.
- Slash commands: :mod:`kesoku_terminal.commands` (``/help``). One that asks first (``/clear``)
  takes the next line as its answer: ``y`` goes ahead, anything else (Ctrl-C too) does nothing.

A session this chat opened and left without a message in it (Ctrl-D at once, ``/new``) is deleted,
so it leaves no empty "untitled" session behind. The daemon going away ends the chat (exit 1).
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import IO, TYPE_CHECKING, cast

import trio
from rich.console import Console
from rich.text import Text

from kesoku.host import interrupt
from kesoku.vocab.events import TurnEnded, TurnStarted
from kesoku.vocab.model import ALLOW, parse_answer
from kesoku_terminal.commands import run_command
from kesoku_terminal.links import ChatGone, ChatLink, DaemonLink, LocalLink, connect
from kesoku_terminal.plain import EXIT_FAILED, EXIT_STOPPED
from kesoku_terminal.prompt import (
    THOUGHT_STYLE,
    AboveOutput,
    Eof,
    InputEvent,
    Line,
    LiveState,
    PromptThread,
    history_file,
)
from kesoku_terminal.render import THOUGHT_ICON, tool_call_line, tool_result_line
from kesoku_terminal.view import Follower

if TYPE_CHECKING:
    from kesoku.agent.runtime import Runtime
    from kesoku.config.settings import Config
    from kesoku.vocab.events import TurnEvent
    from kesoku.vocab.metrics import TurnMetrics
    from kesoku.vocab.model import Message, Session

INPUT_BUFFER = 16
"""Lines typed ahead while the trio side is busy (the prompt thread waits beyond it)."""
EXIT_STOP_WAIT_S = 10.0
"""At exit, how long a stopped turn may take to end (a running tool finishing) before tools are
killed."""
EXIT_KILL_WAIT_S = 5.0
"""After killing tools at exit, how long their results may take to be written."""
PROMPT_CLOSE_WAIT_S = 2.0
"""How long the input thread gets to restore the terminal at exit."""
PROMPT_CLOSE_POLL_S = 0.05


class LiveSink:
    """Shows a turn: finished lines scroll up above the prompt.

    The unfinished one stays in the live area.

    Args:
        console: A rich console writing above the prompt.
        live: The live area's state.
        redraw: Asks the prompt to redraw (thread-safe).
    """

    def __init__(self, console: Console, live: LiveState, redraw: Callable[[], None]) -> None:
        self.console = console
        self.live = live
        self.redraw = redraw
        self._open: str | None = None  # "answer" or "thought"
        self._running: dict[int, str] = {}  # tool call id → tool name

    # -- streamed text ----------------------------------------------------------------------------

    def answer(self, chunk: str) -> None:
        """Stream a piece of the answer."""
        self._stream("answer", chunk, "", "")

    def answer_end(self) -> None:
        """End the answer line."""
        self._end("answer")

    def thought(self, chunk: str) -> None:
        """Stream a piece of reasoning."""
        self._stream("thought", chunk, "dim italic", THOUGHT_STYLE)

    def thought_end(self) -> None:
        """End the reasoning line."""
        self._end("thought")

    def _stream(self, kind: str, chunk: str, rich_style: str, live_style: str) -> None:
        if self._open != kind:
            self._end_open()
            self._open = kind
            self.live.partial_style = live_style
            if kind == "thought":
                chunk = f"{THOUGHT_ICON} {chunk}"
            else:
                self.live.status = None  # the streaming text shows progress now
        text = self.live.partial + chunk
        if "\n" in text:
            done, text = text.rsplit("\n", 1)
            self.print(done, rich_style)
        self.live.partial = text
        self.redraw()

    def _end(self, kind: str) -> None:
        if self._open == kind:
            self._end_open()

    def _end_open(self) -> None:
        if self._open is None:
            return
        style = "dim italic" if self._open == "thought" else ""
        partial, self.live.partial = self.live.partial, ""
        self._open = None
        if partial:
            self.print(partial, style)
        self.redraw()

    # -- activity ---------------------------------------------------------------------------------

    def tool_call(self, call: Message) -> None:
        """Show a posted tool call."""
        self.notice(tool_call_line(call))

    def tool_started(self, call: Message) -> None:
        """A tool started running."""
        self._running[call.id] = call.metadata.tool_name or "tool"
        self.set_status("running " + ", ".join(sorted(set(self._running.values()))))

    def tool_result(self, result: Message) -> None:
        """Show a tool result with its outcome."""
        self._running.pop(result.parent_id or 0, None)
        self.notice(tool_result_line(result))
        names = sorted(set(self._running.values()))
        self.set_status("running " + ", ".join(names) if names else "thinking")

    def system(self, text: str) -> None:
        """Show a system notice."""
        self.notice(text, "yellow")

    def question(self, question: Message) -> None:
        """Show a question and how to answer it."""
        self.notice(question.content, "bold yellow")
        self.notice(
            "answer y (Allow) or n (Deny); any other message denies it and is sent as usual",
            "yellow",
        )
        self.set_status("waiting for your answer")

    def turn_started(self, root: Message) -> None:
        """A turn opened."""
        self._running.clear()
        self.set_status("thinking")

    def turn_ended(self, metrics: TurnMetrics) -> None:
        """Show the metrics line."""
        self._end_open()
        self._running.clear()
        self.notice(metrics.render())
        self.set_status("thinking")  # the chat clears it when no message of ours is left waiting

    # -- output -----------------------------------------------------------------------------------

    def notice(self, text: str, style: str = "dim") -> None:
        """Print a whole line of activity (ending any streamed line first)."""
        self._end_open()
        self.print(text, style)

    def print(self, text: str, style: str = "") -> None:
        """Print text above the prompt (no markup, no wrapping by rich: the terminal wraps)."""
        self.console.print(Text(text, style=style), soft_wrap=True)

    def set_status(self, status: str | None) -> None:
        """Show what the agent is doing under the output (None: nothing), timed from now."""
        if status != self.live.status:
            self.live.status_since = time.monotonic()
            self.live.status = status
        self.redraw()


class ChatUI:
    """An interactive conversation over a link to what runs the session.

    Args:
        link: The chat's own runtime, or the daemon (not yet serving: :meth:`run` serves it).
        resumed: The session existed before (``--session``).
    """

    def __init__(self, link: ChatLink, *, resumed: bool) -> None:
        self.link = link
        self.resumed = resumed
        self.live = LiveState()
        self.prompt = PromptThread(self.live, history_file())
        self.output = AboveOutput(self.prompt, sys.stdout)
        self.console = Console(
            file=as_text_stream(self.output),
            force_terminal=True,
            highlight=False,
            markup=False,
            emoji=False,
        )
        self.sink = LiveSink(self.console, self.live, self.prompt.invalidate)
        self.follower = Follower(
            link.hub, link.log, link.session_id, self.sink, on_event=self._on_event
        )
        self.exiting = False
        self.gone = False
        """The daemon serving the chat went away (exit 1)."""
        self._last_posted = 0
        self._stops = 0
        self._idle = trio.Event()
        self._idle.set()
        self._confirm: tuple[Callable[[], Awaitable[None]], str] | None = None
        self.terminated: int | None = None
        """The signal that ended the chat, if one did: SIGTERM, SIGHUP, or SIGINT outside a
        turn."""

    @property
    def busy(self) -> bool:
        """A message of ours waits for its turn to end."""
        return self.follower.ended_root_id < self._last_posted

    async def run(self) -> int:
        """Converse until Ctrl-D, Ctrl-C on an empty prompt, or ``/exit``.

        Returns:
            0; 128 + the signal number after SIGTERM or SIGHUP (a closed terminal), which stop the
            running turn and kill its tools first, so none outlives the chat, or after a SIGINT
            outside a turn (Ctrl-C before the prompt is up); 1 when the daemon serving the chat
            went away.
        """
        # log lines must not tear the prompt either
        handler = logging.StreamHandler(as_text_stream(self.output))
        handler.setFormatter(logging.Formatter("kesoku: %(message)s"))
        root = logging.getLogger()
        saved = root.handlers[:]
        root.handlers[:] = [handler]
        try:
            send, receive = trio.open_memory_channel[InputEvent](INPUT_BUFFER)
            async with trio.open_nursery() as nursery:
                await nursery.start(self._watch_signals)  # first: Ctrl-C is ours from here on
                if isinstance(self.link, DaemonLink):
                    self.link.on_gone = self._gone
                await nursery.start(self.link.serve, self.follower)
                nursery.start_soon(trio.to_thread.run_sync, self.prompt.run, send)
                if not self.exiting:  # a Ctrl-C while the runtime started
                    self._banner()
                async with receive:
                    async for event in receive:
                        if isinstance(event, Line):
                            try:
                                await self.on_line(event.text)
                            except ChatGone as exc:
                                await self._gone(str(exc))
                        elif isinstance(event, Eof):
                            self.exiting = True
                        elif self._confirm is not None:  # Ctrl-C answers "no"
                            await self._answer_confirm("")
                        elif not self.busy:
                            self.exiting = True
                        else:
                            self.stop_turn()
                        if self.exiting:
                            break
                await self._leave()
                nursery.cancel_scope.cancel()
        finally:
            root.handlers[:] = saved
            self.output.close()
            await self.link.close()  # the runtime has stopped
        if self.gone:
            return EXIT_FAILED
        return 0 if self.terminated is None else 128 + self.terminated

    async def on_line(self, text: str) -> None:
        """A line entered: an answer to an open question, a slash command, or a message.

        A message interrupts the running turn.
        """
        stripped = text.strip()
        if self._confirm is not None:
            await self._answer_confirm(stripped)
            return
        if not stripped:
            return
        if stripped.startswith("//"):
            text = text.replace("/", "", 1)  # `//etc/hosts ...` sends "/etc/hosts ..."
        elif stripped.startswith("/"):
            await run_command(self, stripped)
            return
        self.posted(await self.link.say(text))  # y or n answer an open question

    def posted(self, message_id: int) -> None:
        """A line was sent: message ``message_id`` was posted (0: it answered a question)."""
        if message_id:
            self._last_posted = message_id
            self._update_busy()
            if self.live.status is not None:
                # The daemon relays the turn's events while its answer to the post is on the way:
                # what they show ("running shell") is newer than "thinking".
                return
        self.sink.set_status("thinking")

    def confirm(self, question: str, action: Callable[[], Awaitable[None]], declined: str) -> None:
        """Ask a yes-or-no question; the next line entered answers it.

        Args:
            question: What is asked (`` [y/N]`` is added).
            action: Run on ``y`` or ``yes``.
            declined: Shown on any other answer (an empty line, Ctrl-C): nothing is done.
        """
        self._confirm = (action, declined)
        self.sink.notice(f"{question} [y/N]", "bold yellow")

    async def _answer_confirm(self, answer: str) -> None:
        assert self._confirm is not None
        (action, declined), self._confirm = self._confirm, None
        if parse_answer(answer) == ALLOW:  # y, yes
            await action()
        else:
            self.sink.notice(declined)

    def stop_turn(self) -> None:
        """Stop the running turn; called again in the same turn, kill its running tools."""
        if not self.busy:
            self.sink.notice("no turn is running")
            return
        self._stops += 1
        self.link.stop(self._stops > 1)
        hint = (
            "stopping the turn (Ctrl-C again kills running tools)"
            if self._stops == 1
            else "killing running tools"
        )
        self.sink.notice(hint, "yellow")

    async def switch(self, *, delete: bool) -> bool:
        """Talk in a new session from now on (``/new``; ``/clear`` deletes the one left).

        Returns:
            True when the session left was deleted (``delete``, or nothing was said in it).

        Raises:
            ChatGone: The daemon went away.
            OperatorError: The new session's lock or folder cannot be made.
        """
        dropped = await self.link.switch(delete=delete)
        self._last_posted = 0
        self._update_busy()
        return dropped

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no turn of ours runs; False on timeout."""
        with trio.move_on_after(timeout_s):
            await self._idle.wait()
        return not self.busy

    # -- tasks ------------------------------------------------------------------------------------

    def _on_event(self, event: TurnEvent) -> None:
        """After the follower showed an event of the current session."""
        if isinstance(event, TurnStarted) and self._stops:
            # A stop asked before the turn opened applies to it.
            self.link.stop(self._stops > 1)
        elif isinstance(event, TurnEnded):
            self._update_busy()

    async def _watch_signals(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        # The prompt turns Ctrl-C into a key; SIGINT arrives before the prompt is up, in the
        # instant between two prompts, or from kill.
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
            task_status.started()
            async for signum in signals:
                if signum == signal.SIGINT and self.busy:
                    self.stop_turn()
                    continue
                # SIGINT outside a turn leaves, as Ctrl-C on an empty prompt does. A closed
                # terminal or a service manager wants the process gone: nothing it started may
                # outlive it, and the turn must not be left half-run for a later start to resume.
                self.terminated = signum
                if self.busy and not self.gone:
                    self.link.stop(True)
                    await self.wait_idle(EXIT_KILL_WAIT_S)
                self.exiting = True
                await self._close_prompt()  # ends the input loop, then run() leaves
                return

    async def _leave(self) -> None:
        """Exit cleanly: stop a running turn, then restore the terminal.

        The turn is stopped so it does not resume later.
        """
        if self.busy and not self.gone:
            self.sink.notice("stopping the turn before exit", "yellow")
            self.link.stop(False)
            if not await self.wait_idle(EXIT_STOP_WAIT_S):
                self.link.stop(True)
                await self.wait_idle(EXIT_KILL_WAIT_S)
        await self._close_prompt()

    async def _gone(self, why: str) -> None:
        """The daemon serving the chat went away: say so, and leave."""
        if self.gone:
            return
        self.gone = self.exiting = True
        cut = "; the turn is cut" if self.busy else ""
        self.sink.notice(
            f"kesoku: {why}{cut}; continue with: kesoku chat --session {self.link.session_id}",
            "bold red",
        )
        await self._close_prompt()

    async def _close_prompt(self) -> None:
        """Close the prompt and wait (at most PROMPT_CLOSE_WAIT_S) until its thread has let go."""
        with trio.move_on_after(PROMPT_CLOSE_WAIT_S):
            while not self.prompt.done.is_set():
                self.prompt.close()
                await trio.sleep(PROMPT_CLOSE_POLL_S)

    def _update_busy(self) -> None:
        busy = self.busy
        self.live.busy = busy
        if busy and self._idle.is_set():
            self._idle = trio.Event()
        elif not busy:
            self._stops = 0
            self._idle.set()
            self.sink.set_status(None)

    def _banner(self) -> None:
        link = self.link
        state = f"resumed ({link.title or 'untitled'})" if self.resumed else "new"
        self.sink.notice(
            f"Kesoku · session {link.session_id} {state} · {link.backend} · "
            "/help for commands · Ctrl-D to exit"
        )


def as_text_stream(output: AboveOutput) -> IO[str]:
    """The output as the text stream it behaves as (write, flush, isatty, fileno, encoding)."""
    return cast("IO[str]", output)


async def run_interactive(rt: Runtime, session: Session, serving: set[str], resumed: bool) -> int:
    """Run an interactive conversation in this process (see :class:`ChatUI`).

    Args:
        rt: The runtime (not yet serving).
        session: The session to talk in, held by this process.
        serving: Session ids the runtime answers (``/new`` moves it).
        resumed: ``session`` existed before (``--session``).

    Returns:
        The exit code.
    """
    link = LocalLink(rt, session, serving, opened=not resumed)
    return await ChatUI(link, resumed=resumed).run()


def chat_with_daemon(
    config: Config, session_id: str | None, llm_name: str | None, *, verbose: bool
) -> int | None:
    """Run an interactive conversation served by the daemon of the database, if one serves it.

    Returns:
        The exit code; None when no daemon listens (the caller runs the chat itself).

    Raises:
        OperatorError: The daemon refused (an unknown or busy session, a backend it cannot build).
    """
    db_path = config.workspace.db_path

    async def main() -> int | None:
        link = await connect(db_path, session_id, llm_name)
        if link is None:
            return None
        if verbose:
            print(
                f"kesoku: answered by the daemon (pid {link.pid}) at {link.socket}",
                file=sys.stderr,
                flush=True,
            )
        return await ChatUI(link, resumed=session_id is not None).run()

    code: int | None = EXIT_STOPPED
    if interrupt.restore():  # a Ctrl-C Python could not raise while the chat started
        return code
    try:
        code = trio.run(main)
    except* KeyboardInterrupt:  # Ctrl-C while attaching, before the chat listens for it
        pass
    return code
