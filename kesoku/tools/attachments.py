"""Files users send: one name sanitizer and one save for every adapter (Discord, Google Chat).

A received file's name is the sender's to choose, so it is made into one safe path component before
anything touches the disk (:func:`safe_attachment_name`), and saved without ever overwriting
(:func:`save_attachment`); :func:`saved_copy` finds the copy an earlier take-in of the same message
saved, so a message handled twice saves its files once. A name quoted back to the user or the model
goes through :func:`display_name`, which keeps it short and printable.
"""

from __future__ import annotations

import errno
import itertools
import os
import re
import stat
import unicodedata
from collections.abc import Collection, Iterator
from pathlib import Path

from kesoku.tools.paths import BRIEF_CHARS, NAME_MAX_BYTES, brief

EXTENSION_MAX_CHARS = 16
"""A longer last dotted part is not an extension: it is cut with the rest of the name."""
SAVE_TRIES = 100
"""Names tried by :func:`save_attachment` before it gives up (each collision renames)."""
FALLBACK_NAME = "attachment"
"""The name of a file whose given name has nothing usable left."""

_DROPPED = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
"""Unicode categories removed from names: controls, invisible formatting (bidi overrides, zero-width
characters), lone surrogates (not encodable), line and paragraph separators."""
_FORBIDDEN = re.compile(r'[/\\<>:"|?*]')
"""Separators, and what Windows forbids in a name (the workspace may be shared with Windows)."""
_LEADING = re.compile(r"^[\s.\-]+")
"""No leading dot (a hidden file, ``..``), dash (``-rf`` read as an option) or space."""
_TRAILING = re.compile(r"[\s.]+$")
"""Windows drops trailing dots and spaces, so two names could meet there."""
_RESERVED_WINDOWS = frozenset(
    {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)), *(f"lpt{i}" for i in range(10))}
)


def _fit(text: str, max_bytes: int) -> str:
    """``text`` cut to ``max_bytes`` of UTF-8 on a character boundary, no trailing dot or space."""
    raw = text.encode("utf-8")
    if len(raw) <= max_bytes:
        return text
    return _TRAILING.sub("", raw[:max_bytes].decode("utf-8", errors="ignore"))


def safe_attachment_name(name: str, folder: Path) -> str:
    """A safe file name for an incoming attachment saved in ``folder``.

    Args:
        name: The name the sender gave (any text, lone surrogates included).
        folder: Where it will be saved (only looked at for collisions).

    Returns:
        One path component, valid UTF-8 of at most :data:`~kesoku.tools.paths.NAME_MAX_BYTES` bytes:
        NFC; control, formatting (bidi overrides) and surrogate characters removed; separators and
        characters Windows forbids become ``_``; runs of dots become one; no leading dot, dash or
        space, no trailing dot or space; a Windows reserved name (``CON``, ``LPT1``…) gets a ``_``
        prefix; a long name is cut on a character boundary with its extension kept;
        :data:`FALLBACK_NAME` when nothing is left. A name already taken in ``folder`` becomes
        ``name (1).ext``, ``name (2).ext``, …. Create the file with ``open(..., "xb")``: a
        concurrent save may take the same name first.
    """
    for candidate in _candidates(name):
        if not os.path.lexists(folder / candidate):
            return candidate
    raise AssertionError("unreachable")  # pragma: no cover


def _candidates(name: str) -> Iterator[str]:
    """The names :func:`safe_attachment_name` tries for ``name``, in order, without end."""
    text = unicodedata.normalize("NFC", name)
    text = "".join(c for c in text if unicodedata.category(c) not in _DROPPED)
    text = _FORBIDDEN.sub("_", text)
    text = re.sub(r"\.{2,}", ".", text)
    text = _TRAILING.sub("", _LEADING.sub("", text))
    stem, dot, ext = text.rpartition(".")
    if not dot or not stem or len(ext) > EXTENSION_MAX_CHARS or any(c.isspace() for c in ext):
        stem, ext = text, ""
    if stem.split(".")[0].rstrip().casefold() in _RESERVED_WINDOWS:
        stem = "_" + stem
    suffix = f".{ext}" if ext else ""
    room = NAME_MAX_BYTES - len(suffix.encode("utf-8"))
    stem = _fit(stem, room) or FALLBACK_NAME
    yield stem + suffix
    for n in itertools.count(1):
        mark = f" ({n})"
        yield _fit(stem, room - len(mark)) + mark + suffix


def saved_copy(
    folder: Path, filename: str, data: bytes, *, exclude: Collection[Path] = ()
) -> Path | None:
    """The file :func:`save_attachment` saved ``data`` as earlier, if it is still there unchanged.

    Blocking: run it in a thread. Looks at the names :func:`save_attachment` would have used for
    ``filename`` (``name.ext``, ``name (1).ext``, … up to the first free one) for a regular file (a
    symbolic link is never followed) holding exactly ``data``. A message taken in again (a replay
    after a restart, a crash before it was stored) thus reuses its files instead of saving them
    again; a copy the agent changed since is not reused.

    Args:
        folder: The session workspace.
        filename: The name the user gave.
        data: The file's bytes.
        exclude: Paths not to reuse (the files of the same message already matched, so two equal
            attachments of one message stay two files).

    Returns:
        The path, or None (nothing to reuse, or the folder cannot be read).
    """
    for candidate in _candidates(filename):
        path = folder / candidate
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            return None  # the first free name: save_attachment never went past it
        except OSError:
            return None
        if path in exclude or not stat.S_ISREG(info.st_mode) or info.st_size != len(data):
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
            with os.fdopen(fd, "rb") as held:
                if held.read(len(data) + 1) == data:
                    return path
        except OSError:
            continue
    return None  # pragma: no cover (the candidates never end)


def save_attachment(folder: Path, filename: str, data: bytes) -> Path:
    """Write a received file under a safe, unused name in ``folder`` (blocking: run it in a thread).

    Args:
        folder: The session workspace (created when missing).
        filename: The name the user gave; made safe by :func:`safe_attachment_name`.
        data: The file's bytes.

    Returns:
        The path written.

    Raises:
        OSError: The folder cannot be made or written (a full disk, no permission), or no free name
            was found; :func:`~kesoku.tools.paths.os_problem` words it for the user.
    """
    folder.mkdir(parents=True, exist_ok=True)
    for _ in range(SAVE_TRIES):
        path = folder / safe_attachment_name(filename, folder)
        try:
            # "xb": a save racing this one for the name never overwrites it; the next try renames.
            with open(path, "xb") as out:
                out.write(data)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(
        errno.EEXIST, f"no free name for {display_name(filename)!r} after {SAVE_TRIES} tries"
    )


def display_name(name: str, max_chars: int = BRIEF_CHARS) -> str:
    """A name as it may be quoted to the user or the model, in a message or a Markdown code span.

    Control, formatting and surrogate characters and backticks are removed, whitespace runs become
    one space, and the result is cut to ``max_chars`` characters (``…`` marks the cut); ``?`` when
    nothing is left.
    """
    text = "".join(c for c in name if unicodedata.category(c) not in _DROPPED and c != "`")
    return brief(" ".join(text.split()), max_chars) or "?"


__all__ = [
    "FALLBACK_NAME",
    "SAVE_TRIES",
    "display_name",
    "safe_attachment_name",
    "save_attachment",
    "saved_copy",
]
