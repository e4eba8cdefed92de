"""The runtime: what turns need (gateway, backends, tools, settings) and the task tree running them.

``Runtime.serve`` opens the nursery below the root (ARCHITECTURE.md, "Task tree"): the turn-log
writer and the dispatcher (which owns one worker per session). Adapters post user messages to the
gateway and read replies from it; they watch live progress through :attr:`Runtime.hub`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import trio

from kesoku.agent.compaction.compactor import CompactionPolicy
from kesoku.agent.dispatcher import Dispatcher
from kesoku.agent.questions import QUESTION_TIMEOUT_S, Questions
from kesoku.agent.repeat import MAX_IDENTICAL_CALLS
from kesoku.agent.schedule_tool import schedule_tool
from kesoku.agent.turn import session_cwd
from kesoku.config.settings import AgentConfig, Config
from kesoku.observe.spend import Budget
from kesoku.observe.turnlog_writer import TurnLogWriter
from kesoku.tools.paths import PathGates
from kesoku.vocab.events import EventHub

if TYPE_CHECKING:
    from kesoku.agent.scheduler import Scheduler
    from kesoku.gateway import Gateway
    from kesoku.llm.base import BaseLLM
    from kesoku.tools.base import Tool
    from kesoku.tools.sandbox import Sandbox
    from kesoku.vocab.model import Session

log = logging.getLogger(__name__)

MAX_STEPS_PER_TURN = 50
"""Model calls one turn may make (``agent.max_steps_per_turn``)."""
WORKER_IDLE_S = 60.0
"""An idle session worker is reaped after this long (``agent.worker_idle_s``): a live one holds
about 13 KB plus 1 KB a message, a shed one 0.6 KB, and resuming costs a reload from the store
(``bench/idle_bench.py``)."""
DEFAULT_PERSONA = AgentConfig().persona
"""``agent.persona`` when nothing else is given."""
CLOSE_TIMEOUT_S = 5.0
"""How long closing the backends (HTTP clients, provider caches) may take at shutdown."""


class ToolSource(Protocol):
    """Tools that come and go while the runtime serves (the MCP servers' tools).

    The runtime starts :meth:`serve` in its nursery before the dispatcher and asks :meth:`tools` at
    every model step: a source offers only what works now (a crashed server's tools are withheld).
    """

    name: str

    def tools(self) -> Sequence[Tool]:
        """The tools usable now; called on the event loop at every step, so it must be cheap."""
        ...

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect and keep the tools available until cancelled.

        ``started()`` is called once the first try ended.
        """
        ...


class Runtime:
    """The agent runtime of one process.

    Args:
        gateway: The durable log.
        llm: A backend for every session, or a factory ``(session) -> BaseLLM`` (a session's ``llm``
            override picks another); the factory's result is cached per backend name.
        tools: The tools offered to the model.
        persona: The opening of the system prompt.
        max_steps_per_turn: Model calls allowed in one turn.
        max_identical_calls: Runs of one identical tool call that returns the same, in a turn or a
            subagent, before the next is refused (:mod:`kesoku.agent.repeat`); 0: no limit.
        worker_idle_s: Idle time after which a session worker is reaped.
        project_dir: The working directory (and AGENTS.md source) instead of each session workspace.
        skills: Returns ``(name, description)`` of the available skills, read at each turn.
        turnlog: Writes ``llm-turn-{idx}.log.yaml``; None turns logging off.
        hub: Live turn events for adapters.
        question_timeout_s: How long a question to the user waits before it counts as Deny.
        schedules: Offer the ``schedule`` tool (a process that runs schedules: the daemon).
        subagent_max_steps: Offer the ``subagent`` tool, whose child loops may make this many model
            calls; None: no subagent tool.
        tool_sources: Tools that come and go (MCP servers), served in the runtime's nursery.
        compaction: When and how far to compact sessions (``[compaction]``).
        gates: The path gates every file decision of this process uses: the file tools and the
            adapters (``[file: …]``, attachments). None: gates protecting only the gateway's
            database (:func:`kesoku.host.build.build_runtime` passes the config's, its file
            included).
        budget: Spend caps and prices (:mod:`kesoku.observe.spend`); None: no caps, the built-in
            prices, every call still kept in the ledger.
    """

    def __init__(
        self,
        gateway: Gateway,
        llm: BaseLLM | Callable[[Session], BaseLLM],
        *,
        tools: Sequence[Tool] = (),
        persona: str = DEFAULT_PERSONA,
        max_steps_per_turn: int = MAX_STEPS_PER_TURN,
        max_identical_calls: int = MAX_IDENTICAL_CALLS,
        worker_idle_s: float = WORKER_IDLE_S,
        project_dir: Path | None = None,
        skills: Callable[[], Sequence[tuple[str, str]]] = tuple,
        turnlog: TurnLogWriter | None = None,
        hub: EventHub | None = None,
        question_timeout_s: float = QUESTION_TIMEOUT_S,
        subagent_max_steps: int | None = None,
        schedules: bool = False,
        tool_sources: Sequence[ToolSource] = (),
        compaction: CompactionPolicy | None = None,
        gates: PathGates | None = None,
        budget: Budget | None = None,
    ) -> None:
        self.gateway = gateway
        self.store = gateway.store
        """The session store the agent reads and writes (adapters only see the gateway)."""
        self.budget = budget if budget is not None else Budget(self.store)
        """The spend caps and prices every model call is metered by (no caps by default)."""
        own_db = PathGates(protected_files=(Path(gateway.db_path),))
        self.gates = gates if gates is not None else own_db
        """What tools and adapters may read, write and share (``[file: …]``)."""
        self._llm = llm
        self._used: dict[int, BaseLLM] = {}  # backends handed out, closed at shutdown
        self.tools = tuple(tools)
        if subagent_max_steps is not None:
            from kesoku.agent.subagent import subagent_tool

            self.tools += (subagent_tool(self, max_steps=subagent_max_steps),)
        if schedules:
            self.tools += (schedule_tool(self),)
        self.tools_by_name = {t.name: t for t in self.tools}
        if len(self.tools_by_name) != len(self.tools):
            raise ValueError("two tools share a name")
        self.tool_sources = tuple(tool_sources)
        self.compaction = compaction if compaction is not None else CompactionPolicy()
        self._shadowed: set[str] = set()
        self.persona = persona
        self.max_steps_per_turn = max_steps_per_turn
        self.max_identical_calls = max_identical_calls
        self.worker_idle_s = worker_idle_s
        self.project_dir = project_dir
        self.skills = skills
        self.turnlog = turnlog
        self.hub = hub if hub is not None else EventHub()
        self.questions = Questions(gateway, self.hub, timeout_s=question_timeout_s)
        """Open questions to users; adapters answer with ``rt.questions.answer(id, choice)``."""
        self.dispatcher = Dispatcher(self)
        self.scheduler: Scheduler | None = None
        """The daemon's scheduler (set by it), which a schedule made in this process wakes."""
        self.sandbox: Sandbox | None = None
        """What confines tool processes (set by ``build_runtime``), for the start-up line and
        commands."""

    @classmethod
    def from_config(
        cls,
        config: Config,
        gateway: Gateway,
        *,
        tools: Sequence[Tool] = (),
        llm_name: str | None = None,
        skills: Callable[[], Sequence[tuple[str, str]]] = tuple,
        tool_sources: Sequence[ToolSource] = (),
        gates: PathGates | None = None,
        schedules: bool = False,
    ) -> Runtime:
        """Build the runtime kesoku.toml describes.

        Blocking: backends load their SDKs; call it at start-up.

        Args:
            config: The loaded config.
            gateway: The gateway over ``workspace.db_path``.
            tools: The tools to offer.
            llm_name: A backend that overrides ``agent.llm`` (``kesoku chat --llm``).
            skills: ``(name, description)`` of the skills, for the system prompt.
            tool_sources: Tools that come and go (the MCP servers), served in the runtime's nursery.
            gates: The path gates of the tools and the adapters (see
                :func:`kesoku.host.build.runtime_gates`); None: the config's without its file,
                which only the caller knows.
            schedules: Offer the ``schedule`` tool.

        Raises:
            OperatorError: The chosen backend cannot be built (missing key, unknown name).
        """
        from kesoku.llm.factory import create_llm

        default = create_llm(llm_name, config)  # fail at start, not at the first message
        cache: dict[str, BaseLLM] = {}

        def llm_for(session: Session) -> BaseLLM:
            if llm_name is not None or session.llm is None or session.llm == default.provider:
                return default
            if session.llm not in cache:
                cache[session.llm] = create_llm(session.llm, config)
            return cache[session.llm]

        agent = config.agent
        logs = config.turn_logs
        turnlog = (
            TurnLogWriter(max_session_bytes=logs.max_bytes_per_session, redactor=gateway.redactor)
            if logs.enabled
            else None
        )
        return cls(
            gateway,
            llm_for,
            tools=tools,
            persona=agent.persona,
            max_steps_per_turn=agent.max_steps_per_turn,
            max_identical_calls=agent.max_identical_calls,
            worker_idle_s=agent.worker_idle_s,
            project_dir=Path(agent.project_dir) if agent.project_dir else None,
            skills=skills,
            turnlog=turnlog,
            question_timeout_s=agent.question_timeout_s,
            subagent_max_steps=config.subagent.max_steps if config.subagent.enabled else None,
            schedules=schedules,
            compaction=CompactionPolicy.from_config(config),
            tool_sources=tool_sources,
            gates=gates if gates is not None else PathGates.from_config(config),
            budget=Budget.from_config(config, gateway.store),
        )

    def llm_for(self, session: Session) -> BaseLLM:
        """The backend of a session."""
        from kesoku.llm.base import BaseLLM

        llm = self._llm if isinstance(self._llm, BaseLLM) else self._llm(session)
        self._used[id(llm)] = llm
        return llm

    def current_tools(self) -> tuple[Tool, ...]:
        """The tools usable now: the fixed ones, then each source's.

        A name already taken is skipped.
        """
        if not self.tool_sources:
            return self.tools
        out = list(self.tools)
        names = set(self.tools_by_name)
        for source in self.tool_sources:
            for tool in source.tools():
                if tool.name in names:
                    if tool.name not in self._shadowed:
                        self._shadowed.add(tool.name)
                        log.warning(
                            "tool %s of %s is hidden by another tool of that name",
                            tool.name,
                            source.name,
                        )
                    continue
                names.add(tool.name)
                out.append(tool)
        return tuple(out)

    def mask(self, text: str) -> str:
        """``text`` with its secrets masked by the gateway's redactor (``text`` itself without one).

        For what reaches the model without passing the gateway: the system prompt, a subagent's
        tool results.
        """
        redactor = self.gateway.redactor
        return text if redactor is None else redactor.mask(text)

    def cwd(self, session: Session) -> Path:
        """The working directory of a session's tools."""
        return session_cwd(session, self.project_dir)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the turn-log writer, the tool sources and the dispatcher until cancelled.

        Cancellation:
            See :meth:`Dispatcher.serve`; queued turn logs are written before the writer returns,
            and the backends used are closed (bounded by :data:`CLOSE_TIMEOUT_S`).
        """
        try:
            async with trio.open_nursery() as nursery:
                if self.turnlog is not None:
                    await nursery.start(self.turnlog.serve)
                for source in self.tool_sources:
                    await nursery.start(source.serve)
                await nursery.start(self.dispatcher.serve)
                task_status.started()
        finally:
            # Shielded: a cancelled daemon still releases HTTP clients and provider-side caches;
            # bounded.
            with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT_S):
                for llm in list(self._used.values()):
                    await llm.aclose()
