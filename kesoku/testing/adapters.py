"""What a chat adapter needs to test itself: a model, a runtime, and the adapter contract.

- :class:`FunctionLLM`: a model backend whose every reply is a Python function of the request.
- :func:`memory_gateway`: a real :class:`~kesoku.gateway.Gateway` over a real SQLite database in
  memory (:class:`MemoryGateway`, which can refuse chosen posts the way a failing database does).
- :func:`serve_adapter_runtime`: a real :class:`~kesoku.agent.runtime.Runtime` served over it, and
  the :class:`~kesoku.host.adapters.AdapterContext` the daemon would give an adapter.
- :func:`check_adapter_contract`: what every chat adapter must do, asserted against the adapter
  and a fake of its platform that the author drives through a :class:`PlatformDriver`.

Nothing is mocked: the store, the gateway, the dispatcher and the turns are the ones the daemon
runs; only the model is a function. Importing this module loads no platform library (discord.py,
the Google clients) and no model SDK.
"""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import trio

from kesoku.config.redact import Redactor
from kesoku.gateway import Gateway
from kesoku.host.adapters import AdapterContext
from kesoku.llm.scripted import SCRIPTED_WINDOW, ScriptedLLM, Step, StepToolCall
from kesoku.store import Store
from kesoku.tools.base import Tool, ToolContext
from kesoku.tools.paths import PathGates, check_share
from kesoku.vocab.errors import StoreError
from kesoku.vocab.ir import LLMRequest, TextBlock, ToolResultBlock
from kesoku.vocab.model import Kind, Message, Role, Session, in_turn, is_answer

if TYPE_CHECKING:
    from kesoku.agent.runtime import Runtime
    from kesoku.llm.base import BaseLLM

__all__ = [
    "AdapterRuntime",
    "FunctionLLM",
    "MemoryGateway",
    "PlatformDriver",
    "StartAdapter",
    "check_adapter_contract",
    "last_user_text",
    "memory_gateway",
    "serve_adapter_runtime",
]

# -- the model ------------------------------------------------------------------------------------


Reply = Callable[[LLMRequest], "str | Step"]
"""What a :class:`FunctionLLM` calls per model call: the answer text, or a whole :class:`Step`."""


class FunctionLLM(ScriptedLLM):
    """A model backend whose reply to each request is computed by a Python function.

    The function sees the whole request (system prompt, turns, tools) and returns the answer text,
    or a :class:`~kesoku.llm.scripted.Step` for anything else: tool calls, thoughts, chunks, a
    delay, an error. Each call of the model (each retry too) calls the function once.

    Args:
        reply: ``(request) -> str | Step``; it runs on the event loop, so it must be quick.
        model: The model name shown in turn logs.
        context_window: The window the "server" reports, in tokens.

    Attributes:
        requests: Every request received, in order.

    Example:
        ``FunctionLLM(lambda request: "you said: " + last_user_text(request))``
    """

    def __init__(
        self, reply: Reply, *, model: str = "function", context_window: int = SCRIPTED_WINDOW
    ) -> None:
        def respond(request: LLMRequest) -> Step:
            answer = reply(request)
            return Step(text=answer) if isinstance(answer, str) else answer

        super().__init__(responder=respond, model=model, context_window=context_window)
        self.reply = reply


def last_user_text(request: LLMRequest) -> str:
    """The text of the newest user turn that holds text (tool results are skipped).

    In a group chat (a sender other than the default) the transcript writes ``"sender: text"``;
    the prefix is kept. Empty when no user turn holds text.
    """
    for turn in reversed(request.turns):
        if turn.role == "user":
            texts = [b.text for b in turn.blocks if isinstance(b, TextBlock)]
            if texts:
                return texts[-1]
    return ""


# -- the gateway ----------------------------------------------------------------------------------


