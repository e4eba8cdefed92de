"""Pick and build the model backend a config names (ARCHITECTURE.md, "Model backends").

Provider modules (and their SDKs) are imported inside :func:`create_llm`, so a daemon pays only for
the backend it uses. With ``agent.llm`` unset the backend follows the credentials present (Gemini,
then Claude, then an OpenAI-compatible server), and the offline ``local`` model when there are none.
``agent.fallback`` wraps the choice in a :class:`~kesoku.llm.fallback.FallbackLLM`.

A cloud SDK's import is most of a one-shot chat's start (anthropic about 1.3 s of CPU, google-genai
and openai about 0.5 s each): the SDKs are imported without their optional transports that Kesoku
never uses (:data:`UNUSED_OPTIONAL_MODULES`, :func:`import_backend`).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import logging
import sys
import threading
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, get_args

from kesoku.config.settings import Backend
from kesoku.vocab.errors import ConfigError, OperatorError

if TYPE_CHECKING:
    from kesoku.config.settings import Config
    from kesoku.llm.base import BaseLLM

log = logging.getLogger(__name__)

_CLASSES: dict[str, tuple[str, str]] = {
    "claude": ("kesoku.llm.claude", "ClaudeLLM"),
    "gemini": ("kesoku.llm.gemini", "GeminiLLM"),
    "openai": ("kesoku.llm.openai", "OpenAILLM"),
    "local": ("kesoku.llm.local", "LocalLLM"),
}
"""Where each provider backend lives; imported only when chosen."""
UNUSED_OPTIONAL_MODULES = ("aiohttp", "h2")
"""Optional dependencies of the SDKs' HTTP stacks, left out when a backend's SDK is imported.

Each SDK imports aiohttp when it is installed, for an asyncio transport that cannot run under trio
(the backends use httpx2), and httpcore2 imports h2 for HTTP/2, which no backend asks for: about
100 ms of import each. Both imports are guarded by ``except ImportError`` in the SDKs; a module
imported before (by an adapter) is used as it is.
"""
HTTP_STACK = ("httpcore2",)
"""What the cloud SDKs' clients import when they are built (httpx2's transport), imported with the
backend so that h2 is left out of it too and the client's build (in a worker thread) imports
nothing."""
_LOCAL = _CLASSES["local"][0]

BUNDLED_NOTICE = (
    "answering with the bundled offline model (SmolLM2-135M: short answers, {tools}); "
    "run `kesoku init` or set ANTHROPIC_API_KEY / GEMINI_API_KEY for a capable one"
)
"""The warning of the first bundled-model backend a process builds (``{tools}``: what it does with
tools)."""
_bundled_noticed = False


def default_backend(config: Config) -> tuple[str, str]:
    """The backend used when ``agent.llm`` is unset, and why (for the one-line notice).

    Returns:
        ``(name, reason)``.
    """
    if config.gemini.api_key or (config.gemini.auth_mode == "vertex" and config.gemini.project_id):
        return "gemini", "a Gemini API key (or Vertex AI project) is configured"
    claude = config.claude
    if claude.api_key or (claude.resolved_auth_mode == "vertex" and claude.project_id):
        return "claude", "an Anthropic API key (or Vertex AI project) is configured"
    if config.openai.api_key or config.openai.base_url:
        return "openai", "an OpenAI key or base_url is configured"
    return "local", "no API key is configured, so the offline local model answers"


def create_llm(name: str | None, config: Config) -> BaseLLM:
    """Build the backend ``name`` (or ``agent.llm``, or the default) with the configured fallbacks.

    Args:
        name: A backend name (``kesoku chat --llm``, a session's or channel's override); None:
            ``agent.llm``, and when that is unset too, :func:`default_backend` (logged once, INFO).
        config: The loaded config; file paths in it are already absolute.

    Returns:
        The backend, ready to stream; a FallbackLLM when ``agent.fallback`` names others. The first
        time in a process that it is the bundled local model (no ``local.model_path``), one
        warning says so and how to get a capable one (:data:`BUNDLED_NOTICE`): one line on
        ``kesoku chat``'s stderr, one line in the daemon's log.

    Raises:
        ConfigError: The scripted backend has no ``scripted.path``, or its scenario file is invalid.
        OperatorError: The name is unknown, or a backend cannot be built (a missing extra or key);
            the message is one line naming the config key to fix.
    """
    chosen = name or config.agent.llm
    if chosen is None:
        chosen, reason = default_backend(config)
        log.info("agent.llm is not set: using %s (%s)", chosen, reason)
    primary = _build(chosen, config)
    if chosen == "local" and config.local.model_path is None:
        _notice_bundled(config)
    fallbacks = [b for b in config.agent.fallback if b != chosen]
    if not fallbacks:
        return primary
    from kesoku.llm.fallback import FallbackLLM

    return FallbackLLM([primary, *(_build(b, config) for b in fallbacks)])


def _notice_bundled(config: Config) -> None:
    """Warn, once per process, that the bundled 135M model answers, and how to get a capable one.

    A warning, so ``kesoku chat`` prints it on stderr (stdout is the answer) and the daemon logs it.
    """
    global _bundled_noticed
    if not _bundled_noticed:
        _bundled_noticed = True
        tools = "weak tool calls" if config.local.tools else "no tools"
        log.warning(BUNDLED_NOTICE.format(tools=tools))


def import_backend(module_name: str) -> ModuleType:
    """Import a backend module, its SDK and :data:`HTTP_STACK`; not :data:`UNUSED_OPTIONAL_MODULES`.

    Only this thread's imports are refused those modules, and only during this call; other threads
    import as usual.

    Raises:
        ImportError: The module or its SDK is not installed.
    """
    _refusing.active = True
    try:
        module = importlib.import_module(module_name)
        for name in HTTP_STACK if module_name != _LOCAL else ():  # local: no HTTP
            importlib.import_module(name)
        return module
    finally:
        _refusing.active = False


class _Refuser:
    """A meta path finder that refuses ``names`` (and their submodules) to a thread.

    It refuses while ``switch.active`` is true in the importing thread. It is put on
    ``sys.meta_path`` once, when this module loads, and never removed: a list another thread may be
    iterating for its own import must not change under it.
    """

    def __init__(self, names: Sequence[str], switch: threading.local) -> None:
        self.names = tuple(names)
        self.switch = switch

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if getattr(self.switch, "active", False) and fullname.split(".", 1)[0] in self.names:
            raise ModuleNotFoundError(f"{fullname}: not used by Kesoku's backends", name=fullname)
        return None  # the next finder looks


_refusing = threading.local()
sys.meta_path.insert(0, _Refuser(UNUSED_OPTIONAL_MODULES, _refusing))


def _build(name: str, config: Config) -> BaseLLM:
    if name == "scripted":
        if config.scripted.path is None:
            raise ConfigError(
                "scripted.path: not set; the 'scripted' backend replays the scenario file it names"
            )
        from kesoku.llm.scripted import ScriptedLLM

        llm: BaseLLM = ScriptedLLM.from_yaml(config.scripted.path)
    elif name in _CLASSES:
        module_name, class_name = _CLASSES[name]
        cls = getattr(import_backend(module_name), class_name)
        llm = cls.from_config(config)
    else:
        raise OperatorError(
            f"agent.llm: unknown backend {name!r} (known: {', '.join(get_args(Backend))})"
        )
    llm.max_retries = config.agent.max_retries
    llm.backoff_cap_s = config.agent.retry_cap_s
    return llm
