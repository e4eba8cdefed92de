"""/restart: recycle the process via systemd when Kesoku runs as a service, else in place (execv).

``kesoku service restart`` is started detached and not waited for: systemd stops this process
(SIGTERM, a graceful stop) and starts a new one. Outside systemd (no ``INVOCATION_ID``, which
systemd sets for every unit it starts: systemd.exec(5), "Environment Variables in Spawned
Processes"), or when the command cannot be started or fails at once, the process replaces itself
with ``os.execv``.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Mapping

import trio
from kesoku.host.service import Scope

log = logging.getLogger(__name__)

FAIL_FAST_S = 3.0
"""A restart command still running after this long is taken as accepted (systemd is stopping us)."""


def service_scope(env: Mapping[str, str]) -> Scope | None:
    """The systemd scope Kesoku runs under, or None when it was not started by systemd."""
    if not env.get("INVOCATION_ID"):
        return None
    user = Scope(user=True)
    return user if user.unit_path(env).exists() else Scope(user=False)


def restart_command(scope: Scope) -> list[str]:
    """The command ``<python> -P -m kesoku service restart --user|--system``.

    ``<python>`` is ``sys.executable``: the same interpreter and install as this one. ``-P``: the
    daemon's working folder, where the agent may write, must not shadow a module it imports.
    """
    return [
        sys.executable,
        "-P",
        "-m",
        "kesoku",
        "service",
        "restart",
        "--user" if scope.user else "--system",
    ]


def exec_argv() -> list[str]:
    """The argv that starts this process again.

    Built from ``sys.orig_argv``, so the interpreter's own options are kept.
    """
    return [sys.executable, *sys.orig_argv[1:]]


async def restart_process(env: Mapping[str, str] | None = None) -> None:
    """Restart Kesoku: the service when under systemd, else ``os.execv`` of this process.

    Cancellation:
        Cancelling while waiting for the restart command leaves it running (it is detached).
    """
    env = os.environ if env is None else env
    scope = service_scope(env)
    if scope is not None:
        argv = restart_command(scope)
        try:
            # Detached: systemd will stop this process, and the command must outlive it.
            process = await trio.lowlevel.open_process(
                argv, start_new_session=True, stdin=subprocess.DEVNULL
            )
        except OSError as exc:
            log.warning("restart: cannot run %s: %s; restarting in place", " ".join(argv), exc)
        else:
            with trio.move_on_after(FAIL_FAST_S):
                await process.wait()
            if process.returncode in (None, 0):
                log.info("restart: %s accepted", " ".join(argv))
                return
            log.warning(
                "restart: %s exited %s; restarting in place", " ".join(argv), process.returncode
            )
    argv = exec_argv()
    log.info("restart: exec %s", " ".join(argv))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)
