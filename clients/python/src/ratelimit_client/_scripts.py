"""The Lua twins of ``lua-reference/``, shipped inside the package (``lua/``, copied by
``tools/sync_lua.py``), with their SHA-1 for ``EVALSHA``."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    text: str
    sha: str


def _load(name: str) -> Script:
    text = resources.files("ratelimit_client").joinpath("lua", name).read_text(encoding="utf-8")
    return Script(name, text, hashlib.sha1(text.encode("utf-8")).hexdigest())


#: The script of each command.
SCRIPTS: dict[str, Script] = {
    command: _load(name)
    for command, name in {
        "RL.TOKENBUCKET": "token_bucket.lua",
        "RL.LEAKYBUCKET": "leaky_bucket.lua",
        "RL.FIXEDWINDOW": "fixed_window.lua",
        "RL.SLIDINGWINDOW": "sliding_window.lua",
        "RL.SLIDINGLOG": "sliding_log.lua",
        "RL.GCRA": "gcra.lua",
        "RL.ACQUIRE": "acquire.lua",
        "RL.RELEASE": "release.lua",
        "RL.ALL": "all.lua",
        "RL.SETTLE": "settle.lua",
    }.items()
}

#: The Functions library ``ratelimit`` (``lua-reference/ratelimit.lua``): one function per
#: command, loaded with ``FUNCTION LOAD REPLACE``.
LIBRARY: str = _load("ratelimit.lua").text

#: The name the library registers (``#!lua name=ratelimit``).
LIBRARY_NAME = "ratelimit"


def function_name(command: str) -> str:
    """A command's function in the library: ``RL.TOKENBUCKET`` is ``rl_tokenbucket``."""
    return command.lower().replace(".", "_")
