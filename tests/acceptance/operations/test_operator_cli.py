"""``tenure jobs|queues|dead-letters|schedules|workers`` end to end: every subcommand as a subprocess
(``python -m tenure_cli …``) against a real gunicorn and a real worker on a migrated SQLite file.

The subprocesses' environment holds only ``PATH``, ``TENURE_URL`` and ``TENURE_TOKEN``: the CLI
reaches the jobs through the HTTP API alone, with the permissions of the token's user. Variants of
a subcommand (filters, paging, refusals) call the same ``tenure_cli.main`` in this process, which
saves an interpreter start each. One deployment serves the whole module (the ``deployment``
fixture); every test leaves the queues and schedules running. The same deployment serves the
stuck-thread retry over HTTP (a job whose thread is blocked in C code past its timeout).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import queue
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tenure_cli import main as tenure_main

from .support import ROOT, Procs, processes, wait_for
from .web import Http

APP = "tests.acceptance.operations.apps.cli_kinds:compose"
#: Every test here shares the module's deployment: one xdist worker runs them all.
pytestmark = pytest.mark.xdist_group("operator-cli")


@dataclass
class Deployment:
    url: str
    tmp: Path
    flags: Path
    tokens: dict[str, str]
    passwords: dict[str, str]
    procs: Procs
    #: The test's own API client (setup and checks; one keep-alive connection).
    http: httpx.Client

    def api(self, method: str, path: str, body: Any = None, *, who: str = "admin") -> Any:
        response = self.http.request(method, path, json=body, headers={"Authorization": f"Bearer {self.tokens[who]}"})
        assert response.is_success, f"{method} {path}: {response.status_code} {response.text[:300]}"
        return response.json()

    def submit(self, kind: str, payload: dict[str, Any], *, who: str = "ursula", delay_s: float = 0) -> dict:
        return self.api("POST", "/api/v1/jobs", {"kind": kind, "payload": payload, "delay_s": delay_s}, who=who)

    def wait_job(self, job_id: str, *statuses: str, timeout_s: float = 15) -> dict:
        return wait_for(
            f"job {job_id} to be {statuses}",
            lambda: (job := self.api("GET", f"/api/v1/jobs/{job_id}"))["status"] in statuses and job,
            timeout_s,
            self.procs,
            poll_s=0.05,
        )

    def env(self, who: str) -> dict[str, str]:
        return {"PATH": os.environ["PATH"], "TENURE_URL": self.url, "TENURE_TOKEN": self.tokens[who]}

    def cli(self, *args: str, who: str = "admin", expect: int = 0) -> subprocess.CompletedProcess[str]:
        """``python -m tenure_cli ARGS`` as *who* (token in the environment); asserts its exit code."""
        done = subprocess.run(
            [sys.executable, "-m", "tenure_cli", *args],
            cwd=ROOT,
            env=self.env(who),
            capture_output=True,
            text=True,
            timeout=30,
        )
        return self._checked(done, expect)

    def run(self, *args: str, who: str = "admin", expect: int = 0) -> subprocess.CompletedProcess[str]:
        """``tenure ARGS --url … --token …`` in this process: the same code as :meth:`cli` without
        an interpreter start (a second or more each on a loaded machine), for the many variants."""
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = tenure_main([*args, "--url", self.url, "--token", self.tokens[who]])
            except SystemExit as exc:  # argparse's usage errors
                code = int(exc.code or 0)
        return self._checked(subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue()), expect)

    def _checked(self, done: subprocess.CompletedProcess[str], expect: int) -> subprocess.CompletedProcess[str]:
        assert done.returncode == expect, f"tenure {done.args} → {done.returncode}\n{done.stdout}\n{done.stderr}"
        for token in self.tokens.values():
            assert token not in done.stdout + done.stderr
        return done

    def cli_json(self, *args: str, who: str = "admin") -> list[dict[str, Any]]:
        return _lines(self.cli(*args, "--json", who=who))

    def run_json(self, *args: str, who: str = "admin") -> list[dict[str, Any]]:
        return _lines(self.run(*args, "--json", who=who))

    def release(self, label: str, step: int = 0) -> None:
        (self.flags / f"release-{label}-{step}").touch()


def _lines(done: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in done.stdout.splitlines()]


def _answers(url: str) -> bool:
    try:
        return httpx.get(url + "/api/health/live", timeout=1).is_success
    except httpx.HTTPError:
        return False


def _port() -> int:
    for _ in range(100):
        port = random.randint(20000, 29999)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port in 20000-29999")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    import accounts
    from jobs import schema
    from jobs.db import make_engine

    tmp = tmp_path_factory.mktemp("operator-cli")
    url = f"sqlite:///{tmp / 'tenure.db'}"
    schema.upgrade(url)
    engine = make_engine(url)
    tokens, passwords = {}, {}
    for name, role in (("admin", "admin"), ("ursula", "user"), ("bob", "user")):
        user, passwords[name] = accounts.create_user(engine, name, role=role)
        tokens[name] = accounts.create_token(engine, user.id, "cli")[1]
    engine.dispose()
    flags = tmp / "flags"
    flags.mkdir()
    port = _port()
    env = {
        **os.environ,
        "TENURE_DATABASE_URL": url,
        "TENURE_OUTPUT_ROOT": str(tmp / "outputs"),
        "TENURE_WEB_TASKS_APP": APP,
        "TENURE_SECRET_KEY": "cli-secret",
        "TENURE_WEB_LIVE_POLL_S": "0.1",
        "TENURE_WEB_LIVE_HEARTBEAT_S": "1",
        "PORT": str(port),
        "TENURE_WEB_WORKERS": "1",
        "TENURE_WEB_THREADS": "16",
        "CLI_FLAG_DIR": str(flags),
        # A job stuck past its timeout is failed a lease TTL later: 3 s instead of 30 (the stuck-thread test)
        "TENURE_JOB_LEASE_TTL_S": "3",
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    gunicorn = str(Path(sys.executable).with_name("gunicorn"))
    with processes(tmp) as procs:
        procs.start("web", [gunicorn, "-c", "gunicorn.conf.py", "webapp:create_app()"], env)
        procs.start(
            "worker",
            [sys.executable, "-m", "tenure_cli", "worker", APP, "--processes", "1", "--threads", "4"]
            + ["--worker-shutdown-timeout", "1000"],
            env,
        )
        base = f"http://127.0.0.1:{port}"
        dep = Deployment(base, tmp, flags, tokens, passwords, procs, httpx.Client(base_url=base, timeout=10))

        wait_for("gunicorn to answer", lambda: _answers(dep.url), 30, procs, poll_s=0.1)
        wait_for("the worker to register", lambda: dep.api("GET", "/api/v1/workers"), 30, procs, poll_s=0.1)
        yield dep
        dep.http.close()
        log = (tmp / "web.log").read_text()
        assert all(token not in log for token in tokens.values())


# Each subcommand runs once as a real subprocess (``deployment.cli``, token in the environment);
# the variants of the same code run in this process (``deployment.run``, token as a flag).


def test_usage_errors_exit_2(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    no_url = subprocess.run(
        [sys.executable, "-m", "tenure_cli", "jobs", "list"],
        cwd=ROOT,
        env={"PATH": os.environ["PATH"], "TENURE_TOKEN": deployment.tokens["admin"]},
        capture_output=True,
        text=True,
    )
    assert no_url.returncode == 2
    assert no_url.stderr == "tenure: TENURE_URL is not set (or pass --url), e.g. https://tenure.example.com\n"
    monkeypatch.delenv("TENURE_TOKEN", raising=False)
    assert tenure_main(["queues", "list", "--url", deployment.url]) == 2
    assert capsys.readouterr().err.startswith("tenure: TENURE_TOKEN is not set (or pass --token)")
    assert "invalid choice" in deployment.run("jobs", "frobnicate", expect=2).stderr
    assert "--id --all" in deployment.run("dead-letters", "purge", "cli", expect=2).stderr
    assert "not a whole number" in deployment.run("jobs", "list", "--limit", "0", expect=2).stderr
    assert "not a number of seconds" in deployment.run("workers", "list", "--timeout", "0", expect=2).stderr
    # The API's own validation (422) is a usage error too, with its reason on one line.
    bad = deployment.run("jobs", "list", "--status", "sleeping", expect=2)
    assert bad.stderr.startswith("tenure: The request did not validate. ") and bad.stderr.count("\n") == 1
    assert "status: 0: Must be one of: queued, running" in bad.stderr


def test_credentials_in_the_url_are_refused_without_echoing_them(capsys: pytest.CaptureFixture[str]) -> None:
    assert tenure_main(["jobs", "list", "--url", "http://admin:hunter2@127.0.0.1:1", "--token", "x"]) == 2
    err = capsys.readouterr().err
    assert err == "tenure: TENURE_URL must not contain credentials; put the token in TENURE_TOKEN.\n"


def test_jobs_list_show_and_events_as_tables_and_json(deployment: Deployment) -> None:
    ids = [deployment.submit("cli_echo", {"text": f"list-{i}"})["id"] for i in range(5)]
    for job_id in ids:
        deployment.wait_job(job_id, "succeeded")
    failed = deployment.submit("cli_fail", {"message": "needle in the error"})["id"]
    deployment.wait_job(failed, "failed")

    # Newest first, filtered, and followed over pages of 2 (3 requests) with --all.
    listed = deployment.cli_json("jobs", "list", "--kind", "cli_echo", "--all", "--page-size", "2", who="ursula")
    assert [j["id"] for j in listed] == ids[::-1]
    first = deployment.run("jobs", "list", "--kind", "cli_echo", "--limit", "2", "--page-size", "1", who="ursula")
    rows = first.stdout.splitlines()
    assert rows[0].split() == ["ID", "KIND", "STATUS", "QUEUE", "OWNER", "ATTEMPT", "PROGRESS", "CREATED", "SUMMARY"]
    assert [r.split()[0] for r in rows[1:]] == ids[:-3:-1]
    assert [r.split()[2] for r in rows[1:]] == ["succeeded", "succeeded"]
    cursor = first.stderr.split("--cursor ")[1].split()[0]
    rest = deployment.run_json("jobs", "list", "--kind", "cli_echo", "--cursor", cursor, "--limit", "3", who="ursula")
    assert [j["id"] for j in rest] == ids[-3::-1]
    by_search = deployment.run_json("jobs", "list", "--search", "needle", "--status", "failed", who="ursula")
    assert [j["id"] for j in by_search] == [failed]
    assert deployment.run_json("jobs", "list", "--queue", "cli_slow", "--status", "failed", who="ursula") == []
    newest = listed[0]["created_at"]
    assert [j["id"] for j in deployment.run_json("jobs", "list", "--created-after", newest, who="ursula")] == [
        failed,
        ids[-1],
    ]
    older = deployment.run_json("jobs", "list", "--kind", "cli_echo", "--created-before", newest, who="ursula")
    assert [j["id"] for j in older] == ids[-2::-1]
    # Admins see every owner's jobs and may filter by owner; a user may not (403: exit 1).
    owner = listed[0]["owner"]
    assert owner == "ursula"  # the user name, never the internal owner id
    assert {j["owner"] for j in deployment.run_json("jobs", "list", "--owner", owner, "--all")} == {owner}
    refused = deployment.run("jobs", "list", "--owner", owner, who="ursula", expect=1)
    assert refused.stderr == "tenure: Filtering by owner needs the jobs.read_all permission.\n"

    (shown,) = deployment.run_json("jobs", "show", failed, who="ursula")
    assert shown["status"] == "failed" and "needle in the error" in shown["error"]
    text = deployment.cli("jobs", "show", ids[0], who="ursula").stdout
    assert "\nstatus            succeeded\n" in text and '\nresult            {"echo": "list-0"}\n' in text

    events = deployment.cli_json("jobs", "events", ids[0], "--page-size", "1", who="ursula")
    assert [e["sequence"] for e in events] == list(range(1, len(events) + 1)) and len(events) >= 3
    assert events[-1]["type"] == "status" and events[-1]["data"]["status"] == "succeeded"
    assert deployment.run_json("jobs", "events", ids[0], "--after", "1", who="ursula") == events[1:]
    table = deployment.run("jobs", "events", ids[0], who="ursula").stdout.splitlines()
    assert table[0].split() == ["SEQ", "TIME", "TYPE", "DATA"] and len(table) == len(events) + 1


def test_cancel_queued_and_running_jobs_then_conflict(deployment: Deployment) -> None:
    waiting = deployment.submit("cli_echo", {"text": "later"}, delay_s=3600)["id"]
    (answer,) = deployment.cli_json("jobs", "cancel", waiting, who="ursula")
    assert answer["outcome"] == "cancelled" and answer["job"]["status"] == "cancelled"

    running = deployment.submit("cli_hold", {"label": "cancel-me"})["id"]
    deployment.wait_job(running, "running")
    said = deployment.run("jobs", "cancel", running, who="ursula").stdout
    assert said == f"cancel requested for {running}: it is running and stops at its next checkpoint\n"
    deployment.wait_job(running, "cancelled")

    # A finished job cannot be cancelled: the API's 409 and its message, exit 1 (from a real process).
    again = deployment.cli("jobs", "cancel", running, who="ursula", expect=1)
    assert again.stderr.startswith("tenure: ") and again.stderr.count("\n") == 1 and "finished" in again.stderr
    assert again.stdout == ""


def test_retry_a_failed_job_once(deployment: Deployment) -> None:
    failed = deployment.submit("cli_fail", {})["id"]
    deployment.wait_job(failed, "failed")
    (retry,) = deployment.cli_json("jobs", "retry", failed, who="ursula")
    assert retry["retry_of_job_id"] == failed and retry["id"] != failed
    said = deployment.run("jobs", "retry", failed, who="ursula").stdout  # retried before: that same retry
    assert said.startswith(f"retried {failed} as {retry['id']} ")
    deployment.wait_job(retry["id"], "failed")
    ok = deployment.submit("cli_echo", {"text": "fine"})["id"]
    deployment.wait_job(ok, "succeeded")
    refused = deployment.run("jobs", "retry", ok, who="ursula", expect=1)
    assert refused.stderr.startswith("tenure: ") and refused.stderr.count("\n") == 1


def test_a_retry_waits_for_a_thread_stuck_past_its_timeout(deployment: Deployment) -> None:
    fifo = deployment.flags / "stuck-c-code"  # cli_kinds.stuck_path
    os.mkfifo(fifo)
    job_id = deployment.submit("cli_stuck", {"label": "c-code"})["id"]
    try:
        # Given a job whose thread blocks in C code past its 1 s time limit, failed a lease TTL later
        job = wait_for(
            "the job to time out while its thread runs",
            lambda: (job := deployment.api("GET", f"/api/v1/jobs/{job_id}"))["still_exiting"] and job,
            30,
            deployment.procs,
            poll_s=0.1,
        )
        assert (job["status"], job["error"], job["can_retry"]) == ("failed", "Job timed out.", False)
        attempts = deployment.api("GET", f"/api/v1/jobs/{job_id}/attempts")["items"]
        assert [a["outcome"] for a in attempts] == ["timed out — still exiting"]
        # When it is retried over HTTP while the thread runs, then the answer is 409 with the reason
        refused = deployment.http.post(
            f"/api/v1/jobs/{job_id}/retry", headers={"Authorization": f"Bearer {deployment.tokens['ursula']}"}
        )
        assert refused.status_code == 409, refused.text
        assert "still exiting" in refused.json()["error"]["message"]
        # …from the CLI too (exit 1), and the job page says why it offers no retry
        assert "still exiting" in deployment.run("jobs", "retry", job_id, who="ursula", expect=1).stderr
        port = int(deployment.url.rsplit(":", 1)[1])
        page = Http(port, "ursula", deployment.passwords["ursula"]).page(f"/jobs/{job_id}")
        assert '<td data-label="Outcome" class="outcome">timed out — still exiting' in page
        assert 'id="still-exiting">Timed out — still exiting: its thread has not stopped yet' in page
        assert 'id="retry-btn"' not in page
        assert deployment.api("GET", f"/api/v1/jobs/{job_id}")["still_exiting"]  # the thread still runs
    finally:
        _release(fifo)

    # When the thread is released (a writer opens the FIFO) and returns
    wait_for(
        "the thread's exit",
        lambda: not deployment.api("GET", f"/api/v1/jobs/{job_id}")["still_exiting"],
        30,
        deployment.procs,
        poll_s=0.1,
    )
    # Then the attempt reads "timed out", nothing the thread returned was written, and a retry is made
    job = deployment.api("GET", f"/api/v1/jobs/{job_id}")
    assert (job["status"], job["result"], job["can_retry"]) == ("failed", None, True)
    attempts = deployment.api("GET", f"/api/v1/jobs/{job_id}/attempts")["items"]
    assert [a["outcome"] for a in attempts] == ["timed out"]
    made = deployment.http.post(
        f"/api/v1/jobs/{job_id}/retry", headers={"Authorization": f"Bearer {deployment.tokens['ursula']}"}
    )
    assert made.status_code == 201, made.text
    assert made.json()["retry_of_job_id"] == job_id
    assert deployment.wait_job(made.json()["id"], "succeeded")["result"] == {"label": "c-code"}


def _release(fifo: Path) -> None:
    """Let a thread blocked opening *fifo* go (a writer opens it), and remove it so a retry does not block."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:  # ENXIO: no reader waits (the job never got that far)
        pass
    fifo.unlink()


