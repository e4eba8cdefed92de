"""Finding adapters: the entry points, kept between processes while no sys.path folder moves.

Each lookup runs in a fresh interpreter (as ``kesoku chat`` and ``kesoku start`` do), with its own
``XDG_CACHE_HOME``; a distribution is a real ``*.dist-info`` folder on ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

LOOKUP = """
import json, sys
from kesoku.host.adapters import adapter_entries
found = {e.name: e.value for e in adapter_entries()}
print(json.dumps({"found": found, "metadata": "importlib.metadata" in sys.modules}))
"""

INSTALLED = {"discord": "kesoku_discord", "gchat": "kesoku_gchat", "terminal": "kesoku_terminal"}


def lookup(tmp_path: Path, cache: Path | None = None) -> dict[str, object]:
    env = os.environ | {
        "XDG_CACHE_HOME": str(cache or tmp_path / "cache"),
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(tmp_path / "site"), os.environ.get("PYTHONPATH")])
        ),
    }
    done = subprocess.run(
        [sys.executable, "-c", LOOKUP], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def install(site: Path, name: str) -> None:
    info = site / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[kesoku.adapters]\n{name} = {name}_module:adapter\n")


def test_a_second_lookup_reads_the_first_ones_answer(tmp_path: Path) -> None:
    (tmp_path / "site").mkdir()
    first = lookup(tmp_path)
    assert first == {"found": INSTALLED, "metadata": True}
    [cached] = (tmp_path / "cache" / "kesoku").iterdir()
    assert cached.name.startswith("adapters-")
    assert lookup(tmp_path) == {"found": INSTALLED, "metadata": False}


def test_a_distribution_installed_or_removed_after_a_lookup_is_seen(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    assert lookup(tmp_path)["found"] == INSTALLED
    install(site, "extra")
    assert lookup(tmp_path) == {
        "found": INSTALLED | {"extra": "extra_module:adapter"},
        "metadata": True,
    }
    assert lookup(tmp_path)["metadata"] is False
    shutil.rmtree(site / "extra-0.1.dist-info")
    assert lookup(tmp_path) == {"found": INSTALLED, "metadata": True}


def test_a_damaged_cache_is_looked_up_again_and_replaced(tmp_path: Path) -> None:
    (tmp_path / "site").mkdir()
    lookup(tmp_path)
    [cached] = (tmp_path / "cache" / "kesoku").iterdir()
    for damage in (b"\x00{not json", b'{"stamp": 3}', b""):
        cached.write_bytes(damage)
        assert lookup(tmp_path) == {"found": INSTALLED, "metadata": True}
        assert lookup(tmp_path)["metadata"] is False


def test_a_cache_that_cannot_be_written_costs_only_time(tmp_path: Path) -> None:
    (tmp_path / "site").mkdir()
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    for _ in range(2):
        assert lookup(tmp_path, cache=blocked) == {"found": INSTALLED, "metadata": True}
    assert blocked.read_text() == "not a folder"


FIND = """
from kesoku.host.adapters import find_adapter
print(find_adapter("renamed").value)
"""


def test_an_adapter_the_cache_lacks_is_looked_for_again(tmp_path: Path) -> None:
    site = tmp_path / "site"
    install(site, "extra")
    assert lookup(tmp_path)["found"] == INSTALLED | {"extra": "extra_module:adapter"}
    # edited in place, as a re-run of egg_info does: no folder on sys.path moves
    (site / "extra-0.1.dist-info" / "entry_points.txt").write_text(
        "[kesoku.adapters]\nrenamed = extra_module:adapter\n"
    )
    env = os.environ | {
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, "-c", FIND], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "extra_module:adapter\n"
    found = lookup(tmp_path)["found"]
    assert isinstance(found, dict) and "renamed" in found  # kept for the next lookup


def test_a_relative_cache_home_is_ignored_as_xdg_says(tmp_path: Path) -> None:
    (tmp_path / "site").mkdir()
    home = tmp_path / "home"
    env = os.environ | {
        "XDG_CACHE_HOME": "relative",
        "HOME": str(home),
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(tmp_path / "site"), os.environ.get("PYTHONPATH")])
        ),
    }
    done = subprocess.run(
        [sys.executable, "-c", LOOKUP], env=env, cwd=tmp_path, capture_output=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "relative").exists()
    assert [p.name[:9] for p in (home / ".cache" / "kesoku").iterdir()] == ["adapters-"]
