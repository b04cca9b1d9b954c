"""The project's import graph, read from the source: every import, at module level or inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("dashboard", "promesa_bench")

# Each area may import only from areas of a lower rank (and from its own).
RANKS = {
    "core": 0, "models": 1, "queue": 2, "stats": 2, "schemas": 3, "audit": 3, "ingest": 4, "delivery": 4,
    "consumers": 5, "subscriptions": 6, "accounts": 6, "operations": 7, "jobs": 8, "web": 8, "app": 9, "cli": 10,
}
# Areas of one rank that must not meet directly.
APART = {frozenset({"ingest", "delivery"})}


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules `name` makes Python run: each target and the packages above it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                full = f"{source}.{alias.name}"
                targets.add(full if full in known else source)
    ran = set()
    own = set(_ancestors(name))
    for target in targets:
        if target.split(".")[0] not in PACKAGES:
            continue
        # A package's own modules import its `bp` back (Flask's blueprint idiom): not a circle.
        ran.update(t for t in [*_ancestors(target), target] if t in known and t not in own and t != name)
    return ran


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def area(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if parts[0] == "dashboard" and len(parts) > 1 else None


def uphill(edges: dict[str, set[str]]) -> list[str]:
    """Imports that walk up the ranks, or between areas that must stay apart."""
    wrong = []
    for source, targets in sorted(edges.items()):
        for target in sorted(targets):
            a, b = area(source), area(target)
            if a is None or b is None or a == b:
                continue
            if RANKS[b] > RANKS[a] or frozenset({a, b}) in APART:
                wrong.append(f"{source} -> {target}")
    return wrong
