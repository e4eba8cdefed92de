"""The words every layer speaks: messages, the model IR, events, metrics, errors, text checks.

Nothing here imports the rest of Kesoku (ARCHITECTURE.md, "Package map"): the transcript and the
compacted view are here too, because the model backends, the store and the observers all read them.
"""
