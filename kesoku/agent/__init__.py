"""The agent: runtime, dispatcher, workers, the turn and its one step loop, subagents, history.

Also compaction, the system prompt, questions and the guards. It uses the model backends, the tools
and MCP servers through their interfaces, and the store only through :mod:`kesoku.gateway`
(ARCHITECTURE.md, "Package map").
"""
