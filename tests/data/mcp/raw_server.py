"""An MCP server written without the SDK, as one in another language would be: JSON-RPC by hand.

Its one tool, ``lone``, answers with text holding ``\\ud800``, a lone surrogate escape: valid JSON
(RFC 8259 §7) that pydantic's parser, and so the Python SDK, refuses. The SDK's own servers cannot
send one (pydantic will not encode it), hence this script. Run: ``python raw_server.py``.
"""

from __future__ import annotations

import json
import sys

TOOL = {
    "name": "lone",
    "description": "Answer with a lone surrogate.",
    "inputSchema": {"type": "object"},
}


def answer(request: dict[str, object]) -> dict[str, object] | None:
    method, params = request.get("method"), request.get("params") or {}
    assert isinstance(params, dict)
    if "id" not in request:
        return None  # a notification
    if method == "initialize":
        result: object = {
            "protocolVersion": params.get("protocolVersion"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "raw", "version": "1"},
        }
    elif method == "tools/list":
        result = {"tools": [TOOL]}
    elif method == "tools/call":
        result = {"content": [{"type": "text", "text": "made \ud800 here"}], "isError": False}
    elif method == "ping":
        result = {}
    else:
        return {
            "jsonrpc": "2.0",
            "id": request["id"],
            "error": {"code": -32601, "message": "no such method"},
        }
    return {"jsonrpc": "2.0", "id": request["id"], "result": result}


for line in sys.stdin:
    reply = answer(json.loads(line))
    if reply is not None:
        sys.stdout.write(json.dumps(reply) + "\n")  # ensure_ascii: the surrogate as its \u escape
        sys.stdout.flush()
