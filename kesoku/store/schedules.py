"""Schedules (:mod:`kesoku.vocab.schedule`): stored, found due, moved past a run exactly once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from kesoku.store.base import StoreBase, writes
from kesoku.vocab.schedule import Schedule


class ScheduleTable(StoreBase):
    """The ``schedules`` table's queries (a mixin of :class:`~kesoku.store.store.Store`)."""

    @writes
    def put_schedule(self, schedule: Schedule) -> None:
        """Add a schedule, or replace the one of the same name."""
        row = msgspec.structs.astuple(schedule)
        self._conn.execute(
            f"INSERT OR REPLACE INTO schedules ({_SCHEDULE_COLUMNS})"
            f" VALUES ({', '.join('?' * len(row))})",
            tuple(int(v) if isinstance(v, bool) else v for v in row),
        )

    def get_schedule(self, name: str) -> Schedule | None:
        """The schedule of this name, or None."""
        row = self._conn.execute(
            f"SELECT {_SCHEDULE_COLUMNS} FROM schedules WHERE name = ?", (name,)
        ).fetchone()
        return None if row is None else _row_to_schedule(row)

    def list_schedules(self, *, created_by: str | None = None) -> list[Schedule]:
        """Every schedule (or those one creator made), by name."""
        where, args = ("", ()) if created_by is None else (" WHERE created_by = ?", (created_by,))
        rows = self._conn.execute(
            f"SELECT {_SCHEDULE_COLUMNS} FROM schedules{where} ORDER BY name", args
        )
        return [_row_to_schedule(r) for r in rows]

    def due_schedules(self, now: float) -> list[Schedule]:
        """Enabled schedules whose next run is at or before ``now``, earliest first."""
        rows = self._conn.execute(
            f"SELECT {_SCHEDULE_COLUMNS} FROM schedules WHERE enabled AND next_run IS NOT NULL"
            " AND next_run <= ? ORDER BY next_run",
            (now,),
        )
        return [_row_to_schedule(r) for r in rows]

    def next_schedule_time(self) -> float | None:
        """The earliest planned run of an enabled schedule, or None."""
        row = self._conn.execute(
            "SELECT min(next_run) FROM schedules WHERE enabled AND next_run IS NOT NULL"
        ).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    @writes
    def advance_schedule(
        self,
        name: str,
        *,
        planned: float,
        next_run: float | None,
        last_run: float | None = None,
        last_message_id: int | None = None,
        last_note: str = "",
    ) -> bool:
        """Move a schedule past its run planned at ``planned``, if no one did it first.

        Returns:
            False when its next run is no longer ``planned`` (another process, or a change).
        """
        cur = self._conn.execute(
            "UPDATE schedules SET next_run = ?,"
            " last_run = coalesce(?, last_run), last_message_id = coalesce(?, last_message_id),"
            " last_note = ? WHERE name = ? AND next_run = ? RETURNING name",
            (next_run, last_run, last_message_id, last_note, name, planned),
        )
        return cur.fetchone() is not None

    @writes
    def note_run(self, name: str, *, last_run: float, last_message_id: int) -> None:
        """Record an extra run (``kesoku schedule run``) as the last one; the next stays put."""
        self._conn.execute(
            "UPDATE schedules SET last_run = ?, last_message_id = ?, last_note = '' WHERE name = ?",
            (last_run, last_message_id, name),
        )

    @writes
    def delete_schedule(self, name: str) -> bool:
        """Remove a schedule; False when there was none of that name."""
        row = self._conn.execute(
            "DELETE FROM schedules WHERE name = ? RETURNING name", (name,)
        ).fetchone()
        return row is not None


_SCHEDULE_COLUMNS = ", ".join(f.name for f in msgspec.structs.fields(Schedule))


def _row_to_schedule(row: Sequence[Any]) -> Schedule:
    values = dict(zip((f.name for f in msgspec.structs.fields(Schedule)), row, strict=True))
    values["enabled"] = bool(values["enabled"])
    return Schedule(**values)
