"""Path gates: which files a tool may read, write or share (DESIGN §8).

Every check runs on the path as the OS will see it: ``~`` expanded, made absolute against the tool's
working directory, then resolved (symlinks and ``..``) with :func:`os.path.realpath`. A link inside the
workspace that points outside is judged by its target. The rules:

- Secret paths are denied to every tool, read or write, even inside the workspace: ``~/.ssh``,
  ``~/.aws``, ``~/.config/gcloud``, ``~/.gnupg`` and other credential stores (:data:`SECRET_HOME_PATHS`),
  ``.env`` and ``.env.*`` files anywhere, the Kesoku config file, its database (``-wal``, ``-shm`` and
  ``-journal`` too) and credentials files (:class:`PathGates`), ``/proc/*/environ``. A secret is
  matched on the path as written and as resolved, and a hard link to a secret file is caught by its
  inode.
- Reads pass inside the workspace (the tool's working directory and the session workspace) and the
  configured readable roots; other reads are denied.
- Writes pass inside the workspace. A write elsewhere, or into ``.git/hooks`` and ``.git/config``
  (which make an allowed ``git`` run code), needs the user's approval: :func:`check_write` returns
  :class:`NeedsApproval`. Asking the user goes through the adapters (a ``[question: …]``), which do
  not exist yet, so for now :func:`require_write` refuses such a write with a :class:`ToolError`.

These functions touch the file system (realpath, stat): in async code call them through
``trio.to_thread``. :func:`open_checked` closes the gap between check and use: it opens without
following a final symlink and re-checks the path the kernel reports for the open descriptor.
"""

from __future__ import annotations

import errno
import itertools
import os
import re
import stat
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kesoku.errors import ToolError
from kesoku.tools.base import ToolContext

if TYPE_CHECKING:
    from kesoku.config import Config

SECRET_HOME_PATHS: tuple[str, ...] = (
    ".ssh",
    ".aws",
    ".config/gcloud",
    ".gnupg",
    ".azure",
    ".kube",
    ".docker",
    ".config/gh",
    ".password-store",
    ".local/share/keyrings",
    ".netrc",
    ".git-credentials",
    ".pgpass",
    ".pypirc",
)
"""Credential stores under the home folder, denied to every tool (files, or whole folders)."""

SECRET_SYSTEM_PATHS: tuple[str, ...] = ("/etc/shadow", "/etc/gshadow", "/etc/ssh")
"""System files holding password hashes and host keys."""

_PROC_SECRET = re.compile(r"^/proc/[^/]+(?:/task/[^/]+)?/(?:environ|mem)$")
_DB_SUFFIXES = ("", "-wal", "-shm", "-journal")
_HARDLINK_SCAN_LIMIT = 5000
"""Files looked at when matching a hard link against the secret folders' files."""

ATTACHMENT_NAME_MAX_CHARS = 120
_RESERVED_WINDOWS = frozenset(
    {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)), *(f"lpt{i}" for i in range(10))}
)


