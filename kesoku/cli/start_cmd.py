"""``kesoku start``: run the daemon in the foreground (systemd runs exactly this)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from cyclopts import Parameter


def start(*, config: Annotated[Path | None, Parameter(name=["--config", "-c"])] = None) -> None:
    """Run Kesoku in the foreground: the agent runtime and enabled adapters (Discord, Google Chat).

    Logs one line per event on stderr (journald-friendly under systemd). SIGTERM or Ctrl-C stops
    gracefully: model calls are cut, running tools may finish within agent.shutdown_grace_s (a
    second signal kills them), and cut turns resume at the next start. SIGHUP re-reads the config,
    applies what can change live (agent.persona, agent.max_steps_per_turn, agent.worker_idle_s,
    agent.shutdown_grace_s) and names the keys that need a restart. Terminal sessions are left to
    `kesoku chat`.

    Args:
        config: The TOML file. Default: $KESOKU_CONFIG, else ./kesoku.toml, else built-in defaults.
    """
    from kesoku.host.daemon import run

    raise SystemExit(run(config))
