"""A recording pipeline's plan is accepted at submit (the API schema cannot express its rules) and an
impossible one fails the import step before any work, with the reason."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tasks.pipeline import PLAN_KEY, PipelineError, check_plan
from tests.integration.jobs.support import JobEnv, job_env

GOOD = {"channels": [], "start_s": None, "end_s": None, "highlight_s": 20.0, "danmaku": True, "width": 64, "height": 36}


@pytest.fixture()
def env(tmp_path: Path) -> Iterator[JobEnv]:
    with job_env("sqlite", tmp_path) as e:
        e.declare("first_step", lambda ctx: None)
        yield e


def _ctx_with(env: JobEnv, plan: dict[str, Any]) -> Any:
    job = env.submit("first_step", config={PLAN_KEY: plan})
    ctx = env.claim(job.id)
    assert ctx is not None
    return ctx


def test_a_renderable_plan_passes(env: JobEnv) -> None:
    check_plan(_ctx_with(env, GOOD))
    check_plan(_ctx_with(env, {**GOOD, "start_s": 0.0, "end_s": 5.0}))


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"start_s": 3.0}, "both start_s and end_s"),
        ({"start_s": 5.0, "end_s": 2.0}, "0 <= start_s < end_s"),
        ({"start_s": -1.0, "end_s": 2.0}, "0 <= start_s < end_s"),
        ({"width": 0}, "must be positive"),
        ({"highlight_s": -5.7e16}, "must be positive"),
    ],
)
def test_an_impossible_plan_is_refused_with_its_reason(env: JobEnv, change: dict[str, Any], reason: str) -> None:
    with pytest.raises(PipelineError, match=reason):
        check_plan(_ctx_with(env, {**GOOD, **change}))


def test_outside_a_pipeline_nothing_is_checked(env: JobEnv) -> None:
    job = env.submit("first_step")
    ctx = env.claim(job.id)
    assert ctx is not None
    check_plan(ctx)
