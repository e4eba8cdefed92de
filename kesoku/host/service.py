"""Kesoku as a systemd service: render ``kesoku.service``, and run systemctl and journalctl.

The unit runs ``<python> -m kesoku start -c <config>`` from the config's folder, restarts always
(5 s apart) and gives the daemon 210 s to stop (TimeoutStopSec): above ``agent.shutdown_grace_s``
(180 s by default), so running tools finish before systemd would kill them. ``KillMode=mixed`` sends
SIGTERM to the daemon only, not to the tools' processes, for the same reason.

The unit is sandboxed (:mod:`kesoku.host.service_sandbox`): read-only but for the database's folder,
the sessions and the project folder, which ``install`` creates when missing; no capabilities; a
system call allow list; settings that would break the tools' own sandbox (bubblewrap, Landlock) left
out. A system unit runs as the user who ran ``sudo`` (``User=``), never as root.

Secrets never land in the unit, which is world-readable: every ``-e`` value and every inherited
variable whose name holds KEY, TOKEN, SECRET or PASSWORD (and a proxy URL with a password) go to an
``EnvironmentFile`` created with mode 0600, which the unit references. The user unit's file is
``~/.config/kesoku/kesoku.env``; the system unit's ``/etc/kesoku/kesoku.env`` (read by systemd as
root before it drops to ``User=``).
"""

from __future__ import annotations

import getpass
import os
import pwd
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from kesoku.config.envfile import (
    KEY_VARIABLES,
    config_home,
    env_file_path,
    read_env_file,
    render_env_file,
    write_private,
)
from kesoku.host.service_sandbox import StatePaths, sandbox_lines, state_paths, user_namespaces_work
from kesoku.vocab.errors import OperatorError

if TYPE_CHECKING:
    from kesoku.config.settings import Config

