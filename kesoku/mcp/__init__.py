"""MCP client: the tools, resources and prompts of the servers in ``[[mcp.servers]]``.

- :mod:`kesoku.mcp.manager`: :class:`~kesoku.mcp.manager.McpManager`, the runtime's tool source; one
  task per server keeps it connected (reconnecting with backoff) and withholds its tools while it is
  not.
- :mod:`kesoku.mcp.client`: one connection over stdio or Streamable HTTP with the official ``mcp``
  SDK (anyio, so it runs on trio), imported in a worker thread on first use (about 1.2 s of CPU).
- :mod:`kesoku.mcp.convert`: provider-safe tool names and MCP results as the text a model reads.

Nothing here imports the SDK at module level, so ``import kesoku.mcp.manager`` stays cheap.
"""
