"""``kesoku doctor``: every part of a setup checked at once, each finding one line with its fix.

Sections, in the order they are shown: the config, the keys (names and where each comes from, never
a value), the model backends (one live call each, :func:`~kesoku.host.checks.check_model`), the chat
adapters, the MCP servers, the tools' sandbox, the database (and the daemon serving it, if one does)
and the systemd unit. They run concurrently under trio, each bounded in time; a section that breaks
or overruns is itself a failed line, never a traceback.

A finding is ``ok``, ``warn`` (works, but something would be better: the fix says what), ``FAIL``
(does not work: the fix says what to do) or ``--`` (a fact, neither good nor bad: "no database
yet", "systemd is not available here").

The unit is checked as the service will run: its ``Environment=`` lines, its ``EnvironmentFile=``,
and the keys file every ``kesoku`` command reads at start, so a key this shell has and the service
lacks (the service would answer with another model) is named, with ``kesoku service install`` as
the fix.
"""

from __future__ import annotations

import errno
import importlib.util
import os
import pwd
import shlex
import socket
import subprocess
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Literal, TypeVar

import msgspec
import trio

from kesoku.config.envfile import KEY_VARIABLES, env_file_path, read_env_file
from kesoku.config.redact import configured_secrets
from kesoku.config.settings import (
    Config,
    McpHttpServer,
    McpStdioServer,
    load_config,
    shadowed_variables,
)
from kesoku.host.adapters import AdapterEntry, adapter_entries, is_enabled, section_enabled
from kesoku.host.build import runtime_gates
from kesoku.host.checks import (
    Check,
    check_discord_token,
    check_gchat_subscription,
    check_model,
    check_sandbox,
)
from kesoku.host.control import short_address, socket_path
from kesoku.host.control_server import peer_credentials
from kesoku.host.service import UNIT_NAME, Scope, ServiceError, require_systemd
from kesoku.llm.factory import default_backend
from kesoku.mcp.client import describe
from kesoku.mcp.manager import McpManager, ServerStatus
from kesoku.store import Store
from kesoku.store.db import migrations
from kesoku.tools.sandbox import Sandbox
from kesoku.vocab.errors import ConfigError, StoreError

TIMEOUT_S = 30.0
"""Default bound of one live check: a model call, an MCP server's start, a systemctl call."""
GRACE_S = 10.0
"""A section may take twice its checks' bound plus this before it is reported as hanging."""
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "discord": ("discord", "trio_asyncio"),
    "gchat": ("google.cloud.pubsub_v1", "google.apps.chat_v1", "google.auth"),
}
"""The libraries each first-party adapter's extra brings (pyproject.toml), imported only in its
``serve``: loading the adapter does not tell whether they are installed."""
Mark = Literal["ok", "warn", "FAIL", "--"]
_T = TypeVar("_T")


class Finding(msgspec.Struct, frozen=True):
    """One line of the report.

    Attributes:
        check: What was checked, what was seen and the fix.
        neutral: A fact rather than a verdict ("no database yet"): shown ``--``; it never fails.
    """

    check: Check
    neutral: bool = False

    @property
    def mark(self) -> Mark:
        """``FAIL`` when it does not work, ``--`` for a fact, ``warn`` with a fix, else ``ok``."""
        if not self.check.ok:
            return "FAIL"
        if self.neutral:
            return "--"
        return "warn" if self.check.fix else "ok"

    def lines(self) -> list[str]:
        """The finding as shown: the mark, what and what was seen; the fix indented below."""
        check = self.check
        out = [f"{self.mark:<4}  {check.what}: {check.detail}"]
        if check.fix:
            out.append(f"      → {check.fix}")
        return out


def ok(what: str, detail: str, fix: str = "") -> Finding:
    """It works (a ``fix`` makes it a warning)."""
    return Finding(Check(ok=True, what=what, detail=detail, fix=fix))


def fail(what: str, detail: str, fix: str) -> Finding:
    """It does not work; ``fix`` says what to do."""
    return Finding(Check(ok=False, what=what, detail=detail, fix=fix))


