"""The only code that talks to SQLite (apsw): open, migrate (schema/*.sql), queries."""

from kesoku.store.db import BUSY_TIMEOUT_MS, open_connection, schema_version
from kesoku.store.filters import MessageFilter
from kesoku.store.store import Inserted, Store
from kesoku.vocab.errors import UnknownSessionError

__all__ = [
    "BUSY_TIMEOUT_MS",
    "Inserted",
    "MessageFilter",
    "Store",
    "UnknownSessionError",
    "open_connection",
    "schema_version",
]
