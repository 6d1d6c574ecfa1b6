"""Dramatiq's own test modules, run against SQLiteBroker and PostgresBroker.

The pinned Dramatiq sdist is fetched at test time (``pip download --no-deps --no-binary :all:``),
its generic test modules are extracted into a temporary package next to our ``conftest.py`` (whose
``stub_broker`` fixture returns the broker under test) and run in a child pytest. No upstream code is
committed here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

DRAMATIQ_VERSION = "2.2.1"
REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / "var" / "cache"
HERE = Path(__file__).resolve().parent

MODULES = [
    "test_actors",
    "test_broker",
    "test_callbacks",
    "test_composition",
    "test_encoders",
    "test_generic_actors",
    "test_messages",
    "test_results",
    "test_stub_broker",
    "test_worker",
]

#: Tests that poke StubBroker internals (its in-memory ``Queue`` objects), with the reason.
DESELECTED = {
    "test_actors.py::test_actors_can_be_sent_messages": "reads StubBroker.queues['default'].get()",
    "test_actors.py::test_worker_handles_non_numeric_eta_and_logs_warning": "puts raw bytes on StubBroker.queues[...]",
    "test_actors.py::test_worker_handles_none_eta": "puts raw bytes on StubBroker.queues[...]",
    "test_stub_broker.py::test_stub_broker_can_be_flushed": "asserts StubBroker Queue.qsize()/unfinished_tasks",
    "test_stub_broker.py::test_stub_broker_respects_prefetch": "asserts StubBroker.queues[...].qsize()",
}

#: Upstream tests that hold a wall-clock bound with no wait to absorb a slow moment, with the reason. A failure
#: of these (and only these) is run again (up to :data:`AGAIN` times), in a fresh process, and reported.
TIMING_BOUND = {
    # The bound rides on Dramatiq's own jittered result polling: StubBackend's blocking ``get_result`` looks after
    # 100–200 ms, then after another 200–400 ms, so a first look that comes a few ms before the 100 ms tasks finish
    # ends past the 0.5 s bound. It failed 3 times in ~8 ``make test`` runs on this VM (0.54–0.56 s) and never in
    # 30 isolated or 4 whole-suite runs by hand (0.16–0.18 s).
    "test_composition.py::test_groups_execute_inner_groups[stub]": "0.5 s bound on jittered result polling",
    # Sends five messages 1 ms apart and at once expects all five in the worker's queue: the last message must be
    # claimed and handed over within about 1 ms of its send. On this VM that hand-off takes 0.3 ms at the median and
    # over 1 ms for about 1 message in 100 (scheduling); it failed once in CI. On the PostgreSQL broker the claim is a
    # round trip: run alone, it failed 1 run in 15 (6 in 15 before an enqueue woke this process's consumer itself).
    "test_worker.py::test_workers_process_messages_in_order": "1 ms between the last send and the check",
    # Resumes a paused one-thread worker right after sending 20 messages and expects the 10 high-priority ones
    # first: the consumer must have prefetched all 20 by then, with no wait for it. With both brokers' suites
    # running at once, the SQLite run failed it in 2 of 5 runs (the last messages arrived after the resume).
    "test_actors.py::test_actors_can_prioritize_work": "no wait between the last send and the resume",
}


def fetch_sdist() -> Path:
    CACHE.mkdir(parents=True, exist_ok=True)
    sdist = CACHE / f"dramatiq-{DRAMATIQ_VERSION}.tar.gz"
    if not sdist.exists():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"dramatiq=={DRAMATIQ_VERSION}",
                "-d",
                str(CACHE),
            ],
            check=True,
        )
    return sdist


def extract_tests(sdist: Path, dest: Path) -> Path:
    pkg = dest / "dramatiq_upstream_tests"
    pkg.mkdir(parents=True)
    prefix = f"dramatiq-{DRAMATIQ_VERSION}/tests/"
    with tarfile.open(sdist) as tar:
        for name in MODULES:
            member = tar.getmember(f"{prefix}{name}.py")
            data = tar.extractfile(member)
            assert data is not None
            (pkg / f"{name}.py").write_bytes(data.read())
    (pkg / "__init__.py").write_text("")
    shutil.copy(HERE / "upstream_conftest.py", pkg / "conftest.py")
    shutil.copy(HERE / "upstream_common.py", pkg / "common.py")
    (dest / "pytest.ini").write_text("[pytest]\ntimeout = 60\n")
    return pkg


@pytest.mark.slow
@pytest.mark.services
@pytest.mark.exclusive  # upstream's tests assert wall-clock bounds (e.g. six 100 ms tasks within 0.5 s)
@pytest.mark.timeout(900)
def test_dramatiq_upstream_suite_passes_on_tenures_brokers(tmp_path: Path) -> None:
    """The suite once per broker, both at once: upstream's tests mostly wait (the SQLite child alone, in four
    processes: 24 s of wall clock for 16 s of CPU), so the two children share the machine without crowding."""
    runs = {}
    for broker in ("sqlite", "postgres"):
        root = tmp_path / broker
        root.mkdir()
        pkg = extract_tests(fetch_sdist(), root)
        # Relative node ids: the child runs in its root with that root as rootdir.
        options = [
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:schemathesis",
            "-p",
            "no:anyio",
            "--rootdir",
            str(root),
            "-c",
            str(root / "pytest.ini"),
            "-rf",
        ]
        for test_id in DESELECTED:
            options += ["--deselect", f"{pkg.name}/{test_id}"]
        env = {**os.environ, "PYTHONPATH": str(REPO), "TENURE_CONFORMANCE_BROKER": broker}
        runs[broker] = (pkg, options, env, _start(pkg, [*options, "-n", "4"], env))
    outcomes = {broker: _outcome(broker, *run) for broker, run in runs.items()}
    # A timing-bound failure runs again once both suites are done, alone and in one process: the first try
    # shared the machine with eight others.
    failures = {broker: _again(broker, *runs[broker][:3], outcome) for broker, outcome in outcomes.items()}
    assert not any(failures.values()), failures


def _start(pkg: Path, options: list[str], env: dict[str, str], tests: list[str] | None = None) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "pytest", *(tests or [str(pkg)]), *options]
    return subprocess.Popen(args, cwd=pkg.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _outcome(
    broker: str, pkg: Path, options: list[str], env: dict[str, str], proc: subprocess.Popen[str]
) -> str | set[str]:
    """What failed in *broker*'s child run: "" when it passed in full, the failed tests when every one of them is
    timing-bound, otherwise the failure."""
    stdout, stderr = proc.communicate(timeout=880)
    summary = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    print(f"--- {broker} ---\n{stdout[-20000:]}")
    passed = int(m.group(1)) if (m := re.search(r"(\d+) passed", summary)) else 0
    failed = set(re.findall(rf"^FAILED {re.escape(pkg.name)}/(\S+)", stdout, re.MULTILINE))
    if proc.returncode != 0 and not (failed and failed <= TIMING_BOUND.keys()):
        return f"upstream suite failed: {summary}\n{stdout[-20000:]}\n{stderr[-5000:]}"
    # 106 generic tests minus the 5 deselected, plus 26 more from running the result/rate-limiter
    # backend parametrizations on both Tenure's SQLite backends and Dramatiq's stub ones.
    if passed + len(failed) != 127 or "skipped" in summary:
        return f"expected 127 passed and none skipped: {summary}"
    return failed


#: Runs of a timing-bound failure after the first, each alone in a fresh process.
AGAIN = 2


def _again(broker: str, pkg: Path, options: list[str], env: dict[str, str], outcome: str | set[str]) -> str:
    """*outcome* of *broker*'s run, its timing-bound failures run up to :data:`AGAIN` more times ("" when a run
    passes)."""
    if isinstance(outcome, str):
        return outcome
    if not outcome:
        return ""
    outputs = []
    for _ in range(AGAIN):
        again = _start(pkg, options, env, [f"{pkg.name}/{test_id}" for test_id in sorted(outcome)])
        again_out, _ = again.communicate(timeout=300)
        print(f"timing-bound upstream test(s) failed on {broker}, run again: {sorted(outcome)}\n{again_out[-5000:]}")
        if again.returncode == 0:
            return ""
        outputs.append(again_out[-5000:])
    return f"failed {1 + AGAIN} times: {sorted(outcome)}\n" + "\n".join(outputs)
