#!/usr/bin/env python3
"""Fail when an import breaks the layering of docs/architecture.md.

    webapp ──► tasks ──► jobs ──► broker        monitoring ──► jobs, broker
       └──────────┴────────┴──► settings, accounts (which import no other layer)

Forbidden: ``broker`` importing any other layer; ``settings`` and ``accounts`` importing any other
layer; ``jobs`` importing tasks/webapp/monitoring/accounts; ``tasks`` importing webapp;
``monitoring`` importing webapp/tasks/accounts; anything but webapp importing webapp. Absolute,
relative and function-local imports all count (the whole AST is walked). Migration revisions
(``migrations/versions``) import no product code at all. Inside a layer, modules import each other
without circles (a late import inside a function counts like any other; an ``if TYPE_CHECKING:``
import, which never runs, does not): each circle is reported once, with one path around it.

Usage: ``python scripts/check_architecture.py [ROOT]`` — exit 1 and one line per violation.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

LAYERS = ("broker", "settings", "accounts", "jobs", "tasks", "webapp", "monitoring")

#: For each layer, the layers it must never import.
FORBIDDEN: dict[str, frozenset[str]] = {
    "broker": frozenset(LAYERS) - {"broker"},
    "settings": frozenset(LAYERS) - {"settings"},
    "accounts": frozenset(LAYERS) - {"accounts"},
    "jobs": frozenset({"tasks", "webapp", "monitoring", "accounts"}),
    "tasks": frozenset({"webapp"}),
    "monitoring": frozenset({"webapp", "tasks", "accounts"}),
    "webapp": frozenset(),
}
#: Code outside the layers (scripts, the migration environment, the CLI) may import anything but webapp.
OUTSIDE_FORBIDDEN = frozenset({"webapp"})
#: Migration revisions are frozen in time: they import no product code (a change to a live module would
#: silently change what an old revision does to a database).
REVISIONS_DIR = ("migrations", "versions")
REVISIONS_FORBIDDEN = frozenset(LAYERS) | {"migrations", "tenure_cli"}


@dataclass(frozen=True)
class Violation:
    path: str
    line: int
    importer: str
    imported: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.importer} must not import {self.imported}"


def module_name(root: Path, path: Path) -> list[str]:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    return parts


def _type_checking_only(tree: ast.AST) -> set[int]:
    """The ids of import nodes under ``if TYPE_CHECKING:`` (annotations only: never run)."""
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            guarded.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return guarded


def imported_modules(tree: ast.AST, package: list[str], *, runtime_only: bool = False) -> list[tuple[int, str]]:
    """Every module an AST imports, relative imports resolved against *package* (``runtime_only``: not the
    ``if TYPE_CHECKING:`` imports, which never run)."""
    skip = _type_checking_only(tree) if runtime_only else set()
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1] if node.level <= len(package) else []
                target = ".".join(base + ([node.module] if node.module else []))
                if not node.module:
                    found.extend((node.lineno, f"{target}.{a.name}" if target else a.name) for a in node.names)
                    continue
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            if runtime_only:  # ``from pkg import mod`` imports the module pkg.mod when there is one
                found.extend((node.lineno, f"{target}.{a.name}") for a in node.names)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in (
            "import_module",
            "__import__",
        ):
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                found.append((node.lineno, node.args[0].value))
    return found


@dataclass(frozen=True)
class Circle:
    """Modules of one layer that import each other in a circle (``cycle``: one path around it)."""

    cycle: tuple[str, ...]

    def __str__(self) -> str:
        return f"import circle in {self.cycle[0].split('.')[0]}: {' -> '.join((*self.cycle, self.cycle[0]))}"


def _sources(root: Path) -> list[tuple[Path, list[str]]]:
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in (".venv", "tests", "build", "var") or rel.parts[0].startswith("."):
            continue
        found.append((path, module_name(root, path)))
    return found


def circles(root: Path) -> list[Circle]:
    """Import circles inside each layer (strongly connected modules, Tarjan's algorithm)."""
    modules = {".".join(parts): (path, parts) for path, parts in _sources(root) if parts and parts[0] in LAYERS}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, (path, parts) in modules.items():
        package = parts if path.name == "__init__.py" else parts[:-1]
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except SyntaxError:
            continue  # reported by check()
        for _, target in imported_modules(tree, package, runtime_only=True):
            pieces = target.split(".")
            while pieces and ".".join(pieces) not in modules:
                pieces.pop()  # "jobs.store.JobRow" is the module jobs.store
            imported = ".".join(pieces)
            if imported and imported != name and pieces[0] == parts[0]:
                graph[name].add(imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[Circle] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(Circle(_path_around(graph, set(component), min(component))))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found, key=lambda c: c.cycle)


def _path_around(graph: dict[str, set[str]], members: set[str], start: str) -> tuple[str, ...]:
    """One shortest path from *start* back to itself inside *members* (breadth first)."""
    paths = {start: (start,)}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & members):
            if w == start:
                return paths[v]
            if w not in paths:
                paths[w] = (*paths[v], w)
                queue.append(w)
    raise AssertionError("a strongly connected component has a cycle through each member")


def check(root: Path) -> list[Violation]:
    violations = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in (".venv", "tests", "build", "var") or rel.parts[0].startswith("."):
            continue
        parts = module_name(root, path)
        is_package = path.name == "__init__.py"
        package = parts if is_package else parts[:-1]
        layer = parts[0] if parts and parts[0] in LAYERS else None
        if tuple(rel.parts[:2]) == REVISIONS_DIR:
            forbidden = REVISIONS_FORBIDDEN
        else:
            forbidden = FORBIDDEN[layer] if layer else OUTSIDE_FORBIDDEN
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except SyntaxError as e:
            violations.append(Violation(str(rel), e.lineno or 0, ".".join(parts), f"<syntax error: {e.msg}>"))
            continue
        for line, target in imported_modules(tree, package):
            top = target.split(".", 1)[0]
            if top in forbidden:
                violations.append(Violation(str(rel), line, ".".join(parts) or str(rel), target))
    return violations


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else Path(__file__).resolve().parent.parent)
    problems: list[Violation | Circle] = [*check(root), *circles(root)]
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
