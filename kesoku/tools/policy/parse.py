"""The shell command line as the policy sees it: every simple command, found by a real parser.

:func:`parse_line` runs bashlex (a port of bash's own grammar) and walks the whole tree: lists,
pipelines, subshells, ``{ }`` groups, ``if``/``for``/``while``/``until``, function bodies, command
and process substitutions at any depth, assignment values, redirection targets and here-documents.
It returns flat :class:`SimpleCommand` records; what bashlex cannot represent faithfully is
reported, never guessed:

- a parse error or a construct bashlex does not implement (``[[ ]]``, ``case``, ``$(( ))``, arrays,
  ``select``, ``coproc``) raises :class:`Unparsable`;
- a ``${...}`` expansion holding a command substitution (bashlex does not parse inside it), a node
  kind this module does not know, or a function definition are returned as :class:`Opaque` items.

Two gaps of bashlex 0.18 are closed here: a here-document with a quoted delimiter (``<<'EOF'``)
fails to parse (its delimiter is compared with the quotes still on; patched below), and the ``time``
keyword is not implemented (its tokens are replaced by a placeholder word of the same length, so
the policy sees ``time`` as a wrapper command and positions stay valid).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kesoku.tools.policy.tables import import_bashlex_parser

# before `import bashlex`: Kesoku's prebuilt tables instead of a ~200 ms build
import_bashlex_parser()

import bashlex  # type: ignore[import-untyped]  # noqa: E402
import bashlex.heredoc  # type: ignore[import-untyped]  # noqa: E402
import bashlex.parser  # type: ignore[import-untyped]  # noqa: E402
import bashlex.tokenizer  # type: ignore[import-untyped]  # noqa: E402

TIME_PLACEHOLDER = "\x01" * len("time")
"""Stands for the ``time`` keyword; lines with control characters are refused before parsing."""

MAX_DEPTH = 8
"""Nesting of ``sh -c``, ``eval`` and here-documents followed before a line is refused."""

_SUBSTITUTION_KINDS = frozenset({"commandsubstitution", "processsubstitution"})
_SUBSTITUTION_TEXT = re.compile(r"\$\(|`|<\(|>\(")


class Unparsable(Exception):
    """The line cannot be parsed with confidence; the message says why."""


@dataclass(frozen=True, slots=True)
class Word:
    """One shell word.

    Attributes:
        text: The word after quote removal (``"r"m`` is ``rm``); for a dynamic word, its source
            text.
        static: True when the shell will see exactly ``text``: no parameter, substitution, ANSI-C or
            locale quoting (``$'…'``, ``$"…"``), glob or brace pattern decides its value.
        raw: The source text of the word.
    """

    text: str
    static: bool = True
    raw: str = ""

    @classmethod
    def plain(cls, text: str) -> Word:
        """A word from a string already split (no shell expands it), judged by its text alone."""
        return cls(text, True, text)


@dataclass(frozen=True, slots=True)
class SimpleCommand:
    """One simple command: assignments, then words (program first).

    Attributes:
        assignments: ``NAME=value`` words before the program.
        words: The program and its arguments; empty for an assignment or a redirection alone.
        source: The command's source text, for messages.
        heredoc: The body of a here-document given to it as standard input, if any.
    """

    assignments: tuple[Word, ...] = ()
    words: tuple[Word, ...] = ()
    source: str = ""
    heredoc: str | None = None


@dataclass(frozen=True, slots=True)
class Opaque:
    """Something in the line whose effect cannot be checked.

    Attributes:
        kind: ``function`` (a function definition), ``expansion`` (a substitution inside
            ``${…}``) or ``node`` (a node kind this module does not know).
        source: Its source text.
    """

    kind: str
    source: str


Item = SimpleCommand | Opaque


@dataclass
class _Walker:
    line: str
    depth: int
    items: list[Item] = field(default_factory=list)

    def slice(self, node: Any) -> str:
        start, end = node.pos
        return self.line[start:end].replace(TIME_PLACEHOLDER, "time")

    def visit(self, node: Any) -> None:
        kind = node.kind
        if kind in ("list", "pipeline"):
            for part in node.parts:
                self.visit(part)
        elif kind in ("operator", "pipe", "reservedword", "tilde"):
            return
        elif kind == "compound":
            for part in node.list:
                self.visit(part)
            for redirect in getattr(node, "redirects", ()) or ():
                self.redirect(redirect)
        elif kind == "for":
            self.for_loop(node)
        elif kind in ("if", "while", "until"):
            for part in node.parts:
                self.visit(part)
        elif kind == "function":
            self.items.append(Opaque("function", self.slice(node)))
            for part in node.parts:
                if part.kind == "compound":
                    self.visit(part)
        elif kind == "command":
            self.command(node)
        elif kind in ("word", "assignment"):
            self.word(node)
        elif kind in _SUBSTITUTION_KINDS:
            self.visit(node.command)
        elif kind == "parameter":
            self.parameter(node)
        else:
            self.items.append(Opaque("node", f"{kind}: {self.slice(node)}"))

    def for_loop(self, node: Any) -> None:
        """``for NAME in WORDS; do …``: the words' substitutions run, then the body."""
        for part in list(node.parts)[2:]:
            if part.kind == "word":
                self.word(part)
            elif part.kind != "reservedword":
                self.visit(part)

    def parameter(self, node: Any) -> None:
        value = getattr(node, "value", None) or ""
        if _SUBSTITUTION_TEXT.search(value):
            # bashlex keeps ${x:-$(cmd)} as text: the command inside is never parsed, so never
            # checked.
            self.items.append(Opaque("expansion", "${" + value + "}"))

    def word(self, node: Any) -> Word:
        dynamic = False
        for part in getattr(node, "parts", ()) or ():
            if part.kind in _SUBSTITUTION_KINDS:
                dynamic = True
                self.visit(part)
            elif part.kind == "parameter":
                dynamic = True
                self.parameter(part)
            elif part.kind != "tilde":
                self.visit(part)
        raw = self.slice(node)
        text = node.word.replace(TIME_PLACEHOLDER, "time")
        static = not (dynamic or _has_glob(text) or _has_brace(text) or _has_ansi_c(raw))
        return Word(text if static else raw, static, raw)

    def redirect(self, node: Any) -> str | None:
        """Visit a redirection's target (substitutions in it run); return a here-document's body."""
        target = node.output
        heredoc = getattr(node, "heredoc", None)
        if heredoc is not None and node.type in ("<<", "<<-"):
            delimiter = self.slice(target) if hasattr(target, "pos") else ""
            if not _is_quoted(delimiter):
                self.heredoc_body(heredoc.value)
            body, _, last = str(heredoc.value).rstrip("\n").rpartition("\n")
            # bashlex keeps the closing delimiter as the document's last line.
            return body if last.lstrip("\t") == _unquoted(delimiter) else str(heredoc.value)
        if hasattr(target, "kind") and target.kind == "word":
            self.word(target)
        return None

    def heredoc_body(self, body: str) -> None:
        """Parse an unquoted here-document as a double-quoted word.

        An unquoted here-document expands ``$(…)`` and backticks.
        """
        if not _SUBSTITUTION_TEXT.search(body) and "${" not in body:
            return
        if self.depth >= MAX_DEPTH:
            raise Unparsable("here-documents nested too deeply")
        quoted = ": " + '"' + _as_double_quoted(body) + '"'
        for item in parse_line(quoted, depth=self.depth + 1):
            if isinstance(item, SimpleCommand) and item.words and item.words[0].text == ":":
                continue  # the carrier ':' itself
            self.items.append(item)

    def command(self, node: Any) -> None:
        assignments: list[Word] = []
        words: list[Word] = []
        heredoc: str | None = None
        after_time = False
        for part in node.parts:
            # The `time` keyword (and its -p) times the pipeline; it is no program to match.
            keyword = part.kind == "word" and not words and not assignments
            if keyword and (part.word == TIME_PLACEHOLDER or (after_time and part.word == "-p")):
                after_time = True
                continue
            if part.kind == "assignment" and not words:
                assignments.append(self.word(part))
            elif part.kind in ("word", "assignment"):
                words.append(self.word(part))
            elif part.kind == "redirect":
                heredoc = self.redirect(part) or heredoc
            else:
                self.visit(part)
        self.items.append(
            SimpleCommand(tuple(assignments), tuple(words), self.slice(node), heredoc)
        )


