"""The shell command policy: the operator's intent, parsed with bashlex (ARCHITECTURE.md, "Tools").

Not the boundary: the OS sandbox (:mod:`kesoku.tools.sandbox`) is.
"""