class MemoryGateway(Gateway):
    """A real :class:`~kesoku.gateway.Gateway` that can be told to refuse chosen posts.

    Everything else is the gateway the daemon runs. :func:`memory_gateway` makes one.
    """

    def __init__(self, store: Store, sessions_dir: str | Path, **kwargs: Any) -> None:
        super().__init__(store, sessions_dir, **kwargs)
        self._refusals: list[tuple[Callable[[Message], bool], Exception]] = []

    @contextmanager
    def refuse_posts(
        self, matches: Callable[[Message], bool], error: Exception | None = None
    ) -> Iterator[None]:
        """While inside, a post holding a message that ``matches`` raises ``error`` instead.

        Nothing of such a post is written, as when the database refuses the write. The default
        error is the :class:`~kesoku.vocab.errors.StoreError` a post raises when the database
        stayed locked.

        Args:
            matches: Called with each message posted (before masking); True refuses the post.
            error: What the post raises.
        """
        refusal = (matches, error or StoreError(f"{self.db_path}: the database refused the write"))
        self._refusals.append(refusal)
        try:
            yield
        finally:
            self._refusals.remove(refusal)

    async def post_many(self, messages: Sequence[Message]) -> list[Message]:
        """As :meth:`Gateway.post_many`, unless :meth:`refuse_posts` refuses one of the messages."""
        for matches, error in self._refusals:
            if any(matches(message) for message in messages):
                await trio.lowlevel.checkpoint()
                raise error
        return await super().post_many(messages)


@asynccontextmanager
async def memory_gateway(
    folder: Path | None = None, *, redactor: Redactor | None = None
) -> AsyncIterator[MemoryGateway]:
    """A gateway over an SQLite database in memory, its session folders under ``folder``.

    Args:
        folder: Where session workspaces (and the session locks) go; None: a temporary folder,
            removed afterwards.
        redactor: Masks secrets in every message, as the daemon's does.

    Yields:
        The gateway. Its store is closed (and a temporary folder removed) on exit.
    """
    temporary = folder is None
    root = Path(tempfile.mkdtemp(prefix="kesoku-test-")) if folder is None else Path(folder)
    store = Store(":memory:")
    try:
        yield MemoryGateway(store, root / "sessions", redactor=redactor)
    finally:
        store.close()
        if temporary:
            with trio.CancelScope(shield=True):  # bounded: a folder of a test's few files
                await trio.to_thread.run_sync(shutil.rmtree, root, True)


# -- a runtime and the port -----------------------------------------------------------------------


@dataclass
class AdapterRuntime:
    """A served runtime and the port an adapter gets onto it.

    Attributes:
        rt: The runtime (dispatcher, turns, questions, the event hub).
        gateway: Its gateway.
        ctx: What the daemon would give an adapter: ``AdapterContext.of(rt)``.
        folder: The folder of the session workspaces, the shared folder (``shared``) and the
            protected config file (``kesoku.toml``) of the default path gates.
    """

    rt: Runtime
    gateway: MemoryGateway
    ctx: AdapterContext
    folder: Path

    def sessions(self, adapter: str) -> list[Session]:
        """The sessions an adapter opened (by its chatbot id), oldest first."""
        return self.gateway.store.list_sessions(adapter=adapter)

    def messages(self, adapter: str, *, role: Role | None = None) -> list[Message]:
        """The stored messages of an adapter's sessions (of one role), in log order."""
        found = [
            message
            for session in self.sessions(adapter)
            for message in self.gateway.store.history(session.id)
            if role is None or message.role is role
        ]
        return sorted(found, key=lambda message: message.id)