def test_delete_a_finished_job_and_search_with_qualifiers(deployment: Deployment) -> None:
    done = deployment.submit("cli_echo", {"text": "delete-me 2026"})["id"]
    deployment.wait_job(done, "succeeded")
    waiting = deployment.submit("cli_echo", {"text": "later"}, delay_s=3600)["id"]  # the feed's newest entry
    # the search box's grammar, the summary shown
    (found,) = deployment.run_json("jobs", "list", "--search", 'kind:cli_echo status:succeeded "delete-me 2026"',
                                   who="ursula")  # fmt: skip
    assert found["id"] == done and found["summary"] == "delete-me 2026"
    bad = deployment.run("jobs", "list", "--search", "colour:red", who="ursula", expect=2)  # a 400: bad input
    assert bad.stderr.startswith("tenure: Unknown qualifier colour:")
    # a queued job cannot go (409: exit 1 with the reason); another user's looks missing (exit 3)
    refused = deployment.run("jobs", "delete", waiting, who="ursula", expect=1)
    assert "only finished jobs can be deleted" in refused.stderr
    assert deployment.run("jobs", "delete", done, who="bob", expect=3).stderr == "tenure: Job not found.\n"
    assert deployment.run("jobs", "delete", done, who="ursula").stdout == f"deleted {done}\n"
    assert deployment.run("jobs", "show", done, who="ursula", expect=3).stderr == "tenure: Job not found.\n"
    deployment.run("jobs", "cancel", waiting, who="ursula")


