"""``kesoku doctor``: one screen saying what works and what does not, each line with its fix.

The checks are in :mod:`kesoku.host.doctor`; this module prints them, a section as soon as it and
those above it are done, and sets the exit code.
"""

from __future__ import annotations

import logging
import sys
from functools import partial
from pathlib import Path
from typing import Annotated

import msgspec
import trio
from cyclopts import Parameter

from kesoku.config.settings import default_config_path, load_config
from kesoku.host.doctor import TIMEOUT_S, Finding, diagnose, summary
from kesoku.vocab.errors import OperatorError


def doctor(
    *,
    config: Annotated[Path | None, Parameter(name=["--config", "-c"])] = None,
    no_call: Annotated[bool, Parameter(name="--no-call", negative="")] = False,
    timeout: Annotated[float, Parameter(name="--timeout")] = TIMEOUT_S,
    json: Annotated[bool, Parameter(name="--json", negative="")] = False,
) -> None:
    """Check the whole setup: what works, what does not, and for each problem what to do.

    One line per check, marked ok, warn (works, but the line below says what would be better),
    FAIL (does not work: the line below is the fix) or -- (a fact: no database yet, systemd not
    here). In order:

    - config: the file read (-c, else $KESOKU_CONFIG, else ./kesoku.toml, else the defaults).
    - keys: the keys file (~/.config/kesoku/kesoku.env: warns when other users may read it) and
      every credential or endpoint variable set, by name, with where it comes from (the shell, the
      keys file, kesoku.toml); never a value.
    - model: the backend chosen and why, then one short live call to each backend the config uses
      (agent.llm, its fallbacks, channel overrides); --no-call skips the calls.
    - adapters: each enabled one loads, has its extra installed, and its credentials work (the
      Discord bot token, the Google Chat subscription and credentials file).
    - MCP servers: each connects (its tool count), or why it does not.
    - sandbox: whether bubblewrap or Landlock confines the tools here.
    - database: it opens (a missing migration is applied, as any command does), is writable; its
      size and sessions. None yet is fine: the first message makes it.
    - service: for an installed kesoku.service (user or system), the Python and config it runs,
      whether its environment carries the keys this config needs (else the service would answer
      with another model), and whether it is active.

    The checks run at once, each bounded by --timeout. Exit 0 when nothing failed (warnings do
    not fail), 1 when something did, 2 with one line when the config does not load.

    Args:
        config: The TOML file. Default: $KESOKU_CONFIG, else ./kesoku.toml, else built-in defaults.
        no_call: Make no model call (costs nothing, checks less).
        timeout: Seconds one live check may take: a model call, an MCP server's start, systemctl.
        json: Print the findings as a JSON array (mark, what, detail, fix) instead of lines.
    """
    if not timeout > 0:
        raise OperatorError(f"doctor: --timeout {timeout:g}: a number of seconds above 0")
    path = config if config is not None else default_config_path()
    cfg = load_config(path)
    # The report says it all; log lines of the checks (a retried call, an MCP server that failed)
    # would say it twice, out of order.
    for name in ("kesoku", "mcp"):
        logging.getLogger(name).addHandler(logging.NullHandler())
        logging.getLogger(name).propagate = False
    run = partial(
        diagnose,
        cfg,
        path,
        call_model=not no_call,
        timeout_s=timeout,
        on_section=None if json else _show,
    )
    try:
        findings = trio.run(run)
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    if json:
        rows = [
            {"mark": f.mark, "what": f.check.what, "detail": f.check.detail, "fix": f.check.fix}
            for f in findings
        ]
        sys.stdout.write(msgspec.json.encode(rows).decode() + "\n")
    else:
        print(f"\n{summary(findings)}")
    raise SystemExit(0 if all(f.check.ok for f in findings) else 1)


def _show(findings: list[Finding]) -> None:
    for finding in findings:
        for line in finding.lines():
            print(line)
    sys.stdout.flush()
