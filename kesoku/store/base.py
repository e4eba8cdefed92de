"""What every table of the store shares: the connection, and the mark of a write.

:class:`~kesoku.store.store.Store` is made of one mixin per group of tables (the spend ledger in
:mod:`kesoku.store.ledger`, schedules in :mod:`kesoku.store.schedules`) over this base, so each
module holds the queries of one responsibility and none imports the Store back.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Concatenate, ParamSpec, TypeVar

import apsw

from kesoku.store.db import write_lock_holder
from kesoku.vocab.errors import StoreBusyError

_P = ParamSpec("_P")
_R = TypeVar("_R")
_S = TypeVar("_S", bound="StoreBase")


class StoreBase:
    """The connection and path every table's queries use.

    Attributes:
        path: The database file, or ``:memory:``.
    """

    path: str
    _conn: apsw.Connection

    def _holder(self) -> str:
        """Who holds the write lock: ``pid N?`` when /proc/locks names it.

        See :func:`write_lock_holder`.
        """
        pid = None if self.path == ":memory:" else write_lock_holder(self.path)
        return f"pid {pid}?" if pid is not None else "another connection"


def writes(method: Callable[Concatenate[_S, _P], _R]) -> Callable[Concatenate[_S, _P], _R]:
    """Mark a write of the store, whose lock wait may run out.

    SQLite's ``BusyError`` (another connection held the write lock past the busy timeout) becomes
    :class:`~kesoku.vocab.errors.StoreBusyError` naming the database and the lock's holder, so no
    caller shows a raw apsw traceback.
    """

    @functools.wraps(method)
    def write(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(self, *args, **kwargs)
        except apsw.BusyError as exc:
            holder = self._holder()
            raise StoreBusyError(f"{self.path}: {exc} (held by {holder})", holder=holder) from None

    return write
