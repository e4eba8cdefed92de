"""Provider-safe names for MCP tools and MCP results as text (no server needed)."""

from __future__ import annotations

import base64
import subprocess
import sys
from random import Random

from hypothesis import given
from hypothesis import strategies as st
from mcp_types import (
    AudioContent,
    CallToolResult,
    GetPromptResult,
    PromptMessage,
    ResourceLink,
    TextContent,
)

from kesoku.mcp.convert import (
    TOOL_NAME_RULE,
    block_text,
    call_result_text,
    decoded_size,
    prompt_text,
    server_prefixes,
    tool_names,
)

names = st.text(st.characters(codec="utf-8"), min_size=1, max_size=90)


@given(
    st.lists(names, min_size=1, max_size=4, unique=True),
    st.lists(names, max_size=12, unique=True),
    st.randoms(),
)
def test_offered_names_follow_every_providers_rule_and_map_back(
    servers: list[str], tools: list[str], rnd: Random
) -> None:
    prefixes = server_prefixes(servers)
    assert len(set(prefixes.values())) == len(servers)
    offered: dict[str, str] = {}
    for server in servers:
        mapping = tool_names(prefixes[server], tools)
        assert all(TOOL_NAME_RULE.match(name) for name in mapping), mapping
        assert sorted(mapping.values()) == sorted(tools)  # one offered name per tool, mapped back
        shuffled = tools[:]
        rnd.shuffle(shuffled)
        # the server's listing order does not matter
        assert tool_names(prefixes[server], shuffled) == mapping
        assert not offered.keys() & mapping.keys()  # no two servers share a name
        offered.update(mapping)


def test_names_are_readable_when_they_can_be() -> None:
    assert server_prefixes(
        ["files", "my.server", "my_server", "1password", "日本", "a__b", "-x-"]
    ) == {
        "files": "files",
        "my.server": "my_server",
        "my_server": "my_server_2",
        "1password": "_1password",
        "日本": "mcp",
        "a__b": "a_b",
        "-x-": "_-x-",
    }
    assert tool_names("files", ["read_file", "read.file", "read-file"]) == {
        "files__read-file": "read-file",
        "files__read_file": "read.file",  # "read.file" < "read_file": it keeps the plain name
        "files__read_file_2": "read_file",
    }
    [long] = tool_names("files", ["x" * 100])
    assert len(long) == 64 and long.startswith("files__xxx")


def test_content_blocks_as_text() -> None:
    audio = AudioContent(data=base64.b64encode(bytes(1000)).decode(), mime_type="audio/wav")
    assert block_text(audio) == "[audio: audio/wav, 1,000 bytes, not shown]"
    link = ResourceLink(
        uri="file:///r.txt", name="r", mime_type="text/plain", size=2048, description="A report"
    )
    assert (
        block_text(link)
        == "[resource link file:///r.txt (name r, text/plain, 2,048 bytes): A report]"
    )
    assert [decoded_size(base64.b64encode(bytes(n)).decode()) for n in range(6)] == list(range(6))
    assert (
        call_result_text(CallToolResult(content=[], structured_content={"n": 1}), 100) == '{"n": 1}'
    )
    assert call_result_text(CallToolResult(content=[]), 100) == "(no content)"


def test_prompt_messages_as_one_user_message() -> None:
    def message(role: str, text: str) -> PromptMessage:
        return PromptMessage(role=role, content=TextContent(text=text))  # type: ignore[arg-type]

    only_user = GetPromptResult(messages=[message("user", "one"), message("user", "two")])
    assert prompt_text(only_user) == "one\n\ntwo"
    dialogue = GetPromptResult(messages=[message("user", "hi"), message("assistant", "hello")])
    assert prompt_text(dialogue) == "[user]\nhi\n\n[assistant]\nhello"


def test_the_manager_and_the_daemon_do_not_import_the_sdk() -> None:
    probe = (
        "import sys, kesoku.host.daemon, kesoku.mcp.manager; "
        "print(sorted(m for m in sys.modules if m.startswith('mcp')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=False, timeout=120
    )
    assert result.stdout.strip().splitlines()[-1:] == ["[]"], result.stderr
