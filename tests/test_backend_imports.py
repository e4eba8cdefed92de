"""A backend's SDK is imported without the transports Kesoku never uses (aiohttp, h2).

The imports run in fresh interpreters: in this one the SDKs may already be loaded.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from kesoku.llm.factory import _Refuser

OPENAI = (
    "from kesoku.config.settings import Config, OpenAIConfig\n"
    "config = Config(openai=OpenAIConfig(api_key='sk-test', base_url='http://127.0.0.1:9/v1'))\n"
)


def run(code: str) -> str:
    """Run ``code`` in a fresh interpreter; its stdout."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_backend_comes_without_aiohttp_or_h2() -> None:
    out = run(
        OPENAI + "import sys\n"
        "from kesoku.llm.factory import create_llm\n"
        "print(type(create_llm(None, config)).__name__)\n"
        "print(sorted(m for m in ('openai', 'httpcore2', 'aiohttp', 'h2') if m in sys.modules))\n"
        "import h2  # after the backend's import, this thread imports it as usual\n"
    )
    assert out.splitlines() == ["OpenAILLM", "['httpcore2', 'openai']"]


def test_a_missing_sdk_is_create_llms_import_error() -> None:
    out = run(
        "import sys\n"
        "sys.modules['openai'] = None  # the SDK cannot be imported\n"
        + OPENAI
        + "from kesoku.llm.factory import create_llm\n"
        + "try:\n"
        "    create_llm('openai', config)\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, exc.name)\n"
    )
    assert out == "ModuleNotFoundError openai\n"


def test_the_refusal_holds_only_in_the_thread_that_asks_it() -> None:
    switch = threading.local()
    refuser = _Refuser(("aiohttp",), switch)
    assert refuser.find_spec("aiohttp", None) is None  # not asked: the next finder looks
    switch.active = True
    with pytest.raises(ModuleNotFoundError, match="not used by Kesoku"):
        refuser.find_spec("aiohttp.client", None)
    assert refuser.find_spec("aiohttp_retry", None) is None  # another package
    seen: list[object] = []
    other = threading.Thread(target=lambda: seen.append(refuser.find_spec("aiohttp", None)))
    other.start()
    other.join()
    assert seen == [None]
