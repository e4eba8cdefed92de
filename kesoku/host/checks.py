"""Live checks of a setup: each answers "does this work, and if not, what to do" in one line.

``kesoku init`` runs them on each answer it is given; ``kesoku doctor`` runs them all. Each check
catches every failure of what it checks and returns a :class:`Check` (it raises only for
cancellation), is bounded by its own timeout, and never puts a secret's value in what it returns:
a provider's error message is masked with the config's :class:`~kesoku.config.redact.Redactor`
first (OpenAI's 401 quotes the key it was given).

Only ``kesoku init`` and ``kesoku doctor`` import this module, so httpx2 is imported at its top
(not inside the event loop); a model backend's SDK is imported by
:func:`~kesoku.llm.factory.create_llm` in a worker thread, Pub/Sub's in the thread that asks it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import httpx2
import msgspec
import trio

from kesoku.config.settings import DISCORD_API_BASE_URL
from kesoku.vocab.errors import BackendError, OperatorError
from kesoku.vocab.ir import LLMRequest, LLMTurn, TextBlock

if TYPE_CHECKING:
    from kesoku.config.settings import Config
    from kesoku.llm.base import BaseLLM


class Check(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of one check, shown as one line (and its fix on the next when it failed).

    Attributes:
        ok: It works (a warning is ``ok`` with a ``fix`` that says what would be better).
        what: What was checked, short ("model claude/claude-sonnet-4-6", "Discord bot token").
        detail: What was seen ("answered in 0.8 s", "401 Unauthorized: invalid key"); never a
            secret's value.
        fix: What to do about it (a command, a config key, a variable); empty when nothing.
    """

    ok: bool
    what: str
    detail: str
    fix: str = ""


def render_check(check: Check) -> str:
    """A check as the terminal shows it, the fix (if any) on an indented second line.

    ``✓ what: detail`` when it works, ``✗`` when it failed, ``⚠`` for a warning (ok with a fix).
    """
    mark = "✗" if not check.ok else "⚠" if check.fix else "✓"
    line = f"{mark} {check.what}: {check.detail}"
    return f"{line}\n  fix: {check.fix}" if check.fix else line


# -- the model ------------------------------------------------------------------------------------

PROBE_PROMPT = "Reply with the word OK."
"""The whole request of :func:`check_model`: no system prompt, no tools."""
PROBE_MAX_TOKENS = 32
"""Its output limit, where the backend sends one (Claude, the local model)."""
LOCAL_MODEL_NOTE = "the small offline model: short answers, {tools}"
"""What :func:`check_model` says of the bundled local backend (SmolLM2-135M; ``{tools}``: what it
does with tools, after ``[local] tools``)."""

KEY_FIXES = {
    "claude": (
        "a valid key in ANTHROPIC_API_KEY (or [claude] api_key), from "
        "https://console.anthropic.com/settings/keys; `kesoku init` stores it"
    ),
    "claude-vertex": (
        "Application Default Credentials with access to Claude on Vertex AI: "
        "gcloud auth application-default login"
    ),
    "gemini": (
        "a valid key in GEMINI_API_KEY (or [gemini] api_key), from "
        "https://aistudio.google.com/apikey; `kesoku init` stores it"
    ),
    "gemini-vertex": (
        "Application Default Credentials with Vertex AI access: "
        "gcloud auth application-default login"
    ),
    "openai": (
        "a valid key in OPENAI_API_KEY (or [openai] api_key) for the server at [openai] "
        "base_url; `kesoku init` stores it"
    ),
}
"""The fix of a refused key, per backend (``-vertex``: on Vertex AI): what a caller can test a
failed :func:`check_model` against to ask for the key again."""


def _model_label(cfg: Config, backend: str) -> str:
    if backend == "local":
        path = cfg.local.model_path
        name = os.path.basename(path).removesuffix(".gguf") if path else "SmolLM2-135M-Instruct"
        return f"local/{name}"
    section = getattr(cfg, backend, None)
    model = getattr(section, "model_name", None)
    return f"{backend}/{model}" if model else backend


