"""The static import graph of ucudnn, its server and its kernels: every import statement, at any depth.

Function-level imports count (they run, only later); imports under
``if TYPE_CHECKING:`` do not.  An edge goes to the module named, not to the
packages above it, as import-linter and pydeps count them.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: installed name -> folder in the repository (server/ and kernels/ install as ucudnn.server, ucudnn.kernels)
PACKAGES = {"ucudnn": ROOT / "ucudnn", "ucudnn.server": ROOT / "server", "ucudnn.kernels": ROOT / "kernels"}


def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for pkg, folder in PACKAGES.items():
        for f in folder.rglob("*.py"):
            parts = list(f.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([pkg, *parts])] = f
    return found


def _type_checking_only(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                skip.update(id(n) for n in ast.walk(inner))
    return skip


def graph() -> dict[str, set[str]]:
    """module -> the modules of this repository it imports."""
    mods = modules()
    out: dict[str, set[str]] = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text())
        skip = _type_checking_only(tree)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in mods)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for a in node.names:
                    if f"{source}.{a.name}" in mods:
                        edges.add(f"{source}.{a.name}")
                    elif source in mods:
                        edges.add(source)
        edges.discard(name)
        out[name] = edges
    return out


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found
