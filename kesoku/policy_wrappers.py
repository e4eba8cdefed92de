"""Commands that run another command: how to find the real one inside (``env``, ``sudo``, ``sh -c`` …).

:func:`unwrap` reads a wrapper's options the way the wrapper does and returns the command it will
run, as words (``nice -n 5 rm x`` → ``rm x``) or as shell text to parse again (``sh -c 'rm x'``,
``su -c``, ``env -S``, ``watch``, ``flock -c``). An option it does not know, or one whose value is
decided at run time, raises :class:`Unclear`: guessing where the real command starts is how a
checker is walked past.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from kesoku.policy_parse import Word


class Unclear(Exception):
    """The wrapper's command cannot be found with confidence; the message says why."""


@dataclass(frozen=True, slots=True)
class Unwrapped:
    """What a wrapper runs.

    Attributes:
        argv: The wrapped command's words, or None when it runs none (``command -v x``, ``sudo -v``).
        scripts: Shell text it runs (``sh -c TEXT``), to parse and check as a line.
        assignments: ``NAME=value`` operands it sets in the command's environment (``env``, ``sudo``).
        unchecked: Why it runs code no check can see (``sh script.sh``, a shell reading standard
            input, ``sudo -s``), or None. Allowlist mode refuses it.
    """

    argv: list[Word] | None = None
    scripts: list[str] = field(default_factory=list)
    assignments: list[Word] = field(default_factory=list)
    unchecked: str | None = None


@dataclass(frozen=True, slots=True)
class _Spec:
    value: frozenset[str] = frozenset()  # options taking a value: "-u root", "-uroot", "--user=root"
    flags: frozenset[str] = frozenset()  # options without one; short flags may be grouped ("-rt")
    operands: int = 0  # operands before the command (timeout's duration, chroot's root)
    numeric: bool = False  # "-10" is an option (nice)
    assignments: bool = False  # NAME=value operands before the command (env, sudo)
    scripts: frozenset[str] = frozenset()  # options whose value is shell text (env -S, flock -c)
    no_exec: frozenset[str] = frozenset()  # options after which nothing runs (command -v)
    default: tuple[str, ...] = ()  # the command run when none is given (xargs: echo)
    split_script: bool = False  # a script option's text is split into words, not run by a shell (env -S)
    optional: frozenset[str] = frozenset()  # short options with an optional attached value (xargs -i{})


def _s(*names: str) -> frozenset[str]:
    return frozenset(names)


WRAPPERS: dict[str, _Spec] = {
    "env": _Spec(
        value=_s("-u", "--unset", "-C", "--chdir", "--default-signal", "--ignore-signal", "--block-signal"),
        flags=_s("-i", "--ignore-environment", "-", "-0", "--null", "-v", "--debug", "--list-signal-handling"),
        assignments=True,
        scripts=_s("-S", "--split-string"),
        split_script=True,
    ),
    "nice": _Spec(value=_s("-n", "--adjustment"), numeric=True),
    "timeout": _Spec(
        value=_s("-s", "--signal", "-k", "--kill-after"),
        flags=_s("--preserve-status", "--foreground", "-v", "--verbose", "-f"),
        operands=1,
    ),
    "nohup": _Spec(),
    "setsid": _Spec(flags=_s("-c", "--ctty", "-f", "--fork", "-w", "--wait")),
    "stdbuf": _Spec(value=_s("-i", "-o", "-e", "--input", "--output", "--error")),
    "time": _Spec(
        value=_s("-f", "-o", "--format", "--output"),
        flags=_s("-p", "-a", "-q", "-v", "--portability", "--append", "--quiet", "--verbose"),
    ),
    "command": _Spec(flags=_s("-p"), no_exec=_s("-v", "-V")),
    "builtin": _Spec(),
    "exec": _Spec(value=_s("-a"), flags=_s("-c", "-l")),
    "sudo": _Spec(
        value=_s(
            *("-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-T", "-U", "-R"),
            *("--user", "--group", "--close-from", "--chdir", "--host", "--prompt", "--role", "--type"),
            *("--command-timeout", "--other-user", "--chroot"),
        ),
        flags=_s(
            *("-A", "-b", "-E", "-H", "-k", "-n", "-P", "-S", "-s", "-i"),
            *("--askpass", "--background", "--preserve-env", "--set-home", "--reset-timestamp"),
            *("--non-interactive", "--preserve-groups", "--stdin", "--shell", "--login"),
        ),
        assignments=True,
        no_exec=_s("-e", "--edit", "-l", "--list", "-v", "--validate", "-K", "--remove-timestamp", "-V"),
    ),
    "doas": _Spec(value=_s("-u", "-C"), flags=_s("-n", "-s", "-L")),
    "xargs": _Spec(
        value=_s(
            *("-a", "-d", "-E", "-I", "-L", "-n", "-P", "-s"),
            *("--arg-file", "--delimiter", "--eof", "--replace", "--max-lines", "--max-args"),
            *("--max-procs", "--max-chars", "--process-slot-var"),
        ),
        flags=_s(
            *("-0", "-r", "-t", "-p", "-x", "-o"),
            *("--null", "--no-run-if-empty", "--verbose", "--interactive", "--exit", "--open-tty"),
            "--show-limits",
        ),
        optional=_s("-e", "-i", "-l"),
        default=("echo",),
    ),
    "ionice": _Spec(
        value=_s("-c", "-n", "--class", "--classdata"), flags=_s("-t", "--ignore"), no_exec=_s("-p", "-P", "-u")
    ),
    "chroot": _Spec(value=_s("--userspec", "--groups"), flags=_s("--skip-chdir"), operands=1),
    "taskset": _Spec(flags=_s("-a", "-c", "--all-tasks", "--cpu-list"), operands=1, no_exec=_s("-p", "--pid")),
    "flock": _Spec(
        value=_s("-w", "--wait", "--timeout", "-E", "--conflict-exit-code"),
        flags=_s("-s", "--shared", "-x", "-e", "--exclusive", "-n", "--nb", "--nonblock", "-o", "--close"),
        operands=1,
        scripts=_s("-c", "--command"),
        no_exec=_s("-u", "--unlock"),
    ),
    "unbuffer": _Spec(flags=_s("-p")),
    "busybox": _Spec(),
    "toybox": _Spec(),
}
"""Wrappers that run their operands as a command, with the options each one understands."""

SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "rbash", "yash", "posh", "fish", "csh", "tcsh"})
"""Shells: ``-c TEXT`` runs TEXT, which is parsed and checked like the line itself."""

_SCRIPT_RUNNERS = {
    "su": ("-c", "--command", "--session-command"),
    "runuser": ("-c", "--command"),
    "script": ("-c", "--command"),
}
"""Programs whose ``-c`` option takes shell text, wherever it stands among their arguments."""

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


_UV_GLOBAL = _Spec(
    value=_s("--directory", "--project", "--cache-dir", "--config-file", "--color", "--python-preference"),
    flags=_s(
        *("-q", "-v", "-n", "--quiet", "--verbose", "--offline", "--no-cache", "--native-tls", "--no-progress"),
        *("--preview", "--no-preview", "--no-config", "--no-python-downloads", "--managed-python"),
        "--no-managed-python",
    ),
)
_UV_RUN = _Spec(
    value=_s(
        *("-w", "--with", "--with-editable", "--with-requirements", "-p", "--python", "--project", "--directory"),
        *("--package", "--extra", "--group", "--only-group", "--no-group", "--env-file", "--index", "--from"),
        *("--default-index", "--index-url", "--extra-index-url", "--python-preference", "--resolution"),
        *("--prerelease", "--color", "--cache-dir", "--config-file", "--exclude-newer", "--index-strategy"),
        *("--keyring-provider", "--link-mode", "-P", "--upgrade-package", "--reinstall-package"),
    ),
    flags=_s(
        *("--no-project", "--frozen", "--locked", "--isolated", "--no-sync", "--all-extras", "--no-dev", "--dev"),
        *("--all-groups", "--active", "--no-active", "--exact", "--inexact", "-q", "-v", "--quiet", "--verbose"),
        *("--offline", "--no-cache", "-n", "--refresh", "--reinstall", "--upgrade", "-U", "--no-editable"),
        *("--no-build-isolation", "--compile-bytecode", "--no-env-file", "--all-packages", "--native-tls"),
        *("--no-python-downloads", "--managed-python", "--no-managed-python", "--no-progress", "--no-config"),
        *("--no-build", "--no-binary", "--preview"),
    ),
)
_UV_PYTHON_OPTIONS = {"-m": "-m", "--module": "-m", "-s": None, "--script": None}


