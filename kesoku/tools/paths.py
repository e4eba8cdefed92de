"""Path gates: which files a tool may read, write or share (ARCHITECTURE.md, "Guarantees").

Every check runs on the path as the OS will see it: ``~`` expanded, made absolute against the tool's
working directory, then resolved (symlinks and ``..``) with :func:`os.path.realpath`. A link inside
the workspace that points outside is judged by its target. The rules:

- Secret paths are denied to every tool, read or write, even inside the workspace: ``~/.ssh``,
  ``~/.aws``, ``~/.config/gcloud``, ``~/.gnupg`` and other credential stores
  (:data:`SECRET_HOME_PATHS`), ``.env`` and ``.env.*`` files anywhere, the Kesoku config file, its
  database (``-wal``, ``-shm`` and ``-journal`` too) and credentials files (:class:`PathGates`),
  ``/proc/*/environ``. A secret is matched on the path as written and as resolved, and a hard link
  to a secret file is caught by its inode.
- Reads pass inside the workspace (the tool's working directory and the session workspace) and the
  configured readable roots; other reads are denied.
- Writes pass inside the workspace. A write elsewhere, or into ``.git/hooks`` and ``.git/config``
  (which make an allowed ``git`` run code), needs the user's approval: :func:`check_write` returns
  :class:`NeedsApproval`. Asking the user goes through the adapters (a ``[question: …]``), which do
  not exist yet, so for now :func:`require_write` refuses such a write with a :class:`ToolError`.

A path that cannot name a file (empty, a NUL, a lone surrogate, over :data:`PATH_MAX_BYTES` or
with a name over :data:`NAME_MAX_BYTES`, a symlink loop) is refused with a reason, never an
``OSError`` or a ``ValueError``: :class:`PathProblem` for the tools, a reason string from
:func:`check_share` and :func:`protected_reason`.

These functions touch the file system (realpath, stat): in async code call them through
``trio.to_thread``. :func:`open_checked` closes the gap between check and use: it opens without
following a final symlink and re-checks the path the kernel reports for the open descriptor.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kesoku.tools.base import ToolContext
from kesoku.vocab.errors import ToolError

if TYPE_CHECKING:
    from kesoku.config.settings import Config

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
_DB_SUFFIXES = ("", "-wal", "-shm", "-journal", ".sock", "-wake")
"""A Kesoku file and its companions: SQLite's, the daemon's control socket (a tool attached to
it could answer its own questions) and the wake-up pipes' folder."""
_HARDLINK_SCAN_LIMIT = 5000
"""Files looked at when matching a hard link against the secret folders' files."""

NAME_MAX_BYTES = 255
"""The longest file name (one path component) in bytes: Linux's ``NAME_MAX`` on ext4, XFS, btrfs."""
PATH_MAX_BYTES = 4095
"""The longest path in bytes the kernel takes (Linux ``PATH_MAX`` is 4096 with the final NUL)."""
BRIEF_CHARS = 80
"""Characters of a path quoted in a refusal (a 4,000-byte path is not repeated whole)."""


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
            cfg: The config (its paths absolute, as :func:`kesoku.config.settings.load_config`
                returns them).
            config_file: The file it was loaded from, denied to the tools.
            readable_roots: Readable folders besides ``workspace.readable_roots``.
            shareable_roots: Shareable folders besides ``workspace.shareable_roots``.
            trusted_roots: Folders readable without tainting, besides ``workspace.skills_dir`` (the
                bundled skills).

        Returns:
            Gates protecting the config file, ``workspace.db_path`` and ``gchat.credentials_file``;
            ``workspace.skills_dir`` is readable and trusted (skills name their files by absolute
            path).
        """
        protected = [Path(cfg.workspace.db_path)]
        if config_file is not None:
            protected.append(Path(config_file).absolute())
        if cfg.gchat.credentials_file:
            protected.append(Path(cfg.gchat.credentials_file))
        readable = (*map(Path, cfg.workspace.readable_roots), *readable_roots)
        shareable = (*map(Path, cfg.workspace.shareable_roots), *shareable_roots)
        trusted = (Path(cfg.workspace.skills_dir), *trusted_roots)
        return cls(
            tuple(readable), tuple(shareable), tuple(protected), trusted_roots=tuple(trusted)
        )

    def home_dir(self) -> Path:
        """The home folder the secret rules are relative to."""
        return self.home if self.home is not None else Path(os.path.expanduser("~"))

    def protected_paths(self) -> list[Path]:
        """Kesoku's own files with their SQLite companions (``-wal``, ``-shm``, ``-journal``)."""
        return [
            f.with_name(f.name + suffix) for f in self.protected_files for suffix in _DB_SUFFIXES
        ]


