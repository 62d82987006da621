"""Copies lua-reference/*.lua into the package (src/ratelimit_client/lua/), or with --check
fails when the package's copy differs from lua-reference/.

The package ships the Lua twins inside itself (a wheel cannot reach outside its folder); this is
the one step that makes the copy, and tests/test_lua_copy.py and make dist-python run --check,
so the copy never drifts from its source unnoticed.

    python tools/sync_lua.py          # copy
    python tools/sync_lua.py --check  # compare only (exit 1 naming the files that differ)
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parent.parent.parent / "lua-reference"
COPY = HERE.parent / "src" / "ratelimit_client" / "lua"


def differences() -> list[str]:
    """Names of the scripts whose copy is missing, differs, or has no source any more."""
    source = {p.name: p.read_bytes() for p in SOURCE.glob("*.lua")}
    copy = {p.name: p.read_bytes() for p in COPY.glob("*.lua")}
    if not source:
        raise SystemExit(f"no scripts in {SOURCE}")
    return sorted(n for n in source.keys() | copy.keys() if source.get(n) != copy.get(n))


def main(argv: list[str]) -> int:
    stale = differences()
    if "--check" in argv:
        if stale:
            print(
                "the package's Lua scripts differ from lua-reference/: "
                + ", ".join(stale)
                + " (run: python clients/python/tools/sync_lua.py)",
                file=sys.stderr,
            )
            return 1
        return 0
    COPY.mkdir(parents=True, exist_ok=True)
    for name in stale:
        src = SOURCE / name
        if src.exists():
            (COPY / name).write_bytes(src.read_bytes())
        else:
            (COPY / name).unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
