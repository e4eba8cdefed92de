"""The shell command policy: every simple command of a parsed line against the configured patterns.

The line is parsed by bashlex (:mod:`kesoku.policy_parse`), never split on spaces, and each simple
command found anywhere in it — pipelines, lists, subshells, groups, substitutions, here-documents,
function bodies — is checked, then again each command a wrapper runs (``env``, ``xargs``, ``sudo``,
``timeout``, ``sh -c TEXT`` … in :mod:`kesoku.policy_wrappers`). A pattern is matched
(``re.search``) against the command as the shell will see its words (``"r"m -rf x`` is
``rm -rf x``); a program given as a path (``/bin/rm``, ``./x``) is matched by its base name and by its
full path. In allowlist mode both must be allowed; in blocklist mode either one refuses.

Refused in both modes, because no pattern can judge them: a program name decided at run time (a
variable, substitution, glob, brace or ANSI-C quoted word), a command substitution inside ``${…}``,
variables that make a program run other code (``PATH``, ``LD_PRELOAD``, ``GIT_SSH_COMMAND``,
``PAGER`` …, :data:`DANGEROUS_VARIABLE`) whether assigned, exported, ``read``, or a ``for`` loop's,
``git`` options and settings that run commands, ``hash -p`` and ``enable -f``, words naming a secret
path (see :mod:`kesoku.tools.paths`; ``~``, ``$HOME``, variables set earlier in the line, braces and
globs are expanded first, and a word decided at run time that names a secret folder is refused), files
sed reads or writes by name when secret or protected, and writes — redirections, ``tee``, ``find
-fprint``, sed's ``w`` or any other program's arguments — into shell start-up files, ``/etc`` and other
system folders, ``.git/hooks`` or ``.git/config``.

Refused in allowlist mode only: a line that does not parse (bashlex error, ``[[ ]]``, ``case``,
``$(( ))``, ``coproc``, nested backticks), ``$'…'`` and ``$"…"`` quoting, function definitions,
``eval``, ``source``/``.``, ``alias``, ``trap``; a shell without ``-c`` (it runs a script file or
standard input: ``echo rm x | sh``), ``su`` without ``-c`` and ``sudo -s``; awk programs that can run
commands or redirect (``system()``, ``|``, ``getline <``, ``print >``) and sed's ``e`` command and
``s///e``; wrapper options the policy does not know. Blocklist mode looks through ``eval``, ``alias``
and ``trap`` text instead, and matches an unparsable line's raw text.

In allowlist mode the wrappers themselves must be allowed too (``env``, ``timeout`` …; ``time`` is a
keyword, not a program), and a few builtins that run and write nothing pass without a pattern
(:data:`NEUTRAL_BUILTINS`: ``cd``, ``true``, ``test`` …).

Blocklist mode is a guard rail against accidents; only allowlist mode is a boundary, and only as
strong as its list: an allowed interpreter (``python``, ``node``, ``uv run python``) runs whatever its
script says, and the default allowlist holds ``python``.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kesoku.policy_parse import (
    Opaque,
    SimpleCommand,
    Unparsable,
    Word,
    find_exec,
    parse_line,
)
from kesoku.policy_paths import HOME_WRITE_PROTECTED, SYSTEM_WRITE_PROTECTED, PathJudge
from kesoku.policy_scripts import AWKS, ScriptEffects, awk_effects, sed_effects
from kesoku.policy_wrappers import Unclear, is_wrapper, unwrap
from kesoku.tools.paths import PathGates

if TYPE_CHECKING:
    from kesoku.config import ShellConfig

MAX_LINE_BYTES = 100_000
"""Longer lines are refused: parsing them would hold a thread for seconds."""

DANGEROUS_VARIABLE = re.compile(
    r"^(PATH|LD_\w+|DYLD_\w+|BASH_ENV|ENV|IFS|SHELLOPTS|BASHOPTS|PS4|PROMPT_COMMAND|BASH_FUNC_\S+|GCONV_PATH"
    r"|PERL5OPT|PERL5LIB|PERLLIB|RUBYOPT|NODE_OPTIONS|PYTHONSTARTUP|PYTHONINSPECT|PAGER|MANPAGER|SYSTEMD_PAGER"
    r"|GIT_PAGER|EDITOR|VISUAL|SUDO_EDITOR|LESSOPEN|LESSCLOSE|BROWSER|HOME|XDG_CONFIG_HOME|ZDOTDIR"
    r"|GIT_(?!AUTHOR_|COMMITTER_|TERMINAL_PROMPT$)\w+|KESOKU_\w+)$"
)
"""Variables that make a program load or run other code (a pager, an editor, a library, a shell rc)."""

_GIT_DANGEROUS_KEY = re.compile(
    r"^(alias\..*|core\.(pager|editor|sshcommand|fsmonitor|hookspath|gitproxy|askpass)|sequence\.editor"
    r"|pager\..*|diff\.external|.*\.(command|textconv|driver|helper|clean|smudge|process|program|cmd|path)"
    r"|gpg\..*|credential\..*|uploadpack\..*|receivepack\..*|include\..*|includeif\..*|url\..*|protocol\..*"
    r"|remote\..*\.(uploadpack|receivepack|proxy|vcs)|init\.templatedir|.*tool\..*|web\.browser|browser\..*)$",
    re.IGNORECASE,
)
_GIT_RUNNING_OPTIONS = (
    *("--exec", "--extcmd", "--upload-pack", "--receive-pack", "--config-env", "--exec-path", "--template"),
    *("--open-files-in-pager", "--sendmail-cmd", "--to-cmd", "--cc-cmd", "--smtp-server", "--httpd", "--browser"),
)
_GIT_RUNNING_SHORT = {"rebase": "-x", "difftool": "-x", "clone": "-u", "grep": "-O"}
_GIT_RUNNING_COMMANDS = {"filter-branch": None, "bisect": "run", "submodule": "foreach"}

READ_ONLY_PROGRAMS = frozenset(
    {
        *("cat", "head", "tail", "less", "more", "grep", "egrep", "fgrep", "rg", "ls", "wc", "file", "stat"),
        *("diff", "cmp", "md5sum", "sha1sum", "sha256sum", "sha512sum", "readlink", "realpath", "basename"),
        *("dirname", "du", "tree", "nl", "od", "xxd", "hexdump", "strings", "echo", "printf", "test", "["),
        *("cd", "pushd", "type", "which", "pwd", "true", "false", ":"),
    }
)
"""Programs whose arguments are only read: they may name start-up files and system folders."""
NEUTRAL_BUILTINS = frozenset({"cd", "pushd", "popd", "true", "false", ":", "test", "[", "exit", "wait"})
"""Builtins that run nothing and write nothing: in allowlist mode they pass without a pattern."""
_SETS_VARIABLES = frozenset({"read", "mapfile", "readarray", "getopts", "export", "declare", "typeset", "local"})
_GIT_WRITERS = frozenset({"clone", "init", "worktree", "archive", "format-patch", "bundle", "submodule"})
_FIND_WRITES = frozenset({"-fprint", "-fprint0", "-fprintf", "-fls"})
_DESTINATION_LAST = frozenset({"cp", "ln", "install"})
_WRITE_REDIRECTS = frozenset({">", ">>", ">|", "&>", "&>>", "<>", ">&"})


@dataclass(frozen=True, slots=True)
class PolicyDecision:
    """Whether a command line may run.

    Attributes:
        allowed: True when every simple command passed.
        reason: Why it was refused (for the model: names the command and the rule); empty when allowed.
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


