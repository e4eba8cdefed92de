"""Buttons and menus: the turn header (📜 🛑 ♻️) and question choices, as persistent dynamic items.

Every button's state lives in its ``custom_id`` (at most 100 characters, Discord API "Message
Components"), and the item classes are registered once with ``Client.add_dynamic_items``; so a
button keeps working after a restart, with no view to re-attach per message (discord.py
``ui.DynamicItem``). The callbacks run on the asyncio side (discord.py calls them); they hand Kesoku
work to the adapter, which runs it on the trio side.

Custom ids:

- ``kesoku:trace:<session>:<root>`` and ``kesoku:stop:<session>:<root>``: a turn's header;
- ``kesoku:clear:<session>``: delete the session (regular channels only);
- ``kesoku:q:<message>:<part>:<choice>``: a ``[question: …]`` of assistant message ``<message>``;
- ``kesoku:qs:<message>:<part>:<menu>``: a select menu of such a question (too many choices for
  buttons); the chosen option's value is the choice's index;
- ``kesoku:ask:<question>:<choice>``: a tool's Allow/Deny question (system message ``<question>``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Protocol

from kesoku_discord._compat import discord, ui
from kesoku_discord.convert import (
    BUTTONS_PER_MESSAGE,
    MAX_OPTION_CHARS,
    button_label,
    fit_buttons,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

log = logging.getLogger(__name__)

TRACE, STOP, CLEAR = "📜", "🛑", "♻️"
MENUS_PER_MESSAGE = 5
"""A select menu fills an action row; five rows per message (Discord API, "Action Rows")."""
OPTIONS_PER_MENU = 25
"""Options of one select menu (Discord API, "String Select")."""


class Actions(Protocol):
    """What the buttons ask of the adapter.

    Implemented by :class:`kesoku_discord.adapter.DiscordAdapter`.
    """

    async def on_trace(
        self, interaction: discord.Interaction[Any], session_id: str, root_id: int
    ) -> None:
        """Send the turn's trajectory page."""

    async def on_stop(
        self, interaction: discord.Interaction[Any], session_id: str, root_id: int
    ) -> None:
        """Stop the session's running turn."""

    async def on_clear(self, interaction: discord.Interaction[Any], session_id: str) -> None:
        """Delete the session."""

    async def on_choice(
        self, interaction: discord.Interaction[Any], message_id: int, part: int, choice: int
    ) -> None:
        """A choice of a ``[question: …]`` was clicked."""

    async def on_answer(
        self, interaction: discord.Interaction[Any], question_id: int, choice: int
    ) -> None:
        """Allow or Deny was clicked on a tool's question."""


async def _guarded(interaction: discord.Interaction[Any], action: Awaitable[None]) -> None:
    """Run a click's action as its own failure domain: an error is logged and told to the user."""
    try:
        await action
    except Exception as exc:
        custom_id = interaction.data.get("custom_id", "?") if interaction.data else "?"
        log.exception("discord: button %s (interaction %s) failed", custom_id, interaction.id)
        text = f"⚠️ That did not work ({type(exc).__name__})."
        try:
            if interaction.response.is_done():
                await interaction.followup.send(text, ephemeral=True)
            else:
                await interaction.response.send_message(text, ephemeral=True)
        except Exception as notice:  # the interaction expired, or Discord is unreachable
            log.warning("discord: interaction %s not told it failed: %s", interaction.id, notice)


async def _refuse(interaction: discord.Interaction[Any], text: str) -> None:
    """Tell the user only (an ephemeral reply) why the interaction did nothing."""
    await interaction.response.send_message(text, ephemeral=True)


def _actions(interaction: discord.Interaction[Any]) -> Actions:
    actions: Actions = interaction.client.actions  # set by KesokuClient
    return actions


