"""Skills: discovery, frontmatter (good, tolerated and broken), the platform filter, precedence,
caching, the list_skills/use_skill tools and the bundled skills with their script. Every file lives
in tmp_path."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kesoku.config.settings import load_config
from kesoku.tools.base import Tool, ToolContext
from kesoku.tools.skill_library import Skill, SkillLibrary, bundled_skills_dir
from kesoku.tools.skills import skill_tools
from kesoku.vocab.errors import ToolError
from kesoku.vocab.model import Session

GOOD = "---\nname: {name}\ndescription: {desc}\n---\n# {name}\n\nDo the thing.\n"


def write(folder: Path, text: str | bytes, file: str = "SKILL.md") -> Path:
    """Write a skill file (bytes kept exact: BOM, CRLF) and return its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / file
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def good(root: Path, name: str, desc: str = "A good skill.") -> Path:
    return write(root / name, GOOD.format(name=name, desc=desc))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "skills"
    path.mkdir()
    return path


# -- loading --------------------------------------------------------------------------------------


def test_a_skill_loads_with_its_fields(root: Path) -> None:
    write(
        root / "ai-image",
        "---\nname: ai-image\ndescription: AI image generation and editing.\nlicense: MIT\n"
        "allowed-tools: Bash Read\nmetadata:\n  tags: [aigc, gcp]\n  platforms: [linux, darwin]\n"
        "---\nBody\n",
    )
    (root / "README.md").write_text("not a skill: files in the root are ignored\n")
    skills, warnings = SkillLibrary([root]).scan()
    assert warnings == []
    assert skills == [
        Skill(
            "ai-image",
            "AI image generation and editing.",
            root.resolve() / "ai-image",
            root.resolve() / "ai-image" / "SKILL.md",
            ("aigc", "gcp"),
            ("linux", "darwin"),
            "workspace",
        )
    ]
    assert skills[0].folder.is_absolute()


def test_agent_skills_metadata_strings_are_split(root: Path) -> None:
    write(
        root / "s",
        "---\nname: s\ndescription: d\nmetadata:\n  tags: 'git, review'\n  platforms: Linux macOS\n"
        "---\n",
    )
    [skill] = SkillLibrary([root]).scan()[0]
    assert skill.tags == ("git", "review")
    assert skill.platforms == ("linux", "darwin")


@pytest.mark.parametrize(
    ("raw", "description"),
    [
        pytest.param(
            b"\xef\xbb\xbf" + GOOD.format(name="s", desc="With a BOM.").encode(),
            "With a BOM.",
            id="bom",
        ),
        pytest.param(
            GOOD.format(name="s", desc="CRLF ends.").replace("\n", "\r\n").encode(),
            "CRLF ends.",
            id="crlf",
        ),
        pytest.param(
            b"\xef\xbb\xbf" + GOOD.format(name="s", desc="Both.").replace("\n", "\r\n").encode(),
            "Both.",
            id="bom+crlf",
        ),
        pytest.param(
            GOOD.format(name="s", desc="Old Mac.").replace("\n", "\r").encode(), "Old Mac.", id="cr"
        ),
        pytest.param(
            b"---\nname: s\ndescription: |\n  First line.\n  Second line.\n---\n",
            "First line. Second line.",
            id="literal",
        ),
        pytest.param(
            b"---\nname: s\ndescription: >-\n  Folded\n  text.\n---\nbody",
            "Folded text.",
            id="folded",
        ),
        pytest.param(
            b'---\nname: s\ndescription: "Use when: quoted."\n---\n',
            "Use when: quoted.",
            id="quoted-colon",
        ),
        pytest.param(
            b"---  \nname: s\ndescription: Fence with spaces.\n---\t\n",
            "Fence with spaces.",
            id="fence-ws",
        ),
    ],
)
def test_tolerated_forms_load_without_warning(root: Path, raw: bytes, description: str) -> None:
    write(root / "s", raw)
    skills, warnings = SkillLibrary([root]).scan()
    assert warnings == []
    assert [(s.name, s.description) for s in skills] == [("s", description)]


