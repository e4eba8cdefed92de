"""The adapter port: what an adapter is and may use, how the daemon and ``kesoku chat`` find it.

ARCHITECTURE.md, "Package map", draws the port.

Adapters are found through the entry-point group ``kesoku.adapters``, so a third-party adapter looks
exactly like a first-party one. An entry point names an object (usually a module) with:

- ``enabled(config) -> bool``: whether the daemon runs it. Optional: without it, the adapter is
  enabled when the config section of the same name says ``enabled = true`` (``[discord] enabled``).
- ``async serve(ctx, config, *, task_status)``: run until cancelled, calling
  ``task_status.started()`` once connected. Stopping is cancelling; an exception is reported in one
  line and the daemon starts the adapter again with backoff (1 s doubling to 60 s), except an
  ``OperatorError`` or an ``ImportError``, which only the operator can fix. An adapter keeps each
  message its own failure domain: one that cannot be handled is logged and told in one line, and the
  adapter goes on. ``ctx`` is an :class:`AdapterContext`: the gateway, the event hub, questions and
  the path gates; an adapter never holds the runtime or the store.

The terminal adapter offers ``chat(config, ...)`` instead (see :class:`ChatAdapter`), which
``kesoku chat`` calls. The core never imports an adapter package by name: it asks the entry points.
An adapter whose config section says ``enabled = false`` is never imported, so a broken or heavy
optional adapter costs nothing until it is used.
"""

from __future__ import annotations

import contextlib
import os
import sys
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import msgspec

from kesoku.vocab.errors import OperatorError

if TYPE_CHECKING:
    import trio

    from kesoku.agent.questions import Questions
    from kesoku.agent.runtime import Runtime
    from kesoku.config.settings import Config
    from kesoku.gateway import Gateway
    from kesoku.tools.paths import PathGates
    from kesoku.vocab.events import EventHub

GROUP = "kesoku.adapters"
"""The entry-point group adapters register under.

pyproject.toml: ``[project.entry-points."kesoku.adapters"]``.
"""


@dataclass(frozen=True, slots=True)
class AdapterContext:
    """What a chat adapter may use of the running agent: the port between the two.

    No runtime, store or dispatcher: an adapter posts and reads messages, follows progress, answers
    questions and stops turns, and nothing else (ARCHITECTURE.md, "Package map").

    A platform message is posted as :func:`kesoku.vocab.model.user_text` with the platform's id as
    its ``external_id`` (the dedupe key), in a session from ``gateway.open_session``. What to
    deliver is what ``gateway.listen(after=cursor.start(), adapter=...)`` yields with
    ``role is Role.ASSISTANT and kind is Kind.TEXT`` (the answer, whose ``[file: …]`` and
    ``[question: …]`` parts :func:`kesoku.vocab.markup.parse_reply` finds) and the tool
    questions (:func:`kesoku.vocab.model.is_question`). ``check_adapter_contract``
    (:mod:`kesoku.testing.adapters`) checks an adapter against all of this.

    Attributes:
        gateway: :meth:`~kesoku.gateway.Gateway.post` user messages,
            :meth:`~kesoku.gateway.Gateway.listen` to the log from a
            :class:`~kesoku.gateway.DeliveryCursor`, :meth:`~kesoku.gateway.Gateway.stop` a turn,
            and the session queries (``open_session``, ``get_session``, ``get_message``, ...).
        hub: Live progress: tool started and finished, model deltas, turn ended.
        questions: Open tool questions; ``answer(id, choice, by=...)`` for Allow/Deny buttons.
        gates: Which workspace files may be shared back to a chat
            (:func:`kesoku.tools.paths.check_share`).
    """

    gateway: Gateway
    hub: EventHub
    questions: Questions
    gates: PathGates

    @classmethod
    def of(cls, rt: Runtime) -> AdapterContext:
        """The port onto a runtime (the daemon gives each adapter this)."""
        return cls(gateway=rt.gateway, hub=rt.hub, questions=rt.questions, gates=rt.gates)


