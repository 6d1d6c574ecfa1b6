"""Importing Tenure's actors has no side effects (as ``tasks/__init__.py`` promises): every ``tasks.*`` module,
imported in a fresh interpreter with a clean environment, reads no environment variable, sets or builds no
Dramatiq broker, starts no thread and writes no file. Only :func:`tasks.compose` may do those things. Nor
does it load the libraries only some code paths use, each paid by every process at start: PyAV and numpy
(~0.3 s; web and scheduler processes never decode media), Alembic (~0.25 s; only a database not at the
head revision needs its migrations), jsonschema (~70 ms; payload checks at submit) and httpx (~50–100 ms;
webhook deliveries).

The probe replaces ``os.environ`` before anything is imported with a mapping that records every read whose
nearest caller outside the standard library is a file of this repository (``os.getenv`` looks the name up
in ``os`` at call time, so it is recorded too): a library reading its own settings while it is imported
(dramatiq's, xml.sax's) is not Tenure's doing, but Tenure code calling ``tempfile.gettempdir()`` at import
would be.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = r"""
import importlib, json, os, sys, threading
from collections.abc import MutableMapping

root = os.path.realpath(sys.argv[1])
modules = json.loads(sys.argv[2])
venv = os.path.realpath(sys.prefix)
stdlib = os.path.realpath(os.path.dirname(os.__file__)) + os.sep  # not platstdlib: a venv's holds site-packages
reads = []


def _ours(filename):
    path = os.path.realpath(filename)
    return path.startswith(root + os.sep) and not path.startswith(venv + os.sep)


def _record(what):
    frame = sys._getframe(2)
    while frame is not None:  # the nearest caller outside the standard library (os.getenv, tempfile…)
        name = frame.f_code.co_filename
        path = os.path.realpath(name)
        if not (name.startswith("<frozen") or (path.startswith(stdlib) and "-packages" + os.sep not in path)):
            break
        if frame.f_code.co_name == "<module>":
            return  # a standard module reading its own setting while it is imported (xml.sax: PY_SAX_PARSER)
        frame = frame.f_back
    if frame is not None and frame.f_code.co_filename != "<string>" and _ours(frame.f_code.co_filename):
        reads.append(f"{os.path.relpath(frame.f_code.co_filename, root)}:{frame.f_lineno} {what}")


class Watched(MutableMapping):
    def __init__(self, real):
        self._real = real

    def __getitem__(self, key):
        _record(f"environ[{key!r}]")
        return self._real[key]

    def __contains__(self, key):
        _record(f"{key!r} in environ")
        return key in self._real

    def __iter__(self):
        _record("iterated environ")
        return iter(self._real)

    def __len__(self):
        return len(self._real)

    def __setitem__(self, key, value):
        _record(f"set environ[{key!r}]")
        self._real[key] = value

    def __delitem__(self, key):
        _record(f"del environ[{key!r}]")
        del self._real[key]

    def copy(self):
        _record("copied environ")
        return self._real.copy()


os.environ = Watched(os.environ)
sys.path.insert(0, root)
threads = set(threading.enumerate())
for module in modules:
    importlib.import_module(module)
import dramatiq.broker

print(json.dumps({
    "imported": sorted(m for m in sys.modules if m == "tasks" or m.startswith("tasks.")),
    "reads": reads,
    "broker": repr(dramatiq.broker.global_broker),
    "threads": sorted(t.name for t in set(threading.enumerate()) - threads),
    "deferred_libraries": sorted({"av", "numpy", "alembic", "jsonschema", "httpx"} & set(sys.modules)),
}))
"""


def _task_modules() -> list[str]:
    found = []
    for path in sorted((ROOT / "tasks").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found.append(".".join(parts))
    return found


def test_importing_every_tasks_module_reads_no_environment_and_sets_no_broker(tmp_path: Path) -> None:
    modules = _task_modules()
    assert {"tasks", "tasks.pipeline", "tasks.scheduling.scheduler", "tasks.domain.media.render"} <= set(modules)
    clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(ROOT), json.dumps(modules)],
        cwd=tmp_path,
        env=clean,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(modules) <= set(report["imported"])
    assert report["reads"] == []
    assert report["broker"] == "None"  # neither set_broker nor get_broker (which builds a default one) ran
    assert report["threads"] == []
    assert report["deferred_libraries"] == []
    assert list(tmp_path.iterdir()) == []  # no database file, no output directory, no log


def test_the_probe_sees_each_side_effect(tmp_path: Path) -> None:
    """The same probe on a package that does what ``tasks`` must not: it reports each thing (the checks can fail)."""
    package = tmp_path / "probe_pkg"
    package.mkdir()
    (package / "__init__.py").write_text(
        "import os, tempfile, threading, time\n"
        "import dramatiq\n"
        "from dramatiq.brokers.stub import StubBroker\n"
        "URL = os.getenv('TENURE_DATABASE_URL')\n"
        "SCRATCH = tempfile.gettempdir()\n"
        "dramatiq.set_broker(StubBroker())\n"
        "threading.Thread(target=time.sleep, args=(5,), name='probe-thread', daemon=True).start()\n"
        "open('probe.db', 'w').close()\n"
        "import numpy\n"
    )
    work = tmp_path / "cwd"
    work.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path), json.dumps(["probe_pkg"])],
        cwd=work,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    # dramatiq's own settings (read while it is imported) are not the package's; tempfile's TMPDIR read is
    assert report["reads"][0] == "probe_pkg/__init__.py:4 environ['TENURE_DATABASE_URL']"
    assert {r.split(" ")[0] for r in report["reads"]} == {"probe_pkg/__init__.py:4", "probe_pkg/__init__.py:5"}
    assert report["broker"].startswith("<dramatiq.brokers.stub.StubBroker")
    assert report["threads"] == ["probe-thread"]
    assert report["deferred_libraries"] == ["numpy"]
    assert [p.name for p in work.iterdir()] == ["probe.db"]