async def check_model(
    cfg: Config, name: str | None = None, *, timeout_s: float = 30.0, call: bool = True
) -> Check:
    """Make one small real call to the backend the config names, and say how it went.

    The backend is built as every command builds it (:func:`~kesoku.llm.factory.create_llm`, in a
    worker thread: it imports the SDK), alone (``agent.fallback`` is left out: a fallback answering
    would hide a refused key) and without retries. The request is :data:`PROBE_PROMPT` with an
    output limit of :data:`PROBE_MAX_TOKENS` where the backend sends one; the answer is read to its
    end (a reply cut at the limit counts as an answer).

    Args:
        cfg: The loaded config (its keys already filled from the environment).
        name: The backend to check; None: ``agent.llm``, else the default the keys pick.
        timeout_s: Longest wait for the backend to be built and to answer, in seconds.
        call: False: only build it (a missing key or extra still fails), with no request.

    Returns:
        ``ok`` with "answered in 0.8 s"; not ``ok`` with the provider's message (masked) and what
        to set when the key is refused (HTTP 401/403), the model unknown, the server unreachable,
        the backend impossible to build (a missing key or extra) or the time out.

    Cancellation:
        Propagates; the backend is closed first (shielded, at most 2 s).
    """
    from kesoku.llm.factory import create_llm, default_backend

    backend = name or cfg.agent.llm or default_backend(cfg)[0]
    what = f"model {_model_label(cfg, backend)}"
    alone = msgspec.structs.replace(cfg, agent=msgspec.structs.replace(cfg.agent, fallback=()))
    llm: BaseLLM | None = None
    started = time.monotonic()
    try:
        with trio.fail_after(timeout_s):
            llm = await trio.to_thread.run_sync(create_llm, backend, alone)
            if not call:
                return Check(ok=True, what=what, detail="not called (--no-call)")
            llm.max_retries = 0  # a check says what is, now; a retry would only wait longer
            llm.stall_timeout_s = timeout_s
            await _answer(llm)
    except trio.TooSlowError:
        return Check(
            ok=False,
            what=what,
            detail=f"no answer within {timeout_s:g} s",
            fix=_unreachable_fix(cfg, backend),
        )
    except OperatorError as exc:  # ConfigError included: a missing key, extra or file
        detail, _, fix = str(exc).partition("; ")
        return Check(ok=False, what=what, detail=detail, fix=fix)
    except BackendError as exc:
        message = await _masked(cfg, str(exc))
        return Check(ok=False, what=what, detail=message, fix=_backend_fix(cfg, backend, exc))
    except Exception as exc:  # a check reports, whatever broke
        message = await _masked(cfg, f"{type(exc).__name__}: {exc}")
        return Check(ok=False, what=what, detail=message)
    finally:
        if llm is not None:
            with trio.move_on_after(2.0, shield=True):
                await llm.aclose()
    elapsed = f"answered in {time.monotonic() - started:.1f} s"
    if backend == "local" and cfg.local.model_path is None:
        note = LOCAL_MODEL_NOTE.format(tools="weak tool calls" if cfg.local.tools else "no tools")
        return Check(ok=True, what=what, detail=f"{note}; {elapsed}")
    return Check(ok=True, what=what, detail=elapsed)


async def _answer(llm: BaseLLM) -> None:
    request = LLMRequest(
        system="",
        turns=(LLMTurn("user", (TextBlock(PROBE_PROMPT),)),),
        max_output_tokens=PROBE_MAX_TOKENS,
    )
    # To its end: a stream left open would be finalised by the garbage collector, later
    async with contextlib.aclosing(llm.stream(request)) as events:
        async for _ in events:
            pass


async def _masked(cfg: Config, text: str) -> str:
    from kesoku.config.redact import Redactor

    # from_config reads the Google credentials file for its secrets: off the event loop
    redactor = await trio.to_thread.run_sync(Redactor.from_config, cfg)
    return redactor.mask(text)


def uses_vertex(cfg: Config, backend: str) -> bool:
    """Whether ``backend`` (claude, gemini) runs on Vertex AI: credentials, not an API key."""
    if backend == "claude":
        return cfg.claude.resolved_auth_mode == "vertex"
    return backend == "gemini" and cfg.gemini.auth_mode == "vertex"


def _backend_fix(cfg: Config, backend: str, exc: BackendError) -> str:
    if exc.auth:
        return KEY_FIXES.get(f"{backend}-vertex" if uses_vertex(cfg, backend) else backend, "")
    if exc.status == 404 or "not_found" in str(exc).lower():
        return f"check [{backend}] model_name: the model id as the provider lists it"
    if exc.status is None:
        return _unreachable_fix(cfg, backend)
    return ""


