"""Skills benchmark: the skill list of the system prompt, built on every model call, from 50 skills.

Run: .venv/bin/python bench/skills_bench.py [--skills N] [--rounds R]

Target: a cached ``SkillLibrary.summaries()`` call well under 1 ms (it runs on the event loop, whose
step budget is 25 ms); the first call parses every SKILL.md.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from kesoku.tools.skill_library import SkillLibrary

from _util import median, report

SKILL = (
    "---\nname: {name}\ndescription: Skill number {i} does a thing when asked.\n---\n"
    "# {name}\n\nDo the thing.\n"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skills", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    colds, warms = [], []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            for i in range(args.skills):
                (root / f"skill-{i:02d}").mkdir()
                (root / f"skill-{i:02d}" / "SKILL.md").write_text(
                    SKILL.format(name=f"skill-{i:02d}", i=i)
                )
            library = SkillLibrary([root])
            start = time.perf_counter()
            assert len(library.summaries(None)) == args.skills
            colds.append(time.perf_counter() - start)
            calls = 200
            start = time.perf_counter()
            for _ in range(calls):
                library.summaries("linux")
            warms.append((time.perf_counter() - start) / calls)
    report(f"summaries(), {args.skills} skills, first call", median(colds) * 1000, "ms")
    report(
        f"summaries(), {args.skills} skills, cached", median(warms) * 1000, "ms", "well under 1 ms"
    )


if __name__ == "__main__":
    main()
