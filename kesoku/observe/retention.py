"""A cap on the disk space of each session's turn logs: the oldest logs go first.

Every turn log holds the whole request, so a session's logs grow about with the square of its
length: a long-lived Discord thread can reach gigabytes. :class:`Retention` runs in the writer
process (:mod:`kesoku.observe.turnlog`), after each log is written: it keeps a running total of the
session folder's ``llm-turn-{idx}.log.yaml`` files (one scan the first time a folder is seen) and
deletes the lowest indexes until the folder is back under its cap. The log just written is never
deleted, even when it alone is over the cap. Indexes still come from the highest file left, so
deleting old logs never makes an index repeat.
"""

from __future__ import annotations

import logging
import os
import re
from collections import OrderedDict, deque
from pathlib import Path

logger = logging.getLogger(__name__)

LOG_NAME = re.compile(r"llm-turn-([0-9]+)\.log\.yaml")
"""The name of a turn log file; group 1 is its index."""

_FOLDERS = 1024
"""Folders whose logs are tracked.

The least recently written is dropped first, and rescanned if seen again.
"""


class _Folder:
    __slots__ = ("logs", "total")

    def __init__(self, logs: list[tuple[int, int]]) -> None:
        self.logs: deque[tuple[int, int]] = deque(sorted(logs))  # (idx, bytes), oldest first
        self.total = sum(size for _, size in logs)


class Retention:
    """Keeps each folder's turn logs under ``max_bytes``.

    Not thread-safe: one writing thread uses it.

    Args:
        max_bytes: Bytes of turn logs kept per session folder; 0 keeps everything.
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be 0 (no cap) or more")
        self.max_bytes = max_bytes
        self.deleted = 0
        """Logs deleted so far."""
        self._folders: OrderedDict[str, _Folder] = OrderedDict()

    def written(self, path: Path, idx: int, size: int) -> None:
        """Count the log just written at ``path`` and delete the oldest logs past the cap.

        Raises:
            Nothing: a log that cannot be deleted (gone, or a permission problem) is logged and
            left; the next write tries again.
        """
        if not self.max_bytes:
            return
        key = str(path.parent)
        folder = self._folders.pop(key, None)
        if folder is None:
            folder = _Folder(_scan_sizes(path.parent))  # the new log is on disk: the scan counts it
        else:
            folder.logs.append((idx, size))
            folder.total += size
        self._folders[key] = folder
        while len(self._folders) > _FOLDERS:
            self._folders.popitem(last=False)
        while folder.total > self.max_bytes and len(folder.logs) > 1 and folder.logs[0][0] != idx:
            old, old_size = folder.logs[0]
            try:
                (path.parent / f"llm-turn-{old}.log.yaml").unlink(missing_ok=True)
            except OSError as exc:
                logger.warning("turn log %s/llm-turn-%d.log.yaml not deleted: %s", key, old, exc)
                return
            folder.logs.popleft()
            folder.total -= old_size
            self.deleted += 1


def _scan_sizes(folder: Path) -> list[tuple[int, int]]:
    """``(idx, bytes)`` of each turn log in ``folder``."""
    logs = []
    for idx, item in log_files(folder):
        try:
            logs.append((idx, item.stat().st_size))
        except FileNotFoundError:  # deleted meanwhile (another writer's retention)
            continue
    return logs


def log_files(folder: str | os.PathLike[str]) -> list[tuple[int, os.DirEntry[str]]]:
    """``(idx, entry)`` of each ``llm-turn-{idx}.log.yaml`` in ``folder``, in directory order.

    Raises:
        OSError: The folder cannot be listed (FileNotFoundError when it does not exist).
    """
    with os.scandir(folder) as entries:
        return [(int(m[1]), item) for item in entries if (m := LOG_NAME.fullmatch(item.name))]