def _unreachable_fix(cfg: Config, backend: str) -> str:
    if backend == "local":
        return "[local] n_threads, or a smaller model_path: the model is too slow here"
    base_url = getattr(getattr(cfg, backend, None), "base_url", None)
    if base_url:
        return f"is the server at {base_url} running? ([{backend}] base_url)"
    return "check the network (and HTTPS_PROXY if one is needed)"


# -- Discord --------------------------------------------------------------------------------------

MESSAGE_CONTENT_FLAGS = (1 << 18) | (1 << 19)
"""Application flags GATEWAY_MESSAGE_CONTENT and GATEWAY_MESSAGE_CONTENT_LIMITED (Discord API,
"Application Object", "Application Flags"): the Message Content intent is on."""
MESSAGE_CONTENT_FIX = (
    "turn on the Message Content intent (Developer Portal → your application → Bot → "
    "Privileged Gateway Intents): without it the bot sees only messages that mention it"
)


async def check_discord_token(
    token: str, *, api_base_url: str = DISCORD_API_BASE_URL, timeout_s: float = 10.0
) -> Check:
    """Whose bot token this is (``GET /users/@me``), and whether its Message Content intent is on.

    Args:
        token: The bot token (never part of what is returned).
        api_base_url: Discord's REST API root, up to ``/api/v10``: ``[discord] api_base_url``
            (a proxy; tests: a loopback fake).
        timeout_s: Longest wait for both requests together, in seconds.

    Returns:
        ``ok`` with "bot NAME (id ID)"; a warning when the application's flags say the Message
        Content intent is off; not ``ok`` on 401 (a refused token) and any other failure.

    Cancellation:
        Propagates.
    """
    what = "Discord bot token"
    base = api_base_url.rstrip("/")
    headers = {"Authorization": f"Bot {token}"}
    try:
        with trio.fail_after(timeout_s):
            async with await _http_client(timeout_s, trust_env=True) as client:
                me = await client.get(f"{base}/users/@me", headers=headers)
                if me.status_code == 401:
                    return Check(
                        ok=False,
                        what=what,
                        detail="401 Unauthorized: Discord refused the token",
                        fix=(
                            "copy the token again (Developer Portal → your application → Bot → "
                            "Reset Token) into DISCORD_TOKEN; `kesoku init` stores it"
                        ),
                    )
                me.raise_for_status()
                user = _json_object(me)
                app = await client.get(f"{base}/oauth2/applications/@me", headers=headers)
                flags = _json_object(app).get("flags") if app.status_code == 200 else None
    except trio.TooSlowError:
        return Check(
            ok=False,
            what=what,
            detail=f"no answer from {base} within {timeout_s:g} s",
            fix="check the network (and HTTPS_PROXY if one is needed)",
        )
    except Exception as exc:  # a token that is no header value, a refused connection, a 5xx …
        return Check(ok=False, what=what, detail=_one_line(exc, token))
    name = user.get("username") or user.get("global_name") or "?"
    detail = f"bot {name} (id {user.get('id', '?')})"
    if isinstance(flags, int) and not flags & MESSAGE_CONTENT_FLAGS:
        return Check(ok=True, what=what, detail=detail, fix=MESSAGE_CONTENT_FIX)
    return Check(ok=True, what=what, detail=detail)


def _json_object(response: httpx2.Response) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _one_line(exc: BaseException, *secrets: str) -> str:
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[redacted]")
    return text


async def _http_client(timeout_s: float, *, trust_env: bool) -> httpx2.AsyncClient:
    # Building a client loads the CA certificates (30-250 ms): off the event loop.
    make = functools.partial(httpx2.AsyncClient, timeout=timeout_s, trust_env=trust_env)
    return await trio.to_thread.run_sync(make)


# -- Google Chat ----------------------------------------------------------------------------------

PUBSUB_SCOPE = "https://www.googleapis.com/auth/pubsub"
GCHAT_INSTALL_FIX = "pip install 'kesoku[gchat]'"


