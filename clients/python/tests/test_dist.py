# mypy: disallow-untyped-calls=False
"""The wheel and the sdist, built as make dist-python builds them, installed into a fresh venv
(redis-py from the hashed wheelhouse, nothing else) and used there against real servers."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from servers import Server

pytestmark = pytest.mark.heavy

PROJECT = Path(__file__).resolve().parents[1]
WHEELHOUSE = PROJECT / ".wheelhouse"

SCRIPT = r"""
import asyncio, json, sys
import ratelimit_client
from ratelimit_client import AsyncClient, Client, Concurrency, Options, TokenBucket
from ratelimit_client import asgi, wsgi, decorators, middleware  # no framework needed to import

def run(url):
    c = Client.from_url(url, Options(timeout=2.0))
    out = [c.check("k", TokenBucket(3, 0.001)).decision.remaining for _ in range(4)]
    with c.acquire("slots", Concurrency(1, 30)) as held:
        out.append(held.allowed)
    return {"mode": c.mode.value, "remaining": out}

async def run_async(url):
    async with AsyncClient.from_url(url, Options(timeout=2.0)) as c:
        return (await c.check("a", TokenBucket(3, 0.001))).decision.remaining

module_url, bare_url = sys.argv[1:]
print(json.dumps({
    "file": ratelimit_client.__file__,
    "module": run(module_url),
    "script": run(bare_url),
    "async": asyncio.run(run_async(module_url)),
    "scripts": sorted(ratelimit_client._scripts.SCRIPTS),
}))
"""


def wheelhouse() -> Path:
    """redis-py's wheel, checked against its hash (make test-python fetches it once)."""
    if not any(WHEELHOUSE.glob("redis-*.whl")):
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--require-hashes", "--no-deps", "-r",
             str(PROJECT / "requirements" / "runtime.txt"), "-d", str(WHEELHOUSE)],
            check=True,
        )  # fmt: skip
    return WHEELHOUSE


def build_wheelhouse() -> Path:
    """flit-core's wheel, checked against its hash (make dist-python installs it from PyPI)."""
    if not any(WHEELHOUSE.glob("flit_core-*.whl")):
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--require-hashes", "--no-deps", "-r",
             str(PROJECT / "requirements" / "build.txt"), "-d", str(WHEELHOUSE)],
            check=True,
        )  # fmt: skip
    return WHEELHOUSE


def test_the_wheel_installs_into_a_fresh_venv_and_works(tmp_path: Path, server: Server, bare_server: Server) -> None:
    dist = tmp_path / "dist"
    # As make dist-python builds: the backend's hooks, in a venv of requirements/build.txt alone.
    builder = tmp_path / "build-venv"
    subprocess.run([sys.executable, "-m", "venv", str(builder)], check=True)
    subprocess.run(
        [str(builder / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", "--require-hashes",
         "--no-deps", "--no-index", "--find-links", str(build_wheelhouse()), "-r",
         str(PROJECT / "requirements" / "build.txt")],
        check=True,
    )  # fmt: skip
    frozen = subprocess.run(
        [str(builder / "bin" / "python"), "-m", "pip", "freeze"], check=True, capture_output=True, text=True
    ).stdout
    assert frozen.splitlines() == ["flit_core==4.2.0"]
    built = subprocess.run(
        [str(builder / "bin" / "python"), str(PROJECT / "tools" / "build_dist.py"), str(dist)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert built.splitlines() == ["ratelimit_client-0.1.0.tar.gz", "ratelimit_client-0.1.0-py3-none-any.whl"]
    [wheel] = dist.glob("ratelimit_client-*.whl")
    [sdist] = dist.glob("ratelimit_client-*.tar.gz")
    lua = sorted(p.name for p in (PROJECT / "src" / "ratelimit_client" / "lua").glob("*.lua"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "ratelimit_client/py.typed" in names
    assert sorted(n.split("/")[-1] for n in names if n.startswith("ratelimit_client/lua/")) == lua
    metadata = zipfile.ZipFile(wheel).read(f"{wheel.name.split('-py3')[0]}.dist-info/METADATA").decode()
    assert "Requires-Dist: redis>=8.1.0,<9\n" in metadata
    with tarfile.open(sdist) as t:
        members = t.getnames()
    root = sdist.name.removesuffix(".tar.gz")
    assert f"{root}/src/ratelimit_client/py.typed" in members
    assert all(f"{root}/src/ratelimit_client/lua/{n}" in members for n in lua)
    assert f"{root}/tools/sync_lua.py" in members and f"{root}/requirements/runtime.txt" in members

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheelhouse()), str(wheel)],
        check=True,
    )
    freeze = subprocess.run([str(python), "-m", "pip", "freeze"], check=True, capture_output=True, text=True).stdout
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert sorted(freeze.splitlines()) == [f"ratelimit-client @ file://{wheel}#sha256={digest}", "redis==8.1.0"]
    out = subprocess.run(
        [str(python), "-c", SCRIPT, server.url, bare_server.url], check=True, capture_output=True, text=True
    )
    got = json.loads(out.stdout)
    assert got["file"].startswith(str(venv))
    assert got["module"] == {"mode": "module", "remaining": [2, 1, 0, 0, True]}
    assert got["script"] == {"mode": "script", "remaining": [2, 1, 0, 0, True]}
    assert got["async"] == 2
    assert got["scripts"] == [
        "RL.ACQUIRE", "RL.ALL", "RL.FIXEDWINDOW", "RL.GCRA", "RL.LEAKYBUCKET", "RL.RELEASE", "RL.SETTLE",
        "RL.SLIDINGLOG", "RL.SLIDINGWINDOW", "RL.TOKENBUCKET",
    ]  # fmt: skip
