"""``kesoku chat``: open the store, gateway and runtime in this process, then ask or converse.

The runtime here answers only the sessions this process opened (a :class:`~kesoku.daemon.ScopedDispatcher`),
and a daemon on the same database leaves terminal sessions alone, so a chat and ``kesoku start`` can
share one ``kesoku.db`` without both answering a message.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from kesoku.daemon import INTERACTIVE_ADAPTER, build_runtime
from kesoku.errors import OperatorError
from kesoku.gateway import make_workspace

if TYPE_CHECKING:
    from kesoku.config import Config
    from kesoku.gateway import Gateway
    from kesoku.model import Session


def chat(
    config: Config, *, config_file: Path | None, prompt: str | None, session_id: str | None, llm_name: str | None
) -> int:
    """Answer one prompt (given, or piped on stdin) or, on a terminal without one, hold a conversation.

    Args:
        config: The loaded config.
        config_file: The file it came from (the agent's tools may not read it).
        prompt: The question; None: read stdin when it is not a terminal, else interactive.
        session_id: A terminal session (id or unique prefix) to continue; None: a new session.
        llm_name: A backend overriding ``agent.llm``.

    Returns:
        The exit code: 0 answered, 1 the turn failed, 130 stopped with Ctrl-C.

    Raises:
        OperatorError: Nothing to ask, no terminal for the interactive mode, an unknown session, or a
            config, database or backend problem (one line, exit 2).
    """
    from kesoku.store import Store

    interactive = prompt is None and sys.stdin.isatty()
    question = None if interactive else read_question(prompt)
    if interactive and not sys.stdout.isatty():
        raise OperatorError("chat: the interactive mode needs a terminal; give a PROMPT for a one-shot answer")
    _log_warnings_only()
    db_path = Path(config.workspace.db_path)
    new_database = not db_path.exists()
    store = Store(db_path)
    try:
        serving: set[str] = set()
        try:
            rt = build_runtime(
                config,
                store,
                config_file=config_file,
                llm_name=llm_name,
                serves=serving.__contains__,
                interactive=True,
            )
            session = open_session(rt.gateway, session_id)
        except OperatorError:
            if new_database:  # a setup error must not leave an empty kesoku.db behind
                store.close()
                for suffix in ("", "-wal", "-shm"):
                    db_path.with_name(db_path.name + suffix).unlink(missing_ok=True)
            raise
        serving.add(session.id)
        if config.sandbox.mode == "off" and (config.shell.enabled or config.run_code.enabled):
            logging.getLogger("kesoku.chat").warning(
                "[sandbox] mode = \"off\": the shell and run_code run with your own access to every file"
            )
        if question is not None:
            from kesoku_terminal.oneshot import run_oneshot

            return trio.run(run_oneshot, rt, session, question)
        from kesoku_terminal.interactive import run_interactive

        return trio.run(run_interactive, rt, session, serving, session_id is not None)
    finally:
        store.close()


MAX_STDIN_BYTES = 1024 * 1024
"""The most of piped stdin a one-shot question takes: enough for a diff or a log, not a disk image."""


def read_question(prompt: str | None, *, max_stdin_bytes: int = MAX_STDIN_BYTES) -> str:
    """The one-shot question: the prompt, with stdin appended when stdin is not a terminal.

    ``echo text | kesoku chat "summarize"`` asks "summarize", a blank line, then the text.

    Raises:
        OperatorError: Both are empty; or stdin is larger than ``max_stdin_bytes`` or is not text (it
            would be sent to the model as garbage, and a paid model bills for it).
    """
    text = prompt or ""
    if not sys.stdin.isatty():
        data = sys.stdin.buffer.read(max_stdin_bytes + 1)
        if len(data) > max_stdin_bytes:
            raise OperatorError(
                f"chat: stdin is larger than {max_stdin_bytes // 1024} KiB; pipe less (e.g. `head -c 200k`)"
            )
        if b"\0" in data:
            raise OperatorError("chat: stdin is binary (it holds NUL bytes); pipe text")
        piped = data.decode("utf-8", errors="replace")
        if piped.strip():
            text = f"{text}\n\n{piped}" if text.strip() else piped
    if not text.strip():
        raise OperatorError("chat: nothing to ask; give a PROMPT or pipe text on stdin")
    return text


def open_session(gateway: Gateway, session_id: str | None) -> Session:
    """A new terminal session, or the terminal session ``--session`` names (id or unique prefix).

    The session is held (:mod:`kesoku.session_lock`) from here on, so no other process answers it.

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
    from kesoku.store.store import AmbiguousSessionError, UnknownSessionError

    try:
        session = gateway.store.resolve_session(session_id)
    except AmbiguousSessionError as exc:
        raise OperatorError(f"--session {session_id}: {exc}") from None
    except UnknownSessionError as exc:
        raise OperatorError(f"--session {session_id}: {exc} (/sessions in kesoku chat lists them)") from None
    if session.adapter != INTERACTIVE_ADAPTER:
        raise OperatorError(
            f"--session {session_id}: a {session.adapter} session; kesoku chat continues terminal sessions only"
        )
    make_workspace(session.workspace)
    return hold(gateway, session)


def hold(gateway: Gateway, session: Session) -> Session:
    """Hold ``session`` for this process (before its first message is posted, so no other takes it).

    Raises:
        OperatorError: Another Kesoku process is running the session, or its lock file cannot be made.
    """
    try:
        held = gateway.locks.acquire(session.id)
    except OSError as exc:
        where = exc.filename or gateway.locks.folder
        raise OperatorError(
            f"cannot lock session {session.id[:8]}: {where}: {exc.strerror or exc} (workspace.sessions_dir)"
        ) from None
    if not held:
        pid = gateway.locks.holder(session.id)
        by = f" (pid {pid})" if pid is not None else ""
        raise OperatorError(
            f"--session {session.id[:8]}: another Kesoku process{by} is running this session; "
            "try again when it is done, or start a new session"
        )
    return session


class _OneLine(logging.Formatter):
    """``kesoku: message``, without the traceback: the turn already told the user what failed."""

    def format(self, record: logging.LogRecord) -> str:
        return "kesoku: " + " ".join(record.getMessage().split())


def _log_warnings_only() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLine())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
