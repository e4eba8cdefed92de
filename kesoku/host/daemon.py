"""``kesoku start``: the foreground daemon — runtime, adapters and a signal watcher.

Task tree under ``trio.run`` (ARCHITECTURE.md, "Task tree")::

    root nursery ─┬─ signal watcher: SIGTERM/SIGINT → graceful stop; SIGHUP → reload kesoku.toml
                  ├─ runtime scope ── Runtime.serve (turn logs, dispatcher → workers)
                  │                   + turn-metrics log
                  └─ adapters scope ── one task per enabled adapter (each failure reported,
                                       the adapter restarted with backoff; others go on)

Graceful stop: the runtime scope is cancelled first, which cuts model streams at once; a running
tool batch is shielded and finishes (its results are posted). If tools still run after
``agent.shutdown_grace_s`` (or at a second SIGTERM/SIGINT) they are killed (outcome ``killed``, the
result naming the shutdown as the reason). Adapters are cancelled last, so they can still deliver
what the finishing tools produced. Turns cut this way stay ``processing`` and resume at the next
start (ARCHITECTURE.md, "Task tree"): the model then sees which tools the shutdown killed.

Logging is one line per event on stderr: under journald (``$JOURNAL_STREAM``) each line starts with
a syslog priority (``<4>``) so ``journalctl -p warning`` filters it, and without a terminal there is
no ANSI.

The module also holds what ``kesoku chat`` shares with the daemon: :func:`build_runtime`, which also
decides which sessions a process answers (a daemon and a chat on one database must not both answer).
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import trio

from kesoku.agent.dispatcher import Dispatcher

if TYPE_CHECKING:
    from kesoku.agent.runtime import Runtime, ToolSource
    from kesoku.config.settings import Config
    from kesoku.host.adapters import Adapter, AdapterEntry
    from kesoku.store import Store
    from kesoku.tools.base import Tool
    from kesoku.tools.paths import PathGates
    from kesoku.tools.sandbox import Sandbox
    from kesoku.tools.skill_library import SkillLibrary
    from kesoku.vocab.model import Message

log = logging.getLogger("kesoku.host.daemon")

_GROUPS = frozenset({"agent", "config", "host", "observe", "vocab"})
"""Packages that only group modules: a log line names the module (``daemon``, ``turn``)."""

INTERACTIVE_ADAPTER = "terminal"
"""Sessions of this adapter belong to the ``kesoku chat`` that opened them, never to the daemon."""
KILL_WAIT_S = 10.0
"""How long the results of tools killed at the end of the grace period may take to be posted."""
RESTART_MIN_S = 1.0
"""The first delay before a failed adapter is started again (doubled at each failure in a row)."""
RESTART_MAX_S = 60.0
"""The longest delay between two restarts of an adapter."""
RESTART_RESET_S = 120.0
"""An adapter that ran this long before failing starts again after :data:`RESTART_MIN_S`."""
SESSION_CACHE_SIZE = 4096
"""Sessions whose owner (adapter) the daemon caches, to route user messages without a query each."""
LIVE_KEYS = (
    "agent.persona",
    "agent.max_steps_per_turn",
    "agent.worker_idle_s",
    "agent.shutdown_grace_s",
)
"""Keys a SIGHUP applies to the running daemon; every other change needs a restart."""
# Chatty libraries log every HTTP request at INFO: one line per event means ours, not theirs.
_QUIET_LOGGERS = (
    "httpx",
    "httpx2",
    "httpcore",
    "httpcore2",
    "hpack",
    "google_genai",
    "anthropic",
    "openai",
)
_EXTRAS = ("discord", "gchat")
"""First-party adapters whose dependencies come with the extra of the same name."""
_SYSLOG_PRIORITY = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}
_COLORS = {
    logging.DEBUG: "2",
    logging.INFO: "36",
    logging.WARNING: "33",
    logging.ERROR: "31",
    logging.CRITICAL: "1;31",
}


# -- the runtime of a process ---------------------------------------------------------------------


def runtime_gates(
    config: Config,
    *,
    config_file: Path | None = None,
    skills: SkillLibrary | None = None,
) -> PathGates:
    """The path gates of a process: one set for the file tools, the shell and every adapter.

    Args:
        config: The loaded config.
        config_file: The file it came from: never read, written or shared (it can hold keys).
        skills: The skills library, whose folders are readable without taint; None: the one of
            ``workspace.skills_dir`` and the bundled skills.

    Returns:
        :meth:`PathGates.from_config` of the config, its file and the skills folders.
    """
    from kesoku.tools.paths import PathGates
    from kesoku.tools.skill_library import SkillLibrary

    skills = skills if skills is not None else SkillLibrary.from_config(config)
    trusted = [folder for folder, _ in skills.dirs]
    return PathGates.from_config(config, config_file=config_file, trusted_roots=trusted)


def default_tools(
    config: Config,
    *,
    config_file: Path | None = None,
    skills: SkillLibrary | None = None,
    gates: PathGates | None = None,
    sandbox: Sandbox | None = None,
) -> tuple[Tool, ...]:
    """The tools kesoku.toml enables, the same for the daemon and ``kesoku chat``.

    The file tools (read, write, edit, list, glob, grep: always, through the path gates), the shell
    tool (``[shell] enabled``), run_code (``[run_code] enabled``) and the skill tools (list_skills,
    use_skill). MCP servers' tools come and go: the runtime asks its tool source (kesoku.mcp) at
    every step. The subagent tool is the runtime's own. The shell and run_code are left out where no
    OS sandbox works (``[sandbox] mode`` not ``off``), unless the sandbox asks the user instead (the
    terminal).

    Args:
        config: The loaded config.
        config_file: The file it came from: the tools may not read it (it can hold keys).
        skills: The skills library; None: the one of ``workspace.skills_dir`` and the bundled
            skills.
        gates: The process's path gates; None: the sandbox's, else :func:`runtime_gates` of the
            arguments above.
        sandbox: What confines tool processes; None: ``[sandbox]`` over these gates, refusing to run
            unsandboxed (probed now: blocking, about 10 ms).
    """
    from kesoku.tools.files import file_tools
    from kesoku.tools.sandbox import Sandbox
    from kesoku.tools.skill_library import SkillLibrary
    from kesoku.tools.skills import skill_tools

    skills = skills if skills is not None else SkillLibrary.from_config(config)
    if gates is None:
        gates = (
            sandbox.gates
            if sandbox is not None
            else runtime_gates(config, config_file=config_file, skills=skills)
        )
    sandbox = sandbox if sandbox is not None else Sandbox.from_config(config, gates)
    max_bytes = config.shell.max_output_bytes
    tools = list(file_tools(gates, max_output_bytes=max_bytes))
    runs_processes = sandbox.ask_unsandboxed or sandbox.probe().mechanism is not None
    if config.shell.enabled and runs_processes:
        from kesoku.tools.shell import shell_tool

        tools.append(shell_tool(config.shell, sandbox))
    if config.run_code.enabled and runs_processes:
        from kesoku.tools.run_code import run_code_tool

        tools.append(
            run_code_tool(config.run_code, sandbox, ask_always=config.shell.mode == "allowlist")
        )
    tools.extend(skill_tools(skills, max_output_bytes=max_bytes))
    return tuple(tools)


class ScopedDispatcher(Dispatcher):
    """A dispatcher that answers only the sessions ``serves`` accepts (crash recovery included).

    Args:
        rt: The runtime.
        serves: Takes a session id; True when this process answers that session.
    """

    def __init__(self, rt: Runtime, serves: Callable[[str], bool]) -> None:
        super().__init__(rt)
        self.serves = serves

    def submit(self, message: Message) -> None:
        """Queue a user message of a served session; others are left to the process owning them."""
        if self.serves(message.session_id):
            super().submit(message)


def build_runtime(
    config: Config,
    store: Store,
    *,
    config_file: Path | None = None,
    llm_name: str | None = None,
    serves: Callable[[str], bool] | None = None,
    interactive: bool = False,
) -> Runtime:
    """The gateway and runtime kesoku.toml describes, over an open store.

    The gateway masks the secrets of the config and of this process's environment in every message
    (:class:`~kesoku.config.redact.Redactor`).

    Args:
        config: The loaded config.
        store: The store over ``workspace.db_path``; the caller closes it.
        config_file: The file the config came from (denied to the tools and never shared by an
            adapter: ``rt.gates`` protects it).
        llm_name: A backend overriding ``agent.llm``.
        serves: Which sessions this process answers (by id); None: all.
        interactive: A person at a terminal answers (``kesoku chat``): where no sandbox works the
            tools ask before running unsandboxed, and the sandbox is probed at the first call;
            otherwise it is probed now and such tools are not offered.

    Returns:
        The runtime, not yet serving.

    Raises:
        OperatorError: The backend cannot be built (see :meth:`Runtime.from_config`).
    """
    from kesoku.agent.runtime import Runtime
    from kesoku.config.redact import Redactor
    from kesoku.gateway import Gateway
    from kesoku.tools.sandbox import Sandbox
    from kesoku.tools.skill_library import SkillLibrary

    # Secrets are masked at the gateway: the store, turn logs, traces and the model see them masked.
    gateway = Gateway(store, config.workspace.sessions_dir, redactor=Redactor.from_config(config))
    skills = SkillLibrary.from_config(config)
    # parse once now: each turn then only checks the files for changes (~15 µs a skill)
    skills.scan()
    gates = runtime_gates(config, config_file=config_file, skills=skills)
    sandbox = Sandbox.from_config(config, gates, ask_unsandboxed=interactive)
    tools = default_tools(config, skills=skills, gates=gates, sandbox=sandbox)
    sources: list[ToolSource] = []
    if any(server.enabled for server in config.mcp.servers):
        # light: the mcp SDK loads in a thread at the first connection
        from kesoku.mcp.manager import McpManager

        sources.append(
            McpManager(config.mcp, max_output_bytes=config.shell.max_output_bytes, sandbox=sandbox)
        )
    rt = Runtime.from_config(
        config,
        gateway,
        tools=tools,
        llm_name=llm_name,
        skills=skills.summaries,
        tool_sources=sources,
        gates=gates,
    )
    rt.sandbox = sandbox
    if serves is not None:
        rt.dispatcher = ScopedDispatcher(rt, serves)
    return rt


def daemon_serves(store: Store) -> Callable[[str], bool]:
    """The daemon answers every session but terminal ones (their ``kesoku chat`` answers them)."""

    @functools.lru_cache(maxsize=SESSION_CACHE_SIZE)
    def serves(session_id: str) -> bool:
        session = store.get_session(session_id)
        return session is not None and session.adapter != INTERACTIVE_ADAPTER

    return serves


# -- logging --------------------------------------------------------------------------------------


class LineFormatter(logging.Formatter):
    """One event, one line: a traceback is folded into the line (`` | `` between its lines).

    Args:
        style: ``journal`` (syslog priority prefix, no timestamp: journald adds its own), ``tty``
            (time and a coloured level) or ``plain`` (ISO time, no ANSI).
    """

    def __init__(self, style: str) -> None:
        super().__init__()
        self.style = style

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line in this formatter's style."""
        text = record.getMessage()
        if record.exc_info:
            text = f"{text} | {self.formatException(record.exc_info)}"
        text = " | ".join(part.strip() for part in text.splitlines() if part.strip())
        name = record.name.removeprefix("kesoku.")
        group, _, module = name.partition(".")
        if group in _GROUPS and module:
            name = module
        level = record.levelname.lower()
        if self.style == "journal":
            return f"<{_SYSLOG_PRIORITY.get(record.levelno, 6)}>{level} {name}: {text}"
        if self.style == "tty":
            stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
            color = _COLORS.get(record.levelno, "0")
            return f"\x1b[2m{stamp}\x1b[0m \x1b[{color}m{level:<7}\x1b[0m {name}: {text}"
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(record.created))
        return f"{stamp} {level} {name}: {text}"


