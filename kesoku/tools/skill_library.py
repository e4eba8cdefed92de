"""Skills: folders of instructions (and scripts) the model reads on demand.

A skill is a sub-folder of a skills directory holding ``SKILL.md`` (or, without one, any ``.md``
file in the folder's root) that starts with YAML frontmatter between ``---`` lines, followed by the
instructions in Markdown. This is the public Agent Skills layout (agentskills.io): ``name`` and
``description`` are required; ``license``, ``compatibility``, ``allowed-tools`` and other keys are
accepted and ignored; ``metadata.tags`` and ``metadata.platforms`` are read, as a YAML list or as a
string of names separated by commas or spaces (the Agent Skills spec makes metadata values
strings)::

    ---
    name: ai-image
    description: AI image generation and editing.
    metadata:
      tags: [aigc, gcp]
      platforms: [linux, darwin]
    ---

Platforms name host operating systems, compared with ``platform.system().lower()`` (``linux``,
``darwin``, ``windows``) exactly as the seed says: omitted (or null) = every platform, ``[]`` =
none, otherwise only the listed ones. ``macos``/``osx`` and ``win32``/``win`` are read as ``darwin``
and ``windows``.

How files are read (each rule keeps a good skill loading and turns a bad one into one warning):

- A UTF-8 byte-order mark and CRLF or CR line ends are removed before parsing: they are editor
  habits (Windows), not mistakes, and YAML allows them.
- Block scalars (``description: |`` or ``>``) are valid YAML; the text is folded to one line.
- Everything else that is not valid frontmatter skips that skill with one warning
  ``file:line: what is wrong; skill skipped``: an empty file, no opening or closing ``---``, YAML
  errors (a ``: `` inside an unquoted value gets a hint to quote it, since other Agent Skills
  loaders reject it too), frontmatter that is not a mapping, a missing or non-text
  ``name``/``description``, malformed ``metadata``, a file over :data:`MAX_SKILL_BYTES` or not
  UTF-8.

A symlinked skill folder is followed: the skill's folder is the resolved target (the path the model
is told to use); a dangling or looping symlink is a warning. Directories come in precedence order
(the workspace's ``skills_dir`` first, then the bundled skills): a name found earlier hides the same
name later, whatever its platforms.

:meth:`SkillLibrary.summaries` runs on the event loop at every turn, so parsed files are cached by
``(path, st_mtime_ns, st_size)`` and folder listings by the folder's ``st_mtime_ns``: a call costs
one ``scandir`` per skills directory and two ``stat`` calls per skill. Each distinct warning is
logged once.
"""

from __future__ import annotations

import logging
import os
import platform as _platform
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml

if TYPE_CHECKING:
    from kesoku.config.settings import Config

log = logging.getLogger(__name__)

Source = Literal["workspace", "bundled"]
MAX_SKILL_BYTES = 1024 * 1024
"""A larger skill file is skipped with a warning.

The Agent Skills spec advises under 500 lines.
"""
MAX_SUMMARY_CHARS = 1024
"""A description is cut at this length in :meth:`SkillLibrary.summaries`.

It is the Agent Skills limit.
"""
SKILL_FILE = "SKILL.md"
PLATFORM_ALIASES = {
    "macos": "darwin",
    "osx": "darwin",
    "mac": "darwin",
    "win": "windows",
    "win32": "windows",
}
HOST_PLATFORM = _platform.system().lower()
"""This host's platform as the seed compares it: ``platform.system().lower()``."""

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_FENCE = re.compile(r"---[ \t]*")