BROKEN = [
    pytest.param(
        b"---\nname: bad\ndescription: never closed\n# Body\n",
        ":1: the frontmatter opened",
        id="no-closing",
    ),
    pytest.param(
        b"---\nname: bad\ndescription: Use when: X\n---\n", ":3: invalid YAML", id="colon-unquoted"
    ),
    pytest.param(
        b"---\n- name: bad\n- description: d\n---\n", ":2: the frontmatter is a list", id="list"
    ),
    pytest.param(b"---\njust words\n---\n", ":2: the frontmatter is a str", id="scalar"),
    pytest.param(b"", ": empty file", id="empty"),
    pytest.param(b" \n\n", ": empty file", id="blank"),
    pytest.param(b"---\n---\nbody\n", ":2: the frontmatter is empty", id="empty-frontmatter"),
    pytest.param(b"# Title\n\nNo frontmatter.\n", ":1: no YAML frontmatter", id="no-frontmatter"),
    pytest.param(b"---\ndescription: d\n---\n", ": the frontmatter has no `name`", id="no-name"),
    pytest.param(
        b"---\nname: bad\n---\n", ": the frontmatter has no `description`", id="no-description"
    ),
    pytest.param(
        b"---\nname: 42\ndescription: d\n---\n", ":2: `name` must be text, got int", id="name-int"
    ),
    pytest.param(
        b"---\nname: bad\ndescription: '  '\n---\n",
        ":3: `description` is empty",
        id="blank-description",
    ),
    pytest.param(
        b"---\nname: bad\ndescription: d\nmetadata: [a]\n---\n",
        ":4: `metadata` must be a mapping",
        id="meta",
    ),
    pytest.param(
        b"---\nname: bad\ndescription: d\nmetadata:\n  platforms: {linux: 1}\n---\n",
        ":5: metadata.platforms must be a list",
        id="platforms-map",
    ),
    pytest.param(b"---\nname: bad\n\tdescription: d\n---\n", ":3: invalid YAML", id="tab"),
    pytest.param(
        b"---\nname: bad\ndescription: caf\xe9\n---\n", ":3: not UTF-8 (byte 0xe9)", id="latin-1"
    ),
]


@pytest.mark.parametrize(("raw", "expected"), BROKEN)
def test_a_broken_skill_gives_one_warning_and_the_others_load(
    root: Path, raw: bytes, expected: str, caplog: pytest.LogCaptureFixture
) -> None:
    good(root, "alpha")
    bad = write(root / "bad", raw)
    good(root, "zeta")
    library = SkillLibrary([root])
    with caplog.at_level(logging.WARNING, logger="kesoku.tools.skill_library"):
        for _ in range(3):
            skills, warnings = library.scan()
            library.summaries(None)
    assert [s.name for s in skills] == ["alpha", "zeta"]
    assert len(warnings) == 1, warnings
    real = bad.resolve()
    assert warnings[0].startswith(f"{real}{expected}"), warnings[0]
    assert warnings[0].endswith("; skill skipped")
    # Logged once, not at every scan.
    assert [r.getMessage() for r in caplog.records] == warnings


def test_the_colon_warning_says_how_to_fix_it(root: Path) -> None:
    write(root / "bad", "---\nname: bad\ndescription: Use when: deploying\n---\n")
    [warning] = SkillLibrary([root]).scan()[1]
    assert "mapping values are not allowed" in warning
    assert 'must be quoted: description: "Use when: ..."' in warning


def test_other_md_files_and_folders_without_a_skill(root: Path) -> None:
    write(
        root / "by-guide",
        GOOD.format(name="by-guide", desc="Any .md in the root."),
        file="guide.md",
    )
    write(root / "by-guide", "# Notes without frontmatter\n", file="a-notes.md")
    write(root / "preferred", GOOD.format(name="preferred", desc="From SKILL.md."))
    write(root / "preferred", GOOD.format(name="other", desc="Ignored."), file="aaa.md")
    write(root / "docs-only", "# Just a document\n", file="README.md")
    (root / "no-md" / "scripts").mkdir(parents=True)
    (root / ".hidden").mkdir()
    (root / "__pycache__").mkdir()
    skills, warnings = SkillLibrary([root]).scan()
    assert [(s.name, s.file.name) for s in skills] == [
        ("by-guide", "guide.md"),
        ("preferred", "SKILL.md"),
    ]
    real = root.resolve()
    assert warnings == [
        f"{real / 'docs-only'}: no SKILL.md and no .md file starting with --- frontmatter; "
        "skill skipped",
        f"{real / 'no-md'}: no SKILL.md; skill skipped",
    ]


