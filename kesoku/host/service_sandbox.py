"""The sandbox of ``kesoku.service``: systemd.exec(5) settings that keep the tools' sandbox working.

Every tool process Kesoku starts runs in a sandbox of its own, nested in the unit's: bubblewrap
(``bwrap``, unprivileged: it creates user, mount, pid, network, IPC, UTS and cgroup namespaces,
mounts a fresh ``/proc``, pivots into the new root and brings up ``lo`` over netlink), else Landlock
(the ``landlock_*`` system calls). The unit restricts everything but that: the file system is
read-only except the folders the daemon writes (:func:`state_paths`); there are no capabilities,
devices, kernel modules, clock, hostname or exotic sockets; system calls are an allow list
(``@system-service``, ``@mount``, ``landlock_*``). Why a setting is there or absent is written as
comments in the unit itself, which ``kesoku service install --dry-run`` prints.

A user unit gets the same sandbox inside a user namespace (``PrivateUsers=yes``): the user manager
has no privileges, and systemd.exec(5) makes most of these settings depend on that namespace there.
It needs unprivileged user namespaces, which bwrap needs anyway; where the machine refuses them
(:func:`user_namespaces_work`, checked at install), a user unit keeps only the settings that need
none (system call filter, no new privileges, address families, umask, limits) and a system unit
loses ``PrivateUsers=`` alone. ``ProtectProc=`` is for system units only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kesoku.config.settings import Config

PROBE_TIMEOUT_S = 10.0
"""Longest wait for the user-namespace probe (``unshare``; it takes a few ms)."""
LIMIT_NOFILE = 16384
"""Open files per process (soft and hard): sessions, sockets, MCP pipes with room; bounds a leak."""


@dataclass(frozen=True, slots=True)
class StatePaths:
    """The folders the service writes, and those it only reads although they lie inside one.

    Attributes:
        writable: The database's folder (SQLite writes ``-wal``, ``-shm`` and ``-journal`` beside
            the file), ``workspace.sessions_dir`` (session workspaces, turn logs, ``.locks``) and
            ``agent.project_dir`` when set; absolute, symlinks resolved, none inside another.
        read_only: ``workspace.skills_dir`` when it lies inside a writable folder (the default:
            both beside the config file).
    """

    writable: tuple[Path, ...]
    read_only: tuple[Path, ...]


def state_paths(cfg: Config) -> StatePaths:
    """What the service must be able to write, from a loaded config (its paths already absolute).

    Args:
        cfg: The config the service will run (see :func:`kesoku.config.settings.load_config`).

    Returns:
        The writable folders, and the read-only ones inside them.
    """
    wanted = [Path(cfg.workspace.db_path).parent, Path(cfg.workspace.sessions_dir)]
    if cfg.agent.project_dir:
        wanted.append(Path(cfg.agent.project_dir))
    writable = _outermost(_real(p) for p in wanted)
    skills = _real(Path(cfg.workspace.skills_dir))
    read_only = (skills,) if any(skills.is_relative_to(w) for w in writable) else ()
    return StatePaths(writable=writable, read_only=read_only)


def sandbox_lines(
    paths: StatePaths, *, user: bool, quote: Callable[[str], str], namespaces: bool = True
) -> list[str]:
    """The sandbox's ``[Service]`` lines, comments included.

    Args:
        paths: What the service writes (:func:`state_paths`).
        user: For a user unit (else a system unit).
        quote: Renders one path as a unit-file word (quoting, ``%`` escaping).
        namespaces: Whether the service may have a user namespace (:func:`user_namespaces_work`).
            Without one a user unit keeps only the settings a user manager applies without
            privileges (no file system, device or capability settings), and a system unit loses
            ``PrivateUsers=`` alone.

    Returns:
        Lines without newlines, the first one blank.
    """
    lines = [
        "",
        "# Sandbox. Kesoku's tools run in a sandbox of their own nested in this one (bubblewrap,",
        "# else Landlock), so what bubblewrap needs stays allowed: user, mount, pid and network",
        "# namespaces, mount(2) and pivot_root(2), netlink, and the landlock_* system calls.",
    ]
    if not namespaces:
        lines.append("# This machine refused a user namespace at install: no PrivateUsers=.")
    if namespaces or not user:
        lines += _namespaced(paths, user=user, quote=quote, private_users=namespaces)
    else:
        lines += [
            "# A user manager applies the file system, device and capability settings only inside",
            "# one, so they are left out here; `kesoku service install --system` has them.",
        ]
    lines += [
        "NoNewPrivileges=yes",
        *(["KeyringMode=private"] if user else []),  # already the default of a system service
        "RestrictSUIDSGID=yes",
        "RestrictRealtime=yes",
        "LockPersonality=yes",
        "# AF_NETLINK: bubblewrap brings up lo in a tool's network namespace.",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK",
        "SystemCallArchitectures=native",
        "# @mount: bubblewrap builds a tool's view of the files and pivots into it.",
        "SystemCallFilter=@system-service @mount",
        "# Landlock, the fallback sandbox (no group holds its calls in systemd 252).",
        "SystemCallFilter=landlock_add_rule landlock_create_ruleset landlock_restrict_self",
        "SystemCallFilter=~@clock @cpu-emulation @debug @module @obsolete @raw-io @reboot @swap",
        "# Tools run any program: a refused call fails with EPERM rather than killing it.",
        "SystemCallErrorNumber=EPERM",
        "UMask=0077",
        f"LimitNOFILE={LIMIT_NOFILE}",
        "# A core dump of the daemon would hold its API keys.",
        "LimitCORE=0",
        "# Not set, on purpose:",
        "# - RestrictNamespaces=: bubblewrap creates user, mount, pid, net, ipc, uts, cgroup ones.",
        "# - ProtectKernelTunables=, ProtectKernelLogs=, ProcSubset=pid: they cover parts of",
        "#   /proc, which can make the kernel refuse bubblewrap a /proc of its own; without",
        "#   capabilities the service can neither write /proc/sys nor read the kernel log.",
        "# - MemoryDenyWriteExecute=: every tool inherits it; JIT runtimes (node, java) need W+X.",
        "# - PrivateNetwork=, IPAddressDeny=: the daemon talks to model APIs and chat services.",
    ]
    if not user:
        lines.append("# - RemoveIPC=: User= is a login user, whose other IPC objects it removes.")
    return lines


def _namespaced(
    paths: StatePaths, *, user: bool, quote: Callable[[str], str], private_users: bool
) -> list[str]:
    """The settings that need a mount namespace (a user namespace too, in a user unit)."""
    lines = []
    if user:
        lines += [
            "# A user manager has no privileges: the settings below work inside a user namespace",
            "# of the unit's own (unprivileged user namespaces, which bubblewrap needs too).",
        ]
    if private_users:
        lines.append("PrivateUsers=yes")
    lines += [
        "ProtectSystem=strict",
        "ProtectHome=read-only",
        "# What the daemon writes: made at install; one missing later is skipped (-).",
        *(f"ReadWritePaths={quote('-' + os.fspath(p))}" for p in paths.writable),
    ]
    if paths.read_only:
        lines.append("# Kesoku only reads its skills, even inside a writable folder.")
        lines += [f"ReadOnlyPaths={quote('-' + os.fspath(p))}" for p in paths.read_only]
    lines += ["PrivateTmp=yes", "PrivateDevices=yes", "PrivateMounts=yes"]
    if not user:  # systemd.exec(5): for system services only
        lines.append("ProtectProc=invisible")
    return [
        *lines,
        "ProtectKernelModules=yes",
        "ProtectControlGroups=yes",
        "ProtectClock=yes",
        "ProtectHostname=yes",
        "CapabilityBoundingSet=",
    ]


def user_namespaces_work() -> bool:
    """Whether this process may make a user namespace and mount in it, as ``PrivateUsers=`` does.

    util-linux's ``unshare --user --map-root-user --mount`` runs ``mount -t tmpfs`` over ``/tmp``
    in new user and mount namespaces (private mount propagation, its default). It is refused where
    unprivileged user namespaces are off (``user.max_user_namespaces``, a distribution's sysctl, or
    a security module's rule such as Ubuntu's AppArmor restriction, which leaves the namespace
    without capabilities). Run as root for a system unit, it answers for the system manager.

    Returns:
        True when it succeeds within :data:`PROBE_TIMEOUT_S`; False too where ``unshare`` is
        missing (a unit that starts is worth more than one that might not).
    """
    # util-linux lives in /usr/bin and /bin, also when the installing shell's PATH lacks them.
    unshare = shutil.which("unshare") or shutil.which("unshare", path="/usr/bin:/bin")
    if not sys.platform.startswith("linux") or unshare is None:
        return False
    mount = shutil.which("mount", path="/usr/bin:/bin") or "mount"
    argv = [unshare, "--user", "--map-root-user", "--mount", mount, "-t", "tmpfs", "tmpfs", "/tmp"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _real(path: Path) -> Path:
    """Absolute, symlinks resolved: systemd mounts what a path leads to."""
    return Path(os.path.realpath(path))


def _outermost(paths: Iterable[Path]) -> tuple[Path, ...]:
    """The paths inside no other one (a writable folder covers what it holds), in order."""
    unique = list(dict.fromkeys(paths))
    return tuple(p for p in unique if not any(p != q and p.is_relative_to(q) for q in unique))