def fact(what: str, detail: str, fix: str = "") -> Finding:
    """Neither good nor bad; ``fix`` is a hint."""
    return Finding(Check(ok=True, what=what, detail=detail, fix=fix), neutral=True)


# -- the whole report ---------------------------------------------------------------------------


async def diagnose(
    cfg: Config,
    config_path: Path | None,
    *,
    call_model: bool = True,
    timeout_s: float = TIMEOUT_S,
    env: Mapping[str, str] | None = None,
    on_section: Callable[[list[Finding]], None] | None = None,
) -> list[Finding]:
    """Run every section concurrently; the findings in the fixed order of the sections.

    Args:
        cfg: The loaded config.
        config_path: The file it came from (None: built-in defaults).
        call_model: Make one live call to each model backend the config uses.
        timeout_s: Bound of one live check (a model call, an MCP server's start, systemctl).
        env: The environment (after the keys file was applied); ``os.environ`` when None.
        on_section: Called with each section's findings as soon as it and every section before it
            are done, so a screen fills from the top in a stable order.

    Returns:
        Every finding, sections in order.

    Cancellation:
        Cancelling stops every section at once; threads still running a blocking check (a database
        open, a systemctl call) are abandoned and end on their own.
    """
    env = os.environ if env is None else env
    sections: list[tuple[str, Callable[[], Awaitable[list[Finding]]]]] = [
        ("config", partial(_thread, config_findings, config_path)),
        ("keys", partial(_thread, key_findings, config_path, env)),
        ("model", partial(model_findings, cfg, call=call_model, timeout_s=timeout_s)),
        ("adapters", partial(adapter_findings, cfg, timeout_s=timeout_s)),
        ("MCP servers", partial(mcp_findings, cfg, config_path, timeout_s=timeout_s)),
        ("sandbox", partial(sandbox_findings, cfg)),
        ("database", partial(_thread, database_findings, cfg)),
        ("service", partial(service_findings, config_path, env, timeout_s=timeout_s)),
    ]
    done: list[list[Finding] | None] = [None] * len(sections)
    shown = 0

    async def run(index: int, name: str, section: Callable[[], Awaitable[list[Finding]]]) -> None:
        nonlocal shown
        done[index] = await _bounded(name, section, 2 * timeout_s + GRACE_S)
        while shown < len(done) and (ready := done[shown]) is not None:
            shown += 1
            if on_section is not None:
                on_section(ready)

    async with trio.open_nursery() as nursery:
        for index, (name, section) in enumerate(sections):
            nursery.start_soon(run, index, name, section, name=f"doctor: {name}")
    return [finding for section in done for finding in section or ()]


async def _bounded(
    name: str, section: Callable[[], Awaitable[list[Finding]]], bound_s: float
) -> list[Finding]:
    """A section's findings; one failed line when it raised or did not finish in ``bound_s``."""
    with trio.move_on_after(bound_s):
        try:
            return await section()
        except Exception as exc:  # a check that breaks must not hide the others
            return [fail(name, f"the check itself broke: {describe(exc)}", "report it as a bug")]
    return [fail(name, f"no answer within {bound_s:g} s", "a larger --timeout gives it longer")]


async def _thread(function: Callable[..., _T], *args: object) -> _T:
    """A blocking check (files, SQLite, subprocesses) in a worker thread, abandoned if cancelled."""
    return await trio.to_thread.run_sync(partial(function, *args), abandon_on_cancel=True)


# -- config and keys ----------------------------------------------------------------------------


def config_findings(config_path: Path | None) -> list[Finding]:
    """Which config was read (it loaded, or the doctor would not run)."""
    if config_path is None:
        return [
            fact(
                "config",
                "built-in defaults (no kesoku.toml here)",
                "-c FILE or $KESOKU_CONFIG names one; `kesoku config schema` lists every key",
            )
        ]
    return [ok("config", os.fspath(Path(config_path).absolute()))]


