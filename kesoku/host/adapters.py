"""What an adapter is, and how the daemon and ``kesoku chat`` find adapters (ARCHITECTURE.md, "Module map").

Adapters are found through the entry-point group ``kesoku.adapters``, so a third-party adapter looks
exactly like a first-party one. An entry point names an object (usually a module) with:

- ``enabled(config) -> bool``: whether the daemon runs it. Optional: without it, the adapter is
  enabled when the config section of the same name says ``enabled = true`` (``[discord] enabled``).
- ``async serve(rt, config, *, task_status)``: run until cancelled, calling
  ``task_status.started()`` once connected. Stopping is cancelling; an exception is reported in one
  line and the daemon starts the adapter again with backoff (1 s doubling to 60 s), except an
  ``OperatorError`` or an ``ImportError``, which only the operator can fix. An adapter keeps each
  message its own failure domain: one that cannot be handled is logged and told in one line, and the
  adapter goes on.

The terminal adapter offers ``chat(config, ...)`` instead (see :class:`ChatAdapter`), which
``kesoku chat`` calls. The core never imports an adapter package by name: it asks the entry points.
An adapter whose config section says ``enabled = false`` is never imported, so a broken or heavy
optional adapter costs nothing until it is used.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import trio

from kesoku.vocab.errors import OperatorError

if TYPE_CHECKING:
    from pathlib import Path

    from kesoku.agent.runtime import Runtime
    from kesoku.config.settings import Config
    from kesoku.store import Store

GROUP = "kesoku.adapters"
"""The entry-point group adapters register under (pyproject.toml ``[project.entry-points."kesoku.adapters"]``)."""


@runtime_checkable
class Adapter(Protocol):
    """A chat surface the daemon runs (a module or an object satisfies it structurally)."""

    async def serve(
        self,
        rt: Runtime,
        config: Config,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Post user messages to ``rt.gateway`` and deliver replies until cancelled.

        Args:
            rt: The runtime: ``rt.gateway`` for messages, ``rt.hub`` for live progress.
            config: The loaded config.
            task_status: ``started()`` once the adapter is connected and listening.

        Cancellation:
            Cancelling is the only way to stop it; it must return promptly (no shield without a
            bound).
        """
        ...


@runtime_checkable
class ChatAdapter(Protocol):
    """An adapter that holds a conversation on this process's terminal (``kesoku chat``)."""

    def chat(
        self,
        config: Config,
        *,
        config_file: Path | None,
        prompt: str | None,
        session_id: str | None,
        llm_name: str | None,
    ) -> int:
        """Answer one prompt (``prompt`` given) or hold an interactive conversation.

        Args:
            config: The loaded config.
            config_file: The file it came from (None: defaults); the agent's tools may not read it.
            prompt: The one-shot prompt; None: interactive (or stdin when it is not a terminal).
            session_id: A session to continue; None: a new one.
            llm_name: A backend overriding ``agent.llm``.

        Returns:
            The process exit code.
        """
        ...


@dataclass(frozen=True, slots=True)
class AdapterEntry:
    """One registered adapter, not yet imported.

    Attributes:
        name: The entry point's name (``discord``); also the config section the default ``enabled``
            reads.
        value: What it points at: ``module`` or ``module:attribute``.
    """

    name: str
    value: str

    def load(self) -> Any:
        """Import the adapter object.

        Raises:
            ImportError: The package (or one it imports at module level) is not installed.
            AttributeError: The entry point names an attribute the module lacks.
        """
        import importlib

        module_name, _, attr = self.value.partition(":")
        obj: Any = importlib.import_module(module_name.strip())
        for part in filter(None, attr.strip().split(".")):
            obj = getattr(obj, part)
        return obj


def adapter_entries() -> list[AdapterEntry]:
    """Return every adapter registered under :data:`GROUP`, sorted by name (the first of a name wins)."""
    # importlib.metadata costs tens of milliseconds to import: only the daemon and `chat` pay it.
    from importlib.metadata import entry_points

    found: dict[str, AdapterEntry] = {}
    for ep in entry_points(group=GROUP):
        found.setdefault(ep.name, AdapterEntry(ep.name, ep.value))
    return [found[name] for name in sorted(found)]


def find_adapter(name: str, entries: Sequence[AdapterEntry] | None = None) -> AdapterEntry:
    """Return the registered adapter called ``name``.

    Raises:
        OperatorError: No adapter of that name is registered (an incomplete install).
    """
    entries = adapter_entries() if entries is None else entries
    for entry in entries:
        if entry.name == name:
            return entry
    known = ", ".join(e.name for e in entries) or "none"
    raise OperatorError(
        f"no adapter {name!r} is installed (entry points {GROUP}: {known}); reinstall kesoku"
    )


def section_enabled(name: str, config: Config) -> bool | None:
    """The ``enabled`` key of the config section named like the adapter; None when there is no such key."""
    section = getattr(config, name, None)
    value = getattr(section, "enabled", None)
    return value if isinstance(value, bool) else None


def is_enabled(entry: AdapterEntry, adapter: object, config: Config) -> bool:
    """Whether the daemon should run a loaded adapter.

    Args:
        entry: The registered adapter.
        adapter: The loaded object.
        config: The loaded config.

    Returns:
        The adapter's own ``enabled(config)`` when it has one, else its config section's
        ``enabled``.
    """
    check = getattr(adapter, "enabled", None)
    if callable(check):
        return bool(check(config))
    return bool(section_enabled(entry.name, config))


DELIVERED_WAIT_S = 60.0
"""How long :meth:`DeliveryCursor.delivered` waits at most."""


class DeliveryCursor:
    """An adapter's durable place in the log, so each reply is delivered once across restarts.

    The adapter follows ``gateway.listen(after=cursor.start(), adapter=...)`` and calls
    :meth:`advance` after each message it delivered (or gave up on for good).

    Args:
        store: Where the cursor is kept.
        name: The cursor's name, ``adapter:<chatbot_id>``.
    """

    def __init__(self, store: Store, name: str) -> None:
        self.store = store
        self.name = name
        self.position = 0
        """The id of the last message handled."""
        self._progress = trio.Event()

    def start(self) -> int:
        """The id to listen after: the saved cursor, or the newest stored message.

        An adapter's very first start begins after the newest message: older sessions are not
        replayed into a chat that never saw them.
        """
        saved = self.store.get_cursor(self.name)
        self.position = self.store.last_message_id() if saved is None else saved
        if saved is None:
            self.store.set_cursor(self.name, self.position)
        return self.position

    def advance(self, message_id: int) -> None:
        """Record that ``message_id`` was handled, and wake :meth:`delivered` waiters."""
        self.position = message_id
        self.store.set_cursor(self.name, message_id)
        self._progress.set()
        self._progress = trio.Event()

    async def delivered(self, session_id: str, *, timeout_s: float = DELIVERED_WAIT_S) -> None:
        """Wait until every stored message of a session has been handled (bounded by ``timeout_s``)."""
        from kesoku.store import MessageFilter

        flt = MessageFilter.from_kwargs({"session_id": session_id})
        with trio.move_on_after(timeout_s):
            while self.store.messages_after(self.position, flt, limit=1):
                await self._progress.wait()
