"""The trajectory page in a real browser (Debian's chromium, headless) over the DevTools protocol.

Why DevTools: ``--dump-dom`` prints the page once loaded and cannot click. Chromium is started with
``--remote-debugging-port=0``, which picks a free port and writes it to ``DevToolsActivePort`` in
the (fresh) profile folder; the test connects a websocket to it (the ``websockets`` package, a
dependency of google-genai), opens the page in a new tab, clicks with real mouse events at an
element's coordinates, and reads the DOM with ``Runtime.evaluate``. No test hook lives in the page
itself.

The session comes from the real CLI: ``kesoku chat`` replays a scenario whose shell tool prints 40
lines followed by a ``<script>`` and an ``<img onerror>`` payload; ``kesoku trace`` writes the page.
The badges' session is made by ``kesoku chat`` too: turns ended by an answer, the step limit and a
spend cap.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_cli_chat import chat, kesoku
from test_trace import emoji, session_ending

from kesoku.observe.trace import PREVIEW_LINES
from kesoku.store import Store

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",  # CI runs as root, where chromium's sandbox refuses to start
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-port=0",
)
START_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 15.0

SCENARIO = """\
model: trace-demo
steps:
  - thought: "I will print <b>forty</b> lines."
    tool_calls:
      - name: shell
        arguments:
          command: |
            seq 1 40
            echo '<script>document.title = "pwned"; window.pwned = 1</script>'
            echo '<img src=x onerror="document.title = 1; window.pwned = 2">'
    usage: {input_tokens: 900, output_tokens: 20}
  - text: "Done. <script>window.pwned = 3</script>"
    usage: {input_tokens: 1300, output_tokens: 10}