def test_run_now_starts_a_delayed_job(deployment: Deployment) -> None:
    job_id = deployment.submit("cli_echo", {"text": "tomorrow"}, delay_s=86400)["id"]
    # run-now is an operator action: a user is refused with the API's reason.
    refused = deployment.run("jobs", "run-now", job_id, who="ursula", expect=1)
    assert refused.stderr == "tenure: This needs the queues.pause permission.\n"
    (job,) = deployment.cli_json("jobs", "run-now", job_id)
    assert job["id"] == job_id and job["status"] in ("queued", "running", "succeeded")
    deployment.wait_job(job_id, "succeeded", timeout_s=10)
    assert [e["type"] for e in deployment.run_json("jobs", "events", job_id)].count("run_now") == 1
    # It is no longer waiting: 409, exit 1.
    assert "not waiting" in deployment.run("jobs", "run-now", job_id, expect=1).stderr


def test_another_users_job_looks_exactly_like_a_missing_one(deployment: Deployment) -> None:
    bobs = deployment.submit("cli_fail", {}, who="bob")["id"]
    deployment.wait_job(bobs, "failed")
    missing = "0" * len(bobs)
    foreign = deployment.cli("jobs", "show", bobs, who="ursula", expect=3)
    assert foreign.stderr == "tenure: Job not found.\n" and foreign.stdout == ""
    for command in (["show"], ["events"], ["cancel"], ["retry"], ["events", "--follow"]):
        foreign = deployment.run("jobs", command[0], bobs, *command[1:], who="ursula", expect=3)
        absent = deployment.run("jobs", command[0], missing, *command[1:], who="ursula", expect=3)
        assert foreign.stderr == absent.stderr == "tenure: Job not found.\n" and foreign.stdout == absent.stdout == ""
    assert deployment.run("jobs", "run-now", missing, expect=3).stderr == "tenure: Job not found.\n"
    # An id is one path segment: it never reaches another route.
    deployment.run("jobs", "show", "../queues", expect=3)
    assert "No queue named" in deployment.run("queues", "pause", "no-such-queue", expect=3).stderr
    assert "No schedule named" in deployment.run("schedules", "run", "no-such-schedule", expect=3).stderr