@asynccontextmanager
async def serve_adapter_runtime(
    llm: BaseLLM,
    *,
    folder: Path | None = None,
    tools: Sequence[Tool] = (),
    gates: PathGates | None = None,
    redactor: Redactor | None = None,
    **runtime_options: Any,
) -> AsyncIterator[AdapterRuntime]:
    """Serve a real runtime over :func:`memory_gateway` and make the port for an adapter.

    Args:
        llm: The model (a :class:`FunctionLLM`, a :class:`~kesoku.llm.scripted.ScriptedLLM`).
        folder: Where session workspaces go; None: a temporary folder, removed afterwards.
        tools: The tools offered to the model.
        gates: The path gates of the tools and of ``[file: …]``; None: ``<folder>/shared`` is
            shareable, ``<folder>/kesoku.toml`` is protected as the config file would be, and
            ``<folder>/home`` is the home folder of the secret rules.
        redactor: Masks secrets in every message.
        **runtime_options: More :class:`~kesoku.agent.runtime.Runtime` arguments
            (``question_timeout_s``, ``persona``, ...).

    Yields:
        The runtime, served until the block ends (then cancelled and the store closed).
    """
    from kesoku.agent.runtime import Runtime  # the agent costs ~0.5 s to import: only when used

    async with memory_gateway(folder, redactor=redactor) as gateway:
        root = gateway.sessions_dir.parent
        if gates is None:
            (root / "shared").mkdir(parents=True, exist_ok=True)
            gates = PathGates(
                shareable_roots=(root / "shared",),
                protected_files=(root / "kesoku.toml",),
                home=root / "home",
            )
        rt = Runtime(gateway, llm, tools=tools, gates=gates, **runtime_options)
        async with trio.open_nursery() as nursery:
            await nursery.start(rt.serve)
            try:
                yield AdapterRuntime(rt, gateway, AdapterContext.of(rt), root)
            finally:
                # A tool batch is shielded from the runtime's cancellation (it finishes, as at a
                # daemon's stop): kill what still runs, such as a question nobody will answer.
                for worker in list(rt.dispatcher.workers.values()):
                    worker.kill_tools("the test ended")
                nursery.cancel_scope.cancel()


# -- the contract ---------------------------------------------------------------------------------


class StartAdapter(Protocol):
    """How the contract starts the adapter under test: its ``serve`` with the test's config.

    ``async def start(ctx, *, task_status): await serve(ctx, config, task_status=task_status)``.
    """

    async def __call__(self, ctx: AdapterContext, *, task_status: trio.TaskStatus[None]) -> None:
        """Run the adapter until cancelled; ``task_status.started()`` once connected.

        Args:
            ctx: The port onto the contract's runtime.
            task_status: Call ``started()`` once, when platform messages are taken in and replies
                delivered.
        """
        ...


class PlatformDriver(Protocol):
    """The test's hand on its fake of the platform: what a user does, what the bot sent.

    One user, one conversation: every message goes where the adapter answers it (a channel, a
    thread, a space) and from a user it answers. Calls come from the test's trio thread.

    Errors:
        An exception a method raises ends the check with that exception (it is the test's fault,
        not a broken rule, so it is not turned into an AssertionError).

    Cancellation:
        The check awaits the async methods under its timeouts and cancels them when one runs out;
        the fake must stay usable (the check then fails, naming the rule it was checking).
    """

    async def send_user_message(self, text: str) -> str:
        """A user sends ``text`` to the bot.

        Args:
            text: The message text (one line of printable ASCII).

        Returns:
            The platform's id of the message: what the adapter must store as the user message's
            ``external_id``.
        """
        ...

    async def redeliver(self, message_id: str) -> None:
        """The platform delivers a message it delivered before again, unchanged.

        What at-least-once delivery (Pub/Sub) or a replay around a reconnect (Discord) does.

        Args:
            message_id: What :meth:`send_user_message` returned.
        """
        ...

    async def answer_question(self, prompt: str, choice: str) -> bool:
        """The user answers the question on show whose text holds ``prompt``.

        Args:
            prompt: A part of the question's text.
            choice: The option chosen, as the user sees it (``Allow`` or ``Deny``).

        Returns:
            False when no such question is on show yet (the contract asks again shortly).
        """
        ...

    def sent_texts(self) -> list[str]:
        """Every text the bot sent as a new message, oldest first.

        A message of several text parts (a card's paragraphs) counts each part; later edits of a
        message do not add texts. Must be quick: the contract calls it every 20 ms while it waits.
        """
        ...

    def sent_files(self) -> list[bytes]:
        """The content of every file the bot uploaded, oldest first (empty without uploads)."""
        ...


RULE_STARTED = "started() once connected"
RULE_ONE_MESSAGE = "a platform message is stored as exactly one user message"
RULE_ANSWERED = "the answer is delivered exactly once"
RULE_FAILURE = "a message that cannot be taken in is logged and told, and the adapter goes on"
RULE_QUESTION = "questions are answered through ctx.questions"
RULE_FILES = "[file: …] shares go through the path gates"
RULE_CANCEL = "cancellation returns promptly"
RULE_CURSOR = "the delivery cursor survives a restart: nothing lost, nothing sent twice"

