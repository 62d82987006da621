"""Builds the sdist and the wheel into a folder with the build backend alone: the PEP 517 hooks
of ``flit_core.buildapi`` (pyproject.toml's ``build-backend``) called in this interpreter, which
needs nothing but flit-core (``make dist-python`` makes a venv of requirements/build.txt for it).

    python tools/build_dist.py OUTDIR   # prints the two file names
"""

from __future__ import annotations

import importlib
import os
import sys
import tomllib
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent


def build(outdir: Path) -> list[Path]:
    backend = tomllib.loads((PROJECT / "pyproject.toml").read_text())["build-system"]["build-backend"]
    if backend != "flit_core.buildapi":
        raise SystemExit(f"pyproject.toml's backend is {backend}, not flit_core.buildapi")
    hooks = importlib.import_module(backend)

    outdir.mkdir(parents=True, exist_ok=True)
    here = Path.cwd()
    os.chdir(PROJECT)  # the hooks build the project in the working directory
    try:
        sdist: str = hooks.build_sdist(str(outdir))
        wheel: str = hooks.build_wheel(str(outdir))
    finally:
        os.chdir(here)
    return [outdir / sdist, outdir / wheel]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: build_dist.py OUTDIR")
    for path in build(Path(sys.argv[1]).resolve()):
        print(path.name)
