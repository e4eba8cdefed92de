"""The skill tools: ``list_skills`` and ``use_skill``.

Both work over a :class:`~kesoku.tools.skill_library.SkillLibrary`. Skills are filtered by the host
platform (``platform.system().lower()``), as the seed specifies; the system prompt lists the same
skills through :meth:`~kesoku.tools.skill_library.SkillLibrary.summaries`. ``use_skill`` returns the
skill's instructions under a header naming the skill folder's absolute path and telling the model to
use absolute paths in commands (the working directory is the session's, not the skill's), followed
by the other files of the folder. Both tools read the disk in a worker thread.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Annotated

import trio

from kesoku.tools.base import Tool
from kesoku.tools.output import cap_output
from kesoku.tools.schema import Check, tool_from_function
from kesoku.tools.skill_library import HOST_PLATFORM, Skill, SkillError, SkillLibrary, read_body
from kesoku.vocab.errors import ToolError

DEFAULT_MAX_OUTPUT_BYTES = 32_000
"""The most bytes use_skill returns (header included).

A longer body is cut in the middle, marked.
"""
MAX_LISTED_FILES = 40
"""Files of a skill folder named in use_skill's header."""
MAX_WALKED_ENTRIES = 2000
"""Folder entries looked at while listing a skill's files."""
MAX_NAMES_IN_ERROR = 50
SKILL_TOOL_TIMEOUT_S = 30.0
_SKIPPED = frozenset({".git", "__pycache__", "node_modules", ".venv", "venv"})
_SkillName = Annotated[
    str, Check("`skill_name` must be a non-empty string (a name from list_skills)", str.strip)
]


def skill_tools(
    library: SkillLibrary,
    *,
    platform: str | None = HOST_PLATFORM,
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
) -> tuple[Tool, Tool]:
    """Build ``list_skills`` and ``use_skill``.

    Args:
        library: The skills (workspace skills_dir first, then the bundled ones).
        platform: The OS skills are filtered for; default this host's, None for no filter.
        max_output_bytes: The cap of use_skill's result.

    Returns:
        ``(list_skills, use_skill)``.
    """

    async def list_skills() -> str:
        """List the skills. Also their tags, and those that failed to load."""
        return await trio.to_thread.run_sync(_list, library, platform, abandon_on_cancel=True)

    async def use_skill(skill_name: _SkillName) -> str:
        """Read a skill's instructions."""
        return await trio.to_thread.run_sync(
            _use, library, skill_name, platform, max_output_bytes, abandon_on_cancel=True
        )

    # The docstrings are the descriptions (sent with every model call: kept short). The system
    # prompt lists the skills; use_skill's result says to run a skill's scripts by absolute path.
    return (
        tool_from_function(list_skills, timeout_s=SKILL_TOOL_TIMEOUT_S),
        tool_from_function(use_skill, timeout_s=SKILL_TOOL_TIMEOUT_S),
    )


def _where_new(library: SkillLibrary) -> str:
    folder = library.skills_dir
    return f"{folder}/<name>/SKILL.md" if folder else "<skills_dir>/<name>/SKILL.md"


def _list(library: SkillLibrary, platform: str | None) -> str:
    skills, warnings = library.scan()
    shown = [s for s in skills if s.runs_on(platform)]
    lines: list[str] = []
    if shown:
        lines.append(
            f"{len(shown)} skill{'s' if len(shown) != 1 else ''} (read one with use_skill):"
        )
        for s in shown:
            tags = f" [tags: {', '.join(s.tags)}]" if s.tags else ""
            lines.append(f"- {s.name}: {s.description}{tags}")
    elif skills:
        lines.append(
            f"No skills for this platform ({platform}); {len(skills)} exist for other platforms."
        )
    else:
        lines.append("No skills installed.")
    if warnings:
        lines.append(f"Skipped ({len(warnings)}, fix the file to load it):")
        lines.extend(f"- {w}" for w in warnings[:MAX_NAMES_IN_ERROR])
    lines.append(
        f"New skills go in {_where_new(library)}: "
        "YAML frontmatter (name, description) between --- lines, "
        "then the instructions."
    )
    return "\n".join(lines)


def _use(library: SkillLibrary, name: str, platform: str | None, max_bytes: int) -> str:
    skill = library.get(name, platform)
    if skill is None:
        raise ToolError(_unknown(library, name, platform))
    try:
        body = read_body(skill)
    except OSError as exc:
        raise ToolError(
            f"cannot read skill {skill.name!r} ({skill.file}): {exc.strerror or exc}"
        ) from None
    except SkillError as exc:
        raise ToolError(f"skill {skill.name!r} cannot be read: {exc}") from None
    head = _header(skill)
    room = max(64, max_bytes - len(head.encode()))
    text = cap_output(body, room)
    if len(body.encode()) > room:
        text += f"\n[The skill was cut; read the whole file with read_file: {skill.file}]"
    return head + text


def _unknown(library: SkillLibrary, name: str, platform: str | None) -> str:
    skills = library.scan()[0]
    elsewhere = next((s for s in skills if s.name.casefold() == name.strip().casefold()), None)
    if elsewhere is not None:
        wanted = ", ".join(elsewhere.platforms or ()) or "no platform"
        return f"skill {elsewhere.name!r} is for {wanted}, not this host ({platform})"
    names = [s.name for s in skills if s.runs_on(platform)]
    if not names:
        return (
            f"no skill named {name!r}: no skills are installed (add one in {_where_new(library)})"
        )
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    listed = ", ".join(names[:MAX_NAMES_IN_ERROR]) + (
        " …" if len(names) > MAX_NAMES_IN_ERROR else ""
    )
    return f"no skill named {name!r}{hint} Skills: {listed}"


def _files(folder: Path, skip: Path) -> tuple[list[str], int]:
    """Relative paths of the files in ``folder`` (hidden and cache folders skipped), capped."""
    found: list[str] = []
    seen = 0
    for top, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIPPED)
        for file in sorted(files):
            seen += 1
            path = Path(top, file)
            if not file.startswith(".") and path != skip:
                found.append(path.relative_to(folder).as_posix())
        if seen > MAX_WALKED_ENTRIES:
            break
    return found, seen


def _header(skill: Skill) -> str:
    folder = os.fspath(skill.folder)
    files, seen = _files(skill.folder, skill.file)
    script = next((f for f in files if f.startswith("scripts/")), "scripts/x.py")
    lines = [
        f"# Skill: {skill.name}",
        f"Skill folder (absolute path): {folder}",
        f"The working directory is not this folder: use absolute paths in every command, such as "
        f"`python {folder}/{script}`, and read its files as {folder}/<file>.",
    ]
    if files:
        more = (
            f" (and {len(files) - MAX_LISTED_FILES} more)" if len(files) > MAX_LISTED_FILES else ""
        )
        if seen > MAX_WALKED_ENTRIES:
            more += " (listing stopped early)"
        lines.append(f"Other files in the folder{more}: " + ", ".join(files[:MAX_LISTED_FILES]))
    return "\n".join(lines) + "\n\n---\n\n"


__all__ = ["DEFAULT_MAX_OUTPUT_BYTES", "skill_tools"]
