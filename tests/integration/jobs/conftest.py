from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .support import JobEnv, job_env

BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres+redis", marks=pytest.mark.services),
]


@pytest.fixture(params=BACKENDS)
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[JobEnv]:
    """Parametrized over SQLite (one file) and PostgreSQL + Redis (outbox)."""
    with job_env(request.param, tmp_path) as e:
        yield e


@pytest.fixture()
def sqlite_env(tmp_path: Path) -> Iterator[JobEnv]:
    with job_env("sqlite", tmp_path) as e:
        yield e


@pytest.fixture()
def postgres_env(tmp_path: Path) -> Iterator[JobEnv]:
    """PostgreSQL + Redis alone: for races SQLite's single writer cannot have."""
    with job_env("postgres", tmp_path) as e:
        yield e
