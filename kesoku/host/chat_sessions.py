"""The sessions of ``kesoku chat``: a new or continued terminal session, held by one process.

The terminal adapter opens them for a chat it runs itself; the daemon's control socket
(:mod:`kesoku.host.control_server`) for a chat it serves.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from typing import TYPE_CHECKING

from kesoku.gateway import make_workspace
from kesoku.host.build import INTERACTIVE_ADAPTER
from kesoku.vocab.errors import OperatorError

if TYPE_CHECKING:
    from kesoku.gateway import Gateway
    from kesoku.vocab.model import Session


def open_session(gateway: Gateway, session_id: str | None, *, llm: str | None = None) -> Session:
    """A new terminal session, or the terminal session ``--session`` names (id or unique prefix).

    ``llm`` is the backend of a new session (``kesoku chat --llm`` through the daemon).

    The session is held (:mod:`kesoku.store.locks`) from here on, so no other process answers it.

    Raises:
        OperatorError: No such session, an ambiguous prefix, a session of another adapter (the
            daemon answers those), a session another Kesoku process is running, or a workspace
            folder that cannot be made.
    """
    if session_id is None:
        session = gateway.open_session(INTERACTIVE_ADAPTER, f"tty-{uuid.uuid4().hex}", llm=llm)
        try:
            return hold(gateway, session)
        except BaseException:  # refused, or Ctrl-C: nothing was said in it
            discard_if_empty(gateway, session)
            raise
    from kesoku.vocab.errors import AmbiguousSessionError, UnknownSessionError

    try:
        session = gateway.resolve_session(session_id)
    except AmbiguousSessionError as exc:
        raise OperatorError(f"--session {session_id}: {exc}") from None
    except UnknownSessionError as exc:
        raise OperatorError(
            f"--session {session_id}: {exc} (/sessions in kesoku chat lists them)"
        ) from None
    if session.adapter != INTERACTIVE_ADAPTER:
        raise OperatorError(
            f"--session {session_id}: a {session.adapter} session; "
            "kesoku chat continues terminal sessions only"
        )
    make_workspace(session.workspace)
    return hold(gateway, session)


def discard_if_empty(gateway: Gateway, session: Session) -> bool:
    """Delete a session this process opened if nothing was ever said in it.

    A chat left before its first message (Ctrl-C while it starts, Ctrl-D, ``/new``) would
    otherwise leave an empty "untitled" session in every list. A session that holds any message
    (another process may post into it) or that a schedule names is kept, and so is a workspace
    folder someone put files in.

    Args:
        gateway: The gateway of the session's database.
        session: A session this process created (never one it was asked to continue).

    Returns:
        True when the session was deleted (or was already gone).
    """
    store = gateway.store
    # count_turns first: a long conversation is kept without reading its history.
    if store.count_turns(session.id) or store.history(session.id) or gateway.schedules_of(session):
        return False
    # Two statements, not one transaction: what posts into a terminal session is the process
    # holding it (this one, done posting) or a schedule that names it (checked above).
    store.delete_session(session.id)
    with contextlib.suppress(OSError):  # rmdir, not rmtree: only an empty folder goes
        os.rmdir(session.workspace)
    return True


def hold(gateway: Gateway, session: Session) -> Session:
    """Hold ``session`` for this process (before its first message is posted, so no other takes it).

    Raises:
        OperatorError: Another Kesoku process is running the session, or its lock file cannot be
            made.
    """
    try:
        held = gateway.locks.acquire(session.id)
    except OSError as exc:
        where = exc.filename or gateway.locks.folder
        raise OperatorError(
            f"cannot lock session {session.id[:8]}: {where}: {exc.strerror or exc} "
            "(workspace.sessions_dir)"
        ) from None
    if not held:
        pid = gateway.locks.holder(session.id)
        by = f" (pid {pid})" if pid is not None else ""
        raise OperatorError(
            f"--session {session.id[:8]}: another Kesoku process{by} is running this session; "
            "try again when it is done, or start a new session"
        )
    return session


async def next_session(
    gateway: Gateway, previous: Session, *, opened: bool, delete: bool, llm: str | None = None
) -> tuple[Session, bool]:
    """A new terminal session in place of ``previous``, for a chat that leaves it (``/new``).

    The new one is held before ``previous`` is let go (its worker, if one still runs, holds it
    until it ends).

    Args:
        gateway: The gateway of the sessions' database.
        previous: The session the chat leaves.
        opened: The chat opened ``previous`` (rather than continuing it): it is deleted if nothing
            was said in it.
        delete: Delete ``previous`` whatever it holds (``/clear``, after the user said yes).
        llm: The new session's backend (the chat's ``--llm``).

    Returns:
        The new session, and whether ``previous`` was deleted.

    Raises:
        OperatorError: The new session's lock or workspace folder cannot be made.
    """
    session = open_session(gateway, None, llm=llm)
    gateway.locks.release(previous.id)
    if delete:
        await gateway.delete_session(previous.id)
        return session, True
    return session, opened and discard_if_empty(gateway, previous)