@dataclass(frozen=True, slots=True)
class NeedsApproval:
    """A write the user must approve first.

    Attributes:
        path: The resolved path that would be written.
        reason: Why it needs approval, for the question shown to the user.
    """

    path: Path
    reason: str


class PathProblem(ToolError):
    """A path that cannot name a file here; :attr:`reason` says why, for a one-line refusal.

    Attributes:
        reason: ``"it holds a NUL character"``, ``"it is a symlink loop"``, … (no path in it).
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"invalid path {brief(path)!r}: {reason}")
        self.reason = reason


def brief(text: str, max_chars: int = BRIEF_CHARS) -> str:
    """A path or name cut to ``max_chars`` characters (``…`` marks the cut), to quote it."""
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


def path_problem(text: str) -> str | None:
    """Why ``text`` cannot name a file, judged on the text alone (no file-system access).

    Returns:
        None for a usable path; else the reason: empty, a NUL character, a lone surrogate (not
        encodable for the OS), longer than :data:`PATH_MAX_BYTES` or with a component longer than
        :data:`NAME_MAX_BYTES`.
    """
    if not text:
        return "it is empty"
    if "\x00" in text:
        return "it holds a NUL character"
    try:
        raw = os.fsencode(text)
    except UnicodeEncodeError as exc:
        return f"it is not valid text (a lone surrogate at character {exc.start + 1})"
    if len(raw) > PATH_MAX_BYTES:
        return f"it is too long ({len(raw):,} bytes; at most {PATH_MAX_BYTES:,})"
    longest = max(len(part) for part in raw.split(b"/"))
    if longest > NAME_MAX_BYTES:
        return f"a name in it is too long ({longest:,} bytes; at most {NAME_MAX_BYTES})"
    return None


def os_problem(exc: OSError) -> str:
    """An ``OSError`` met while looking at a path, as a refusal reason (no path in it)."""
    if exc.errno == errno.ELOOP:
        return "it is a symlink loop (too many levels of symbolic links)"
    if exc.errno == errno.ENAMETOOLONG:
        return "it is too long for the file system"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    return exc.strerror or f"{type(exc).__name__}: {exc}"


def _expand(path: str | os.PathLike[str], home: Path | None) -> str:
    text = os.fspath(path)
    problem = path_problem(text)
    if problem is not None:
        raise PathProblem(text, problem)
    if home is not None and (text == "~" or text.startswith("~/")):
        return os.fspath(home) + text[1:]
    return os.path.expanduser(text)


def absolute(path: str | os.PathLike[str], base: Path, home: Path | None = None) -> Path:
    """``path`` with ``~`` expanded, made absolute against ``base`` and normalised.

    ``..`` is removed; the path is not resolved.

    Args:
        path: The path as given.
        base: The folder a relative path is relative to.
        home: What ``~`` means; None: the current user's home.

    Raises:
        PathProblem: The path cannot name a file (see :func:`path_problem`).
    """
    return Path(os.path.normpath(Path(base) / _expand(path, home)))


def _resolved(
    path: str | os.PathLike[str], base: Path, home: Path | None
) -> tuple[Path, os.stat_result | None]:
    """The real path and its stat (None: nothing there); one the OS cannot look at: PathProblem."""
    text = os.fspath(path)
    joined = Path(base) / _expand(text, home)
    # realpath walks the components in order, so `link/..` leaves the link's target as the OS does.
    real = Path(os.path.realpath(joined))
    try:
        # realpath leaves a symlink loop unresolved: stat is what finds it (ELOOP).
        return real, os.stat(real)
    except (FileNotFoundError, NotADirectoryError):
        return real, None
    except OSError as exc:
        raise PathProblem(text, os_problem(exc)) from None


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
        PathProblem: The path cannot name a file, or the OS cannot look at it (a symlink loop, a
            result too long, a folder on the way that may not be searched).
    """
    return _resolved(path, base, home)[0]


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _forms(path: Path) -> set[str]:
    """A path as written and as resolved, case-folded.

    A case-insensitive file system is one case.
    """
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
        """Whether a file with this stat is a hard link to a secret file.

        The secret inodes are read once.
        """
        if not stat.S_ISREG(st.st_mode) or st.st_nlink < 2:
            return False
        if self._inodes is None:
            self._inodes = _secret_inodes(self._gates)
        return (st.st_dev, st.st_ino) in self._inodes

    def reason(self, written: Path) -> str | None:
        """Why an absolute, normalised path (as written or resolved) is secret, or None.

        A path the OS could not take (a NUL, a lone surrogate) is refused here too: what cannot be
        resolved cannot be shown not to be a secret.
        """
        problem = path_problem(os.fspath(written))
        if problem is not None:
            return problem
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
        A short reason naming the rule (``"~/.ssh is a secret location"``), or None. Both the path
        as written and its resolved target are checked.

    Raises:
        PathProblem: The path cannot name a file (see :func:`path_problem`).
    """
    return SecretMatcher(gates).reason(absolute(path, base, gates.home))


def protected_reason(path: str | os.PathLike[str], base: Path, gates: PathGates) -> str | None:
    """Why Kesoku must not write (or send) this path itself, or None; never raises.

    For Kesoku's own writes outside the tools (``kesoku trace -o``, ``kesoku sessions export
    -o``): the secret rules of :func:`secret_reason` (the config, the database, credentials), and
    any path the OS cannot look at, with its reason.

    Args:
        path: The path as given.
        base: The folder a relative path is relative to.
        gates: Kesoku's own files and the home folder.
    """
    try:
        reason = secret_reason(path, base, gates)
        if reason is None:
            _resolved(path, base, gates.home)
    except PathProblem as exc:
        return exc.reason
    return reason


def _secret_inodes(gates: PathGates) -> set[tuple[int, int]]:
    """(device, inode) of the protected files and of the files in the secret locations (bounded)."""
    found: set[tuple[int, int]] = set()
    home = gates.home_dir()
    candidates = gates.protected_paths()
    walked = 0
    for top in [home / rel for rel in SECRET_HOME_PATHS] + [Path(p) for p in SECRET_SYSTEM_PATHS]:
        if os.path.isdir(top):
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
    if (
        stat.S_ISREG(st.st_mode)
        and st.st_nlink > 1
        and (st.st_dev, st.st_ino) in _secret_inodes(gates)
    ):
        raise ToolError(f"access to {shown} is denied: it is a hard link to a secret file")


def workspaces(ctx: ToolContext) -> tuple[Path, ...]:
    """The resolved folders a tool may read and write freely.

    They are its working directory and the session workspace.
    """
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
        PathProblem: The path cannot name a file, or the OS cannot look at it.
    """
    reason = secret_reason(path, ctx.cwd, gates)
    if reason is not None:
        raise ToolError(f"reading {path} is denied: {reason}")
    real, st = _resolved(path, ctx.cwd, gates.home)
    if not _inside_any(real, (*workspaces(ctx), *gates.trusted_roots, *gates.readable_roots)):
        raise ToolError(
            f"reading {real} is denied: "
            f"it is outside the workspace ({ctx.cwd}) and the readable roots; "
            "copy what you need into the workspace or ask the user to add a readable root"
        )
    if st is not None:
        _check_hardlink(st, real, gates)
    if not _inside_any(real, (*workspaces(ctx), *gates.trusted_roots)):
        # a readable root: outside the workspace's trust
        ctx.guard.add_taint("file", os.fspath(real))
    return real


