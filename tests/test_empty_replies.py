"""No empty success: a reply without content or stop reason fails the call: retried, then one line.

The llama.cpp server answers a prompt over its ``n_ctx`` with HTTP 200 and an empty body; before,
``kesoku chat`` printed nothing and exited 0.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import trio
from runtime_harness import serve_runtime
from test_cli_chat import CLEARED
from test_openai import openai, request

from kesoku.testing import ScriptedLLM
from kesoku.testing.fakes.openai_api import EmptyReply, OpenAIFake
from kesoku.testing.fakes.openai_api import text_reply as openai_text
from kesoku.vocab.errors import BackendError
from kesoku.vocab.ir import StopEvent, StopReason
from kesoku.vocab.metrics import TurnState
from kesoku.vocab.model import Role

pytestmark = pytest.mark.filterwarnings(
    r"ignore:Async generator '(openai|httpx2|httpcore2)\.[\w.]+' "
    r"was garbage collected:ResourceWarning"
)


async def test_an_empty_200_is_a_failed_call_retried_then_one_line(tmp_path: Path) -> None:
    fake = OpenAIFake()
    fake.push(EmptyReply(), EmptyReply(), EmptyReply())
    async with openai(fake, max_retries=2) as llm:
        llm.backoff_cap_s = 0.0
        async with serve_runtime(tmp_path, llm) as h:
            await h.say("a prompt over n_ctx")
            state = (await h.turn_end()).state
            history = h.history()
    assert state is TurnState.FAILED
    assert len(fake.bodies) == 3  # the call and its two retries
    notice = history[-1]
    assert notice.role is Role.SYSTEM
    assert notice.content.startswith(
        "⚠ The model call failed: openai: the server answered with nothing"
    )
    assert "\n" not in notice.content


async def test_an_empty_200_then_an_answer_succeeds() -> None:
    fake = OpenAIFake()
    fake.push(EmptyReply(), openai_text("fine"))
    async with openai(fake) as llm:
        llm.backoff_cap_s = 0.0
        response = await llm.generate(request())
    assert (response.text, response.stop_reason) == ("fine", StopReason.END)


async def test_a_step_with_no_stop_reason_and_no_content_is_not_a_success() -> None:
    llm = ScriptedLLM([{"stop": "none"}, {"stop": "none"}], max_retries=1)
    llm.backoff_cap_s = 0.0
    with pytest.raises(BackendError, match="answered with nothing"):
        await llm.generate(request())
    # A reply that said it ended, with nothing in it, is an (empty) answer.
    empty = ScriptedLLM([{}])
    events = [e async for e in empty.stream(request())]
    assert events == [StopEvent(StopReason.END, "end")]


async def test_kesoku_chat_one_shot_exits_1_on_an_empty_200(tmp_path: Path) -> None:
    # its window is asked: no warning
    fake = OpenAIFake(api_key=None, server="llama.cpp", window=8192)
    fake.push(EmptyReply(), EmptyReply())
    async with fake.serve() as url:
        (tmp_path / "kesoku.toml").write_text(
            '[agent]\nllm = "openai"\nmax_retries = 1\nretry_cap_s = 0.01\n'
            f'[openai]\nbase_url = "{url}"\nmodel_name = "llama"\n'
        )
        env = {k: v for k, v in os.environ.items() if k not in CLEARED} | {
            "XDG_STATE_HOME": str(tmp_path / "state")
        }
        command = [
            sys.executable,
            "-m",
            "kesoku",
            "chat",
            "-c",
            str(tmp_path / "kesoku.toml"),
            "hello",
        ]
        with trio.fail_after(120):
            result = await trio.run_process(
                command,
                cwd=tmp_path,
                env=env,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    assert result.returncode == 1
    assert result.stdout == b""
    line, how = result.stderr.decode().splitlines()  # why, then how to go on
    assert line.startswith("⚠ The model call failed: openai: the server answered with nothing")
    assert how.startswith("continue with: kesoku chat --session ")
    assert len(fake.bodies) == 2
