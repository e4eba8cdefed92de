"""`kesoku service`, run as the real CLI in a subprocess.

systemctl and journalctl are replaced by small fake executables on PATH that record their arguments
(the real ones need a running systemd, which test machines do not have); the rendered unit is
checked by the real ``systemd-analyze verify`` and scored by ``systemd-analyze security``."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kesoku.config.envfile import KEY_VARIABLES, parse_env_file
from kesoku.config.settings import load_config
from kesoku.host.service import is_secret
from kesoku.host.service_sandbox import state_paths, user_namespaces_work

REPO = Path(__file__).resolve().parent.parent
NAMESPACES = user_namespaces_work()
"""Whether this machine gives user namespaces (the unit's sandbox needs one; so does bubblewrap)."""
CLEARED = (
    "KESOKU_CONFIG",
    "XDG_CONFIG_HOME",
    "SUDO_USER",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "GOOGLE_API_KEY",
    "GOOGLE_CLOUD_PROJECT",
    "GOOGLE_CLOUD_LOCATION",
    "NO_PROXY",
    *KEY_VARIABLES,
)
FAKE = """#!/bin/sh
echo "$(basename "$0") $*" >> "$FAKE_LOG"
if [ -n "$FAKE_FAIL" ]; then echo "$FAKE_FAIL" >&2; exit 1; fi
if [ "$1" = "--user" ]; then shift; fi
case "$1" in show) echo "Version=252";; status) echo "kesoku.service - fake status"; exit 3;; esac
exit 0
"""


@pytest.fixture
def home(tmp_path: Path) -> Path:
    folder = tmp_path / "home"
    folder.mkdir()
    return folder


@pytest.fixture
def config(tmp_path: Path) -> Path:
    folder = tmp_path / "my agent"  # a space: ExecStart must quote it
    folder.mkdir()
    path = folder / "kesoku.toml"
    path.write_text('[agent]\npersona = "You are a test."\n')
    return path


@pytest.fixture
def fake_bin(tmp_path: Path) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in ("systemctl", "journalctl"):
        exe = folder / name
        exe.write_text(FAKE)
        exe.chmod(0o755)
    return folder


def kesoku(
    *args: str, home: Path, path: str, prefix: tuple[str, ...] = (), **env: str
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in CLEARED}
    environ |= {"HOME": str(home), "PATH": path, **env}
    return subprocess.run(
        [*prefix, sys.executable, "-m", "kesoku", "service", *args],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def analyze(unit: Path, *args: str, user: bool) -> subprocess.CompletedProcess[str]:
    """``systemd-analyze [--user] ARGS UNIT``;
    --user needs a runtime folder, an empty one does offline."""
    runtime = unit.parent / "runtime"
    runtime.mkdir(mode=0o700, exist_ok=True)
    return subprocess.run(
        ["systemd-analyze", *(["--user"] if user else []), *args, str(unit)],
        env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def assert_verified(unit: Path, *, user: bool) -> None:
    verify = analyze(unit, "verify", user=user)
    # systemd-analyze exits 0 even for some bad lines: it must say nothing about our file.
    assert verify.returncode == 0, verify.stderr
    assert "kesoku.service" not in verify.stdout + verify.stderr, verify.stderr


def settings(unit: str) -> list[str]:
    """The unit's lines without comments and blank lines."""
    return [line for line in unit.splitlines() if line and not line.startswith("#")]


def sandbox(
    *, writable: list[str], read_only: list[str], user: bool, namespaces: bool = True
) -> list[str]:
    """The sandbox settings a unit must hold, in order
    (``namespaces``: the machine gives user namespaces)."""
    mounts = [
        *(["PrivateUsers=yes"] if namespaces else []),
        "ProtectSystem=strict",
        "ProtectHome=read-only",
        *(f"ReadWritePaths={w}" for w in writable),
        *(f"ReadOnlyPaths={r}" for r in read_only),
        "PrivateTmp=yes",
        "PrivateDevices=yes",
        "PrivateMounts=yes",
        *([] if user else ["ProtectProc=invisible"]),
        "ProtectKernelModules=yes",
        "ProtectControlGroups=yes",
        "ProtectClock=yes",
        "ProtectHostname=yes",
        "CapabilityBoundingSet=",
    ]
    return [
        *([] if user and not namespaces else mounts),  # a user manager mounts nothing without one
        "NoNewPrivileges=yes",
        *(["KeyringMode=private"] if user else []),
        "RestrictSUIDSGID=yes",
        "RestrictRealtime=yes",
        "LockPersonality=yes",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK",
        "SystemCallArchitectures=native",
        "SystemCallFilter=@system-service @mount",
        "SystemCallFilter=landlock_add_rule landlock_create_ruleset landlock_restrict_self",
        "SystemCallFilter=~@clock @cpu-emulation @debug @module @obsolete @raw-io @reboot @swap",
        "SystemCallErrorNumber=EPERM",
        "UMask=0077",
        "LimitNOFILE=16384",
        "LimitCORE=0",
    ]


def expected_user_unit(config: Path, home: Path, *, path: str, env_file: bool) -> list[str]:
    """The user unit's settings for the ``config`` fixture (its folder name holds a blank)."""
    quoted = f'"{config}"'
    folder = os.path.realpath(config.parent)
    lines = [
        "[Unit]",
        "Description=Kesoku autonomous agent daemon",
        "[Service]",
        "Type=exec",
        f"WorkingDirectory={config.parent}",
        f"ExecStart={sys.executable} -P -m kesoku start -c {quoted}",
        'Environment="GOOGLE_CLOUD_PROJECT=proj-1"',
        f'Environment="PATH={path}"',
    ]
    if env_file:
        lines.append(f"EnvironmentFile={home}/.config/kesoku/kesoku.env")
    lines += [
        "Restart=always",
        "RestartSec=5",
        "TimeoutStopSec=210",
        "KillMode=mixed",
        "LimitNOFILE=65536",
        "SyslogIdentifier=kesoku",
        "StandardOutput=journal",
        "StandardError=journal",
        *sandbox(
            writable=[f'"-{folder}"'],
            read_only=[f'"-{folder}/skills"'],
            user=True,
            namespaces=NAMESPACES,
        ),
        "[Install]",
        "WantedBy=default.target",
    ]
    return lines


def test_dry_run_prints_the_exact_unit_and_keeps_secrets_out(
    config: Path, home: Path, fake_bin: Path, tmp_path: Path
) -> None:
    path = f"{fake_bin}:/usr/bin:/bin"
    log = tmp_path / "calls.log"
    result = kesoku(
        "install", "-c", str(config), "-e", "EXTRA=x-secret-1", "--dry-run",
        home=home, path=path, FAKE_LOG=str(log),
        GOOGLE_API_KEY="g-secret-2", DISCORD_TOKEN="d-secret-3",
        GOOGLE_CLOUD_PROJECT="proj-1", HTTPS_PROXY="http://bob:p-secret-4@proxy:3128",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(
        "# Written by `kesoku service install`; run it again rather than editing"
    )
    assert settings(result.stdout) == expected_user_unit(config, home, path=path, env_file=True)
    # The settings one could take for forgotten say why they are absent.
    assert (
        "# - RestrictNamespaces=: bubblewrap creates user, mount, pid, net, ipc, uts, cgroup"
        in result.stdout
    )
    assert "# - MemoryDenyWriteExecute=: every tool inherits it" in result.stdout
    assert "secret" not in result.stdout + result.stderr  # names only, never values
    assert result.stderr == (
        "# the service's environment: DISCORD_TOKEN, EXTRA, GOOGLE_API_KEY, GOOGLE_CLOUD_PROJECT, "
        f"HTTPS_PROXY, PATH\n# would write {home}/.config/kesoku/kesoku.env (mode 0600) with: "
        "DISCORD_TOKEN, EXTRA, GOOGLE_API_KEY, HTTPS_PROXY\n"
    )
    assert not (home / ".config").exists()  # a dry run writes nothing and calls no systemctl
    assert not log.exists()


def test_the_units_command_imports_nothing_from_its_working_folder(
    config: Path, home: Path
) -> None:
    # The agent's file tools may write in the config's folder: a module there named like one
    # Kesoku imports would run unsandboxed at the next start.
    from kesoku.host.doctor import parse_unit

    dry = kesoku("install", "-c", str(config), "--dry-run", home=home, path="/usr/bin:/bin")
    assert dry.returncode == 0, dry.stderr
    unit = parse_unit(dry.stdout)
    [folder] = re.findall(r"^WorkingDirectory=(.*)$", dry.stdout, re.MULTILINE)
    marker = Path(folder) / "shadowed"
    (Path(folder) / "cyclopts.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nraise SystemExit('shadowed')\n"
    )
    words = unit.exec_start
    # the unit's own command, asked for its help (cyclopts shows it)
    command = [*words[: words.index("kesoku") + 1], "start", "--help"]
    assert "-P" in command
    env = os.environ | {"HOME": str(home)}
    for argv, shadowed in ((command, False), ([w for w in command if w != "-P"], True)):
        done = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True)
        assert marker.exists() is shadowed, (argv, done.stdout, done.stderr)
        marker.unlink(missing_ok=True)


def test_dry_run_without_secrets_has_no_environment_file(config: Path, home: Path) -> None:
    result = kesoku("install", "-c", str(config), "--dry-run", home=home, path="/usr/bin:/bin",
                    GOOGLE_CLOUD_PROJECT="proj-1")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert settings(result.stdout) == expected_user_unit(
        config, home, path="/usr/bin:/bin", env_file=False
    )
    first = result.stderr.splitlines()[0]
    assert first == "# the service's environment: GOOGLE_CLOUD_PROJECT, PATH"
    assert "would write" not in result.stderr


def test_system_unit_runs_as_the_invoking_user_after_the_network(config: Path, home: Path) -> None:
    result = kesoku(
        "install", "-c", str(config), "--system", "--dry-run",
        home=home, path="/usr/bin:/bin", SUDO_USER="alice", DISCORD_TOKEN="tok",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    unit = result.stdout.splitlines()
    assert unit[3:5] == ["After=network-online.target", "Wants=network-online.target"]
    assert "User=alice" in unit
    assert "EnvironmentFile=/etc/kesoku/kesoku.env" in unit
    assert unit[-1] == "WantedBy=multi-user.target"
    assert "tok" not in result.stdout
    folder = os.path.realpath(config.parent)
    expected = sandbox(
        writable=[f'"-{folder}"'],
        read_only=[f'"-{folder}/skills"'],
        user=False,
        namespaces=NAMESPACES,
    )
    body = settings(result.stdout)
    assert body[body.index(expected[0]) : -2] == expected
    assert "# - RemoveIPC=: User= is a login user, whose other IPC objects it removes." in unit


def test_a_system_unit_never_runs_as_root(config: Path, home: Path) -> None:
    line = one_line_error(kesoku("install", "-c", str(config), "--system", "--dry-run", home=home,
                                 path="/usr/bin:/bin", SUDO_USER="root"))  # fmt: skip
    assert line == (
        "kesoku: a system unit runs Kesoku as an ordinary user, not root: run "
        "`sudo kesoku service install --system` from that user's shell"
    )


def test_the_unit_writes_where_the_config_keeps_state_and_install_makes_those_folders(
    tmp_path: Path, home: Path, fake_bin: Path
) -> None:
    agent = tmp_path / "agent"
    (agent / "skills").mkdir(parents=True)
    config = agent / "kesoku.toml"
    config.write_text(
        '[workspace]\ndb_path = "../state/kesoku.db"\nsessions_dir = "../state/sessions"\n'
        '[agent]\nproject_dir = "../work/repo"\n'
    )
    root = os.path.realpath(tmp_path)
    dry = kesoku("install", "-c", str(config), "--dry-run", home=home, path="/usr/bin:/bin")
    assert dry.returncode == 0, dry.stderr
    # The sessions live inside the database's folder: one writable folder covers both. The
    # skills are read-only anyway (outside every writable folder).
    rules = [
        line
        for line in settings(dry.stdout)
        if line.startswith(("ReadWritePaths", "ReadOnlyPaths"))
    ]
    assert rules == [f"ReadWritePaths=-{root}/state", f"ReadWritePaths=-{root}/work/repo"]
    assert [line for line in dry.stderr.splitlines() if "would create" in line] == [
        f"# would create {root}/state (the service writes there)",
        f"# would create {root}/work/repo (the service writes there)",
    ]
    assert not (tmp_path / "state").exists()

    log = tmp_path / "calls.log"
    done = kesoku(
        "install", "-c", str(config), home=home, path=f"{fake_bin}:/usr/bin:/bin", FAKE_LOG=str(log)
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "state").is_dir()
    assert (tmp_path / "work" / "repo").is_dir()
    assert not (
        tmp_path / "state" / "sessions"
    ).exists()  # the daemon makes it, inside a writable folder


def test_state_paths_follow_symlinks_and_keep_skills_read_only_inside_a_writable_folder(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "disk" / "sessions"
    outside.mkdir(parents=True)
    agent = tmp_path / "agent"
    agent.mkdir()
    (agent / "sessions").symlink_to(outside)
    config = agent / "kesoku.toml"
    config.write_text('[workspace]\nskills_dir = "my skills"\n')
    paths = state_paths(load_config(config, env={}))
    real = Path(os.path.realpath(tmp_path))
    # systemd mounts what a path leads to: the symlinked sessions folder is writable where it lies.
    assert paths.writable == (real / "agent", real / "disk" / "sessions")
    assert paths.read_only == (real / "agent" / "my skills",)


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed"
)
@pytest.mark.parametrize("scope", ["--user", "--system"])
def test_the_rendered_unit_passes_systemd_analyze_verify_and_security(
    scope: str, config: Path, home: Path, tmp_path: Path
) -> None:
    # Public values with the characters unit files treat specially: %, quotes, backslash, $.
    path = '/usr/bin:/bin:/opt/we ird/%h/"q"/\\/$HOME'
    result = kesoku(
        "install", "-c", str(config), scope, "--dry-run", "-e", "K=%h $HOME \"q\" \\",
        home=home, path=path, GOOGLE_CLOUD_LOCATION="us $east %i", SUDO_USER="alice",
    )  # fmt: skip
    assert 'Environment="PATH=/usr/bin:/bin:/opt/we ird/%%h/\\"q\\"/\\\\/$HOME"' in result.stdout
    assert result.returncode == 0, result.stderr
    unit = tmp_path / "kesoku.service"
    unit.write_text(result.stdout)
    assert_verified(unit, user=scope == "--user")
    if scope == "--user" and not NAMESPACES:
        pytest.skip(
            "no user namespaces here: a user unit keeps no file system sandbox (see the next test)"
        )
    # Exposure 0.0 (locked down) to 10.0 (none); --threshold=40 fails above 4.0.
    security = analyze(unit, "security", "--offline=yes", "--threshold=40", user=scope == "--user")
    assert security.returncode == 0, security.stdout + security.stderr
    exposure = re.search(r"Overall exposure level for kesoku\.service: (\d+\.\d)", security.stdout)
    assert exposure is not None, security.stdout
    assert float(exposure.group(1)) <= 4.0, security.stdout


NO_NAMESPACES = ("unshare", "--user", "--map-root-user", "sh", "-c",
                 'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"', "sh")  # fmt: skip
"""Runs a command where no user namespace can be made:
the limit holds in a user namespace's children."""


@pytest.mark.skipif(
    not NAMESPACES or shutil.which("unshare") is None, reason="needs unshare(1) and user namespaces"
)
def test_where_user_namespaces_are_refused_the_unit_keeps_what_works_without_and_says_so(
    config: Path, home: Path, tmp_path: Path
) -> None:
    folder = os.path.realpath(config.parent)
    mounts = {"writable": [f'"-{folder}"'], "read_only": [f'"-{folder}/skills"']}
    note = "# this machine refuses user namespaces: {} (the unit says more)"
    for scope, user in (("--user", True), ("--system", False)):
        result = kesoku(
            "install", "-c", str(config), scope, "--dry-run",
            home=home, path="/usr/bin:/bin", prefix=NO_NAMESPACES, SUDO_USER="alice",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert result.stderr.splitlines()[0] == note.format(
            "its file system sandbox is off" if user else "no PrivateUsers="
        )
        expected = sandbox(**mounts, user=user, namespaces=False)
        body = settings(result.stdout)
        assert body[body.index(expected[0]) : -2] == expected
        assert (
            "# This machine refused a user namespace at install: no PrivateUsers=." in result.stdout
        )
        if shutil.which("systemd-analyze") is not None:  # still a valid unit
            unit = tmp_path / "kesoku.service"
            unit.write_text(result.stdout)
            assert_verified(unit, user=user)


def test_install_writes_the_unit_and_a_private_secrets_file_then_enables(
    config: Path, home: Path, fake_bin: Path, tmp_path: Path
) -> None:
    log = tmp_path / "calls.log"
    path = f"{fake_bin}:/usr/bin:/bin"
    result = kesoku("install", "-c", str(config), "-e", "A=it's $x", "-e", "B=plain",
                    home=home, path=path, FAKE_LOG=str(log), GOOGLE_API_KEY="key-1")  # fmt: skip
    assert result.returncode == 0, result.stderr
    unit = home / ".config/systemd/user/kesoku.service"
    secrets = home / ".config/kesoku/kesoku.env"
    assert "EnvironmentFile=" + str(secrets) in unit.read_text()
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o600
    assert stat.S_IMODE(secrets.parent.stat().st_mode) == 0o700
    assert secrets.read_text().splitlines()[1:] == [
        'A="it\'s \\$x"',
        "B='plain'",
        "GOOGLE_API_KEY='key-1'",
    ]
    assert log.read_text().splitlines() == [
        "systemctl --user show --property=Version",
        "systemctl --user daemon-reload",
        "systemctl --user enable kesoku.service",
    ]
    assert f"installed {unit} (user unit, enabled at boot, not started)" in result.stdout
    assert "key-1" not in result.stdout + result.stderr

    # Reinstalling from a shell without them keeps the file's: it is the keys' home (kesoku init).
    before = secrets.read_text()
    again = kesoku("install", "-c", str(config), home=home, path=path, FAKE_LOG=str(log))
    assert again.returncode == 0, again.stderr
    assert secrets.read_text() == before
    assert "EnvironmentFile=" + str(secrets) in unit.read_text()
    # An emptied file (the user removed every key) is not referenced, and goes.
    secrets.write_text("# nothing\n")
    third = kesoku("install", "-c", str(config), home=home, path=path, FAKE_LOG=str(log))
    assert third.returncode == 0, third.stderr
    assert not secrets.exists()
    assert "EnvironmentFile" not in unit.read_text()


def test_uninstall_stops_disables_removes_and_reloads(
    config: Path, home: Path, fake_bin: Path, tmp_path: Path
) -> None:
    log = tmp_path / "calls.log"
    path = f"{fake_bin}:/usr/bin:/bin"
    assert (
        kesoku(
            "install", "-c", str(config), "-e", "A=1", home=home, path=path, FAKE_LOG=str(log)
        ).returncode
        == 0
    )
    log.unlink()
    result = kesoku("uninstall", home=home, path=path, FAKE_LOG=str(log))
    assert result.returncode == 0, result.stderr
    assert not (home / ".config/systemd/user/kesoku.service").exists()
    # The user's secrets file stays: kesoku chat reads its keys too.
    assert (home / ".config/kesoku/kesoku.env").read_text().splitlines()[1:] == ["A='1'"]
    assert f"kept {home}/.config/kesoku/kesoku.env" in result.stdout
    assert log.read_text().splitlines() == [
        "systemctl --user show --property=Version",
        "systemctl --user stop kesoku.service",
        "systemctl --user disable kesoku.service",
        "systemctl --user daemon-reload",
    ]
    missing = one_line_error(kesoku("uninstall", home=home, path=path, FAKE_LOG=str(log)))
    assert missing.startswith("kesoku: kesoku.service is not installed")


def test_start_stop_restart_status_and_logs_call_systemd(
    home: Path, fake_bin: Path, tmp_path: Path
) -> None:
    log = tmp_path / "calls.log"
    path = f"{fake_bin}:/usr/bin:/bin"
    for action in ("start", "stop", "restart"):
        result = kesoku(action, home=home, path=path, FAKE_LOG=str(log))
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"{action} kesoku.service: done")
    status = kesoku("status", "--system", home=home, path=path, FAKE_LOG=str(log))
    assert status.returncode == 3  # systemctl's own code (3: not running) passes through
    assert status.stdout == "kesoku.service - fake status\n"
    assert kesoku("logs", home=home, path=path, FAKE_LOG=str(log)).returncode == 0
    assert kesoku("logs", "-f", "-n", "7", home=home, path=path, FAKE_LOG=str(log)).returncode == 0
    calls = [c for c in log.read_text().splitlines() if "show --property" not in c]
    assert calls == [
        "systemctl --user start kesoku.service",
        "systemctl --user stop kesoku.service",
        "systemctl --user restart kesoku.service",
        "systemctl status kesoku.service",
        "journalctl --user -u kesoku.service -n 50",
        "journalctl --user -u kesoku.service -n 7 -f",
    ]


def test_without_systemd_every_command_says_so_in_one_line(
    config: Path, home: Path, tmp_path: Path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for args in (
        ("install", "-c", str(config)),
        ("uninstall",),
        ("start",),
        ("stop",),
        ("restart",),
        ("status",),
    ):
        line = one_line_error(kesoku(*args, home=home, path=str(empty)))
        assert line == "kesoku: systemd is not available here (no systemctl on PATH)", args
    line = one_line_error(kesoku("logs", "-f", home=home, path=str(empty)))
    assert line == "kesoku: systemd's journal is not available here (no journalctl on PATH)"
    assert not (home / ".config").exists()


def test_an_unreachable_user_manager_is_one_line(
    config: Path, home: Path, fake_bin: Path, tmp_path: Path
) -> None:
    result = kesoku(
        "install", "-c", str(config),
        home=home, path=f"{fake_bin}:/usr/bin:/bin",
        FAKE_LOG=str(tmp_path / "log"), FAKE_FAIL="Failed to connect to bus: No medium found",
    )  # fmt: skip
    line = one_line_error(result)
    assert line.startswith(
        "kesoku: the systemd user manager is not reachable: "
        "Failed to connect to bus: No medium found"
    )
    assert not (home / ".config").exists()


def test_bad_options_are_one_line(config: Path, home: Path, tmp_path: Path) -> None:
    line = one_line_error(
        kesoku("install", "-c", str(config), "-e", "NOEQUALS", "--dry-run", home=home, path="/bin")
    )
    assert (
        line == "kesoku: -e 'NOEQUALS': expected KEY=VALUE with KEY made of letters, digits and _"
    )
    missing = tmp_path / "nope.toml"
    line = one_line_error(
        kesoku("install", "-c", str(missing), "--dry-run", home=home, path="/bin")
    )
    assert line.startswith(f"kesoku: service install: {missing} does not exist")


def test_install_without_a_config_file_says_how_to_get_one(home: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "kesoku.toml"
    result = kesoku("install", "--dry-run", "-c", str(missing), home=home, path=os.environ["PATH"])
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith(
        f"kesoku: service install: {missing} does not exist; give the daemon's config"
    )


def test_every_key_the_readme_names_is_carried_and_secrets_stay_in_the_private_file(
    config: Path, home: Path, fake_bin: Path, tmp_path: Path
) -> None:
    log = tmp_path / "calls.log"
    values = {name: f"value-of-{name.lower()}" for name in KEY_VARIABLES}
    values["OPENAI_BASE_URL"] = "http://127.0.0.1:11434/value-of-openai_base_url"  # a URL: checked
    env: dict[str, Any] = {"FAKE_LOG": str(log), **values}  # Any: kesoku()'s prefix= is a tuple
    result = kesoku("install", "-c", str(config), home=home, path=f"{fake_bin}:/usr/bin:/bin",
                    **env)  # fmt: skip
    assert result.returncode == 0, result.stderr
    unit = (home / ".config/systemd/user/kesoku.service").read_text()
    secrets = parse_env_file((home / ".config/kesoku/kesoku.env").read_text())
    for name, value in values.items():
        in_unit = f'Environment="{name}={value}"' in unit
        # Each one reaches the service exactly once: a key in the 0600 file, the rest in the unit.
        assert in_unit != (secrets.get(name) == value), name
        assert in_unit == (not is_secret(name, value)), name
    assert {"ANTHROPIC_API_KEY", "OPENAI_API_KEY", "DISCORD_TOKEN"} <= set(secrets)
    assert "value-of-anthropic_api_key" not in result.stdout + result.stderr  # names only
    assert "ANTHROPIC_API_KEY" in result.stdout  # "secrets in FILE (mode 0600): NAMES"
    assert "offline model" not in result.stderr


def test_keys_from_the_keys_file_are_carried_and_a_keyless_service_is_announced(
    config: Path, home: Path
) -> None:
    dry = kesoku("install", "-c", str(config), "--dry-run", home=home, path="/usr/bin:/bin")
    assert dry.returncode == 0, dry.stderr
    assert "the service will answer with the small offline model" in dry.stderr
    # The keys `kesoku init` stores reach the service without being exported.
    keys = home / ".config/kesoku/kesoku.env"
    keys.parent.mkdir(parents=True)
    keys.write_text("# by kesoku init\nANTHROPIC_API_KEY='sk-ant-secret'\nMCP_TOKEN='t-secret'\n")
    dry = kesoku("install", "-c", str(config), "--dry-run", home=home, path="/usr/bin:/bin")
    assert dry.returncode == 0, dry.stderr
    assert dry.stderr.splitlines()[0] == (
        "# the service's environment: ANTHROPIC_API_KEY, MCP_TOKEN, PATH"
    )
    assert "offline model" not in dry.stderr
    assert "secret" not in dry.stdout + dry.stderr
    # The shell still wins over the file, as for every command.
    dry = kesoku("install", "-c", str(config), "--dry-run", home=home, path="/usr/bin:/bin",
                 ANTHROPIC_API_KEY="")  # fmt: skip
    assert "ANTHROPIC_API_KEY" in dry.stderr.splitlines()[0]  # empty counts as unset: the file's
