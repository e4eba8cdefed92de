"""What an interactive chat talks to: a runtime of its own, or the daemon serving the database.

:class:`~kesoku_terminal.interactive.ChatUI` does the same with either: it posts lines, stops
turns, runs the session commands of :mod:`kesoku.host.chat_commands`, switches sessions, and shows
the turns through a :class:`~kesoku_terminal.view.Follower`. :class:`LocalLink` does that with the
chat's own runtime (its hub and store); :class:`DaemonLink` with the daemon's control socket
(:mod:`kesoku.host.control`), whose frames carry the same commands, lines and events, so the two
show the same thing.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

import trio

from kesoku.host.chat_commands import run_command, say
from kesoku.host.chat_sessions import discard_if_empty, next_session
from kesoku.host.control import (
    Attach,
    Attached,
    Command,
    FrameError,
    FrameReader,
    Gap,
    Log,
    Posted,
    Refused,
    Reply,
    Say,
    Stop,
    Switch,
    ToClient,
    ToDaemon,
    encode,
    short_address,
    socket_path,
)
from kesoku.vocab.errors import OperatorError
from kesoku_terminal.remote import LEAVE_WAIT_S, BufferedLog, unreadable
from kesoku_terminal.view import Follower, SessionLog, StoreLog, user_name

if TYPE_CHECKING:
    from pathlib import Path

    from kesoku.agent.runtime import Runtime
    from kesoku.vocab.events import EventHub
    from kesoku.vocab.model import Session

Lines = list[tuple[str, str]]
"""A command's output: ``(text, style)`` per line."""
RECEIVE_BYTES = 65536
OUTBOX = 256
"""Frames waiting to be written to the daemon (a stop is never held up by a slow request)."""


class ChatGone(Exception):
    """The daemon went away, or ended the connection with a refusal (the message says which)."""


