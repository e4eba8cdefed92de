"""Shared fixtures: real SQLite files in tmp_path, a gateway over them; every trio test runs under
the blocking detector (kesoku.host.blocking) and fails if one task step holds the event loop too
long."""

from __future__ import annotations

import inspect
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio

from kesoku.gateway import Gateway
from kesoku.host.blocking import BlockingDetector
from kesoku.store import Store
from kesoku.vocab.model import Session

if TYPE_CHECKING:
    from test_gchat_support import FakePubSub


def pytest_configure(config: pytest.Config) -> None:
    # Every `kesoku` command reads ~/.config/kesoku/kesoku.env (kesoku init's keys): the tests and
    # the commands they run must not see the keys of whoever runs them.
    os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="kesoku-tests-config-")


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "kesoku.db"


@pytest.fixture
def store(db_path: Path) -> Iterator[Store]:
    s = Store(db_path)
    yield s
    s.close()


@pytest.fixture
def gateway(store: Store, tmp_path: Path) -> Gateway:
    return Gateway(store, tmp_path / "sessions")


@pytest.fixture
def pubsub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakePubSub]:
    """The in-process Pub/Sub fake, with the Pub/Sub client of this test pointed at it."""
    from test_gchat_support import start_fake  # grpc and Google clients: only where it is used

    fake, server, host = start_fake()
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", host)
    yield fake
    server.stop(0)


@pytest.fixture
def session(gateway: Gateway) -> Session:
    return gateway.open_session("terminal", "chan-1")


def _run_watched(
    fn: Callable[[], Any],
    *,
    clock: trio.abc.Clock | None,
    instruments: Sequence[trio.abc.Instrument],
) -> Any:
    """trio.run with a BlockingDetector; fails the test on any step over the threshold."""
    detector = BlockingDetector()
    result = trio.run(fn, clock=clock, instruments=[*instruments, detector])
    if detector.violations:
        pytest.fail(detector.report())
    return result


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if isinstance(item, pytest.Function) and inspect.iscoroutinefunction(item.obj):
            # pytest-trio takes the runner from the first trio marker that names one.
            item.add_marker(pytest.mark.trio(run=_run_watched))


def pytest_unconfigure(config: pytest.Config) -> None:
    # llama-cpp-python opens os.devnull twice at import and never closes it (llama_cpp/_utils.py),
    # so the interpreter's exit printed two ResourceWarnings after the summary. Nothing writes there
    # now.
    utils = sys.modules.get("llama_cpp._utils")
    for name in ("outnull_file", "errnull_file"):
        file = getattr(utils, name, None)
        if file is not None:
            file.close()
