"""The daemon restarts a failing adapter with backoff; the runtime and the other adapters go on.

Adapters here are small objects registered as entry points of a module put in ``sys.modules``; the
daemon runs over a real store and the scripted model, on trio's autojump clock (no real sleeps).
"""

from __future__ import annotations

import logging
import sys
import types
from pathlib import Path

import pytest
import trio
from trio.testing import MockClock

from kesoku.agent.runtime import Runtime
from kesoku.config.settings import Config
from kesoku.gateway import Gateway
from kesoku.host.adapters import AdapterEntry
from kesoku.host.daemon import RESTART_MAX_S, Backoff, Daemon
from kesoku.store import Store
from kesoku.testing import ScriptedLLM
from kesoku.vocab.errors import OperatorError
from kesoku.vocab.model import user_text

MODULE = "kesoku_test_restart_adapters"


class Flaky:
    """Fails ``failures`` times (the second run fails only after serving a while), then serves."""

    def __init__(self, failures: int, *, long_run_s: float = 5.0) -> None:
        self.failures = failures
        self.long_run_s = long_run_s
        self.starts: list[float] = []

    def enabled(self, config: Config) -> bool:
        return True

    async def serve(
        self, rt: Runtime, config: Config, *, task_status: trio.TaskStatus[None]
    ) -> None:
        self.starts.append(trio.current_time())
        run = len(self.starts)
        if run == 2:
            task_status.started()
            await trio.sleep(self.long_run_s)
        if run <= self.failures:
            raise RuntimeError(f"connection lost ({run})")
        task_status.started()
        session = rt.gateway.open_session(type(self).__name__.lower(), "room")
        await rt.gateway.post(user_text(session.id, "served at last"))
        await trio.sleep_forever()


class Steady(Flaky):
    def __init__(self) -> None:
        super().__init__(0)


class Misconfigured(Flaky):
    async def serve(
        self, rt: Runtime, config: Config, *, task_status: trio.TaskStatus[None]
    ) -> None:
        self.starts.append(trio.current_time())
        raise OperatorError("misconfigured: set [misconfigured] token")


@pytest.fixture
def adapters(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = types.ModuleType(MODULE)
    monkeypatch.setitem(sys.modules, MODULE, module)
    return module


def entry(name: str) -> AdapterEntry:
    return AdapterEntry(name, f"{MODULE}:{name}")


async def run_daemon(store: Store, entries: list[AdapterEntry], until: float) -> Runtime:
    """Serve the daemon over ``store`` until the clock reads ``until``, then stop it gracefully."""
    rt = Runtime(
        Gateway(store, Path(store.path).parent / "sessions"),
        ScriptedLLM([{"text": "ok"}], loop=True),
    )
    daemon = Daemon(rt, Config(), None, entries=entries)
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.serve)
        await trio.sleep_until(until)
        daemon.request_stop()
    return rt


async def test_a_failing_adapter_is_restarted_with_backoff_and_the_others_go_on(
    store: Store,
    adapters: types.ModuleType,
    autojump_clock: MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    flaky, steady, misconfigured = Flaky(4), Steady(), Misconfigured(0)
    adapters.__dict__.update(flaky=flaky, steady=steady, misconfigured=misconfigured)
    caplog.set_level(logging.INFO, logger="kesoku.host.daemon")
    start = trio.current_time()
    rt = await run_daemon(
        store, [entry("flaky"), entry("steady"), entry("misconfigured")], start + 60
    )
    starts = [t - start for t in flaky.starts]
    # Run 1 fails at once: 1 s. Run 2 serves 5 s, then fails: 2 s. Runs 3, 4 fail at once: 4 s, 8 s.
    assert starts == pytest.approx([0, 1, 1 + 5 + 2, 1 + 5 + 2 + 4, 1 + 5 + 2 + 4 + 8])
    assert len(steady.starts) == 1
    assert len(misconfigured.starts) == 1  # the operator's to fix: never restarted
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.name == "kesoku.host.daemon" and "adapter flaky" in r.getMessage()
    ]
    assert lines == [
        "adapter flaky failed: RuntimeError: connection lost (1); restart 1 in 1 s",
        "adapter flaky: started again (restart 1)",
        "adapter flaky failed: RuntimeError: connection lost (2); restart 2 in 2 s",
        "adapter flaky failed: RuntimeError: connection lost (3); restart 3 in 4 s",
        "adapter flaky failed: RuntimeError: connection lost (4); restart 4 in 8 s",
        "adapter flaky: started again (restart 4)",
    ]
    failures = [r for r in caplog.records if "adapter flaky failed" in r.getMessage()]
    assert all(r.exc_info for r in failures), "each restart line carries the traceback"
    # Adapters with no [name] enabled key decide for themselves: the ready line counts them.
    (ready,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ready:")]
    assert ready.endswith("; chat adapters flaky, steady, misconfigured; waiting for messages")
    assert any(
        r.getMessage()
        == "adapter misconfigured failed: OperatorError: misconfigured: set [misconfigured] token; "
        "not restarted"
        for r in caplog.records
    )
    # The runtime kept serving: the flaky adapter's message, posted once it served, was answered.
    (session,) = rt.gateway.store.list_sessions(adapter="flaky")
    assert [m.content for m in rt.gateway.store.history(session.id)] == ["served at last", "ok"]


def test_the_backoff_doubles_to_its_cap_and_starts_over_after_a_long_run() -> None:
    backoff = Backoff()
    delays = [backoff.after(0.5) for _ in range(9)]
    assert delays == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert delays[-1] == RESTART_MAX_S
    assert backoff.after(3600) == 1  # it ran an hour before failing: not the same failure in a row
    assert backoff.after(0) == 2
    assert backoff.restarts == 11
