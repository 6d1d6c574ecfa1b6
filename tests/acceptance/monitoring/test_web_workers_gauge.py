"""The shipped ``gunicorn.conf.py`` counts its web workers in ``tenure_web_workers`` (make run's web process)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _web_workers(url: str) -> float | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("tenure_web_workers "):
            return float(line.split()[1])
    return None


def test_gunicorn_conf_counts_its_web_workers(tmp_path: Path) -> None:
    # Given the Procfile's web command with the shipped config, two workers and a multiprocess directory
    port = _free_port()
    (tmp_path / "prom").mkdir()
    env = {
        **os.environ,
        "PORT": str(port),
        "TENURE_DATABASE_URL": f"sqlite:///{tmp_path / 'tenure.db'}",
        "TENURE_OUTPUT_ROOT": str(tmp_path / "outputs"),
        "TENURE_SECRET_KEY": "test-secret-key",
        "TENURE_WEB_WORKERS": "2",
        "TENURE_WEB_METRICS_PUBLIC": "true",
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prom"),
    }
    env.pop("TENURE_WEB_BIND", None)
    bin_dir = Path(sys.executable).parent
    subprocess.run([str(bin_dir / "tenure"), "db", "upgrade"], env=env, cwd=ROOT, check=True, capture_output=True)
    web = subprocess.Popen(
        [str(bin_dir / "gunicorn"), "-c", "gunicorn.conf.py", "webapp:create_app()"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        # When /metrics is scraped
        deadline = time.monotonic() + 30
        value = None
        while time.monotonic() < deadline and web.poll() is None:
            value = _web_workers(f"http://127.0.0.1:{port}/metrics")
            if value == 2:
                break
            time.sleep(0.2)

        # Then both gunicorn workers are counted
        assert value == 2, f"tenure_web_workers is {value}"
    finally:
        os.killpg(web.pid, signal.SIGTERM)
        web.wait(timeout=20)
