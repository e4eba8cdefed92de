"""File tools: read_file, write_file, edit_file, list_dir, glob and grep, through the path gates.

Every path goes through :mod:`kesoku.tools.paths` first: reads pass inside the workspace (the
working directory and the session workspace) and the readable roots; writes pass inside the
workspace; secret paths (``~/.ssh``, ``.env``, Kesoku's config and database …) are denied to every
tool. A write outside the workspace (or into ``.git/hooks``) asks the user first
(:func:`approve_write`, through the call's guard) and is refused with a
:class:`~kesoku.vocab.errors.ToolError` unless the user allows it. A read outside the workspace (a
readable root) marks the session tainted. Files are opened with
:func:`~kesoku.tools.paths.open_checked`, which re-checks what was opened, so a symlink swapped in
after the check does not lead outside.

All file-system work runs in a worker thread (``trio.to_thread``); outputs are capped (lines, bytes,
matches, entries) and say where they were cut and how to go on.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import trio

from kesoku.tools.base import Tool, ToolContext
from kesoku.tools.output import cap_output
from kesoku.tools.paths import (
    NeedsApproval,
    PathGates,
    SecretMatcher,
    brief,
    check_read,
    check_write,
    open_checked,
    os_problem,
    require_write,
    workspaces,
)
from kesoku.tools.schema import Check, tool_from_function
from kesoku.vocab.errors import ToolError

DEFAULT_MAX_OUTPUT_BYTES = 32_000
"""Bytes of text a file tool returns at most (the shell's ``max_output_bytes`` is a good value)."""
READ_MAX_LINES = 2000
"""Lines read_file returns when the model gives no limit."""
LINE_MAX_CHARS = 2000
"""A longer line is cut (minified files, data on one line)."""
LIST_MAX_ENTRIES = 1000
GLOB_MAX_RESULTS = 500
GREP_MAX_MATCHES = 200
SCAN_MAX_ENTRIES = 200_000
"""Folder entries glob and grep look at before they stop and say the result is partial."""
GREP_MAX_FILE_BYTES = 10_000_000
"""grep skips larger files (logs, data dumps): read them with read_file ranges or the shell."""
BINARY_SNIFF_BYTES = 8192
SKIPPED_DIRS = frozenset(
    {".git", "node_modules", ".venv", "venv", "__pycache__", ".mypy_cache", ".pytest_cache"}
)
"""Folders grep does not descend into unless it is pointed at them."""
FILE_TOOL_TIMEOUT_S = 60.0

_NON_EMPTY = "`{name}` must be a non-empty string"
_Text = Annotated[str, Check("`{name}` must be a string (it may be empty)")]
"""A text argument that may be empty."""
_NonEmpty = Annotated[str, Check(_NON_EMPTY, bool)]
_Positive = Annotated[
    int, Check("`{name}` must be a positive integer, got {value!r}", lambda n: n >= 1)
]


@dataclass(frozen=True, slots=True)
class _Env:
    gates: PathGates
    max_output_bytes: int
    approved: Path | None = (
        None  # the path the user allowed this call to write outside the workspace
    )


def file_tools(
    gates: PathGates, *, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
) -> tuple[Tool, ...]:
    """The file tools: read_file, write_file, edit_file, list_dir, glob and grep.

    Args:
        gates: Readable roots and Kesoku's own files (see :class:`~kesoku.tools.paths.PathGates`).
        max_output_bytes: The cap of each result's text.

    Returns:
        The six tools, in that order.
    """

    async def in_thread(
        tool: str,
        fn: Callable[..., str],
        ctx: ToolContext,
        *args: object,
        approved: Path | None = None,
        writes: bool = False,
    ) -> str:
        env = _Env(gates, ctx.output_cap(max_output_bytes), approved)
        try:
            # Writes finish even if the call is cancelled (a half-written file is worse than a late
            # result); reads and scans are abandoned at once.
            return await trio.to_thread.run_sync(fn, env, ctx, *args, abandon_on_cancel=not writes)
        except OSError as exc:  # the file system's refusal: the model's to read, not a bug
            where = f" ({brief(str(exc.filename))})" if exc.filename else ""
            raise ToolError(f"{tool} failed: {os_problem(exc)}{where}") from None

    # The descriptions are given below, not taken from the docstrings: they go with every model
    # call (bench/overhead_bench.py counts them), so each says only what the schema (argument
    # names, types, defaults) and the system prompt's rules (how paths resolve, that a write outside
    # the workspace asks the user) do not. The first sentence is the system prompt's snippet.
    async def read_file(
        ctx: ToolContext,
        path: _NonEmpty,
        start_line: _Positive = 1,
        max_lines: _Positive = READ_MAX_LINES,
    ) -> str:
        """Read a text file's lines, numbered."""
        return await in_thread("read_file", _read_file, ctx, path, start_line, max_lines)

    async def write_file(ctx: ToolContext, path: _NonEmpty, content: _Text) -> str:
        """Write a whole text file, after the user's approval outside the workspace."""
        approved = await approve_write("write_file", path, ctx, gates)
        return await in_thread(
            "write_file", _write_file, ctx, path, content, approved=approved, writes=True
        )

    async def edit_file(
        ctx: ToolContext, path: _NonEmpty, old_text: _NonEmpty, new_text: _Text
    ) -> str:
        """Replace a text in a file, after the user's approval outside the workspace."""
        approved = await approve_write("edit_file", path, ctx, gates)
        return await in_thread(
            "edit_file", _edit_file, ctx, path, old_text, new_text, approved=approved, writes=True
        )

    async def list_dir(ctx: ToolContext, path: _NonEmpty = ".") -> str:
        """List a folder."""
        return await in_thread("list_dir", _list_dir, ctx, path)

    async def glob(ctx: ToolContext, pattern: _NonEmpty, path: _NonEmpty = ".") -> str:
        """Find files by name."""
        return await in_thread("glob", _glob, ctx, pattern, path)

    async def grep(
        ctx: ToolContext,
        pattern: _NonEmpty,
        path: _NonEmpty = ".",
        glob: str = "",
        ignore_case: bool = False,
    ) -> str:
        """Search file contents."""
        return await in_thread("grep", _grep, ctx, pattern, path, glob, ignore_case)

    def tool(fn: Callable[..., Awaitable[str]], description: str) -> Tool:
        return tool_from_function(fn, description=description, timeout_s=FILE_TOOL_TIMEOUT_S)

    return (
        tool(read_file, "Read a text file. Lines come numbered: `N<tab>text`."),
        tool(write_file, "Write a whole text file. Missing folders are created."),
        tool(
            edit_file,
            "Edit a text file. `old_text` must occur exactly once; it becomes `new_text`.",
        ),
        tool(list_dir, "List a folder."),
        tool(glob, "Find files by name. `pattern` is relative to `path`; `**` spans folders."),
        tool(
            grep,
            "Search file contents. `pattern` is a Python regex; `path` a file or folder; `glob` a "
            "file name filter.",
        ),
    )


async def approve_write(tool: str, path: str, ctx: ToolContext, gates: PathGates) -> Path | None:
    """Ask the user before a write outside the workspace; nothing to ask inside it.

    Args:
        tool: The tool that writes (named in the question).
        path: The path the model gave.
        ctx: The call's context; its guard asks the user.
        gates: The path gates.

    Returns:
        The resolved path the user allowed, or None when the write needs no approval.

    Raises:
        ToolError: The path is secret, or the user denied the write (or did not answer in time).

    Cancellation:
        The question is withdrawn and Cancelled propagates.
    """
    decision = await trio.to_thread.run_sync(check_write, path, ctx, gates)
    if not isinstance(decision, NeedsApproval):
        return None
    approval = await ctx.confirm(
        f"{tool} wants to write {decision.path} ({decision.reason}). Allow?"
    )
    if not approval.allowed:
        raise ToolError(
            f"writing {decision.path} needs the user's approval ({decision.reason}) "
            f"and was not allowed ({approval.note}); the file was not written. "
            f"Write inside the workspace ({ctx.cwd}) instead."
        )
    return decision.path


def _shown(real: Path, ctx: ToolContext) -> str:
    """A path as the model should see it: relative to the working directory when inside it."""
    try:
        return os.fspath(real.relative_to(os.path.realpath(ctx.cwd))) or "."
    except ValueError:
        return os.fspath(real)


def _open_read(real: Path, ctx: ToolContext, gates: PathGates) -> tuple[int, os.stat_result]:
    """Open a checked path for reading; it must be a regular file (not a folder, device or pipe)."""
    try:
        fd = open_checked(real, os.O_RDONLY | os.O_NONBLOCK, ctx, gates, write=False)
    except FileNotFoundError:
        raise ToolError(f"no such file: {real}") from None
    except OSError as exc:
        raise ToolError(f"cannot open {real}: {os_problem(exc)}") from None
    return fd, _regular(fd, real)


def _regular(fd: int, real: Path) -> os.stat_result:
    """The stat of an open regular file; any other kind closes the descriptor and is a ToolError."""
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode):
        return st
    os.close(fd)
    if stat.S_ISDIR(st.st_mode):
        raise ToolError(f"{real} is a folder: use list_dir")
    raise ToolError(f"{real} is not a regular file (a device, pipe or socket)")


