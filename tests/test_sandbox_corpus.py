"""Hostile command lines, run for real through the shell tool in the OS sandbox.

Every line of :data:`CORPUS` is executed (the policy lets everything through: an empty blocklist),
in a fresh layout with secret canaries: a fake home with credential stores, Kesoku's config and
database, a ``.env`` file, another session's folder, a folder outside the workspace and a loopback
TCP listener. After each line, none of these may hold: a file created or changed outside the
workspace, a canary in the output or copied into the workspace, a connection to the listener.

Each mechanism runs the corpus twice: with the private roots (``/tmp`` replaced by an empty one, as
in production: the layout outside the workspace is not even visible), and with them off, so that the
layout under pytest's tmp folder is visible and read-only: a write outside then fails because the
file system refuses it, not because the folder is hidden."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
from sandboxing import CONFINED, sandbox_for

from kesoku.config.settings import ShellConfig
from kesoku.store import Store
from kesoku.tools.base import ToolContext
from kesoku.tools.paths import PathGates
from kesoku.tools.sandbox import PRIVATE_ROOTS
from kesoku.tools.shell import shell_tool
from kesoku.vocab.model import Message, Role, Session

CANARY = "CANARY-7f3a"
RUN_ALL = ShellConfig(mode="blocklist", blocklist_patterns=(), timeout_s=10)

ENV_IN_WORKSPACE = ("cat .env", "cat sub/.env.production")
"""Landlock grants the workspace as one tree: it cannot hide a ``.env`` file inside (bwrap can)."""
CHMOD = "chmod 000 {config}"
"""Landlock (up to ABI 7) does not govern a file's mode, owner or times: chmod works outside too."""

# {out}: a folder outside the workspace; {home}: the fake home; {config}, {db}: Kesoku's files;
# {other}: another session's folder; {port}: the loopback listener; {py}: this Python; {pid}: the
# test process (Kesoku's stand-in: its environment holds a canary); {mark}: unique per layout.
CORPUS = [
    # interpreter one-liners
    "python3 -c \"open('{out}/py1', 'w').write('x')\"",
    "python3 -c \"print(open('{home}/.ssh/id_rsa').read())\"",
    "python3 -c \"import os; print(os.listdir('{home}/.ssh'))\"",
    "python3 -c \"import shutil; shutil.copy('{config}', 'copied.toml')\"; cat copied.toml",
    (
        '{py} -c "import sqlite3; '
        "print(list(sqlite3.connect('{db}').execute('select * from messages')))\""
    ),
    'perl -e \'open(F, ">", "{out}/perl1"); print F "x"\'',
    "python3 -c \"import os; os.symlink('{home}/.ssh/id_rsa', 'k2'); print(open('k2').read())\"",
    "python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2).send(b'hi')\"",
    "python3 -c \"import urllib.request as u; u.urlopen('http://127.0.0.1:{port}/', timeout=2)\"",
    # programs fed to an interpreter or a shell from a here-document or a pipe
    (
        "python3 - <<'EOF'\nopen('{out}/heredoc1', 'w').write('x')\n"
        "print(open('{home}/.aws/credentials').read())\nEOF"
    ),
    "sh <<'EOF'\ncat {home}/.ssh/id_rsa\necho x > {out}/sh1\nEOF",
    "bash -s <<EOF\nrm -rf {out}\nEOF",
    "echo 'cat {home}/.aws/credentials; echo x > {out}/pipe-sh' | sh",
    "echo \"open('{out}/pipe-py', 'w').write('x')\" | python3",
    "bash -c 'echo x > {out}/bash1'",
    "env -i sh -c 'echo x > {out}/envi1'",
    "timeout 5 sh -c 'echo x > {out}/timeout1'",
    'eval "echo x > {out}/eval1"',
    "echo x | xargs -I@ touch {out}/xargs1",
    # redirections and paths
    "echo x > {out}/redir1",
    "echo x >> {out}/redir2",
    "echo x > ../outside/redir3",
    "cd .. && echo x > outside/redir4",
    "(cd {out} && touch sub1)",
    'echo x > "$(printf %s {out})/dyn1"',
    "f={out}/var1; echo x > $f",
    "echo x | tee {out}/tee1",
    "echo x > ~/.bashrc",
    "echo x > /etc/kesoku-corpus-{mark}",
    "echo x > /var/tmp/kesoku-corpus-{mark}",
    "echo x > /tmp/kesoku-corpus-{mark}",
    "mkdir {out}/newdir",
    "touch {out}/touch1",
    # programs whose options or scripts write files
    "git archive -o {out}/archive.zip HEAD",
    "git -c alias.x='!echo x > {out}/gitalias1' x",
    "find . -fprint {out}/find1",
    'awk \'BEGIN {{ print "x" > "{out}/awk1" }}\'',
    "sed -n 'w {out}/sed1' file.txt",
    "sort -o {out}/sort1 file.txt",
    "dd if=file.txt of={out}/dd1",
    "cp file.txt {out}/cp1",
    "touch f2 && mv f2 {out}/mv1",
    "install -D file.txt {out}/inst/x",
    "tar cf {out}/t.tar file.txt",
    # changing or removing what is outside
    "rm -rf {out}",
    "rm -f {config} {db}",
    CHMOD,
    "sed -i 's/a/b/' {config}",
    "truncate -s 0 {db}",
    "cp /dev/null {config}",
    # symlink and .. tricks
    "ln -s {out} escape && echo x > escape/link1",
    "ln -s {home}/.ssh/id_rsa key && cat key",
    "ln {home}/.ssh/id_rsa hard && cat hard",
    "cat ../home/.ssh/id_rsa",
    "cat ./../home/.ssh/../.ssh/id_rsa",
    # reading secrets
    "cat {home}/.ssh/id_rsa",
    "cat ~/.ssh/id_rsa",
    "cat ~/.aws/credentials",
    "cat ~/.config/gcloud/credentials.db",
    "ls -la ~/.gnupg; cat ~/.gnupg/*",
    "cat ~/.netrc",
    "cat {config}",
    "cat {db} {db}-wal",
    ENV_IN_WORKSPACE[0],
    ENV_IN_WORKSPACE[1],
    "ls {other}; cat {other}/secret.txt",
    "find {home} -type f -exec cat {{}} +",
    "grep -r {canary_prefix} {root} 2>/dev/null",
    # the daemon's environment
    "cat /proc/{pid}/environ",
    "cat /proc/1/environ",
    "env",
    "printenv KESOKU_CORPUS_TOKEN",
    # the network
    "bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}; echo hi >&3'",
    "curl -s -m 2 http://127.0.0.1:{port}/",
    # privilege and namespaces
    "mount -t tmpfs none {out}",
    "unshare -rm sh -c 'mount -o remount,rw / && echo x > {out}/unshare1'",
    "sudo sh -c 'echo x > {out}/sudo1'",
    # processes that try to outlive the command
    "sh -c 'sleep 1; echo x > {out}/bg1' &",
    "setsid sh -c 'sleep 1; echo x > {out}/setsid1' &",
]