def test_pause_and_resume_a_queue(deployment: Deployment) -> None:
    refused = deployment.run("queues", "pause", "cli_slow", who="ursula", expect=1)
    assert refused.stderr == "tenure: This needs the queues.pause permission.\n"
    assert deployment.cli("queues", "pause", "cli_slow").stdout == "queue cli_slow paused\n"
    try:
        held = deployment.submit("cli_echo", {"text": "held"})["id"]
        # A job on another queue, submitted later, runs and ends: the worker is claiming, not the paused queue.
        deployment.wait_job(deployment.submit("cli_fail", {})["id"], "failed")
        assert deployment.api("GET", f"/api/v1/jobs/{held}")["status"] == "queued"
        queues = {q["queue"]: q for q in deployment.cli_json("queues", "list")}
        assert queues["cli_slow"]["paused"] is True and queues["cli_slow"]["ready"] >= 1
        table = deployment.run("queues", "list").stdout.splitlines()
        assert table[0].split() == ["QUEUE", "READY", "DELAYED", "RUNNING", "DEAD", "LAG", "PAUSED"]
        assert any(r.split()[0] == "cli_slow" and r.split()[-1] == "yes" for r in table[1:])
    finally:
        (resumed,) = deployment.cli_json("queues", "resume", "cli_slow")
    assert resumed == {"queue": "cli_slow", "paused": False}
    deployment.wait_job(held, "succeeded")


