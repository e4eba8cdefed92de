"""The OS sandbox around every process a tool starts: bubblewrap, else Landlock.

The sandbox, not the shell policy, decides what a tool's processes may touch (ARCHITECTURE.md,
"Sandbox"). Inside it:

- the whole file system is read-only but for the call's writable folders (the session workspace,
  ``[agent] project_dir``, run_code's scratch folder), and ``/tmp`` is private (Kesoku's own
  installation, the skills folders and the readable roots stay readable if they lie there);
- secret places are not visible: the credential stores
  (:data:`~kesoku.tools.paths.SECRET_HOME_PATHS`, :data:`~kesoku.tools.paths.SECRET_SYSTEM_PATHS`),
  Kesoku's own files (config, database and its
  ``-wal``/``-shm``/``-journal``, credentials files), ``.env*`` files in the writable folders and
  the readable roots (and at the top of the home folder, of the folders of Kesoku's files and of its
  installation), and the sessions folder except the session's own workspace;
- there is no network unless ``[sandbox] network = true``;
- the environment is an allowlist (:data:`BASE_ENV`, ``LC_*``, ``[sandbox] env``): never the
  daemon's keys and tokens;
- the processes die with the call, and with Kesoku (a ``kill -9`` included).

bubblewrap (``bwrap``) builds this from mounts in new user, mount, pid, network, IPC and UTS
namespaces, with every capability dropped; its ``--die-with-parent`` kills the pid namespace when
Kesoku dies. Landlock (Linux 5.13+) is the fallback where ``bwrap`` is missing or cannot make
namespaces: :mod:`kesoku.tools.landlock_exec` applies the rules in a launcher process, then runs the
command in its process group and kills that group when Kesoku dies. What Landlock cannot do:
hide ``.env`` files inside a writable folder, refuse UDP before ABI 8, refuse connecting to a named
Unix socket, keep a process that leaves the group (``setsid``) from outliving Kesoku.

Both parent-death mechanisms fire when the *thread* that started the process ends, and trio starts
processes from worker threads that end after 10 s idle: :func:`kesoku.tools.shell.run_command`
therefore starts tool processes on the event loop's thread. MCP servers are started by the mcp SDK
from such a worker thread, so their sandbox has no parent-death kill; they end when their standard
input closes.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import trio

from kesoku.tools.paths import SECRET_HOME_PATHS, SECRET_SYSTEM_PATHS, PathGates
from kesoku.vocab.errors import OperatorError, ToolError

if TYPE_CHECKING:
    from kesoku.config.settings import Config, SandboxConfig
    from kesoku.tools.base import ToolContext

Mechanism = Literal["bwrap", "landlock", "off"]

BASE_ENV = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "TERM",
    "TZ",
    "NO_COLOR",
)
"""Variables every tool process gets from Kesoku's environment (with ``LC_*``)."""
PRIVATE_ROOTS = ("/tmp", "/var/tmp", "/run", "/dev/shm")
"""Shared scratch and runtime folders (other programs' files and sockets): a sandbox has its own."""
ENV_SCAN_ENTRIES = 5000
"""Folder entries looked at per root when looking for ``.env`` files (the walk stops there)."""
PROBE_TIMEOUT_S = 10.0
LANDLOCK_READ = 1 | 4 | 8
"""Landlock rights to execute, read files, list folders (``LANDLOCK_ACCESS_FS_*``, Linux uapi)."""
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")
_SKIP_DIRS = frozenset(
    {".git", "node_modules", ".venv", "venv", "__pycache__", ".tox", ".mypy_cache"}
)


@dataclass(frozen=True, slots=True)
class Probe:
    """Which mechanism works on this machine.

    Attributes:
        mechanism: ``bwrap``, ``landlock``, ``off`` (``[sandbox] mode = "off"``), or None when the
            mode asks for a sandbox and none works.
        detail: One line: what runs (``bubblewrap 0.8.0``), or why nothing does.
    """

    mechanism: Mechanism | None
    detail: str


@dataclass(frozen=True, slots=True)
class Launch:
    """A command ready to start: the argv to execute and its environment."""

    argv: list[str]
    env: dict[str, str]


