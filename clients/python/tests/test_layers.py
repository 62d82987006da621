"""The package's modules in layers, as the table of docs/architecture.md (``<!-- layers: python
-->``) lists them: every import of a module (at the top, inside a function, or for typing only),
read with ``ast``, is of a module of its row; every module is in the table; and a row uses only
rows above it, so that no import goes upward and no circle can form."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "ratelimit_client"
DOC = Path(__file__).resolve().parents[3] / "docs" / "architecture.md"
MARKER = "<!-- layers: python -->"


def layer_table() -> list[tuple[str, set[str]]]:
    """The rows of the table, in order: (module, the modules it may use)."""
    doc = DOC.read_text()
    assert MARKER in doc, f"docs/architecture.md has no {MARKER!r}"
    rows: list[tuple[str, set[str]]] = []
    for line in doc[doc.index(MARKER) + len(MARKER) :].splitlines()[1:]:
        if not line.strip():
            break
        cells = [c.strip() for c in line.split("|")]
        layer = cells[1].strip("`")
        if layer in ("layer", "") or layer.startswith("-"):
            continue
        uses = {u.strip().strip("`") for u in cells[2].split(",")} - {"nothing", ""}
        rows.append((layer, uses))
    assert rows, f"the table after {MARKER!r} is empty"
    return rows


def imports_of(path: Path) -> set[str]:
    """The package's modules that a module imports, wherever the import statement is."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                if node.module:
                    out.add(node.module.split(".")[0])
                else:
                    out.update(a.name for a in node.names)
            elif node.level == 0 and node.module and node.module.split(".")[0] == "ratelimit_client":
                parts = node.module.split(".")
                out.add(parts[1] if len(parts) > 1 else "__init__")
            else:
                assert node.level == 0, f"{path.name}: an import from {node.level} levels up"
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "ratelimit_client":
                    out.add(parts[1] if len(parts) > 1 else "__init__")
    return out


def violations(rows: list[tuple[str, set[str]]], imports: dict[str, set[str]]) -> list[str]:
    """What is wrong with a package whose modules import ``imports`` under the table ``rows``."""
    out = []
    table = dict(rows)
    if len(table) != len(rows):
        out.append("a module is listed twice")
    if sorted(table) != sorted(imports):
        out.append(
            f"not in the table: {sorted(set(imports) - set(table))}; not a module: {sorted(set(table) - set(imports))}"
        )
    above: set[str] = set()
    for layer, uses in rows:
        if not uses <= above:
            out.append(f"{layer} may use {sorted(uses - above)}, which are not above it")
        above.add(layer)
    for name, got in sorted(imports.items()):
        if name in table and not got <= table[name]:
            out.append(f"{name} imports {sorted(got - table[name])}, not in its row")
        if name in table and not table[name] <= got:
            out.append(f"{name}'s row lists {sorted(table[name] - got)}, which it does not import")
    return out


def test_every_import_goes_down_the_table() -> None:
    imports = {p.stem: imports_of(p) for p in PACKAGE.glob("*.py")}
    assert len(imports) == 16
    assert violations(layer_table(), imports) == []


def test_the_check_sees_an_upward_import_and_a_circle(tmp_path: Path) -> None:
    """What the check reads: an upward import inside a function and one for typing only; and
    what it refuses: a circle, an import missing from its row, a module missing from the table."""
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from .decorators import limit\n"
        "def f():\n    from . import asgi\n    import ratelimit_client.wsgi\n"
        "    from ratelimit_client import Client\n"
    )
    assert imports_of(source) == {"decorators", "asgi", "wsgi", "__init__"}
    assert violations([("a", {"b"}), ("b", {"a"})], {"a": {"b"}, "b": {"a"}}) == [
        "a may use ['b'], which are not above it"
    ]
    assert violations([("a", set()), ("b", {"a"})], {"a": {"b"}, "b": {"a"}, "c": set()}) == [
        "not in the table: ['c']; not a module: []",
        "a imports ['b'], not in its row",
    ]
