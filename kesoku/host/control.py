"""The daemon's control socket: where it is, and the frames a ``kesoku chat`` client exchanges.

``kesoku start`` listens on a Unix socket next to its database (:func:`socket_path`). A ``kesoku
chat`` that finds it attaches to a session, posts its lines and follows the turns there, instead of
building a runtime and importing a model SDK in its own process (ARCHITECTURE.md, "The chat
client"). A one-shot sends ``Attach``, ``Post`` and maybe ``Stop`` and ``Answer``; an interactive
chat also ``Say``, ``Command`` and ``Switch``. The daemon answers each request in order (``Attach``
and ``Switch``: ``Attached`` or ``Refused``; ``Post`` and ``Say``: ``Posted``; ``Command``:
``Reply``), between the frames it relays. SQLite stays the only source of truth: the daemon posts
through its gateway, and the frames it sends back are copies of what its log holds (:class:`Log`)
and of its live, lossy turn events, in the order a follower needs them.

Wire format: each frame is a 4-byte big-endian length, then one MessagePack map (msgspec), tagged
by ``type``. Frames are at most :data:`MAX_FRAME_BYTES`.

This module is light on purpose (no trio, no store): the client imports it.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import msgspec

from kesoku.vocab.events import TurnEvent
from kesoku.vocab.model import Message

PROTOCOL = 2
"""Bumped when a frame changes meaning; a client refuses a daemon speaking another."""
MAX_FRAME_BYTES = 64 * 1024 * 1024
"""The largest frame a client accepts (a log batch of long tool results fits)."""
MAX_REQUEST_BYTES = 16 * 1024 * 1024
"""The largest frame the daemon accepts from an attached client (a question with 1 MiB of stdin,
a pasted block)."""
MAX_ATTACH_BYTES = 64 * 1024
"""The largest first frame the daemon accepts (an ``Attach`` is a few dozen bytes): a connection
that has not attached cannot make it buffer more."""
SUN_PATH_MAX = 107
"""The longest path ``sockaddr_un`` holds (108 bytes with the NUL, unix(7))."""
_HEADER = struct.Struct(">I")


# -- client → daemon ------------------------------------------------------------------------------


class Attach(msgspec.Struct, frozen=True, tag="attach"):
    """The first frame: open a new terminal session (``session`` None) or continue one.

    ``session`` is an id or a unique prefix; ``llm`` a backend for a new session (``--llm``).
    """

    session: str | None = None
    llm: str | None = None
    protocol: int = PROTOCOL


class Post(msgspec.Struct, frozen=True, tag="post"):
    """Post the user's question to the attached session."""

    text: str


class Stop(msgspec.Struct, frozen=True, tag="stop"):
    """Stop the session's turn (``force``: kill its running tools too)."""

    force: bool = False


class Answer(msgspec.Struct, frozen=True, tag="answer"):
    """Answer a question (``choice`` Allow or Deny; ``by`` who, for the record)."""

    question_id: int
    choice: str
    by: str


class Say(msgspec.Struct, frozen=True, tag="say"):
    """A line typed in an interactive chat (:func:`kesoku.host.chat_commands.say`).

    It answers the oldest open question when it is an answer (``y``, ``n``) and one is open, else
    it is posted.
    """

    text: str
    by: str


class Command(msgspec.Struct, frozen=True, tag="command"):
    """Run a session command (:data:`kesoku.host.chat_commands.COMMANDS`) on the attached session.

    ``busy``: a turn of the chat's runs.
    """

    name: str
    args: str = ""
    busy: bool = False


class Switch(msgspec.Struct, frozen=True, tag="switch"):
    """Leave the attached session for a new one (``/new``); ``delete``: delete it (``/clear``)."""

    delete: bool = False


# -- daemon → client ------------------------------------------------------------------------------


