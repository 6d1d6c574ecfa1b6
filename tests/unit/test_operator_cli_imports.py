"""The operator commands (``tenure jobs …``) talk HTTP only: running one imports none of the server side,
so ``tenure`` works on a machine that has nothing but the package and a URL."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVER_SIDE = ("broker", "jobs", "tasks", "webapp", "monitoring", "dramatiq", "flask", "sqlalchemy")

PROBE = """
import json, sys
from tenure_cli import main
code = main(sys.argv[1:])
loaded = sorted({m.split(".")[0] for m in sys.modules} & set(json.loads(sys.stdin.read())))
print(json.dumps({"code": code, "loaded": loaded}))
"""


def test_an_operator_command_imports_nothing_of_the_server_side() -> None:
    with socket.socket() as closed:  # a port nobody listens on: the command fails to connect
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "jobs", "list", "--url", url, "--token", "tnr_probe"],
        input=json.dumps(SERVER_SIDE),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert json.loads(done.stdout) == {"code": 1, "loaded": []}
    assert done.stderr.startswith(f"tenure: Cannot reach {url}: ConnectError") and "tnr_probe" not in done.stderr
