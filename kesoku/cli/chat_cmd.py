"""``kesoku chat``: its options and help (cyclopts); :mod:`kesoku.cli.chat_run` does the rest.

Everything heavy loads after parsing: ``kesoku chat --help`` stays light.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from cyclopts import Parameter

from kesoku.config.settings import Backend


def chat(
    prompt: str | None = None,
    /,
    *,
    session: Annotated[str | None, Parameter(name=["--session", "-s"])] = None,
    llm: Annotated[Backend | None, Parameter(name="--llm")] = None,
    config: Annotated[Path | None, Parameter(name=["--config", "-c"])] = None,
    local: Annotated[bool, Parameter(name="--local", negative="")] = False,
    verbose: Annotated[bool, Parameter(name=["--verbose", "-v"], negative="")] = False,
) -> None:
    """Talk to the agent in the terminal, or ask one question.

    With PROMPT: the answer streams to stdout; thoughts and tool activity go to stderr, and last
    the line to go on with (`continue with: kesoku chat --session ID`); exit 0, or 1 with one line
    on stderr saying why when the turn fails, 2 when the config or the database cannot be used (a
    database locked past its busy timeout), or 130 after Ctrl-C. Piped stdin is appended to the
    prompt: `git diff | kesoku chat "review this"`. Without PROMPT on a terminal: an interactive
    conversation (/help lists its commands).

    Where it runs: when `kesoku start` serves the same database, the chat (one-shot or
    interactive) is answered by that daemon (its model, tools and kesoku.toml; no SDK loads here,
    so it starts at once); otherwise, with --local, or for --llm with --session, the runtime runs
    in this process. -v says which.

    Args:
        prompt: The question. Omit it for an interactive conversation.
        session: Continue a terminal session (its id, or a unique prefix of it); default: a new one.
        llm: A model backend overriding agent.llm for this chat.
        config: The TOML file. Default: $KESOKU_CONFIG, else ./kesoku.toml, else built-in defaults.
        local: Run the runtime in this process even when a daemon serves the database.
        verbose: Say on stderr whether the daemon or this process answers.
    """
    from kesoku.cli.chat_run import run_chat

    raise SystemExit(
        run_chat(prompt, session=session, llm=llm, config=config, local=local, verbose=verbose)
    )
