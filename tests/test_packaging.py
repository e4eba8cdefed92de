"""What an install exposes: the right import names, bundled data, the entry points, the wheel."""

import shutil
import subprocess
import sys
import zipfile
from importlib import metadata, resources
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", ["adapters", "schema"])
def test_generic_top_level_names_are_not_importable(name: str, tmp_path: Path) -> None:
    # A fresh interpreter in an unrelated folder sees exactly what the install put on sys.path.
    proc = subprocess.run(
        [sys.executable, "-c", f"import {name}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1
    assert f"No module named '{name}'" in proc.stderr


def test_kesoku_and_the_prefixed_adapters_are_importable(tmp_path: Path) -> None:
    code = "import kesoku, kesoku_terminal, kesoku_discord, kesoku_gchat; print(kesoku.__version__)"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr


def test_schema_and_skills_are_package_data() -> None:
    schema = resources.files("kesoku").joinpath("_schema")
    names = {entry.name for entry in schema.iterdir()}
    assert "0001_initial.sql" in names
    assert "kesoku.schema.json" in names
    assert "CREATE TABLE messages" in schema.joinpath("0001_initial.sql").read_text()
    assert resources.files("kesoku").joinpath("_skills").joinpath("README.md").is_file()


def test_adapters_are_found_through_entry_points() -> None:
    found = {ep.name: ep.value for ep in metadata.entry_points(group="kesoku.adapters")}
    assert found == {
        "terminal": "kesoku_terminal",
        "discord": "kesoku_discord",
        "gchat": "kesoku_gchat",
    }


def test_the_console_script_is_declared() -> None:
    [script] = [ep for ep in metadata.entry_points(group="console_scripts") if ep.name == "kesoku"]
    assert script.value == "kesoku.cli:main"


def test_the_wheel_carries_the_symlinked_data_and_no_generic_packages(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("kesoku", "adapters", "schema", "skills"):
        # symlinks=True: kesoku/_schema and kesoku/_skills stay symlinks, as in a clone
        shutil.copytree(
            ROOT / name, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
        )
    assert (src / "kesoku" / "_schema").is_symlink()
    out = tmp_path / "dist"
    build = "from setuptools import build_meta as b; import sys; print(b.build_wheel(sys.argv[1]))"
    proc = subprocess.run(
        [sys.executable, "-c", build, str(out)],
        cwd=src,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    wheel = out / proc.stdout.strip().splitlines()[-1]
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {
        "kesoku/_schema/0001_initial.sql",
        "kesoku/_schema/kesoku.schema.json",
        "kesoku/_skills/README.md",
    } <= names
    assert {
        "kesoku_terminal/__init__.py",
        "kesoku_discord/__init__.py",
        "kesoku_gchat/__init__.py",
    } <= names
    tops = {name.split("/")[0] for name in names}
    assert not tops & {"adapters", "schema", "skills", "tests"}
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "[kesoku.adapters]" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_every_package_folder_is_listed_for_the_wheel() -> None:
    import tomllib

    repo = Path(__file__).resolve().parent.parent
    listed = set(
        tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(init.parent.relative_to(root).parts)
        for root in (repo, repo / "adapters")
        for top in (
            ["kesoku"] if root == repo else ["kesoku_terminal", "kesoku_discord", "kesoku_gchat"]
        )
        for init in (root / top).rglob("__init__.py")
        if "_schema" not in init.parts and "_skills" not in init.parts
    }
    assert found == listed, f"add to [tool.setuptools] packages: {sorted(found - listed)}"