def _has_glob(text: str) -> bool:
    return any(c in text for c in "*?[")


def _has_brace(text: str) -> bool:
    return "{" in text and "}" in text and ("," in text or ".." in text)


def _has_ansi_c(raw: str) -> bool:
    """Whether a word's source holds ``$'…'`` or ``$"…"`` outside quotes.

    ``'$'`` and ``"$'"`` do not.
    """
    quote = ""
    i = 0
    while i < len(raw):
        c = raw[i]
        if quote == "'":
            quote = "" if c == "'" else quote
        elif c == "\\":
            i += 1
        elif quote == '"':
            quote = "" if c == '"' else quote
        elif c == "$" and raw[i + 1 : i + 2] in ("'", '"'):
            return True
        elif c in "'\"":
            quote = c
        i += 1
    return False


def _unquoted(delimiter: str) -> str:
    """A here-document delimiter as bash compares it: quotes and backslashes removed."""
    return re.sub(r"\\(.)", r"\1", delimiter.replace("'", "").replace('"', ""))


def _is_quoted(delimiter: str) -> bool:
    return any(c in delimiter for c in "'\"\\")


def _as_double_quoted(body: str) -> str:
    r"""Rewrite a here-document body as the inside of a double-quoted word with the same expansions.

    Both expand ``$``, backticks and backslash before ``$``, backtick, backslash and newline; they
    differ on ``"``, literal in a here-document: it is escaped, and ``\"`` keeps its backslash.
    """
    out: list[str] = []
    i = 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            out.append('\\\\\\"' if nxt == '"' else c + nxt)
            i += 2
            continue
        out.append('\\"' if c == '"' else c)
        i += 1
    return "".join(out)


