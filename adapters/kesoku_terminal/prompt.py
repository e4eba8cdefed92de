"""The input line of ``kesoku chat``: prompt-toolkit in a worker thread, lines handed to trio.

Why prompt-toolkit: it is maintained, gives history (a file), bracketed paste (a pasted multi-line
block arrives as one message instead of one message per line), Alt-Enter for a newline, and it keeps
the input line at the bottom while output prints above it (:class:`AboveOutput`), which is what lets
a line typed during a turn interrupt it. readline's ``input()`` has none of the last three.

prompt-toolkit runs on asyncio, so it never touches the trio thread: ``session.prompt()`` runs in a
worker thread (its own private event loop) and each line crosses over with ``trio.from_thread.run``.
The area above the input (the unfinished line of a streaming answer, a spinner) is drawn by the
prompt's ``message`` callable from a :class:`LiveState` the trio side writes.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import trio
from prompt_toolkit import PromptSession
from prompt_toolkit.application.current import get_app
from prompt_toolkit.buffer import Buffer
from prompt_toolkit.formatted_text import StyleAndTextTuples
from prompt_toolkit.history import FileHistory, History, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent

from kesoku_terminal.render import status_line

if TYPE_CHECKING:
    from prompt_toolkit.application import Application

REFRESH_S = 0.1
"""How often the prompt redraws (the spinner's frame and elapsed seconds)."""
PROMPT = "› "
THOUGHT_STYLE = "fg:ansibrightblack italic"
STATUS_STYLE = "fg:ansibrightblack"


@dataclass(frozen=True, slots=True)
class Line:
    """A line the user entered (several lines when pasted or entered with Alt-Enter)."""

    text: str


@dataclass(frozen=True, slots=True)
class CtrlC:
    """Ctrl-C pressed at the prompt (while a turn runs, or on an empty line)."""


@dataclass(frozen=True, slots=True)
class Eof:
    """Ctrl-D on an empty line, or the terminal closed."""


InputEvent = Line | CtrlC | Eof


@dataclass(slots=True)
class LiveState:
    """What the area above the input shows; written by trio, read by the prompt thread.

    Each field is replaced whole (a str, a float, a bool), so the prompt thread never sees half an
    update.

    Attributes:
        partial: The unfinished last line of the streaming answer or thought.
        partial_style: Its prompt-toolkit style ('' for answer text).
        status: What the agent is doing (``thinking``, ``running shell``); None when idle.
        status_since: ``time.monotonic()`` when the status began.
        busy: A turn of ours is running or queued (Ctrl-C then stops it rather than clearing the
            line).
    """

    partial: str = ""
    partial_style: str = ""
    status: str | None = None
    status_since: float = field(default_factory=time.monotonic)
    busy: bool = False


def history_file() -> History:
    """The input history, ``$XDG_STATE_HOME/kesoku/chat_history``.

    In memory when that cannot be written.
    """
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    folder = Path(base) / "kesoku"
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = folder / "chat_history"
        path.touch(mode=0o600, exist_ok=True)
    except OSError:
        return InMemoryHistory()
    return FileHistory(os.fspath(path))


class PromptThread:
    """Runs the prompt in a worker thread until Ctrl-D or :meth:`close`.

    Args:
        live: The state drawn above the input.
        history: The input history.
    """

    def __init__(self, live: LiveState, history: History) -> None:
        self.live = live
        self.history = history
        self.done = threading.Event()
        self._closing = False
        self._app: Application[str] | None = None
        self._send: trio.MemorySendChannel[InputEvent] | None = None

    def run(self, send: trio.MemorySendChannel[InputEvent]) -> None:
        """Read lines until Ctrl-D or :meth:`close`; run it with ``trio.to_thread.run_sync``.

        One prompt stays up for the whole conversation: Enter hands the line over and clears the
        input without leaving the prompt. Leaving it between lines would put the terminal back in
        cooked mode for a moment, and a key typed then (Ctrl-D above all) would be lost.

        Args:
            send: Where each line (or Ctrl-C, Ctrl-D) goes; closed when the thread ends.
        """
        self._send = send
        try:
            session: PromptSession[str] = PromptSession(
                history=self.history, key_bindings=self._bindings(), reserve_space_for_menu=0
            )
            session.default_buffer.accept_handler = self._accept
            self._app = session.app
            while not self._closing:
                event: InputEvent
                try:
                    session.prompt(
                        self._message, refresh_interval=REFRESH_S, prompt_continuation="  "
                    )
                    continue  # only close() ends the prompt without an exception
                except KeyboardInterrupt:
                    event = CtrlC()
                except EOFError:
                    event = Eof()
                if self._closing or not self._hand_over(event) or isinstance(event, Eof):
                    break
        finally:
            self.done.set()
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(send.close)

    @property
    def app(self) -> Application[str] | None:
        """The prompt's application while it runs, else None."""
        app = self._app
        return app if app is not None and app.is_running else None

    def invalidate(self) -> None:
        """Redraw the prompt soon.

        Thread-safe: the trio side calls it after changing :attr:`live`.
        """
        app = self.app
        if app is not None:
            app.invalidate()

    def close(self) -> None:
        """Ask the prompt to end (thread-safe); call it again until :attr:`done` is set."""
        self._closing = True
        app = self._app
        loop = app.loop if app is not None else None
        if app is not None and loop is not None and app.is_running:
            loop.call_soon_threadsafe(_exit_app, app)

    # -- inside the prompt thread -----------------------------------------------------------------

    def _hand_over(self, event: InputEvent) -> bool:
        """Give an event to trio (waiting if it has :data:`INPUT_BUFFER` unread).

        Returns:
            False once trio left.
        """
        if self._send is None:
            return False
        try:
            trio.from_thread.run(self._send.send, event)
        except (
            trio.BrokenResourceError,
            trio.ClosedResourceError,
            trio.RunFinishedError,
            trio.Cancelled,
        ):
            return False
        return True

    def _accept(self, buffer: Buffer) -> bool:
        """Enter: leave ``› line`` in the scrollback, hand the line over, keep the prompt up."""
        text = buffer.text
        continued = text.replace("\n", "\n  ")
        print_above(get_app(), f"\x1b[1m{PROMPT}\x1b[0m{continued}\n")
        self._hand_over(Line(text))
        return False  # clear the input (the history keeps the line)

    def _message(self) -> StyleAndTextTuples:
        """The live area and the prompt.

        When the prompt ends (Ctrl-D, Ctrl-C on an empty line) only the prompt is drawn a last time,
        so the scrollback keeps no stale copy of the live area.
        """
        live = self.live
        if get_app().is_done:
            return [("bold", PROMPT)]
        fragments: StyleAndTextTuples = []
        if live.partial:
            fragments += [(live.partial_style, live.partial), ("", "\n")]
        if live.status is not None:
            fragments += [
                (STATUS_STYLE, status_line(live.status, time.monotonic() - live.status_since)),
                ("", "\n"),
            ]
        fragments.append(("bold", PROMPT))
        return fragments

    def _bindings(self) -> KeyBindings:
        bindings = KeyBindings()

        @bindings.add("c-c")
        def _ctrl_c(event: KeyPressEvent) -> None:
            buffer = event.app.current_buffer
            if self.live.busy:
                # stop the turn; keep the prompt and whatever is typed in it
                self._hand_over(CtrlC())
            elif buffer.text:
                buffer.reset()  # idle with text typed: clear it, as a shell does
            else:
                event.app.exit(exception=KeyboardInterrupt(), style="class:aborting")

        @bindings.add("escape", "enter")
        def _newline(event: KeyPressEvent) -> None:
            event.app.current_buffer.insert_text("\n")

        return bindings


class AboveOutput:
    """A text stream that prints above the running prompt, for rich and for log lines.

    prompt-toolkit's own ``StdoutProxy`` prints through ``run_in_terminal``, which puts the terminal
    in cooked mode for each write: a key typed in that instant is echoed by the terminal, and a
    Ctrl-D is lost. Here each batch of whole lines is written from the prompt's event loop between
    two renders, without a mode switch: erase the prompt, write, redraw. A partial line waits for
    its newline (the live area shows unfinished lines). With no prompt running it writes straight
    through.

    Args:
        prompt: The prompt to print above.
        stream: The real terminal stream (stdout).
    """

    def __init__(self, prompt: PromptThread, stream: TextIO) -> None:
        self.prompt = prompt
        self.stream = stream
        self._lock = threading.Lock()
        self._lines: list[str] = []
        self._partial = ""

    @property
    def encoding(self) -> str:
        """The terminal's encoding."""
        return self.stream.encoding

    def write(self, text: str) -> int:
        """Queue text; whole lines are printed at the prompt's next turn."""
        with self._lock:
            data = self._partial + text
            if "\n" not in data:
                self._partial = data
                return len(text)
            head, self._partial = data.rsplit("\n", 1)
            self._lines.append(head + "\n")
        app = self.prompt.app
        loop = app.loop if app is not None else None
        if app is None or loop is None:
            self._drain(None)
            return len(text)
        try:
            loop.call_soon_threadsafe(self._drain, app)
        except RuntimeError:  # the prompt's loop just closed: write through
            self._drain(None)
        return len(text)

    def flush(self) -> None:
        """Nothing to do: lines go out as they complete (see :meth:`close` for the rest)."""

    def close(self) -> None:
        """Write whatever is left, partial line included (the prompt has ended)."""
        with self._lock:
            self._lines.append(self._partial)
            self._partial = ""
        self._drain(None)

    def isatty(self) -> bool:
        """Whether the terminal is one (rich asks)."""
        return self.stream.isatty()

    def fileno(self) -> int:
        """The terminal's descriptor (rich reads its size)."""
        return self.stream.fileno()

    def _drain(self, app: Application[str] | None) -> None:
        with self._lock:
            text = "".join(self._lines)
            self._lines.clear()
        if not text:
            return  # an earlier drain took it
        if app is None or not app.is_running or app.is_done:
            self.stream.write(text)
            self.stream.flush()
            return
        print_above(app, text)


def print_above(app: Application[str], text: str) -> None:
    """Print above the prompt, from its event loop.

    Erase the prompt, write, and let it draw itself again below.
    """
    app.renderer.erase()  # the prompt and the live area; the cursor goes back to where they began
    app.output.write_raw(text)
    app.output.flush()
    app.invalidate()


def _exit_app(app: Application[str]) -> None:
    if app.is_running and app.future is not None and not app.future.done():
        app.exit(exception=EOFError())
