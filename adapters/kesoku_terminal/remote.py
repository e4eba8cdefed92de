"""``kesoku chat "prompt"`` through the daemon serving the database (its control socket).

The daemon already holds the model's SDK and a warm runtime, so the question costs this process a
config load and one socket: no store, no runtime, no SDK, and no trio (its import alone is more
than such a chat's budget; ARCHITECTURE.md, "The chat client"). One thread waits with ``selectors``
on the socket, the signals (``signal.set_wakeup_fd``) and, while a question waits for an answer,
standard input.

What is shown, what Ctrl-C and questions do, and the exit codes are those of a chat in its own
process (:mod:`kesoku_terminal.plain`), with one more case: the daemon stopping before the turn
ended (exit 1: the turn is cut; the session goes on with ``--session``).
"""

from __future__ import annotations

import contextlib
import itertools
import selectors
import signal
import socket
import sys
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING

from kesoku.host import interrupt
from kesoku.host.control import (
    PROTOCOL,
    Answer,
    Attach,
    Attached,
    FrameError,
    FrameReader,
    Gap,
    Log,
    Post,
    Posted,
    Refused,
    Reply,
    Stop,
    ToClient,
    ToDaemon,
    encode,
    short_address,
    socket_path,
)
from kesoku.vocab.errors import OperatorError
from kesoku.vocab.model import DENY, parse_answer
from kesoku_terminal.plain import (
    NOT_ASKED,
    SIGNALS,
    Controls,
    PlainSink,
    finish,
    live_answer,
)
from kesoku_terminal.view import Follower, user_name

if TYPE_CHECKING:
    from kesoku.config.settings import Config
    from kesoku.vocab.model import Message

RECEIVE_BYTES = 65536
LEAVE_WAIT_S = 5.0
"""At exit, how long the daemon may take to let the session go (normally under a millisecond)."""
GONE = "kesoku: the daemon stopped before the turn ended; the turn is cut"
"""The line of a chat whose daemon went away mid-turn (exit 1)."""
ATTACH_WAIT_S = 30.0
"""How long the daemon may take to answer an ``Attach`` (building a ``--llm`` backend: seconds)."""
UNANSWERED = "kesoku: the daemon did not end the turn; left it (it may go on there)"
"""The line of a chat that gave up on the daemon: a signal after the kill was asked already."""


