"""``kesoku service``: install, remove and control Kesoku as a systemd unit (kesoku.service).

A cyclopts sub-app, imported only when ``kesoku service ...`` runs. The work (unit rendering,
systemctl, journalctl) is in :mod:`kesoku.host.service`. Without systemd every command but
``install --dry-run`` says so in one line and exits 2.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from cyclopts import App, Parameter

from kesoku.host import service as svc
from kesoku.host.service import UNIT_NAME, Scope

if TYPE_CHECKING:
    from kesoku.config.settings import Config

service_app = App(
    name="service", help="Install and control Kesoku as a systemd service (kesoku.service)."
)

UserFlag = Annotated[
    bool,
    Parameter(
        name="--user",
        negative="--system",
        help=(
            "A user unit (~/.config/systemd/user, the default), or --system (/etc/systemd/system)."
        ),
    ),
]


@service_app.command(name="install")
def install_cmd(
    *,
    config: Annotated[Path, Parameter(name=["--config", "-c"])] = Path("kesoku.toml"),
    env: Annotated[tuple[str, ...], Parameter(name=["--env", "-e"], negative="")] = (),
    user: UserFlag = True,
    dry_run: Annotated[bool, Parameter(name="--dry-run", negative="")] = False,
) -> None:
    """Write kesoku.service, reload systemd and enable it for boot (without starting it).

    The unit runs `kesoku start -c CONFIG` from CONFIG's folder with this Python, restarts always,
    and allows 210 s to stop. It is sandboxed: read-only but for the database's folder, the sessions
    and agent.project_dir (created now when missing), without capabilities; a system unit runs as
    the user who ran sudo, never root. --dry-run shows every setting and why.

    The service gets every credential and endpoint variable that is set here: ANTHROPIC_API_KEY,
    GEMINI_API_KEY, GOOGLE_API_KEY, OPENAI_API_KEY, OPENAI_BASE_URL, DISCORD_TOKEN,
    GOOGLE_APPLICATION_CREDENTIALS, GOOGLE_CLOUD_PROJECT, GOOGLE_CLOUD_LOCATION and
    GOOGLE_GENAI_USE_VERTEXAI, with PATH and the proxies; "here" is this shell, else the keys file
    `kesoku init` wrote (~/.config/kesoku/kesoku.env), whose other variables are kept too. Secrets
    (every -e value, and variables whose name contains KEY, TOKEN, SECRET or PASSWORD) go to an
    EnvironmentFile readable only by its owner (~/.config/kesoku/kesoku.env, or
    /etc/kesoku/kesoku.env), never into the unit. The names carried are printed, never the values,
    and a service that would fall back to the offline model for want of a key says so.

    Args:
        config: The config file the service reads; resolved to an absolute path.
        env: KEY=VALUE for the service's environment (repeat the option for more).
        user: See above.
        dry_run: Print the unit and write nothing.
    """
    from kesoku.config.settings import load_config
    from kesoku.vocab.errors import OperatorError

    if not config.exists():
        # A daemon needs a file of its own (credentials, adapters): say how to get one.
        raise OperatorError(
            f"service install: {config} does not exist; give the daemon's config with -c PATH, "
            "or start from the commented reference kesoku.toml of the Kesoku repository "
            "(`kesoku config schema` lists every key)"
        )
    # A service that crash-loops on a config typo helps nobody: check it now.
    cfg = load_config(config)
    unit = svc.plan_unit(config, env, user=user, cfg=cfg)
    if not unit.namespaces:
        note = "its file system sandbox is off" if user else "no PrivateUsers="
        print(
            f"# this machine refuses user namespaces: {note} (the unit says more)", file=sys.stderr
        )
    if dry_run:
        carried = ", ".join(sorted({*unit.public_env, *unit.secret_env}))
        print(f"# the service's environment: {carried}", file=sys.stderr)
        _warn_local(cfg)
        sys.stdout.write(unit.render())
        for folder in unit.paths.writable:
            if not folder.exists():
                print(f"# would create {folder} (the service writes there)", file=sys.stderr)
        if unit.secret_env:
            names = ", ".join(sorted(unit.secret_env))
            print(f"# would write {unit.env_file} (mode 0600) with: {names}", file=sys.stderr)
        return
    svc.install(unit)
    print(f"installed {unit.unit_path} ({unit.scope.name} unit, enabled at boot, not started)")
    if unit.secret_env:
        print(f"secrets in {unit.env_file} (mode 0600): {', '.join(sorted(unit.secret_env))}")
    print(f"start it with: kesoku service start{'' if user else ' --system'}")
    _warn_local(cfg)


def _warn_local(cfg: Config) -> None:
    """One stderr line when the service would answer with the offline model for want of a key."""
    from kesoku.llm.factory import default_backend

    backend, _ = default_backend(cfg)
    if cfg.agent.llm is None and backend == "local":
        print(
            "# no model API key is set here, in the keys file or in the config: the service will "
            "answer with the small offline model (`kesoku init` sets one up, or export "
            "ANTHROPIC_API_KEY / GEMINI_API_KEY / OPENAI_API_KEY and install again)",
            file=sys.stderr,
        )


@service_app.command(name="uninstall")
def uninstall_cmd(*, user: UserFlag = True) -> None:
    """Stop and disable the service, remove its unit, and reload systemd.

    A system unit's secrets file (/etc/kesoku/kesoku.env) is removed too. A user unit's
    (~/.config/kesoku/kesoku.env) is kept: every kesoku command reads its keys from it.

    Args:
        user: See `kesoku service install --help`.
    """
    scope = Scope(user)
    removed = svc.uninstall(scope)
    print(f"removed {removed}")
    secrets = scope.env_file_path(os.environ)
    if user and secrets.exists():
        print(f"kept {secrets} (your keys: kesoku chat reads them too)")


def _control(action: str, user: bool) -> None:
    code = svc.control(Scope(user), action)
    if code == 0:
        print(
            f"{action} {UNIT_NAME}: done; "
            f"`kesoku service status{'' if user else ' --system'}` shows it"
        )
    raise SystemExit(code)


@service_app.command(name="start")
def start_cmd(*, user: UserFlag = True) -> None:
    """Start the service now (systemctl start kesoku.service).

    Args:
        user: See `kesoku service install --help`.
    """
    _control("start", user)


@service_app.command(name="stop")
def stop_cmd(*, user: UserFlag = True) -> None:
    """Stop the service (running tools get up to agent.shutdown_grace_s to finish).

    Args:
        user: See `kesoku service install --help`.
    """
    _control("stop", user)


@service_app.command(name="restart")
def restart_cmd(*, user: UserFlag = True) -> None:
    """Restart the service (after changing kesoku.toml; SIGHUP applies only some keys live).

    Args:
        user: See `kesoku service install --help`.
    """
    _control("restart", user)


@service_app.command(name="status")
def status_cmd(*, user: UserFlag = True) -> None:
    """Show the service's state and its last log lines (systemctl status).

    Args:
        user: See `kesoku service install --help`.
    """
    svc.exec_command(svc.status_command(Scope(user)))


@service_app.command(name="logs")
def logs_cmd(
    *,
    follow: Annotated[bool, Parameter(name=["--follow", "-f"], negative="")] = False,
    lines: Annotated[int, Parameter(name=["--lines", "-n"])] = 50,
    user: UserFlag = True,
) -> None:
    """Show the service's log from journald (journalctl -u kesoku.service).

    Args:
        follow: Keep printing new lines as they come.
        lines: How many recent lines to show.
        user: See `kesoku service install --help`.
    """
    svc.exec_command(svc.logs_command(Scope(user), follow=follow, lines=lines))
