"""The terminal adapter behind ``kesoku chat`` (found through the ``kesoku.adapters`` entry point).

It is never enabled in the daemon: a daemon under systemd has no terminal. A terminal session is
answered by the ``kesoku chat`` process that opened it, or by the daemon while a chat it serves is
attached. ``kesoku chat`` calls :func:`chat`. Importing this package is cheap: the one-shot and
interactive modules load on use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    from kesoku.config.settings import Config


def enabled(config: Config) -> bool:
    """Never in the daemon (see the module docstring)."""
    return False


def chat(
    config: Config,
    *,
    config_file: Path | None,
    prompt: str | None,
    session_id: str | None,
    llm_name: str | None,
    local: bool = False,
    verbose: bool = False,
) -> int:
    """Answer one prompt, or hold a conversation; the exit code (see ``kesoku chat --help``).

    The chat goes through the daemon serving the database when one does (a one-shot:
    :mod:`kesoku_terminal.remote`; an interactive chat: :mod:`kesoku_terminal.links`), else, or
    with ``local``, runs in this process (:mod:`kesoku_terminal.app`); so does ``--llm`` with
    ``--session`` (a continued session keeps the daemon's backend).

    Raises:
        OperatorError: Nothing to ask, no terminal for the interactive mode, an unknown session, or
            a config, database or backend problem (one line, exit 2).
    """
    import sys

    from kesoku.vocab.errors import OperatorError
    from kesoku_terminal.plain import read_question

    interactive = prompt is None and sys.stdin.isatty()
    if interactive and not sys.stdout.isatty():
        raise OperatorError(
            "chat: the interactive mode needs a terminal; give a PROMPT for a one-shot answer"
        )
    question = None if interactive else read_question(prompt)
    if local:
        why = "--local"
    elif llm_name is not None and session_id is not None:
        why = "--llm with --session"
    else:
        if question is None:
            from kesoku_terminal.interactive import chat_with_daemon

            code = chat_with_daemon(config, session_id, llm_name, verbose=verbose)
        else:
            from kesoku_terminal.remote import ask_daemon

            code = ask_daemon(
                config, question, session_id=session_id, llm_name=llm_name, verbose=verbose
            )
        if code is not None:
            return code
        why = "no daemon serves the database"
    if verbose:  # which files: a chat started in another folder finds another config and database
        print(
            f"kesoku: running in this process ({why}); config "
            f"{config_file or 'none (the defaults)'}, database {config.workspace.db_path}",
            file=sys.stderr,
            flush=True,
        )
    from kesoku_terminal.app import chat as run_chat

    return run_chat(
        config, config_file=config_file, question=question, session_id=session_id, llm_name=llm_name
    )