def _approval_reason(real: Path, ctx: ToolContext) -> str | None:
    if not _inside_any(real, workspaces(ctx)):
        return f"{real} is outside the workspace"
    parts = real.parts
    for i, part in enumerate(parts[:-1]):
        if part == ".git" and (
            parts[i + 1] == "hooks" or (parts[i + 1] == "config" and i + 2 == len(parts))
        ):
            return f"{real} can make git run commands"
    return None


def check_write(
    path: str | os.PathLike[str], ctx: ToolContext, gates: PathGates
) -> Path | NeedsApproval:
    """Allow a write, ask for approval, or refuse it.

    Args:
        path: The path the model gave.
        ctx: The call's context.
        gates: Kesoku's own files and the home folder.

    Returns:
        The resolved path when the write is inside the workspace; a :class:`NeedsApproval` when it
        is outside, or into ``.git/hooks`` or ``.git/config``.

    Raises:
        ToolError: The path is secret (never writable, not even with approval).
        PathProblem: The path cannot name a file, or the OS cannot look at it.
    """
    reason = secret_reason(path, ctx.cwd, gates)
    if reason is not None:
        raise ToolError(f"writing {path} is denied: {reason}")
    real, st = _resolved(path, ctx.cwd, gates.home)
    if st is not None:
        _check_hardlink(st, real, gates)
    approval = _approval_reason(real, ctx)
    return NeedsApproval(real, approval) if approval is not None else real


