"""What a Kesoku process runs: the runtime built from kesoku.toml, its path gates and tools.

``kesoku start`` and ``kesoku chat`` both build their runtime here; :func:`build_runtime` also
decides which sessions a process answers (a daemon and a chat on one database must not both
answer the same session).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kesoku.agent.dispatcher import Dispatcher

if TYPE_CHECKING:
    from kesoku.agent.runtime import Runtime, ToolSource
    from kesoku.config.settings import Config
    from kesoku.store import Store
    from kesoku.tools.base import Tool
    from kesoku.tools.paths import PathGates
    from kesoku.tools.sandbox import Sandbox
    from kesoku.tools.skill_library import SkillLibrary
    from kesoku.vocab.model import Message

INTERACTIVE_ADAPTER = "terminal"
"""Sessions of this adapter belong to the ``kesoku chat`` that opened them, never to the daemon."""
SESSION_CACHE_SIZE = 4096
"""Sessions whose owner (adapter) the daemon caches, to route user messages without a query each."""


def runtime_gates(
    config: Config,
    *,
    config_file: Path | None = None,
    skills: SkillLibrary | None = None,
) -> PathGates:
    """The path gates of a process: one set for the file tools, the shell and every adapter.

    Args:
        config: The loaded config.
        config_file: The file it came from: never read, written or shared (it can hold keys).
        skills: The skills library, whose folders are readable without taint; None: the one of
            ``workspace.skills_dir`` and the bundled skills.

    Returns:
        :meth:`PathGates.from_config` of the config, its file and the skills folders.
    """
    from kesoku.tools.paths import PathGates
    from kesoku.tools.skill_library import SkillLibrary

    skills = skills if skills is not None else SkillLibrary.from_config(config)
    trusted = [folder for folder, _ in skills.dirs]
    return PathGates.from_config(config, config_file=config_file, trusted_roots=trusted)


def default_tools(
    config: Config,
    *,
    config_file: Path | None = None,
    skills: SkillLibrary | None = None,
    gates: PathGates | None = None,
    sandbox: Sandbox | None = None,
) -> tuple[Tool, ...]:
    """The tools kesoku.toml enables, the same for the daemon and ``kesoku chat``.

    The file tools (read, write, edit, list, glob, grep: always, through the path gates), the shell
    tool (``[shell] enabled``), run_code (``[run_code] enabled``) and the skill tools (list_skills,
    use_skill). MCP servers' tools come and go: the runtime asks its tool source (kesoku.mcp) at
    every step. The subagent tool is the runtime's own. The shell and run_code are left out where no
    OS sandbox works (``[sandbox] mode`` not ``off``), unless the sandbox asks the user instead (the
    terminal).

    Args:
        config: The loaded config.
        config_file: The file it came from: the tools may not read it (it can hold keys).
        skills: The skills library; None: the one of ``workspace.skills_dir`` and the bundled
            skills.
        gates: The process's path gates; None: the sandbox's, else :func:`runtime_gates` of the
            arguments above.
        sandbox: What confines tool processes; None: ``[sandbox]`` over these gates, refusing to run
            unsandboxed (probed now: blocking, about 10 ms).
    """
    from kesoku.tools.files import file_tools
    from kesoku.tools.sandbox import Sandbox
    from kesoku.tools.skill_library import SkillLibrary
    from kesoku.tools.skills import skill_tools

    skills = skills if skills is not None else SkillLibrary.from_config(config)
    if gates is None:
        gates = (
            sandbox.gates
            if sandbox is not None
            else runtime_gates(config, config_file=config_file, skills=skills)
        )
    sandbox = sandbox if sandbox is not None else Sandbox.from_config(config, gates)
    max_bytes = config.shell.max_output_bytes
    tools = list(file_tools(gates, max_output_bytes=max_bytes))
    runs_processes = sandbox.ask_unsandboxed or sandbox.probe().mechanism is not None
    if config.shell.enabled and runs_processes:
        from kesoku.tools.shell import shell_tool

        tools.append(shell_tool(config.shell, sandbox))
    if config.run_code.enabled and runs_processes:
        from kesoku.tools.run_code import run_code_tool

        tools.append(
            run_code_tool(config.run_code, sandbox, ask_always=config.shell.mode == "allowlist")
        )
    tools.extend(skill_tools(skills, max_output_bytes=max_bytes))
    return tuple(tools)


class ScopedDispatcher(Dispatcher):
    """A dispatcher that answers only the sessions ``serves`` accepts (crash recovery included).

    Args:
        rt: The runtime.
        serves: Takes a session id; True when this process answers that session.
    """

    def __init__(self, rt: Runtime, serves: Callable[[str], bool]) -> None:
        super().__init__(rt)
        self.serves = serves

    def submit(self, message: Message) -> None:
        """Queue a user message of a served session; others are left to the process owning them."""
        if self.serves(message.session_id):
            super().submit(message)


def build_runtime(
    config: Config,
    store: Store,
    *,
    config_file: Path | None = None,
    llm_name: str | None = None,
    serves: Callable[[str], bool] | None = None,
    interactive: bool = False,
) -> Runtime:
    """The gateway and runtime kesoku.toml describes, over an open store.

    The gateway masks the secrets of the config and of this process's environment in every message
    (:class:`~kesoku.config.redact.Redactor`).

    Args:
        config: The loaded config.
        store: The store over ``workspace.db_path``; the caller closes it.
        config_file: The file the config came from (denied to the tools and never shared by an
            adapter: ``rt.gates`` protects it).
        llm_name: A backend overriding ``agent.llm``.
        serves: Which sessions this process answers (by id); None: all.
        interactive: A person at a terminal answers (``kesoku chat``): where no sandbox works the
            tools ask before running unsandboxed, and the sandbox is probed at the first call;
            otherwise it is probed now and such tools are not offered.

    Returns:
        The runtime, not yet serving.

    Raises:
        OperatorError: The backend cannot be built (see :meth:`Runtime.from_config`).
    """
    from kesoku.agent.runtime import Runtime
    from kesoku.config.redact import Redactor
    from kesoku.gateway import Gateway
    from kesoku.tools.sandbox import Sandbox
    from kesoku.tools.skill_library import SkillLibrary

    # Secrets are masked at the gateway: the store, turn logs, traces and the model see them masked.
    gateway = Gateway(store, config.workspace.sessions_dir, redactor=Redactor.from_config(config))
    skills = SkillLibrary.from_config(config)
    # parse once now: each turn then only checks the files for changes (~15 µs a skill)
    skills.scan()
    gates = runtime_gates(config, config_file=config_file, skills=skills)
    sandbox = Sandbox.from_config(config, gates, ask_unsandboxed=interactive)
    tools = default_tools(config, skills=skills, gates=gates, sandbox=sandbox)
    sources: list[ToolSource] = []
    if any(server.enabled for server in config.mcp.servers):
        # light: the mcp SDK loads in a thread at the first connection
        from kesoku.mcp.manager import McpManager

        sources.append(
            McpManager(config.mcp, max_output_bytes=config.shell.max_output_bytes, sandbox=sandbox)
        )
    rt = Runtime.from_config(
        config,
        gateway,
        tools=tools,
        llm_name=llm_name,
        skills=skills.summaries,
        tool_sources=sources,
        gates=gates,
        schedules=not interactive,  # the daemon runs schedules; kesoku chat does not
    )
    rt.sandbox = sandbox
    if serves is not None:
        rt.dispatcher = ScopedDispatcher(rt, serves)
    return rt


def daemon_serves(store: Store) -> Callable[[str], bool]:
    """The daemon answers every session but terminal ones (their ``kesoku chat`` answers them)."""

    @functools.lru_cache(maxsize=SESSION_CACHE_SIZE)
    def serves(session_id: str) -> bool:
        session = store.get_session(session_id)
        return session is not None and session.adapter != INTERACTIVE_ADAPTER

    return serves