async def check_gchat_subscription(
    project_id: str, subscription: str, credentials_file: str | None, *, timeout_s: float = 15.0
) -> Check:
    """Whether the Pub/Sub subscription the Chat app publishes to exists and can be read.

    One ``GetSubscription`` (google-cloud-pubsub, in a worker thread), with the service-account
    key file when one is given, else Application Default Credentials; ``PUBSUB_EMULATOR_HOST``
    points it at the emulator (the library's own switch).

    Args:
        project_id: The Google Cloud project (unused when ``subscription`` is a full name).
        subscription: The short name, or ``projects/P/subscriptions/S``.
        credentials_file: A service-account key file; None: Application Default Credentials.
        timeout_s: Longest wait, in seconds (a thread still running then is abandoned).

    Returns:
        ``ok`` with the subscription and its topic; not ``ok`` when the gchat extra is missing, the
        credentials cannot be loaded, the subscription does not exist or cannot be read, or
        Pub/Sub does not answer.

    Cancellation:
        Propagates at once (the worker thread is abandoned).
    """
    path = (
        subscription
        if subscription.startswith("projects/")
        else f"projects/{project_id}/subscriptions/{subscription}"
    )
    what = "Google Chat subscription"
    ask = functools.partial(_get_subscription, path, credentials_file, timeout_s)
    try:
        with trio.fail_after(timeout_s + 1):
            found = await trio.to_thread.run_sync(ask, abandon_on_cancel=True)
    except trio.TooSlowError:
        found = Check(
            ok=False,
            what=what,
            detail=f"no answer from Pub/Sub within {timeout_s:g} s",
            fix="check the network",
        )
    return msgspec.structs.replace(found, what=what)


def _get_subscription(path: str, credentials_file: str | None, timeout_s: float) -> Check:
    """The blocking part of :func:`check_gchat_subscription` (its ``what`` is set there)."""
    try:
        from google.api_core import exceptions as api_errors
        from google.auth import exceptions as auth_errors
        from google.cloud import pubsub_v1  # type: ignore[import-untyped]
    except ImportError as exc:
        return Check(
            ok=False, what="", detail=f"the gchat extra is missing ({exc})", fix=GCHAT_INSTALL_FIX
        )
    adc_fix = (
        "set [gchat] credentials_file to a service-account key file, or run "
        "`gcloud auth application-default login`"
    )
    try:
        if os.environ.get("PUBSUB_EMULATOR_HOST") or not credentials_file:
            client = pubsub_v1.SubscriberClient()
        else:
            from google.oauth2 import service_account

            credentials = service_account.Credentials.from_service_account_file(  # type: ignore[no-untyped-call]
                credentials_file, scopes=[PUBSUB_SCOPE]
            )
            client = pubsub_v1.SubscriberClient(credentials=credentials)
    except (OSError, ValueError) as exc:
        return Check(
            ok=False,
            what="",
            detail=f"credentials file {credentials_file}: {_one_line(exc)}",
            fix="[gchat] credentials_file: a service-account key file (JSON) downloaded from IAM",
        )
    except auth_errors.GoogleAuthError as exc:
        return Check(ok=False, what="", detail=f"no Google credentials: {exc}", fix=adc_fix)
    try:
        with client:
            found = client.get_subscription(subscription=path, timeout=timeout_s)
    except api_errors.NotFound:
        return Check(
            ok=False,
            what="",
            detail=f"{path} does not exist",
            fix=(
                "create it (gcloud pubsub subscriptions create NAME --topic TOPIC) or fix "
                "[gchat] subscription and project_id"
            ),
        )
    except api_errors.PermissionDenied as exc:
        return Check(
            ok=False,
            what="",
            detail=f"{path}: permission denied ({exc.message})",
            fix="grant the credentials roles/pubsub.subscriber on the subscription",
        )
    except auth_errors.GoogleAuthError as exc:
        return Check(ok=False, what="", detail=f"Google credentials: {exc}", fix=adc_fix)
    except Exception as exc:  # DeadlineExceeded, ServiceUnavailable, a malformed name …
        return Check(ok=False, what="", detail=f"{path}: {_one_line(exc)}")
    return Check(ok=True, what="", detail=f"{path} exists (topic {found.topic})")


# -- OpenAI-compatible servers on this machine ----------------------------------------------------

