r"""The secrets file: ``~/.config/kesoku/kesoku.env`` (mode 0600, systemd's EnvironmentFile syntax).

``kesoku init`` writes the keys it was given there, ``kesoku service install`` writes the same file
(the user unit's ``EnvironmentFile=``), and every ``kesoku`` command reads it at start
(:func:`apply_env_file`): a variable already set in the shell wins, so an ``export`` still overrides
the file for one command. One file, one syntax, read the same way by systemd and by Kesoku: lines
``NAME=VALUE``, the value bare, in single quotes (verbatim) or in double quotes (``\`` escapes
``\ " $`` and backquote), blank lines and ``#`` or ``;`` comments (systemd.exec(5),
"EnvironmentFile=").
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, MutableMapping
from pathlib import Path

from kesoku.vocab.errors import ConfigError

ENV_FILE_NAME = "kesoku.env"
MODEL_KEYS = ("ANTHROPIC_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY", "OPENAI_API_KEY")
"""A model backend's API key: any one of them means the local model is not the default."""
KEY_VARIABLES = (
    *MODEL_KEYS,
    "OPENAI_BASE_URL",
    "DISCORD_TOKEN",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_CLOUD_PROJECT",
    "GOOGLE_CLOUD_LOCATION",
    "GOOGLE_GENAI_USE_VERTEXAI",
)
"""Every variable Kesoku reads a credential or an endpoint from (the README's list): the service
carries each one that is set, and ``kesoku doctor`` reports which are."""
_LINE = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.*)")
_DOUBLE_ESCAPE = re.compile(r'\\([\\"$`])')


def config_home(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME``, else ``~/.config``."""
    env = os.environ if env is None else env
    home = env.get("XDG_CONFIG_HOME")
    if home:
        return Path(home)
    return Path(env.get("HOME") or os.path.expanduser("~")) / ".config"


def env_file_path(env: Mapping[str, str] | None = None) -> Path:
    """``~/.config/kesoku/kesoku.env`` (under ``$XDG_CONFIG_HOME`` when set)."""
    return config_home(env) / "kesoku" / ENV_FILE_NAME


def parse_env_file(text: str, *, where: str = ENV_FILE_NAME) -> dict[str, str]:
    """The variables of an EnvironmentFile's text, in file order (a later line wins).

    Args:
        text: The file's contents.
        where: The file's name for error messages.

    Raises:
        ConfigError: A line that is neither a comment nor ``NAME=VALUE``, or an unclosed quote;
            the message names the file and the line (never the value: it may be a secret).
    """
    values: dict[str, str] = {}
    # Only \n ends a line (str.splitlines also splits at \x1c-\x1e, \x85, U+2028: value bytes).
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        match = _LINE.fullmatch(line)
        if match is None:
            raise ConfigError(f"{where}:{number}: expected NAME=VALUE (a variable name, then =)")
        value = match["value"].strip()
        if value[:1] in ("'", '"'):
            quote = value[0]
            if len(value) < 2 or not value.endswith(quote):
                raise ConfigError(f"{where}:{number}: {match['name']}: unclosed {quote} quote")
            value = value[1:-1]
            if quote == '"':
                value = _DOUBLE_ESCAPE.sub(r"\1", value)
        values[match["name"]] = value
    return values


def render_env_file(values: Mapping[str, str], *, header: str) -> str:
    r"""An EnvironmentFile's text: ``header`` as a comment, then one sorted line per variable.

    Single quotes keep a value verbatim; a value holding one is double-quoted instead, with ``\``,
    ``"``, ``$`` and backquote escaped; :func:`parse_env_file` reads back exactly what was given.

    Raises:
        ConfigError: A value holds a line break (the format is one line per variable).
    """
    body = "".join(f"{k}={_quoted(v)}\n" for k, v in sorted(values.items()))
    return f"# {header}\n{body}"


def read_env_file(path: Path) -> dict[str, str]:
    """The variables of the file at ``path``; empty when it does not exist.

    Raises:
        ConfigError: The file cannot be read, or a line is malformed (see :func:`parse_env_file`).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read it ({exc})") from None
    return parse_env_file(text, where=os.fspath(path))


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read, never readable by others even for an instant.

    The folder is created with mode 0700; the file is written to a temporary sibling opened with
    mode 0600 and renamed over the target (so an existing file with looser permissions is replaced,
    not reused).

    Raises:
        OSError: The folder or the file cannot be written.
    """
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            os.fchmod(handle.fileno(), 0o600)  # the umask cannot loosen it, but make it explicit
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def update_env_file(path: Path, values: Mapping[str, str], *, header: str) -> dict[str, str]:
    """Set ``values`` in the file at ``path``, keeping every other variable it holds; mode 0600.

    Returns:
        The file's variables after the update.

    Raises:
        ConfigError: The existing file is malformed (it is left as it was), or a value holds a
            line break.
        OSError: The file cannot be written.
    """
    merged = read_env_file(path) | dict(values)
    write_private(path, render_env_file(merged, header=header))
    return merged


def apply_env_file(
    environ: MutableMapping[str, str] | None = None, path: Path | None = None
) -> list[str]:
    """Copy the secrets file's variables into ``environ`` where they are not already set.

    A set but empty variable counts as unset, as the config's fallbacks treat it.

    Args:
        environ: The environment to fill; ``os.environ`` when None.
        path: The file; :func:`env_file_path` of ``environ`` when None.

    Returns:
        The names that were copied, sorted.

    Raises:
        ConfigError: The file cannot be read or is malformed.
    """
    environ = os.environ if environ is None else environ
    values = read_env_file(env_file_path(environ) if path is None else path)
    applied = sorted(name for name, value in values.items() if not environ.get(name))
    for name in applied:
        environ[name] = values[name]
    return applied


def names_set(names: Iterable[str], env: Mapping[str, str] | None = None) -> list[str]:
    """Those of ``names`` that ``env`` (``os.environ`` when None) sets to a non-empty value."""
    env = os.environ if env is None else env
    return [name for name in names if env.get(name)]


def _quoted(value: str) -> str:
    if "\n" in value or "\r" in value:
        raise ConfigError("a value for the secrets file holds a line break; it cannot be stored")
    if "'" not in value:
        return f"'{value}'"
    return '"' + re.sub(r'([\\"$`])', r"\\\1", value) + '"'
