"""Public fakes and checks for tests and demos, Kesoku's own and a third-party backend's.

- :class:`ScriptedLLM` and its :class:`Step` (with :class:`StepError`, :class:`StepEvent`,
  :class:`StepToolCall`, :class:`StepUsage`): a backend that replays a scenario instead of calling a
  model;
- :class:`BlockingDetector`: fails a test whose task step holds the event loop too long;
- :func:`check_backend_contract` with :class:`ContractFake`, :class:`Answer` and :class:`Failure`
  (:mod:`kesoku.testing.backends`): the contract every model backend keeps, checked against a fake
  of its provider;
- :mod:`kesoku.testing.adapters` (imported by name: it loads the store): ``check_adapter_contract``,
  the contract every chat adapter keeps, driven through a ``PlatformDriver`` of its platform's
  fake, with ``FunctionLLM``, ``memory_gateway`` and ``serve_adapter_runtime``;
- :mod:`kesoku.testing.fakes`: wire-level fakes of the Anthropic, OpenAI and Gemini APIs, served
  on loopback (the ``testing`` extra: starlette and hypercorn), imported only by name.

Importing this package stays light: no provider SDK, no starlette, no store, no network.
"""

from __future__ import annotations

from kesoku.host.blocking import BlockingDetector
from kesoku.llm.scripted import ScriptedLLM, Step, StepError, StepEvent, StepToolCall, StepUsage
from kesoku.testing.backends import Answer, ContractFake, Failure, check_backend_contract

__all__ = [
    "Answer",
    "BlockingDetector",
    "ContractFake",
    "Failure",
    "ScriptedLLM",
    "Step",
    "StepError",
    "StepEvent",
    "StepToolCall",
    "StepUsage",
    "check_backend_contract",
]
