#!/usr/bin/env python3
"""Fail when an import breaks the layering of docs/architecture.md.

    webapp ──► tasks ──► jobs ──► broker        monitoring ──► jobs, broker
       └──────────┴────────┴──► settings, accounts (which import no other layer)

Forbidden: ``broker`` importing any other layer; ``settings`` and ``accounts`` importing any other
layer; ``jobs`` importing tasks/webapp/monitoring/accounts; ``tasks`` importing webapp;
``monitoring`` importing webapp/tasks/accounts; anything but webapp importing webapp. Absolute,
relative and function-local imports all count (the whole AST is walked). Migration revisions
(``migrations/versions``) import no product code at all.

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


def imported_modules(tree: ast.AST, package: list[str]) -> list[tuple[int, str]]:
    """Every module an AST imports, relative imports resolved against *package*."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
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
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in (
            "import_module",
            "__import__",
        ):
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                found.append((node.lineno, node.args[0].value))
    return found


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
    violations = check(root)
    for v in violations:
        print(v)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
