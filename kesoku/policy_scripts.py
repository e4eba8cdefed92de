"""Script languages that can run commands or write files: what an awk or sed script will do.

:func:`awk_effects` and :func:`sed_effects` read a program's options the way it does, find its script
(inline or in a file) and report, as :class:`ScriptEffects`, whether it can run commands and which
files it reads or writes by name. A script the policy cannot read raises
:class:`~kesoku.policy_wrappers.Unclear`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kesoku.policy_parse import Word
from kesoku.policy_wrappers import Unclear, option_value, static_text

AWKS = frozenset({"awk", "gawk", "mawk", "nawk"})
"""awk implementations: ``system()``, pipes and ``getline`` run commands from the program text."""

_AWK_RUNS = re.compile(r"\bsystem\s*\(|\||@(load|include)\b|\bgetline\b[^;{}\n]*<|\bprintf?\b[^;{}\n]*>")
_AWK_VALUE = frozenset({"-F", "-v", "--field-separator", "--assign"})
_AWK_FILES = frozenset({"-f", "--file", "-E", "--exec", "-i", "--include", "-l", "--load"})
_AWK_FLAGS = frozenset({"--posix", "--traditional", "--lint", "-b", "-c", "-P", "-O", "-r", "--re-interval"})


@dataclass(slots=True)
class ScriptEffects:
    """What an awk or sed program does beyond filtering text.

    Attributes:
        runs: Why it can run a command (``system()``, sed's ``e``), or None.
        reads: Files it reads by name from inside its program (sed ``r``/``R``).
        writes: Files it writes by name from inside its program (sed ``w``/``W``, ``s///w``).
    """

    runs: str | None = None
    reads: list[str] = field(default_factory=list)
    writes: list[str] = field(default_factory=list)


def awk_effects(args: list[Word]) -> ScriptEffects:
    """Read an awk command line: does its program run commands or redirect output?

    Raises:
        Unclear: The program comes from a file, or an option is unknown or decided at run time.
    """
    programs: list[str] = []
    i = 0
    while i < len(args):
        text = static_text(args[i], "awk")
        option = text.partition("=")[0]
        if text == "--":
            i += 1
            break
        if not text.startswith("-") or text == "-":
            break
        if option in ("-S", "--sandbox"):
            return ScriptEffects()  # gawk's sandbox turns system(), pipes and redirections off
        if option in _AWK_FILES or text[:2] in _AWK_FILES:
            raise Unclear(f"`awk {text}` reads its program from a file the policy cannot check")
        if option in ("-e", "--source") or text[:2] == "-e":
            programs.append(text[2:] if text[:2] == "-e" and len(text) > 2 else option_value(args, i, "awk", option))
            i += 1 if (text[:2] == "-e" and len(text) > 2) else 2
        elif option in _AWK_VALUE or text[:2] in _AWK_VALUE:
            i += 1 if ("=" in text and option.startswith("--")) or (len(text) > 2 and text[1] != "-") else 2
        elif option in _AWK_FLAGS:
            i += 1
        else:
            raise Unclear(f"`awk` option `{text}` is not known to the policy")
    if not programs and i < len(args):
        programs.append(static_text(args[i], "awk"))
    for program in programs:
        if _AWK_RUNS.search(program):
            return ScriptEffects(runs="its program can run commands or write files (system(), |, getline <, > or >>)")
    return ScriptEffects()


_SED_FLAGS = frozenset("nErsuzb")
_SED_LONG_FLAGS = frozenset(
    {"--quiet", "--silent", "--regexp-extended", "--separate", "--unbuffered", "--null-data", "--posix"}
    | {"--debug", "--sandbox", "--follow-symlinks", "--binary"}
)


def sed_effects(args: list[Word]) -> ScriptEffects:
    """Read a sed command line (GNU sed): which files its script reads or writes, and whether it runs commands.

    Raises:
        Unclear: The script comes from a file, holds a command the policy does not know, or an
            option is unknown or decided at run time.
    """
    scripts: list[str] = []
    i = 0
    while i < len(args):
        text = static_text(args[i], "sed")
        option = text.partition("=")[0]
        i += 1
        if text == "--":
            break
        if not text.startswith("-") or text == "-":
            i -= 1
            break
        if option in ("--expression", "--file", "--line-length", "--in-place") or text in _SED_LONG_FLAGS:
            if option == "--file":
                raise Unclear("`sed --file` reads its script from a file the policy cannot check")
            if option == "--expression":
                scripts.append(text.partition("=")[2] if "=" in text else option_value(args, i - 1, "sed", option))
                i += 0 if "=" in text else 1
            elif option == "--line-length" and "=" not in text:
                i += 1
            continue
        if text.startswith("--"):
            raise Unclear(f"`sed` option `{text}` is not known to the policy")
        for j, letter in enumerate(text[1:], start=1):
            rest = text[j + 1 :]
            if letter == "f":
                raise Unclear("`sed -f` reads its script from a file the policy cannot check")
            if letter in "el":
                value = rest or option_value(args, i - 1, "sed", "-" + letter)
                i += 0 if rest else 1
                if letter == "e":
                    scripts.append(value)
                break
            if letter == "i":
                break  # -i[SUFFIX]: the rest of the word is the backup suffix
            if letter not in _SED_FLAGS:
                raise Unclear(f"`sed` option `-{letter}` is not known to the policy")
    if not scripts and i < len(args):
        scripts.append(static_text(args[i], "sed"))
    effects = ScriptEffects()
    for script in scripts:
        _sed_scan(script, effects)
    return effects


def _sed_delimited(script: str, i: int, delimiter: str) -> int:
    """The index after the next unescaped ``delimiter`` from ``i``."""
    while i < len(script):
        if script[i] == "\\":
            i += 2
            continue
        if script[i] == delimiter:
            return i + 1
        i += 1
    raise Unclear("the sed script has an unterminated expression")


def _sed_line_end(script: str, i: int) -> int:
    end = script.find("\n", i)
    return len(script) if end < 0 else end


def _sed_scan(script: str, effects: ScriptEffects) -> None:
    """Walk a sed script command by command (GNU sed's grammar) and note what it runs, reads and writes."""
    i = 0
    while i < len(script):
        c = script[i]
        if c in " \t\n;{}!":
            i += 1
        elif c == "#":
            i = _sed_line_end(script, i)
        elif c == "/":
            i = _sed_delimited(script, i + 1, "/")
            while i < len(script) and script[i] in "IM":  # regex address flags
                i += 1
        elif c == "\\" and i + 1 < len(script):
            i = _sed_delimited(script, i + 2, script[i + 1])
        elif c.isdigit() or c in "$,~+":
            i += 1
        elif c in "aic":  # text to the end of the line (a backslash-newline continues it)
            while True:
                i = _sed_line_end(script, i)
                if i > 0 and script[i - 1] == "\\" and i < len(script):
                    i += 1
                    continue
                break
        elif c in ":btTv":
            while i < len(script) and script[i] not in ";\n":
                i += 1
        elif c in "rRwW":
            end = _sed_line_end(script, i + 1)
            name = script[i + 1 : end].strip()
            (effects.reads if c in "rR" else effects.writes).append(name)
            i = end
        elif c == "e":
            effects.runs = "sed's e command runs a shell command"
            return
        elif c in "sy":
            if i + 1 >= len(script):
                raise Unclear("the sed script ends inside an s or y command")
            delimiter = script[i + 1]
            i = _sed_delimited(script, _sed_delimited(script, i + 2, delimiter), delimiter)
            while c == "s" and i < len(script) and script[i] not in ";\n}":
                if script[i] == "e":
                    effects.runs = "the s///e flag runs the result as a shell command"
                    return
                if script[i] == "w":
                    end = _sed_line_end(script, i + 1)
                    effects.writes.append(script[i + 1 : end].strip())
                    i = end
                    break
                i += 1
        elif c in "=dDgGhHnNpPxzFlLqQ":
            i += 1
        else:
            raise Unclear(f"the sed command `{c}` is not known to the policy")


__all__ = ["AWKS", "ScriptEffects", "awk_effects", "sed_effects"]
