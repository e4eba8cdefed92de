"""``kesoku mcp list``: each MCP server of kesoku.toml, whether it connects, and what it offers."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from cyclopts import Parameter

if TYPE_CHECKING:
    from kesoku.config.settings import Config, McpConfig
    from kesoku.mcp.manager import ServerStatus
    from kesoku.tools.sandbox import Sandbox

DESCRIPTION_WIDTH = 70
"""Characters of a description shown."""


def list_servers(
    *,
    config: Annotated[Path | None, Parameter(name=["--config", "-c"])] = None,
    timeout: Annotated[float, Parameter(name="--timeout")] = 30.0,
) -> None:
    """Connect to each enabled MCP server once and show its state, tools, prompts and resources.

    Servers are the [[mcp.servers]] tables of kesoku.toml; a tool is offered to the model as
    <server>__<tool> (characters other than letters, digits, _ and - become _; a name over 64
    characters is cut and ends with a hash). All servers are tried at once, each within its own
    timeout_s (at most --timeout), and each one's lines are printed as soon as it connected or
    failed: servers are listed in the order they answered, disabled ones last. A server that
    cannot be started or reached shows why (no answer within its timeout, the last line it wrote
    on stderr, lines on stdout that are not JSON-RPC). Exit 0 when every enabled server
    connected, 1 when one did not, 2 with one line when the config is bad.

    Args:
        config: The TOML file. Default: $KESOKU_CONFIG, else ./kesoku.toml, else built-in defaults.
        timeout: The most seconds a server gets to start, pass the handshake and list its tools;
            one whose timeout_s is shorter gets its timeout_s.
    """
    import trio

    from kesoku.config.settings import default_config_path, load_config

    path = config if config is not None else default_config_path()
    cfg = load_config(path)
    if not cfg.mcp.servers:
        print(
            "no MCP servers configured: add a [[mcp.servers]] table to kesoku.toml "
            "(name, transport, command or url)"
        )
        return
    # Failures are in the table below; the log lines would say the same thing a second time.
    logging.getLogger("kesoku.mcp").addHandler(logging.NullHandler())
    logging.getLogger("kesoku.mcp").propagate = False
    statuses = trio.run(probe, cfg.mcp, timeout, _sandbox(cfg, path), _show)
    if any(s.state not in ("connected", "disabled") for s in statuses):
        raise SystemExit(1)


def _show(status: ServerStatus) -> None:
    # flushed: a pipe would otherwise hold the lines until the slowest server is done
    print("\n".join(render(status)), flush=True)


def _sandbox(cfg: Config, path: Path | None) -> Sandbox | None:
    """The daemon's sandbox, for the servers with ``sandbox = true`` (None when no server asks)."""
    if not any(getattr(server, "sandbox", False) for server in cfg.mcp.servers):
        return None
    from kesoku.tools.paths import PathGates
    from kesoku.tools.sandbox import Sandbox

    return Sandbox.from_config(cfg, PathGates.from_config(cfg, config_file=path))


async def probe(
    config: McpConfig,
    timeout_s: float,
    sandbox: Sandbox | None = None,
    show: Callable[[ServerStatus], None] | None = None,
) -> list[ServerStatus]:
    """Connect every enabled server once, all at once, then stop them.

    Args:
        config: The servers.
        timeout_s: The most a server gets to start, pass the handshake and list its tools; a
            server's own ``timeout_s`` when shorter.
        sandbox: For the servers with ``sandbox = true``.
        show: Called with each server's status as soon as its attempt ended (connected or
            failed), then with each disabled server's.

    Returns:
        The statuses in the order they were shown.

    Every server is stopped before it returns: a stdio server gets 2 s to leave once its stdin
    closes, then the SDK terminates it.
    """
    import math

    import trio

    from kesoku.mcp.manager import McpManager, ServerStatus

    send, receive = trio.open_memory_channel[ServerStatus](math.inf)
    manager = McpManager(
        config,
        connect_timeout_s=timeout_s,
        connect_timeouts={s.name: min(s.timeout_s, timeout_s) for s in config.servers},
        startup_wait_s=0.0,
        sandbox=sandbox,
        on_first_try=send.send_nowait,
    )
    enabled = sum(1 for s in config.servers if s.enabled)
    statuses: list[ServerStatus] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(manager.serve)
        # Each server's first attempt ends within its timeout (plus the SDK's bounded stop of a
        # stdio server that did not answer), so this loop ends.
        while len(statuses) < enabled:
            statuses.append(await receive.receive())
            if show is not None:
                show(statuses[-1])
        for status in manager.statuses():
            if status.state == "disabled":
                statuses.append(status)
                if show is not None:
                    show(status)
        nursery.cancel_scope.cancel()
    return statuses


def _cut(text: str) -> str:
    return text if len(text) <= DESCRIPTION_WIDTH else text[: DESCRIPTION_WIDTH - 1] + "…"


def render(status: ServerStatus) -> list[str]:
    """A server's lines: a heading, then its tools, prompts and resources indented."""
    if status.state == "connected":
        offers = [f"{len(status.tools)} tool(s)", f"{len(status.prompts)} prompt(s)"]
        if status.resources:
            offers.append("resources (list_resources, read_resource)")
        state = f"connected: {', '.join(offers)}"
    elif status.state == "failed":
        state = f"failed: {status.error}"
    else:
        state = status.state
    lines = [f"{status.name} ({status.transport}): {state}"]
    width = max((len(name) for name, _ in status.tools), default=0)
    lines.extend(f"  {name:<{width}}  {_cut(text)}".rstrip() for name, text in status.tools)
    for name, text, arguments in status.prompts:
        args = " ".join(arg if required else f"[{arg}]" for arg, required in arguments)
        lines.append(
            f"  prompt: /mcp {status.name} {name} {args}".rstrip()
            + (f"  {_cut(text)}" if text else "")
        )
    return lines
