"""Model backends behind one template; each provider module imports its SDK lazily.

ARCHITECTURE.md, "Model backends", says what they share.
"""