def _replace_time_keywords(line: str) -> str:
    """Put :data:`TIME_PLACEHOLDER` where the tokenizer sees the ``time`` keyword."""
    tokens = bashlex.parser._parser(line).tok
    spans = [(t.lexpos, t.endlexpos) for t in tokens if t.ttype == bashlex.tokenizer.tokentype.TIME]
    for start, end in reversed(spans):
        if line[start:end] == "time":
            line = line[:start] + TIME_PLACEHOLDER + line[end:]
    return line


def _bashlex_parse(line: str) -> list[Any]:
    try:
        return list(bashlex.parse(line))
    except NotImplementedError as exc:
        if "time command" not in str(exc):
            raise
    return list(bashlex.parse(_replace_time_keywords(line)))


def parse_line(line: str, *, depth: int = 0) -> list[Item]:
    """Find every simple command of a shell line.

    Args:
        line: The command line (control characters other than tab and newline are the caller's to
            refuse).
        depth: How deep in ``sh -c`` strings and here-documents this line is.

    Returns:
        The simple commands, in source order (a substitution's commands come before the command
        whose word holds it), and :class:`Opaque` items for what cannot be checked.

    Raises:
        Unparsable: bashlex cannot parse the line or does not implement one of its constructs.
    """
    if depth > MAX_DEPTH:
        raise Unparsable(f"commands nested more than {MAX_DEPTH} levels deep")
    if not line.strip():
        return []
    try:
        trees = _bashlex_parse(line)
    except NotImplementedError as exc:
        raise Unparsable(f"unsupported shell construct ({_short(exc)})") from None
    except RecursionError:
        raise Unparsable("nested too deeply") from None
    except Exception as exc:  # bashlex raises ParsingError, but also AssertionError, IndexError …
        raise Unparsable(_short(exc)) from None
    walker = _Walker(line, depth)
    for tree in trees:
        walker.visit(tree)
    return walker.items


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]


def iter_commands(items: list[Item]) -> Iterator[SimpleCommand]:
    """The simple commands among parsed items."""
    return (item for item in items if isinstance(item, SimpleCommand))


def _patch_quoted_heredoc_delimiter() -> None:
    """Bashlex 0.18 compares a here-document's lines with its delimiter before quote removal.

    ``cat <<'EOF'`` then waits for a line reading ``'EOF'`` and fails at the end of the input. The
    delimiter is given to bashlex's ``makeheredoc`` with its quotes removed, as bash does; the
    quoting is read again from the source by :meth:`_Walker.redirect` (a quoted delimiter means the
    body is not expanded).
    """
    original: Callable[..., Any] = bashlex.heredoc.makeheredoc
    if getattr(original, "_kesoku_patched", False):
        return

    def makeheredoc(tokenizer: Any, redirnode: Any, lineno: int, killleading: bool) -> Any:
        word = redirnode.output.word
        unquoted = _unquoted(word)
        if unquoted == word:
            return original(tokenizer, redirnode, lineno, killleading)
        redirnode.output.word = unquoted
        try:
            return original(tokenizer, redirnode, lineno, killleading)
        finally:
            redirnode.output.word = word

    makeheredoc._kesoku_patched = True  # type: ignore[attr-defined]
    bashlex.heredoc.makeheredoc = makeheredoc


_patch_quoted_heredoc_delimiter()


def find_exec(args: list[Word]) -> list[list[Word]]:
    """The commands of ``find … -exec CMD … ;``.

    Also ``-execdir``, ``-ok``, ``-okdir``, and commands ending in ``+``.
    """
    commands: list[list[Word]] = []
    i = 0
    while i < len(args):
        if args[i].text in ("-exec", "-execdir", "-ok", "-okdir"):
            j = i + 1
            while j < len(args) and args[j].text not in (";", "+"):
                j += 1
            if j > i + 1:
                commands.append(args[i + 1 : j])
            i = j
        i += 1
    return commands


__all__ = [
    "MAX_DEPTH",
    "TIME_PLACEHOLDER",
    "Item",
    "Opaque",
    "SimpleCommand",
    "Unparsable",
    "Word",
    "find_exec",
    "iter_commands",
    "parse_line",
]
