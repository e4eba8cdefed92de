"""Taint sources: recorded once per (kind, label), kept in SQLite, and read back by a new worker."""

from __future__ import annotations

from pathlib import Path

from runtime_harness import serve_runtime

from kesoku.agent.guard import SessionGuard
from kesoku.store import Store
from kesoku.testing import ScriptedLLM
from kesoku.tools.files import file_tools
from kesoku.tools.paths import PathGates
from kesoku.vocab.model import Attachment, TaintSource, user_text


def test_the_store_keeps_each_source_once_in_order(tmp_path: Path) -> None:
    store = Store(tmp_path / "kesoku.db")
    try:
        sid = store.create_session("terminal", "chan", workspace_root=tmp_path / "sessions").id
        store.add_taint(sid, [TaintSource("url", "https://a.test"), TaintSource("file", "/srv/x")])
        store.add_taint(sid, [TaintSource("url", "https://a.test"), TaintSource("mcp", "search")])
        assert store.taint_sources(sid) == [
            TaintSource("url", "https://a.test"),
            TaintSource("file", "/srv/x"),
            TaintSource("mcp", "search"),
        ]
        store.delete_session(sid)
        assert store.taint_sources(sid) == []
    finally:
        store.close()


async def test_attachments_and_outside_reads_taint_the_session_durably(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "guide.md").write_text("outside guidance\n")
    tools = file_tools(PathGates(readable_roots=(docs,), home=tmp_path / "home"))
    llm = ScriptedLLM(
        [
            {"tool_calls": [{"name": "read_file", "arguments": {"path": str(docs / "guide.md")}}]},
            {"text": "read it"},
        ]
    )
    async with serve_runtime(tmp_path, llm, tools=tools) as h:
        (tmp_path / "report.pdf").write_bytes(b"%PDF-1.4 tiny")
        report = Attachment(
            path=str(tmp_path / "report.pdf"), mime_type="application/pdf", filename="report.pdf"
        )
        await h.gateway.post(user_text(h.session.id, "look", attachments=(report,)))
        await h.turn_end()
        assert h.store.taint_sources(h.session.id) == [
            TaintSource("attachment", "report.pdf"),
            TaintSource("file", str(docs / "guide.md")),
        ]
        # A later worker (after a restart) starts from what the store holds.
        fresh = SessionGuard(h.store, h.rt.questions, h.session.id)
        assert fresh.tainted
        assert fresh.taint_sources() == tuple(h.store.taint_sources(h.session.id))


async def test_an_untouched_session_is_not_tainted(tmp_path: Path) -> None:
    async with serve_runtime(tmp_path, ScriptedLLM([{"text": "hi"}])) as h:
        await h.say("hello")
        await h.turn_end()
        assert h.store.taint_sources(h.session.id) == []
        assert not SessionGuard(h.store, h.rt.questions, h.session.id).tainted