def check_command(
    line: str,
    shell: ShellConfig,
    *,
    cwd: Path | None = None,
    workspace: Sequence[Path] = (),
    gates: PathGates | None = None,
) -> PolicyDecision:
    """Check a shell line against the policy.

    Args:
        line: The command line, as ``sh -c`` would run it.
        shell: ``mode`` and the pattern lists.
        cwd: Where the line runs (relative paths in it); None: the current directory.
        workspace: Folders the line may write freely (paths inside them are not "system" paths).
        gates: Kesoku's own files and the home folder, for the secret-path rules.

    Returns:
        The decision; a refusal's reason names the offending simple command and the rule.

    Note:
        This reads the file system (``realpath``, glob expansion of words): call it through
        ``trio.to_thread`` from async code.
    """
    checker = _Checker(shell, cwd, workspace, gates)
    try:
        checker.hygiene(line)
        checker.line(line, depth=0)
    except _Refusal as refusal:
        return checker.refused(refusal)
    return PolicyDecision(True, commands=tuple(checker.checked))


def check_argv(
    argv: Sequence[str],
    shell: ShellConfig,
    *,
    cwd: Path | None = None,
    workspace: Sequence[Path] = (),
    gates: PathGates | None = None,
) -> PolicyDecision:
    """Check a command run without a shell (``shell.use_shell = false``): argv is executed as is.

    Args:
        argv: The program and its arguments.
        shell: ``mode`` and the pattern lists.
        cwd: Where it runs.
        workspace: Folders it may write freely.
        gates: For the secret-path rules.

    Returns:
        The decision, as :func:`check_command`; wrappers and ``sh -c`` text are looked through.
    """
    checker = _Checker(shell, cwd, workspace, gates)
    try:
        for arg in argv:
            checker.hygiene(arg)
        if not argv:
            raise _Refusal(None, "empty", "the command is empty")
        # No shell runs: nothing is expanded, so an argument is exactly its text (a glob is literal).
        words = [Word(a, True, a) for a in argv[1:]]
        program = Word.plain(argv[0])
        checker.run(shlex.join(argv), [program, *words], depth=0, bases=[checker.cwd], unknown_cd=False)
    except _Refusal as refusal:
        return checker.refused(refusal)
    return PolicyDecision(True, commands=tuple(checker.checked))


