"""``kesoku chat "prompt"``: one question, the answer on stdout, the rest on stderr, an exit code.

stdout carries only the model's answer text (so ``kesoku chat "..." > answer.txt`` and pipes work):
streamed to a terminal, written to a pipe or a file once it is stored;
thoughts, tool calls and results, system notices and the metrics line go to stderr, dimmed when
stderr is a terminal. The metrics line is printed to a terminal, or when the turn was stopped, so a
script reading stderr sees one line per event that matters.

After the turn one more line on stderr says how to go on in the same session (``continue with:
kesoku chat --session ID``), whatever the outcome; nothing is said when the question was never
stored.

Exit codes: 0 answered; 1 the turn failed (the model call failed, the step limit) or was interrupted
by another message; 130 stopped by Ctrl-C (the shell's code for SIGINT); 143 or 129 stopped by
SIGTERM or SIGHUP (``timeout``, a closed terminal): the turn is stopped and its running tools
killed, so none outlives the chat, and the turn is left ``stopped``, not half-run.
"""

from __future__ import annotations

import signal
import sys
from typing import TYPE_CHECKING, TextIO

import trio

from kesoku.vocab.events import QuestionAsked, TurnStarted
from kesoku.vocab.metrics import TurnState
from kesoku.vocab.model import DENY, parse_answer, user_text
from kesoku_terminal.render import THOUGHT_ICON, tool_call_line, tool_result_line
from kesoku_terminal.view import Follower, user_name

if TYPE_CHECKING:
    from kesoku.agent.runtime import Runtime
    from kesoku.vocab.events import TurnEvent
    from kesoku.vocab.metrics import TurnMetrics
    from kesoku.vocab.model import Message, Session

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_STOPPED = 130
_EXIT_CODES = {
    TurnState.DONE: EXIT_OK,
    TurnState.FAILED: EXIT_FAILED,
    TurnState.STEP_LIMIT: EXIT_FAILED,
    TurnState.REPEATING: EXIT_FAILED,
    TurnState.BUDGET: EXIT_FAILED,
    TurnState.INTERRUPTED: EXIT_FAILED,
    TurnState.STOPPED: EXIT_STOPPED,
}
DIM, RESET = "\x1b[2m", "\x1b[0m"
NOT_ASKED = "kesoku: stopped before the question was stored; nothing was asked"
"""The one line of a chat stopped before its question was stored (a signal while it starts, or
while the question waits for a locked database)."""


class PlainSink:
    """Writes a turn to two text streams, keeping lines whole across them.

    When stdout and stderr are the same terminal, a thought left open on stderr would run into the
    answer on stdout; so before writing to one stream, the line open on the other is ended.

    Args:
        out: The answer's stream (stdout).
        err: Everything else (stderr).
        err_tty: stderr is a terminal: dim the activity and always show the metrics line.
    """

    def __init__(self, out: TextIO, err: TextIO, *, err_tty: bool) -> None:
        self.out = out
        self.err = err
        self.err_tty = err_tty
        self.metrics: TurnMetrics | None = None
        self._open: str | None = None  # "answer" or "thought": the line left open
        self._answer_at_bol = True

    # -- the answer, streamed to stdout ---------------------------------------------------------

    def answer(self, chunk: str) -> None:
        """Stream a piece of the answer."""
        if self._open == "thought":
            self._end_thought()
        self.out.write(chunk)
        self.out.flush()
        self._open = "answer"
        self._answer_at_bol = chunk.endswith("\n")

    def answer_end(self) -> None:
        """End the answer line."""
        if self._open == "answer":
            if not self._answer_at_bol:
                self.out.write("\n")
                self.out.flush()
            self._open = None
            self._answer_at_bol = True

    # -- activity, on stderr --------------------------------------------------------------------

    def thought(self, chunk: str) -> None:
        """Stream a piece of reasoning."""
        if self._open == "answer":
            self.answer_end()
        if self._open != "thought":
            self._err(f"{THOUGHT_ICON} ")
            self._open = "thought"
        self._err(chunk)

    def thought_end(self) -> None:
        """End the reasoning line."""
        if self._open == "thought":
            self._end_thought()

    def tool_call(self, call: Message) -> None:
        """Show a posted tool call."""
        self._line(tool_call_line(call))

    def tool_started(self, call: Message) -> None:
        """A tool started running."""
        pass  # the call's line was printed when it was posted; a pipe needs no spinner

    def tool_result(self, result: Message) -> None:
        """Show a tool result with its outcome."""
        self._line(tool_result_line(result))

    def system(self, text: str) -> None:
        """Show a system notice."""
        self._line(text, dim=False)

    def question(self, question: Message) -> None:
        """Show a question; :class:`_Controls` answers it.

        It answers from the terminal, or Deny without one.
        """
        self._line(question.content, dim=False)

    def turn_started(self, root: Message) -> None:
        """A turn opened."""
        pass

    def turn_ended(self, metrics: TurnMetrics) -> None:
        """Show the metrics line."""
        self.metrics = metrics
        if self.err_tty or metrics.state is TurnState.STOPPED:
            self._line(metrics.render())

    # -- plumbing -------------------------------------------------------------------------------

    def _end_thought(self) -> None:
        self._err("\n")
        self._open = None

    def _line(self, text: str, *, dim: bool = True) -> None:
        self.answer_end()
        self.thought_end()
        self._err(text + "\n", dim=dim)

    def _err(self, text: str, *, dim: bool = True) -> None:
        if self.err_tty and dim and text.strip():
            text = f"{DIM}{text}{RESET}"
        self.err.write(text)
        self.err.flush()