class ChatLink(Protocol):
    """The chat's side of whatever runs its session.

    Attributes:
        session_id, title, workspace: The current session's.
        backend: Its ``provider/model``.
        hub: Where live events come from (None: :meth:`serve` hands them to the follower).
        log: The log the follower reads at each event.
    """

    session_id: str
    title: str | None
    workspace: str
    backend: str
    hub: EventHub | None
    log: SessionLog

    async def serve(
        self, follower: Follower, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the session and feed ``follower`` until cancelled; ``started`` once it may post."""
        ...

    async def say(self, text: str) -> int:
        """A typed line: an answer to the open question (0), else the posted message's id.

        Raises:
            ChatGone: The daemon went away.
        """
        ...

    def stop(self, force: bool) -> None:
        """Stop the session's turn (``force``: kill its running tools too)."""
        ...

    async def command(self, name: str, args: str, *, busy: bool) -> tuple[Lines, int]:
        """Run a session command: its lines, and the message it posted (0: none).

        Raises:
            ChatGone: The daemon went away.
        """
        ...

    async def switch(self, *, delete: bool) -> bool:
        """Talk in a new session from now on (the follower too); True when the one left was deleted.

        Raises:
            ChatGone: The daemon went away.
            OperatorError: The new session's lock or folder cannot be made.
        """
        ...

    async def close(self) -> None:
        """Leave: a session this chat opened and said nothing in is deleted.

        Returns once the session is let go (another chat may take it at once), or after
        :data:`LEAVE_WAIT_S` at most.
        """
        ...


class LocalLink:
    """A chat running its own runtime (``kesoku chat --local``, or no daemon).

    Args:
        rt: The runtime (not yet serving: :meth:`serve` serves it).
        session: The session to talk in (held by this process).
        serving: Session ids this process answers; a switch moves it to the new session.
        opened: This chat opened ``session`` (not ``--session``).
    """

    def __init__(self, rt: Runtime, session: Session, serving: set[str], *, opened: bool) -> None:
        self.rt = rt
        self.serving = serving
        self.opened = opened
        self.hub: EventHub | None = rt.hub
        self.log: SessionLog = StoreLog(rt.store)
        self._follower: Follower | None = None
        self._set(session)

    def _set(self, session: Session) -> None:
        self.session = session
        self.session_id = session.id
        self.title = session.title
        self.workspace = session.workspace
        llm = self.rt.llm_for(session)
        self.backend = f"{llm.provider}/{llm.model}"

    async def serve(
        self, follower: Follower, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Follow the hub, and serve the runtime, until cancelled."""
        self._follower = follower
        async with trio.open_nursery() as nursery:
            await nursery.start(follower.run)
            await nursery.start(self.rt.serve)
            task_status.started()

    async def say(self, text: str) -> int:
        """Answer the open question or post (:func:`kesoku.host.chat_commands.say`)."""
        return await say(self.rt, self.session_id, text, user_name())

    def stop(self, force: bool) -> None:
        """Stop the turn through the gateway."""
        self.rt.gateway.stop(self.session_id, force=force)

    async def command(self, name: str, args: str, *, busy: bool) -> tuple[Lines, int]:
        """Run the session command here."""
        run = await run_command(self.rt, self.session, name, args, busy=busy)
        return run.lines, run.posted

    async def switch(self, *, delete: bool) -> bool:
        """Open a new session here (:func:`kesoku.host.chat_sessions.next_session`)."""
        previous = self.session
        session, dropped = await next_session(
            self.rt.gateway, previous, opened=self.opened, delete=delete
        )
        self.serving.add(session.id)
        self.serving.discard(previous.id)  # its lock is let go: another process may take it
        self.opened = True
        self._set(session)
        if self._follower is not None:
            self._follower.switch(session.id)
        return dropped

    async def close(self) -> None:
        """Delete the session if this chat opened it and nothing was said in it."""
        if self.opened:
            self.serving.discard(self.session_id)
            discard_if_empty(self.rt.gateway, self.session)


class DaemonLink:
    """A chat served by the daemon over its control socket (:func:`connect`).

    Args:
        stream: The connection, attached.
        attached: The daemon's answer to ``Attach``.
        reader: The reader that cut ``attached`` from the stream.
        early: Frames read with ``attached``.
        path: The socket's path (for ``kesoku chat -v``).

    Attributes:
        on_gone: Awaited once, with why, when the daemon ends the connection (the chat then
            leaves).
    """

    def __init__(
        self,
        stream: trio.SocketStream,
        attached: Attached,
        reader: FrameReader,
        early: list[ToClient],
        path: Path,
    ) -> None:
        self.stream = stream
        self.socket = path
        self.pid = attached.pid
        self.hub: EventHub | None = None
        self._log = BufferedLog(attached.last_message_id)
        self.log: SessionLog = self._log
        self.on_gone: Callable[[str], Awaitable[None]] = _nothing
        self._set(attached)
        self._reader = reader
        self._early = early
        self._out, self._outbox = trio.open_memory_channel[bytes](OUTBOX)
        self._reply_in, self._replies = trio.open_memory_channel[ToClient](1)
        self._asking = trio.Lock()
        self._waiting = False

    def _set(self, attached: Attached) -> None:
        self.session_id = attached.session_id
        self.title = attached.title
        self.workspace = attached.workspace
        self.backend = attached.backend

    async def serve(
        self, follower: Follower, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Write queued frames, and hand relayed frames to ``follower``, until cancelled."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._write)
            task_status.started()
            why = "the daemon stopped"
            try:
                await self._read(follower)
            except ChatGone as exc:
                why = str(exc)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                why = f"the connection to the daemon broke ({exc})"
            except FrameError as exc:
                why = unreadable(exc).removeprefix("chat: ")
            self._reply_in.close()  # a request waiting for its reply learns it now
            await self.on_gone(why)
            await trio.sleep_forever()

    async def _write(self) -> None:
        async for data in self._outbox:
            try:
                await self.stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return  # the reader sees the end too

    async def _read(self, follower: Follower) -> None:
        frames, self._early = self._early, []
        while True:
            for frame in frames:
                await self._take(frame, follower)
            data = await self.stream.receive_some(RECEIVE_BYTES)
            if not data:
                return
            frames = list(self._reader.feed(data))  # type: ignore[arg-type]

    async def _take(self, frame: ToClient, follower: Follower) -> None:
        if isinstance(frame, Log):
            self._log.add(frame.messages)
        elif isinstance(frame, Gap):
            follower.gap()
        elif isinstance(frame, Attached | Posted | Reply | Refused):
            if not self._waiting:
                if isinstance(frame, Refused):  # the daemon ends the connection: say why
                    raise ChatGone(frame.error)
                return  # nothing asked it: not ours to take
            if isinstance(frame, Attached):
                # Switched: the new session's frames follow at once, so the view moves now.
                self._log.reset(frame.last_message_id)
                self._set(frame)
                follower.switch(frame.session_id)
            await self._reply_in.send(frame)
        else:
            follower.handle(frame)

    async def _ask(self, frame: ToDaemon) -> ToClient:
        async with self._asking:
            self._waiting = True
            self._send(frame)
            try:
                reply = await self._replies.receive()
            except trio.EndOfChannel:
                raise ChatGone("the daemon stopped") from None
            finally:
                self._waiting = False
        if isinstance(reply, Refused):
            raise ChatGone(reply.error)
        return reply

    def _send(self, frame: ToDaemon) -> None:
        # gone (the reader says so), or 256 frames behind (a stop is asked again)
        with contextlib.suppress(trio.WouldBlock, trio.ClosedResourceError):
            self._out.send_nowait(encode(frame))

    async def say(self, text: str) -> int:
        """Send the line; the daemon answers the open question or posts it."""
        reply = await self._ask(Say(text, user_name()))
        assert isinstance(reply, Posted)
        return reply.message_id

    def stop(self, force: bool) -> None:
        """Ask the daemon to stop the turn."""
        self._send(Stop(force))

    async def command(self, name: str, args: str, *, busy: bool) -> tuple[Lines, int]:
        """Run the session command in the daemon."""
        reply = await self._ask(Command(name, args, busy))
        assert isinstance(reply, Reply)
        return [tuple(line) for line in reply.lines], reply.posted  # type: ignore[misc]

    async def switch(self, *, delete: bool) -> bool:
        """The daemon opens the new session; the log starts over there."""
        reply = await self._ask(Switch(delete))
        assert isinstance(reply, Attached)
        return reply.dropped

    async def close(self) -> None:
        """Hang up, and wait until the daemon has let the session go (it closes its end then)."""
        self._out.close()
        try:
            with (
                trio.move_on_after(LEAVE_WAIT_S),
                contextlib.suppress(OSError, trio.BrokenResourceError, trio.ClosedResourceError),
            ):
                self.stream.socket.shutdown(socket.SHUT_WR)
                while await self.stream.receive_some(RECEIVE_BYTES):
                    pass  # what it relayed meanwhile
        finally:
            self.stream.socket.close()


async def connect(db_path: str, session_id: str | None, llm_name: str | None) -> DaemonLink | None:
    """Attach to the daemon serving ``db_path``, if one does.

    Returns:
        The link; None when no daemon listens there.

    Raises:
        OperatorError: The daemon refused (an unknown or busy session, a backend it cannot build,
            another protocol), or closed the connection.
    """
    path = socket_path(db_path)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with short_address(path) as address:
            await sock.connect(address)
    except OSError:  # none there, a dead daemon's socket, or not ours to reach
        sock.close()
        return None
    stream = trio.SocketStream(sock)
    try:
        await stream.send_all(encode(Attach(session_id, llm_name)))
        reader = FrameReader(to_client=True)
        frames: list[ToClient] = []
        while not frames and (data := await stream.receive_some(RECEIVE_BYTES)):
            frames.extend(reader.feed(data))  # type: ignore[arg-type]
    except FrameError as exc:
        await stream.aclose()
        raise OperatorError(unreadable(exc)) from None
    except BaseException:
        await stream.aclose()
        raise
    first = frames[0] if frames else None
    if not isinstance(first, Attached):
        await stream.aclose()
        if isinstance(first, Refused):
            raise OperatorError(first.error)
        raise OperatorError("chat: the daemon closed the connection; try again, or --local")
    return DaemonLink(stream, first, reader, frames[1:], path)


async def _nothing(why: str) -> None:
    """The default :attr:`DaemonLink.on_gone`."""
