"""`kesoku skills list`, run as the real entry point in a subprocess; its help stays light."""

from __future__ import annotations

from pathlib import Path

from test_config_cli import BAD, assert_operator_error, kesoku
from test_startup_imports import HELP_NEEDS_NONE_OF, loaded_modules, present


def make_workspace(tmp_path: Path) -> Path:
    skills = tmp_path / "my-skills"
    (skills / "deploy").mkdir(parents=True)
    (skills / "deploy" / "SKILL.md").write_text(
        "---\nname: deploy\ndescription: Ship the site to staging.\n"
        "metadata:\n  platforms: [darwin]\n---\nSteps.\n"
    )
    (skills / "writing-skills").mkdir()
    (skills / "writing-skills" / "SKILL.md").write_text(
        "---\nname: writing-skills\ndescription: Our own way of writing skills.\n---\n"
    )
    (skills / "broken").mkdir()
    (skills / "broken" / "SKILL.md").write_text(
        "---\nname: broken\ndescription: Use when: never\n---\n"
    )
    config = tmp_path / "kesoku.toml"
    config.write_text('[workspace]\nskills_dir = "my-skills"\n')
    return config


def test_list_shows_sources_platforms_and_warnings(tmp_path: Path) -> None:
    config = make_workspace(tmp_path)
    result = kesoku("skills", "list", "-c", str(config))
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines()]
    assert rows[0] == ["NAME", "SOURCE", "PLATFORMS", "DESCRIPTION"]
    by_name = {row[0]: row for row in rows[1:] if row}
    assert by_name["writing-skills"][1:3] == ["workspace", "all"]
    assert by_name["reviewing-changes"][1:3] == ["bundled", "all"]
    assert by_name["deploy"][1:3] == ["workspace", "darwin"]
    skills_dir = (tmp_path / "my-skills").resolve()
    assert f"add a skill: {skills_dir}/<name>/SKILL.md" in result.stdout
    [warning] = result.stderr.splitlines()
    assert warning.startswith(
        f"warning: {skills_dir / 'broken' / 'SKILL.md'}:3: invalid YAML frontmatter"
    )


def test_list_for_one_platform(tmp_path: Path) -> None:
    config = make_workspace(tmp_path)
    mac = kesoku("skills", "list", "-c", str(config), "--platform", "macOS")
    assert mac.returncode == 0, mac.stderr
    assert "deploy" in mac.stdout
    linux = kesoku("skills", "list", "-c", str(config), "--platform", "linux")
    assert "deploy " not in linux.stdout
    assert "writing-skills" in linux.stdout


def test_a_bad_config_is_one_line(tmp_path: Path) -> None:
    path = BAD / "wrong_type_bool.toml"
    line = assert_operator_error(kesoku("skills", "list", "-c", str(path)))
    assert line == f"kesoku: {path}:4: discord.channels[0].auto_thread: expected bool, got str"
    missing = tmp_path / "missing.toml"
    assert (
        assert_operator_error(kesoku("skills", "list", "-c", str(missing)))
        == f"kesoku: {missing}: no such file"
    )


def test_help_teaches_the_format_and_imports_nothing_heavy(tmp_path: Path) -> None:
    result = kesoku("skills", "list", "--help")
    assert result.returncode == 0
    for words in (
        "workspace.skills_dir",
        "SKILL.md",
        "name: my-skill",
        "description:",
        "platforms",
    ):
        assert words in result.stdout, words
    assert present(loaded_modules(["skills", "list", "--help"], tmp_path), HELP_NEEDS_NONE_OF) == []
    assert "\n  skills  " in kesoku("--help").stdout
