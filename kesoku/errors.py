"""Error classes, sorted by who must act on them (DESIGN §12).

- The operator: :class:`ConfigError` (a bad kesoku.toml) and :class:`StoreError` (a database this
  code cannot use). The CLI prints their message as one line and exits 2; never a traceback.
- The model and retry classes (``ToolError``, ``BackendError``) arrive with the runtime and backends.
"""


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