CONFIRM_TOOL = "kesoku_contract_confirm"
"""The tool the contract's model calls to ask the user a question."""
QUESTION = "May the contract check go on? Allow?"
SECRET = "kesoku-contract-secret-7f3a"
"""What the files the gates refuse hold: it must never reach the platform."""
POLL_S = 0.02


class _Status:
    """A ``task_status`` that counts ``started()`` calls instead of moving a task."""

    def __init__(self) -> None:
        self.calls = 0
        self.event = trio.Event()

    def started(self, value: object = None) -> None:
        self.calls += 1
        self.event.set()


@dataclass
class _Running:
    """One run of the adapter in the contract's nursery."""

    status: _Status = field(default_factory=_Status)
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    done: trio.Event = field(default_factory=trio.Event)
    error: Exception | None = None

    def check(self) -> None:
        """Fail if the adapter stopped by itself, or called ``started()`` twice."""
        if self.status.calls > 1:
            raise AssertionError(f"{RULE_STARTED}: started() was called {self.status.calls} times")
        if self.done.is_set() and not self.scope.cancel_called:
            why = f"raised {self.error!r}" if self.error is not None else "returned"
            raise AssertionError(f"the adapter must run until cancelled; it {why}")


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclass
class _Contract:
    start: StartAdapter
    driver: PlatformDriver
    adapter: str
    timeout_s: float
    cancel_timeout_s: float
    ar: AdapterRuntime
    nursery: trio.Nursery
    log: _Records
    running: _Running = field(default_factory=_Running)
    sent: dict[str, str] = field(default_factory=dict)
    """Platform id → the token of each message the contract sent that must be answered."""

    # -- running the adapter ----------------------------------------------------------------------

    async def start_adapter(self) -> None:
        running = self.running = _Running()

        async def run() -> None:
            try:
                with running.scope:
                    await self.start(self.ar.ctx, task_status=running.status)
            except Exception as exc:
                running.error = exc
            finally:
                running.done.set()

        self.nursery.start_soon(run)
        with trio.move_on_after(self.timeout_s):
            while not running.status.event.is_set():
                running.check()
                with trio.move_on_after(POLL_S):
                    await running.status.event.wait()
        running.check()
        if not running.status.calls:
            raise AssertionError(f"{RULE_STARTED}: not called within {self.timeout_s:g} s")

    async def stop_adapter(self) -> None:
        running = self.running
        running.check()
        running.scope.cancel()
        with trio.move_on_after(self.cancel_timeout_s):
            await running.done.wait()
        if not running.done.is_set():
            raise AssertionError(
                f"{RULE_CANCEL}: serve() still runs {self.cancel_timeout_s:g} s after its "
                "cancellation"
            )
        if running.error is not None:
            raise AssertionError(f"{RULE_CANCEL}: serve() raised {running.error!r} when cancelled")

    async def until(self, rule: str, what: str, predicate: Callable[[], Any]) -> Any:
        with trio.move_on_after(self.timeout_s):
            while True:
                self.running.check()
                found = predicate()
                if found:
                    return found
                await trio.sleep(POLL_S)
        raise AssertionError(f"{rule}: {what} within {self.timeout_s:g} s")

    # -- what the platform and the log hold -------------------------------------------------------

    def stored(self, message_id: str) -> list[Message]:
        return [
            m for m in self.ar.messages(self.adapter, role=Role.USER) if m.external_id == message_id
        ]

    def texts_with(self, text: str) -> list[str]:
        return [t for t in self.driver.sent_texts() if text in t]

    async def send(self, kind: str) -> tuple[str, str]:
        token = f"kc-{kind}-{len(self.sent) + 1}"
        message_id = await self.driver.send_user_message(f"contract check {token}")
        self.sent[message_id] = token
        return message_id, token

    async def answered(self, message_id: str, token: str) -> Message:
        """Wait for the stored user message and its answer on the platform; check both."""
        found: list[Message] = await self.until(
            RULE_ONE_MESSAGE,
            f"no user message with external_id {message_id!r} ({token}) was stored",
            lambda: self.stored(message_id),
        )
        if len(found) != 1:
            raise AssertionError(
                f"{RULE_ONE_MESSAGE}: {message_id!r} ({token}) is stored {len(found)} times"
            )
        (user,) = found
        if token not in user.content:
            raise AssertionError(
                f"{RULE_ONE_MESSAGE}: the message stored for {message_id!r} does not hold what "
                f"was sent ({token!r}): {user.content!r}"
            )
        session = self.ar.gateway.get_session(user.session_id)
        if session is None or session.adapter != self.adapter:
            raise AssertionError(
                f"{RULE_ONE_MESSAGE}: {message_id!r} was stored in a session of "
                f"{session.adapter if session else None!r}, not of {self.adapter!r}"
            )
        await self.until(
            RULE_ANSWERED,
            f"the answer to {token} ({answer_of(token)!r}) did not reach the platform",
            lambda: self.texts_with(answer_of(token)),
        )
        return user

    def check_once(self) -> None:
        """Every message sent is stored once and answered once."""
        for message_id, token in self.sent.items():
            stored = self.stored(message_id)
            if len(stored) != 1:
                raise AssertionError(
                    f"{RULE_ONE_MESSAGE}: {message_id!r} ({token}) is stored {len(stored)} times"
                )
            shown = self.texts_with(answer_of(token))
            if len(shown) != 1:
                raise AssertionError(
                    f"{RULE_ANSWERED}: the answer to {token} reached the platform "
                    f"{len(shown)} times: {shown}"
                )

    # -- the rules --------------------------------------------------------------------------------

    async def run(self) -> None:
        await self.start_adapter()
        root = await self.round_trip_and_redelivery()
        await self.failure()
        await self.question()
        await self.files()
        await self.restart(root)
        self.check_once()
        await self.stop_adapter()

    async def round_trip_and_redelivery(self) -> Message:
        first_id, first = await self.send("echo")
        root = await self.answered(first_id, first)
        await self.driver.redeliver(first_id)
        # A message after the repeat: once it is answered, the repeat was taken in (or dropped).
        await self.answered(*await self.send("echo"))
        self.check_once()
        return root

    async def failure(self) -> None:
        records = len(self.log.records)
        before = len(self.driver.sent_texts())

        def poison(message: Message) -> bool:
            return message.role is Role.USER and "kc-poison" in message.content

        with self.ar.gateway.refuse_posts(poison):
            token = "kc-poison"
            message_id = await self.driver.send_user_message(f"contract check {token}")
            told = await self.until(
                RULE_FAILURE,
                "the user was not told that the message could not be taken in (a new message "
                "naming StoreError)",
                lambda: [t for t in self.driver.sent_texts()[before:] if "StoreError" in t],
            )
        if any("\n" in t.strip() for t in told):
            raise AssertionError(f"{RULE_FAILURE}: the notice is not one line: {told}")
        logged = [
            r for r in self.log.records[records:] if r.exc_info and message_id in r.getMessage()
        ]
        if not logged:
            seen = [r.getMessage() for r in self.log.records[records:]]
            raise AssertionError(
                f"{RULE_FAILURE}: no error logged with its traceback naming the message "
                f"{message_id!r}; logged: {seen}"
            )
        if self.stored(message_id):
            raise AssertionError(f"{RULE_FAILURE}: the refused message was stored after all")
        await self.answered(*await self.send("echo"))

    async def question(self) -> None:
        users = len(self.ar.messages(self.adapter, role=Role.USER))
        message_id, token = await self.send("ask")
        clicked = False
        with trio.move_on_after(self.timeout_s):
            while not (clicked := await self.driver.answer_question(QUESTION, "Allow")):
                self.running.check()
                await trio.sleep(POLL_S)
        if not clicked:
            raise AssertionError(
                f"{RULE_QUESTION}: the question {QUESTION!r} was not shown within "
                f"{self.timeout_s:g} s"
            )
        found: list[Message] = await self.until(
            RULE_ONE_MESSAGE,
            f"no user message with external_id {message_id!r} ({token}) was stored",
            lambda: self.stored(message_id),
        )
        user = found[0]
        store = self.ar.gateway.store

        def recorded() -> list[Message]:
            history = store.history(user.session_id)
            return [m for m in history if is_answer(m) and m.root_id == user.id]

        answers = await self.until(
            RULE_QUESTION,
            "choosing Allow on the platform did not answer the question through ctx.questions",
            recorded,
        )
        if [a.metadata.extra.get("choice") for a in answers] != ["Allow"]:
            said = [a.content for a in answers]
            raise AssertionError(f"{RULE_QUESTION}: the question was answered {said}")
        await self.answered(message_id, token)
        shown = self.texts_with(answer_of(token))
        if not any("allowed" in t for t in shown):
            raise AssertionError(f"{RULE_QUESTION}: the tool was not allowed: {shown}")
        added = self.ar.messages(self.adapter, role=Role.USER)[users:]
        if [m.external_id for m in added] != [message_id]:
            raise AssertionError(
                f"{RULE_QUESTION}: the answer was posted as a user message: "
                f"{[m.content for m in added]}"
            )

    async def files(self) -> None:
        files_before = len(self.driver.sent_files())
        message_id, token = await self.send("file")
        user = await self.answered(message_id, token)
        session = self.ar.gateway.get_session(user.session_id)
        assert session is not None
        for path in refused_files(self.ar.folder):
            reason = await trio.to_thread.run_sync(
                check_share, path, Path(session.workspace), self.ar.rt.gates
            )
            if not isinstance(reason, str):
                raise AssertionError(
                    f"the contract's gates share {path}: give it gates that refuse it"
                )
            if not self.texts_with(reason):
                raise AssertionError(
                    f"{RULE_FILES}: the refusal of {path.name} ({reason!r}) was not told"
                )
        leaked = [t for t in self.driver.sent_texts() if SECRET in t]
        leaked += [
            f"a file of {len(f)} bytes"
            for f in self.driver.sent_files()[files_before:]
            if SECRET.encode() in f
        ]
        if leaked:
            raise AssertionError(
                f"{RULE_FILES}: a file the gates refuse reached the platform: {leaked}"
            )

    async def restart(self, root: Message) -> None:
        await self.stop_adapter()
        before = len(self.driver.sent_texts())
        late = answer_of("kc-late")
        await self.ar.gateway.post(in_turn(root, Role.ASSISTANT, Kind.TEXT, late))
        await self.start_adapter()
        await self.until(
            RULE_CURSOR,
            "a reply written while the adapter was stopped was not delivered after its restart",
            lambda: self.texts_with(late),
        )
        new = self.driver.sent_texts()[before:]
        if new != [late]:
            raise AssertionError(
                f"{RULE_CURSOR}: after the restart the platform got {new}, not only {[late]}"
            )
        await self.answered(*await self.send("echo"))


