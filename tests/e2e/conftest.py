"""A real deployment for browser tests: migrated SQLite file, gunicorn (gthread) and a dramatiq worker.

Processes listen on 127.0.0.1 only and are stopped by their process-group id at the end.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.e2e.apps.web_kinds:compose"
CHROMIUM = "/usr/bin/chromium"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Deployment:
    base_url: str
    tmp: Path
    env: dict[str, str]
    admin: tuple[str, str]
    user: tuple[str, str]
    admin_token: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    #: People of the other built-in roles: role → (name, password).
    others: dict[str, tuple[str, str]] = field(default_factory=dict)

    def login_of(self, who: str) -> tuple[str, str]:
        """(name, password) of ``admin``, ``user`` or another built-in role's person."""
        return {"admin": self.admin, "user": self.user, **self.others}[who]

    def call(
        self, method: str, path: str, body: Any = None, *, who: str = "admin", headers: dict | None = None
    ) -> tuple[int, Any]:
        """``(status, JSON answer)`` of an API call, whatever the status."""
        name, password = self.login_of(who)
        auth = base64.b64encode(f"{name}:{password}".encode()).decode()
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        request.add_header("Authorization", f"Basic {auth}")
        request.add_header("Content-Type", "application/json")
        for key, value in (headers or {}).items():
            request.add_header(key, value)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")
            try:
                return exc.code, json.loads(text or "null")
            except ValueError:
                return exc.code, text

    def api(self, method: str, path: str, body: Any = None, *, who: str = "admin", headers: dict | None = None) -> Any:
        status, answer = self.call(method, path, body, who=who, headers=headers)
        if status >= 400:
            raise AssertionError(f"{method} {path}: {status} {json.dumps(answer)[:300]}")
        return answer

    def submit(self, kind: str, payload: dict, *, who: str = "user") -> dict:
        return self.api("POST", "/api/v1/jobs", {"kind": kind, "payload": payload}, who=who)

    def wait_job(self, job_id: str, predicate, timeout_s: float = 20.0) -> dict:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout_s
        while True:
            job = self.api("GET", f"/api/v1/jobs/{job_id}")
            if predicate(job):
                return job
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} never got there: {job}")
            time.sleep(0.1)


def _start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(12)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(5)


@pytest.fixture(scope="module")
def deployment(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    import accounts
    from jobs import schema
    from jobs.db import make_engine

    tmp = tmp_path_factory.mktemp("e2e")
    url = f"sqlite:///{tmp / 'tenure.db'}"
    schema.upgrade(url)
    engine = make_engine(url)
    admin_pw = "admin-password-e2e"
    user_pw = "user-password-e2e"
    admin, _ = accounts.create_user(engine, "admin", admin_pw, role="admin")
    accounts.create_user(engine, "ursula", user_pw, role="user")
    others = {"viewer": ("vera", "viewer-password-e2e"), "operator": ("otto", "operator-password-e2e")}
    for role, (name, password) in others.items():
        accounts.create_user(engine, name, password, role=role)
    _, admin_token = accounts.create_token(engine, admin.id, "e2e")
    engine.dispose()
    port = _free_port()
    env = {
        **os.environ,
        "TENURE_DATABASE_URL": url,
        "TENURE_OUTPUT_ROOT": str(tmp / "outputs"),
        "TENURE_WEB_TASKS_APP": APP,
        "TENURE_SECRET_KEY": "e2e-secret",
        "TENURE_WEB_UI_POLL_S": "30",
        "TENURE_WEB_LIVE_POLL_S": "0.2",
        "TENURE_JOB_LEASE_TTL_S": "5",
        "TENURE_IMPORT_ROOTS": str(tmp / "recordings"),
        "PORT": str(port),
        "TENURE_WEB_WORKERS": "2",
        "TENURE_WEB_THREADS": "16",
        # Each refused Basic credential costs one scrypt at this cost, and the fuzz's auth probes send hundreds.
        "TENURE_WEB_PASSWORD_SCRYPT_N": "1024",
    }
    env.update(getattr(request.module, "DEPLOYMENT_ENV", {}))  # a module's own settings (its docstring says why)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    dep = Deployment(
        f"http://127.0.0.1:{port}", tmp, env, ("admin", admin_pw), ("ursula", user_pw), admin_token, others=others
    )
    gunicorn = str(Path(sys.executable).with_name("gunicorn"))
    dep.procs.append(_start([gunicorn, "-c", "gunicorn.conf.py", "webapp:create_app()"], env, tmp / "web.log"))
    dep.procs.append(
        _start(
            [
                sys.executable,
                "-m",
                "dramatiq",
                APP,
                "--processes",
                "1",
                "--threads",
                "4",
                "--worker-shutdown-timeout",
                "2000",
            ],
            env,
            tmp / "worker.log",
        )
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(dep.base_url + "/api/health/live", timeout=1):
                break
        except OSError:
            if time.monotonic() > deadline or dep.procs[0].poll() is not None:
                for proc in dep.procs:
                    _stop(proc)
                raise AssertionError((tmp / "web.log").read_text()[-3000:]) from None
            time.sleep(0.1)
    try:
        yield dep
    finally:
        for proc in dep.procs:
            _stop(proc)
        shutil.rmtree(tmp / "outputs", ignore_errors=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One Chromium per test module (Debian's, driven by Playwright)."""
    playwright_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip("chromium is not installed (scripts/install_browser.sh)")
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-background-networking"])
        yield b
        b.close()