def test_dead_letters_list_replay_and_purge(deployment: Deployment) -> None:
    import dramatiq

    from broker import SQLiteBroker

    flags = [deployment.flags / "dead-a", deployment.flags / "dead-b"]
    producer = SQLiteBroker(f"sqlite:///{deployment.tmp / 'tenure.db'}", middleware=[])
    producer.declare_queue("cli")
    for flag in flags:
        message = dramatiq.Message(queue_name="cli", actor_name="cli_flaky", args=(str(flag),), kwargs={}, options={})
        producer.enqueue(message)
    producer.close()
    dead = wait_for(
        "two dead letters",
        lambda: len(found := deployment.run_json("dead-letters", "list", "--queue", "cli")) == 2 and found,
        15,
        deployment.procs,
        poll_s=0.1,
    )
    assert {d["actor"] for d in dead} == {"cli_flaky"} and all(d["reason"] for d in dead)
    assert deployment.cli_json("dead-letters", "list", "--queue", "cli", "--all", "--page-size", "1") == dead
    assert deployment.run_json("dead-letters", "list", "--queue", "cli", "--after-id", str(dead[0]["id"])) == dead[1:]
    table = deployment.run("dead-letters", "list", "--limit", "1").stdout.splitlines()
    assert table[0].split()[:3] == ["ID", "QUEUE", "ACTOR"] and len(table) == 2
    refused = deployment.run("dead-letters", "purge", "cli", "--all", who="ursula", expect=1)
    assert refused.stderr == "tenure: This needs the dead_letters.manage permission.\n"
    assert "No queue named" in deployment.run("dead-letters", "replay", "nope", "--all", expect=3).stderr
    assert "No queue named" in deployment.run("dead-letters", "purge", "nope", "--all", expect=3).stderr

    flags[0].write_text("now it works")
    said = deployment.cli("dead-letters", "replay", "cli", "--id", str(dead[0]["id"])).stdout
    assert said == "replayed 1 dead letter(s) of queue cli\n"
    wait_for("the replayed message to run", flags[0].with_suffix(".done").exists, 15, deployment.procs)
    assert deployment.run_json("dead-letters", "purge", "cli", "--id", str(dead[0]["id"])) == [{"purged": 0}]
    (purged,) = deployment.cli_json("dead-letters", "purge", "cli", "--all")
    assert purged == {"purged": 1}
    assert deployment.run_json("dead-letters", "list", "--queue", "cli") == []
    assert not flags[1].with_suffix(".done").exists()


