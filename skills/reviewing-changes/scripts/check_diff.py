#!/usr/bin/env python3
"""Check a git diff before it is committed: what changed, and what must not go in.

Usage:
    python check_diff.py [--staged | --base REF] [--repo PATH]

Without options it checks the working tree against HEAD (staged and unstaged changes); --staged
checks only what `git commit` would record; --base REF checks everything since REF (a branch or
commit).

It prints a summary (files, lines added and removed) and findings on added lines, each as
`path:line: LEVEL: what`:
  error   merge conflict markers, private keys, tokens and passwords that look real
  warning debugger calls left in (breakpoint(), pdb, console.log, debugger;), trailing whitespace,
          files over 1 MB, untracked files that are not part of the check
  note    TODO/FIXME/XXX added

Exit status: 0 no errors (warnings may be printed), 1 at least one error, 2 git failed or bad usage.
Standard library only; Python 3.8 or newer.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

LARGE_BYTES = 1_000_000
MAX_FINDINGS = 200

ERRORS = [
    (re.compile(r"^(<{7}|>{7})( |$)|^={7}$"), "merge conflict marker"),
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"), "a private key"),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), "an AWS access key id"),
    (re.compile(r"\b(ghp|gho|ghs|ghu|github_pat)_[A-Za-z0-9_]{20,}"), "a GitHub token"),
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"), "a Slack token"),
    (re.compile(r"\bsk-(ant-|proj-)?[A-Za-z0-9_-]{20,}"), "an API secret key (sk-...)"),
    (re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b"), "a Google API key"),
    (
        re.compile(
            r"""(?i)\b(api[_-]?key|secret|token|passw(or)?d)\b["']?\s*[:=]\s*["'][^"'\s$<{]{8,}["']"""
        ),
        "a hard-coded credential",
    ),
]
WARNINGS = [
    (re.compile(r"\bbreakpoint\(\)|\bpdb\.set_trace\(|\bimport pdb\b"), "a debugger call"),
    (re.compile(r"\bconsole\.log\(|^\s*debugger;"), "a debugging statement"),
    (re.compile(r"[ \t]+$"), "trailing whitespace"),
]
NOTES = [(re.compile(r"\b(TODO|FIXME|XXX)\b"), "a new TODO/FIXME")]
HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,\d+)? @@")


def git(repo: str, *args: str) -> str:
    """Run git in ``repo`` and return its output; exit 2 with git's message when it fails."""
    proc = subprocess.run(
        ["git", "-c", "core.quotePath=false", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        encoding="utf-8",
        errors="replace",
        check=False,
    )
    if proc.returncode != 0:
        sys.stderr.write(f"check_diff: git {' '.join(args)} failed: {proc.stderr.strip()}\n")
        raise SystemExit(2)
    return proc.stdout


def diff_args(args: argparse.Namespace, repo: str) -> list[str]:
    """The ``git diff`` arguments selecting what to check."""
    if args.staged:
        return ["--cached"]
    if args.base:
        return [args.base]
    has_head = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", "HEAD"],
        cwd=repo,
        capture_output=True,
        check=False,
    )
    return ["HEAD"] if has_head.returncode == 0 else ["--cached"]


def scan(patch: str) -> list[tuple[str, int, str, str]]:
    """Findings ``(path, line, level, what)`` on the added lines of a unified diff."""
    findings = []
    path, line = "", 0
    for raw in patch.splitlines():
        if raw.startswith("+++ "):
            target = raw[4:]
            path = (
                "" if target == "/dev/null" else target[2:] if target.startswith("b/") else target
            )
            continue
        if raw.startswith("--- ") or raw.startswith("diff --git"):
            continue
        match = HUNK.match(raw)
        if match:
            line = int(match.group(1))
            continue
        if raw.startswith("+") and path:
            text = raw[1:]
            for level, rules in (("error", ERRORS), ("warning", WARNINGS), ("note", NOTES)):
                for pattern, what in rules:
                    if pattern.search(text):
                        findings.append((path, line, level, what))
            line += 1
    return findings


def main(argv: list[str] | None = None) -> int:
    """Print the summary and the findings; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--staged", action="store_true", help="only the staged changes (what a commit records)"
    )
    which.add_argument("--base", metavar="REF", help="everything since REF")
    parser.add_argument("--repo", default=".", help="the repository (default: the current folder)")
    args = parser.parse_args(argv)
    repo = os.path.abspath(args.repo)
    top = git(repo, "rev-parse", "--show-toplevel").strip()
    selection = diff_args(args, top)

    numstat = git(top, "diff", "--numstat", "--no-renames", *selection)
    files = []
    for row in numstat.splitlines():
        added, removed, name = row.split("\t", 2)
        files.append((name, added, removed))
    added_total = sum(int(a) for _, a, _ in files if a.isdigit())
    removed_total = sum(int(r) for _, _, r in files if r.isdigit())
    what = (
        "staged changes"
        if args.staged
        else f"changes since {args.base}"
        if args.base
        else "working tree vs HEAD"
    )
    print(f"{what}: {len(files)} file(s), +{added_total} -{removed_total}")
    for name, added, removed in files:
        kind = "binary" if added == "-" else f"+{added} -{removed}"
        print(f"  {name}  {kind}")

    findings = scan(
        git(top, "diff", "--unified=0", "--no-color", "--no-renames", "--no-ext-diff", *selection)
    )
    for name, _, _ in files:
        full = os.path.join(top, name)
        if os.path.isfile(full) and os.path.getsize(full) > LARGE_BYTES:
            findings.append((name, 0, "warning", f"a large file ({os.path.getsize(full)} bytes)"))
    if not args.base:
        untracked = git(top, "ls-files", "--others", "--exclude-standard").splitlines()
        for name in untracked[:20]:
            findings.append(
                (name, 0, "warning", "untracked: not in this check nor in a commit until added")
            )
        if len(untracked) > 20:
            findings.append(
                (f"({len(untracked) - 20} more untracked files)", 0, "warning", "see git status")
            )
    if args.staged:
        unstaged = git(top, "diff", "--name-only").splitlines()
        for name in unstaged[:20]:
            findings.append(
                (name, 0, "note", "has unstaged changes that this commit would not include")
            )

    if findings:
        print("findings:")
        for name, line, level, text in findings[:MAX_FINDINGS]:
            where = f"{name}:{line}" if line else name
            print(f"  {where}: {level}: {text}")
        if len(findings) > MAX_FINDINGS:
            print(f"  … {len(findings) - MAX_FINDINGS} more")
    errors = sum(1 for f in findings if f[2] == "error")
    print(f"result: {errors} error(s), {sum(1 for f in findings if f[2] == 'warning')} warning(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
