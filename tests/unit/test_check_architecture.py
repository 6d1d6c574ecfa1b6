"""Counter-examples for scripts/check_architecture.py: each forbidden import shape is caught."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_architecture.py"
spec = importlib.util.spec_from_file_location("check_architecture", SCRIPT)
assert spec and spec.loader
check_architecture = importlib.util.module_from_spec(spec)
sys.modules["check_architecture"] = check_architecture
spec.loader.exec_module(check_architecture)


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for pkg in ("broker", "settings", "accounts", "jobs", "tasks", "webapp", "monitoring"):
        write(tmp_path, f"{pkg}/__init__.py", "")
    return tmp_path


@pytest.mark.parametrize(
    ("rel", "source", "imported"),
    [
        ("broker/x.py", "import jobs.store\n", "jobs.store"),
        ("broker/x.py", "from ..jobs import store\n", "jobs"),
        ("broker/sub/y.py", "from ...tasks.render import f\n", "tasks.render"),
        ("jobs/x.py", "def f():\n    from webapp import create_app\n", "webapp"),
        ("jobs/x.py", "from .. import tasks\n", "tasks"),
        ("jobs/x.py", "import importlib\nimportlib.import_module('tasks.render')\n", "tasks.render"),
        ("tasks/x.py", "import webapp.api\n", "webapp.api"),
        ("monitoring/x.py", "from webapp.auth import login\n", "webapp.auth"),
        ("scripts/tool.py", "import webapp\n", "webapp"),
        ("jobs/x.py", "import tasks.does_not_exist\n", "tasks.does_not_exist"),
        ("settings/x.py", "def f():\n    from jobs.db import make_engine\n", "jobs.db"),
        ("accounts/x.py", "from settings import Settings\n", "settings"),
        ("jobs/x.py", "import accounts\n", "accounts"),
        ("broker/x.py", "from settings.environment import Settings\n", "settings.environment"),
        ("monitoring/x.py", "from accounts import store\n", "accounts"),
        ("migrations/versions/0009_x.py", "from broker import schema_sql\n", "broker"),
        ("migrations/versions/0009_x.py", "import accounts.store  # noqa\n", "accounts.store"),
    ],
)
def test_forbidden_imports_are_reported(tree: Path, rel: str, source: str, imported: str) -> None:
    write(tree, rel, source)
    violations = check_architecture.check(tree)
    assert [v.imported for v in violations] == [imported]
    assert violations[0].path == rel


@pytest.mark.parametrize(
    ("rel", "source"),
    [
        ("webapp/x.py", "import tasks\nimport jobs\nimport broker\nimport monitoring\n"),
        ("tasks/x.py", "from jobs import submit\nfrom broker import SQLiteBroker\n"),
        ("jobs/x.py", "from . import store\nfrom .store import q\nimport broker\n"),
        ("jobs/x.py", "from settings.environment import Settings\n"),
        ("webapp/x.py", "import accounts\nfrom settings import runtime\n"),
        ("tasks/x.py", "import accounts\nfrom settings import Settings\n"),
        ("migrations/env.py", "from jobs.models import metadata\n"),
        ("migrations/versions/0009_x.py", "import sqlalchemy as sa\nfrom alembic import op\n"),
        ("monitoring/x.py", "import jobs\nimport broker\n"),
        ("broker/x.py", "from .store import MessageStore\nimport dramatiq\n"),
        ("jobs/x.py", "import jobsearch\n"),
    ],
)
def test_allowed_imports_pass(tree: Path, rel: str, source: str) -> None:
    write(tree, rel, source)
    assert check_architecture.check(tree) == []


def test_cli_exit_code_and_message(tree: Path) -> None:
    write(tree, "broker/bad.py", "import webapp\n")
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tree)], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "broker/bad.py:1: broker.bad must not import webapp" in proc.stdout


def test_this_repository_is_clean() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


# -- import circles inside a layer -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("files", "cycle"),
    [
        # two modules, one of the imports late (inside a function)
        ({"jobs/a.py": "from . import b\n", "jobs/b.py": "def f():\n    from .a import g\n"}, ("jobs.a", "jobs.b")),
        # three modules, absolute imports, a name imported from a module
        (
            {
                "jobs/a.py": "import jobs.b\n",
                "jobs/b.py": "from jobs.c import x\n",
                "jobs/c.py": "from jobs import a\n",
            },
            ("jobs.a", "jobs.b", "jobs.c"),
        ),
        # a package's __init__ importing its module, which imports the package
        ({"webapp/ui/__init__.py": "from . import pages\n", "webapp/ui/pages.py": "from . import bp\n"},
         ("webapp.ui", "webapp.ui.pages")),
        # importlib counts too
        (
            {"tasks/a.py": "import importlib\nimportlib.import_module('tasks.b')\n", "tasks/b.py": "import tasks.a\n"},
            ("tasks.a", "tasks.b"),
        ),
    ],
)  # fmt: skip
def test_import_circles_inside_a_layer_are_reported(tree: Path, files: dict[str, str], cycle: tuple[str, ...]) -> None:
    for rel, source in files.items():
        write(tree, rel, source)
    found = check_architecture.circles(tree)
    assert [c.cycle for c in found] == [cycle]
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tree)], capture_output=True, text=True)
    assert proc.returncode == 1 and f"import circle in {cycle[0].split('.')[0]}: " in proc.stdout


@pytest.mark.parametrize(
    "files",
    [
        # one-way imports, and a package __init__ re-exporting modules that import only each other
        {"jobs/__init__.py": "from .a import f\n", "jobs/a.py": "from . import b\n", "jobs/b.py": "import json\n"},
        # an annotation-only import never runs
        {
            "broker/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n",
            "broker/b.py": "from .a import A\n",
        },
        # across layers is the layering rule's business, not a circle inside a layer
        {"tasks/a.py": "import jobs.b\n", "jobs/b.py": "def f():\n    import tasks.a\n"},
    ],
)
def test_imports_without_a_circle_pass(tree: Path, files: dict[str, str]) -> None:
    for rel, source in files.items():
        write(tree, rel, source)
    assert check_architecture.circles(tree) == []