def require_write(
    path: str | os.PathLike[str],
    ctx: ToolContext,
    gates: PathGates,
    *,
    approved: Path | None = None,
) -> Path:
    """Like :func:`check_write`, refusing what needs approval unless the user approved it.

    The approval holds only for that very path.

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
            f"writing {decision.path} needs the user's approval ({decision.reason}); "
            "the file was not written"
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

    Between the check and the open, a concurrent command could swap a folder for a symlink. The
    final component is opened with ``O_NOFOLLOW``, and the path the kernel reports for the
    descriptor is put through the same gate before a byte is read or written.

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
            raise ToolError(
                f"{real} changed into a symlink while it was being opened; not opened"
            ) from None
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


def check_share(path: str | os.PathLike[str], workspace: Path, gates: PathGates) -> Path | str:
    """Whether ``[file: /abs/path]`` may send this file; never raises.

    The order of the rules keeps a refusal from revealing more than it must: a secret is refused as
    secret whether it exists or not, and a path outside the shared folders is refused as outside
    before anything about it is looked at.

    Args:
        path: The path from the message; it must be absolute.
        workspace: The session workspace.
        gates: The shareable roots, Kesoku's own files and the home folder.

    Returns:
        The resolved path of an existing regular file, not secret, inside the session workspace or a
        shareable root; else the reason it is refused, a phrase to follow "I can't share `x`: "
        (``"it is outside the session folder and the shared folders"``).
    """
    text = os.fspath(path)
    problem = path_problem(text)
    if problem is not None:
        return problem
    if not os.path.isabs(text):
        return "the path must be absolute"
    try:
        reason = secret_reason(text, workspace, gates)
        if reason is not None:
            return reason
        real = resolve(text, workspace, gates.home)
        if not _inside_any(real, (workspace, *gates.shareable_roots)):
            return "it is outside the session folder and the shared folders"
        st = os.stat(real)
    except PathProblem as exc:
        return exc.reason
    except (FileNotFoundError, NotADirectoryError):
        return "it does not exist"
    except OSError as exc:
        return os_problem(exc)
    if not stat.S_ISREG(st.st_mode):
        return "it is not a regular file"
    try:
        _check_hardlink(st, real, gates)
    except ToolError:
        return "it is a hard link to a secret file"
    return real


def read_shared(real: Path, max_bytes: int) -> bytes | int:
    """Read a file :func:`check_share` allowed, unless it is larger than ``max_bytes`` (blocking).

    The final component is opened without following a symlink and the descriptor must still be a
    regular file, so a file swapped after the check is not sent.

    Args:
        real: The resolved path :func:`check_share` returned.
        max_bytes: The largest file to read.

    Returns:
        The file's bytes, or its size in bytes when that is over ``max_bytes`` (nothing is read).

    Raises:
        OSError: The file cannot be opened or read (use :func:`os_problem` for the reason), or is no
            longer a regular file.
    """
    fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as file:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "it is no longer a regular file")
        if st.st_size > max_bytes:
            return st.st_size
        return file.read(max_bytes)


__all__ = [
    "NAME_MAX_BYTES",
    "PATH_MAX_BYTES",
    "SECRET_HOME_PATHS",
    "SECRET_SYSTEM_PATHS",
    "NeedsApproval",
    "PathGates",
    "PathProblem",
    "SecretMatcher",
    "absolute",
    "brief",
    "check_read",
    "check_share",
    "check_write",
    "open_checked",
    "os_problem",
    "path_problem",
    "protected_reason",
    "read_shared",
    "require_write",
    "resolve",
    "secret_reason",
    "workspaces",
]
