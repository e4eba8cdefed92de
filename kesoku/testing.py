"""Public fakes for tests and demos: the scripted model backend and the blocking detector.

Importing this module stays light: no provider SDK, no store, no network.
"""

from __future__ import annotations

from kesoku.host.blocking import BlockingDetector
from kesoku.llm.scripted import ScriptedLLM, Step, StepError, StepEvent, StepToolCall, StepUsage

__all__ = [
    "BlockingDetector",
    "ScriptedLLM",
    "Step",
    "StepError",
    "StepEvent",
    "StepToolCall",
    "StepUsage",
]