# -- read, write, edit ----------------------------------------------------------------------------


def _read_file(env: _Env, ctx: ToolContext, given: str, start: int, limit: int) -> str:
    real = check_read(given, ctx, env.gates)
    fd, st = _open_read(real, ctx, env.gates)
    with os.fdopen(fd, "rb") as file:
        if b"\x00" in file.read(BINARY_SNIFF_BYTES):
            raise ToolError(
                f"{_shown(real, ctx)} is a binary file ({st.st_size} bytes); "
                "it cannot be shown as text"
            )
        file.seek(0)
        out: list[str] = []
        used = 0
        number = 0
        cut_at: int | None = None
        more = False
        for number, raw in enumerate(file, start=1):
            if number < start:
                continue
            if len(out) >= limit:
                more = True
                break
            text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            if len(text) > LINE_MAX_CHARS:
                text = text[:LINE_MAX_CHARS] + f" … [line cut: {len(text)} characters]"
            entry = f"{number}\t{text}"
            used += len(entry.encode()) + 1
            if used > env.max_output_bytes and out:
                cut_at = number
                break
            out.append(entry)
    shown = _shown(real, ctx)
    if not out:
        if number == 0:
            return f"{shown} is empty"
        raise ToolError(f"{shown} has {number} lines; start_line {start} is past the end")
    first, last = start, start + len(out) - 1
    body = "\n".join(out)
    if cut_at is not None:
        body += f"\n[output cap reached: read on with start_line={cut_at}]"
    elif more:
        body += f"\n[more lines follow: read on with start_line={last + 1}]"
    return f"{shown} (lines {first}-{last}):\n{body}"