def configure_logging(
    stream: TextIO | None = None, *, level: int = logging.INFO
) -> logging.Handler:
    """Send the log to ``stream`` (stderr), one line per event, styled for where it goes.

    Args:
        stream: The stream; ``sys.stderr`` when None.
        level: The lowest level shown.

    Returns:
        The installed handler (it replaces the root logger's handlers).
    """
    stream = sys.stderr if stream is None else stream
    if os.environ.get("JOURNAL_STREAM") and not stream.isatty():
        style = "journal"
    elif stream.isatty() and not os.environ.get("NO_COLOR"):
        style = "tty"
    else:
        style = "plain"
    handler = logging.StreamHandler(stream)
    handler.setFormatter(LineFormatter(style))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    return handler


# -- the daemon -----------------------------------------------------------------------------------


def run(config_path: Path | None) -> int:
    """Run the daemon in the foreground until SIGTERM or SIGINT.

    Args:
        config_path: ``-c``; None: ``$KESOKU_CONFIG``, else ./kesoku.toml, else defaults.

    Returns:
        The exit code: 0 after a graceful stop.

    Raises:
        OperatorError: The config, database or backend cannot be used (one line, exit 2).
    """
    from kesoku import __version__
    from kesoku.config.settings import default_config_path, load_config, set_config
    from kesoku.store import Store

    configure_logging()
    raise_open_file_limit()
    path = config_path if config_path is not None else default_config_path()
    config = load_config(path)
    set_config(config)
    store = Store(config.workspace.db_path)
    try:
        rt = build_runtime(config, store, config_file=path, serves=daemon_serves(store))
        where = f"config {path.resolve()}" if path is not None else "no config file (defaults)"
        log.info(
            "kesoku %s starting: pid %d, %s, db %s",
            __version__,
            os.getpid(),
            where,
            config.workspace.db_path,
        )
        log_sandbox(rt.sandbox, config)
        daemon = Daemon(rt, config, path)
        try:
            return trio.run(daemon.serve)
        except KeyboardInterrupt:  # Ctrl-C before the signal watcher was listening
            log.info("interrupted during start-up")
            return 130
    finally:
        store.close()


