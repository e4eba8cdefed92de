"""The paths a shell word may name, and which of them the shell policy protects (:mod:`kesoku.policy`).

A word's text is expanded the way the shell would before the policy judges it: ``~`` and ``$HOME`` to
the gates' home folder, variables the same line assigned, braces, and globs (at most
:data:`~kesoku.policy_parse.GLOB_LIMIT` matches). Secret locations come from
:class:`~kesoku.tools.paths.SecretMatcher`; the files and folders no command may write are below.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Sequence
from pathlib import Path

from kesoku.policy_parse import GLOB_LIMIT, Word, expand_braces, glob_paths
from kesoku.tools.paths import SECRET_HOME_PATHS, SECRET_SYSTEM_PATHS, PathGates, SecretMatcher

HOME_WRITE_PROTECTED: tuple[str, ...] = (
    *(".bashrc", ".bash_profile", ".bash_login", ".bash_logout", ".profile", ".zshrc", ".zprofile"),
    *(".zshenv", ".zlogin", ".zlogout", ".kshrc", ".mkshrc", ".inputrc", ".pam_environment", ".xinitrc"),
    *(".xprofile", ".gitconfig", ".vimrc", ".emacs", ".npmrc", ".config/fish", ".config/autostart"),
    *(".config/systemd", ".config/environment.d", ".config/git", ".config/nvim", ".local/bin", ".cargo/config"),
    *(".cargo/config.toml", ".pip", ".config/pip", ".emacs.d"),
)
"""Files under the home folder that make later commands or logins run code; never written by the shell."""
SYSTEM_WRITE_PROTECTED: tuple[str, ...] = (
    *("/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot", "/var/spool/cron"),
    *("/proc", "/sys", "/dev", "/root"),
)
_DEV_WRITABLE = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty", "/dev/zero"})


class PathJudge:
    """Expands the path words of one command line and says which paths are protected.

    Args:
        gates: The secret and protected paths of the configuration.
        cwd: The working directory of the line.
        workspace: Folders that stay writable even under a system folder (the cwd is one).
    """

    def __init__(self, gates: PathGates, cwd: Path, workspace: Sequence[Path]) -> None:
        self.home = os.fspath(gates.home_dir())
        self.workspace = [os.path.realpath(w) for w in (*workspace, cwd)]
        self.secrets = SecretMatcher(gates)
        self.fragments = _secret_fragments(gates)
        self.variables: dict[str, str] = {}
        """Variables the line assigned so far (the policy's checker records them)."""

    def secret_fragment(self, word: Word) -> str | None:
        """A secret location named in a word decided at run time (``$X/.ssh/id_rsa``), or None."""
        return next((f for f in _components(word.raw) if f in self.fragments or f.startswith(".env.")), None)

    def candidates(self, word: Word, bases: list[Path]) -> list[Path] | None:
        """The absolute paths a word may name, or None when it is decided at run time."""
        text = word.text
        if not word.static:
            text = _VARIABLE.sub(self.substitute, word.raw.replace('"', ""))
            if any(c in text for c in "$`'\\") and not word.glob and not word.brace:
                return None
        texts = expand_braces(text) if "{" in text else [text]
        out: list[Path] = []
        for item in texts:
            item = self.expand_tilde(item)
            roots = [Path("/")] if item.startswith("/") else bases
            for root in roots:
                path = Path(os.path.normpath(root / item)) if item else root
                out.append(path)
                if word.glob and any(c in item for c in "*?["):
                    out += [Path(p) for p in itertools.islice(glob_paths(os.fspath(path)), GLOB_LIMIT)]
        return out

    def substitute(self, m: re.Match[str]) -> str:
        """A ``$NAME`` or ``${NAME}`` whose value the line set, or HOME; else left as is."""
        name = m.group(1) or m.group(2)
        if name == "HOME":
            return self.home
        return self.variables.get(name, m.group(0))

    def expand_tilde(self, text: str) -> str:
        """``~`` and ``~/…`` are the gates' home folder; ``~user`` is left to the OS."""
        if text == "~" or text.startswith("~/"):
            return self.home + text[1:]
        return os.path.expanduser(text)

    def protected(self, path: Path) -> str | None:
        """Why no command may write ``path`` (git hooks and config, start-up files, system folders), or None."""
        real = os.path.realpath(path)
        parts = Path(real).parts
        for i, part in enumerate(parts[:-1]):
            if part == ".git" and (parts[i + 1] == "hooks" or (parts[i + 1] == "config" and i + 2 == len(parts))):
                return "git runs what is written there"
        forms = {os.path.normpath(path), real}
        for form in forms:
            for rel in HOME_WRITE_PROTECTED:
                if _within(form, os.path.join(self.home, rel)):
                    return f"~/{rel} runs code at login or when programs start"
        if any(_within(real, w) for w in self.workspace):
            return None  # a project under /opt or /usr/src is still the workspace
        for form in forms:
            if form in _DEV_WRITABLE or form.startswith("/dev/fd/"):
                continue
            for system in SYSTEM_WRITE_PROTECTED:
                if _within(form, system):
                    return f"{system} is a system location"
        return None


_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def _components(raw: str) -> list[str]:
    """The path components of a word's source, quotes removed (``"$d"/.ssh`` gives ``$d`` and ``.ssh``)."""
    return [part for part in re.split(r"/", re.sub(r"[\"'\\]", "", raw)) if part]


def _secret_fragments(gates: PathGates) -> frozenset[str]:
    """Names that mark a secret location in a word decided at run time (``$X/.ssh/id_rsa``)."""
    names = {Path(rel).name for rel in SECRET_HOME_PATHS} | {Path(p).name for p in SECRET_SYSTEM_PATHS}
    names |= {f.name for f in gates.protected_files} | {".env", "environ"}
    return frozenset(names)


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


__all__ = ["HOME_WRITE_PROTECTED", "SYSTEM_WRITE_PROTECTED", "PathJudge"]