@runtime_checkable
class Adapter(Protocol):
    """A chat surface the daemon runs (a module or an object satisfies it structurally)."""

    async def serve(
        self,
        ctx: AdapterContext,
        config: Config,
        *,
        task_status: trio.TaskStatus[None] = ...,
    ) -> None:
        """Post user messages to ``ctx.gateway`` and deliver replies until cancelled.

        Args:
            ctx: The port: ``ctx.gateway`` for messages, ``ctx.hub`` for live progress.
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
        local: bool = False,
        verbose: bool = False,
    ) -> int:
        """Answer one prompt (``prompt`` given) or hold an interactive conversation.

        Args:
            config: The loaded config.
            config_file: The file it came from (None: defaults); the agent's tools may not read it.
            prompt: The one-shot prompt; None: interactive (or stdin when it is not a terminal).
            session_id: A session to continue; None: a new one.
            llm_name: A backend overriding ``agent.llm``.
            local: Run in this process even when a daemon serves the database.
            verbose: Say where the chat runs.

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


def adapter_entries(*, cached: bool = True) -> list[AdapterEntry]:
    """Return every adapter registered under :data:`GROUP`, sorted by name.

    Of several with the same name, the first wins. The answer is kept in
    ``$XDG_CACHE_HOME/kesoku/adapters-<interpreter>.json`` with the modification time of every
    ``sys.path`` entry, and used while none of them moved (ARCHITECTURE.md, "Package map", the
    adapter port); ``cached=False`` looks again all the same.
    """
    stamp = _path_stamp()
    kept = _read_cache(stamp) if cached else None
    if kept is not None:
        return kept
    # importlib.metadata costs tens of milliseconds to import and more to scan every distribution
    from importlib.metadata import entry_points

    found: dict[str, AdapterEntry] = {}
    for ep in entry_points(group=GROUP):
        found.setdefault(ep.name, AdapterEntry(ep.name, ep.value))
    entries = [found[name] for name in sorted(found)]
    _write_cache(stamp, entries)
    return entries


def _path_stamp() -> list[tuple[str, int | None]]:
    """Each ``sys.path`` entry with its modification time (ns; None: missing).

    An installer adds or removes a distribution's ``*.dist-info`` folder, which moves the time of
    the folder holding it: importlib.metadata's own per-process cache trusts the same sign.
    """
    stamp: list[tuple[str, int | None]] = []
    for entry in sys.path:
        try:
            stamp.append((entry, os.stat(entry or ".").st_mtime_ns))
        except OSError:
            stamp.append((entry, None))
    return stamp


def _cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # unset, empty or relative: the XDG spec says ~/.cache
        base = os.path.join(os.path.expanduser("~"), ".cache")
    # one file per interpreter; a clash would only cost a lookup (the stamp names every path)
    key = f"{zlib.crc32(sys.executable.encode()):08x}"
    return Path(base, "kesoku", f"adapters-{key}.json")


class _Cached(msgspec.Struct):
    stamp: list[tuple[str, int | None]]
    entries: list[tuple[str, str]]


def _read_cache(stamp: list[tuple[str, int | None]]) -> list[AdapterEntry] | None:
    try:
        cached = msgspec.json.decode(_cache_file().read_bytes(), type=_Cached)
    except (OSError, msgspec.DecodeError):
        return None  # none yet, unreadable, or damaged: look again
    if cached.stamp != stamp:
        return None
    return [AdapterEntry(name, value) for name, value in cached.entries]


def _write_cache(stamp: list[tuple[str, int | None]], entries: list[AdapterEntry]) -> None:
    path = _cache_file()
    data = msgspec.json.encode(_Cached(stamp, [(e.name, e.value) for e in entries]))
    temp = path.with_name(f"{path.name}.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp.write_bytes(data)
        os.replace(temp, path)  # another process reads the old file or the new, never half
    except OSError:  # a read-only home only costs the next lookup its time
        with contextlib.suppress(OSError):
            temp.unlink()


def find_adapter(name: str, entries: Sequence[AdapterEntry] | None = None) -> AdapterEntry:
    """Return the registered adapter called ``name``.

    Raises:
        OperatorError: No adapter of that name is registered (an incomplete install).
    """
    if entries is None:
        entries = adapter_entries()
        if _named(name, entries) is None:  # an entry point edited in place moves no folder
            entries = adapter_entries(cached=False)
    found = _named(name, entries)
    if found is not None:
        return found
    known = ", ".join(e.name for e in entries) or "none"
    raise OperatorError(
        f"no adapter {name!r} is installed (entry points {GROUP}: {known}); reinstall kesoku"
    )


def _named(name: str, entries: Sequence[AdapterEntry]) -> AdapterEntry | None:
    return next((entry for entry in entries if entry.name == name), None)


def section_enabled(name: str, config: Config) -> bool | None:
    """The ``enabled`` key of the config section named like the adapter.

    None when there is no such key.
    """
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