def key_findings(config_path: Path | None, env: Mapping[str, str]) -> list[Finding]:
    """The keys file (where, its mode), and the keys set: names and where each comes from.

    Args:
        config_path: The config file (its own keys are named too), or None.
        env: The environment after the keys file was applied (the shell's own values win).
    """
    path = env_file_path(env)
    findings: list[Finding] = []
    try:
        stored = read_env_file(path)
    except ConfigError as exc:
        stored = {}
        findings.append(fail("keys file", str(exc), f"fix that line of {path}, or run kesoku init"))
    else:
        findings.append(_keys_file_finding(path, stored))
    found = []
    for name in KEY_VARIABLES:
        value = env.get(name)
        if not value:
            continue
        if stored.get(name) == value:
            found.append(f"{name} (keys file)")
        elif name in stored:
            found.append(f"{name} (shell, over the keys file's)")
        else:
            found.append(f"{name} (shell)")
    in_config, shadowed = _config_secrets(config_path, env)
    if config_path is not None:
        found += [f"{kind} ({config_path.name})" for kind in in_config]
    if found:
        findings.append(ok("keys", ", ".join(found)))
    else:
        # No hint here: the backend line says what a key would change.
        findings.append(fact("keys", "none in the shell, the keys file or the config"))
    if shadowed and config_path is not None:
        keys = ", ".join(key for key, _ in shadowed)
        variables = ", ".join(f"${name}" for _, name in shadowed)
        findings.append(
            ok(
                "keys",
                f"{config_path.name} sets {keys}: it is used, not {variables}",
                f"remove {keys} from {config_path} to use {variables}",
            )
        )
    if in_config and config_path is not None:
        mode = _mode(config_path)
        if mode is not None and mode & 0o077:
            findings.append(
                ok(
                    "config file",
                    f"{config_path} holds {', '.join(in_config)} and other users may read it "
                    f"(mode {mode:04o})",
                    f"chmod 600 {shlex.quote(os.fspath(config_path))}, or move the keys to the "
                    "keys file (kesoku init)",
                )
            )
    return findings


def _keys_file_finding(path: Path, stored: Mapping[str, str]) -> Finding:
    mode = _mode(path)
    if mode is None:
        return fact("keys file", f"none at {path}", "kesoku init writes one (mode 0600)")
    if mode & 0o077:
        return ok(
            "keys file",
            f"{path} is open to other users (mode {mode:04o}), and it holds keys",
            f"chmod 600 {shlex.quote(os.fspath(path))}",
        )
    return ok("keys file", f"{path} (mode {mode:04o}): {len(stored)} variable(s)")


def _mode(path: Path) -> int | None:
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        return None


def _config_secrets(
    config_path: Path | None, env: Mapping[str, str]
) -> tuple[list[str], list[tuple[str, str]]]:
    """The config keys the file sets to a secret (``claude.api_key``), and those hiding a variable.

    The second list is :func:`~kesoku.config.settings.shadowed_variables` of ``env``.
    """
    if config_path is None:
        return [], []
    try:
        # env={}: what the file holds, not the environment's fallbacks.
        from_file = load_config(config_path, env={})
    except ConfigError:
        return [], []
    kinds = configured_secrets(from_file, {}).values()
    # The credentials file's fields are that file's, not the config's.
    own = sorted({kind for kind in kinds if not kind.startswith("gchat.credentials_file")})
    return own, shadowed_variables(from_file, env)


# -- model backends -----------------------------------------------------------------------------


def backends(cfg: Config) -> list[str]:
    """The backends the config uses: the default one first, then fallbacks and overrides."""
    primary = cfg.agent.llm or default_backend(cfg)[0]
    named = [
        primary,
        *cfg.agent.fallback,
        *(c.llm for c in cfg.discord.channels if c.llm),
        *([cfg.gchat.llm] if cfg.gchat.llm else []),
        *(s.llm for s in cfg.gchat.spaces if s.llm),
    ]
    return list(dict.fromkeys(named))