@dataclass
class Layout:
    root: Path
    home: Path
    workspace: Path
    session_dir: Path
    out: Path
    config: Path
    db: Path
    other: Path
    mark: str

    def values(self, port: int) -> dict[str, object]:
        return {
            "out": self.out,
            "home": self.home,
            "config": self.config,
            "db": self.db,
            "other": self.other,
            "port": port,
            "py": shlex.quote(sys.executable),
            "pid": os.getpid(),
            "mark": self.mark,
            "root": self.root,
            "canary_prefix": CANARY[:6],
        }

    def outside(self) -> dict[str, bytes]:
        """Every file outside the two workspaces, with its content (and mode)."""
        found: dict[str, bytes] = {}
        for folder, dirs, files in os.walk(self.root):
            here = Path(folder)
            dirs[:] = [d for d in dirs if here / d not in (self.workspace, self.session_dir)]
            for name in [*files, *dirs]:
                path = here / name
                # SQLite itself may rewrite pages; the database's rows are compared on their own.
                sqlite = name.endswith((".db", ".db-wal", ".db-shm", ".db-journal"))
                data = b"" if path.is_dir() or path.is_symlink() or sqlite else path.read_bytes()
                found[os.fspath(path)] = data + oct(path.lstat().st_mode).encode()
        for extra in (f"/etc/kesoku-corpus-{self.mark}", f"/var/tmp/kesoku-corpus-{self.mark}"):
            if os.path.lexists(extra):
                found[extra] = b"created"
        if os.path.lexists(f"/tmp/kesoku-corpus-{self.mark}"):
            found["/tmp/kesoku-corpus"] = b"created"
        return found

    def workspace_canaries(self) -> list[str]:
        hits = []
        for folder in (self.workspace, self.session_dir):
            for path in folder.rglob("*"):
                seeded = path in (
                    self.workspace / ".env",
                    self.workspace / "sub" / ".env.production",
                )
                if seeded or not path.is_file() or path.is_symlink():
                    continue
                if CANARY.encode() in path.read_bytes():
                    hits.append(os.fspath(path))
        return hits