def answer_of(token: str) -> str:
    """The contract model's answer to a message holding ``token``."""
    return f"answer to {token}"


def refused_files(folder: Path) -> tuple[Path, Path]:
    """Files the default gates refuse: the protected config file and a ``.env`` file shared."""
    return folder / "kesoku.toml", folder / "shared" / ".env"


def _write_secrets(folder: Path) -> None:
    (folder / "shared").mkdir(parents=True, exist_ok=True)
    for path in refused_files(folder):
        path.write_text(f"TOKEN={SECRET}\n")


def _contract_model(folder: Path) -> FunctionLLM:
    def reply(request: LLMRequest) -> str | Step:
        match = re.search(r"kc-[a-z]+-\d+", last_user_text(request))
        token = match.group(0) if match else "kc-unknown"
        last = request.turns[-1].blocks if request.turns else ()
        results = [b.content for b in last if isinstance(b, ToolResultBlock)]
        if token.startswith("kc-ask-"):
            if not results:
                return Step(tool_calls=(StepToolCall(name=CONFIRM_TOOL),))
            return f"{answer_of(token)}: {results[-1]}"
        if token.startswith("kc-file-"):
            markers = "\n".join(f"[file: {path}]" for path in refused_files(folder))
            return f"{markers}\n{answer_of(token)}"
        return answer_of(token)

    return FunctionLLM(reply, model="contract")


