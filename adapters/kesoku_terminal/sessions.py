"""The terminal's sessions: a new or continued ``kesoku chat`` session, held by this process."""

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


def open_session(gateway: Gateway, session_id: str | None) -> Session:
    """A new terminal session, or the terminal session ``--session`` names (id or unique prefix).

    The session is held (:mod:`kesoku.store.locks`) from here on, so no other process answers it.

    Raises:
        OperatorError: No such session, an ambiguous prefix, a session of another adapter (the
            daemon answers those), a session another Kesoku process is running, or a workspace
            folder that cannot be made.
    """
    if session_id is None:
        session = gateway.open_session(INTERACTIVE_ADAPTER, f"tty-{uuid.uuid4().hex}")
        try:
            return hold(gateway, session)
        except OperatorError:  # nothing was said in it: leave no empty "untitled" session behind
            gateway.store.delete_session(session.id)
            with contextlib.suppress(OSError):
                os.rmdir(session.workspace)
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
