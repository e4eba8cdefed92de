"""The shell command policy: the operator's intent about which commands the agent runs.

The policy is not the boundary. What a command can read, write or reach is decided by the OS
sandbox around it (:mod:`kesoku.tools.sandbox`); the policy says which programs the operator wants
the agent to run (``mode = "allowlist"``) or not to run (``"blocklist"``).

The line is parsed by bashlex (:mod:`kesoku.tools.policy.parse`), never split on spaces, and each
simple command found anywhere in it (pipelines, lists, subshells, groups, substitutions, function
bodies) is checked, then again each command a wrapper runs: ``env``, ``nice``, ``timeout``,
``nohup``, ``setsid``, ``stdbuf``, ``time``, ``command``, ``builtin``, ``exec``, ``xargs``, ``find
-exec``, a shell's ``-c`` text or the here-document it reads (:data:`WRAPPERS`, :data:`SHELLS`).

A pattern is matched with :func:`re.match` at the start of a command as the shell will see it: the
program, then its words with quotes removed, joined by spaces (``"r"m -rf x`` is ``rm -rf x``). So a
pattern names a program and what follows it, and a word inside an argument (``grep -r "sudo "
notes/``) or a file name (``cat dd-report.txt``) is never taken for a program. A program given as a
path (``/bin/rm``) is matched by its base name and by its full path: in allowlist mode both must be
allowed, in blocklist mode either one refuses.

Allowlist mode also refuses what it cannot judge: a line bashlex cannot parse, a program name
decided at run time (a variable, substitution, glob, brace or ``$'…'`` quoting), ``eval``,
``source``, ``alias``, ``trap``, function definitions, a shell reading a script file or a pipe
(``echo rm x | sh``), and wrapper options it does not know. The wrappers themselves must be allowed
too (``time`` is a keyword, not a program), and builtins that run and write nothing pass without a
pattern (:data:`NEUTRAL_BUILTINS`). Blocklist mode looks through ``eval``, ``alias`` and
``trap`` text instead, and matches an unparsable line's commands as its ``;``, ``&&``, ``||`` and
``|`` separate them.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kesoku.tools.policy.parse import Opaque, SimpleCommand, Unparsable, Word, find_exec, parse_line

if TYPE_CHECKING:
    from kesoku.config.settings import ShellConfig

MAX_LINE_BYTES = 100_000
"""Longer lines are refused: parsing them would hold a thread for seconds."""
NEUTRAL_BUILTINS = frozenset(
    {"cd", "pushd", "popd", "true", "false", ":", "test", "[", "exit", "wait"}
)
"""Builtins that run nothing and write nothing: in allowlist mode they pass without a pattern."""
SHELLS = frozenset(
    {"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "rbash", "yash", "posh", "fish"}
)
"""Shells: ``-c TEXT`` (or the here-document they read) is checked like the line itself."""
_TEXT_BUILTINS = frozenset({"eval", "source", ".", "alias", "trap"})
_SEPARATORS = re.compile(r"\|\||&&|[;|&\n()]")


@dataclass(frozen=True, slots=True)
class _Wrapper:
    flags: frozenset[str] = frozenset()  # options without a value
    value: frozenset[str] = frozenset()  # options taking a value: "-n 5", "-n5", "--adjustment=5"
    operands: int = 0  # operands before the command (timeout's duration)
    assignments: bool = False  # NAME=value operands before the command (env)
    no_exec: frozenset[str] = frozenset()  # options after which nothing runs (command -v)
    default: tuple[str, ...] = ()  # the command run when none is given (xargs: echo)


WRAPPERS: dict[str, _Wrapper] = {
    "env": _Wrapper(
        flags=frozenset({"-i", "--ignore-environment", "-0", "--null", "-v", "--debug"}),
        value=frozenset({"-u", "--unset", "-C", "--chdir"}),
        assignments=True,
    ),
    "nice": _Wrapper(value=frozenset({"-n", "--adjustment"})),
    "timeout": _Wrapper(
        flags=frozenset({"--preserve-status", "--foreground", "-v", "--verbose"}),
        value=frozenset({"-s", "--signal", "-k", "--kill-after"}),
        operands=1,
    ),
    "nohup": _Wrapper(),
    "setsid": _Wrapper(flags=frozenset({"-c", "--ctty", "-f", "--fork", "-w", "--wait"})),
    "stdbuf": _Wrapper(value=frozenset({"-i", "-o", "-e", "--input", "--output", "--error"})),
    "time": _Wrapper(
        flags=frozenset({"-p", "-a", "-q", "-v", "--portability", "--append", "--quiet"}),
        value=frozenset({"-f", "-o", "--format", "--output"}),
    ),
    "command": _Wrapper(flags=frozenset({"-p"}), no_exec=frozenset({"-v", "-V"})),
    "builtin": _Wrapper(),
    "exec": _Wrapper(flags=frozenset({"-c", "-l"}), value=frozenset({"-a"})),
    "xargs": _Wrapper(
        flags=frozenset({"-0", "-r", "-t", "-p", "-x", "--null", "--no-run-if-empty", "--verbose"}),
        value=frozenset({"-a", "-d", "-E", "-I", "-L", "-n", "-P", "-s", "--arg-file"}),
        default=("echo",),
    ),
}
"""Programs that run their operands as a command, and their options that take a value."""


@dataclass(frozen=True, slots=True)
class PolicyDecision:
    """Whether a command line may run.

    Attributes:
        allowed: True when every simple command passed.
        reason: Why it was refused (for the model: the command and the rule); empty if allowed.
        command: The offending simple command, as the shell will see it.
        rule: The rule that refused it (``allowlist``, ``blocklist[0]``, ``unparsable``, …).
        commands: The simple commands checked (of an allowed line).
    """

    allowed: bool
    reason: str = ""
    command: str | None = None
    rule: str | None = None
    commands: tuple[str, ...] = ()


class _Refusal(Exception):
    def __init__(self, command: str | None, rule: str, detail: str) -> None:
        super().__init__(detail)
        self.command = command
        self.rule = rule
        self.detail = detail


def check_command(line: str, shell: ShellConfig) -> PolicyDecision:
    """Check a shell line against the policy.

    Args:
        line: The command line, as ``sh -c`` would run it.
        shell: ``mode`` and the pattern lists.

    Returns:
        The decision; a refusal's reason names the offending simple command and the rule.

    Note:
        Parsing a long line takes milliseconds: call it through ``trio.to_thread`` from async code.
    """
    checker = _Checker(shell)
    try:
        checker.hygiene(line)
        checker.line(line, depth=0)
    except _Refusal as refusal:
        return checker.refused(refusal)
    return PolicyDecision(True, commands=tuple(checker.checked))


def check_argv(argv: Sequence[str], shell: ShellConfig) -> PolicyDecision:
    """Check a command run without a shell (``shell.use_shell = false``): argv is executed as is.

    Args:
        argv: The program and its arguments.
        shell: ``mode`` and the pattern lists.

    Returns:
        The decision, as :func:`check_command`; wrappers and ``sh -c`` text are looked through.
    """
    checker = _Checker(shell)
    try:
        for arg in argv:
            checker.hygiene(arg)
        if not argv:
            raise _Refusal(None, "empty", "the command is empty")
        checker.run(shlex.join(argv), [Word.plain(a) for a in argv], depth=0)
    except _Refusal as refusal:
        return checker.refused(refusal)
    return PolicyDecision(True, commands=tuple(checker.checked))


@dataclass
class _Checker:
    shell: ShellConfig
    checked: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.allowlist = self.shell.mode == "allowlist"
        raw = self.shell.allowlist_patterns if self.allowlist else self.shell.blocklist_patterns
        self.patterns = [re.compile(p) for p in raw]

    def refused(self, refusal: _Refusal) -> PolicyDecision:
        mode = "allowlist" if self.allowlist else "blocklist"
        reason = f"refused by the shell policy ({mode} mode): {refusal.detail}"
        return PolicyDecision(False, reason, refusal.command, refusal.rule)

    def hygiene(self, line: str) -> None:
        if not line.strip():
            raise _Refusal(None, "empty", "the command is empty")
        if len(line.encode("utf-8", errors="surrogatepass")) > MAX_LINE_BYTES:
            raise _Refusal(None, "too-long", f"the command is longer than {MAX_LINE_BYTES} bytes")
        bad = next((c for c in line if (ord(c) < 32 and c not in "\t\n") or ord(c) == 127), None)
        if bad is not None:
            # NUL cuts an argument short and \r hides text in a terminal: what is shown is not
            # what runs.
            raise _Refusal(
                None, "control-character", f"the command holds the control character {bad!r}"
            )

    def unchecked(self, source: str, rule: str, why: str) -> None:
        """Commands that cannot be seen: an allowlist refuses them, a blocklist lets them be."""
        if self.allowlist:
            raise _Refusal(source, rule, why)

    def line(self, line: str, depth: int) -> None:
        try:
            items = parse_line(line, depth=depth)
        except Unparsable as exc:
            why = (
                f"the command cannot be parsed with confidence ({exc}); use plain commands, pipes, "
                "&&, ||, ;"
            )
            self.unchecked(line, "unparsable", why)
            self.unparsed(line)
            return
        for item in items:
            if isinstance(item, Opaque):
                self.opaque(item)
            else:
                self.simple(item, depth)

    def unparsed(self, line: str) -> None:
        """Blocklist mode, an unparsable line: each part between separators, quoted and not."""
        for part in _SEPARATORS.split(line):
            for text in {part.strip(), re.sub(r"[\"'\\]", "", part).strip()}:
                if text:
                    self.match_blocklist(text, line)
        self.checked.append(line)

    def opaque(self, item: Opaque) -> None:
        if item.kind == "function":
            self.unchecked(item.source, "function", f"`{item.source}` defines a shell function")
        elif item.kind == "expansion":
            self.unchecked(
                item.source,
                "hidden-substitution",
                f"`{item.source}` hides a command the policy cannot see",
            )
        else:
            self.unchecked(
                item.source,
                "unsupported",
                f"`{item.source}` is a construct the policy cannot check",
            )

    def simple(self, command: SimpleCommand, depth: int) -> None:
        if not command.words:
            return
        base = command.words[0].text.rsplit("/", 1)[-1]
        if base in SHELLS and command.heredoc is not None and not _has_c(command.words[1:]):
            self.match_program(command.source, list(command.words))
            self.nested(command.heredoc, depth)  # `sh <<EOF … EOF`: the body is its script
            return
        self.run(command.source, list(command.words), depth)

    def nested(self, text: str, depth: int) -> None:
        self.hygiene(text)
        self.line(text, depth + 1)

    def run(self, source: str, words: list[Word], depth: int) -> None:
        """Check a command about to be executed, then what it runs in turn."""
        base = self.match_program(source, words)
        if base is None:
            return
        shown = " ".join(w.text for w in words)
        args = words[1:]
        if base in _TEXT_BUILTINS:
            self.builtin(base, args, shown, depth)
        elif base == "find":
            for executed in find_exec(args):
                self.run(shown, executed, depth)
        elif base in SHELLS:
            self.shell_text(base, args, shown, depth)
        elif base in WRAPPERS:
            inner = self.unwrap(base, args, shown)
            if inner:
                self.run(shown, inner, depth)

    def match_program(self, source: str, words: list[Word]) -> str | None:
        """Match a command's program and words; its base name (None: decided at run time)."""
        program = words[0]
        if not program.static or not program.text or any(c.isspace() for c in program.text):
            self.unchecked(
                source,
                "dynamic-program",
                f"`{source}` runs a program whose name `{program.raw or program.text}` is decided "
                "at run time (a variable, substitution, glob, brace or $'…' quoting); write the "
                "program name literally",
            )
            return None
        name = program.text
        base = name.rsplit("/", 1)[-1]
        shown = " ".join(w.text for w in words)
        if "/" in name and not base:
            self.unchecked(shown, "dynamic-program", f"`{shown}` names a folder as its program")
            return None
        if not (self.allowlist and name in NEUTRAL_BUILTINS):
            self.match(name, base, [w.text for w in words[1:]], shown)
        self.checked.append(shown)
        return base

    def match(self, name: str, base: str, args: list[str], shown: str) -> None:
        texts = [" ".join([name, *args])]
        if "/" in name:
            texts.append(" ".join([base, *args]))
        if not self.allowlist:
            for text in texts:
                self.match_blocklist(text, shown)
            return
        for text in texts:
            if not any(p.match(text) for p in self.patterns):
                why = "matches none of shell.allowlist_patterns"
                if len(texts) > 1:
                    why += (
                        f" (a program given as a path must be allowed both as `{base}` and as "
                        f"`{name}`)"
                    )
                raise _Refusal(shown, "allowlist", f"`{text}` {why}")

    def match_blocklist(self, text: str, shown: str) -> None:
        for i, pattern in enumerate(self.patterns):
            if pattern.match(text):
                raise _Refusal(
                    shown,
                    f"blocklist[{i}]",
                    f"`{text}` matches shell.blocklist_patterns[{i}] {pattern.pattern!r}",
                )

    def builtin(self, base: str, args: list[Word], shown: str, depth: int) -> None:
        """``eval``, ``source``, ``alias``, ``trap``: refused by an allowlist, else text checked."""
        self.unchecked(
            shown, base, f"`{shown}`: {base} runs or defines commands the policy cannot check"
        )
        texts = [w.text for w in args]
        if base == "eval" and all(w.static for w in args) and texts:
            self.nested(" ".join(texts), depth)
        elif base == "alias":
            for text in texts:
                if "=" in text:
                    self.nested(text.partition("=")[2], depth)
        elif base == "trap":
            operands = [t for t in texts if not t.startswith("-")]
            if len(operands) >= 2 and operands[0].strip():
                self.nested(operands[0], depth)

    def shell_text(self, name: str, args: list[Word], shown: str, depth: int) -> None:
        """``sh [options] -c TEXT``: TEXT is a line; without ``-c`` a script or stdin runs."""
        for i, word in enumerate(args):
            text = word.text
            if not word.static:
                self.unchecked(shown, "wrapper", f"`{shown}`: `{word.raw}` is decided at run time")
                return
            if len(text) > 1 and text[0] == "-" and not text.startswith("--") and "c" in text[1:]:
                if i + 1 >= len(args) or not args[i + 1].static:
                    self.unchecked(
                        shown,
                        "wrapper",
                        f"`{shown}`: the -c text is missing or decided at run time",
                    )
                    return
                self.nested(args[i + 1].text, depth)
                return
            if not text.startswith(("-", "+")):
                break
        self.unchecked(
            shown, "wrapper", f"`{shown}`: `{name}` without -c runs a script file or standard input"
        )

    def unwrap(self, name: str, args: list[Word], shown: str) -> list[Word] | None:
        """The command a wrapper runs, after its options (and ``env``'s assignments)."""
        spec = WRAPPERS[name]
        i = 0
        while i < len(args):
            word = args[i]
            text = word.text
            if not word.static:
                self.unchecked(shown, "wrapper", f"`{shown}`: `{word.raw}` is decided at run time")
                return None
            if text == "--":
                i += 1
                break
            if text.startswith("-") and len(text) > 1:
                option = text.partition("=")[0] if text.startswith("--") else text[:2]
                if option in spec.no_exec:
                    return None
                if option in spec.value:
                    attached = "=" in text or (len(text) > 2 and not text.startswith("--"))
                    i += 1 if attached else 2
                    continue
                if option not in spec.flags and not text[1:].isdigit():  # nice -10
                    why = f"`{shown}`: `{name}` option `{option}` is not known to the policy"
                    self.unchecked(shown, "wrapper", why)
                i += 1
                continue
            if spec.assignments and re.match(r"[A-Za-z_][A-Za-z0-9_]*=", text):
                i += 1
                continue
            break
        i += spec.operands
        rest = args[i:]
        return rest or [Word.plain(w) for w in spec.default] or None


def _has_c(words: Sequence[Word]) -> bool:
    return any(
        len(w.text) > 1 and w.text[0] == "-" and not w.text.startswith("--") and "c" in w.text
        for w in words
    )


__all__ = [
    "MAX_LINE_BYTES",
    "NEUTRAL_BUILTINS",
    "SHELLS",
    "WRAPPERS",
    "PolicyDecision",
    "check_argv",
    "check_command",
]