def _confirm_tool() -> Tool:
    async def run(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        approval = await ctx.confirm(QUESTION)
        return "allowed" if approval.allowed else f"denied ({approval.note})"

    return Tool(CONFIRM_TOOL, "Ask the user whether the contract check may go on.", run)


async def check_adapter_contract(
    start: StartAdapter,
    driver: PlatformDriver,
    *,
    adapter: str,
    folder: Path | None = None,
    timeout_s: float = 20.0,
    cancel_timeout_s: float = 15.0,
) -> None:
    """Assert what every chat adapter must do, against the adapter and a fake of its platform.

    The contract serves its own runtime (:func:`serve_adapter_runtime`, a model that answers
    ``answer to <token>`` for each message, and a tool that asks the user a question) and starts
    the adapter with its port. Then, in one conversation:

    1. ``started()`` is called once, within ``timeout_s``; the adapter runs until cancelled.
    2. A platform message is stored as exactly one user message of one of the adapter's sessions,
       holding the text, with the platform's id as its ``external_id``; the answer reaches the
       platform exactly once; the platform delivering the message again changes neither.
    3. A message that cannot be taken in (the gateway refuses its post with ``StoreError``) is
       logged at ERROR with its traceback and the platform's id, told to the user in one line
       naming ``StoreError``, and the next message is answered.
    4. A tool's question shown on the platform and answered ``Allow`` there reaches the tool
       through ``ctx.questions``, without becoming a user message.
    5. ``[file: …]`` of the config file and of a ``.env`` file is refused with the reason the path
       gates give, and neither file's content reaches the platform.
    6. Cancelling ``serve`` returns within ``cancel_timeout_s``; a reply written while the adapter
       is stopped is delivered after it starts again, and nothing delivered before is sent again.
    7. Finally, every message is still stored once and answered once.

    Args:
        start: Runs the adapter: ``async (ctx, *, task_status) -> None``.
        driver: The test's fake of the platform, already serving.
        adapter: The adapter's chatbot id: the ``adapter`` of the sessions it opens.
        folder: Where the runtime's sessions, shared folder and config file go; None: a temporary
            folder.
        timeout_s: The longest wait for each thing the platform or the log should show, in seconds.
        cancel_timeout_s: The longest time ``serve`` may take to return once cancelled, in seconds.

    Raises:
        AssertionError: A rule is broken; the message starts with the rule.

    Cancellation:
        Cancelling the check cancels the adapter and the runtime.
    """
    records = _Records()
    root_logger = logging.getLogger()
    root_logger.addHandler(records)
    temporary = None
    if folder is None:
        temporary = folder = Path(tempfile.mkdtemp(prefix="kesoku-contract-"))
    try:
        failure = await _check(start, driver, adapter, folder, timeout_s, cancel_timeout_s, records)
    finally:
        root_logger.removeHandler(records)
        if temporary is not None:
            with trio.CancelScope(shield=True):  # bounded: the few files of one conversation
                await trio.to_thread.run_sync(shutil.rmtree, temporary, True)
    if failure is not None:
        raise failure  # raised here, not inside a nursery: an AssertionError, not a group


async def _check(
    start: StartAdapter,
    driver: PlatformDriver,
    adapter: str,
    folder: Path,
    timeout_s: float,
    cancel_timeout_s: float,
    records: _Records,
) -> AssertionError | None:
    await trio.to_thread.run_sync(_write_secrets, folder)
    async with (
        serve_adapter_runtime(
            _contract_model(folder), folder=folder, tools=(_confirm_tool(),)
        ) as ar,
        trio.open_nursery() as adapters,
    ):
        contract = _Contract(
            start, driver, adapter, timeout_s, cancel_timeout_s, ar, adapters, records
        )
        try:
            await contract.run()
        except AssertionError as exc:
            return exc
        finally:
            adapters.cancel_scope.cancel()
    return None
