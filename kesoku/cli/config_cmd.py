"""``kesoku config check`` and ``schema``: validate kesoku.toml before the daemon does."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Annotated

from cyclopts import Parameter

from kesoku.config.settings import config_json_schema, default_config_path, load_config


def check(*, config: Annotated[Path | None, Parameter(name=["--config", "-c"])] = None) -> None:
    """Validate a config file the way ``kesoku start`` reads it, and say which sections it sets.

    Every key is checked: unknown keys, wrong types, out-of-range numbers, invalid regexes and
    duplicate MCP server names are reported as one line ``file:line: key.path: what was expected``
    and the command exits 2. Nothing is contacted and no secret is printed. For example
    ``kesoku config check -c /etc/kesoku/kesoku.toml`` before ``kesoku service restart``.

    Args:
        config: The TOML file. Default: $KESOKU_CONFIG, else ./kesoku.toml, else built-in defaults.
    """
    path = config if config is not None else default_config_path()
    cfg = load_config(path)
    if path is None:
        print(f"ok: no kesoku.toml and no $KESOKU_CONFIG; all defaults, db {cfg.workspace.db_path}")
        return
    # Section names only: values may be API keys or tokens.
    sections = sorted(tomllib.loads(path.read_text("utf-8-sig")))
    print(f"ok: {path.resolve()} (sections set: {', '.join(sections) or 'none'})")


def schema() -> None:
    """Print the JSON Schema of kesoku.toml, for editors (``#:schema`` in the file's first line).

    The committed copy lives in schema/kesoku.schema.json; regenerate it after changing
    kesoku/config/settings.py:

        kesoku config schema > schema/kesoku.schema.json
    """
    print(json.dumps(config_json_schema(), indent=2, sort_keys=True))
