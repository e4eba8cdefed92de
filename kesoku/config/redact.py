"""Secrets masked once, before anything records them: :class:`Redactor`.

What is masked in any text handed to :meth:`Redactor.mask`:

- The values of configured secrets (:func:`configured_secrets`): ``[gemini]``, ``[claude]`` and
  ``[openai] api_key``, ``[discord] bot_token``, the secret fields of the ``[gchat]
  credentials_file`` JSON when it can be read (``private_key``, ``private_key_id``,
  ``client_secret``, ``refresh_token``), MCP servers' secret-looking header and environment values,
  and the daemon's environment variables whose names hold KEY, TOKEN, SECRET, PASSWORD, PASSWD or
  CREDENTIAL. Each value is also found in its JSON-escaped form (a key file printed by ``cat``).
  Left out: values under :data:`MIN_SECRET_CHARS` characters (masking every ``dev`` or ``1234``
  would wreck ordinary text and protect little), and values that are a path or a URL without a
  password (``GOOGLE_APPLICATION_CREDENTIALS=/etc/key.json`` names the secret, it is not one).
- Well-known shapes (:data:`SHAPES`, :data:`KEPT_SHAPES`): GitHub tokens (``ghp_`` … ``ghr_``,
  ``github_pat_``), OpenAI (``sk-…``, ``sk-proj-…``) and Anthropic (``sk-ant-…``) keys, Google
  API keys (``AIza…``) and OAuth access tokens (``ya29.…``), Slack tokens (``xox[abprs]-…``) and
  webhook URLs, AWS access key ids (``AKIA``/``ASIA``) and secret keys after their names, JWTs,
  PEM private key blocks (a block cut short is masked to its end), ``Bearer`` credentials, the
  value of an upper-case ``NAME=value`` whose name says password, secret, token or key, and the
  password of ``scheme://user:password@host`` (the user and host stay).

Each becomes ``[redacted:KIND]``: the shape (``github-token``), the config key
(``openai.api_key``) or the variable (``$DEPLOY_TOKEN``). Masked text is a fixed point: masking it
again changes nothing, and text without a secret comes back as the same object.

Where it is applied (see ARCHITECTURE.md): the gateway masks every message before it is checked,
stored and handed to listeners (``content`` and the strings inside ``metadata.tool_arguments``),
so the database, exports, trace pages, chat surfaces and the model's next request get the masked
text, and a tool call runs with the masked arguments it is stored with; the turn-log writer masks
each model response; the system prompt (it holds AGENTS.md) and a subagent's tool results are
masked where they are made.

What is not masked: a secret split across two messages or two strings; a secret encoded
(base64, URL-encoded, hex) or cut by an output cap before its recognisable part; values under
the length floor; shapes not listed (a lower-case ``password: x`` line of a YAML file);
``metadata.thought_signature`` and ids (opaque provider data, sent back exactly),
``metadata.extra``, attachment names and bytes; the live text deltas shown while a turn streams
(never stored); rows written before masking existed.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import msgspec

from kesoku.vocab.model import Message

if TYPE_CHECKING:
    from kesoku.config.settings import Config

MIN_SECRET_CHARS = 8
"""Configured values shorter than this are not masked (see the module docstring)."""
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
"""A variable (environment, MCP ``env``, header) whose name matches holds a secret."""
SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})
"""HTTP header names that hold credentials whatever :data:`SECRET_NAME` says."""
CREDENTIALS_FILE_KEYS = ("private_key", "private_key_id", "client_secret", "refresh_token")
"""The secret fields of a Google credentials JSON (service account or authorized user)."""

_TOKEN = "A-Za-z0-9_-"  # the characters of most tokens: a token starts where none precedes it
_NAME = "A-Za-z0-9"  # a variable's name: DB_PASSWORD= is one, MYPASSWORD= is not
_AWS_SECRET = r"[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])"
_VALUE = r"[^\s\"'$<{\[*/~.][^\s\"'&;,]{7,}"  # 8+ characters, not a placeholder or a path
# A PEM block's body (base64 lines, JSON-escaped line breaks, the headers of an encrypted key, the
# marker of an output cap that cut it: kesoku.tools.output.MARKER) and its END line when it has
# one. Possessive: linear, never backtracking.
_PEM_BODY = (
    r"(?:(?:Proc-Type|DEK-Info):[^\n]*|\[… [0-9]+ bytes cut …\]|\\[nr]|[A-Za-z0-9+/=]+|\s+)*+"
    r"(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----)?"
)

SHAPES: tuple[tuple[str, str, str, str], ...] = (
    ("private-key", "", "-----", rf"BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----{_PEM_BODY}"),
    ("anthropic-key", _TOKEN, "s", rf"k-ant-[{_TOKEN}]{{20,}}"),
    (
        "openai-key",
        _TOKEN,
        "s",
        rf"k-(?:(?:proj|svcacct|admin)-[{_TOKEN}]{{20,}}|[A-Za-z0-9]{{32,}})",
    ),
    ("github-token", _TOKEN, "", r"gh[pousr]_[A-Za-z0-9]{36,}"),
    ("github-token", _TOKEN, "", r"github_pat_[A-Za-z0-9_]{22,}"),
    ("google-api-key", _TOKEN, "AI", rf"za[{_TOKEN}]{{35}}"),
    ("google-oauth-token", _TOKEN, "", rf"ya29\.[{_TOKEN}]{{20,}}"),
    (
        "slack-webhook",
        "",
        "https://hoo",
        rf"ks\.slack\.com/(?:services|workflows|triggers)/[/{_TOKEN}]{{8,}}",
    ),
    ("slack-token", _TOKEN, "", r"xox[abprs]-[A-Za-z0-9-]{10,}"),
    ("aws-access-key-id", "A-Z0-9", "A", r"KIA[A-Z0-9]{16}(?![A-Z0-9])"),
    ("aws-access-key-id", "A-Z0-9", "AS", r"IA[A-Z0-9]{16}(?![A-Z0-9])"),
    ("jwt", _TOKEN, "ey", rf"J[{_TOKEN}]{{8,}}\.eyJ[{_TOKEN}]{{8,}}\.[{_TOKEN}]*"),
)
"""``(kind, boundary, prefix, regex)`` of the shapes masked whole: the token is ``prefix`` (plain
text) then what ``regex`` matches; with a ``boundary`` (a character class body) it may not follow
such a character ("task-…" holds no "sk-" key). ``regex`` starts with a plain character, chosen
rare (see :class:`Redactor`)."""

KEPT_SHAPES: tuple[tuple[str, str, str, str, str], ...] = (
    ("password", "", "", r"://[^\s:/?#@\[\]\"'<>]*:", r"(?![$<{\[*])[^\s/?#@\"'<>]+(?=@)"),
    ("bearer-token", _TOKEN, "", r"Bearer +", r"[A-Za-z0-9_.~+/-]{20,}=*"),
    *(
        ("aws-secret-access-key", "", prefix, rf"{key}[\"']?\s*[=:]\s*[\"']?", _AWS_SECRET)
        for prefix, key in (
            ("aws_secret_access_", "key"),
            ("AWS_SECRET_ACCESS_", "KEY"),
            ("SecretAccess", "Key"),
        )
    ),
    *(
        (kind, _NAME, start, rf"{rest}(?:_[A-Z0-9]+)*=", _VALUE)
        for kind, words in (
            ("password", (("PASS", "WORD"), ("PASS", "WD"))),
            ("secret", (("SE", "CRET"),)),
            ("token", (("TO", "KEN"),)),
            ("api-key", (("API_", "KEY"), ("API", "KEY"), ("ACCESS_", "KEY"), ("PRIVATE_", "KEY"))),
        )
        for start, rest in words
    ),
)
"""``(kind, boundary, prefix, kept, masked)``: ``prefix`` and the text matching ``kept`` stay (a
URL's scheme and user, a variable's name); the ``masked`` text right after them is replaced."""

# Characters by how often they occur in prose, code and logs, the most frequent first (roughly): a
# literal secret is found at its rarest character.
_LOWER = " etaoinsrhldcu\n.mf_p(,)g=w:y\"b/'-v0123456789k[]x{}"
_BY_FREQUENCY = {c: i for i, c in enumerate(_LOWER + "STACEIRPNOLDMFjBUGHqzKVWYJXQZ")}
_RARE = len(_BY_FREQUENCY)  # anything not listed: rarer still
_ANCHOR_WITHIN = 16  # a literal's anchor is among its first characters (a short lookbehind)

T = TypeVar("T")


class Redactor:
    """Masks configured secret values and well-known token shapes in text, in one regex pass.

    Build one per process (:meth:`from_config`) and share it: it is immutable, so threads may
    share it too.

    How it stays fast: one scan of the text. The alternatives are grouped by the plain character
    each starts with, so the compiled pattern knows the few characters a match can start at and
    tries to match only there. That character is chosen rare: ``sk-…`` is found at its ``k`` and
    ``eyJ…`` at its ``J`` (a lookbehind checks what precedes), a literal at its rarest character.
    Text without a secret costs that scan (about 10 ns a character) and no copy.

    Args:
        secrets: ``value -> kind`` of literal secrets (:func:`configured_secrets`), matched as they
            are, longest first, before the shapes.
    """

    def __init__(self, secrets: Mapping[str, str] | None = None) -> None:
        self.secrets: dict[str, str] = {v: kind for v, kind in (secrets or {}).items() if v}
        """The literal values masked and the kind each is named by."""
        branches: dict[str, list[str]] = {}  # a first character -> the alternatives it starts
        # group name -> (kind, characters of the token before the match, the match before is kept)
        self._groups: dict[str, tuple[str, int, bool]] = {}

        def add(name: str, kind: str, edge: str, prefix: str, rx: str, masked: str | None) -> None:
            first, rest = rx[0], rx[1:]
            lead = re.escape(prefix + first)
            guard = (f"(?<={lead})" if prefix else "") + (f"(?<![{edge}]{lead})" if edge else "")
            group = f"(?P<{name}>{masked})"
            body = f"(?P<{name}>{guard}{rest})" if masked is None else f"{guard}{rest}{group}"
            branches.setdefault(re.escape(first), []).append(body)
            self._groups[name] = (kind, len(prefix), masked is not None)

        for i, value in enumerate(sorted(self.secrets, key=len, reverse=True)):
            head = value[:_ANCHOR_WITHIN]
            at = max(range(len(head)), key=lambda j: _BY_FREQUENCY.get(head[j], _RARE))
            regex = value[at] + re.escape(value[at + 1 :])
            add(f"l{i}", self.secrets[value], "", value[:at], regex, None)
        for i, (kind, boundary, prefix, regex) in enumerate(SHAPES):
            add(f"s{i}", kind, boundary, prefix, regex, None)
        for i, (kind, boundary, prefix, kept, masked) in enumerate(KEPT_SHAPES):
            add(f"k{i}", kind, boundary, prefix, kept, masked)
        self._pattern = re.compile("|".join(f"{c}(?:{'|'.join(a)})" for c, a in branches.items()))

    @classmethod
    def from_config(cls, config: Config, env: Mapping[str, str] | None = None) -> Redactor:
        """The redactor of a process: the secrets of ``config`` and ``env`` (blocking: reads files).

        Args:
            config: The loaded config.
            env: The process environment; ``os.environ`` when None.
        """
        return cls(configured_secrets(config, os.environ if env is None else env))

    def mask(self, text: str) -> str:
        """``text`` with each secret replaced by ``[redacted:KIND]``; ``text`` itself if none."""
        parts: list[str] = []
        done = 0  # text[:done] is in parts
        for match in self._pattern.finditer(text):
            name = match.lastgroup
            assert name is not None  # every alternative ends in its named group
            kind, before, kept = self._groups[name]
            start = match.start(name) if kept else max(match.start() - before, done)
            parts += (text[done:start], f"[redacted:{kind}]")
            done = match.end(name)
        if not parts:
            return text
        parts.append(text[done:])
        masked = "".join(parts)
        return text if masked == text else masked

    def mask_tree(self, value: T) -> T:
        """A JSON-like value (dicts, lists, tuples, strings, scalars) with its strings masked.

        Keys are left as they are. ``value`` itself comes back when nothing in it changed.
        """
        if isinstance(value, str):
            return self.mask(value)  # type: ignore[return-value]
        if isinstance(value, dict):
            items = {key: self.mask_tree(item) for key, item in value.items()}
            if all(items[key] is item for key, item in value.items()):
                return value
            return items  # type: ignore[return-value]
        if isinstance(value, list | tuple):
            masked = [self.mask_tree(item) for item in value]
            if all(new is old for new, old in zip(masked, value, strict=True)):
                return value
            out = tuple(masked) if isinstance(value, tuple) else masked
            return out  # type: ignore[return-value]
        return value

    def mask_message(self, message: Message) -> Message:
        """A message with its ``content`` and the strings of ``metadata.tool_arguments`` masked.

        Returns:
            ``message`` itself when there was nothing to mask, else a copy. Ids, the thought
            signature and every other field are left as they are.
        """
        content = self.mask(message.content)
        arguments = message.metadata.tool_arguments
        masked = self.mask_tree(arguments) if arguments else arguments
        if content is message.content and masked is arguments:
            return message
        metadata = message.metadata
        if masked is not arguments:
            metadata = msgspec.structs.replace(metadata, tool_arguments=masked)
        return msgspec.structs.replace(message, content=content, metadata=metadata)


def configured_secrets(config: Config, env: Mapping[str, str]) -> dict[str, str]:
    """``value -> kind`` of the secrets a process holds (the rules are in the module docstring).

    Args:
        config: The loaded config.
        env: The process environment.

    Returns:
        Each value (and its JSON-escaped form) with the name it is masked by: the config key
        (``gemini.api_key``), ``gchat.credentials_file.FIELD``, ``mcp.NAME.headers.HEADER``,
        ``mcp.NAME.env.VAR``, or ``$VAR`` for the environment. A config key wins over a variable.
    """
    from kesoku.config.settings import McpStdioServer

    found = [
        (kind, value)
        for kind, value in (
            ("gemini.api_key", config.gemini.api_key),
            ("claude.api_key", config.claude.api_key),
            ("openai.api_key", config.openai.api_key),
            ("discord.bot_token", config.discord.bot_token),
        )
        if value
    ]
    if config.gchat.credentials_file:
        found += _credentials_file_secrets(config.gchat.credentials_file)
    for server in config.mcp.servers:
        where = f"mcp.{server.name}"
        if isinstance(server, McpStdioServer):
            env_vars = server.env.items()
            found += [(f"{where}.env.{n}", v) for n, v in env_vars if SECRET_NAME.search(n)]
            continue
        for name, value in server.headers.items():
            if name.lower() in SECRET_HEADERS or SECRET_NAME.search(name):
                found.append((f"{where}.headers.{name}", value))
                scheme, _, credential = value.partition(" ")
                if credential and scheme.isalpha():  # "Bearer xyz": xyz may be printed alone
                    found.append((f"{where}.headers.{name}", credential))
    found += [(f"${n}", v) for n, v in sorted(env.items()) if SECRET_NAME.search(n)]
    secrets: dict[str, str] = {}
    for kind, value in found:
        value = value.strip()
        if len(value) >= MIN_SECRET_CHARS and _NOT_SECRET.fullmatch(value) is None:
            for form in (value, json.dumps(value, ensure_ascii=False)[1:-1]):
                secrets.setdefault(form, kind)
    return secrets


_NOT_SECRET = re.compile(r"(?:~?\.{0,2}/|[A-Za-z]:[\\/])\S*|https?://[^@\s]*")
"""Values that are a path or a URL without credentials: they name a secret, they are not one."""


def _credentials_file_secrets(path: str) -> list[tuple[str, str]]:
    """The secret fields of a Google credentials JSON; none when it cannot be read or parsed.

    An unreadable file is not an error here: the adapter that uses it reports it.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(data, dict):
        return []
    return [
        (f"gchat.credentials_file.{key}", value)
        for key in CREDENTIALS_FILE_KEYS
        if isinstance(value := data.get(key), str)
    ]