def test_schedules_list_run_pause_resume(deployment: Deployment) -> None:
    (nightly,) = [s for s in deployment.cli_json("schedules", "list") if s["name"] == "cli_nightly"]
    assert "0 3 * * *" in nightly["cron"] and nightly["paused"] is False and nightly["next_fire_at"]
    assert "cli_nightly" in deployment.run("schedules", "list").stdout
    deployment.run("schedules", "run", "cli_nightly", who="ursula", expect=1)
    (fire,) = deployment.cli_json("schedules", "run", "cli_nightly")
    assert fire["schedule"] == "cli_nightly" and fire["job_id"]
    assert deployment.wait_job(fire["job_id"], "succeeded")["result"] == {"echo": "nightly"}
    assert deployment.cli("schedules", "pause", "cli_nightly").stdout == "schedule cli_nightly paused\n"
    try:
        (paused,) = [s for s in deployment.run_json("schedules", "list") if s["name"] == "cli_nightly"]
        assert paused["paused"] is True
    finally:
        (resumed,) = deployment.cli_json("schedules", "resume", "cli_nightly")
    assert resumed == {"name": "cli_nightly", "paused": False}


def test_workers_list(deployment: Deployment) -> None:
    workers = deployment.cli_json("workers", "list")
    assert workers and all(w["host"] == socket.gethostname() for w in workers)
    assert any("cli" in w["queues"] and "cli_slow" in w["queues"] for w in workers)
    table = deployment.run("workers", "list").stdout.splitlines()
    assert table[0].split()[:3] == ["HOST", "PID", "QUEUES"] and len(table) == len(workers) + 1
    refused = deployment.run("workers", "list", who="ursula", expect=1)
    assert refused.stderr == "tenure: This needs the metrics.read permission.\n"