def _write_bytes(real: Path, data: bytes, ctx: ToolContext, gates: PathGates) -> None:
    """Write a checked path whole: open (re-checked), truncate, write, sync."""
    try:
        real.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ToolError(f"cannot make the folder {real.parent}: {os_problem(exc)}") from None
    try:
        # O_NONBLOCK: a FIFO without a reader fails at once instead of holding the thread forever.
        fd = open_checked(real, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK, ctx, gates, write=True)
    except IsADirectoryError:
        raise ToolError(f"{real} is a folder") from None
    except OSError as exc:
        raise ToolError(f"cannot open {real} for writing: {exc.strerror or exc}") from None
    _regular(fd, real)
    with os.fdopen(fd, "wb") as file:
        file.truncate(0)
        file.write(data)
        file.flush()
        os.fsync(fd)


def _write_file(env: _Env, ctx: ToolContext, given: str, content: str) -> str:
    real = require_write(given, ctx, env.gates, approved=env.approved)
    existed = real.exists()
    data = content.encode("utf-8", errors="surrogatepass")
    _write_bytes(real, data, ctx, env.gates)
    lines = content.count("\n") + (1 if content and not content.endswith("\n") else 0)
    verb = "overwrote" if existed else "created"
    return f"{verb} {_shown(real, ctx)}: {len(data)} bytes, {lines} lines"


def _edit_file(env: _Env, ctx: ToolContext, given: str, old: str, new: str) -> str:
    real = require_write(given, ctx, env.gates, approved=env.approved)
    fd, _ = _open_read(real, ctx, env.gates)
    with os.fdopen(fd, "rb") as file:
        data = file.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolError(f"{_shown(real, ctx)} is not UTF-8 text; edit it with the shell") from None
    shown = _shown(real, ctx)
    count = text.count(old)
    if count == 0:
        raise ToolError(
            f"old_text was not found in {shown}; read the file and copy the text exactly"
        )
    if count > 1:
        raise ToolError(
            f"old_text matches {count} times in {shown}; "
            "include surrounding lines so it matches once"
        )
    index = text.index(old)
    updated = text[:index] + new + text[index + len(old) :]
    _write_bytes(real, updated.encode("utf-8"), ctx, env.gates)
    line = text.count("\n", 0, index) + 1
    return (
        f"edited {shown} at line {line}: "
        f"{old.count(chr(10)) + 1} line(s) replaced by {new.count(chr(10)) + 1}"
    )