async def model_findings(cfg: Config, *, call: bool, timeout_s: float) -> list[Finding]:
    """How the backend was chosen, then one live call to each backend the config uses."""
    findings = []
    if cfg.agent.llm is None:
        name, reason = default_backend(cfg)
        hint = (
            "kesoku init (or export ANTHROPIC_API_KEY, GEMINI_API_KEY or OPENAI_API_KEY) for a "
            "larger model"
            if name == "local"
            else ""
        )
        findings.append(fact("backend", f"{name}: {reason}", hint))
    names = backends(cfg)
    results: dict[str, Check] = {}

    async def one(name: str) -> None:
        results[name] = await check_model(cfg, name, timeout_s=timeout_s, call=call)

    async with trio.open_nursery() as nursery:
        for name in names:
            nursery.start_soon(one, name)
    # Not called, a backend that builds proves only its key and extra are there: neither ok nor not
    return [
        *findings,
        *(
            Finding(r) if call or not r.ok else fact(r.what, r.detail)
            for r in (results[n] for n in names)
        ),
    ]


# -- chat adapters ------------------------------------------------------------------------------


async def adapter_findings(cfg: Config, *, timeout_s: float) -> list[Finding]:
    """Each enabled adapter: it loads, its extra is installed, its credentials work."""
    entries = await _thread(adapter_entries)
    found: dict[str, list[Finding]] = {}

    async def one(entry: AdapterEntry) -> None:
        if section_enabled(entry.name, cfg) is False:
            return  # as the daemon: a disabled adapter is not even imported
        try:
            adapter = await _thread(entry.load)
        except Exception as exc:
            found[entry.name] = [_load_failure(entry, exc)]
            return
        try:
            enabled = is_enabled(entry, adapter, cfg)
        except Exception as exc:  # a third party's enabled(): its failure, not the doctor's
            fix = "fix or remove the package that registers this adapter"
            found[entry.name] = [
                fail(f"adapter {entry.name}", f"its enabled() failed: {describe(exc)}", fix)
            ]
            return
        if enabled:
            found[entry.name] = await _adapter_checks(entry.name, cfg, timeout_s)

    async with trio.open_nursery() as nursery:
        for entry in entries:
            nursery.start_soon(one, entry)
    if not found:
        return [
            fact(
                "adapters",
                "none enabled: only kesoku chat reaches the agent",
                "[discord] or [gchat] enabled = true puts it on a chat server",
            )
        ]
    return [finding for entry in entries for finding in found.get(entry.name, ())]


def _load_failure(entry: AdapterEntry, exc: Exception) -> Finding:
    fix = (
        f"pip install 'kesoku[{entry.name}]'"
        if isinstance(exc, ImportError) and entry.name in EXTRA_MODULES
        else "reinstall kesoku (or the package that registers this adapter)"
    )
    return fail(f"adapter {entry.name}", f"cannot load {entry.value}: {describe(exc)}", fix)


def _missing_modules(name: str) -> list[str]:
    missing = []
    for module in EXTRA_MODULES.get(name, ()):
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:  # a parent package is missing
            found = False
        if not found:
            missing.append(module)
    return missing


async def _adapter_checks(name: str, cfg: Config, timeout_s: float) -> list[Finding]:
    missing = await _thread(_missing_modules, name)
    if missing:
        return [
            fail(
                f"adapter {name}",
                f"enabled, but its libraries are not installed ({', '.join(missing)})",
                f"pip install 'kesoku[{name}]'",
            )
        ]
    if name == "discord":
        token = cfg.discord.bot_token
        if not token:
            return [
                fail(
                    "adapter discord",
                    "enabled, but no bot token",
                    "set DISCORD_TOKEN (kesoku init stores it) or [discord] bot_token",
                )
            ]
        base = cfg.discord.api_base_url
        return [Finding(await check_discord_token(token, api_base_url=base, timeout_s=timeout_s))]
    if name == "gchat":
        return await _gchat_checks(cfg, timeout_s)
    return [ok(f"adapter {name}", "enabled; loads")]