def ask_daemon(
    config: Config,
    question: str,
    *,
    session_id: str | None,
    llm_name: str | None,
    verbose: bool = False,
) -> int | None:
    """Ask ``question`` through the daemon serving ``workspace.db_path``, if one does.

    Args:
        config: The loaded config (only its database path is used: the daemon runs with its own).
        question: The question, stdin already appended.
        session_id: A terminal session (id or unique prefix) to continue; None: a new one.
        llm_name: The backend of a new session.
        verbose: Say on stderr that the daemon answers.

    Returns:
        The exit code; None when no daemon listens (the caller runs the chat itself).

    Raises:
        OperatorError: The daemon refused (an unknown or busy session, another protocol): one line,
            exit 2.
    """
    path = socket_path(config.workspace.db_path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        with short_address(path) as address:
            sock.connect(address)
    except OSError:  # none there, a dead daemon's socket, or not ours to reach
        sock.close()
        return None
    if interrupt.restore():  # a Ctrl-C Python could not raise while the chat started
        sock.close()
        print(NOT_ASKED, file=sys.stderr)
        return 128 + signal.SIGINT
    with sock, _signals() as wakeup:
        client = _Client(sock, wakeup)
        try:
            attached = client.attach(Attach(session_id, llm_name))
        except _Left as left:  # a signal before the daemon answered: nothing was asked
            print(NOT_ASKED, file=sys.stderr)
            return 128 + left.signum
        if verbose:
            print(
                f"kesoku: answered by the daemon (pid {attached.pid}) at {path}",
                file=sys.stderr,
                flush=True,
            )
        try:
            code = client.ask(attached, question)
        except _Left as left:
            sid = attached.session_id
            print(f"{UNANSWERED}; continue with: kesoku chat --session {sid}", file=sys.stderr)
            return 128 + left.signum
        client.leave()
        return code


class _Left(Exception):
    """The user gave up on a daemon that does not answer (a signal)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def unreadable(exc: FrameError) -> str:
    """The line for a daemon whose answer cannot be read (another version, or not a daemon)."""
    return f"chat: the daemon's answer cannot be read ({exc}); restart it, or add --local"


class BufferedLog:
    """The session's log as the daemon relays it (a :class:`~kesoku_terminal.view.SessionLog`).

    Args:
        last_id: The newest message id when the client attached.
    """

    def __init__(self, last_id: int) -> None:
        self.last_id = last_id
        self._messages: deque[Message] = deque()

    def reset(self, last_id: int) -> None:
        """Start over after ``last_id`` (the chat moved to another session)."""
        self._messages.clear()
        self.last_id = last_id

    def add(self, messages: list[Message]) -> None:
        """Messages the daemon relayed, in id order."""
        self._messages.extend(messages)
        if messages:
            self.last_id = max(self.last_id, messages[-1].id)

    def last_message_id(self) -> int:
        """The newest message id relayed (or at attach)."""
        return self.last_id

    def messages_after(self, after: int, session_id: str, limit: int) -> list[Message]:
        """Relayed messages after ``after``; those before it are read, so they are let go."""
        while self._messages and self._messages[0].id <= after:
            self._messages.popleft()
        return list(itertools.islice(self._messages, limit))


class _Client:
    """One chat's connection: the frames, the signals, the terminal."""

    def __init__(self, sock: socket.socket, wakeup: socket.socket) -> None:
        self.sock = sock
        self.wakeup = wakeup
        self.reader = FrameReader(to_client=True)
        self.pending: deque[ToClient] = deque()
        self.questions: deque[Message] = deque()
        self.selector = selectors.DefaultSelector()
        self.selector.register(sock, selectors.EVENT_READ)
        self.selector.register(wakeup, selectors.EVENT_READ)

    def send(self, frame: ToDaemon) -> None:
        with contextlib.suppress(OSError):  # the daemon gone: the next read says so
            self.sock.sendall(encode(frame))

    def leave(self) -> None:
        """Hang up, and wait until the daemon has let the session go (it closes its end then).

        So a chat that follows at once (``--session``, here or ``--local``) finds it free.
        """
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)
            self.sock.settimeout(LEAVE_WAIT_S)
            while self.sock.recv(RECEIVE_BYTES):
                pass  # what it relayed meanwhile

    def attach(self, request: Attach) -> Attached:
        """Send ``request``; the daemon's answer.

        Raises:
            OperatorError: Refused, or the daemon went away.
        """
        self.send(request)
        frame = self.next_frame()
        if isinstance(frame, Refused):
            raise OperatorError(frame.error)
        if not isinstance(frame, Attached):
            raise OperatorError("chat: the daemon closed the connection; try again, or --local")
        if frame.protocol != PROTOCOL:
            raise OperatorError(
                f"chat: the daemon speaks control protocol {frame.protocol}, this kesoku chat "
                f"{PROTOCOL}: restart the daemon after an upgrade, or add --local"
            )
        return frame

    def ask(self, attached: Attached, question: str) -> int:
        """Post the question and show the turn that answers it; the exit code."""
        session_id = attached.session_id
        sink = PlainSink(sys.stdout, sys.stderr, err_tty=sys.stderr.isatty())
        stops = Controls(
            lambda force: self.send(Stop(force)),
            lambda question_id, choice, by: self.send(Answer(question_id, choice, by)),
            sink.notice,
        )
        log = BufferedLog(attached.last_message_id)
        follower = Follower(
            None, log, session_id, sink, on_event=stops.on_event, live_answer=live_answer()
        )
        cancelled = False

        def cancel_post() -> None:
            nonlocal cancelled
            cancelled = True

        stops.posting = cancel_post
        stops.ask = self.questions.append
        if cancelled:
            return finish(sink, stops, session_id, asked=False)
        self.send(Post(question))
        stops.stored(asked=True)  # sent: the daemon stores it, a signal now stops its turn
        mine: int | None = None
        while mine is None or follower.ended_root_id < mine:
            self._ask_next(stops)
            try:
                frame = self.next_frame(stops)
            except _Left:
                sink.answer_end()
                sink.thought_end()
                raise
            if frame is None:
                sink.answer_end()
                sink.thought_end()
                print(f"{GONE}; continue with: kesoku chat --session {session_id}", file=sys.stderr)
                return 1
            if isinstance(frame, Log):
                log.add(frame.messages)
            elif isinstance(frame, Posted):
                mine = frame.message_id
            elif isinstance(frame, Gap):
                follower.gap()
            elif isinstance(frame, Refused):
                raise OperatorError(frame.error)
            elif not isinstance(frame, (Attached, Reply)):
                follower.handle(frame)
        return finish(sink, stops, session_id, asked=True)

    def _ask_next(self, stops: Controls) -> None:
        """Start asking the oldest waiting question, unless one is being asked."""
        if not self.questions or self._asking():
            return
        print("Allow? [y/N] ", end="", file=sys.stderr, flush=True)
        self.selector.register(sys.stdin.fileno(), selectors.EVENT_READ)

    def _asking(self) -> bool:
        return sys.stdin.fileno() in self.selector.get_map()

    def next_frame(self, stops: Controls | None = None) -> ToClient | None:
        """The next frame from the daemon, handling signals and answers meanwhile.

        Without ``stops`` (attaching) the daemon has :data:`ATTACH_WAIT_S` to answer.

        Returns:
            The frame; None when the daemon closed the connection.

        Raises:
            _Left: A signal while attaching, or one after the turn's kill was asked already (a
                daemon that does not answer must not hold the chat).
            OperatorError: The daemon did not answer the attach in time, or sent an unreadable
                frame.
        """
        while not self.pending:
            ready = self.selector.select(None if stops is not None else ATTACH_WAIT_S)
            if not ready:
                raise OperatorError(
                    f"chat: the daemon did not answer in {ATTACH_WAIT_S:g} s; "
                    "kesoku doctor says which process it is, or add --local"
                )
            for key, _ in ready:
                if key.fileobj is self.wakeup:
                    for signum in self.wakeup.recv(64):
                        if stops is None or stops.count >= 2:
                            raise _Left(signum)
                        stops.on_signal(signum)
                elif key.fd == sys.stdin.fileno():
                    self.selector.unregister(key.fd)
                    line = sys.stdin.readline()  # a terminal: readable once a line is typed
                    asked = self.questions.popleft()
                    assert stops is not None
                    stops.answer(asked.id, parse_answer(line) or DENY, user_name())
                    self._ask_next(stops)
                else:
                    try:
                        data = self.sock.recv(RECEIVE_BYTES)
                    except OSError:
                        data = b""
                    if not data:
                        return None
                    try:
                        self.pending.extend(self.reader.feed(data))  # type: ignore[arg-type]
                    except FrameError as exc:
                        raise OperatorError(unreadable(exc)) from None
        return self.pending.popleft()


@contextlib.contextmanager
def _signals() -> Iterator[socket.socket]:
    """Deliver :data:`~kesoku_terminal.plain.SIGNALS` as bytes on a socket (their numbers)."""
    receive, send = socket.socketpair()
    receive.setblocking(False)
    send.setblocking(False)
    previous = {signum: signal.signal(signum, _ignore) for signum in SIGNALS}
    old_fd = signal.set_wakeup_fd(send.fileno(), warn_on_full_buffer=False)
    try:
        yield receive
    finally:
        signal.set_wakeup_fd(old_fd)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        receive.close()
        send.close()


def _ignore(signum: int, frame: object) -> None:
    """A handler that only lets the wake-up descriptor carry the signal."""
