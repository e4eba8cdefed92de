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

The runtime is built by :mod:`kesoku.host.build` (shared with ``kesoku chat``); the log lines are
:mod:`kesoku.host.logs`.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from kesoku.agent.runtime import Runtime
    from kesoku.config.settings import Config
    from kesoku.host.adapters import Adapter, AdapterEntry
    from kesoku.host.control_server import ControlServer
    from kesoku.tools.sandbox import Sandbox

log = logging.getLogger("kesoku.host.daemon")

KILL_WAIT_S = 10.0
"""How long the results of tools killed at the end of the grace period may take to be posted."""
RESTART_MIN_S = 1.0
"""The first delay before a failed adapter is started again (doubled at each failure in a row)."""
RESTART_MAX_S = 60.0
"""The longest delay between two restarts of an adapter."""
RESTART_RESET_S = 120.0
"""An adapter that ran this long before failing starts again after :data:`RESTART_MIN_S`."""
LIVE_KEYS = (
    "agent.persona",
    "agent.max_steps_per_turn",
    "agent.worker_idle_s",
    "agent.shutdown_grace_s",
)
"""Keys a SIGHUP applies to the running daemon; every other change needs a restart."""
_EXTRAS = ("discord", "gchat")
"""First-party adapters whose dependencies come with the extra of the same name."""


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
    from kesoku.host.build import build_runtime, daemon_serves
    from kesoku.host.control import socket_path
    from kesoku.host.control_server import ControlServer
    from kesoku.host.logs import configure_logging
    from kesoku.store import Store

    configure_logging()
    raise_open_file_limit()
    path = config_path if config_path is not None else default_config_path()
    config = load_config(path)
    set_config(config)
    store = Store(config.workspace.db_path)
    try:
        control = ControlServer(socket_path(config.workspace.db_path))
        others = daemon_serves(store)
        rt = build_runtime(
            config,
            store,
            config_file=path,
            serves=lambda session_id: control.serves(session_id) or others(session_id),
        )
        from kesoku.agent.scheduler import sync_heartbeat

        sync_heartbeat(store, config.heartbeat, time.time())
        where = f"config {path.resolve()}" if path is not None else "no config file (defaults)"
        log.info(
            "kesoku %s starting: pid %d, %s, db %s",
            __version__,
            os.getpid(),
            where,
            config.workspace.db_path,
        )
        log_sandbox(rt.sandbox, config)
        daemon = Daemon(rt, config, path, control=control)
        try:
            return trio.run(daemon.serve)
        except KeyboardInterrupt:  # Ctrl-C before the signal watcher was listening
            log.info("interrupted during start-up")
            return 130
        finally:
            rt.gateway.locks.close()  # the sessions it still held, and their pid files
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
        control: The control socket ``kesoku chat`` clients reach it by (stopped with the
            adapters, last); None: none.
    """

    def __init__(
        self,
        rt: Runtime,
        config: Config,
        config_path: Path | None,
        *,
        entries: list[AdapterEntry] | None = None,
        control: ControlServer | None = None,
    ) -> None:
        from kesoku.agent.scheduler import Scheduler, adapter_targets

        self.rt = rt
        self.control = control
        self.config = config
        self.config_path = config_path
        self.entries = entries
        self.scheduler = Scheduler(rt, adapter_targets(config), config=config)
        rt.scheduler = self.scheduler
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
            if self.control is not None:
                # In the adapters' scope's place: clients follow the tools a stop lets finish.
                control_scope = trio.CancelScope()
                await nursery.start(self._serve_control, self.control, control_scope)
            log.info("ready: backend %s; %s", self._backend_name(), self._reach())
            task_status.started()
            await self.stopping.wait()
            runtime_scope.cancel()
            await self._wait_for_tools()
            adapters_scope.cancel()
            if self.control is not None:
                control_scope.cancel()
            nursery.cancel_scope.cancel()
        log.info("stopped")
        return 0

    def _reach(self) -> str:
        """Who can reach this daemon, for the ready line."""
        from kesoku.host.adapters import section_enabled

        chats = [
            e.name
            for e in self.entries or ()
            # None: no [name] enabled key, an adapter that decides itself (not the terminal's).
            if section_enabled(e.name, self.config)
            or (section_enabled(e.name, self.config) is None and e.name != "terminal")
        ]
        if chats:
            return f"chat adapters {', '.join(chats)}; waiting for messages"
        return (
            "no chat adapter is enabled ([discord] or [gchat] enabled = true), so no chat reaches "
            "it; it still runs schedules and the heartbeat, resumes turns cut by a restart, "
            "answers sessions other processes store"
            + (", and serves kesoku chat" if self.control and self.control.listening else "")
        )

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
                    await nursery.start(self.scheduler.serve)
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

    async def _serve_control(
        self,
        control: ControlServer,
        scope: trio.CancelScope,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        with scope:
            await control.serve(self.rt, task_status=task_status)

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
        try:
            enabled = is_enabled(entry, adapter, self.config)
        except Exception as exc:  # a third party's own code: that adapter fails, not the daemon
            log.error(
                "adapter %s: its enabled() failed: %s; not started", entry.name, _describe(exc)
            )
            return
        if not enabled:
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