@dataclass(frozen=True, slots=True)
class PathGates:
    """Where the file rules look, beyond the workspace and the home folder.

    Attributes:
        readable_roots: Folders whose files every tool may read.
        shareable_roots: Folders whose files may be sent with ``[file: /abs/path]``.
        protected_files: Kesoku's own secrets: the config file, the database (its ``-wal``, ``-shm``
            and ``-journal`` files are implied), credentials files. Denied to every tool.
        home: The home folder of the secret rules; None: the current user's (``~``).
        trusted_roots: Folders every tool may read without tainting the session: the skills
            directories (the operator's and Kesoku's own).
    """

    readable_roots: tuple[Path, ...] = ()
    shareable_roots: tuple[Path, ...] = ()
    protected_files: tuple[Path, ...] = ()
    home: Path | None = None
    trusted_roots: tuple[Path, ...] = ()

    @classmethod
    def from_config(
        cls,
        cfg: Config,
        *,
        config_file: Path | None = None,
        readable_roots: Sequence[Path] = (),
        shareable_roots: Sequence[Path] = (),
        trusted_roots: Sequence[Path] = (),
    ) -> PathGates:
        """The gates of a loaded config.

        Args:
            cfg: The config (its paths absolute, as :func:`kesoku.config.load_config` returns them).
            config_file: The file it was loaded from, denied to the tools.
            readable_roots: Readable folders besides ``workspace.readable_roots``.
            shareable_roots: Shareable folders besides ``workspace.shareable_roots``.
            trusted_roots: Folders readable without tainting, besides ``workspace.skills_dir`` (the
                bundled skills).

        Returns:
            Gates protecting the config file, ``workspace.db_path`` and ``gchat.credentials_file``;
            ``workspace.skills_dir`` is readable and trusted (skills name their files by absolute path).
        """
        protected = [Path(cfg.workspace.db_path)]
        if config_file is not None:
            protected.append(Path(config_file).absolute())
        if cfg.gchat.credentials_file:
            protected.append(Path(cfg.gchat.credentials_file))
        readable = (*map(Path, cfg.workspace.readable_roots), *readable_roots)
        shareable = (*map(Path, cfg.workspace.shareable_roots), *shareable_roots)
        trusted = (Path(cfg.workspace.skills_dir), *trusted_roots)
        return cls(tuple(readable), tuple(shareable), tuple(protected), trusted_roots=tuple(trusted))

    def home_dir(self) -> Path:
        """The home folder the secret rules are relative to."""
        return self.home if self.home is not None else Path(os.path.expanduser("~"))

    def protected_paths(self) -> list[Path]:
        """Kesoku's own files with their SQLite companions (``-wal``, ``-shm``, ``-journal``)."""
        return [f.with_name(f.name + suffix) for f in self.protected_files for suffix in _DB_SUFFIXES]


@dataclass(frozen=True, slots=True)
class NeedsApproval:
    """A write the user must approve first.

    Attributes:
        path: The resolved path that would be written.
        reason: Why it needs approval, for the question shown to the user.
    """

    path: Path
    reason: str


def _expand(path: str | os.PathLike[str], home: Path | None) -> str:
    text = os.fspath(path)
    if not text or "\x00" in text:
        raise ToolError(f"invalid path {text!r}: empty or with a NUL character")
    if home is not None and (text == "~" or text.startswith("~/")):
        return os.fspath(home) + text[1:]
    return os.path.expanduser(text)


def absolute(path: str | os.PathLike[str], base: Path, home: Path | None = None) -> Path:
    """``path`` with ``~`` expanded, made absolute against ``base`` and normalised (``..`` removed), unresolved.

    Args:
        path: The path as given.
        base: The folder a relative path is relative to.
        home: What ``~`` means; None: the current user's home.

    Raises:
        ToolError: The path is empty or holds a NUL character.
    """
    return Path(os.path.normpath(Path(base) / _expand(path, home)))


def resolve(path: str | os.PathLike[str], base: Path, home: Path | None = None) -> Path:
    """Resolve a path as the OS will: ``~``, relative to ``base``, symlinks and ``..``.

    Args:
        path: The path the model gave.
        base: The folder a relative path is relative to (the tool's working directory).
        home: What ``~`` means; None: the current user's home.

    Returns:
        The absolute real path (it need not exist: unresolvable tails are kept, like
        ``Path.resolve(strict=False)``).

    Raises:
        ToolError: The path is empty or holds a NUL character.
    """
    # realpath walks the components in order, so `link/..` leaves the link's target as the OS does.
    return Path(os.path.realpath(Path(base) / _expand(path, home)))


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _forms(path: Path) -> set[str]:
    """A path as written and as resolved, case-folded (a case-insensitive file system is one case)."""
    return {os.path.normpath(path).casefold(), os.path.realpath(path).casefold()}


def _secret_roots(gates: PathGates) -> list[tuple[str, str]]:
    """(folded root, label) of each secret location, both as written and resolved."""
    home = gates.home_dir()
    roots: list[tuple[str, str]] = []
    for rel in SECRET_HOME_PATHS:
        roots += [(form, f"~/{rel}") for form in _forms(home / rel)]
    for system in SECRET_SYSTEM_PATHS:
        roots += [(form, system) for form in _forms(Path(system))]
    return roots


def _protected_names(gates: PathGates) -> list[tuple[str, str]]:
    """(folded path, label) of each Kesoku file and its SQLite companions."""
    out: list[tuple[str, str]] = []
    for file in gates.protected_files:
        for suffix in _DB_SUFFIXES:
            companion = file.with_name(file.name + suffix)
            out += [(form, f"Kesoku's own file {file.name}{suffix}") for form in _forms(companion)]
    return out


