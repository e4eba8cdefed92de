"""``kesoku chat`` once its options are parsed: load the config, hand over to the terminal adapter.

Apart from :mod:`kesoku.cli.chat_cmd` (the options, for cyclopts) so that ``kesoku chat
"question"``, the common one-shot, runs without importing cyclopts at all (:func:`kesoku.cli.main`):
through a running daemon that import would be a third of the chat's time. The adapter is found
through the ``kesoku.adapters`` entry points (the core never imports an adapter package by name).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path


def run_chat(
    prompt: str | None,
    *,
    session: str | None = None,
    llm: str | None = None,
    config: Path | None = None,
    local: bool = False,
    verbose: bool = False,
) -> int:
    """Run ``kesoku chat`` (its options: :func:`kesoku.cli.chat_cmd.chat`); the exit code.

    Raises:
        OperatorError: The config does not load, the terminal adapter is missing, or the chat
            cannot start (one line, exit 2).
    """
    from kesoku.config.settings import default_config_path, load_config, set_config
    from kesoku.host.adapters import ChatAdapter, find_adapter
    from kesoku.vocab.errors import OperatorError

    path = config if config is not None else default_config_path()
    cfg = load_config(path)
    set_config(cfg)
    entry = find_adapter("terminal")
    adapter = entry.load()
    if not isinstance(adapter, ChatAdapter):
        raise OperatorError(f"the terminal adapter ({entry.value}) has no chat(); reinstall kesoku")
    return adapter.chat(
        cfg,
        config_file=path,
        prompt=prompt,
        session_id=session,
        llm_name=llm,
        local=local,
        verbose=verbose,
    )