class _Follower:
    """``tenure jobs events ID --follow --json`` as ursula, its stdout read line by line by a thread."""

    def __init__(self, deployment: Deployment, job_id: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tenure_cli", "jobs", "events", job_id, "--follow", "--json"],
            cwd=ROOT,
            env=deployment.env("ursula"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put("")  # end of output

    def read_until(self, predicate: Any, timeout_s: float = 15) -> list[dict[str, Any]]:
        """The JSON lines printed until one satisfies *predicate*."""
        seen: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                raw = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no such line within {timeout_s}s: {seen}") from None
            assert raw, f"the follower ended ({self.proc.wait()}) before such a line: {seen} {self.stderr()}"
            seen.append(json.loads(raw))
            if predicate(seen[-1]):
                return seen

    def rest(self) -> str:
        """Whatever it printed after the lines read so far, once it has ended."""
        chunks = []
        while (raw := self.lines.get(timeout=10)) != "":
            chunks.append(raw)
        return "".join(chunks)

    def stderr(self) -> str:
        assert self.proc.stderr is not None
        return self.proc.stderr.read() if self.proc.poll() is not None else ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def test_follow_streams_live_events_until_the_job_finishes(deployment: Deployment) -> None:
    job_id = deployment.submit("cli_hold", {"label": "follow-me", "steps": 2})["id"]
    deployment.wait_job(job_id, "running")
    follower = _Follower(deployment, job_id)
    try:
        before = follower.read_until(lambda e: e["type"] == "holding")
        # Released only now: everything after this comes over the live feed.
        deployment.release("follow-me", 0)
        progress = follower.read_until(lambda e: e["type"] == "progress")
        assert progress[-1] == {
            "sequence": None,
            "type": "progress",
            "data": {"progress": 0.5, "message": "follow-me: step 1 of 2"},
            "created_at": None,
        }
        deployment.release("follow-me", 1)
        after = follower.read_until(lambda e: e["type"] == "status" and e["data"]["status"] == "succeeded")
        assert follower.proc.wait(10) == 0
        assert follower.rest() == "" and follower.stderr() == ""
    finally:
        follower.kill()
    events = [e for e in before + progress + after if e["sequence"] is not None]
    assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))  # each once, in order
    assert "released" in [e["type"] for e in after]
    assert events == deployment.run_json("jobs", "events", job_id)
    # A finished job: its events, then exit 0 at once.
    table = deployment.run("jobs", "events", job_id, "--follow", who="ursula").stdout.splitlines()
    assert table[0].split() == ["SEQ", "TIME", "TYPE", "DATA"] and len(table) == len(events) + 1