"""


class DevTools:
    """A DevTools protocol connection to one chromium process, attached to one tab."""

    def __init__(self, executable: str, profile: Path) -> None:
        from websockets.sync.client import connect

        self.stack = contextlib.ExitStack()
        self.log = profile.parent / "chromium.log"
        with self.log.open("wb") as log:
            # Its own process group: the renderer and zygote go with it when the test ends.
            self.proc = subprocess.Popen(
                [executable, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (port_file.exists() and len(port_file.read_text().splitlines()) == 2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                pytest.fail(
                    f"chromium did not start: {self.log.read_text(errors='replace')[-2000:]}"
                )
            threading.Event().wait(0.05)
        port, path = port_file.read_text().splitlines()
        self.ws = self.stack.enter_context(
            connect(f"ws://127.0.0.1:{port}{path}", max_size=None, open_timeout=CALL_TIMEOUT_S)
        )
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []
        self.session_id = ""

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send a command (to the attached tab once there is one) and return its result."""
        message: dict[str, Any] = {"id": next(self.ids), "method": method, "params": params}
        if self.session_id:
            message["sessionId"] = self.session_id
        self.ws.send(json.dumps(message))
        while True:
            reply = json.loads(self.ws.recv(timeout=CALL_TIMEOUT_S))
            if reply.get("id") == message["id"]:
                if "error" in reply:
                    raise AssertionError(f"{method}: {reply['error']}")
                return dict(reply["result"])
            self.events.append(reply)

    def wait_event(self, method: str) -> dict[str, Any]:
        """Return the first event of this kind, received already or next."""
        while True:
            for event in self.events:
                if event.get("method") == method:
                    self.events.remove(event)
                    return event
            self.events.append(json.loads(self.ws.recv(timeout=CALL_TIMEOUT_S)))

    def open(self, url: str) -> None:
        """Open a tab, attach to it, and load ``url`` with console and log messages recorded."""
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session_id = self.call("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        self.call("Page.navigate", url=url)
        self.wait_event("Page.loadEventFired")

    def js(self, expression: str) -> Any:
        """Evaluate in the page and return the value
        (DevTools evaluation is not subject to the page's CSP)."""
        result = self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def click(self, selector: str) -> None:
        """Click the centre of the element with real mouse events, as a person would."""
        box = self.js(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.call(
                "Input.dispatchMouseEvent",
                type=kind,
                x=box[0],
                y=box[1],
                button="left",
                clickCount=1,
            )

    def close(self) -> None:
        """Close the browser, and kill its process group if it does not leave."""
        try:
            if hasattr(self, "ws"):
                self.session_id = ""
                self.call("Browser.close")
                self.stack.close()
            self.proc.wait(timeout=10)
        except Exception:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.skip(
            "chromium is not installed and could not be: "
            ".ci/run installs it (apt-get install -y chromium)"
        )
    return path


@pytest.fixture
def browser(chromium: str, tmp_path: Path) -> Iterator[DevTools]:
    tools = DevTools(chromium, tmp_path / "profile")
    try:
        yield tools
    finally:
        tools.close()


def traced_page(tmp_path: Path) -> Path:
    """Run the scenario through ``kesoku chat`` and write its trace with ``kesoku trace``."""
    (tmp_path / "scenario.yaml").write_text(SCENARIO)
    (tmp_path / "kesoku.toml").write_text(
        '[agent]\nllm = "scripted"\n[scripted]\npath = "scenario.yaml"\n'
    )
    answered = chat(tmp_path, "Print forty lines")
    assert answered.returncode == 0, answered.stderr
    store = Store(tmp_path / "kesoku.db")
    try:
        (session,) = store.list_sessions()
    finally:
        store.close()
    page = tmp_path / "trace.html"
    written = kesoku(tmp_path, "trace", session.id[:6], "-o", str(page))
    assert written.returncode == 0, written.stderr
    return page


def test_a_long_tool_result_expands_on_click_and_no_payload_runs(
    browser: DevTools, tmp_path: Path
) -> None:
    page = traced_page(tmp_path)
    browser.open(page.as_uri())
    # The payloads would have changed the title or set window.pwned while the page loaded.
    assert browser.js("document.title") == "Print forty lines · Kesoku trace"
    assert browser.js("typeof window.pwned") == "undefined"
    assert browser.js("document.querySelectorAll('img').length") == 0
    assert browser.js("document.scripts.length") == 1  # the page's own
    # The result shows its first lines; the rest is behind a closed expand control.
    head = browser.js("document.querySelector('.result .head').innerText").splitlines()
    assert len(head) == PREVIEW_LINES and head[0] == "$ seq 1 40"
    rest = "document.querySelector('.result details.more')"
    assert browser.js(f"{rest}.open") is False
    assert browser.js(f"{rest}.querySelector('.rest').checkVisibility()") is False
    browser.click(".result details.more > summary")
    assert browser.js(f"{rest}.open") is True
    assert browser.js(f"{rest}.querySelector('.rest').checkVisibility()") is True
    shown = browser.js(f"{rest}.querySelector('.rest').innerText")
    assert shown.splitlines()[0] == str(int(head[-1]) + 1) and "40" in shown.splitlines()
    # The payloads are there as text, exactly as the tool printed them.
    assert '<script>document.title = "pwned"; window.pwned = 1</script>' in shown
    assert '<img src=x onerror="document.title = 1; window.pwned = 2">' in shown
    assert "Done. <script>window.pwned = 3</script>" in browser.js("document.body.innerText")
    # Escaping alone kept them inert: the CSP (the second line of defence) had nothing to block.
    logged = [
        e["params"]["entry"]["text"] for e in browser.events if e.get("method") == "Log.entryAdded"
    ]
    assert not [t for t in logged if "Content Security Policy" in t], logged
    assert browser.js("typeof window.pwned") == "undefined"


def test_the_page_script_runs_under_its_csp_and_expands_everything(
    browser: DevTools, tmp_path: Path
) -> None:
    page = traced_page(tmp_path)
    browser.open(page.as_uri())
    closed = "[...document.querySelectorAll('details')].filter(d => !d.open).length"
    assert browser.js(closed) == 2  # the thought and the rest of the long result
    browser.click("button[data-open='1']")
    assert browser.js(closed) == 0
    assert "I will print <b>forty</b> lines." in browser.js(
        "document.querySelector('.thought pre').innerText"
    )
    browser.click("button[data-open='0']")
    assert browser.js("[...document.querySelectorAll('details')].filter(d => d.open).length") == 0


def test_each_turn_badge_says_how_it_ended_with_icons_drawn_in_the_page(
    browser: DevTools, tmp_path: Path
) -> None:
    sid = session_ending(tmp_path, "done", "step_limit", "budget")
    page = tmp_path / "trace.html"
    written = kesoku(tmp_path, "trace", sid, "-o", str(page))
    assert written.returncode == 0, written.stderr
    browser.open(page.as_uri())
    shown = browser.js(
        "[...document.querySelectorAll('h2 .badge')].map(b => [b.classList[1], b.innerText.trim()])"
    )
    assert shown == [["done", "done"], ["step_limit", "step limit"], ["budget", "spend cap"]]
    # Every icon is drawn: its box has a size and its <use> found its symbol in the page (a missing
    # one draws nothing: an empty bounding box), under the CSP that fetches nothing.
    drawn = browser.js(
        "[...document.querySelectorAll('svg.ic')].map(s => {"
        " const r = s.getBoundingClientRect(), b = s.querySelector('use').getBBox();"
        " return [s.querySelector('use').getAttribute('href'), r.width > 0 && b.width > 0"
        " && b.height > 0]; })"
    )
    assert {href for href, _ in drawn} >= {"#i-done", "#i-step_limit", "#i-budget", "#i-user"}
    assert [href for href, ok in drawn if not ok] == []
    # The text the page shows, stored text (in <pre>) aside, needs no emoji font.
    text = browser.js(
        "(() => { const w = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);"
        " const out = []; while (w.nextNode()) {"
        " if (!w.currentNode.parentElement.closest('pre')) out.push(w.currentNode.data); }"
        " return out.join(''); })()"
    )
    assert "step limit" in text and "spend cap" in text
    assert not emoji(text)