@dataclass(frozen=True, slots=True)
class Skill:
    """One loaded skill.

    Attributes:
        name: Its ``name``; what ``use_skill`` takes.
        description: Its ``description`` on one line (block scalars folded).
        folder: The skill's folder, absolute and resolved (symlinks followed).
        file: The ``.md`` file read (``SKILL.md`` unless the folder has none).
        tags: ``metadata.tags``, possibly empty.
        platforms: ``metadata.platforms`` lower-cased; None when omitted (every platform), ``()``
            for none.
        source: ``workspace`` (the configured skills_dir) or ``bundled`` (shipped with Kesoku).
    """

    name: str
    description: str
    folder: Path
    file: Path
    tags: tuple[str, ...]
    platforms: tuple[str, ...] | None
    source: Source

    def runs_on(self, platform: str | None) -> bool:
        """Whether the skill is offered on ``platform`` (None: no filter)."""
        return (
            platform is None
            or self.platforms is None
            or normalize_platform(platform) in self.platforms
        )


class SkillError(ValueError):
    """A skill file cannot be loaded; the message is ``file[:line]: what is wrong``."""


class NoFrontmatterError(SkillError):
    """The file does not start with ``---``.

    In a folder without SKILL.md, it is simply not the skill file.
    """


def normalize_platform(name: str) -> str:
    """``Linux`` → ``linux``, ``macOS`` → ``darwin``, ``win32`` → ``windows``.

    Other names are lower-cased.
    """
    low = name.strip().lower()
    return PLATFORM_ALIASES.get(low, low)


def bundled_skills_dir() -> Path:
    """The skills shipped with Kesoku.

    They are ``skills/`` in a checkout, ``kesoku/_skills`` when installed.

    Returns:
        The folder, read through importlib.resources like the migrations in ``kesoku/_schema``.

    Raises:
        RuntimeError: Kesoku is installed in a way that has no folder on disk (a zip import).
    """
    ref = resources.files("kesoku").joinpath("_skills")
    if not isinstance(ref, Path):
        raise RuntimeError(f"the bundled skills are not a folder on disk: {ref}")
    return ref


# -- one file -------------------------------------------------------------------------------------


def split_frontmatter(text: str, file: Path) -> tuple[str, str, int]:
    """Split a skill file into its frontmatter and body.

    Args:
        text: The file's text; a leading BOM and CRLF/CR line ends are removed first.
        file: Its path, for error messages.

    Returns:
        ``(frontmatter YAML, body, line number of the body's first line)``.

    Raises:
        SkillError: The file is empty or the frontmatter has no opening or closing ``---`` line.
    """
    text = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    if not text.strip():
        raise SkillError(
            f"{file}: empty file; "
            "a skill starts with YAML frontmatter (name, description) between --- lines"
        )
    lines = text.split("\n")
    if not _FENCE.fullmatch(lines[0]):
        raise NoFrontmatterError(
            f"{file}:1: no YAML frontmatter: the first line must be --- (found {lines[0][:40]!r})"
        )
    for i in range(1, len(lines)):
        if _FENCE.fullmatch(lines[i]):
            return "\n".join(lines[1:i]), "\n".join(lines[i + 1 :]), i + 2
    raise SkillError(f"{file}:1: the frontmatter opened on line 1 has no closing --- line")


def _yaml_error(exc: yaml.YAMLError, file: Path) -> SkillError:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    line = f":{mark.line + 2}" if mark is not None else ""  # +1: 1-based, +1: the opening --- line
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    hint = ""
    if "mapping values are not allowed" in problem:
        hint = ' (a value holding ": " must be quoted: description: "Use when: ...")'
    elif "found character '\\t'" in problem:
        hint = " (indent with spaces, not tabs)"
    return SkillError(f"{file}{line}: invalid YAML frontmatter: {problem}{hint}")


def _where(file: Path, front: str, key: str) -> str:
    """``file:line`` of the first frontmatter line setting ``key`` (any indent), else ``file``."""
    pattern = re.compile(rf"\s*{re.escape(key)}\s*:")
    for number, line in enumerate(front.split("\n"), start=2):  # line 1 is the opening ---
        if pattern.match(line):
            return f"{file}:{number}"
    return str(file)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _names(value: object, key: str, file: Path, front: str) -> tuple[str, ...]:
    """A list of names given as a YAML list or a string separated by commas or spaces."""
    if isinstance(value, str):
        return tuple(part for part in re.split(r"[,\s]+", value) if part)
    if isinstance(value, list) and all(
        isinstance(v, str | int | float) and not isinstance(v, bool) for v in value
    ):
        return tuple(str(v).strip() for v in value if str(v).strip())
    where = _where(file, front, key)
    raise SkillError(
        f"{where}: metadata.{key} must be a list of names like [a, b], got {_short(value)}"
    )