def _is_env_file(name: str) -> bool:
    folded = name.casefold()
    return folded == ".env" or folded.startswith(".env.")


class SecretMatcher:
    """The secret rules of some gates, resolved once for many checks (a command line's words).

    Args:
        gates: Kesoku's own files and the home folder.
    """

    def __init__(self, gates: PathGates) -> None:
        self._gates = gates
        self._roots = _secret_roots(gates)
        self._protected = _protected_names(gates)
        self._inodes: set[tuple[int, int]] | None = None

    def hard_link(self, st: os.stat_result) -> bool:
        """Whether a file with this stat is a hard link to a secret file (the secret inodes are read once)."""
        if not stat.S_ISREG(st.st_mode) or st.st_nlink < 2:
            return False
        if self._inodes is None:
            self._inodes = _secret_inodes(self._gates)
        return (st.st_dev, st.st_ino) in self._inodes

    def reason(self, written: Path) -> str | None:
        """Why an absolute, normalised path (as written or resolved) is secret, or None."""
        real = Path(os.path.realpath(written))
        if _is_env_file(written.name) or _is_env_file(real.name):
            return ".env files hold secrets"
        for form in {os.fspath(written).casefold(), os.fspath(real).casefold()}:
            for root, label in self._roots:
                if _within(form, root):
                    return f"{label} is a secret location"
            for protected, label in self._protected:
                if form == protected:
                    return f"{label} holds Kesoku's configuration and credentials"
            if _PROC_SECRET.match(form):
                return "a process environment holds credentials"
        return None


def secret_reason(path: str | os.PathLike[str], base: Path, gates: PathGates) -> str | None:
    """Say why a path is secret, or None.

    Args:
        path: The path as given (relative to ``base``, or absolute, or with ``~``).
        base: The folder a relative path is relative to.
        gates: Kesoku's own files and the home folder.

    Returns:
        A short reason naming the rule (``"~/.ssh is a secret location"``), or None. Both the path as
        written and its resolved target are checked.

    Raises:
        ToolError: The path is empty or holds a NUL character.
    """
    return SecretMatcher(gates).reason(absolute(path, base, gates.home))


def _secret_inodes(gates: PathGates) -> set[tuple[int, int]]:
    """(device, inode) of the protected files and of the files in the secret locations (bounded)."""
    found: set[tuple[int, int]] = set()
    home = gates.home_dir()
    candidates = gates.protected_paths()
    walked = 0
    for top in [home / rel for rel in SECRET_HOME_PATHS] + [Path(p) for p in SECRET_SYSTEM_PATHS]:
        if top.is_dir():
            for folder, _dirs, files in os.walk(top):
                candidates += [Path(folder, f) for f in files]
                walked += len(files)
                if walked > _HARDLINK_SCAN_LIMIT:
                    break
        else:
            candidates.append(top)
    for candidate in candidates:
        try:
            st = candidate.stat()
        except OSError:
            continue
        found.add((st.st_dev, st.st_ino))
    return found


def _check_hardlink(st: os.stat_result, shown: Path, gates: PathGates) -> None:
    """Deny a regular file with several names when one of them is a secret file."""
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1 and (st.st_dev, st.st_ino) in _secret_inodes(gates):
        raise ToolError(f"access to {shown} is denied: it is a hard link to a secret file")


def workspaces(ctx: ToolContext) -> tuple[Path, ...]:
    """The resolved folders a tool may read and write freely: its working directory and the session workspace."""
    out: list[Path] = []
    for folder in (ctx.cwd, Path(ctx.session.workspace)):
        real = Path(os.path.realpath(folder))
        if real not in out:
            out.append(real)
    return tuple(out)


def _inside_any(path: Path, roots: Iterable[Path]) -> bool:
    text = os.fspath(path)
    return any(_within(text, os.path.realpath(root)) for root in roots)


