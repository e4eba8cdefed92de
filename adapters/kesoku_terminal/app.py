"""``kesoku chat``: open the store, gateway and runtime in this process, then ask or converse.

The runtime here answers only the sessions this process opened (a
:class:`~kesoku.host.build.ScopedDispatcher`), and a daemon on the same database leaves terminal
sessions alone, so a chat and ``kesoku start`` can share one ``kesoku.db`` without both answering a
message.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from kesoku.host.build import build_runtime
from kesoku.vocab.errors import OperatorError
from kesoku_terminal.sessions import open_session

if TYPE_CHECKING:
    from kesoku.config.settings import Config


def chat(
    config: Config,
    *,
    config_file: Path | None,
    prompt: str | None,
    session_id: str | None,
    llm_name: str | None,
) -> int:
    """Answer one prompt (given, or piped on stdin), or hold a conversation.

    The conversation is held on a terminal without a prompt.

    Args:
        config: The loaded config.
        config_file: The file it came from (the agent's tools may not read it).
        prompt: The question; None: read stdin when it is not a terminal, else interactive.
        session_id: A terminal session (id or unique prefix) to continue; None: a new session.
        llm_name: A backend overriding ``agent.llm``.

    Returns:
        The exit code: 0 answered, 1 the turn failed, 130 stopped with Ctrl-C.

    Raises:
        OperatorError: Nothing to ask, no terminal for the interactive mode, an unknown session, or
            a config, database or backend problem (one line, exit 2).
    """
    from kesoku.store import Store

    interactive = prompt is None and sys.stdin.isatty()
    question = None if interactive else read_question(prompt)
    if interactive and not sys.stdout.isatty():
        raise OperatorError(
            "chat: the interactive mode needs a terminal; give a PROMPT for a one-shot answer"
        )
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
                '[sandbox] mode = "off": the shell and run_code run with your own access '
                "to every file"
            )
        if question is not None:
            from kesoku_terminal.oneshot import run_oneshot

            return trio.run(run_oneshot, rt, session, question)
        from kesoku_terminal.interactive import run_interactive

        return trio.run(run_interactive, rt, session, serving, session_id is not None)
    finally:
        store.close()


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
