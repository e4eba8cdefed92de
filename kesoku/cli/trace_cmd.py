"""``kesoku trace SESSION``: a session's or one turn's trajectory as a self-contained HTML page."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

from cyclopts import Parameter

from kesoku.cli.sessions_cmd import (
    ConfigOption,
    find_session,
    open_store,
    output_gates,
    write_output,
)


def trace(
    session: str,
    /,
    *,
    turn: Annotated[int | None, Parameter(name=["--turn", "-t"])] = None,
    output: Annotated[
        Path | None, Parameter(name=["--output", "-o"], allow_leading_hyphen=True)
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Write the trajectory of a session as one HTML page that works offline.

    The page shows the user's messages, each model call with its timing and token usage, thoughts,
    tool calls with their arguments and results, compactions, and how each turn ended: done, step
    limit, spend cap, repeating, interrupted, stopped, failed or running. Open it in any browser;
    it needs no network and no emoji font.

    Args:
        session: The session (id or unique prefix; kesoku sessions list shows them).
        turn: Only this turn (1 is the first, -1 the last).
        output: The file to write (its folder must exist); "-" writes to stdout. Default:
            kesoku-trace-SESSION_ID[-turn-N].html here.
        config: The TOML file. Default: $KESOKU_CONFIG, else ./kesoku.toml, else built-in defaults.
    """
    from kesoku.observe.trace import render_trace
    from kesoku.vocab.errors import OperatorError

    with open_store(config) as (cfg, store):
        gates = output_gates(cfg, config)
        s = find_session(store, session)
        try:
            page = render_trace(store, s.id, turn=turn)
        except LookupError as exc:
            raise OperatorError(f"trace {s.id}: {exc}") from None
    # A lone surrogate in stored text cannot be encoded: replace it rather than fail the whole page.
    data = page.encode("utf-8", "replace")
    if output is not None and str(output) == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    path = output or Path(f"kesoku-trace-{s.id}{'' if turn is None else f'-turn-{turn}'}.html")
    write_output(path, data, gates)
    print(f"wrote {path} ({len(data) // 1024:,} KiB)")