def check_read(path: str | os.PathLike[str], ctx: ToolContext, gates: PathGates) -> Path:
    """Allow a read, or refuse it with a reason the model reads.

    Args:
        path: The path the model gave (relative to ``ctx.cwd``, absolute, or with ``~``).
        ctx: The call's context: its working directory and session workspace.
        gates: Readable roots and Kesoku's own files.

    Returns:
        The resolved path to read.

    Raises:
        ToolError: The path is secret, or outside the workspace and the readable roots.
    """
    real = resolve(path, ctx.cwd, gates.home)
    reason = secret_reason(path, ctx.cwd, gates)
    if reason is not None:
        raise ToolError(f"reading {path} is denied: {reason}")
    if not _inside_any(real, (*workspaces(ctx), *gates.trusted_roots, *gates.readable_roots)):
        raise ToolError(
            f"reading {real} is denied: it is outside the workspace ({ctx.cwd}) and the readable roots; "
            "copy what you need into the workspace or ask the user to add a readable root"
        )
    if real.exists():
        _check_hardlink(real.stat(), real, gates)
    if not _inside_any(real, (*workspaces(ctx), *gates.trusted_roots)):
        ctx.guard.add_taint("file", os.fspath(real))  # a readable root: outside the workspace's trust
    return real


def _approval_reason(real: Path, ctx: ToolContext) -> str | None:
    if not _inside_any(real, workspaces(ctx)):
        return f"{real} is outside the workspace"
    parts = real.parts
    for i, part in enumerate(parts[:-1]):
        if part == ".git" and (parts[i + 1] == "hooks" or (parts[i + 1] == "config" and i + 2 == len(parts))):
            return f"{real} can make git run commands"
    return None


def check_write(path: str | os.PathLike[str], ctx: ToolContext, gates: PathGates) -> Path | NeedsApproval:
    """Allow a write, ask for approval, or refuse it.

    Args:
        path: The path the model gave.
        ctx: The call's context.
        gates: Kesoku's own files and the home folder.

    Returns:
        The resolved path when the write is inside the workspace; a :class:`NeedsApproval` when it is
        outside, or into ``.git/hooks`` or ``.git/config``.

    Raises:
        ToolError: The path is secret (never writable, not even with approval).
    """
    real = resolve(path, ctx.cwd, gates.home)
    reason = secret_reason(path, ctx.cwd, gates)
    if reason is not None:
        raise ToolError(f"writing {path} is denied: {reason}")
    if real.exists():
        _check_hardlink(real.stat(), real, gates)
    approval = _approval_reason(real, ctx)
    return NeedsApproval(real, approval) if approval is not None else real


def require_write(
    path: str | os.PathLike[str], ctx: ToolContext, gates: PathGates, *, approved: Path | None = None
) -> Path:
    """Like :func:`check_write`, refusing what needs approval unless the user approved that very path.

    Args:
        path: The path the model gave.
        ctx: The call's context.
        gates: Kesoku's own files and the home folder.
        approved: The resolved path the user allowed (see :func:`kesoku.tools.files.approve_write`).

    Returns:
        The resolved path to write.

    Raises:
        ToolError: The path is secret, or the write needs approval and ``approved`` is not this path
            (the path resolved differently since the question: a symlink swapped in meanwhile).
    """
    decision = check_write(path, ctx, gates)
    if isinstance(decision, NeedsApproval):
        if approved is not None and decision.path == approved:
            return decision.path
        raise ToolError(
            f"writing {decision.path} needs the user's approval ({decision.reason}); the file was not written"
        )
    return decision


def _descriptor_path(fd: int) -> Path | None:
    """The path the kernel reports for an open descriptor (Linux ``/proc``); None where unknown."""
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    return Path(target) if target.startswith("/") and not target.endswith(" (deleted)") else None


