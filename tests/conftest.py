"""Shared fixtures: real SQLite files in tmp_path, a gateway over them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kesoku.gateway import Gateway
from kesoku.model import Session
from kesoku.store import Store


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
def session(gateway: Gateway) -> Session:
    return gateway.open_session("terminal", "chan-1")