UNIT_NAME = "kesoku.service"
INHERITED_ENV = ("PATH", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", *KEY_VARIABLES)
"""Variables copied from the installing shell when set: every credential and endpoint Kesoku reads
(:data:`~kesoku.config.envfile.KEY_VARIABLES`), the search path and the proxies."""
SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD")
RESTART_S = 5
STOP_TIMEOUT_S = 210
OPEN_FILES = 65536
"""The unit's ``LimitNOFILE`` (soft and hard): a thousand live sessions with their HTTP connections
and tool pipes fit, where the common default soft limit (1024) does not (the daemon also raises its
soft limit to the hard one at start)."""
SYSTEMCTL_TIMEOUT_S = 30.0
"""Longest wait for one systemctl call (daemon-reload, enable, stop)."""
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ServiceError(OperatorError):
    """systemd is missing or refused a command; the message is one line."""


@dataclass(frozen=True, slots=True)
class Scope:
    """Where the unit lives: the user's manager (``systemctl --user``) or the system's.

    Attributes:
        user: True for a user unit.
    """

    user: bool

    @property
    def name(self) -> str:
        """``user`` or ``system``."""
        return "user" if self.user else "system"

    @property
    def flags(self) -> list[str]:
        """``["--user"]`` for the user manager, else nothing."""
        return ["--user"] if self.user else []

    def unit_path(self, env: Mapping[str, str]) -> Path:
        """``~/.config/systemd/user/kesoku.service`` or ``/etc/systemd/system/kesoku.service``."""
        if self.user:
            return config_home(env) / "systemd" / "user" / UNIT_NAME
        return Path("/etc/systemd/system") / UNIT_NAME

    def env_file_path(self, env: Mapping[str, str]) -> Path:
        """``~/.config/kesoku/kesoku.env`` or ``/etc/kesoku/kesoku.env``: the secrets, mode 0600."""
        if self.user:
            return env_file_path(env)
        return Path("/etc/kesoku") / env_file_path(env).name


@dataclass(frozen=True, slots=True)
class Unit:
    """Everything an install writes.

    Attributes:
        scope: User or system.
        config: The config file, absolute.
        python: The interpreter that runs ``-m kesoku`` (the one running this command: its venv).
        public_env: Variables written in the unit (``Environment=``).
        secret_env: Variables written to the 0600 EnvironmentFile.
        unit_path: Where the unit goes.
        env_file: Where the secrets go.
        run_as: ``User=`` of a system unit (None: a user unit).
        paths: The folders the service writes, and those inside them it only reads.
        namespaces: Whether this machine gave the installer a user namespace (see
            :func:`~kesoku.host.service_sandbox.user_namespaces_work`); the sandbox needs one.
    """

    scope: Scope
    config: Path
    python: str
    public_env: dict[str, str]
    secret_env: dict[str, str]
    unit_path: Path
    env_file: Path
    run_as: str | None
    paths: StatePaths
    namespaces: bool = True

    def render(self) -> str:
        """The unit file's text."""
        lines = [
            "# Written by `kesoku service install`; run it again rather than editing this file.",
            "[Unit]",
            "Description=Kesoku autonomous agent daemon",
        ]
        if not self.scope.user:  # the user manager has no network-online.target
            lines += ["After=network-online.target", "Wants=network-online.target"]
        # -P: `-m` would put the working folder first on the import path, where the agent's file
        # tools may write (a `yaml.py` there would run unsandboxed at the next start)
        exec_args = [self.python, "-P", "-m", "kesoku", "start", "-c", os.fspath(self.config)]
        lines += [
            "",
            "[Service]",
            "Type=exec",
            f"WorkingDirectory={_specifiers(os.fspath(self.config.parent))}",
            "ExecStart=" + " ".join(_exec_arg(a) for a in exec_args),
        ]
        lines += [f"Environment={_quoted(f'{k}={v}')}" for k, v in sorted(self.public_env.items())]
        if self.secret_env:
            lines.append(f"EnvironmentFile={_specifiers(os.fspath(self.env_file))}")
        if self.run_as is not None:
            lines.append(f"User={self.run_as}")
        lines += [
            "Restart=always",
            f"RestartSec={RESTART_S}",
            # Above agent.shutdown_grace_s (180 s): running tools finish before systemd kills
            # anything.
            f"TimeoutStopSec={STOP_TIMEOUT_S}",
            # SIGTERM to the daemon alone: it lets running tools finish; the rest get SIGKILL at the
            # timeout.
            "KillMode=mixed",
            f"LimitNOFILE={OPEN_FILES}",
            "SyslogIdentifier=kesoku",
            "StandardOutput=journal",
            "StandardError=journal",
            *sandbox_lines(
                self.paths, user=self.scope.user, quote=_word, namespaces=self.namespaces
            ),
            "",
            "[Install]",
            f"WantedBy={'default.target' if self.scope.user else 'multi-user.target'}",
        ]
        return "\n".join(lines) + "\n"

    def render_env_file(self) -> str:
        """The EnvironmentFile's text (secrets: write it with mode 0600 only)."""
        header = f"Secrets of {UNIT_NAME}, written by `kesoku service install` (mode 0600)."
        return render_env_file(self.secret_env, header=header)


def plan_unit(
    config: Path,
    extra_env: Sequence[str],
    *,
    user: bool,
    env: Mapping[str, str] | None = None,
    python: str | None = None,
    cfg: Config | None = None,
) -> Unit:
    """Decide what ``install`` writes.

    Args:
        config: The config file (resolved to an absolute path).
        extra_env: ``-e KEY=VALUE`` options, in order (a later one wins).
        user: A user unit (else a system unit).
        env: The installing shell's environment; ``os.environ`` when None.
        python: The interpreter for ExecStart; ``sys.executable`` when None.
        cfg: ``config`` already loaded; loaded here when None.

    Returns:
        The unit to write.

    Raises:
        ServiceError: A malformed ``-e``, the config file does not exist, or a system unit would run
            as root.
        ConfigError: The config file is invalid.
    """
    env = os.environ if env is None else env
    path = Path(config).expanduser().absolute()
    if not path.is_file():
        raise ServiceError(
            f"{path}: no such config file (-c); `kesoku config check -c FILE` validates one"
        )
    public: dict[str, str] = {}
    # What the secrets file already holds stays (variables added by hand, for an MCP server say);
    # the shell overrides it, as it does for every kesoku command.
    secret = read_env_file(env_file_path(env))
    for key in INHERITED_ENV:
        value = env.get(key)
        if value:
            secret.pop(key, None)
            (secret if is_secret(key, value) else public)[key] = value
    for item in extra_env:
        key, sep, value = item.partition("=")
        if not sep or not _NAME.fullmatch(key):
            raise ServiceError(
                f"-e {item!r}: expected KEY=VALUE with KEY made of letters, digits and _"
            )
        public.pop(key, None)
        secret[key] = (
            value  # an -e value may be anything: it never goes into the world-readable unit
        )
    scope = Scope(user)
    run_as = None
    if not user:
        run_as = env.get("SUDO_USER") or getpass.getuser()
        if run_as == "root":
            # Without capabilities root cannot start bubblewrap (it cannot map its uid), and a
            # root daemon with them would hand root's reach to every tool.
            raise ServiceError(
                "a system unit runs Kesoku as an ordinary user, not root: run "
                "`sudo kesoku service install --system` from that user's shell"
            )
    if cfg is None:
        from kesoku.config.settings import load_config

        cfg = load_config(path, env=env)
    return Unit(
        scope=scope,
        config=path,
        python=python or sys.executable,
        public_env=public,
        secret_env=secret,
        unit_path=scope.unit_path(env),
        env_file=scope.env_file_path(env),
        run_as=run_as,
        paths=state_paths(cfg),
        namespaces=user_namespaces_work(),
    )


def is_secret(name: str, value: str) -> bool:
    """A variable whose name says it holds a credential, or a URL carrying a password."""
    if any(marker in name.upper() for marker in SECRET_MARKERS):
        return True
    try:
        return urlsplit(value).password is not None
    except ValueError:
        return False


# -- writing and systemctl ------------------------------------------------------------------------


def install(unit: Unit, env: Mapping[str, str] | None = None) -> None:
    """Write the unit (and the secrets file), reload systemd and enable the service.

    The service is not started. The folders it writes are created when missing (owned by ``User=``
    in a system unit), since the sandbox can make writable only what exists.

    Raises:
        ServiceError: systemd is unreachable, a file or folder cannot be written, or systemctl
            fails.
    """
    systemctl = require_systemd(unit.scope, env)
    try:
        make_folders(unit.paths.writable, owner=unit.run_as)
        if unit.secret_env:
            write_private(unit.env_file, unit.render_env_file())
        else:
            unit.env_file.unlink(missing_ok=True)  # no secrets any more: leave none behind
        unit.unit_path.parent.mkdir(parents=True, exist_ok=True)
        unit.unit_path.write_text(unit.render(), encoding="utf-8")
    except OSError as exc:
        raise ServiceError(
            f"cannot write {exc.filename}: {exc.strerror}{_sudo_hint(unit.scope)}"
        ) from None
    except KeyError:
        raise ServiceError(f"User={unit.run_as}: no such user here (SUDO_USER names it)") from None
    _call(systemctl, unit.scope, "daemon-reload")
    _call(systemctl, unit.scope, "enable", UNIT_NAME)


def uninstall(scope: Scope, env: Mapping[str, str] | None = None) -> Path:
    """Stop and disable the service, remove its unit, reload systemd.

    A system unit's secrets file (``/etc/kesoku/kesoku.env``) goes too; a user unit's is kept: it is
    also the file every ``kesoku`` command of that user reads its keys from (``kesoku init``).

    Returns:
        The removed unit file.

    Raises:
        ServiceError: systemd is unreachable, the unit is not installed, or a file cannot be
            removed.
    """
    env = os.environ if env is None else env
    systemctl = require_systemd(scope, env)
    path = scope.unit_path(env)
    if not path.exists():
        raise ServiceError(f"{UNIT_NAME} is not installed ({path} does not exist)")
    # Either may fail harmlessly (already stopped, already disabled); the removal below is what
    # counts.
    _call(systemctl, scope, "stop", UNIT_NAME, check=False)
    _call(systemctl, scope, "disable", UNIT_NAME, check=False)
    try:
        path.unlink()
        if not scope.user:
            scope.env_file_path(env).unlink(missing_ok=True)
    except OSError as exc:
        raise ServiceError(
            f"cannot remove {exc.filename}: {exc.strerror}{_sudo_hint(scope)}"
        ) from None
    _call(systemctl, scope, "daemon-reload")
    return path


def control(scope: Scope, action: str, env: Mapping[str, str] | None = None) -> int:
    """``systemctl [--user] start|stop|restart kesoku.service``, its output shown as it comes.

    Returns:
        systemctl's exit code.

    Raises:
        ServiceError: systemd is unreachable.
    """
    systemctl = require_systemd(scope, env)
    return subprocess.run([systemctl, *scope.flags, action, UNIT_NAME], check=False).returncode


def status_command(scope: Scope, env: Mapping[str, str] | None = None) -> list[str]:
    """The ``systemctl status`` command line (run it with :func:`exec_command`).

    Raises:
        ServiceError: systemd is unreachable.
    """
    return [require_systemd(scope, env), *scope.flags, "status", UNIT_NAME]


def logs_command(
    scope: Scope, *, follow: bool, lines: int, env: Mapping[str, str] | None = None
) -> list[str]:
    """The ``journalctl`` command line showing the service's log.

    Raises:
        ServiceError: journalctl is not installed.
    """
    env = os.environ if env is None else env
    journalctl = shutil.which("journalctl", path=env.get("PATH"))
    if journalctl is None:
        raise ServiceError("systemd's journal is not available here (no journalctl on PATH)")
    return [
        journalctl,
        *scope.flags,
        "-u",
        UNIT_NAME,
        "-n",
        str(lines),
        *(["-f"] if follow else []),
    ]


def exec_command(argv: list[str]) -> None:
    """Replace this process with ``argv``: the terminal, the pager and Ctrl-C then belong to it."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)


def require_systemd(scope: Scope, env: Mapping[str, str] | None = None) -> str:
    """Find systemctl and check that the scope's manager answers.

    Returns:
        The systemctl path.

    Raises:
        ServiceError: No systemctl, or the manager cannot be reached (no user session bus, a
            container without systemd as PID 1).
    """
    env = os.environ if env is None else env
    systemctl = shutil.which("systemctl", path=env.get("PATH"))
    if systemctl is None:
        raise ServiceError("systemd is not available here (no systemctl on PATH)")
    try:
        probe = subprocess.run(
            [systemctl, *scope.flags, "show", "--property=Version"],
            capture_output=True,
            text=True,
            timeout=SYSTEMCTL_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServiceError(f"systemd is not available here ({systemctl}: {exc})") from None
    if probe.returncode != 0:
        hint = (
            "; log in through a systemd session or run `loginctl enable-linger`, or use --system"
            if scope.user
            else "; is systemd PID 1 here?"
        )
        raise ServiceError(
            f"the systemd {scope.name} manager is not reachable: {_first_line(probe.stderr)}{hint}"
        )
    return systemctl


def make_folders(paths: Sequence[Path], *, owner: str | None = None) -> list[Path]:
    """Create the folders that do not exist yet, parents included.

    Args:
        paths: The folders.
        owner: A user to own what is created (the system unit's ``User=``); None keeps this
            process's.

    Returns:
        The folders created, outermost first.

    Raises:
        OSError: A folder cannot be created or handed over.
        KeyError: ``owner`` is not a known user.
    """
    made: list[Path] = []
    for path in paths:
        for folder in reversed((path, *path.parents)):
            if not folder.exists():
                folder.mkdir()
                made.append(folder)
    if owner is not None and made:
        entry = pwd.getpwnam(owner)
        for folder in made:
            os.chown(folder, entry.pw_uid, entry.pw_gid)
    return made


def _call(systemctl: str, scope: Scope, *args: str, check: bool = True) -> None:
    argv = [systemctl, *scope.flags, *args]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=SYSTEMCTL_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise ServiceError(
            f"`{' '.join(argv[1:])}` did not finish in {SYSTEMCTL_TIMEOUT_S:g} s"
        ) from None
    if check and done.returncode != 0:
        raise ServiceError(
            f"systemctl {' '.join(argv[1:])} failed: {_first_line(done.stderr or done.stdout)}"
        )


# -- unit-file syntax (systemd.syntax(7), systemd.service(5), systemd.exec(5)) --------------------


def _specifiers(text: str) -> str:
    """``%`` starts a specifier in unit files (``%h``): a literal one is ``%%``."""
    return text.replace("%", "%%")


def _quoted(text: str) -> str:
    r"""A double-quoted unit-file value: backslash and quote escaped (C-style), ``%`` doubled."""
    return '"' + _specifiers(text.replace("\\", "\\\\").replace('"', '\\"')) + '"'


def _word(text: str) -> str:
    """One word of a unit-file list (ExecStart, ``ReadWritePaths=``), quoted when it needs to be."""
    if text and not re.search(r"[\s\"'\\;]", text):
        return _specifiers(text)
    return _quoted(text)


def _exec_arg(arg: str) -> str:
    """One ExecStart argument; ``$`` would expand a variable there, so a literal one is ``$$``."""
    return _word(arg.replace("$", "$$"))


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "no output")


def _sudo_hint(scope: Scope) -> str:
    return (
        " (a system unit needs root: run with sudo)" if not scope.user and os.geteuid() != 0 else ""
    )
