"""Asking an OpenAI-compatible server for its model's context window (Ollama, llama.cpp, vLLM).

The Chat Completions API has no such field, so each server is asked in its own dialect; the first
answer wins, and a server that answers none of them gets None (the caller falls back to a small
default and says so). Wire shapes:

- llama.cpp server: ``GET /props`` → ``default_generation_settings.n_ctx``, the window the server
  was started with (``-c``; tools/server/README.md, "GET /props").
- Ollama: ``POST /api/show`` with ``{"model": …}`` → the Modelfile's ``num_ctx`` in
  ``parameters`` (a text of ``name value`` lines), else ``model_info["<arch>.context_length"]``
  with ``<arch>`` from ``model_info["general.architecture"]`` (docs/api.md, "Show Model
  Information"). Without a ``num_ctx`` Ollama runs the model at its server default
  (``OLLAMA_CONTEXT_LENGTH``), which the API does not report; set the window under
  ``[compaction.context_windows]`` then.
- vLLM: ``GET /v1/models`` → ``data[].max_model_len`` of the entry whose ``id`` is the model
  (vllm/entrypoints/openai/protocol.py, ``ModelCard``).

Every answer is untrusted: anything but a positive integer where one is expected counts as no
answer.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import openai as openai_sdk

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 5.0
"""Timeout of each question to the server (it is asked once per backend)."""


async def ask_window(client: openai_sdk.AsyncOpenAI, base_url: str, model: str) -> int | None:
    """The model's context window as the server reports it, in tokens.

    Args:
        client: The backend's SDK client (its key, headers and transport).
        base_url: The server's OpenAI-compatible base URL, up to and including ``/v1``.
        model: The model id as the server knows it.

    Returns:
        Tokens, or None when no dialect answered with one. Never raises for the server's failures
        (refused connections, 404s, odd bodies).

    Cancellation:
        Propagates; nothing is cached by this function.
    """
    root = server_root(base_url)
    probes: tuple[tuple[str, str, dict[str, Any] | None], ...] = (
        ("llama.cpp", f"{root}/props", None),
        ("ollama", f"{root}/api/show", {"model": model}),
        ("vllm", f"{base_url.rstrip('/')}/models", None),
    )
    for kind, url, body in probes:
        data = await _fetch(client, url, body)
        if data is None:
            continue
        window = parse_window(kind, data, model)
        if window is not None:
            log.info(
                "%s server at %s reports a context window of %d tokens for %s",
                kind,
                root,
                window,
                model,
            )
            return window
    return None


def server_root(base_url: str) -> str:
    """The server's root URL, where /props and /api live: the base URL minus a trailing ``/v1``."""
    parts = urlsplit(base_url.rstrip("/"))
    path = parts.path[: -len("/v1")] if parts.path.endswith("/v1") else parts.path
    return urlunsplit((parts.scheme, parts.netloc, path, "", "")).rstrip("/")


def parse_window(kind: str, data: object, model: str) -> int | None:
    """The window in one server dialect's answer (``llama.cpp``, ``ollama``, ``vllm``), or None."""
    if not isinstance(data, dict):
        return None
    if kind == "llama.cpp":
        settings = data.get("default_generation_settings")
        return _positive(settings.get("n_ctx")) if isinstance(settings, dict) else None
    if kind == "ollama":
        return _ollama_window(data)
    if kind == "vllm":
        entries = data.get("data")
        if not isinstance(entries, list):
            return None
        cards = [e for e in entries if isinstance(e, dict)]
        mine = [c for c in cards if c.get("id") == model] or (cards if len(cards) == 1 else [])
        return _positive(mine[0].get("max_model_len")) if mine else None
    return None


def _ollama_window(data: dict[str, Any]) -> int | None:
    parameters = data.get("parameters")
    if isinstance(parameters, str):
        for line in parameters.splitlines():
            name, _, value = line.strip().partition(" ")
            if name == "num_ctx":
                try:
                    return _positive(int(value.strip()))
                except ValueError:
                    return None
    info = data.get("model_info")
    if isinstance(info, dict):
        arch = info.get("general.architecture")
        if isinstance(arch, str):
            return _positive(info.get(f"{arch}.context_length"))
    return None


def _positive(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


async def _fetch(
    client: openai_sdk.AsyncOpenAI, url: str, body: dict[str, Any] | None
) -> object | None:
    """The JSON a GET (or, with a body, a POST) answers, or None for any failure."""
    options: Any = {"timeout": PROBE_TIMEOUT_S, "max_retries": 0}
    try:
        if body is None:
            return await client.get(url, cast_to=object, options=options)
        return await client.post(url, cast_to=object, body=body, options=options)
    # any failure (HTTP, transport, a body that is not JSON) is "no answer"
    except Exception as exc:
        log.debug("no context window from %s: %s", url, exc)
        return None
