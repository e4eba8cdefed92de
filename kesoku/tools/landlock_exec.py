"""The Landlock launcher: ``python -I -S …/kesoku/tools/landlock_exec.py SPEC -- COMMAND…``.

Started by :class:`kesoku.tools.sandbox.Sandbox` where bubblewrap is not available. It restricts
itself with Landlock (through landlockpy; kernel docs: "Landlock: unprivileged access control"),
which every process it starts inherits and cannot lift, then runs the command as its child and
exits with the command's status (128 + N after signal N, as a shell reports it).

It runs as a script with the standard library only (``-S``: no site start-up), importing landlockpy
from the folder SPEC names. SPEC is JSON: ``path`` (where landlockpy is installed), ``read`` (paths
granted execute, read and list), ``write`` (paths granted every file
system right), ``devices`` (device files granted read and write), ``network`` (false: TCP bind and
connect refused from ABI 4, UDP from ABI 8), ``die_with_parent`` (true: when Kesoku dies the
launcher gets SIGTERM and kills its process group, the command's processes with it). Signals to
processes outside the sandbox and abstract Unix sockets are scoped off from ABI 6.

A launcher that cannot apply the rules exits 126 with one line on standard error; the command
never runs unconfined.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal this process gets when the thread that started it ends."""
EXIT_CANNOT_CONFINE = 126
EXIT_NOT_FOUND = 127


def _restrict(spec: dict[str, object]) -> None:
    home = spec.get("path")
    if isinstance(home, str) and home not in sys.path:
        sys.path.insert(0, home)
    # landlockpy finds libc with ctypes.util.find_library, which runs `ldconfig -p` in a child
    # process on every call (about 15 ms here); CDLL(None) reaches the libc already loaded.
    import ctypes.util

    find_library = ctypes.util.find_library
    ctypes.util.find_library = lambda name: None if name == "c" else find_library(name)
    import landlockpy as ll

    abi = ll.abi_version()
    if abi < 1:
        raise OSError("the kernel has no Landlock")
    handled = ll.fs_for_abi(abi)
    net = ll.AccessNet.NONE if spec.get("network") else ll.net_for_abi(abi)
    scoped = ll.scope_for_abi(abi)
    read = ll.AccessFS.EXECUTE | ll.AccessFS.READ_FILE | ll.AccessFS.READ_DIR
    # The rights a rule on a file (not a folder) may hold; the kernel refuses the others (EINVAL).
    on_file = read | ll.AccessFS.WRITE_FILE | ll.AccessFS.IOCTL_DEV | ll.AccessFS.TRUNCATE
    on_file &= ~ll.AccessFS.READ_DIR
    device = on_file
    with ll.Ruleset(handled_fs=handled, handled_net=net, scoped=scoped) as rules:
        for key, access in (("read", read), ("write", handled), ("devices", device)):
            paths = spec.get(key, [])
            assert isinstance(paths, list)
            for path in paths:
                try:
                    rules.allow_path(path, access if os.path.isdir(path) else access & on_file)
                except FileNotFoundError:
                    continue  # gone since the spec was made: nothing to grant
        rules.restrict()


def main(argv: list[str] | None = None) -> int:
    """Confine this process, run the command, return its status."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m kesoku.tools.landlock_exec SPEC -- COMMAND...", file=sys.stderr)
        return 2
    spec = json.loads(args[0])
    command = args[2:]
    parent = os.getppid()
    try:
        _restrict(spec)
    except Exception as exc:  # the command must not run unconfined, whatever went wrong
        print(f"kesoku sandbox: Landlock could not be applied: {exc}", file=sys.stderr)
        return EXIT_CANNOT_CONFINE
    if spec.get("die_with_parent"):
        signal.signal(signal.SIGTERM, lambda *_: os.killpg(0, signal.SIGKILL))
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # Kesoku died before the signal was armed
            os.killpg(0, signal.SIGKILL)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            os.write(2, f"kesoku sandbox: cannot run {command[0]!r}: {exc.strerror}\n".encode())
            os._exit(EXIT_NOT_FOUND if isinstance(exc, FileNotFoundError) else EXIT_CANNOT_CONFINE)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main())