def _uv(args: list[Word], *, tool: bool) -> Unwrapped:
    """``uv [global options] run|tool run …`` and ``uvx …``: the command run inside the environment.

    Other ``uv`` subcommands (``pip``, ``sync``, ``add`` …) run no command line of the model's.
    """
    i = 0
    if not tool:
        while i < len(args):
            text = static_text(args[i], "uv")
            if not text.startswith("-"):
                break
            i += 1 if text in _UV_GLOBAL.flags or "=" in text else 2
            if text.partition("=")[0] not in _UV_GLOBAL.flags | _UV_GLOBAL.value:
                raise Unclear(f"`uv` option `{text}` is not known to the policy")
        sub = [static_text(w, "uv") for w in args[i : i + 2]]
        if sub[:1] == ["run"]:
            i += 1
        elif sub == ["tool", "run"]:
            i += 2
        else:
            return Unwrapped(None)
    python: list[str] = []
    while i < len(args):
        text = static_text(args[i], "uv")
        option = text.partition("=")[0]
        if text == "--":
            i += 1
            break
        if not text.startswith("-"):
            break
        if text in _UV_PYTHON_OPTIONS:  # -m/--module and -s/--script: uv runs python
            flag = _UV_PYTHON_OPTIONS[text]
            python = ["python", flag] if flag else ["python"]
            i += 1
        elif option in _UV_RUN.value:
            if "=" not in text:
                option_value(args, i, "uv", option)
            i += 1 if "=" in text else 2
        elif text in _UV_RUN.flags:
            i += 1
        else:
            raise Unclear(f"`uv` option `{text}` is not known to the policy")
    argv = args[i:]
    if not argv:
        return Unwrapped(None)
    if not python and argv[0].static and argv[0].text.endswith(".py"):
        python = ["python"]  # `uv run script.py` runs the script with the project's python
    return Unwrapped([*(Word.plain(p) for p in python), *argv])


def is_wrapper(name: str) -> bool:
    """Whether :func:`unwrap` knows how ``name`` runs another command."""
    return name in WRAPPERS or name in SHELLS or name in _SCRIPT_RUNNERS or name in ("watch", "uv", "uvx")


def unwrap(name: str, args: list[Word]) -> Unwrapped:
    """Find what a wrapper runs.

    Args:
        name: The wrapper's base name (``env``, ``sudo``, ``sh`` …).
        args: Its arguments.

    Returns:
        The wrapped command, shell text, and the assignments the wrapper makes.

    Raises:
        Unclear: An unknown option, or an option or operand decided at run time.
    """
    if name in SHELLS:
        return _shell(name, args)
    if name in _SCRIPT_RUNNERS:
        return _script_runner(name, args)
    if name == "watch":
        return _watch(args)
    if name in ("uv", "uvx"):
        return _uv(args, tool=name == "uvx")
    out = _generic(name, WRAPPERS[name], args)
    shells = {"-s", "-i", "--shell", "--login"}
    if name in ("sudo", "doas") and out.argv is None and any(w.text in shells for w in args):
        return Unwrapped(None, out.scripts, out.assignments, f"`{name} -s` starts a shell reading standard input")
    return out


def static_text(word: Word, name: str) -> str:
    """The text of an argument of ``name``; :class:`Unclear` when it is decided at run time."""
    if not word.static:
        raise Unclear(f"`{name}` is given `{word.raw}`, decided at run time")
    return word.text


def _generic(name: str, spec: _Spec, args: list[Word]) -> Unwrapped:
    out = Unwrapped()
    i = 0
    while i < len(args):
        text = static_text(args[i], name)
        if text == "--":
            i += 1
            break
        if text == "-" and "-" in spec.flags:
            i += 1
            continue
        if text.startswith("--"):
            option, eq, value = text.partition("=")
            if option in spec.no_exec:
                return Unwrapped(None)
            if option in spec.scripts:
                script = value if eq else option_value(args, i, name, option)
                i += 1 if eq else 2
                if spec.split_script:
                    return _split_script(name, script, args[i:], out)
                out.scripts.append(script)
                continue
            if option in spec.value:
                if not eq:
                    option_value(args, i, name, option)
                i += 1 if eq else 2
                continue
            if option in spec.flags and not eq:
                i += 1
                continue
            raise Unclear(f"`{name}` option `{option}` is not known to the policy")
        if text.startswith("-") and len(text) > 1:
            if spec.numeric and text[1:].isdigit():
                i += 1
                continue
            i, done, result = _short_options(name, spec, args, i, text, out)
            if done:
                return result
            continue
        if spec.assignments and _NAME.match(text):
            out.assignments.append(args[i])
            i += 1
            continue
        break
    for _ in range(spec.operands):
        if i >= len(args):
            return Unwrapped(None, out.scripts, out.assignments)
        static_text(args[i], name)
        i += 1
    if spec.scripts and i < len(args) and args[i].static and args[i].text in spec.scripts:  # flock FILE -c TEXT
        out.scripts.append(option_value(args, i, name, args[i].text))
        i += 2
    rest = args[i:]
    if not rest and spec.default:
        rest = [Word.plain(word) for word in spec.default]
    return Unwrapped(rest or None, out.scripts, out.assignments)