def environment(
    names: Iterable[str] = (), environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of a tool process: :data:`BASE_ENV`, ``LC_*`` and ``names``, where set.

    Args:
        names: More variables to pass (``[sandbox] env``).
        environ: Where the values come from; None: ``os.environ``.
    """
    source = os.environ if environ is None else environ
    wanted = {*BASE_ENV, *names}
    return {k: v for k, v in source.items() if k in wanted or k.startswith("LC_")}


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _depth(path: str) -> int:
    return 0 if path == "/" else path.count("/")


def _env_files(root: Path, *, recursive: bool) -> list[str]:
    """``.env`` and ``.env.*`` files under ``root`` (bounded: :data:`ENV_SCAN_ENTRIES` entries)."""
    found: list[str] = []
    seen = 0
    stack = [os.fspath(root)]
    while stack and seen < ENV_SCAN_ENTRIES:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            name = entry.name.casefold()
            if name == ".env" or name.startswith(".env."):
                found.append(entry.path)
            elif recursive and name not in _SKIP_DIRS and entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
    return found


class Sandbox:
    """How tool processes are confined, from ``[sandbox]`` and the path gates' protected set.

    Args:
        config: ``[sandbox]``: ``mode``, ``network``, ``env``.
        gates: The home folder, Kesoku's own files and the readable roots (see
            :class:`~kesoku.tools.paths.PathGates`).
        sessions_dir: The folder of all session workspaces, hidden but for the session's own.
        ask_unsandboxed: Where no sandbox works: ask the user once per session before a tool runs
            unsandboxed (the terminal); False: refuse (a chat adapter's sessions).
        bwrap: The bubblewrap program; None: ``bwrap`` on ``PATH``.
        private_roots: The shared folders replaced by empty ones (:data:`PRIVATE_ROOTS`).
    """

    def __init__(
        self,
        config: SandboxConfig,
        gates: PathGates | None = None,
        *,
        sessions_dir: str | os.PathLike[str] | None = None,
        ask_unsandboxed: bool = False,
        bwrap: str | None = None,
        private_roots: Sequence[str] = PRIVATE_ROOTS,
    ) -> None:
        self.config = config
        self.gates = gates if gates is not None else PathGates()
        self.sessions_dir = (
            Path(os.path.realpath(sessions_dir)) if sessions_dir is not None else None
        )
        self.ask_unsandboxed = ask_unsandboxed
        self.bwrap = bwrap if bwrap is not None else shutil.which("bwrap")
        self.private_roots = tuple(private_roots)
        self._probe: Probe | None = None
        self._lock = threading.Lock()
        self._allowed_unsandboxed: set[str] = set()

    @classmethod
    def from_config(
        cls, config: Config, gates: PathGates, *, ask_unsandboxed: bool = False
    ) -> Sandbox:
        """The sandbox of a loaded config, hiding ``workspace.sessions_dir``."""
        return cls(
            config.sandbox,
            gates,
            sessions_dir=config.workspace.sessions_dir,
            ask_unsandboxed=ask_unsandboxed,
        )

    # -- which mechanism --------------------------------------------------------------------------

    def probe(self) -> Probe:
        """Find the mechanism that works (blocking, ~10 ms once; then cached).

        ``auto`` tries bubblewrap, then Landlock; ``bwrap`` and ``landlock`` try only that one.
        """
        with self._lock:
            if self._probe is None:
                self._probe = self._find()
            return self._probe

    def _find(self) -> Probe:
        mode = self.config.mode
        if mode == "off":
            return Probe("off", 'off ([sandbox] mode = "off"): tools run with Kesoku\'s own access')
        tried: list[str] = []
        if mode in ("auto", "bwrap"):
            found = self._probe_bwrap()
            if found.mechanism is not None:
                return found
            tried.append(found.detail)
        if mode in ("auto", "landlock"):
            found = _probe_landlock()
            if found.mechanism is not None:
                return found
            tried.append(found.detail)
        return Probe(None, "; ".join(tried))

    def _probe_bwrap(self) -> Probe:
        if self.bwrap is None or shutil.which(self.bwrap) is None:
            return Probe(None, "bubblewrap is not installed (Debian: apt install bubblewrap)")
        argv = [*self._bwrap_base(network=False, die_with_parent=True), "--", "true"]
        try:
            done = subprocess.run(argv, capture_output=True, timeout=PROBE_TIMEOUT_S, check=False)
            version = subprocess.run(
                [self.bwrap, "--version"],
                capture_output=True,
                text=True,
                timeout=PROBE_TIMEOUT_S,
                check=False,
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Probe(None, f"bubblewrap cannot run: {exc}")
        if done.returncode != 0:
            error = done.stderr.decode("utf-8", "replace").strip().splitlines()
            return Probe(
                None,
                f"bubblewrap cannot make its namespaces: {error[-1] if error else done.returncode}",
            )
        return Probe("bwrap", version or "bubblewrap")

    def describe(self) -> str:
        """One line for ``kesoku start``: the mechanism and what it allows."""
        probe = self.probe()
        net = "network on" if self.config.network else "no network"
        if probe.mechanism in ("bwrap", "landlock"):
            return f"sandbox: {probe.detail}; tools write only their workspace, {net}"
        if probe.mechanism == "off":
            return f"sandbox {probe.detail}"
        return f"sandbox: none works here ({probe.detail})"

    # -- one command ------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def launch(
        self, argv: Sequence[str], ctx: ToolContext, *, writable: Sequence[Path], shown: str
    ) -> AsyncIterator[Launch]:
        """Prepare a tool's command to run confined (probe and file system reads in a thread).

        Args:
            argv: The command.
            ctx: The call (its session, working directory, and the user to ask).
            writable: Folders the command may write (the working directory among them).
            shown: The command as the user reads it, for a question.

        Yields:
            The argv to execute (the command wrapped in bwrap or the Landlock launcher) and its
            environment. A Landlock call's private temporary folder is removed on exit.

        Raises:
            ToolError: No sandbox works and the session's user did not allow running unsandboxed (a
                chat adapter's session is never asked).

        Cancellation:
            A question is withdrawn; a private temporary folder is removed (shielded, bounded).
        """
        probe = await trio.to_thread.run_sync(self.probe)
        env = environment(self.config.env)
        if probe.mechanism is None:
            await self._allow_unsandboxed(probe, ctx, shown)
        if probe.mechanism in (None, "off"):
            yield Launch(list(argv), env)
            return
        # The wrapper would report a missing program as its own failure: say it as run_command does.
        if not await trio.to_thread.run_sync(_runnable, argv[0], ctx.cwd, env.get("PATH")):
            raise ToolError(f"cannot start {argv[0]!r} in {os.fspath(ctx.cwd)}: no such program")
        folders = await trio.to_thread.run_sync(
            lambda: [Path(os.path.realpath(f)) for f in writable]
        )
        if probe.mechanism == "bwrap":
            wrapped = await trio.to_thread.run_sync(
                functools.partial(self.bwrap_argv, argv, writable=folders, cwd=ctx.cwd)
            )
            yield Launch(wrapped, env)
            return
        scratch = Path(
            await trio.to_thread.run_sync(functools.partial(tempfile.mkdtemp, prefix="kesoku-tmp-"))
        )
        try:
            env.update(TMPDIR=os.fspath(scratch), TMP=os.fspath(scratch), TEMP=os.fspath(scratch))
            wrapped = await trio.to_thread.run_sync(
                functools.partial(self.landlock_argv, argv, writable=[*folders, scratch])
            )
            yield Launch(wrapped, env)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(PROBE_TIMEOUT_S):
                await trio.to_thread.run_sync(shutil.rmtree, scratch, True)

    async def _allow_unsandboxed(self, probe: Probe, ctx: ToolContext, shown: str) -> None:
        session = ctx.session.id
        if session in self._allowed_unsandboxed:
            return
        if not self.ask_unsandboxed:
            raise ToolError(
                f"not run: no OS sandbox works on this machine ({probe.detail}), and chat "
                "sessions run tools only inside one; the operator can install bubblewrap or set "
                '[sandbox] mode = "off"'
            )
        approval = await ctx.confirm(
            f"No OS sandbox works on this machine ({probe.detail}). `{shown}` and the tool calls "
            "after it in this session would run with your own access to every file and the "
            "network. Allow?"
        )
        if not approval.allowed:
            raise ToolError(
                "not run: it would run without an OS sandbox, which was not allowed "
                f"({approval.note})"
            )
        self._allowed_unsandboxed.add(session)

    def server_command(self, command: str, args: Sequence[str], cwd: str | None) -> list[str]:
        """An MCP server's command line in the sandbox (blocking: probes and reads the file system).

        The server may write only its ``cwd`` (when set) and a private ``/tmp``; it gets no
        parent-death kill (see the module docstring) and ends when its standard input closes.

        Raises:
            OperatorError: No sandbox works here, or ``[sandbox] mode = "off"``.
        """
        probe = self.probe()
        if probe.mechanism in (None, "off"):
            raise OperatorError(f"sandbox = true, but there is no OS sandbox: {probe.detail}")
        writable = [Path(os.path.realpath(cwd))] if cwd else []
        if probe.mechanism == "bwrap":
            return self.bwrap_argv(
                [command, *args], writable=writable, cwd=Path(cwd or "/"), die_with_parent=False
            )
        return self.landlock_argv([command, *args], writable=writable, die_with_parent=False)

    # -- what is hidden ---------------------------------------------------------------------------

    def _emptied(self) -> list[str]:
        """The folders replaced by empty ones: the private roots and the sessions folder."""
        roots = [p for p in self.private_roots if os.path.isdir(p)]
        if self.sessions_dir is not None and self.sessions_dir.is_dir():
            roots.append(os.fspath(self.sessions_dir))
        return roots

    def readable(self) -> list[str]:
        """Folders a tool must still read when they lie in an emptied root (``/tmp``, say).

        Kesoku's own installation (the interpreter's prefixes, and the folder holding the
        ``kesoku`` package: site-packages, or the source tree of an editable install), the
        skills folders and the readable roots; resolved. Secrets inside them are hidden as
        anywhere else.
        """
        here = Path(__file__).resolve().parents[2]  # kesoku/tools/sandbox.py -> its install root
        found = {sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))}
        found |= {os.fspath(here), *map(os.fspath, self.gates.trusted_roots)}
        found |= set(map(os.fspath, self.gates.readable_roots))
        return sorted(os.path.realpath(p) for p in found if os.path.isdir(p))

    def hidden(self, writable: Sequence[Path]) -> tuple[list[str], list[str]]:
        """The secret folders and files that exist now (resolved), for one command.

        Returns:
            ``(folders, files)``; the sessions folder is not among them (it is hidden whole, but for
            the workspace, by the mechanisms themselves).
        """
        gates = self.gates
        home = gates.home_dir()
        candidates = [home / rel for rel in SECRET_HOME_PATHS]
        candidates += [Path(p) for p in SECRET_SYSTEM_PATHS]
        candidates += gates.protected_paths()
        env_files: list[str] = []
        for root in (*writable, *gates.readable_roots):
            env_files += _env_files(root, recursive=True)
        for root in {home, *(f.parent for f in gates.protected_files), *map(Path, self.readable())}:
            env_files += _env_files(root, recursive=False)
        folders: set[str] = set()
        files: set[str] = set()
        for path in (*map(os.fspath, candidates), *env_files):
            real = os.path.realpath(path)
            if os.path.isdir(real):
                folders.add(real)
            elif os.path.lexists(real):
                files.add(real)
        return sorted(folders), sorted(files)

    # -- bubblewrap -------------------------------------------------------------------------

    def _bwrap_base(self, *, network: bool, die_with_parent: bool) -> list[str]:
        assert self.bwrap is not None
        argv = [self.bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        # as root, bwrap would otherwise keep every capability
        argv += [
            "--unshare-all",
            "--cap-drop",
            "ALL",
        ]
        if network:
            argv.append("--share-net")
        if die_with_parent:
            argv.append("--die-with-parent")
        return argv

    def bwrap_argv(
        self,
        argv: Sequence[str],
        *,
        writable: Sequence[Path],
        cwd: Path,
        die_with_parent: bool = True,
    ) -> list[str]:
        """The bubblewrap command line that runs ``argv`` confined (blocking: reads files).

        Mounts, in order of depth so that a mask lands over the folder that holds it: the root
        read-only; fresh tmpfs over the private roots, the sessions folder and each secret
        folder; :meth:`readable` folders inside those bound back read-only; each writable folder
        bound read-write; ``/dev/null`` over each secret file. A secret path that the mounts
        already hide is left alone.
        """
        network = self.config.network
        binds = [os.fspath(w) for w in writable if os.path.isdir(w)]
        folders, files = self.hidden(writable)
        roots = self._emptied()
        # Kesoku's own installation and the folders tools read stay visible inside an emptied root.
        shown = [r for r in self.readable() if not _visible(r, roots, binds)]
        resolver = "/run/systemd/resolve"  # /etc/resolv.conf may point into /run, emptied above
        if network and os.path.isdir(resolver):
            shown.append(resolver)
        # A secret inside a root made empty is gone already; one inside a writable folder is not.
        seen = [*shown, *binds]
        secret = [f for f in folders if _visible(f, roots, seen)]
        masks = [f for f in files if _visible(f, roots, seen)]
        mounts: list[tuple[str, int, tuple[str, ...]]] = [
            (p, 0, ("--tmpfs", p)) for p in dict.fromkeys([*roots, *secret])
        ]
        mounts += [(p, 1, ("--ro-bind", p, p)) for p in dict.fromkeys(shown)]
        mounts += [(p, 2, ("--bind", p, p)) for p in dict.fromkeys(binds)]
        mounts += [(f, 3, ("--ro-bind", "/dev/null", f)) for f in masks]
        out = self._bwrap_base(network=network, die_with_parent=die_with_parent)
        for _, _, args in sorted(mounts, key=lambda m: (_depth(m[0]), m[1], m[0])):
            out += args
        return [*out, "--chdir", os.fspath(cwd), "--", *argv]

    # -- Landlock ---------------------------------------------------------------------------

    def landlock_argv(
        self, argv: Sequence[str], *, writable: Sequence[Path], die_with_parent: bool = True
    ) -> list[str]:
        """The launcher command line that runs ``argv`` under Landlock (blocking: reads files).

        Read and execute rights cover every folder but the hidden ones: the tree is granted whole
        where nothing under it is hidden, and the ancestors of a hidden path are granted child by
        child. The writable folders and the common devices get write rights too.
        """
        folders, files = self.hidden(writable)
        roots = self._emptied()
        write = [os.fspath(w) for w in writable if os.path.isdir(w)]
        excluded = sorted({*folders, *files, *roots, *write})
        read = _granted("/", excluded)
        for extra in self.readable():  # inside an excluded root: granted on its own, secrets apart
            if not _visible(extra, roots, write):
                read += _granted(extra, excluded)
        spec = {
            "read": read,
            "write": write,
            "devices": [d for d in _DEVICES if os.path.exists(d)],
            "network": self.config.network,
            "die_with_parent": die_with_parent,
            "path": _landlockpy_home(),
        }
        # -S: without site's start-up (about 40 ms here) the launcher finds landlockpy by "path".
        launcher = [
            sys.executable,
            "-I",
            "-S",
            os.fspath(Path(__file__).with_name("landlock_exec.py")),
        ]
        return [*launcher, json.dumps(spec), "--", *argv]


@functools.cache
def _landlockpy_home() -> str | None:
    """The folder landlockpy is installed in (its package's parent), for the launcher's path."""
    import importlib.util

    found = importlib.util.find_spec("landlockpy")
    if found is None or found.origin is None:
        return None
    return os.fspath(Path(found.origin).parent.parent)


def _runnable(program: str, cwd: Path, path: str | None) -> bool:
    """Whether ``program`` names an executable file (through ``PATH`` when it has no slash)."""
    if "/" in program:
        return os.access(cwd / program, os.X_OK) and not os.path.isdir(cwd / program)
    return shutil.which(program, path=path) is not None


def _visible(path: str, tmpfs: Sequence[str], binds: Sequence[str]) -> bool:
    """Whether a path is seen through the mounts: its deepest enclosing mount is not a tmpfs."""
    enclosing = [
        (len(root), kind)
        for kind, roots in ((0, tmpfs), (1, binds))
        for root in roots
        if _within(path, root)
    ]
    return not enclosing or max(enclosing)[1] == 1


def _granted(root: str, excluded: Sequence[str]) -> list[str]:
    """Paths whose subtrees together are everything under ``root`` but ``excluded``."""
    if root in excluded:
        return []
    if not any(_within(e, root) for e in excluded):
        return [root]
    out: list[str] = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    for entry in entries:
        if entry.is_symlink():
            continue  # a link is reached through its target's own rule
        if entry.is_dir(follow_symlinks=False):
            out += _granted(entry.path, excluded)
        elif entry.path not in excluded:
            out.append(entry.path)
    return out


def _probe_landlock() -> Probe:
    try:
        import landlockpy
    except ImportError:
        return Probe(None, "Landlock needs the landlockpy package")
    abi = landlockpy.abi_version()
    if abi < 1:
        return Probe(None, "the kernel has no Landlock (Linux 5.13+ with landlock in the LSM list)")
    net = "TCP off" if abi >= 4 else "network not restricted before ABI 4"
    return Probe("landlock", f"Landlock ABI {abi} ({net})")


__all__ = ["BASE_ENV", "PRIVATE_ROOTS", "Launch", "Mechanism", "Probe", "Sandbox", "environment"]
