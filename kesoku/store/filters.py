"""Message filters, written once and applied two ways: as SQL and to a message in memory.

The gateway hands a just-posted message to a listener after :meth:`MessageFilter.matches`; a
listener catching up reads the store with :meth:`MessageFilter.where`. Both must agree, so both live
here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from kesoku.vocab.model import Kind, Message, Role, Status

# Filter keys → the column they test. ``adapter`` is a messages column copied from the session.
_COLUMNS = ("session_id", "role", "kind", "status", "sender", "adapter")


def _as_set(key: str, value: object) -> frozenset[str] | None:
    if value is None:
        return None
    if isinstance(value, str):  # a StrEnum is a str too
        return frozenset({str(value)})
    if isinstance(value, Iterable):
        values = frozenset(str(v) for v in value)
        if not values:
            raise ValueError(f"filter {key!r} is an empty collection: it would match nothing")
        return values
    raise TypeError(
        f"filter {key!r} takes a string or a collection of strings, not {type(value).__name__}"
    )


class MessageFilter(msgspec.Struct, frozen=True):
    """Which messages a listener wants; each field is a set of accepted values, None = any.

    Build one with :meth:`from_kwargs`, e.g. ``MessageFilter.from_kwargs({"role": Role.USER})``.
    """

    session_id: frozenset[str] | None = None
    role: frozenset[str] | None = None
    kind: frozenset[str] | None = None
    status: frozenset[str] | None = None
    sender: frozenset[str] | None = None
    adapter: frozenset[str] | None = None

    @classmethod
    def from_kwargs(cls, filters: Mapping[str, Any]) -> MessageFilter:
        """Build a filter from ``listen(**filters)`` keyword arguments.

        Args:
            filters: Keys among session_id, role, kind, status, sender, adapter; each value a string
                (or enum) or a collection of them.

        Returns:
            The filter.

        Raises:
            TypeError: An unknown key or a value of the wrong type.
            ValueError: An empty collection, or a role, kind or status that does not exist.
        """
        unknown = set(filters) - set(_COLUMNS)
        if unknown:
            raise TypeError(
                f"unknown message filter {sorted(unknown)}; known: {', '.join(_COLUMNS)}"
            )
        sets = {key: _as_set(key, value) for key, value in filters.items()}
        for key, enum in (("role", Role), ("kind", Kind), ("status", Status)):
            bad = (sets.get(key) or frozenset()) - {e.value for e in enum}
            if bad:
                raise ValueError(f"no {key} called {sorted(bad)}")
        return cls(**sets)

    def matches(self, msg: Message, adapter: str) -> bool:
        """Tell whether a message (of a session owned by ``adapter``) passes the filter."""
        return (
            (self.session_id is None or msg.session_id in self.session_id)
            and (self.role is None or msg.role in self.role)
            and (self.kind is None or msg.kind in self.kind)
            and (self.status is None or msg.status in self.status)
            and (self.sender is None or msg.sender in self.sender)
            and (self.adapter is None or adapter in self.adapter)
        )

    def where(self) -> tuple[str, list[str]]:
        """Render the filter as SQL.

        Returns:
            A clause to AND into a WHERE (``"1"`` when the filter takes everything) and its
            bindings.
        """
        clauses: list[str] = []
        bindings: list[str] = []
        for column in _COLUMNS:
            values: frozenset[str] | None = getattr(self, column)
            if values is None:
                continue
            ordered = sorted(values)
            clauses.append(f"{column} IN ({', '.join('?' * len(ordered))})")
            bindings.extend(ordered)
        return (" AND ".join(clauses) or "1"), bindings
