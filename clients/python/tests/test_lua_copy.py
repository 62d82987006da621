# mypy: disallow-untyped-calls=False
"""The package ships the Lua twins of lua-reference/ (copied in by tools/sync_lua.py): the copy
must be exactly the source, and every command the clients send must have its script."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from ratelimit_client import LIBRARY
from ratelimit_client._scripts import SCRIPTS, function_name

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parents[2] / "lua-reference"


def test_the_packaged_scripts_are_lua_reference() -> None:
    # The same check make dist-python runs; it names the stale files and the command to run.
    out = subprocess.run(
        [sys.executable, str(HERE.parent / "tools" / "sync_lua.py"), "--check"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    for script in SCRIPTS.values():
        source = (SOURCE / script.name).read_bytes()
        assert script.text.encode() == source
        assert script.sha == hashlib.sha1(source).hexdigest()
    assert LIBRARY.encode() == (SOURCE / "ratelimit.lua").read_bytes()


def test_every_command_has_its_script_and_function() -> None:
    assert sorted(SCRIPTS) == [
        "RL.ACQUIRE", "RL.ALL", "RL.FIXEDWINDOW", "RL.GCRA", "RL.LEAKYBUCKET", "RL.RELEASE", "RL.SETTLE",
        "RL.SLIDINGLOG", "RL.SLIDINGWINDOW", "RL.TOKENBUCKET",
    ]  # fmt: skip
    for command in SCRIPTS:
        # The library registers one function per command, named after it.
        assert f"redis.register_function('{function_name(command)}'," in LIBRARY, command
    assert LIBRARY.startswith("#!lua name=ratelimit")
