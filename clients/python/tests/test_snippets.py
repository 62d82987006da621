# mypy: disallow-untyped-calls=False
"""Every ```python block of README.md and docs/python.md (and of docs/clients.md and
docs/client.md, which have none today), extracted from the Markdown, is a module of its own:
type-checked with ``mypy --strict`` as written, then run against a server with the module (the
address ``redis://127.0.0.1:6379`` of the docs replaced by the server's). Each block must send
the server at least one command of the module (``INFO commandstats``); each application it
makes (a Flask, Starlette or FastAPI app) answers a request on each of its routes, and at least
one of those answers carries the ``RateLimit`` fields."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from servers import Server, call

pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parents[3]
PROJECT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "docs/python.md", "docs/clients.md", "docs/client.md"]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
ADDRESS = "redis://127.0.0.1:6379"


@dataclass
class Snippet:
    file: str
    line: int
    code: str

    @property
    def name(self) -> str:
        return f"{self.file}:{self.line}"


def snippets() -> list[Snippet]:
    out = []
    for f in DOCS:
        text = (ROOT / f).read_text()
        for m in BLOCK.finditer(text):
            out.append(Snippet(f, 1 + text.count("\n", 0, m.start()), m.group(1)))
    return out


def test_the_docs_have_their_blocks() -> None:
    found = {s.name for s in snippets()}
    assert len(found) == 8, sorted(found)
    assert sum(1 for s in snippets() if s.file == "README.md") == 1


def test_every_block_type_checks_strictly(tmp_path: Path) -> None:
    files = []
    for i, s in enumerate(snippets()):
        path = tmp_path / f"snippet_{i}.py"
        path.write_text(s.code)
        files.append((path, s))
    config = tmp_path / "mypy.ini"
    config.write_text(f"[mypy]\nstrict = True\nmypy_path = {PROJECT / 'src'}\ncache_dir = {tmp_path / 'cache'}\n")
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(config), *(str(p) for p, _ in files)],
        capture_output=True,
        text=True,
    )
    report = run.stdout
    for path, s in files:
        report = report.replace(str(path), s.name)
    assert run.returncode == 0, report
    assert report.startswith(f"Success: no issues found in {len(files)} source files")


def module_calls(server: Server) -> int:
    """Calls of the module's commands the server has answered."""
    info = call(server.raw(), "INFO", "commandstats")
    text = info.decode() if isinstance(info, bytes) else str(info)
    return sum(int(m.group(1)) for m in re.finditer(r"^cmdstat_rl\.\w+:calls=(\d+)", text, re.M))


def apps_of(namespace: dict[str, Any]) -> list[tuple[str, Any]]:
    from flask import Flask
    from starlette.applications import Starlette

    return [(n, v) for n, v in namespace.items() if isinstance(v, (Flask, Starlette))]


def method_of(methods: Any) -> str:
    """GET when a route takes it, else the first other method it takes (not OPTIONS, HEAD)."""
    allowed = set(methods or ()) - {"OPTIONS", "HEAD"}
    return "GET" if not allowed or "GET" in allowed else sorted(allowed)[0]


def requests_to(app: Any) -> list[dict[str, str]]:
    """One request on each route of ``app`` (``/`` when it has none): the status and the fields."""
    from flask import Flask
    from starlette.routing import Route
    from starlette.testclient import TestClient

    out = []
    if isinstance(app, Flask):
        web = app.test_client()
        rules: list[tuple[str, Any]] = [(r.rule, r.methods) for r in app.url_map.iter_rules() if r.endpoint != "static"]
        for path, methods in rules or [("/", None)]:
            r = web.open(path, method=method_of(methods))
            out.append({"path": path, "status": str(r.status_code), **dict(r.headers)})
        return out
    with TestClient(app) as web:
        routes: list[tuple[str, Any]] = [
            (r.path, r.methods)
            for r in app.routes
            if isinstance(r, Route) and not r.path.startswith(("/docs", "/openapi", "/redoc"))
        ]
        for path, methods in routes or [("/", None)]:
            r = web.request(method_of(methods), path)
            out.append({"path": path, "status": str(r.status_code), **r.headers})
    return out


@pytest.mark.parametrize("snippet", snippets(), ids=lambda s: s.name)
def test_every_block_runs_against_a_server(snippet: Snippet, server: Server) -> None:
    code = snippet.code.replace(ADDRESS, server.url)
    assert code != snippet.code or ADDRESS not in snippet.code
    before = module_calls(server)
    namespace: dict[str, Any] = {"__name__": "snippet"}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, snippet.name, "exec"), namespace)
        answers = {name: requests_to(app) for name, app in apps_of(namespace)}
    assert module_calls(server) > before, f"{snippet.name} sent the module no command"
    for name, got in answers.items():
        limited = [a for a in got if any(k.lower() == "ratelimit" for k in a)]
        assert limited, f"{snippet.name}: no answer of {name} carries the RateLimit fields: {got}"
