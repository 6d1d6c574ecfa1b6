"""Cleaning what a killed attempt left in the output root (a step of the 30-second resync).

A render writes into a scratch directory ``<root>/<job>/.<attempt>-<name>.partial-<hex>`` and only
publishes complete files. A worker killed mid-render (SIGKILL, OOM) cannot remove it; the job's
next attempt writes to new names and never references it. This removes such a scratch directory
once its attempt can no longer be running: the job is finished, gone, or on a later attempt.
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

from sqlalchemy import Engine

from jobs import JobNotFound, JobStatus, get_job

logger = logging.getLogger(__name__)

_PARTIAL = re.compile(r"^\.(?P<attempt>\d+)-.+\.partial-[0-9a-f]+$")


def clean_partial_outputs(engine: Engine, output_root: Path) -> int:
    """Remove the scratch directories of attempts that are over.

    Parameters:
      engine: The job database.
      output_root: The root of per-attempt outputs (``<root>/<job id>/…``).

    Returns:
      How many scratch directories were removed.
    """
    if not output_root.is_dir():
        return 0
    removed = 0
    for partial in output_root.glob("*/.*.partial-*"):
        match = _PARTIAL.match(partial.name)
        if match is None or not partial.is_dir():
            continue
        attempt = int(match["attempt"])
        try:
            job = get_job(engine, partial.parent.name, owner_id="", is_admin=True)
            running_it = job.status == JobStatus.RUNNING and job.attempt == attempt
        except JobNotFound:
            running_it = False
        if running_it:
            continue
        shutil.rmtree(partial, ignore_errors=True)
        if not partial.exists():
            removed += 1
            logger.info("Removed %s: the attempt that wrote it is over.", partial)
    return removed