def test_follow_stops_on_ctrl_c_with_130(deployment: Deployment) -> None:
    job_id = deployment.submit("cli_hold", {"label": "interrupt-me"})["id"]
    deployment.wait_job(job_id, "running")
    follower = _Follower(deployment, job_id)
    try:
        follower.read_until(lambda e: e["type"] == "holding")
        follower.proc.send_signal(signal.SIGINT)
        assert follower.proc.wait(10) == 130
        assert follower.stderr() == ""
    finally:
        follower.kill()
        deployment.release("interrupt-me")
    deployment.wait_job(job_id, "succeeded")


def test_follow_exits_1_when_the_web_process_goes_away(deployment: Deployment) -> None:
    job_id = deployment.submit("cli_hold", {"label": "outlive"})["id"]
    deployment.wait_job(job_id, "running")
    follower = _Follower(deployment, job_id)
    master = deployment.procs.started[0]
    try:
        follower.read_until(lambda e: e["type"] == "holding")
        (web_worker,) = Path(f"/proc/{master.pid}/task/{master.pid}/children").read_text().split()
        os.kill(int(web_worker), signal.SIGKILL)  # gunicorn's master starts another one
        assert follower.proc.wait(10) == 1
        assert follower.stderr().startswith("tenure: The live feed ended: ")
    finally:
        follower.kill()
        deployment.release("outlive")
    wait_for("a new web worker", lambda: _answers(deployment.url), 30, deployment.procs, poll_s=0.1)
    deployment.wait_job(job_id, "succeeded")


def test_a_follow_beyond_the_users_live_connections_is_refused_with_exit_1(deployment: Deployment) -> None:
    from websockets.sync.client import connect

    # bob's slots are taken by WebSocket feeds: those hold a slot while open (an SSE feed releases
    # its slot when the view returns, so SSE feeds cannot be used to fill them).
    url = deployment.url.replace("http://", "ws://") + "/api/v1/live"
    with contextlib.ExitStack() as feeds:
        for _ in range(4):  # LIVE_MAX_PER_IDENTITY
            ws = feeds.enter_context(
                connect(url, additional_headers={"Authorization": f"Bearer {deployment.tokens['bob']}"})
            )
            ws.send(json.dumps({"cursor": None}))  # the first message says where to start: from now
            assert json.loads(ws.recv(timeout=10))["type"] == "hello"
        # Refused before the job is read: the API's 429, not the 404 this id would get.
        refused = deployment.run("jobs", "events", "0" * 32, "--follow", who="bob", expect=1)
    assert refused.stderr == "tenure: Too many live connections.\n"


def test_a_wrong_token_is_refused_with_exit_1(capsys: pytest.CaptureFixture[str], deployment: Deployment) -> None:
    assert tenure_main(["workers", "list", "--url", deployment.url, "--token", "tnr_not-a-token"]) == 1
    assert capsys.readouterr().err == "tenure: Invalid credentials.\n"
