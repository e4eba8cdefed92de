"""Kesoku: a self-hosted autonomous agent daemon.

The core package never imports the ``kesoku_*`` adapter packages; adapters are found through the
``kesoku.adapters`` entry-point group (see :mod:`kesoku.host.adapters`).
"""

__version__ = "0.1.0"
