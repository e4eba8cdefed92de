"""Import discord.py and trio-asyncio once, quietly: the rest of the adapter imports them from here.

discord.py 2.7 imports the standard library's ``audioop`` (deprecated since Python 3.11) for voice,
which the adapter never uses; the DeprecationWarning it raises at import is filtered here only, so
a process that turns warnings into errors (the test suite) can still load the adapter.
"""

from __future__ import annotations

import warnings

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"discord(\..*)?$")
    warnings.filterwarnings("ignore", message=".*audioop.*", category=DeprecationWarning)
    import discord as discord
    import discord.app_commands as app_commands
    import discord.ui as ui
    import trio_asyncio as trio_asyncio  # type: ignore[import-untyped]  # no py.typed in 0.16

__all__ = ["app_commands", "discord", "trio_asyncio", "ui"]
