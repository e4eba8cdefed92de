"""Error classes, sorted by who must act on them.

- The operator: :class:`ConfigError` (a bad kesoku.toml) and :class:`StoreError` (a database this
  code cannot use). The CLI prints their message as one line and exits 2; never a traceback.
- The model: :class:`ToolError`, raised by a tool, becomes a ``failed`` tool result the model reads.
- Retry: :class:`BackendError` from a model backend; ``retryable`` says whether the base retries it.
- The caller: :class:`UnknownSessionError` and :class:`AmbiguousSessionError` (a session id or
  prefix that names no session, or several), which each command words for its own option.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from kesoku.vocab.text import valid_text

if TYPE_CHECKING:
    from kesoku.vocab.model import Session


class KesokuError(Exception):
    """Base class of every error Kesoku raises on purpose."""


class OperatorError(KesokuError):
    """An error only the person running Kesoku can fix; its message is one complete line."""


class ConfigError(OperatorError):
    """kesoku.toml is unreadable, is not valid TOML, or holds a wrong key or value.

    The message names the file, the line where it is known, the key path (for example
    ``discord.channels[0].auto_thread``) and what was expected.
    """


class StoreError(OperatorError):
    """The SQLite database cannot be used (newer than this code, corrupt, or unwritable)."""


class StoreBusyError(StoreError):
    """Another connection held the database's write lock past the busy timeout; nothing was written.

    Attributes:
        holder: Who holds the lock, for messages: ``pid 1234?`` (read from /proc/locks) or
            ``another connection``.
    """

    def __init__(self, message: str, *, holder: str) -> None:
        super().__init__(message)
        self.holder = holder


class ToolError(KesokuError):
    """A tool could not do what the model asked; the message is shown to the model as the result."""


_CONTEXT_OVERFLOW = re.compile(
    r"prompt is too long|context[_ ]length|maximum context"
    r"|exceeds the maximum number of tokens|context size"
    r"|context window|too many tokens",
    re.IGNORECASE,
)


class BackendError(KesokuError):
    """A model call failed.

    Args:
        message: What went wrong, in one line (provider, status and the provider's message); made
            valid UTF-8 (:func:`kesoku.vocab.text.valid_text`).
        retryable: True for rate limits, overload, 5xx and dropped connections: the base retries
            them.
        status: The HTTP status when there was one.
        retry_after_s: The provider's ``retry-after`` hint, in seconds.
        auth: True when credentials or permissions are wrong (401, 403): only the operator can fix
            it, so it is never retried; a configured fallback backend is tried, and the switch is
            logged.
    """

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = False,
        status: int | None = None,
        retry_after_s: float | None = None,
        auth: bool = False,
    ) -> None:
        # A provider's error body is text from outside: it reaches the turn log, a notice, the CLI.
        super().__init__(valid_text(message))
        self.retryable = retryable and not auth
        self.status = status
        self.retry_after_s = retry_after_s
        self.auth = auth

    @property
    def context_overflow(self) -> bool:
        """True when the provider refused the request for exceeding the model's context window.

        The providers say so in their messages, not in a status of their own (all send a 400):
        Anthropic "prompt is too long", Gemini "input token count ... exceeds the maximum number of
        tokens", OpenAI ``context_length_exceeded`` / "maximum context length", llama.cpp "exceeds
        the available context size".
        """
        return not self.retryable and _CONTEXT_OVERFLOW.search(str(self)) is not None


class UnknownSessionError(LookupError):
    """A message names a session that does not exist."""


class AmbiguousSessionError(LookupError):
    """Several sessions start with the prefix given (:meth:`kesoku.store.Store.resolve_session`).

    Attributes:
        matches: The sessions that start with it, oldest first.
    """

    def __init__(self, matches: list[Session]) -> None:
        super().__init__(f"{len(matches)} sessions start with it; give more of the id")
        self.matches = matches