async def _gchat_checks(cfg: Config, timeout_s: float) -> list[Finding]:
    gchat = cfg.gchat
    project, subscription = gchat.project_id, gchat.subscription
    if not project or not subscription:
        unset = [
            key
            for key, value in (("gchat.project_id", project), ("gchat.subscription", subscription))
            if not value
        ]
        return [
            fail(
                "adapter gchat",
                f"enabled, but {' and '.join(unset)} unset",
                "set them in kesoku.toml (the Pub/Sub subscription your Chat app publishes to)",
            )
        ]
    credentials = gchat.credentials_file
    if credentials is not None and not os.access(credentials, os.R_OK):
        return [
            fail(
                "adapter gchat",
                f"cannot read the credentials file {credentials}",
                "fix gchat.credentials_file (or GOOGLE_APPLICATION_CREDENTIALS) or its mode",
            )
        ]
    check = await check_gchat_subscription(project, subscription, credentials, timeout_s=timeout_s)
    return [Finding(check)]


# -- MCP servers --------------------------------------------------------------------------------


async def mcp_findings(cfg: Config, config_path: Path | None, *, timeout_s: float) -> list[Finding]:
    """One line per configured MCP server: connected with its tools, disabled, or why it failed."""
    if not cfg.mcp.servers:
        return [fact("MCP servers", "none configured")]
    sandbox = None
    if any(isinstance(s, McpStdioServer) and s.sandbox for s in cfg.mcp.servers):
        gates = await _thread(runtime_gates, cfg, config_path)
        sandbox = Sandbox.from_config(cfg, gates)
    manager = McpManager(
        cfg.mcp, connect_timeout_s=timeout_s, startup_wait_s=timeout_s + 1.0, sandbox=sandbox
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.serve)
        statuses = manager.statuses()
        nursery.cancel_scope.cancel()
    servers = {s.name: s for s in cfg.mcp.servers}
    return [_mcp_finding(status, servers[status.name]) for status in statuses]


def _mcp_finding(status: ServerStatus, server: McpStdioServer | McpHttpServer) -> Finding:
    what = f"MCP {status.name}"
    if status.state == "connected":
        offers = f"{len(status.tools)} tool(s)"
        if status.prompts:
            offers += f", {len(status.prompts)} prompt(s)"
        return ok(what, f"connected ({status.transport}): {offers}")
    if status.state == "disabled":
        return fact(what, "disabled (enabled = false)")
    if isinstance(server, McpStdioServer):
        fix = (
            f"check its command ({server.command}), args and env in [[mcp.servers]]; "
            "`kesoku mcp list` shows it once it connects"
        )
    else:
        fix = "check its url and headers in [[mcp.servers]], and that the server is up"
    why = status.error or "still connecting when the time was up"
    return fail(what, why, fix)


# -- sandbox ------------------------------------------------------------------------------------


async def sandbox_findings(cfg: Config) -> list[Finding]:
    """Whether the tools' OS sandbox works here (bubblewrap, or Landlock)."""
    return [Finding(await _thread(check_sandbox, cfg))]


# -- database -----------------------------------------------------------------------------------