# -- list, glob, grep -----------------------------------------------------------------------------


def _list_dir(env: _Env, ctx: ToolContext, given: str) -> str:
    real = check_read(given, ctx, env.gates)
    if not real.is_dir():
        raise ToolError(
            f"{_shown(real, ctx)} is not a folder" if real.exists() else f"no such folder: {real}"
        )
    lines: list[str] = []
    with os.scandir(real) as entries:
        items = sorted(entries, key=lambda e: e.name)
    for entry in items[:LIST_MAX_ENTRIES]:
        if entry.is_symlink():
            lines.append(f"{entry.name} -> {os.readlink(entry.path)}")
        elif entry.is_dir():
            lines.append(entry.name + "/")
        else:
            try:
                lines.append(f"{entry.name}  {entry.stat().st_size} bytes")
            except OSError:
                lines.append(entry.name)
    header = f"{_shown(real, ctx)}/ ({len(items)} entries)"
    if len(items) > LIST_MAX_ENTRIES:
        lines.append(
            f"[{len(items) - LIST_MAX_ENTRIES} more entries not shown: use glob to narrow]"
        )
    return cap_output("\n".join([header, *lines]), env.max_output_bytes)


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A regex for a relative glob.

    ``*`` and ``?`` stay within a folder, ``**`` spans folders, ``[…]`` are sets.

    Raises:
        ToolError: The pattern is absolute or climbs out with ``..``.
    """
    if not pattern or pattern.startswith(("/", "~")) or ".." in pattern.split("/"):
        raise ToolError(
            f"glob pattern {pattern!r} must be relative and must not use ..; "
            "pass the folder as `path`"
        )
    out: list[str] = []
    parts = pattern.split("/")
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "**":
            out.append(".*" if last else "(?:.*/)?")
            continue
        j = 0
        while j < len(part):
            c = part[j]
            if c == "*":
                out.append("[^/]*")
            elif c == "?":
                out.append("[^/]")
            elif c == "[" and "]" in part[j + 2 :]:
                end = part.index("]", j + 2)
                body = part[j + 1 : end]
                negate = body.startswith(("!", "^"))
                body = re.escape(body[1:] if negate else body).replace("\\-", "-")
                out.append(f"[{'^' if negate else ''}{body}]")
                j = end
            else:
                out.append(re.escape(c))
            j += 1
        if not last:
            out.append("/")
    return re.compile("".join(out) + r"\Z", re.DOTALL)


def _walk(
    root: Path, *, skip: frozenset[str] = frozenset()
) -> Iterator[tuple[str, os.DirEntry[str]]]:
    """(path relative to root, entry) of everything below root.

    Symlinked folders are not entered.
    """
    stack = [(root, "")]
    seen = 0
    while stack:
        folder, prefix = stack.pop()
        try:
            with os.scandir(folder) as entries:
                items = sorted(entries, key=lambda e: e.name)
        except OSError:
            continue
        subfolders: list[tuple[Path, str]] = []
        for entry in items:
            seen += 1
            if seen > SCAN_MAX_ENTRIES:
                raise _ScanLimit
            rel = prefix + entry.name
            yield rel, entry
            if entry.is_dir(follow_symlinks=False) and entry.name not in skip:
                subfolders.append((Path(entry.path), rel + "/"))
        stack.extend(reversed(subfolders))  # the first sub-folder is popped first


class _ScanLimit(Exception):
    """More than SCAN_MAX_ENTRIES entries were looked at."""


def _readable(entry: os.DirEntry[str], secrets: SecretMatcher, roots: tuple[Path, ...]) -> bool:
    """Whether a found entry may be shown.

    It must not be secret (nor a hard link to one), and its target must be inside the roots.
    """
    if secrets.reason(Path(entry.path)) is not None:
        return False
    try:
        if secrets.hard_link(entry.stat(follow_symlinks=False)):
            return False
    except OSError:
        return False
    real = os.path.realpath(entry.path)
    return any(
        real == os.fspath(r) or real.startswith(os.fspath(r).rstrip("/") + "/") for r in roots
    )


def _roots(ctx: ToolContext, env: _Env) -> tuple[Path, ...]:
    return (*workspaces(ctx), *(Path(os.path.realpath(r)) for r in env.gates.readable_roots))


def _glob(env: _Env, ctx: ToolContext, pattern: str, given: str) -> str:
    regex = glob_regex(pattern)
    base = check_read(given, ctx, env.gates)
    if not base.is_dir():
        raise ToolError(f"{_shown(base, ctx)} is not a folder")
    secrets, roots = SecretMatcher(env.gates), _roots(ctx, env)
    found: list[str] = []
    partial = ""
    try:
        for rel, entry in _walk(base):
            if regex.match(rel) and _readable(entry, secrets, roots):
                found.append(rel + ("/" if entry.is_dir() else ""))
                if len(found) >= GLOB_MAX_RESULTS:
                    partial = f"[stopped at {GLOB_MAX_RESULTS} results: narrow the pattern]"
                    break
    except _ScanLimit:
        partial = f"[stopped after looking at {SCAN_MAX_ENTRIES} entries: narrow `path`]"
    where = _shown(base, ctx)
    if not found:
        return f"no files match {pattern!r} in {where}" + (f"\n{partial}" if partial else "")
    lines = [f"{len(found)} match(es) for {pattern!r} in {where}:", *found]
    if partial:
        lines.append(partial)
    return cap_output("\n".join(lines), env.max_output_bytes)


def _grep(
    env: _Env, ctx: ToolContext, source: str, given: str, glob: str, ignore_case: bool
) -> str:
    flags = re.IGNORECASE if ignore_case else 0
    try:
        regex = re.compile(source, flags)
    except re.error as exc:
        raise ToolError(f"invalid regular expression {source!r}: {exc}") from None
    name_filter = glob_regex(glob) if glob else None
    # a single file is fully checked here
    base = check_read(given, ctx, env.gates)
    secrets, roots = SecretMatcher(env.gates), _roots(ctx, env)
    if base.is_file():
        files: Iterator[tuple[str, str]] = iter([(_shown(base, ctx), os.fspath(base))])
    elif base.is_dir():
        prefix = "" if _shown(base, ctx) == "." else _shown(base, ctx) + "/"
        files = (
            (prefix + rel, entry.path)
            for rel, entry in _walk(base, skip=SKIPPED_DIRS)
            if entry.is_file(follow_symlinks=False)  # a symlinked file is not followed
            and (name_filter is None or name_filter.match(rel) or name_filter.match(entry.name))
            and _readable(entry, secrets, roots)
        )
    else:
        raise ToolError(f"no such file or folder: {base}")
    out: list[str] = []
    used = 0
    partial = ""
    try:
        for shown, path in files:
            for line_no, text in _matching_lines(path, regex):
                entry = f"{shown}:{line_no}: {text}"
                used += len(entry.encode()) + 1
                if len(out) >= GREP_MAX_MATCHES or used > env.max_output_bytes:
                    partial = (
                        f"[stopped at {len(out)} matches: narrow the pattern, `path` or `glob`]"
                    )
                    raise _ScanLimit
                out.append(entry)
    except _ScanLimit:
        partial = partial or f"[stopped after looking at {SCAN_MAX_ENTRIES} entries: narrow `path`]"
    if not out:
        return f"no matches for {source!r}" + (f"\n{partial}" if partial else "")
    return "\n".join([*out, partial] if partial else out)


def _matching_lines(path: str, regex: re.Pattern[str]) -> Iterator[tuple[int, str]]:
    """(line number, text) of the lines of a text file that match.

    Binary and huge files are skipped.
    """
    try:
        # O_NOFOLLOW: a file swapped for a symlink after the walk looked at it is not read.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as file:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > GREP_MAX_FILE_BYTES:
                return
            if b"\x00" in file.read(BINARY_SNIFF_BYTES):
                return
            file.seek(0)
            for number, raw in enumerate(file, start=1):
                text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                if regex.search(text):
                    yield number, text if len(text) <= 500 else text[:500] + " …"
    except OSError:
        return


__all__ = ["DEFAULT_MAX_OUTPUT_BYTES", "file_tools", "glob_regex"]
