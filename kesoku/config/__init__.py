"""kesoku.toml: the settings Structs and their loader, one-line error explanations, the secrets.

Above :mod:`kesoku.vocab` only (ARCHITECTURE.md, "Package map").
"""
