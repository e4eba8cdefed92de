"""The daemon's side of the control socket (:mod:`kesoku.host.control`): it serves ``kesoku chat``.

One task per client. A client attaches to a terminal session (the daemon holds its lock and answers
it while the client is attached), posts its lines, runs session commands
(:mod:`kesoku.host.chat_commands`), may switch to a new session (``/new``, ``/clear``), and receives
the session's stored messages and live events, relayed in the order
:class:`kesoku_terminal.view.Follower` reads them: before each event, the log messages stored since
the last frame (the event names its place among them). A client that falls a whole buffer behind
gets :class:`~kesoku.host.control.Gap` instead of the lost events, as a view of the hub does.

Only processes of the daemon's own user may connect (the socket is 0600 and ``SO_PEERCRED`` is
checked): a client speaks as the operator at a terminal. A client leaving, or killed, detaches: the
turn it started still ends in the daemon, and a new session nothing was said in is removed.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import stat
import struct
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from kesoku.host.chat_commands import run_command, say
from kesoku.host.chat_sessions import discard_if_empty, next_session, open_session
from kesoku.host.control import (
    MAX_ATTACH_BYTES,
    MAX_REQUEST_BYTES,
    PROTOCOL,
    Answer,
    Attach,
    Attached,
    Command,
    FrameError,
    FrameReader,
    Gap,
    Log,
    Post,
    Posted,
    Refused,
    Reply,
    Say,
    Stop,
    Switch,
    ToClient,
    encode,
    short_address,
)
from kesoku.store import MessageFilter
from kesoku.vocab.errors import OperatorError
from kesoku.vocab.events import ModelDelta
from kesoku.vocab.model import user_text

if TYPE_CHECKING:
    from kesoku.agent.runtime import Runtime
    from kesoku.vocab.events import Subscription
    from kesoku.vocab.model import Message, Session

log = logging.getLogger("kesoku.host.control")

ATTACH_TIMEOUT_S = 10.0
"""How long a new connection may take to send its first frame."""
EVENT_BUFFER = 4096
"""Events a client may fall behind before some are lost (as a terminal view of the hub)."""
LOG_BATCH = 256
"""Messages read from the store per query while relaying."""
RECEIVE_BYTES = 65536
MAX_CLIENTS = 256
"""Connections served at once; one more is closed at once (each holds a descriptor and a task)."""
ACCEPT_PAUSE_S = 0.1
"""After an accept failed for want of descriptors or memory, the pause before the next try."""
_ACCEPT_PAUSES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
TAKE_OVER_S = 2.0
"""While another daemon serves the database, how often this one tries to take its socket over."""
RETIRE_WAIT_S = 2.0
"""When a client leaves, how long its session's worker may take to let the lock go before the
connection closes anyway (an idle worker takes a few ms; a running turn goes on after)."""
REFUSED_CONFINED = (
    "chat: the daemon does not take a process it started (a tool, an MCP server) or one running "
    "with no_new_privs as a user; --local runs the chat in this process"
)


class ControlServer:
    """Listens on the control socket and serves each ``kesoku chat`` client.

    Args:
        path: The socket's path (:func:`kesoku.host.control.socket_path` of the database).

    Attributes:
        attached: Sessions with a client attached (one at most: a second is refused).
        listening: It holds the socket (False while another daemon does).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.attached: set[str] = set()
        self.clients: set[trio.SocketStream] = set()
        self.listening = False

    def serves(self, session_id: str) -> bool:
        """A client is attached to the session: the daemon answers it."""
        return session_id in self.attached

    async def serve(
        self, rt: Runtime, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve clients until cancelled; the socket is removed at the end.

        While another daemon serves the database this one answers no chat: it tries the socket
        again every :data:`TAKE_OVER_S` and serves once that daemon is gone (stopped or killed).
        A socket that cannot be made otherwise is logged and left: chats then run in their own
        process, as without a daemon.
        """
        waited = False
        while True:
            try:
                listener, inode = await self._listen()
                self.listening = True
                break
            except OSError as exc:
                busy = exc.errno == errno.EADDRINUSE
                if not waited or not busy:
                    log.warning(
                        "no control socket at %s (%s): this daemon answers no kesoku chat%s",
                        self.path,
                        exc.strerror or exc,
                        " until that one stops" if busy else "",
                    )
                if not waited:
                    task_status.started()
                    waited = True
                if not busy:
                    return
            await trio.sleep(TAKE_OVER_S)
        if waited:
            log.info(
                "control socket at %s: the daemon that served it stopped; this one answers kesoku "
                "chat now",
                self.path,
            )
            task_status = trio.TASK_STATUS_IGNORED
        try:
            async with trio.open_nursery() as nursery:
                task_status.started()
                while True:
                    try:
                        stream = await listener.accept()
                    except OSError as exc:  # out of descriptors or memory: wait, do not die
                        if exc.errno not in _ACCEPT_PAUSES:
                            raise
                        log.warning("control socket: cannot accept a client now: %s", exc)
                        await trio.sleep(ACCEPT_PAUSE_S)
                        continue
                    if len(self.clients) >= MAX_CLIENTS:
                        log.warning("control socket: %d clients already; one refused", MAX_CLIENTS)
                        await stream.aclose()
                        continue
                    nursery.start_soon(self._client, rt, stream)
        finally:
            self.listening = False
            with contextlib.suppress(OSError):
                if os.stat(self.path).st_ino == inode:  # still ours, not a newer daemon's
                    os.unlink(self.path)
            with contextlib.suppress(OSError):
                listener.socket.close()

    async def _listen(self) -> tuple[trio.SocketListener, int]:
        """Bind the socket (0600), in place of one a dead daemon left.

        Raises:
            OSError: A live daemon listens there (EADDRINUSE), or the socket cannot be made.
        """
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with short_address(self.path) as address:
                try:
                    await sock.bind(address)
                except OSError as exc:
                    if exc.errno != errno.EADDRINUSE:
                        raise
                    await _remove_if_dead(address, self.path)
                    await sock.bind(address)
            # Before listen(): no client can connect until only this user may.
            os.chmod(self.path, 0o600)
            sock.listen(64)
            return trio.SocketListener(sock), os.stat(self.path).st_ino
        except BaseException:
            sock.close()
            raise

    async def _client(self, rt: Runtime, stream: trio.SocketStream) -> None:
        self.clients.add(stream)
        try:
            await self._serve_client(rt, stream)
        finally:
            self.clients.discard(stream)

    async def _serve_client(self, rt: Runtime, stream: trio.SocketStream) -> None:
        async with stream:
            try:
                pid, uid = peer_credentials(stream.socket)  # type: ignore[arg-type]
            except OSError:
                return
            if uid != os.getuid():
                log.warning("control socket: refused a client of uid %d", uid)
                return
            refusal = _refusal(pid)
            if refusal is not None:
                if refusal:
                    log.warning("control socket: refused pid %d: %s", pid, refusal)
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await stream.send_all(encode(Refused(REFUSED_CONFINED)))
                return
            client = _Client(rt, stream, self)
            try:
                await client.run()
            except (trio.BrokenResourceError, trio.ClosedResourceError, FrameError) as exc:
                log.debug("control socket: client gone: %s", exc)


def _refusal(pid: int) -> str | None:
    """Why the process ``pid`` may not speak as a user ("" when it is gone); None: it may.

    A tool's process or an MCP server attached as a user could answer its own session's questions.
    bubblewrap hides the socket; Landlock cannot refuse a connect to a named socket. A process the
    daemon started descends from it, unless it left by a double fork; one under Landlock runs with
    ``no_new_privs`` whatever its parent (Landlock requires it of an unprivileged process).
    """
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as status:
            confined = any(line.split() == ["NoNewPrivs:", "1"] for line in status)
    except OSError:
        return ""  # it left already: nothing to say
    if confined:
        return "it runs with no_new_privs (a sandboxed tool, or a sandboxed terminal)"
    if descends_from(pid, os.getpid()):
        return "a process the daemon started"
    return None


def peer_credentials(sock: socket.socket) -> tuple[int, int]:
    """``(pid, uid)`` of the process at the other end of a Unix socket, as it connected.

    ``SO_PEERCRED`` (unix(7)); the pid is as this process's pid namespace sees it.
    """
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return int(pid), int(uid)


def descends_from(pid: int, ancestor: int, *, max_depth: int = 256) -> bool:
    """Whether process ``pid`` is ``ancestor`` or one of its descendants (``/proc/PID/stat``).

    True also when the chain cannot be read to its end: the caller refuses what it cannot clear.
    """
    for _ in range(max_depth):
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat:
                # pid (comm) state ppid ...: comm may hold spaces and parentheses
                pid = int(stat.read().rpartition(b")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            return True
    return True


async def _remove_if_dead(address: str, path: Path) -> None:
    """Remove the socket at ``path`` unless a daemon answers on it.

    Raises:
        OSError: A daemon answers (EADDRINUSE): it serves this database already.
    """
    if not stat.S_ISSOCK(os.lstat(path).st_mode):  # never delete someone's file
        raise OSError(errno.EEXIST, f"{path} exists and is not a socket: move it away")
    probe = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        await probe.connect(address)
    except OSError:
        os.unlink(path)  # left by a daemon that died
    else:
        raise OSError(errno.EADDRINUSE, "another daemon serves this database")
    finally:
        probe.close()


class _Client:
    """One connection: attach, then requests and the relay, until either side ends."""

    def __init__(self, rt: Runtime, stream: trio.SocketStream, server: ControlServer) -> None:
        self.rt = rt
        self.stream = stream
        self.server = server
        self.reader = FrameReader(to_client=False, max_bytes=MAX_ATTACH_BYTES)
        self.pending: list[object] = []
        self.sending = trio.Lock()

    async def send(self, frame: ToClient) -> None:
        async with self.sending:  # two tasks send: the relay and the replies
            await self.stream.send_all(encode(frame))

    async def receive(self) -> object | None:
        """The next frame from the client; None at the end of the stream."""
        while not self.pending:
            data = await self.stream.receive_some(RECEIVE_BYTES)
            if not data:
                return None
            self.pending.extend(self.reader.feed(data))
        return self.pending.pop(0)

    async def run(self) -> None:
        first = None
        with trio.move_on_after(ATTACH_TIMEOUT_S):
            first = await self.receive()
        if not isinstance(first, Attach):
            return
        self.reader.max_bytes = MAX_REQUEST_BYTES
        if first.protocol != PROTOCOL:
            await self.send(
                Refused(
                    f"this kesoku chat speaks control protocol {first.protocol}, the daemon "
                    f"{PROTOCOL}: restart the daemon after an upgrade, or add --local"
                )
            )
            return
        gateway = self.rt.gateway
        try:
            session = open_session(gateway, first.session, llm=first.llm)
        except OperatorError as exc:
            await self.send(Refused(str(exc)))
            return
        opened, dropped = first.session is None, False  # opened: a session this chat made
        try:
            while (switch := await self._attached(session, dropped)) is not None:
                session, dropped = await next_session(
                    gateway, session, opened=opened, delete=switch.delete, llm=first.llm
                )
                opened = True
        except OperatorError as exc:  # another chat's session, a backend or folder not made
            await self.send(Refused(str(exc)))
        finally:
            gateway.locks.release(session.id)
            if opened:
                discard_if_empty(gateway, session)

    async def _attached(self, session: Session, dropped: bool) -> Switch | None:
        """Serve ``session`` until the client leaves (None) or switches to a new one.

        Raises:
            OperatorError: Another chat is attached to it, or its backend cannot be built.
        """
        if session.id in self.server.attached:
            raise OperatorError(
                f"--session {session.id[:8]}: another kesoku chat is running this session"
            )
        # Built now, in a thread: an SDK imported by the first turn would stall every session of
        # the daemon for as long (1.4 s for anthropic).
        llm = await trio.to_thread.run_sync(self.rt.llm_for, session)
        self.server.attached.add(session.id)
        # What the daemon's start left to a chat (terminal sessions are answered only while one is
        # attached): a turn a restart cut, a message nobody answered. The daemon answers it now.
        store = self.rt.store
        left = store.open_user_messages(up_to=store.last_message_id(), session_id=session.id)
        for message in left:
            self.rt.dispatcher.submit(message)
        try:
            with self.rt.hub.subscribe(session.id, buffer=EVENT_BUFFER) as events:
                cursor = self.rt.store.last_message_id()
                await self.send(
                    Attached(
                        session.id,
                        last_message_id=cursor,
                        pid=os.getpid(),
                        backend=f"{llm.provider}/{llm.model}",
                        title=session.title,
                        workspace=session.workspace,
                        dropped=dropped,
                    )
                )
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._relay, session.id, events, cursor)
                    switch = await self._requests(session)
                    nursery.cancel_scope.cancel()
            return switch
        finally:
            self.server.attached.discard(session.id)
            worker = self.rt.dispatcher.workers.get(session.id)
            if worker is not None:  # the session is the terminal's again once its turn ends
                worker.retire()
                # The client waits for the connection's end: then the session is free for a chat
                # that follows at once (a turn a killed client left running is not waited for).
                with trio.move_on_after(RETIRE_WAIT_S):
                    await self.rt.dispatcher.ended(worker)

    async def _requests(self, session: Session) -> Switch | None:
        """Handle the client's frames until it closes the connection (None) or switches."""
        session_id = session.id
        while (frame := await self.receive()) is not None:
            if isinstance(frame, Switch):
                return frame
            if isinstance(frame, Attach):  # one per connection: Switch moves to another session
                await self.send(Refused("chat: this connection is attached already"))
                return None
            if isinstance(frame, Post | Say):
                try:
                    if isinstance(frame, Say):
                        posted = await say(self.rt, session_id, frame.text, frame.by)
                    else:
                        posted = (await self.rt.gateway.post(user_text(session_id, frame.text))).id
                except OperatorError as exc:  # a database locked past its busy timeout
                    await self.send(Refused(str(exc)))
                    return None
                await self.send(Posted(posted))
            elif isinstance(frame, Command):
                await self.send(await self._command(session, frame))
            elif isinstance(frame, Stop):
                self.rt.gateway.stop(session_id, force=frame.force)
            elif isinstance(frame, Answer):
                # only this session's questions: the client speaks for its terminal, no other chat
                waiting = self.rt.questions.open_questions(session_id)
                if any(q.id == frame.question_id for q in waiting):
                    self.rt.questions.answer(frame.question_id, frame.choice, by=frame.by)
        return None

    async def _command(self, session: Session, frame: Command) -> Reply:
        """Run a session command; a failure is one line to the client and a traceback in the log."""
        try:
            run = await run_command(self.rt, session, frame.name, frame.args, busy=frame.busy)
        except Exception:
            log.exception("control socket: /%s failed", frame.name)
            return Reply([(f"/{frame.name} failed; the daemon's log says why", "yellow")])
        return Reply(run.lines, run.posted)

    async def _relay(self, session_id: str, events: Subscription, cursor: int) -> None:
        """Send each event after the log messages stored before it; a gap when events were lost."""
        flt = MessageFilter.from_kwargs({"session_id": session_id})
        lost = 0
        async for event in events:
            if not isinstance(event, ModelDelta):  # a delta names no place in the log
                cursor = await self._send_log(flt, cursor)
            await self.send(event)
            if events.dropped > lost:  # the event read after a drop still precedes the gap
                lost = events.dropped
                cursor = await self._send_log(flt, cursor)
                await self.send(Gap())

    async def _send_log(self, flt: MessageFilter, cursor: int) -> int:
        """Send the session's messages stored after ``cursor``; the new cursor."""
        messages: list[Message] = []
        while True:
            batch = self.rt.store.messages_after(cursor, flt, limit=LOG_BATCH)
            messages.extend(batch)
            if batch:
                cursor = batch[-1].id
            if len(batch) < LOG_BATCH:
                break
        if messages:
            await self.send(Log(messages))
        return cursor