def raise_open_file_limit() -> int | None:
    """Raise the soft open-file limit (``RLIMIT_NOFILE``) to the hard one; a log line if it moves.

    Many live sessions, each turn's HTTP connection, tool pipes and the store's files all need
    descriptors, and the common soft limit (1024) is far below the hard one (often 524288; systemd
    sets both from the unit's ``LimitNOFILE``). Raising the soft limit up to the hard one needs no
    privilege (getrlimit(2)).

    Returns:
        The soft limit now in force; None where the limit cannot be read.
    """
    try:
        import resource
    except ImportError:  # not a POSIX system
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY or soft >= hard:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        log.warning("open-file limit stays at %d (could not raise it to %d: %s)", soft, hard, exc)
        return soft
    log.info("open-file limit raised from %d to %d (the hard limit)", soft, hard)
    return hard


def log_sandbox(sandbox: Sandbox | None, config: Config) -> None:
    """The start-up line saying what confines tool processes; a warning when nothing does."""
    if sandbox is None:
        return
    probe = sandbox.probe()
    if probe.mechanism in ("bwrap", "landlock"):
        log.info("%s", sandbox.describe())
    elif probe.mechanism == "off":
        log.warning('%s; set [sandbox] mode = "auto" to confine them', sandbox.describe())
    elif config.shell.enabled or config.run_code.enabled:
        log.warning(
            "%s: the shell and run_code are not offered to chat sessions", sandbox.describe()
        )