def _text(meta: dict[Any, Any], key: str, file: Path, front: str) -> str:
    value = meta.get(key)
    if isinstance(value, str) and value.strip():
        return " ".join(value.split())
    where = _where(file, front, key)
    if value is None:
        raise SkillError(
            f"{where}: the frontmatter has no `{key}` (Agent Skills require name and description)"
        )
    if not isinstance(value, str):
        raise SkillError(
            f"{where}: `{key}` must be text, got {type(value).__name__} {_short(value)}; quote it"
        )
    raise SkillError(f"{where}: `{key}` is empty")


def parse_skill(text: str, file: Path, folder: Path, source: Source) -> Skill:
    """Parse a skill file's text.

    Args:
        text: The whole file (BOM and CRLF tolerated).
        file: The file's path.
        folder: The skill's folder (absolute, resolved).
        source: Where the folder was found.

    Returns:
        The skill.

    Raises:
        SkillError: The frontmatter is missing, invalid YAML, not a mapping, or lacks a text
            ``name`` or ``description``; or ``metadata`` is malformed. The message names the file
            and, when known, the line.
    """
    front, _, _ = split_frontmatter(text, file)
    try:
        meta = yaml.load(front, Loader=_Loader)
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, file) from None
    if meta is None:
        raise SkillError(f"{file}:2: the frontmatter is empty; it needs name and description")
    if not isinstance(meta, dict):
        raise SkillError(
            f"{file}:2: the frontmatter is a {type(meta).__name__}, "
            "not a mapping (name: ..., description: ...)"
        )
    name = _text(meta, "name", file, front)
    description = _text(meta, "description", file, front)
    extra = meta.get("metadata")
    if extra is None:
        extra = {}
    if not isinstance(extra, dict):
        where = _where(file, front, "metadata")
        raise SkillError(
            f"{where}: `metadata` must be a mapping (tags: [...], platforms: [...]), "
            f"got {_short(extra)}"
        )
    tags = () if extra.get("tags") is None else _names(extra["tags"], "tags", file, front)
    raw = extra.get("platforms")
    names = () if raw is None else _names(raw, "platforms", file, front)
    platforms = None if raw is None else tuple(normalize_platform(p) for p in names)
    return Skill(name, description, folder, file, tags, platforms, source)


def read_body(skill: Skill) -> str:
    """The instructions of a skill: its file without the frontmatter, read again now.

    Args:
        skill: A loaded skill.

    Returns:
        The Markdown body, stripped (may be empty).

    Raises:
        OSError: The file cannot be read any more.
        SkillError: It is no longer valid UTF-8 or lost its frontmatter.
    """
    data = skill.file.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SkillError(f"{skill.file}: not UTF-8 (byte 0x{data[exc.start]:02x})") from None
    return split_frontmatter(text, skill.file)[1].strip()


def _load(path: Path, size: int, folder: Path, source: Source) -> Skill | SkillError:
    if size > MAX_SKILL_BYTES:
        return SkillError(
            f"{path}: {size} bytes; a skill file may hold {MAX_SKILL_BYTES} "
            "(move details to references/)"
        )
    try:
        data = path.read_bytes()
    except OSError as exc:
        return SkillError(f"{path}: cannot read: {exc.strerror or exc}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        return SkillError(
            f"{path}:{line}: not UTF-8 (byte 0x{data[exc.start]:02x}); save it as UTF-8"
        )
    try:
        return parse_skill(text, path, folder, source)
    except SkillError as exc:
        return exc


# -- the library ----------------------------------------------------------------------------------