def _short_options(
    name: str, spec: _Spec, args: list[Word], i: int, text: str, out: Unwrapped
) -> tuple[int, bool, Unwrapped]:
    """Read one group of short options (``-rt``, ``-n5``, ``-S 'text'``); returns (next index, done, result)."""
    j = 1
    while j < len(text):
        option = "-" + text[j]
        rest = text[j + 1 :]
        if option in spec.no_exec:
            return i + 1, True, Unwrapped(None)
        if option in spec.scripts:
            script = rest or option_value(args, i, name, option)
            nxt = i + 1 if rest else i + 2
            if spec.split_script:
                return nxt, True, _split_script(name, script, args[nxt:], out)
            out.scripts.append(script)
            return nxt, False, out
        if option in spec.value:
            if not rest:
                option_value(args, i, name, option)
                return i + 2, False, out
            return i + 1, False, out
        if option in spec.optional:
            return i + 1, False, out
        if option not in spec.flags:
            raise Unclear(f"`{name}` option `{option}` is not known to the policy")
        j += 1
    return i + 1, False, out


def option_value(args: list[Word], i: int, name: str, option: str) -> str:
    """The static value after ``option`` (at ``args[i]``) of ``name``; :class:`Unclear` when missing or dynamic."""
    if i + 1 >= len(args):
        raise Unclear(f"`{name}` option `{option}` has no value")
    return static_text(args[i + 1], name)


def _split_script(name: str, script: str, rest: list[Word], out: Unwrapped) -> Unwrapped:
    """``env -S 'a b'``: the text is split into words that come before the remaining operands."""
    try:
        words = shlex.split(script)
    except ValueError as exc:
        raise Unclear(f"`{name} -S` text cannot be split: {exc}") from None
    inner = _generic(name, WRAPPERS[name], [Word.plain(w) for w in words] + rest)
    return Unwrapped(inner.argv, out.scripts + inner.scripts, out.assignments + inner.assignments)


def _shell(name: str, args: list[Word]) -> Unwrapped:
    """``sh [options] -c TEXT [name [args]]``: TEXT is a line; without ``-c`` a script file or stdin runs."""
    has_c = False
    i = 0
    while i < len(args):
        text = static_text(args[i], name)
        if text in ("--", "-"):
            i += 1
            break
        if text.startswith("--"):
            if text in ("--rcfile", "--init-file"):
                i += 2
                continue
            i += 1  # --norc, --login, --posix …: none runs other text than the script
            continue
        if len(text) > 1 and text[0] in "-+":
            letters = text[1:]
            if not letters.isalpha():
                raise Unclear(f"`{name}` option `{text}` is not known to the policy")
            has_c = has_c or (text[0] == "-" and "c" in letters)
            i += 2 if ("o" in letters or "O" in letters) else 1
            continue
        break
    if not has_c:
        return Unwrapped(None, unchecked=f"`{name}` without -c runs a script file or standard input")
    if i >= len(args):
        raise Unclear(f"`{name} -c` has no command text")
    return Unwrapped(None, [static_text(args[i], name)])


def _script_runner(name: str, args: list[Word]) -> Unwrapped:
    options = _SCRIPT_RUNNERS[name]
    scripts: list[str] = []
    for i, word in enumerate(args):
        text = word.text if word.static else ""
        if not word.static and word.raw.startswith("-"):
            raise Unclear(f"`{name}` is given `{word.raw}`, decided at run time")
        if text in options:
            scripts.append(option_value(args, i, name, text))
        elif any(text.startswith(f"{o}=") for o in options if o.startswith("--")):
            scripts.append(text.partition("=")[2])
        elif text.startswith("-c") and len(text) > 2:
            scripts.append(text[2:])
    if not scripts and name == "su":
        return Unwrapped(None, unchecked="`su` without -c starts a shell reading standard input")
    return Unwrapped(None, scripts)


def _watch(args: list[Word]) -> Unwrapped:
    """``watch [options] COMMAND...``: the operands are joined and run by ``sh -c``."""
    spec = _Spec(
        value=_s("-n", "--interval", "-q", "--equexit", "-s", "--shotsfile"),
        flags=_s(
            *("-b", "--beep", "-c", "--color", "-C", "--no-color", "-d", "--differences", "-e", "--errexit"),
            *("-g", "--chgexit", "-t", "--no-title", "-w", "--no-wrap", "-x", "--exec", "-p", "--precise"),
            *("-r", "--no-rerun"),
        ),
    )
    inner = _generic("watch", spec, args)
    if inner.argv is None:
        return Unwrapped(None)
    return Unwrapped(None, [" ".join(static_text(w, "watch") for w in inner.argv)])


__all__ = [
    "SHELLS",
    "WRAPPERS",
    "Unclear",
    "Unwrapped",
    "is_wrapper",
    "option_value",
    "static_text",
    "unwrap",
]
