"""The loopback server of the fakes, now public in :mod:`kesoku.testing.fakes.server`.

The adapters' fakes (chat_api.py) and their tests import it from here.
"""

from kesoku.testing.fakes.server import Recorded, RequestLog, serve_app

__all__ = ["Recorded", "RequestLog", "serve_app"]