class TraceButton(
    ui.DynamicItem[ui.Button[Any]], template=r"kesoku:trace:(?P<sid>[\w-]+):(?P<root>\d+)"
):
    """📜: the turn's trajectory as an HTML file."""

    def __init__(self, session_id: str, root_id: int) -> None:
        super().__init__(
            ui.Button(
                emoji=TRACE,
                style=discord.ButtonStyle.secondary,
                custom_id=f"kesoku:trace:{session_id}:{root_id}",
            )
        )
        self.session_id, self.root_id = session_id, root_id

    @classmethod
    async def from_custom_id(
        cls, interaction: discord.Interaction[Any], item: ui.Item[Any], match: re.Match[str], /
    ) -> TraceButton:
        """Rebuild the button from its custom id (after a restart too)."""
        return cls(match["sid"], int(match["root"]))

    async def callback(self, interaction: discord.Interaction[Any]) -> None:
        """Hand the click to the adapter."""
        action = _actions(interaction).on_trace(interaction, self.session_id, self.root_id)
        await _guarded(interaction, action)


class StopButton(
    ui.DynamicItem[ui.Button[Any]], template=r"kesoku:stop:(?P<sid>[\w-]+):(?P<root>\d+)"
):
    """🛑: stop the running turn."""

    def __init__(self, session_id: str, root_id: int) -> None:
        super().__init__(
            ui.Button(
                emoji=STOP,
                style=discord.ButtonStyle.secondary,
                custom_id=f"kesoku:stop:{session_id}:{root_id}",
            )
        )
        self.session_id, self.root_id = session_id, root_id

    @classmethod
    async def from_custom_id(
        cls, interaction: discord.Interaction[Any], item: ui.Item[Any], match: re.Match[str], /
    ) -> StopButton:
        """Rebuild the button from its custom id (after a restart too)."""
        return cls(match["sid"], int(match["root"]))

    async def callback(self, interaction: discord.Interaction[Any]) -> None:
        """Hand the click to the adapter."""
        action = _actions(interaction).on_stop(interaction, self.session_id, self.root_id)
        await _guarded(interaction, action)


class ClearButton(ui.DynamicItem[ui.Button[Any]], template=r"kesoku:clear:(?P<sid>[\w-]+)"):
    """♻️: delete the session, its messages and its workspace."""

    def __init__(self, session_id: str) -> None:
        super().__init__(
            ui.Button(
                emoji=CLEAR,
                style=discord.ButtonStyle.secondary,
                custom_id=f"kesoku:clear:{session_id}",
            )
        )
        self.session_id = session_id

    @classmethod
    async def from_custom_id(
        cls, interaction: discord.Interaction[Any], item: ui.Item[Any], match: re.Match[str], /
    ) -> ClearButton:
        """Rebuild the button from its custom id (after a restart too)."""
        return cls(match["sid"])

    async def callback(self, interaction: discord.Interaction[Any]) -> None:
        """Hand the click to the adapter."""
        action = _actions(interaction).on_clear(interaction, self.session_id)
        await _guarded(interaction, action)


class ChoiceButton(
    ui.DynamicItem[ui.Button[Any]], template=r"kesoku:q:(?P<mid>\d+):(?P<part>\d+):(?P<choice>\d+)"
):
    """One choice of a ``[question: …]``; the choice's text is read back from the stored message."""

    def __init__(self, message_id: int, part: int, choice: int, label: str = "…") -> None:
        super().__init__(
            ui.Button(
                label=button_label(label),
                style=discord.ButtonStyle.primary,
                custom_id=f"kesoku:q:{message_id}:{part}:{choice}",
            )
        )
        self.message_id, self.part, self.choice = message_id, part, choice

    @classmethod
    async def from_custom_id(
        cls, interaction: discord.Interaction[Any], item: ui.Item[Any], match: re.Match[str], /
    ) -> ChoiceButton:
        """Rebuild the button from its custom id (after a restart too)."""
        label = getattr(item, "label", None) or "…"
        return cls(int(match["mid"]), int(match["part"]), int(match["choice"]), label)

    async def callback(self, interaction: discord.Interaction[Any]) -> None:
        """Hand the click to the adapter."""
        actions = _actions(interaction)
        action = actions.on_choice(interaction, self.message_id, self.part, self.choice)
        await _guarded(interaction, action)