def open_checked(real: Path, flags: int, ctx: ToolContext, gates: PathGates, *, write: bool) -> int:
    """Open an already checked path and check again what was opened.

    Between the check and the open, a concurrent command could swap a folder for a symlink. The final
    component is opened with ``O_NOFOLLOW``, and the path the kernel reports for the descriptor is
    put through the same gate before a byte is read or written.

    Args:
        real: A path returned by :func:`check_read` or :func:`require_write`.
        flags: ``os.open`` flags (do not pass ``O_TRUNC``: truncate after this returns).
        ctx: The call's context.
        gates: The gates the path was checked with.
        write: Check the descriptor as a write (else as a read).

    Returns:
        The open descriptor; the caller closes it.

    Raises:
        ToolError: The opened file is not the checked one, or is a symlink.
        OSError: The open failed.
    """
    try:
        fd = os.open(real, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP or os.path.islink(real):
            raise ToolError(f"{real} changed into a symlink while it was being opened; not opened") from None
        raise
    try:
        actual = _descriptor_path(fd)
        if actual is not None and actual != real:
            if write:
                require_write(actual, ctx, gates)
            else:
                check_read(actual, ctx, gates)
        _check_hardlink(os.fstat(fd), real, gates)
    except BaseException:
        os.close(fd)
        raise
    return fd


def shareable(
    path: str | os.PathLike[str],
    workspace: Path,
    roots: Sequence[Path] = (),
    *,
    gates: PathGates | None = None,
) -> bool:
    """Whether ``[file: /abs/path]`` may send this file.

    Args:
        path: The path from the message; it must be absolute.
        workspace: The session workspace.
        roots: The configured shareable roots.
        gates: Kesoku's own files and the home folder, for the secret rules.

    Returns:
        True for an existing regular file, not secret, whose resolved path is inside the session
        workspace or a shareable root.
    """
    text = os.fspath(path)
    if not text or "\x00" in text or not os.path.isabs(text):
        return False
    gates = gates if gates is not None else PathGates()
    if secret_reason(text, workspace, gates) is not None:
        return False
    real = resolve(text, workspace, gates.home)
    if not real.is_file() or not _inside_any(real, (workspace, *roots)):
        return False
    try:
        _check_hardlink(real.stat(), real, gates)
    except ToolError:
        return False
    return True


def safe_attachment_name(name: str, folder: Path) -> str:
    """A safe file name for an incoming attachment saved in ``folder``.

    Args:
        name: The name the sender gave.
        folder: Where it will be saved (only looked at for collisions).

    Returns:
        A single path component: separators and characters Windows forbids become ``_``, control and
        invisible formatting characters (bidi overrides) are removed, runs of dots become one, no
        leading dot or space, at most :data:`ATTACHMENT_NAME_MAX_CHARS` characters with the extension
        kept; ``attachment`` when nothing is left. A name already taken in ``folder`` becomes
        ``name (1).ext``, ``name (2).ext``, …. Create the file with ``open(..., "xb")``: a concurrent
        save may take the same name first.
    """
    text = unicodedata.normalize("NFC", name)
    text = "".join(c for c in text if not unicodedata.category(c).startswith("C"))
    text = re.sub(r'[/\\<>:"|?*]', "_", text)
    text = re.sub(r"\.{2,}", ".", text)
    text = text.strip(" .")
    stem, dot, ext = text.rpartition(".")
    if not dot or not stem or len(ext) > 16 or " " in ext:
        stem, ext = text, ""
    if stem.split(".")[0].casefold() in _RESERVED_WINDOWS:
        stem = "_" + stem
    suffix = f".{ext}" if ext else ""
    stem = stem[: ATTACHMENT_NAME_MAX_CHARS - len(suffix)].rstrip(" .") or "attachment"
    candidate = stem + suffix
    for n in itertools.count(1):
        if not os.path.lexists(folder / candidate):
            return candidate
        mark = f" ({n})"
        candidate = stem[: ATTACHMENT_NAME_MAX_CHARS - len(suffix) - len(mark)] + mark + suffix
    raise AssertionError("unreachable")  # pragma: no cover


SAVE_TRIES = 100
"""Names tried by :func:`save_attachment` before it gives up (each collision renames)."""


def save_attachment(folder: Path, filename: str, data: bytes) -> Path:
    """Write a received file under a safe, unused name in ``folder`` (blocking: a worker thread's job).

    Args:
        folder: The session workspace (created when missing).
        filename: The name the user gave; made safe by :func:`safe_attachment_name`.
        data: The file's bytes.

    Returns:
        The path written.

    Raises:
        OSError: The folder cannot be written, or no free name was found.
    """
    folder.mkdir(parents=True, exist_ok=True)
    for _ in range(SAVE_TRIES):
        path = folder / safe_attachment_name(filename, folder)
        try:
            # "xb": a save racing this one for the same name never overwrites it; the next try renames.
            with open(path, "xb") as out:
                out.write(data)
            return path
        except FileExistsError:
            continue
    raise OSError(f"no free name for {filename!r} in {folder}")


__all__ = [
    "SECRET_HOME_PATHS",
    "SECRET_SYSTEM_PATHS",
    "NeedsApproval",
    "PathGates",
    "SecretMatcher",
    "absolute",
    "check_read",
    "check_write",
    "open_checked",
    "require_write",
    "resolve",
    "safe_attachment_name",
    "save_attachment",
    "secret_reason",
    "shareable",
    "workspaces",
]