def database_findings(cfg: Config) -> list[Finding]:
    """The database: it opens, its schema is this Kesoku's, it is writable; its size and sessions.

    Opening it applies the migrations it lacks, as any ``kesoku`` command (and the next start)
    would. No database yet is a fact: the first message makes it.
    """
    path = Path(cfg.workspace.db_path)
    if not path.exists():
        folder = next(p for p in path.parents if p.exists())
        if not os.access(folder, os.W_OK | os.X_OK):
            return [
                fail(
                    "database",
                    f"none yet at {path}, and {folder} is not writable: the first message fails",
                    f"make {folder} writable, or point workspace.db_path elsewhere",
                )
            ]
        return [fact("database", f"none yet at {path}: made at the first message")]
    try:
        store = Store(path)
    except StoreError as exc:
        return [fail("database", str(exc), "point workspace.db_path at another file")]
    try:
        sessions = len(store.list_sessions())
    finally:
        store.close()
    for writable in (path, path.parent):
        if not os.access(writable, os.W_OK):
            return [
                fail(
                    "database",
                    f"{writable} is not writable by this user",
                    f"chmod u+w {shlex.quote(os.fspath(writable))}, or run as its owner",
                )
            ]
    size = sum(_size(Path(f"{path}{suffix}")) for suffix in ("", "-wal"))
    schema = migrations()[-1].version  # opening migrated it to this Kesoku's newest
    detail = f"{path}: {sessions} session(s), {size / 1e6:.1f} MB, schema version {schema}"
    return [ok("database", detail), daemon_finding(path)]


def daemon_finding(db_path: Path) -> Finding:
    """Whether a daemon serves the database on its control socket (``kesoku chat`` goes there).

    A connection that sends nothing is closed by the daemon without a word; the daemon's pid is
    the socket peer's (``SO_PEERCRED``).
    """
    path = socket_path(db_path)
    if not path.exists():
        return fact("daemon", f"none serves {db_path.name}: kesoku chat runs its own runtime")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with short_address(path) as address:
            sock.connect(address)
        pid, _ = peer_credentials(sock)
    except OSError as exc:
        if exc.errno == errno.EACCES:
            return fail(
                "daemon",
                f"{path} is not this user's to reach ({exc.strerror})",
                "run kesoku chat as the daemon's user, or with --local",
            )
        return fact(
            "daemon",
            f"none answers at {path} (left by a daemon that stopped): kesoku chat runs its own "
            "runtime",
            "the next kesoku start replaces it",
        )
    finally:
        sock.close()
    return ok("daemon", f"pid {pid} serves {db_path.name} at {path}: kesoku chat goes through it")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


# -- the systemd unit ---------------------------------------------------------------------------


class UnitFile(msgspec.Struct, frozen=True, kw_only=True):
    """What a ``kesoku.service`` file says, as far as the doctor needs.

    Attributes:
        exec_start: ExecStart's words (specifiers and ``$$`` undone).
        environment: ``Environment=`` assignments, in order.
        env_files: ``EnvironmentFile=`` paths (a leading ``-``, "may be missing", dropped).
        user: ``User=``, or None.
    """

    exec_start: tuple[str, ...] = ()
    environment: dict[str, str] = {}
    env_files: tuple[str, ...] = ()
    user: str | None = None

    @property
    def config(self) -> str | None:
        """The ``-c`` argument of ExecStart."""
        words = self.exec_start
        return next((words[i + 1] for i, w in enumerate(words[:-1]) if w == "-c"), None)


def parse_unit(text: str) -> UnitFile:
    """The ExecStart, environment and user of a unit file (``systemd.syntax(7)``, as rendered).

    Raises:
        ValueError: A quoted value is not closed.
    """
    exec_start: list[str] = []
    environment: dict[str, str] = {}
    env_files: list[str] = []
    user = None
    for raw in text.splitlines():
        key, sep, value = raw.strip().partition("=")
        if not sep or key.startswith(("#", ";")):
            continue
        value = value.strip()
        if key == "ExecStart":
            exec_start = [_unspecified(w).replace("$$", "$") for w in shlex.split(value)]
        elif key == "Environment":
            for word in shlex.split(value):
                name, _, setting = _unspecified(word).partition("=")
                environment[name] = setting
        elif key == "EnvironmentFile":
            env_files.append(_unspecified(value.removeprefix("-")))
        elif key == "User":
            user = value
    return UnitFile(
        exec_start=tuple(exec_start),
        environment=environment,
        env_files=tuple(env_files),
        user=user,
    )


def _unspecified(text: str) -> str:
    return text.replace("%%", "%")