class Backoff:
    """Delays between restarts of a failing adapter.

    They double from :data:`RESTART_MIN_S` to :data:`RESTART_MAX_S`, and start over once a run
    lasted :data:`RESTART_RESET_S` before it failed.

    Attributes:
        restarts: Restarts so far.
        delay_s: The last delay.
    """

    def __init__(self) -> None:
        self.restarts = 0
        self.delay_s = 0.0

    def after(self, ran_s: float) -> float:
        """The delay before the next restart, after a run of ``ran_s`` seconds that failed."""
        if ran_s >= RESTART_RESET_S or not self.delay_s:
            self.delay_s = RESTART_MIN_S
        else:
            self.delay_s = min(self.delay_s * 2, RESTART_MAX_S)
        self.restarts += 1
        return self.delay_s


class Daemon:
    """The daemon's tasks and its reaction to signals.

    Args:
        rt: The runtime (not yet serving).
        config: The loaded config.
        config_path: The file SIGHUP re-reads (None: the default lookup again).
        entries: The adapters to consider; None: every ``kesoku.adapters`` entry point.
    """

    def __init__(
        self,
        rt: Runtime,
        config: Config,
        config_path: Path | None,
        *,
        entries: list[AdapterEntry] | None = None,
    ) -> None:
        self.rt = rt
        self.config = config
        self.config_path = config_path
        self.entries = entries
        self.stopping = trio.Event()
        self.runtime_done = trio.Event()
        self.running_adapters: set[str] = set()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> int:
        """Serve until a stop signal (or :meth:`request_stop`), then stop gracefully.

        Returns:
            0.

        Cancellation:
            Cancelling from outside skips the grace period: tool batches still finish (they are
            shielded).
        """
        from kesoku.host.adapters import adapter_entries

        if self.entries is None:
            self.entries = adapter_entries()
        async with trio.open_nursery() as nursery:
            await nursery.start(self._watch_signals)
            runtime_scope: trio.CancelScope = await nursery.start(self._serve_runtime)
            adapters_scope: trio.CancelScope = await nursery.start(self._serve_adapters)
            log.info("ready: backend %s; waiting for messages", self._backend_name())
            task_status.started()
            await self.stopping.wait()
            runtime_scope.cancel()
            await self._wait_for_tools()
            adapters_scope.cancel()
            nursery.cancel_scope.cancel()
        log.info("stopped")
        return 0

    def request_stop(self) -> None:
        """Begin a graceful stop (what SIGTERM and SIGINT do)."""
        self.stopping.set()

    def kill_tools(self, why: str) -> int:
        """Kill the running tools of every session, leaving their turns to resume after the restart.

        Args:
            why: What cut them short, for their results (``agent.shutdown_grace_s ran out``).

        Returns:
            How many turns were running.
        """
        reason = f"Kesoku shut down ({why}); the turn resumes after the restart"
        return sum(
            worker.kill_tools(reason) for worker in list(self.rt.dispatcher.workers.values())
        )

    async def _wait_for_tools(self) -> None:
        grace_s = self.config.agent.shutdown_grace_s
        with trio.move_on_after(grace_s):
            await self.runtime_done.wait()
        if self.runtime_done.is_set():
            return
        log.warning(
            "tools still running after %g s (agent.shutdown_grace_s): killing them", grace_s
        )
        self.kill_tools(f"agent.shutdown_grace_s = {grace_s:g} s ran out")
        with trio.move_on_after(KILL_WAIT_S):
            await self.runtime_done.wait()
        if not self.runtime_done.is_set():
            log.error(
                "a tool ignores cancellation; waiting for it (systemd's TimeoutStopSec bounds this)"
            )
            await self.runtime_done.wait()

    # -- tasks ------------------------------------------------------------------------------------

    async def _watch_signals(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            task_status.started()
            async for signum in signals:
                name = signal.Signals(signum).name
                if signum == signal.SIGHUP:
                    self.reload()
                elif not self.stopping.is_set():
                    running = sum(w.turn is not None for w in self.rt.dispatcher.workers.values())
                    grace_s = self.config.agent.shutdown_grace_s
                    log.info(
                        "%s: stopping; %d running turn(s) get up to %g s for their tools",
                        name,
                        running,
                        grace_s,
                    )
                    self.request_stop()
                else:
                    log.warning("%s again: killing running tools now", name)
                    self.kill_tools(f"a second {name}")

    async def _serve_runtime(self, *, task_status: trio.TaskStatus[trio.CancelScope]) -> None:
        try:
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    # Subscribed first: a turn recovered at start may end before serve() returns.
                    await nursery.start(self._log_turns)
                    await nursery.start(self.rt.serve)
                    task_status.started(scope)
        finally:
            self.runtime_done.set()

    async def _log_turns(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        from kesoku.vocab.events import TurnEnded

        store = self.rt.store
        with self.rt.hub.subscribe() as events:
            task_status.started()
            async for event in events:
                if isinstance(event, TurnEnded):
                    session = store.get_session(event.session_id)
                    owner = session.adapter if session is not None else "deleted"
                    log.info("session %s (%s): %s", event.session_id, owner, event.metrics.render())

    async def _serve_adapters(self, *, task_status: trio.TaskStatus[trio.CancelScope]) -> None:
        with trio.CancelScope() as scope:
            task_status.started(scope)
            async with trio.open_nursery() as nursery:
                for entry in self.entries or ():
                    nursery.start_soon(self._serve_adapter, entry, name=f"adapter {entry.name}")

    async def _serve_adapter(self, entry: AdapterEntry) -> None:
        """Run one adapter if enabled, restarted with backoff when it fails; others never see it."""
        from kesoku.host.adapters import Adapter, is_enabled, section_enabled

        if section_enabled(entry.name, self.config) is False:
            return  # disabled adapters are not even imported
        try:
            adapter = entry.load()
        except Exception as exc:  # an ImportError, or any error of the module's own import
            log.error(
                "adapter %s: cannot load %s: %s%s",
                entry.name,
                entry.value,
                _describe(exc),
                _hint(entry, exc),
            )
            return
        if not is_enabled(entry, adapter, self.config):
            return
        if not isinstance(adapter, Adapter):
            log.error(
                "adapter %s: enabled, but %s has no serve() (not built yet); skipped",
                entry.name,
                entry.value,
            )
            return
        backoff = Backoff()
        while True:
            began = trio.current_time()
            failure = await self._run_adapter(entry, adapter, backoff.restarts)
            if failure is None:
                return
            delay_s = backoff.after(trio.current_time() - began)
            log.error(
                "adapter %s failed: %s%s; restart %d in %g s",
                entry.name,
                _describe(failure),
                _hint(entry, failure),
                backoff.restarts,
                delay_s,
                exc_info=failure,
            )
            await trio.sleep(delay_s)

    async def _run_adapter(
        self, entry: AdapterEntry, adapter: Adapter, restarts: int
    ) -> Exception | None:
        """Serve the adapter once; returns the failure to restart after, or None: no restart."""
        from kesoku.host.adapters import AdapterContext
        from kesoku.vocab.errors import OperatorError

        ctx = AdapterContext.of(self.rt)
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(functools.partial(adapter.serve, ctx, self.config))
                self.running_adapters.add(entry.name)
                again = f" again (restart {restarts})" if restarts else ""
                log.info("adapter %s: started%s", entry.name, again)
        except Exception as exc:
            leaf = _leaf(exc)
            # The operator's to fix: a restart would fail the same way.
            if isinstance(leaf, (OperatorError, ImportError)):
                why = f"{_describe(leaf)}{_hint(entry, leaf)}"
                log.error("adapter %s failed: %s; not restarted", entry.name, why)
                return None
            return leaf if isinstance(leaf, Exception) else exc
        else:
            log.info("adapter %s: stopped", entry.name)
            return None
        finally:
            self.running_adapters.discard(entry.name)

    # -- reload -----------------------------------------------------------------------------------

    def reload(self) -> None:
        """Re-read kesoku.toml (SIGHUP): apply what can change live, name what needs a restart.

        Only key names are logged, never values: they may be API keys or tokens.
        """
        import msgspec

        from kesoku.config.settings import load_config, set_config
        from kesoku.vocab.errors import OperatorError

        where = str(self.config_path) if self.config_path is not None else "the default config"
        try:
            new = load_config(self.config_path)
        except OperatorError as exc:
            log.error("SIGHUP: %s; the running config stays", exc)
            return
        changed = changed_keys(self.config, new)
        if not changed:
            log.info("SIGHUP: %s reloaded, nothing changed", where)
            return
        live = [key for key in changed if key in LIVE_KEYS]
        later = [key for key in changed if key not in LIVE_KEYS]
        fields = {key.split(".", 1)[1]: getattr(new.agent, key.split(".", 1)[1]) for key in live}
        agent = msgspec.structs.replace(self.config.agent, **fields)
        self.config = msgspec.structs.replace(self.config, agent=agent)
        set_config(self.config)
        self.rt.persona = agent.persona
        self.rt.max_steps_per_turn = agent.max_steps_per_turn
        self.rt.worker_idle_s = agent.worker_idle_s
        applied = f"applied {', '.join(live)}" if live else "applied nothing"
        pending = f"; restart to apply {', '.join(later)}" if later else ""
        log.info("SIGHUP: %s reloaded: %s%s", where, applied, pending)

    def _backend_name(self) -> str:
        from kesoku.llm.factory import default_backend

        return self.config.agent.llm or default_backend(self.config)[0]


def changed_keys(old: Config, new: Config) -> list[str]:
    """The dotted keys whose value differs.

    A list-valued key such as ``discord.channels`` is compared as a whole.
    """
    import msgspec

    a, b = _flatten(msgspec.to_builtins(old)), _flatten(msgspec.to_builtins(new))
    return sorted(key for key in a.keys() | b.keys() if a.get(key) != b.get(key))


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _leaf(exc: BaseException) -> BaseException:
    """The first real exception inside (nested) exception groups: the one worth one line."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _hint(entry: AdapterEntry, exc: BaseException) -> str:
    if isinstance(exc, ImportError) and entry.name in _EXTRAS:
        return f" (install its extra: pip install 'kesoku[{entry.name}]')"
    return ""
