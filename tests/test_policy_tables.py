"""The shipped bashlex tables: equal to what bashlex builds, and used only for the grammar they fit.

Each check runs in a fresh interpreter: bashlex can be imported only once per process.
"""

from __future__ import annotations

import subprocess
import sys

PARSE_CORPUS = (
    "echo hi | grep h && (cd /tmp; ls $(pwd)) > out.txt 2>&1",
    "for i in 1 2 3; do echo $i; done; while true; do break; done",
    "if [ -f x ]; then cat x; elif true; then :; else echo no; fi",
    "a=1 b=2 env FOO=bar sh -c 'rm -rf /' <(ls) >(cat) `date`",
    "f() { echo body; }; f | tee >(wc -l) || exit 3",
)


def run(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return result.stdout


def test_the_shipped_tables_are_what_bashlex_builds() -> None:
    code = (
        "from kesoku.tools.policy.tables import build_tables\n"
        "from kesoku.tools.policy import _bashlex_tables as shipped\n"
        "fingerprint, tables = build_tables()\n"
        "print(fingerprint == shipped.FINGERPRINT, tables == shipped.TABLES)\n"
    )
    assert run(code).split() == ["True", "True"], (
        "regenerate them: python -m kesoku.tools.policy.tables"
    )


def test_parses_are_the_same_with_the_shipped_tables() -> None:
    dump = (
        f"import bashlex\nfor line in {PARSE_CORPUS!r}:\n"
        "    print([p.dump() for p in bashlex.parse(line)])\n"
    )
    own = run(dump)  # bashlex builds its own tables
    shipped = run(
        "from kesoku.tools.policy.tables import import_bashlex_parser\nimport_bashlex_parser()\n"
        + dump
    )
    assert own == shipped
    assert own.count("\n") == len(PARSE_CORPUS)


def test_another_grammar_ignores_the_shipped_tables() -> None:
    code = (
        "import kesoku.tools.policy._bashlex_tables as shipped\n"
        "shipped.FINGERPRINT = 'another grammar'\n"
        "from kesoku.tools.policy import tables as policy_tables\n"
        "used = []\n"
        "original = policy_tables._from_shipped\n"
        "policy_tables._from_shipped = lambda *a: used.append(original(*a))\n"
        "policy_tables.import_bashlex_parser()\n"
        "import bashlex\n"
        "print(used == [None], len(bashlex.parse('echo ok')))\n"
    )
    assert run(code).split() == ["True", "1"]
