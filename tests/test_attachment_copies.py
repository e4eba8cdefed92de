"""saved_copy: the file an earlier take-in of a message saved, found so it is not saved twice."""

from __future__ import annotations

import os
from pathlib import Path

from kesoku.tools.attachments import save_attachment, saved_copy


def test_the_copy_saved_before_is_found_under_its_name_or_a_numbered_one(tmp_path: Path) -> None:
    first = save_attachment(tmp_path, "../report.txt", b"one")
    second = save_attachment(tmp_path, "../report.txt", b"two")
    assert (first.name, second.name) == ("_report.txt", "_report (1).txt")
    assert saved_copy(tmp_path, "../report.txt", b"one") == first
    assert saved_copy(tmp_path, "../report.txt", b"two") == second
    assert saved_copy(tmp_path, "../report.txt", b"three") is None
    assert saved_copy(tmp_path, "other.txt", b"one") is None
    assert saved_copy(tmp_path / "missing", "report.txt", b"one") is None


def test_a_copy_taken_by_the_same_message_or_changed_since_is_not_reused(tmp_path: Path) -> None:
    first = save_attachment(tmp_path, "a.txt", b"same")
    assert saved_copy(tmp_path, "a.txt", b"same", exclude={first}) is None
    first.write_bytes(b"edited by the agent")
    assert saved_copy(tmp_path, "a.txt", b"same") is None
    first.write_bytes(b"sam")  # same start, shorter: not the file sent
    assert saved_copy(tmp_path, "a.txt", b"same") is None


def test_a_symbolic_link_is_never_taken_for_a_copy(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(b"data")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    os.symlink(outside / "secret.txt", workspace / "secret.txt")
    assert saved_copy(workspace, "secret.txt", b"data") is None
    saved = save_attachment(workspace, "secret.txt", b"data")
    assert saved.name == "secret (1).txt"
    assert saved_copy(workspace, "secret.txt", b"data") == saved
