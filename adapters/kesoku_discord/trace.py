"""📜: one turn's trajectory page, rendered in a worker thread over its own Store connection."""

from __future__ import annotations

from kesoku.store import Store
from kesoku.trace import build_turns, render_trace


def render_turn(db_path: str, session_id: str, root_id: int) -> tuple[str, str] | None:
    """Render the turn opened by user message ``root_id`` (blocking: call it in a worker thread).

    A Store is not thread-safe, so this opens its own on the same database file.

    Args:
        db_path: The database file.
        session_id: The session.
        root_id: The turn's user message.

    Returns:
        ``(html, file name)``, or None when the session is gone. A turn not found (answered together
        with a later message) shows the whole session.
    """
    store = Store(db_path)
    try:
        if store.get_session(session_id) is None:
            return None
        turns = build_turns(store.history(session_id), [])
        number = next((t.number for t in turns if any(r.id == root_id for r in t.roots)), None)
        html = render_trace(store, session_id, turn=number)
        suffix = f"turn-{number}" if number is not None else "session"
        return html, f"kesoku-{session_id}-{suffix}.html"
    finally:
        store.close()