async def service_findings(
    config_path: Path | None, env: Mapping[str, str], *, timeout_s: float
) -> list[Finding]:
    """The unit of each scope that has one: what it runs, its keys, whether it is active."""
    scopes = [scope for scope in (Scope(True), Scope(False)) if scope.unit_path(env).exists()]
    if not scopes:
        try:
            await _thread(require_systemd, Scope(True), env)
        except ServiceError as exc:
            return [fact("service", f"not installed; {exc}")]
        return [
            fact(
                "service",
                "not installed",
                "kesoku service install runs Kesoku at boot under systemd",
            )
        ]
    findings: list[Finding] = []
    for scope in scopes:
        findings += await _thread(unit_findings, scope, config_path, env)
        findings.append(await _thread(active_finding, scope, env, timeout_s))
    return findings


def unit_findings(scope: Scope, config_path: Path | None, env: Mapping[str, str]) -> list[Finding]:
    """An installed unit: the Python and config it runs, and whether it carries the keys needed.

    Args:
        scope: The unit's scope (it is installed).
        config_path: The config this doctor read (None: built-in defaults).
        env: This process's environment, the keys file applied.
    """
    path = scope.unit_path(env)
    what = f"service ({scope.name} unit)"
    again = f"kesoku service install{'' if scope.user else ' --system'} -c CONFIG"
    try:
        unit = parse_unit(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return [fail(what, f"cannot read {path}: {exc}", again)]
    findings: list[Finding] = []
    python = unit.exec_start[0] if unit.exec_start else ""
    if not python or not os.access(python, os.X_OK):
        findings.append(
            fail(what, f"ExecStart runs {python or 'nothing'}, which is missing", again)
        )
    unit_config = unit.config
    if unit_config is None:
        return [*findings, fail(what, f"{path} runs no -c config", again)]
    again = again.replace("CONFIG", shlex.quote(unit_config))
    words = list(unit.exec_start)
    if "-m" in words and "-P" not in words[: words.index("-m")]:
        findings.append(
            fail(
                what,
                "ExecStart runs python -m without -P: it imports from its working folder first, "
                "where the agent may write (a unit from before -P)",
                again,
            )
        )
    here = Path(config_path).resolve() if config_path is not None else None
    if here != Path(unit_config).resolve():
        findings.append(
            ok(
                what,
                f"runs {unit_config}, not {here or 'the built-in defaults'} (checked here)",
                f"kesoku doctor -c {shlex.quote(unit_config)} checks the service's config",
            )
        )
    else:
        findings.append(ok(what, f"{path}: runs {unit_config}"))
    try:
        service_env = _service_env(scope, unit, env)
    except ConfigError as exc:
        fix = (
            "fix that file, or run kesoku service install again"
            if scope.user
            else "run kesoku doctor with sudo to check them (root owns the unit's keys)"
        )
        return [*findings, ok(what, f"its keys were not checked: {exc}", fix)]
    return [*findings, _keys_carried(what, unit_config, env, service_env, again)]


def _service_env(scope: Scope, unit: UnitFile, env: Mapping[str, str]) -> dict[str, str]:
    """The environment ``kesoku start`` will see under the unit (manager's own variables aside).

    Its Environment=, overridden by its EnvironmentFile= (systemd.exec(5)), then the keys file of
    the user it runs as for what is still unset (every kesoku command reads it at start).

    Raises:
        ConfigError: An EnvironmentFile cannot be read (a system unit's is root's) or is malformed.
    """
    service = dict(unit.environment)
    for file in unit.env_files:
        service |= read_env_file(Path(file))
    if scope.user or unit.user is None:
        keys_file = env_file_path(env)
    else:
        try:
            home = pwd.getpwnam(unit.user).pw_dir
        except KeyError:
            raise ConfigError(f"User={unit.user}: no such user here") from None
        keys_file = env_file_path({"HOME": home})
    for name, value in read_env_file(keys_file).items():
        if not service.get(name):
            service[name] = value
    return service


def _credentials(cfg: Config) -> dict[str, str | None]:
    """The config keys that carry credentials or endpoints of what this config uses."""
    out: dict[str, str | None] = {}
    for backend in backends(cfg):
        if backend == "gemini":
            g = cfg.gemini
            out |= {"gemini.api_key": g.api_key, "gemini.project_id": g.project_id}
        elif backend == "claude":
            c = cfg.claude
            out |= {"claude.api_key": c.api_key, "claude.project_id": c.project_id}
        elif backend == "openai":
            o = cfg.openai
            out |= {"openai.api_key": o.api_key, "openai.base_url": o.base_url}
    if cfg.discord.enabled:
        out["discord.bot_token"] = cfg.discord.bot_token
    if cfg.gchat.enabled:
        out |= {
            "gchat.credentials_file": cfg.gchat.credentials_file,
            "gchat.project_id": cfg.gchat.project_id,
        }
    return out


def _keys_carried(
    what: str,
    unit_config: str,
    env: Mapping[str, str],
    service_env: Mapping[str, str],
    again: str,
) -> Finding:
    """Whether the service's environment gives its config what this shell's gives it."""
    try:
        here = load_config(unit_config, env=env)
        there = load_config(unit_config, env=service_env)
    except ConfigError as exc:
        return fail(
            what, f"its config does not load: {exc}", f"kesoku config check -c {unit_config}"
        )
    lacking = sorted(n for n in KEY_VARIABLES if env.get(n) and not service_env.get(n))
    names = f" ({', '.join(lacking)})" if lacking else ""
    fix = f"{again}: it carries the keys of this shell and of the keys file"
    ours, theirs = default_backend(here)[0], default_backend(there)[0]
    if here.agent.llm is None and ours != theirs:
        model = "the small offline model" if theirs == "local" else theirs
        return fail(
            what,
            f"its environment lacks keys this shell has{names}: the service would answer with "
            f"{model}, not {ours}",
            fix,
        )
    needed, given = _credentials(here), _credentials(there)
    missing = [key for key, value in needed.items() if value and not given.get(key)]
    if missing:
        return fail(what, f"its environment leaves {', '.join(missing)} unset{names}", fix)
    differ = [key for key, value in needed.items() if value and given.get(key) != value]
    if differ:
        return ok(
            what,
            f"its {', '.join(differ)} differ from this shell's (the shell's are checked here)",
            f"{again} gives it this shell's; or unset them in this shell",
        )
    carried = sorted(key for key, value in needed.items() if value)
    detail = ", ".join(carried) if carried else "none needed"
    return ok(what, f"its environment carries the keys its config uses: {detail}")


def active_finding(scope: Scope, env: Mapping[str, str], timeout_s: float) -> Finding:
    """``systemctl is-active``; systemd out of reach is a fact, not a failure."""
    what = f"service ({scope.name} unit)"
    flag = "" if scope.user else " --system"
    try:
        systemctl = require_systemd(scope, env)
    except ServiceError as exc:
        return fact(what, f"cannot tell whether it runs: {exc}")
    try:
        done = subprocess.run(
            [systemctl, *scope.flags, "is-active", UNIT_NAME],
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return fact(what, f"cannot tell whether it runs: {describe(exc)}")
    state = done.stdout.strip() or "unknown"
    if state in ("active", "reloading", "activating"):
        return ok(what, state)
    if state == "failed":
        return fail(
            what,
            "failed",
            f"kesoku service logs{flag} shows why; then kesoku service restart{flag}",
        )
    return ok(what, f"{state}: installed but not running", f"kesoku service start{flag}")


def summary(findings: Sequence[Finding]) -> str:
    """The last line: how many problems and warnings, or that all is well."""
    problems = sum(f.mark == "FAIL" for f in findings)
    warnings = sum(f.mark == "warn" for f in findings)
    if not problems and not warnings:
        return "all well"
    parts = [f"{problems} problem(s)"] if problems else []
    parts += [f"{warnings} warning(s)"] if warnings else []
    return ", ".join(parts) + ": each line above says what to do"
