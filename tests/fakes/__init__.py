"""Wire-level fakes of the chat platforms (Discord, Google Chat).

The model APIs' fakes are public, in :mod:`kesoku.testing.fakes`.
"""