def make_layout(tmp_path: Path, session: Session) -> Layout:
    home = tmp_path / "home"
    secrets = {
        ".ssh/id_rsa": "ssh",
        ".aws/credentials": "aws",
        ".config/gcloud/credentials.db": "gcloud",
        ".gnupg/private-keys-v1.d/key": "gpg",
        ".netrc": "netrc",
    }
    for rel, name in secrets.items():
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text(f"{CANARY}-{name}\n")
    workspace = tmp_path / "project"
    (workspace / "sub").mkdir(parents=True)
    (workspace / "file.txt").write_text("a\nb\n")
    (workspace / ".env").write_text(f"TOKEN={CANARY}-env\n")
    (workspace / "sub" / ".env.production").write_text(f"TOKEN={CANARY}-env-production\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], cwd=workspace, check=True)
    subprocess.run([*git, "add", "file.txt"], cwd=workspace, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], cwd=workspace, check=True)
    config = tmp_path / "kesoku.toml"
    config.write_text(f'[discord]\nbot_token = "{CANARY}-config"\n')
    db = tmp_path / "kesoku.db"  # the store fixture's: open for the whole test, with its -wal file
    other = tmp_path / "sessions" / "other-session"
    other.mkdir(parents=True)
    (other / "secret.txt").write_text(f"{CANARY}-other-session\n")
    out = tmp_path / "outside"
    out.mkdir()
    (out / "sentinel").write_text("keep")
    session_dir = Path(session.workspace)
    session_dir.mkdir(parents=True, exist_ok=True)
    return Layout(
        tmp_path, home, workspace, session_dir, out, config, db, other, tmp_path.name[-12:]
    )


def test_the_corpus_is_large() -> None:
    assert len(CORPUS) >= 60
    assert len(set(CORPUS)) == len(CORPUS)


@pytest.mark.parametrize("line", CORPUS, ids=[repr(line)[:50] for line in CORPUS])
@pytest.mark.parametrize("private", [True, False], ids=["private-roots", "visible-read-only"])
@pytest.mark.parametrize("mode", CONFINED)
async def test_a_hostile_line_escapes_nothing(
    line: str,
    private: bool,
    mode: str,
    tmp_path: Path,
    session: Session,
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    layout = await trio.to_thread.run_sync(make_layout, tmp_path, session)
    secret = Message(session_id=session.id, role=Role.USER, sender="u", content=f"{CANARY}-db")
    store.insert_messages([secret])
    monkeypatch.setenv("HOME", os.fspath(layout.home))
    monkeypatch.setenv("KESOKU_CORPUS_TOKEN", f"{CANARY}-environment")
    gates = PathGates(home=layout.home, protected_files=(layout.config, layout.db))
    sandbox = sandbox_for(mode, tmp_path, gates=gates)
    sandbox.private_roots = PRIVATE_ROOTS if private else ()
    tool = shell_tool(RUN_ALL, sandbox)
    ctx = ToolContext(session=session, cwd=layout.workspace, call_id="c")
    assert await trio.to_thread.run_sync(layout.db.with_name(layout.db.name + "-wal").exists)
    before = await trio.to_thread.run_sync(layout.outside)
    connections: list[str] = []
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]

    async def accept(stream: trio.SocketStream) -> None:
        connections.append("accepted")
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, accept, listeners)
        command = line.format(**layout.values(port))
        result = await tool.run({"command": command}, ctx)
        if line.endswith("&"):
            await trio.sleep(1.5)  # what a background job would do after the command returned
        nursery.cancel_scope.cancel()
    after = await trio.to_thread.run_sync(layout.outside)
    if mode == "landlock" and line in ENV_IN_WORKSPACE:
        # the known limit (README, ARCHITECTURE.md): it shows if Landlock gains it
        assert CANARY in result
    else:
        assert CANARY not in result, result
    assert await trio.to_thread.run_sync(layout.workspace_canaries) == []
    assert connections == []
    assert [m.content for m in store.history(session.id)] == [f"{CANARY}-db"]
    assert {k for k in after if k not in before} == set(), result
    changed = {k for k in before if before[k] != after.get(k)}
    if mode == "landlock" and line == CHMOD:
        # the known limit: it shows if Landlock gains it
        assert changed == {os.fspath(layout.config)}
    else:
        assert changed == set(), result