LOCAL_SERVERS = (
    "http://127.0.0.1:11434/v1",  # Ollama
    "http://127.0.0.1:1234/v1",  # LM Studio
    "http://127.0.0.1:8080/v1",  # llama.cpp server
    "http://127.0.0.1:8000/v1",  # vLLM
)
"""The default ports of the usual self-hosted servers, as ``kesoku init`` looks for them."""


async def find_openai_servers(
    candidates: Sequence[str] = ("http://127.0.0.1:11434/v1",), *, timeout_s: float = 1.0
) -> list[tuple[str, list[str]]]:
    """The OpenAI-compatible servers among ``candidates`` that answer ``GET {base}/models``.

    Args:
        candidates: Base URLs up to ``/v1`` (default: Ollama's port on this machine).
        timeout_s: Longest wait for each, in seconds; they are asked at the same time.

    Returns:
        ``(base URL, model ids)`` of each server that answered a model list, in the order of
        ``candidates``; servers that did not (nothing listening, a 404, another kind of server) are
        left out.

    Cancellation:
        Propagates.
    """
    found: dict[str, list[str]] = {}

    async def ask(client: httpx2.AsyncClient, base: str) -> None:
        with trio.move_on_after(timeout_s):
            models = await _list_models(client, base)
            if models is not None:
                found[base] = models

    # No proxy: these are servers on this machine.
    client = await _http_client(timeout_s, trust_env=False)
    async with client, trio.open_nursery() as nursery:
        for base in candidates:
            nursery.start_soon(ask, client, base)
    return [(base, found[base]) for base in candidates if base in found]


async def _list_models(client: httpx2.AsyncClient, base: str) -> list[str] | None:
    try:
        response = await client.get(f"{base.rstrip('/')}/models")
    except httpx2.HTTPError:
        return None
    data = _json_object(response).get("data") if response.status_code == 200 else None
    if not isinstance(data, list):
        return None
    return [str(m["id"]) for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]


# -- the sandbox ----------------------------------------------------------------------------------

BWRAP_FIX = "apt install bubblewrap (dnf install bubblewrap, pacman -S bubblewrap)"


def check_sandbox(cfg: Config) -> Check:
    """Whether the tools' OS sandbox works here with ``[sandbox]`` as configured.

    Blocking (it runs ``bwrap … true`` once, about 10 ms): from trio, call it in a worker thread.

    Returns:
        ``ok`` when bubblewrap runs; a warning (``ok`` with a fix) for Landlock, which cannot hide
        ``.env`` files inside the workspace nor stop UDP, and for ``mode = "off"``; not ``ok`` when
        no sandbox works (then ``kesoku start`` offers no shell nor run_code).
    """
    from kesoku.tools.sandbox import Sandbox

    sandbox = Sandbox(cfg.sandbox)
    probe = sandbox.probe()
    what = "sandbox"
    net = "network on" if cfg.sandbox.network else "no network"
    if probe.mechanism == "bwrap":
        return Check(ok=True, what=what, detail=f"{probe.detail}; {net}")
    if probe.mechanism == "landlock":
        fix = ""
        if cfg.sandbox.mode == "auto":  # bubblewrap was tried first
            better = "bubblewrap also hides .env files in the workspace and stops UDP"
            fix = f"{BWRAP_FIX}: {better}" if sandbox.bwrap is None else _USERNS + f": {better}"
        return Check(ok=True, what=what, detail=f"{probe.detail}; {net}", fix=fix)
    if probe.mechanism == "off":
        return Check(
            ok=True,
            what=what,
            detail='off ([sandbox] mode = "off"): tools run with your own access',
            fix='[sandbox] mode = "auto"',
        )
    return Check(
        ok=False,
        what=what,
        detail=f"none works here: {probe.detail}",
        fix=(BWRAP_FIX if sandbox.bwrap is None else _USERNS)
        + "; until then `kesoku start` offers no shell nor run_code, and `kesoku chat` asks "
        "before running them unconfined",
    )


_USERNS = (
    "bubblewrap needs unprivileged user namespaces (refused in some containers, and by "
    "kernel.apparmor_restrict_unprivileged_userns on Ubuntu 24.04+)"
)


__all__ = [
    "Check",
    "check_discord_token",
    "check_gchat_subscription",
    "check_model",
    "check_sandbox",
    "find_openai_servers",
    "render_check",
    "uses_vertex",
]