class SkillLibrary:
    """The skills of some directories, re-read cheaply whenever asked.

    Args:
        dirs: Skills directories in precedence order (the workspace's ``skills_dir``, then
            :func:`bundled_skills_dir`). A missing directory holds no skills and is not a warning;
            a directory given twice (after resolving symlinks) counts once. The one that is the
            bundled folder has source ``bundled``, the others ``workspace``.

    Thread safety:
        Methods may be called from the trio thread and from worker threads at once (a lock guards
        the caches). A refresh with nothing changed costs about 15 µs per skill (0.7 ms for 50); a
        first parse about 0.2 ms per skill, so a daemon warms the cache with :meth:`scan` in a
        worker thread at start.
    """

    def __init__(self, dirs: Sequence[Path]) -> None:
        try:
            bundled: Path | None = bundled_skills_dir().resolve()
        except RuntimeError:
            bundled = None
        self.dirs: list[tuple[Path, Source]] = []
        for d in dirs:
            real = Path(d).expanduser().resolve()
            if all(real != seen for seen, _ in self.dirs):
                self.dirs.append((real, "bundled" if real == bundled else "workspace"))
        self._first = self.dirs[0][0] if self.dirs else None
        self._lock = threading.Lock()
        self._files: dict[str, tuple[tuple[int, int], Skill | SkillError]] = {}
        self._listings: dict[str, tuple[int, list[str]]] = {}
        self._logged: set[str] = set()

    @classmethod
    def from_config(cls, config: Config) -> SkillLibrary:
        """The library of ``workspace.skills_dir``, then the bundled skills.

        ``workspace.skills_dir`` is absolute after load_config.
        """
        return cls([Path(config.workspace.skills_dir), bundled_skills_dir()])

    @property
    def skills_dir(self) -> Path | None:
        """Where new skills go: the first directory given, resolved (None when none was given)."""
        return self._first

    def scan(self) -> tuple[list[Skill], list[str]]:
        """Look at every directory again, re-parsing only the files that changed.

        Returns:
            ``(skills sorted by name, warnings)``: one warning line per skipped skill, naming its
            file (and line when known). Hidden duplicates are not warnings (a debug log says so),
            except two folders of the same directory declaring the same name.
        """
        with self._lock:
            found: dict[str, Skill] = {}
            warnings: list[str] = []
            for root, source in self.dirs:
                seen_here: dict[str, Path] = {}
                for result in self._scan_dir(root, source):
                    if isinstance(result, str):
                        warnings.append(result)
                    elif result.name in seen_here:
                        warnings.append(
                            f"{result.file}: name {result.name!r} "
                            f"is already used by {seen_here[result.name]}; "
                            "skill skipped"
                        )
                    elif result.name in found:
                        seen_here[result.name] = result.file
                        log.debug(
                            "skill %s in %s is hidden by %s",
                            result.name,
                            result.file,
                            found[result.name].file,
                        )
                    else:
                        seen_here[result.name] = result.file
                        found[result.name] = result
            for line in warnings:
                if line not in self._logged:
                    self._logged.add(line)
                    log.warning("%s", line)
        return sorted(found.values(), key=lambda s: s.name), warnings

    def visible(self, platform: str | None = HOST_PLATFORM) -> list[Skill]:
        """The skills offered on ``platform``.

        Args:
            platform: A host OS as ``platform.system().lower()`` names it (default: this host's);
                None lists every skill whatever its platforms.

        Returns:
            The skills sorted by name.
        """
        return [s for s in self.scan()[0] if s.runs_on(platform)]

    def get(self, name: str, platform: str | None = HOST_PLATFORM) -> Skill | None:
        """The skill called ``name`` if it is offered on ``platform``.

        The name matches exactly, else ignoring case.
        """
        skills = self.visible(platform)
        exact = next((s for s in skills if s.name == name), None)
        return exact or next(
            (s for s in skills if s.name.casefold() == name.strip().casefold()), None
        )

    def summaries(self, platform: str | None = HOST_PLATFORM) -> list[tuple[str, str]]:
        """``(name, description)`` of each skill offered on ``platform``, for the system prompt.

        Cheap enough for the event loop: two ``stat`` calls per skill when nothing changed (about
        0.7 ms for 50 skills). Descriptions are cut at :data:`MAX_SUMMARY_CHARS`.

        Args:
            platform: As in :meth:`visible`.

        Returns:
            The pairs, sorted by name.
        """
        out = []
        for s in self.visible(platform):
            text = s.description
            if len(text) > MAX_SUMMARY_CHARS:
                text = text[: MAX_SUMMARY_CHARS - 1] + "…"
            out.append((s.name, text))
        return out

    # -- internals (called with the lock held) ----------------------------------------------------

    def _scan_dir(self, root: Path, source: Source) -> list[Skill | str]:
        # Plain strings and os calls: pathlib objects cost more than the system calls here.
        try:
            with os.scandir(root) as it:
                entries = sorted(it, key=lambda e: e.name)
        except FileNotFoundError:
            return []
        except NotADirectoryError:
            return [f"{root}: the skills directory is a file, not a folder"]
        except OSError as exc:
            return [f"{root}: cannot list the skills directory: {exc.strerror or exc}"]
        out: list[Skill | str] = []
        for entry in entries:
            if entry.name.startswith(".") or entry.name == "__pycache__":
                continue
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            if not is_dir:
                if entry.is_symlink() and not os.path.exists(entry.path):
                    out.append(f"{entry.path}: a dangling or looping symlink; skill skipped")
                continue
            out.append(self._load_folder(entry, source))
        return out

    def _load_folder(self, entry: os.DirEntry[str], source: Source) -> Skill | str:
        try:
            # The root is resolved, so only a symlinked folder needs resolving.
            folder = os.path.realpath(entry.path, strict=True) if entry.is_symlink() else entry.path
            mtime = entry.stat().st_mtime_ns
        except (OSError, RuntimeError) as exc:
            return f"{entry.path}: cannot open the skill folder: {exc}; skill skipped"
        cached = self._listings.get(folder)
        if cached is None or cached[0] != mtime:
            try:
                with os.scandir(folder) as it:
                    names = [e.name for e in it if e.name.lower().endswith(".md") and e.is_file()]
            except OSError as exc:
                return f"{folder}: cannot list: {exc.strerror or exc}; skill skipped"
            # SKILL.md first (any case), then the other .md files by name.
            names.sort(key=lambda n: (n.lower() != SKILL_FILE.lower(), n))
            cached = (mtime, names)
            self._listings[folder] = cached
        for name in cached[1]:
            result = self._parsed(os.path.join(folder, name), folder, source)
            if isinstance(result, Skill):
                return result
            # Without SKILL.md, a .md file that does not start with --- is just another document.
            if name.lower() == SKILL_FILE.lower() or not isinstance(result, NoFrontmatterError):
                return f"{result}; skill skipped"
        other = " and no .md file starting with --- frontmatter" if cached[1] else ""
        return f"{folder}: no {SKILL_FILE}{other}; skill skipped"

    def _parsed(self, file: str, folder: str, source: Source) -> Skill | SkillError:
        try:
            st = os.stat(file)
        except OSError as exc:
            return SkillError(f"{file}: cannot read: {exc.strerror or exc}")
        key = (st.st_mtime_ns, st.st_size)
        cached = self._files.get(file)
        if (
            cached is not None
            and cached[0] == key
            and (not isinstance(cached[1], Skill) or cached[1].source == source)
        ):
            return cached[1]
        result = _load(Path(file), st.st_size, Path(folder), source)
        self._files[file] = (key, result)
        return result


__all__ = [
    "HOST_PLATFORM",
    "MAX_SKILL_BYTES",
    "Skill",
    "SkillError",
    "SkillLibrary",
    "bundled_skills_dir",
    "normalize_platform",
    "parse_skill",
    "read_body",
    "split_frontmatter",
]