async def run_oneshot(rt: Runtime, session: Session, prompt: str) -> int:
    """Ask one question in ``session`` and show the turn that answers it.

    Args:
        rt: The runtime (not yet serving: this runs it).
        session: The session to ask in.
        prompt: The question (stdin already appended).

    Returns:
        The exit code (see the module docstring).

    Cancellation:
        Ctrl-C (SIGINT) stops the turn (a second one kills running tools); the turn ends ``stopped``
        and its metrics line is printed before 130 is returned. SIGTERM and SIGHUP stop it and kill
        its tools at once; 128 + the signal number is returned. A signal before the question is
        stored (while the runtime starts, or while the question waits for a locked database) ends
        the chat there: nothing is stored or asked, :data:`NOT_ASKED` says so, and 128 + the signal
        number is returned.
    """
    sink = PlainSink(sys.stdout, sys.stderr, err_tty=sys.stderr.isatty())
    stops = _Controls(rt, session.id)
    # A pipe or a file gets the answer once it is stored: never text the session did not keep.
    live = sys.stdout.isatty()
    follower = Follower(
        rt.hub, rt.gateway, session.id, sink, on_event=stops.on_event, live_answer=live
    )
    # Until the question is stored a signal cancels this scope (entered or not yet), so that the
    # question is never posted after a Ctrl-C that came while the runtime was starting.
    stops.posting = trio.CancelScope()
    async with trio.open_nursery() as nursery:
        stops.nursery = nursery
        await nursery.start(stops.watch_signals)  # first: Ctrl-C from here on is ours to handle
        await nursery.start(follower.run)
        await nursery.start(rt.serve)
        mine: Message | None = None
        with stops.posting:
            stops.apply()
            mine = await rt.gateway.post(user_text(session.id, prompt))
        stops.posting = None
        if mine is not None and stops.hint is not None:  # a signal while the post completed
            print(stops.hint, file=sys.stderr, flush=True)
        if mine is not None:  # the turn that answers `mine` is rooted on it or on a later message
            await follower.wait_ended(mine.id)
        nursery.cancel_scope.cancel()
    if mine is None:
        print(NOT_ASKED, file=sys.stderr)
        return 128 + (stops.terminated or signal.SIGINT)
    sink.system(f"continue with: kesoku chat --session {session.id}")
    assert sink.metrics is not None
    if stops.terminated is not None and sink.metrics.state is TurnState.STOPPED:
        return 128 + stops.terminated
    return _EXIT_CODES[sink.metrics.state]


class _Controls:
    """Ctrl-C and questions in one-shot mode.

    The first Ctrl-C stops the turn (running tools finish), the next kill tools. A question is asked
    on the terminal when standard input is one (``y`` allows; anything else, or end of input,
    denies); with standard input piped nobody can answer, so it is denied at once and the result
    says so.
    """

    def __init__(self, rt: Runtime, session_id: str) -> None:
        self.rt = rt
        self.session_id = session_id
        self.count = 0
        self.terminated: int | None = None
        """The number of the SIGTERM or SIGHUP that stopped the turn, if one did."""
        self.nursery: trio.Nursery | None = None
        self.posting: trio.CancelScope | None = None
        """Until the question is stored: the scope of its post (a signal cancels it)."""
        self.hint: str | None = None
        """What the last signal does, kept while the question may still not be stored."""

    def apply(self) -> None:
        if self.count and self.posting is not None:
            self.posting.cancel()
        elif self.count:
            self.rt.gateway.stop(self.session_id, force=self.count > 1)

    def on_event(self, event: TurnEvent) -> None:
        if isinstance(event, TurnStarted):
            self.apply()  # a Ctrl-C that came before the turn opened
        elif isinstance(event, QuestionAsked):
            if sys.stdin.isatty() and self.nursery is not None:
                self.nursery.start_soon(self._ask, event.question)
            else:
                self.rt.questions.answer(
                    event.question.id, DENY, by="nobody (one-shot chat without a terminal)"
                )

    async def _ask(self, question: Message) -> None:
        print("Allow? [y/N] ", end="", file=sys.stderr, flush=True)
        line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
        self.rt.questions.answer(question.id, parse_answer(line) or DENY, by=user_name())

    async def watch_signals(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
            task_status.started()
            async for signum in signals:
                if signum == signal.SIGINT:
                    self.count += 1
                    hint = (
                        "killing tools"
                        if self.count > 1
                        else "stopping the turn (Ctrl-C again kills running tools)"
                    )
                else:  # whoever sent it wants the process gone: nothing may outlive it
                    self.count = max(self.count, 2)
                    self.terminated = signum
                    hint = f"{signal.Signals(signum).name}: stopping the turn and killing its tools"
                if self.posting is None:
                    print(hint, file=sys.stderr, flush=True)
                else:  # said once the post ends, if it stored the question (else NOT_ASKED is)
                    self.hint = hint
                self.apply()