class ChoiceSelect(
    ui.DynamicItem[ui.Select[Any]],
    template=r"kesoku:qs:(?P<mid>\d+):(?P<part>\d+):(?P<menu>\d+)",
):
    """A select menu of up to 25 choices of a ``[question: …]`` with too many for buttons.

    An option's value is the choice's index in the question; its text is read back from the stored
    message, as for :class:`ChoiceButton`.
    """

    def __init__(
        self,
        message_id: int,
        part: int,
        menu: int,
        options: Sequence[discord.SelectOption] = (),
        placeholder: str | None = None,
    ) -> None:
        super().__init__(
            ui.Select(
                custom_id=f"kesoku:qs:{message_id}:{part}:{menu}",
                placeholder=placeholder,
                options=list(options),
            )
        )
        self.message_id, self.part = message_id, part

    @classmethod
    async def from_custom_id(
        cls, interaction: discord.Interaction[Any], item: ui.Item[Any], match: re.Match[str], /
    ) -> ChoiceSelect:
        """Rebuild the menu from its custom id (after a restart too)."""
        options = getattr(item, "options", ())
        placeholder = getattr(item, "placeholder", None)
        return cls(int(match["mid"]), int(match["part"]), int(match["menu"]), options, placeholder)

    async def callback(self, interaction: discord.Interaction[Any]) -> None:
        """Hand the chosen option to the adapter; a value that is no choice index is refused."""
        data: Mapping[str, Any] = interaction.data or {}
        values = data.get("values") or [""]
        value = str(values[0])
        if not re.fullmatch(r"\d{1,6}", value, re.ASCII):
            refusal = _refuse(interaction, "That is not one of the question's choices.")
            await _guarded(interaction, refusal)
            return
        actions = _actions(interaction)
        action = actions.on_choice(interaction, self.message_id, self.part, int(value))
        await _guarded(interaction, action)


class AnswerButton(
    ui.DynamicItem[ui.Button[Any]], template=r"kesoku:ask:(?P<qid>\d+):(?P<choice>\d+)"
):
    """Allow or Deny on a tool's question.

    Answered through ``ctx.questions``, never as a user message.
    """

    def __init__(self, question_id: int, choice: int, label: str = "…") -> None:
        style = discord.ButtonStyle.success if choice == 0 else discord.ButtonStyle.danger
        super().__init__(
            ui.Button(
                label=button_label(label),
                style=style,
                custom_id=f"kesoku:ask:{question_id}:{choice}",
            )
        )
        self.question_id, self.choice = question_id, choice

    @classmethod
    async def from_custom_id(
        cls, interaction: discord.Interaction[Any], item: ui.Item[Any], match: re.Match[str], /
    ) -> AnswerButton:
        """Rebuild the button from its custom id (after a restart too)."""
        label = getattr(item, "label", None) or "…"
        return cls(int(match["qid"]), int(match["choice"]), label)

    async def callback(self, interaction: discord.Interaction[Any]) -> None:
        """Hand the click to the adapter."""
        action = _actions(interaction).on_answer(interaction, self.question_id, self.choice)
        await _guarded(interaction, action)


DYNAMIC_ITEMS = (TraceButton, StopButton, ClearButton, ChoiceButton, ChoiceSelect, AnswerButton)
"""Registered with ``Client.add_dynamic_items`` at start: every Kesoku button and menu, before and
after a restart."""


def header_view(session_id: str, root_id: int, *, clear: bool, running: bool = True) -> ui.View:
    """The header's buttons: 📜 always, 🛑 while the turn runs, ♻️ outside threads."""
    view = ui.View(timeout=None)
    view.add_item(TraceButton(session_id, root_id))
    if running:
        view.add_item(StopButton(session_id, root_id))
    if clear:
        view.add_item(ClearButton(session_id))
    return view