class _Checker:
    def __init__(
        self, shell: ShellConfig, cwd: Path | None, workspace: Sequence[Path], gates: PathGates | None
    ) -> None:
        self.allowlist = shell.mode == "allowlist"
        self.key = "allowlist_patterns" if self.allowlist else "blocklist_patterns"
        raw = shell.allowlist_patterns if self.allowlist else shell.blocklist_patterns
        self.patterns = [re.compile(p) for p in raw]
        self.cwd = Path(os.path.abspath(cwd if cwd is not None else os.getcwd()))
        self.paths = PathJudge(gates if gates is not None else PathGates(), self.cwd, workspace)
        self.variables = self.paths.variables  # what the line assigns, for the paths its words name
        self.checked: list[str] = []

    def refused(self, refusal: _Refusal) -> PolicyDecision:
        mode = "allowlist" if self.allowlist else "blocklist"
        reason = f"refused by the shell policy ({mode} mode): {refusal.detail}"
        return PolicyDecision(False, reason, refusal.command, refusal.rule)

    # -- the line ---------------------------------------------------------------------------------

    def hygiene(self, line: str) -> None:
        if not line.strip():
            raise _Refusal(None, "empty", "the command is empty")
        if len(line.encode("utf-8", errors="surrogatepass")) > MAX_LINE_BYTES:
            raise _Refusal(None, "too-long", f"the command is longer than {MAX_LINE_BYTES} bytes")
        bad = next((c for c in line if (ord(c) < 32 and c not in "\t\n") or ord(c) == 127), None)
        if bad is not None:
            # NUL cuts an argument short and \r hides text in a terminal: what is shown is not what runs.
            raise _Refusal(None, "control-character", f"the command holds the control character {bad!r}")

    def line(self, line: str, depth: int) -> None:
        try:
            items = parse_line(line, depth=depth)
        except Unparsable as exc:
            if self.allowlist:
                raise _Refusal(
                    line,
                    "unparsable",
                    f"the command cannot be parsed with confidence ({exc}); use plain commands, pipes, "
                    "&&, ||, ; and redirections",
                ) from None
            self.unparsed(line)
            return
        commands = [item for item in items if isinstance(item, SimpleCommand)]
        for command in commands:
            # Static values given to variables in the line, so `d=~/.ssh; cat $d/id_rsa` is judged.
            for assignment in command.assignments:
                if assignment.static and "=" in assignment.text:
                    name, _, value = assignment.text.partition("=")
                    self.variables[name] = value
        bases, unknown_cd = self.bases(commands)
        for item in items:
            if isinstance(item, Opaque):
                self.opaque(item)
            else:
                self.simple(item, depth, bases, unknown_cd)

    def unparsed(self, line: str) -> None:
        """Blocklist mode, a line bashlex cannot parse: match its text, also with quotes removed."""
        for text in (line, re.sub(r"[\"'\\]", "", line)):
            self.match_blocklist(text, line)
        self.checked.append(line)

    def opaque(self, item: Opaque) -> None:
        if item.kind == "function":
            if self.allowlist:
                raise _Refusal(item.source, "function", f"`{item.source}` defines a shell function")
            return
        if item.kind == "expansion":
            detail = f"`{item.source}` hides a command the policy cannot check"
            raise _Refusal(item.source, "hidden-substitution", detail)
        raise _Refusal(item.source, "unsupported", f"`{item.source}` is a construct the policy cannot check")

    def bases(self, commands: list[SimpleCommand]) -> tuple[list[Path], bool]:
        """The folders a relative path may be relative to, following the line's ``cd`` commands."""
        targets: list[str] = []
        unknown = False
        for command in commands:
            if not command.words or command.words[0].text not in ("cd", "pushd"):
                continue
            operands = [w for w in command.words[1:] if not (w.static and w.text.startswith("-"))]
            if not operands:
                targets.append("~")
            elif operands[0].static:
                targets.append(operands[0].text)
            else:
                unknown = True
        bases = [self.cwd]
        for _ in range(2):
            for target in targets:
                for base in list(bases):
                    folder = Path(os.path.normpath(base / self.paths.expand_tilde(target)))
                    if folder not in bases and len(bases) < 16:
                        bases.append(folder)
        return bases, unknown

    # -- one simple command -----------------------------------------------------------------------

    def simple(self, command: SimpleCommand, depth: int, bases: list[Path], unknown_cd: bool) -> None:
        source = command.source
        for assignment in command.assignments:
            self.assignment(assignment.raw, source)
        for operand in command.operands:
            self.path_word(operand, source, bases, unknown_cd, write=False, strict=False)
        for redirect in command.redirects:
            if redirect.target is None or (redirect.op == ">&" and redirect.target.text.isdigit()):
                continue
            self.path_word(redirect.target, source, bases, unknown_cd, write=redirect.op in _WRITE_REDIRECTS)
        if command.words:
            self.run(source, list(command.words), depth, bases, unknown_cd)

    def run(self, source: str, words: list[Word], depth: int, bases: list[Path], unknown_cd: bool) -> None:
        """Check a command about to be executed: its program, its arguments, and what it runs in turn."""
        program = words[0]
        shown = " ".join(w.text for w in words)
        if not program.static or not program.text or any(c.isspace() for c in program.text):
            raise _Refusal(
                source,
                "dynamic-program",
                f"`{source}` runs a program whose name `{program.raw or program.text}` is decided at run time "
                "(a variable, substitution, glob, brace or $'…' quoting); write the program name literally",
            )
        quoted = next((w for w in words if w.ansi_c), None)
        if quoted is not None and self.allowlist:
            detail = f"`{source}` uses $'…' or $\"…\" quoting (`{quoted.raw}`), which is not parsed with confidence"
            raise _Refusal(source, "unparsable", detail)
        name = self.paths.expand_tilde(program.text) if program.tilde else program.text
        base = name.rsplit("/", 1)[-1]
        args = words[1:]
        self.builtin(base, args, shown, depth)
        if not (self.allowlist and name in NEUTRAL_BUILTINS):
            self.match(name, base, [w.text for w in args], shown)
        self.checked.append(shown)
        self.arguments(base, args, shown, bases, unknown_cd)
        if base == "git":
            self.git(args, shown)
        if base == "find":
            for executed in find_exec(args):
                self.run(shown, executed, depth, bases, unknown_cd)
        if base in AWKS or base == "sed":
            self.script(base, args, shown, bases, unknown_cd)
        if is_wrapper(base):
            try:
                inner = unwrap(base, args)
            except Unclear as exc:
                raise _Refusal(shown, "wrapper", f"cannot tell what `{shown}` runs: {exc}") from None
            if inner.unchecked is not None and self.allowlist:
                raise _Refusal(shown, "wrapper", f"`{shown}`: {inner.unchecked}, which the policy cannot check")
            for assignment in inner.assignments:
                self.assignment(assignment.text, shown)
            for script in inner.scripts:
                self.hygiene(script)
                self.line(script, depth + 1)
            if inner.argv:
                self.run(shown, inner.argv, depth, bases, unknown_cd)

    def match(self, name: str, base: str, args: list[str], shown: str) -> None:
        texts = [" ".join([name, *args])]
        if "/" in name:
            if not base:
                raise _Refusal(shown, "dynamic-program", f"`{shown}` names a folder as its program")
            texts.append(" ".join([base, *args]))
        if not self.allowlist:
            for text in texts:
                self.match_blocklist(text, shown)
            return
        for text in texts:
            if not any(p.search(text) for p in self.patterns):
                why = "matches none of shell.allowlist_patterns"
                if len(texts) > 1:
                    why += f" (a program given as a path must be allowed both as `{base}` and as `{name}`)"
                raise _Refusal(shown, "allowlist", f"`{text}` {why}")

    def match_blocklist(self, text: str, shown: str) -> None:
        for i, pattern in enumerate(self.patterns):
            if pattern.search(text):
                raise _Refusal(
                    shown,
                    f"blocklist[{i}]",
                    f"`{text}` matches shell.blocklist_patterns[{i}] {pattern.pattern!r}",
                )

    def assignment(self, text: str, shown: str) -> None:
        name = text.partition("=")[0].lstrip("'\"")
        if DANGEROUS_VARIABLE.match(name):
            raise _Refusal(
                shown,
                "variable",
                f"`{shown}` sets {name}, which can make a program run other code; set it in the daemon's environment",
            )

    def script(self, base: str, args: list[Word], shown: str, bases: list[Path], unknown_cd: bool) -> None:
        """Awk and sed programs: running commands is refused in allowlist mode; files they name are checked."""
        try:
            effects = awk_effects(args) if base in AWKS else sed_effects(args)
        except Unclear as exc:
            if self.allowlist:
                raise _Refusal(shown, "interpreter", f"cannot tell what `{shown}` does: {exc}") from None
            effects = ScriptEffects()
        if effects.runs is not None and self.allowlist:
            raise _Refusal(shown, "interpreter", f"`{shown}`: {effects.runs}")
        for name in effects.reads:
            self.path_word(Word.plain(name), shown, bases, unknown_cd, write=False)
        for name in effects.writes:
            self.path_word(Word.plain(name), shown, bases, unknown_cd, write=True)

    def builtin(self, base: str, args: list[Word], shown: str, depth: int) -> None:
        """Builtins that run or redefine commands from text: refused in allowlist mode, looked through otherwise."""
        texts = [w.text for w in args]
        if base in ("eval", "source", ".", "alias", "trap") and self.allowlist:
            raise _Refusal(shown, base, f"`{shown}`: {base} runs or defines commands the policy cannot check")
        if base in _SETS_VARIABLES or (base == "printf" and "-v" in texts):
            # `read PATH`, `printf -v PATH`, `export PATH=…`: each names a variable it sets.
            for text in texts:
                if not text.startswith("-"):
                    self.assignment(text if "=" in text else text + "=", shown)
        if (base == "hash" and any(t.startswith("-") and "p" in t for t in texts)) or (
            base == "enable" and any(t.startswith("-") and "f" in t for t in texts)
        ):
            raise _Refusal(shown, base, f"`{shown}` redefines what a command name runs")
        if base == "eval":
            if not all(w.static for w in args):
                raise _Refusal(shown, "eval", f"`{shown}`: eval of text decided at run time cannot be checked")
            self.line(" ".join(texts), depth + 1)
        elif base == "alias":
            for text in texts:
                if "=" in text:
                    self.line(text.partition("=")[2], depth + 1)
        elif base == "trap":
            operands = [t for t in texts if not t.startswith("-")]
            if len(operands) >= 2:
                self.line(operands[0], depth + 1)

    def git(self, args: list[Word], shown: str) -> None:
        texts = [w.text for w in args]
        for i, text in enumerate(texts):
            key = None
            if text == "-c" and i + 1 < len(texts):
                key = texts[i + 1].partition("=")[0]
            elif text.startswith("-c") and len(text) > 2 and texts[0:i].count("-c") == 0:
                key = text[2:].partition("=")[0]
            if key is not None and _GIT_DANGEROUS_KEY.match(key):
                raise _Refusal(shown, "git", f"`{shown}`: the git setting {key} can run commands")
            if any(text == o or text.startswith(o + "=") for o in _GIT_RUNNING_OPTIONS):
                raise _Refusal(shown, "git", f"`{shown}`: git option {text.partition('=')[0]} runs commands")
        operands = [t for t in texts if not t.startswith("-")]
        for command, sub in _GIT_RUNNING_COMMANDS.items():
            if command in operands and (sub is None or sub in operands):
                raise _Refusal(shown, "git", f"`{shown}`: git {command} {sub or ''} runs commands".replace("  ", " "))
        for command, short in _GIT_RUNNING_SHORT.items():
            if command in operands and any(t.startswith(short) for t in texts):
                raise _Refusal(shown, "git", f"`{shown}`: git {command} {short} runs commands")
        if "instaweb" in operands:
            raise _Refusal(shown, "git", f"`{shown}`: git instaweb runs a web server and a browser")
        if "config" in operands:
            for text in texts[texts.index("config") + 1 :]:
                if not text.startswith("-") and _GIT_DANGEROUS_KEY.match(text.partition("=")[0]):
                    raise _Refusal(shown, "git", f"`{shown}`: the git setting {text} can run commands")

    # -- paths --------------------------------------------------------------------------------------

    def arguments(self, base: str, args: list[Word], shown: str, bases: list[Path], unknown_cd: bool) -> None:
        """Arguments naming secrets are refused; naming protected files too, unless the program only reads."""
        writes = not _reads_only(base, [w.text for w in args])
        operands = [w for w in args if not w.text.startswith("-")]
        for word in args:
            write = writes and (base not in _DESTINATION_LAST or (bool(operands) and word is operands[-1]))
            candidates = [word]
            if word.static and "=" in word.text:
                candidates.append(Word.plain(word.text.partition("=")[2]))
            elif "=" in word.raw:  # --output=$HOME/x: the value after = is a path of its own
                value = word.raw.partition("=")[2]
                candidates.append(Word(value, False, value, glob=word.glob, brace=word.brace))
            elif word.static and word.text.startswith("-") and "/" in word.text:
                continue  # an option like -I/usr/include names no file to write
            for candidate in candidates:
                self.path_word(candidate, shown, bases, unknown_cd, write=write, strict=False)
        if base == "tee":
            for word in operands:
                self.path_word(word, shown, bases, unknown_cd, write=True)
        if base == "find":
            for option, target in itertools.pairwise(args):
                if option.text in _FIND_WRITES:
                    self.path_word(target, shown, bases, unknown_cd, write=True)

    def path_word(
        self, word: Word, shown: str, bases: list[Path], unknown_cd: bool, *, write: bool, strict: bool = True
    ) -> None:
        paths = self.paths.candidates(word, bases)
        if paths is None:
            fragment = self.paths.secret_fragment(word)
            if fragment is not None:
                detail = f"`{shown}` names `{fragment}`, a secret location, through a word decided at run time"
                raise _Refusal(shown, "secret-path", detail)
            if strict and write and self.allowlist:
                raise _Refusal(shown, "dynamic-target", f"`{shown}` writes to a file named at run time ({word.raw})")
            return
        if strict and write and unknown_cd and not word.text.startswith(("/", "~")):
            detail = f"`{shown}` writes to a relative path after a cd the policy cannot follow"
            raise _Refusal(shown, "dynamic-target", detail)
        for path in paths:
            reason = self.paths.secrets.reason(path)
            if reason is not None:
                raise _Refusal(shown, "secret-path", f"`{shown}` names {path}: {reason}")
            if write:
                why = self.paths.protected(path)
                if why is not None:
                    raise _Refusal(shown, "protected-path", f"`{shown}` writes to {path}: {why}")


def _reads_only(base: str, args: list[str]) -> bool:
    """Whether a program only reads the files its arguments name."""
    if base in READ_ONLY_PROGRAMS or base in ("jq", "cut", "tr", "column", *AWKS):
        return True
    if base == "find":
        return "-delete" not in args
    if base == "git":
        return not any(a in _GIT_WRITERS or a.startswith("--output") for a in args)
    if base == "sed":
        return not any(
            a.startswith("--in-place") or (a.startswith("-") and not a.startswith("--") and "i" in a) for a in args
        )
    if base == "sort":
        return not any(a.startswith(("-o", "--output")) for a in args)
    return False


__all__ = [
    "DANGEROUS_VARIABLE",
    "HOME_WRITE_PROTECTED",
    "MAX_LINE_BYTES",
    "READ_ONLY_PROGRAMS",
    "SYSTEM_WRITE_PROTECTED",
    "PolicyDecision",
    "check_argv",
    "check_command",
]
