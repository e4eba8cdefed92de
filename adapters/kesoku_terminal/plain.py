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

What shows the turn (:class:`PlainSink`), what a signal or a question does (:class:`Controls`) and
the exit code (:func:`finish`) are the same whether the turn runs in this process
(:mod:`kesoku_terminal.oneshot`, trio) or in the daemon (:mod:`kesoku_terminal.remote`); this module
imports no trio for the latter.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from kesoku.vocab.errors import OperatorError
from kesoku.vocab.events import QuestionAsked, TurnStarted
from kesoku.vocab.metrics import TurnState
from kesoku.vocab.model import DENY
from kesoku_terminal.render import THOUGHT_ICON, tool_call_line, tool_result_line

if TYPE_CHECKING:
    from kesoku.vocab.events import TurnEvent
    from kesoku.vocab.metrics import TurnMetrics
    from kesoku.vocab.model import Message

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

    def notice(self, text: str) -> None:
        """Show a line of the chat's own (what a signal does), ending any line left open."""
        self._line(text)

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


def live_answer() -> bool:
    """Stream the answer to a terminal only.

    A pipe or a file gets it once it is stored: never text the session did not keep.
    """
    return sys.stdout.isatty()


def finish(sink: PlainSink, stops: Controls, session_id: str, *, asked: bool) -> int:
    """The last line of a one-shot and its exit code (see the module docstring).

    Args:
        sink: The sink that showed the turn (its metrics are the turn's end).
        stops: The chat's controls (the signal that stopped it, if one did).
        session_id: The session asked in.
        asked: The question was stored (False: a signal came first).
    """
    if not asked:
        print(NOT_ASKED, file=sys.stderr)
        return 128 + (stops.terminated or signal.SIGINT)
    sink.system(f"continue with: kesoku chat --session {session_id}")
    assert sink.metrics is not None
    if stops.terminated is not None and sink.metrics.state is TurnState.STOPPED:
        return 128 + stops.terminated
    return _EXIT_CODES[sink.metrics.state]


def ask_line() -> str:
    """Ask Allow? on the terminal; the line typed (blocking: run it in a thread)."""
    print("Allow? [y/N] ", end="", file=sys.stderr, flush=True)
    return sys.stdin.readline()


class Controls:
    """Ctrl-C and questions in one-shot mode, in this process or through the daemon.

    The first Ctrl-C stops the turn (running tools finish), the next kill tools. A question is asked
    on the terminal when standard input is one (``y`` allows; anything else, or end of input,
    denies); with standard input piped nobody can answer, so it is denied at once and the result
    says so.

    Args:
        stop: Stops the session's turn; its argument is ``force`` (kill running tools).
        answer: Answers a question: ``(question_id, choice, by)``.
        say: Shows what a signal does, as a whole line (:meth:`PlainSink.notice`: a thought left
            open is ended first).
    """

    def __init__(
        self,
        stop: Callable[[bool], object],
        answer: Callable[[int, str, str], object],
        say: Callable[[str], object],
    ) -> None:
        self.stop = stop
        self.answer = answer
        self.say = say
        self.count = 0
        self.terminated: int | None = None
        """The number of the SIGTERM or SIGHUP that stopped the turn, if one did."""
        self.posting: Callable[[], object] | None = None
        """Until the question is stored: cancels its post (a signal calls it)."""
        self.ask: Callable[[Message], object] | None = None
        """Starts asking a question on the terminal (its answer goes to :attr:`answer`)."""
        self.hint: str | None = None
        """What the last signal does, kept while the question may still not be stored."""

    def apply(self) -> None:
        """Act on the signals so far: cancel the post, or stop the turn."""
        if self.count and self.posting is not None:
            self.posting()
        elif self.count:
            self.stop(self.count > 1)

    def stored(self, *, asked: bool) -> None:
        """The post is over: if it stored the question, say what a signal meanwhile does.

        The turn's start applies that signal (:meth:`on_event`).
        """
        self.posting = None
        if asked and self.hint is not None:
            self.say(self.hint)
        self.hint = None

    def on_event(self, event: TurnEvent) -> None:
        """The follower's hook: a stop that came before the turn opened; questions."""
        if isinstance(event, TurnStarted):
            self.apply()  # a Ctrl-C that came before the turn opened
        elif isinstance(event, QuestionAsked):
            if sys.stdin.isatty() and self.ask is not None:
                self.ask(event.question)
            else:
                self.answer(event.question.id, DENY, "nobody (one-shot chat without a terminal)")

    def on_signal(self, signum: int) -> None:
        """SIGINT counts up (stop, then kill tools); SIGTERM and SIGHUP kill tools at once."""
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
            self.say(hint)
        else:  # said once the post ends, if it stored the question (else NOT_ASKED is)
            self.hint = hint
        self.apply()


SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""The signals a one-shot chat handles (:meth:`Controls.on_signal`)."""


MAX_STDIN_BYTES = 1024 * 1024
"""The most of piped stdin a one-shot question takes: enough for a diff or a log, not a disk
image."""


def read_question(prompt: str | None, *, max_stdin_bytes: int = MAX_STDIN_BYTES) -> str:
    """The one-shot question: the prompt, with stdin appended when stdin is not a terminal.

    ``echo text | kesoku chat "summarize"`` asks "summarize", a blank line, then the text.

    Raises:
        OperatorError: Both are empty; or stdin is larger than ``max_stdin_bytes`` or is not text
            (it would be sent to the model as garbage, and a paid model bills for it).
    """
    text = prompt or ""
    if not sys.stdin.isatty():
        data = sys.stdin.buffer.read(max_stdin_bytes + 1)
        if len(data) > max_stdin_bytes:
            raise OperatorError(
                f"chat: stdin is larger than {max_stdin_bytes // 1024} KiB; "
                "pipe less (e.g. `head -c 200k`)"
            )
        if b"\0" in data:
            raise OperatorError("chat: stdin is binary (it holds NUL bytes); pipe text")
        piped = data.decode("utf-8", errors="replace")
        if piped.strip():
            text = f"{text}\n\n{piped}" if text.strip() else piped
    if not text.strip():
        raise OperatorError("chat: nothing to ask; give a PROMPT or pipe text on stdin")
    return text
