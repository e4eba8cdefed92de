"""``kesoku skills list``: the agent's skills, their sources, and the ones that fail to load."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated

from cyclopts import Parameter

DESCRIPTION_WIDTH = 70
"""Characters of a description shown in the table."""


def list_skills(
    *,
    config: Annotated[Path | None, Parameter(name=["--config", "-c"])] = None,
    platform: Annotated[str | None, Parameter(name="--platform")] = None,
) -> None:
    """List the skills: name, source, platforms and description; broken ones as warnings on stderr.

    Skills are read from workspace.skills_dir of kesoku.toml (default ./skills next to the file),
    then from the skills bundled with Kesoku; a workspace skill hides a bundled one of the same
    name. A skill is a folder holding SKILL.md (the public Agent Skills layout; scripts/ and
    references/ may sit beside):

        ---
        name: my-skill   # what use_skill takes
        description: What it does and when to use it (quote it if it holds ": ").
        metadata: {tags: [git], platforms: [linux, darwin]}  # optional; no platforms: any OS
        ---
        The instructions, in Markdown.

    A skill whose file cannot be read is skipped with one warning naming the file and line; the
    others still load. Exit 0 even with warnings; 2 with one line when the config is bad.

    Args:
        config: The TOML file. Default: $KESOKU_CONFIG, else ./kesoku.toml, else built-in defaults.
        platform: Show only the skills offered on this OS (linux, darwin, windows). Default: every
            skill, marking those this host does not get.
    """
    from kesoku.config.settings import default_config_path, load_config
    from kesoku.tools.skill_library import HOST_PLATFORM, SkillLibrary, normalize_platform

    path = config if config is not None else default_config_path()
    cfg = load_config(path)
    # The warnings are printed below; without this, logging's last-resort handler would print them
    # twice.
    logging.getLogger("kesoku.tools.skill_library").addHandler(logging.NullHandler())
    library = SkillLibrary.from_config(cfg)
    skills, warnings = library.scan()
    wanted = normalize_platform(platform) if platform else None
    shown = [s for s in skills if s.runs_on(wanted)]
    rows = [("NAME", "SOURCE", "PLATFORMS", "DESCRIPTION")]
    for s in shown:
        platforms = "all" if s.platforms is None else (",".join(s.platforms) or "none")
        if wanted is None and not s.runs_on(HOST_PLATFORM):
            platforms += f" (not {HOST_PLATFORM})"
        text = (
            s.description
            if len(s.description) <= DESCRIPTION_WIDTH
            else s.description[: DESCRIPTION_WIDTH - 1] + "…"
        )
        rows.append((s.name, s.source, platforms, text))
    if shown:
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        for row in rows:
            print(
                (
                    f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]:<{widths[2]}}  {row[3]}"
                ).rstrip()
            )
    else:
        where = f" for {wanted}" if wanted else ""
        print(f"no skills{where}")
    dirs = ", ".join(f"{d} ({source})" for d, source in library.dirs)
    print(
        f"\nread from: {dirs}\nadd a skill: {library.skills_dir or '<skills_dir>'}/<name>/SKILL.md"
    )
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