class Attached(msgspec.Struct, frozen=True, tag="attached"):
    """The session is held by the daemon; log frames start after ``last_message_id``.

    ``backend`` is the session's ``provider/model``; ``dropped``, after a ``Switch``, says the
    session left was deleted (nothing was said in it, or ``delete`` asked it).
    """

    session_id: str
    last_message_id: int
    pid: int
    protocol: int = PROTOCOL
    backend: str = ""
    title: str | None = None
    workspace: str = ""
    dropped: bool = False


class Refused(msgspec.Struct, frozen=True, tag="refused"):
    """The request cannot be served; ``error`` is the one line to show (exit 2)."""

    error: str


class Posted(msgspec.Struct, frozen=True, tag="posted"):
    """The question is stored as message ``message_id`` (0: a ``Say`` that answered a question)."""

    message_id: int


class Reply(msgspec.Struct, frozen=True, tag="reply"):
    """A ``Command``'s lines ``(text, style)``; ``posted``: the message it sent, else 0."""

    lines: list[tuple[str, str]]
    posted: int = 0


class Log(msgspec.Struct, frozen=True, tag="log"):
    """The session's messages stored since the last log frame, in id order."""

    messages: list[Message]


class Gap(msgspec.Struct, frozen=True, tag="gap"):
    """Live events were lost (the client fell behind): read the log, show deltas again later."""


ToDaemon = Attach | Post | Stop | Answer | Say | Command | Switch
ToClient = Attached | Refused | Posted | Reply | Log | Gap | TurnEvent

_encoder = msgspec.msgpack.Encoder()
_to_daemon = msgspec.msgpack.Decoder(ToDaemon)
_to_client = msgspec.msgpack.Decoder(ToClient)


class FrameError(Exception):
    """A frame that cannot be read: too long, or not one this protocol knows."""


def encode(frame: ToDaemon | ToClient) -> bytes:
    """One frame, its length header included."""
    body = _encoder.encode(frame)
    return _HEADER.pack(len(body)) + body


class FrameReader:
    """Cuts a byte stream into frames; feed it what the socket returns.

    Args:
        to_client: Decode the daemon's frames (the client's side); False: the client's frames.
        max_bytes: The largest frame accepted (change :attr:`max_bytes` as the peer is trusted
            more).
    """

    def __init__(self, *, to_client: bool, max_bytes: int = MAX_FRAME_BYTES) -> None:
        self._decoder = _to_client if to_client else _to_daemon
        self._buffer = bytearray()
        self.max_bytes = max_bytes

    def feed(self, data: bytes) -> Iterator[ToDaemon | ToClient]:
        """The frames ``data`` completes.

        Raises:
            FrameError: A frame over :attr:`max_bytes` or not of this protocol.
        """
        self._buffer += data
        while len(self._buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._buffer)
            if size > self.max_bytes:
                raise FrameError(f"a frame of {size:,} bytes (the most is {self.max_bytes:,})")
            end = _HEADER.size + size
            if len(self._buffer) < end:
                return
            body = bytes(self._buffer[_HEADER.size : end])
            del self._buffer[:end]
            try:
                yield self._decoder.decode(body)
            except msgspec.DecodeError as exc:
                raise FrameError(f"an unreadable frame: {exc}") from None


def socket_path(db_path: str | os.PathLike[str]) -> Path:
    """Where the daemon serving ``db_path`` listens: ``<database>.sock``, beside it."""
    db = Path(db_path).expanduser().absolute()
    return db.with_name(db.name + ".sock")


@contextlib.contextmanager
def short_address(path: Path) -> Iterator[str]:
    """An address for ``path`` that fits ``sockaddr_un``, for ``bind`` or ``connect``.

    A longer path is reached through ``/proc/self/fd/N/<name>``, N a descriptor of its folder
    (open while the context lasts): the kernel resolves the folder, so the socket is the same file.

    Raises:
        OSError: The folder cannot be opened.
    """
    if len(os.fsencode(path)) <= SUN_PATH_MAX:
        yield str(path)
        return
    folder = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{folder}/{path.name}"
    finally:
        os.close(folder)