def choice_views(message_id: int, part: int, choices: Sequence[str]) -> list[ui.View]:
    """The components of a question's choices, one view per message; every choice is in one.

    Choices that all fit whole on buttons (:func:`~kesoku_discord.convert.fit_buttons`) are
    buttons labelled with the choice, as the message shows only the question. Up to 25 with a label
    too long are buttons numbered ``N. label…``; more are select menus of 25 numbered options
    (labels cut to 100 characters), five per message, so 125 choices per view and a further view
    (message) per 125 more. Either way the message lists every choice in full
    (:func:`~kesoku_discord.convert.question_content`).

    Args:
        message_id: The assistant message holding the question.
        part: The question's index in the message's parts (``parse_reply``).
        choices: The question's choices, at least one.

    Returns:
        The views, in order: the first goes with the question's text, each further one with a
        message of its own.
    """
    if len(choices) <= BUTTONS_PER_MESSAGE:
        whole = fit_buttons(choices)
        view = ui.View(timeout=None)
        for i, choice in enumerate(choices):
            label = choice if whole else f"{i + 1}. {choice}"
            view.add_item(ChoiceButton(message_id, part, i, label))
        return [view]
    views: list[ui.View] = []
    per_view = MENUS_PER_MESSAGE * OPTIONS_PER_MENU
    for first in range(0, len(choices), per_view):
        view = ui.View(timeout=None)
        for start in range(first, min(first + per_view, len(choices)), OPTIONS_PER_MENU):
            chunk = choices[start : start + OPTIONS_PER_MENU]
            options = [
                discord.SelectOption(
                    label=button_label(f"{start + n}. {choice}", MAX_OPTION_CHARS),
                    value=str(start + n - 1),
                )
                for n, choice in enumerate(chunk, 1)
            ]
            placeholder = f"Choose ({start + 1}–{start + len(chunk)})"
            menu = start // OPTIONS_PER_MENU
            view.add_item(ChoiceSelect(message_id, part, menu, options, placeholder))
        views.append(view)
    return views


def answer_view(question_id: int, options: Sequence[str]) -> ui.View:
    """Allow / Deny buttons of a tool's question."""
    view = ui.View(timeout=None)
    for i, option in enumerate(options[:BUTTONS_PER_MESSAGE]):
        view.add_item(AnswerButton(question_id, i, option))
    return view


def disabled_copy(message: discord.Message, chosen: int | None = None) -> ui.View:
    """The message's buttons and menus, all disabled: no second submission.

    The chosen button is highlighted; a menu shows the chosen option (value ``chosen``) as
    selected.
    """
    view = ui.View(timeout=None)
    for row in message.components:
        for component in getattr(row, "children", ()):
            if isinstance(component, discord.SelectMenu):
                view.add_item(_disabled_menu(component, chosen))
                continue
            if not isinstance(component, discord.Button):
                continue
            custom_id = component.custom_id or ""
            highlight = chosen is not None and custom_id.endswith(f":{chosen}")
            style = discord.ButtonStyle.success if highlight else discord.ButtonStyle.secondary
            view.add_item(
                ui.Button(
                    label=component.label,
                    emoji=component.emoji,
                    style=style,
                    custom_id=custom_id or None,
                    disabled=True,
                )
            )
    return view


def _disabled_menu(menu: discord.SelectMenu, chosen: int | None) -> ui.Select[Any]:
    options = [
        discord.SelectOption(
            label=o.label, value=o.value, default=chosen is not None and o.value == str(chosen)
        )
        for o in menu.options
    ]
    select: ui.Select[Any] = ui.Select(placeholder=menu.placeholder, options=options, disabled=True)
    if menu.custom_id:  # always, for a menu of ours; else discord.py's made-up id stays
        select.custom_id = menu.custom_id
    return select
