"""The terminal adapter behind ``kesoku chat`` (found through the ``kesoku.adapters`` entry point).

It is never enabled in the daemon: a daemon under systemd has no terminal, and terminal sessions
belong to the ``kesoku chat`` process that opened them. ``kesoku chat`` calls :func:`chat`.
Importing this package is cheap: the one-shot and interactive modules load on use.
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
) -> int:
    """Answer one prompt, or hold a conversation (see :func:`kesoku_terminal.app.chat`)."""
    from kesoku_terminal.app import chat as run_chat

    return run_chat(
        config, config_file=config_file, prompt=prompt, session_id=session_id, llm_name=llm_name
    )
