"""``kesoku chat`` in its own process: open the store, gateway and runtime, then ask or converse.

The runtime here answers only the sessions this process opened (a
:class:`~kesoku.host.build.ScopedDispatcher`), and a daemon on the same database leaves terminal
sessions alone, so a chat and ``kesoku start`` can share one ``kesoku.db`` without both answering a
message.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from kesoku.host import interrupt
from kesoku.host.build import build_runtime
from kesoku.host.chat_sessions import discard_if_empty, open_session
from kesoku.vocab.errors import OperatorError
from kesoku_terminal.oneshot import run_oneshot
from kesoku_terminal.plain import EXIT_STOPPED, NOT_ASKED

if TYPE_CHECKING:
    from kesoku.agent.runtime import Runtime
    from kesoku.config.settings import Config
    from kesoku.vocab.model import Session


def chat(
    config: Config,
    *,
    config_file: Path | None,
    question: str | None,
    session_id: str | None,
    llm_name: str | None,
) -> int:
    """Answer one question, or hold a conversation, with a runtime in this process.

    Args:
        config: The loaded config.
        config_file: The file it came from (the agent's tools may not read it).
        question: The one-shot question (stdin already appended); None: interactive.
        session_id: A terminal session (id or unique prefix) to continue; None: a new session.
        llm_name: A backend overriding ``agent.llm``.

    Returns:
        The exit code: 0 answered, 1 the turn failed, 130 stopped with Ctrl-C.

    Raises:
        OperatorError: An unknown session, or a config, database or backend problem (one line,
            exit 2).
    """
    from kesoku.store import Store

    _log_warnings_only()
    db_path = Path(config.workspace.db_path)
    new_database = not db_path.exists()
    store: Store | None = None
    session: Session | None = None
    try:
        try:
            store = Store(db_path)
            serving: set[str] = set()
            rt = build_runtime(
                config,
                store,
                config_file=config_file,
                llm_name=llm_name,
                serves=serving.__contains__,
                interactive=True,
            )
            session = open_session(rt.gateway, session_id)
        except (OperatorError, KeyboardInterrupt):
            # A setup error, or Ctrl-C while setting up, must not leave an empty kesoku.db behind.
            if new_database:
                if store is not None:
                    store.close()
                    store = None
                for suffix in ("", "-wal", "-shm"):
                    with contextlib.suppress(OSError):  # a folder that could not be made
                        db_path.with_name(db_path.name + suffix).unlink(missing_ok=True)
            raise
        serving.add(session.id)
        if config.sandbox.mode == "off" and (config.shell.enabled or config.run_code.enabled):
            logging.getLogger("kesoku.chat").warning(
                '[sandbox] mode = "off": the shell and run_code run with your own access '
                "to every file"
            )
        return _run(rt, session, question, serving, resumed=session_id is not None)
    finally:
        if store is not None:
            if session is not None:
                if session_id is None:  # a session this chat opened
                    discard_if_empty(rt.gateway, session)  # no-op unless nothing was said in it
                rt.gateway.locks.close()  # its sessions' locks, and their pid files
            store.close()


def _run(
    rt: Runtime, session: Session, question: str | None, serving: set[str], *, resumed: bool
) -> int:
    """Ask ``question`` or converse, in trio; the exit code.

    Ctrl-C before the chat listens for it (while its runtime starts) ends it with 130: trio raises
    ``KeyboardInterrupt`` in the task it interrupted, inside the nurseries' exception groups.
    """
    code = EXIT_STOPPED
    try:
        if interrupt.restore():  # a Ctrl-C Python could not raise while the chat started
            raise KeyboardInterrupt
        if question is not None:
            code = trio.run(run_oneshot, rt, session, question)
        else:
            from kesoku_terminal.interactive import run_interactive  # prompt-toolkit, rich

            code = trio.run(run_interactive, rt, session, serving, resumed)
    except* KeyboardInterrupt:
        if question is not None:
            print(NOT_ASKED, file=sys.stderr)
    return code


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