def test_duplicate_names_in_one_directory_warn(root: Path) -> None:
    good(root, "a-first")
    write(root / "b-second", GOOD.format(name="a-first", desc="Same name."))
    skills, warnings = SkillLibrary([root]).scan()
    assert [s.folder.name for s in skills] == ["a-first"]
    assert len(warnings) == 1
    assert "name 'a-first' is already used by" in warnings[0]


def test_a_symlinked_folder_is_followed_and_a_dangling_one_warns(
    root: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere" / "linked"
    good(elsewhere.parent, "linked")
    (root / "linked").symlink_to(elsewhere)
    (root / "dangling").symlink_to(tmp_path / "missing")
    skills, warnings = SkillLibrary([root]).scan()
    # The folder is the link's target: the path the model is told to use.
    assert [(s.name, s.folder, s.file) for s in skills] == [
        ("linked", elsewhere.resolve(), elsewhere.resolve() / "SKILL.md")
    ]
    assert warnings == [
        f"{root.resolve() / 'dangling'}: a dangling or looping symlink; skill skipped"
    ]


def test_missing_and_wrong_skills_dirs(tmp_path: Path) -> None:
    assert SkillLibrary([tmp_path / "missing"]).scan() == ([], [])
    (tmp_path / "file").write_text("x")
    assert SkillLibrary([tmp_path / "file"]).scan()[1] == [
        f"{tmp_path / 'file'}: the skills directory is a file, not a folder"
    ]


# -- platforms and precedence ---------------------------------------------------------------------


def test_platform_filter_as_the_seed_says(root: Path) -> None:
    good(root, "everywhere")  # platforms omitted: every platform
    write(root / "nowhere", "---\nname: nowhere\ndescription: d\nmetadata:\n  platforms: []\n---\n")
    write(root / "mac", "---\nname: mac\ndescription: d\nmetadata:\n  platforms: [macos]\n---\n")
    write(
        root / "chat", "---\nname: chat\ndescription: d\nmetadata:\n  platforms: [discord]\n---\n"
    )
    write(
        root / "null", "---\nname: null-platforms\ndescription: d\nmetadata:\n  platforms:\n---\n"
    )
    library = SkillLibrary([root])

    def names(platform: str | None) -> list[str]:
        return [s.name for s in library.visible(platform)]

    assert names("linux") == ["everywhere", "null-platforms"]
    assert names("Darwin") == ["everywhere", "mac", "null-platforms"]
    assert names(None) == ["chat", "everywhere", "mac", "nowhere", "null-platforms"]
    assert library.summaries("linux") == [("everywhere", "A good skill."), ("null-platforms", "d")]
    assert library.get("mac", "linux") is None
    assert library.get("MAC", "darwin") is not None  # case is forgiven
    assert [s.platforms for s in library.scan()[0]] == [("discord",), None, ("darwin",), (), None]


def test_workspace_hides_bundled_and_sources_are_labelled(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(root / "writing-skills", GOOD.format(name="writing-skills", desc="Local version."))
    # a directory given twice counts once
    library = SkillLibrary([root, bundled_skills_dir(), root])
    with caplog.at_level(logging.DEBUG, logger="kesoku.tools.skill_library"):
        skills, warnings = library.scan()
    assert warnings == []
    by_name = {s.name: s for s in skills}
    assert by_name["writing-skills"].description == "Local version."
    assert by_name["writing-skills"].source == "workspace"
    assert by_name["reviewing-changes"].source == "bundled"
    assert any("is hidden by" in r.getMessage() for r in caplog.records)
    assert library.skills_dir == root.resolve()


def test_from_config_resolves_skills_dir_next_to_the_file(tmp_path: Path) -> None:
    (tmp_path / "kesoku.toml").write_text('[workspace]\nskills_dir = "my-skills"\n')
    good(tmp_path / "my-skills", "mine")
    library = SkillLibrary.from_config(load_config(tmp_path / "kesoku.toml"))
    assert library.skills_dir == (tmp_path / "my-skills").resolve()
    names = [s.name for s in library.visible(None)]
    assert "mine" in names
    assert "writing-skills" in names


def test_the_bundled_skills_load_without_warnings() -> None:
    skills, warnings = SkillLibrary([bundled_skills_dir()]).scan()
    assert warnings == []
    assert {s.name for s in skills} == {
        "writing-skills",
        "fixing-failing-tests",
        "reviewing-changes",
    }
    for s in skills:
        assert s.source == "bundled"
        assert s.name == s.folder.name  # the Agent Skills rule
        assert s.platforms is None
        assert len(s.description) <= 1024


# -- caching --------------------------------------------------------------------------------------


def test_unchanged_files_are_not_parsed_again(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import kesoku.tools.skill_library as module

    calls: list[Path] = []
    real_load = module._load

    def counting(path: Path, *args: object) -> object:
        calls.append(path)
        return real_load(path, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(module, "_load", counting)
    path = good(root, "one")
    library = SkillLibrary([root])
    library.summaries(None)
    library.summaries(None)
    assert len(calls) == 1
    path.write_text(GOOD.format(name="one", desc="Changed, and longer than before."))
    assert library.summaries(None) == [("one", "Changed, and longer than before.")]
    good(root, "two")
    assert [n for n, _ in library.summaries(None)] == ["one", "two"]
    assert len(calls) == 3


def test_long_descriptions_are_cut_in_summaries(root: Path) -> None:
    good(root, "long", desc="word " * 400)
    [(_, text)] = SkillLibrary([root]).summaries(None)
    assert len(text) == 1024
    assert text.endswith("…")


# -- the tools ------------------------------------------------------------------------------------


@pytest.fixture
def ctx(session: Session, tmp_path: Path) -> ToolContext:
    return ToolContext(session=session, cwd=tmp_path, call_id="call-1")


def tools(library: SkillLibrary, **kwargs: object) -> dict[str, Tool]:
    return {t.name: t for t in skill_tools(library, platform="linux", **kwargs)}  # type: ignore[arg-type]


async def test_list_skills_shows_names_tags_and_skipped(root: Path, ctx: ToolContext) -> None:
    write(
        root / "deploy", "---\nname: deploy\ndescription: Ship it.\nmetadata:\n  tags: [ops]\n---\n"
    )
    write(
        root / "mac-only",
        "---\nname: mac-only\ndescription: d\nmetadata:\n  platforms: [darwin]\n---\n",
    )
    write(root / "broken", "---\nname: broken\n")
    text = await tools(SkillLibrary([root]))["list_skills"].run({}, ctx)
    real = root.resolve()
    assert text == (
        "1 skill (read one with use_skill):\n"
        "- deploy: Ship it. [tags: ops]\n"
        "Skipped (1, fix the file to load it):\n"
        f"- {real / 'broken' / 'SKILL.md'}:1: the frontmatter opened on line 1 has no closing --- "
        "line; skill skipped\n"
        f"New skills go in {real}/<name>/SKILL.md: YAML frontmatter (name, description) between "
        "--- lines, then the instructions."
    )


async def test_list_skills_when_there_are_none(tmp_path: Path, ctx: ToolContext) -> None:
    text = await tools(SkillLibrary([tmp_path / "nothing"]))["list_skills"].run({}, ctx)
    assert text.startswith("No skills installed.\nNew skills go in ")
    assert f"{tmp_path / 'nothing'}/<name>/SKILL.md" in text


async def test_use_skill_puts_the_absolute_folder_first(root: Path, ctx: ToolContext) -> None:
    write(
        root / "gen",
        "\ufeff---\r\nname: gen\r\ndescription: Generate.\r\n---\r\n"
        "# Gen\r\n\r\nRun `uv run scripts/gen.py`.\r\n",
    )
    (root / "gen" / "scripts").mkdir()
    (root / "gen" / "scripts" / "gen.py").write_text("print('x')\n")
    (root / "gen" / "references").mkdir()
    (root / "gen" / "references" / "api.md").write_text("api\n")
    (root / "gen" / "__pycache__").mkdir()
    (root / "gen" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    text = await tools(SkillLibrary([root]))["use_skill"].run({"skill_name": "gen"}, ctx)
    folder = (root / "gen").resolve()
    head, body = text.split("\n\n---\n\n", 1)
    assert head.splitlines() == [
        "# Skill: gen",
        f"Skill folder (absolute path): {folder}",
        "The working directory is not this folder: use absolute paths in every command, such as "
        f"`python {folder}/scripts/gen.py`, and read its files as {folder}/<file>.",
        "Other files in the folder: references/api.md, scripts/gen.py",
    ]
    assert body == "# Gen\n\nRun `uv run scripts/gen.py`."


async def test_use_skill_unknown_and_other_platform(root: Path, ctx: ToolContext) -> None:
    good(root, "deploy-site")
    good(root, "review")
    write(root / "mac", "---\nname: mac\ndescription: d\nmetadata:\n  platforms: [darwin]\n---\n")
    use = tools(SkillLibrary([root]))["use_skill"]
    with pytest.raises(ToolError) as err:
        await use.run({"skill_name": "deploy-sites"}, ctx)
    assert (
        str(err.value)
        == "no skill named 'deploy-sites'; did you mean 'deploy-site'? Skills: deploy-site, review"
    )
    with pytest.raises(ToolError, match=r"skill 'mac' is for darwin, not this host \(linux\)"):
        await use.run({"skill_name": "mac"}, ctx)
    with pytest.raises(ToolError, match="`skill_name` must be a non-empty string"):
        await use.run({}, ctx)
    assert "Skill: review" in await use.run({"skill_name": "Review"}, ctx)


async def test_use_skill_caps_a_long_body(root: Path, ctx: ToolContext) -> None:
    write(root / "big", GOOD.format(name="big", desc="d") + "line\n" * 5000)
    text = await tools(SkillLibrary([root]), max_output_bytes=2000)["use_skill"].run(
        {"skill_name": "big"}, ctx
    )
    assert len(text.encode()) < 2200
    assert "bytes cut" in text
    assert text.endswith(
        f"read the whole file with read_file: {(root / 'big' / 'SKILL.md').resolve()}]"
    )


async def test_use_skill_on_a_file_broken_since_the_scan(root: Path, ctx: ToolContext) -> None:
    path = good(root, "fickle")
    library = SkillLibrary([root])
    use = tools(library)["use_skill"]
    assert "Do the thing." in await use.run({"skill_name": "fickle"}, ctx)
    path.write_text("---\nname: fickle\ndescription: now: broken\n---\n")
    with pytest.raises(ToolError, match="no skill named 'fickle'"):
        await use.run({"skill_name": "fickle"}, ctx)


# -- the bundled script ---------------------------------------------------------------------------

CHECK_DIFF = bundled_skills_dir() / "reviewing-changes" / "scripts" / "check_diff.py"


def git(repo: Path, *args: str) -> None:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    ident = [
        "-c",
        "user.name=Test",
        "-c",
        "user.email=test@example.invalid",
        "-c",
        "init.defaultBranch=main",
    ]
    subprocess.run(["git", *ident, *args], cwd=repo, env=env, check=True, capture_output=True)


def check_diff(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHECK_DIFF), "--repo", str(repo), *args],
        capture_output=True,
        text=True,
        check=False,
    )


def test_check_diff_flags_conflicts_secrets_and_leftovers(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "app.py").write_text("def f():\n    return 1\n")
    git(repo, "add", "app.py")
    git(repo, "commit", "-q", "-m", "first")
    assert check_diff(repo).stdout.startswith("working tree vs HEAD: 0 file(s), +0 -0")

    key = "AKIA" + "ABCDEFGHIJKLMNOP"  # built here so the test file itself holds no key
    (repo / "app.py").write_text(
        f"def f():\n    breakpoint()\n    return 1  \n<<<<<<< HEAD\nKEY = '{key}'\n# TODO: tidy\n"
    )
    (repo / "new.txt").write_text("untracked\n")
    result = check_diff(repo)
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:2] == ["working tree vs HEAD: 1 file(s), +5 -1", "  app.py  +5 -1"]
    assert "  app.py:2: warning: a debugger call" in lines
    assert "  app.py:3: warning: trailing whitespace" in lines
    assert "  app.py:4: error: merge conflict marker" in lines
    assert "  app.py:5: error: an AWS access key id" in lines
    assert "  app.py:6: note: a new TODO/FIXME" in lines
    assert "  new.txt: warning: untracked: not in this check nor in a commit until added" in lines
    assert lines[-1] == "result: 2 error(s), 3 warning(s)"

    git(repo, "checkout", "-q", "--", "app.py")
    (repo / "app.py").write_text("def f():\n    return 2\n")
    git(repo, "add", "app.py", "new.txt")
    staged = check_diff(repo, "--staged")
    assert staged.returncode == 0, staged.stdout
    assert staged.stdout.startswith("staged changes: 2 file(s), +2 -1\n")
    assert staged.stdout.endswith("result: 0 error(s), 0 warning(s)\n")


def test_check_diff_outside_a_repository_exits_2(tmp_path: Path) -> None:
    result = check_diff(tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("check_diff: git rev-parse --show-toplevel failed:")
