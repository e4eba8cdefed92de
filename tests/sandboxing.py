"""Helpers for tests running real processes in the OS sandbox: the mechanisms here, process hunting.

``MECHANISMS`` parametrizes a test over bubblewrap, Landlock and no sandbox; a mechanism that cannot
work on this machine is skipped with the reason (.ci/run installs bubblewrap with apt-get).
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
import trio

from kesoku.config.settings import SandboxConfig
from kesoku.tools.paths import PathGates
from kesoku.tools.sandbox import Sandbox


def _reason(mode: str) -> str | None:
    probe = Sandbox(SandboxConfig(mode=mode)).probe()  # type: ignore[arg-type]
    return None if probe.mechanism == mode else probe.detail


_REASONS = {mode: _reason(mode) for mode in ("bwrap", "landlock")}
MECHANISMS = [
    *(
        pytest.param(mode, marks=pytest.mark.skipif(reason is not None, reason=f"{mode}: {reason}"))
        for mode, reason in _REASONS.items()
    ),
    "off",
]
"""``[sandbox] mode`` values to parametrize over: each real mechanism, and none."""
CONFINED = MECHANISMS[:2]
"""The real mechanisms only."""

_serial = itertools.count(1)


def sandbox_for(
    mode: str,
    tmp_path: Path,
    *,
    gates: PathGates | None = None,
    network: bool = False,
    env: tuple[str, ...] = (),
) -> Sandbox:
    """A sandbox of ``mode`` whose home folder and sessions folder are under ``tmp_path``."""
    gates = gates if gates is not None else PathGates(home=tmp_path / "home")
    config = SandboxConfig(mode=mode, network=network, env=env)  # type: ignore[arg-type]
    return Sandbox(config, gates, sessions_dir=tmp_path / "sessions")


def marker() -> str:
    """A unique ``sleep`` duration (``30.00123``): its processes are found by their command line."""
    return f"30.{os.getpid() % 1000:03d}{next(_serial):02d}"


def running(mark: str, *, exact: bool = False) -> list[int]:
    """Pids of the live processes (zombies excluded) whose command line holds ``mark``.

    Args:
        mark: See :func:`marker`.
        exact: Only ``sleep MARK`` itself, not the shells and sandbox wrappers naming it.
    """
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        wanted = (
            cmdline == f"sleep {mark} " if exact else mark in cmdline and "pytest" not in cmdline
        )
        if wanted and state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


async def wait_running(mark: str, timeout_s: float = 10.0) -> list[int]:
    """Wait until a process holding ``mark`` runs; its pids."""
    with trio.fail_after(timeout_s):
        while not (pids := running(mark)):  # noqa: ASYNC110 (another process starts it)
            await trio.sleep(0.02)
    return pids


async def wait_gone(mark: str, timeout_s: float = 5.0) -> None:
    """Wait until no process holding ``mark`` runs (fails after ``timeout_s``)."""
    with trio.fail_after(timeout_s):
        while running(mark):  # noqa: ASYNC110 (the kernel ends them; there is nothing to wait on)
            await trio.sleep(0.02)
