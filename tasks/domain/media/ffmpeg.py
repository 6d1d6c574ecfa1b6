"""Run the ffmpeg CLI: find the binary, parse ``-progress pipe:1``, cancel by killing its process group.

ffmpeg runs in its own session (``start_new_session=True``), so cancellation, a timeout or any
exception in the caller kills the whole process group with SIGKILL and reaps it: no ffmpeg process
outlives :func:`run_ffmpeg`. If the worker process itself is SIGKILLed, a parent-death signal
(``setpriv --pdeathsig``) ends ffmpeg too instead of leaving it encoding as an orphan. Progress
blocks are parsed on a reader thread and handed to the caller's ``progress`` callback on the
caller's own thread (callbacks may touch a DB session).
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ..control import Cancelled, DomainError, Progress, ShouldStop, clamp_fraction, never_stop, no_progress

#: How often the caller's ``should_stop`` is polled while ffmpeg runs.
DEFAULT_POLL_INTERVAL_S = 0.1
#: How many trailing bytes of ffmpeg's stderr an error message keeps.
STDERR_TAIL_BYTES = 2_000


class FfmpegError(DomainError):
    """ffmpeg exited with an error."""


class FfmpegNotFound(DomainError):
    """No ffmpeg binary: install Debian's ffmpeg or the imageio-ffmpeg wheel."""


@dataclass(frozen=True)
class FfmpegRun:
    """What a finished ffmpeg run reported."""

    returncode: int
    elapsed_s: float
    progress_blocks: int
    pid: int


def ffmpeg_exe(explicit: str | os.PathLike[str] | None = None) -> str:
    """Resolve the ffmpeg binary.

    Parameters
    ----------
    explicit:
        A path from the settings; wins when given.

    Returns
    -------
    str
        ``explicit``, else Debian's ``ffmpeg`` on PATH, else imageio-ffmpeg's bundled static binary.

    Raises
    ------
    FfmpegNotFound
        When none of them exists.
    """
    if explicit:
        return os.fspath(explicit)
    found = shutil.which("ffmpeg")
    if found:
        return found
    try:
        import imageio_ffmpeg
    except ImportError as exc:  # pragma: no cover - imageio-ffmpeg is a declared dependency
        raise FfmpegNotFound(FfmpegNotFound.__doc__) from exc
    return imageio_ffmpeg.get_ffmpeg_exe()


def _death_signal_prefix() -> list[str]:
    """``setpriv --pdeathsig KILL --`` where available (util-linux, Linux), else nothing.

    ffmpeg runs in its own session so it can be killed as a group, which also means nothing kills
    it when the worker itself is SIGKILLed: it would keep encoding, orphaned, into a scratch
    directory nobody publishes. A parent-death signal ends it with its worker. ``setpriv`` sets it
    and then execs ffmpeg (same pid); unlike ``preexec_fn`` this is safe in a threaded worker.
    """
    setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    return [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []


def parse_progress_time_s(block: dict[str, str]) -> float | None:
    """The output position of one ``-progress`` block in seconds, or None when ffmpeg has none yet.

    ``out_time_us`` is preferred; ``out_time_ms`` is *also* microseconds (an ffmpeg quirk), and
    ffmpeg 9 sometimes reports ``N/A`` mid-run, which means "no update".
    """
    for key in ("out_time_us", "out_time_ms"):
        value = block.get(key)
        if value and value != "N/A":
            try:
                return max(0.0, int(value) / 1e6)
            except ValueError:
                continue
    return None


def _read_progress(stream: IO[str], blocks: queue.Queue[dict[str, str] | None]) -> None:
    block: dict[str, str] = {}
    for line in stream:
        key, sep, value = line.strip().partition("=")
        if not sep:
            continue
        block[key] = value
        if key == "progress":
            blocks.put(block)
            block = {}
    blocks.put(None)


def kill_process_group(proc: subprocess.Popen) -> None:
    """SIGKILL ffmpeg's whole process group and reap it (partial output is discarded anyway)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.wait(timeout=10)


def run_ffmpeg(
    args: Sequence[str],
    *,
    duration_s: float | None,
    cwd: Path | None = None,
    progress: Progress = no_progress,
    should_stop: ShouldStop = never_stop,
    timeout_s: float | None = None,
    ffmpeg: str | None = None,
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
    on_start: Callable[[int], None] | None = None,
) -> FfmpegRun:
    """Run ffmpeg with live progress and cancellation.

    Parameters
    ----------
    args:
        ffmpeg arguments after the binary (inputs, filters, outputs). ``-progress pipe:1 -nostats``
        and ``-loglevel error`` are added here.
    duration_s:
        Expected output duration, to turn ``out_time`` into a fraction; None reports no fractions.
    cwd:
        Working directory; lets filtergraphs use fixed relative file names (no escaping).
    progress, should_stop:
        The caller's callbacks; ``should_stop`` is polled every ``poll_interval_s``.
    timeout_s:
        Kill ffmpeg and fail after this many seconds.
    ffmpeg:
        Binary to use (see :func:`ffmpeg_exe`).
    on_start:
        Optional ``on_start(pid)`` hook, called once ffmpeg is running (tests watch the pid).

    Returns
    -------
    FfmpegRun

    Raises
    ------
    Cancelled
        ``should_stop()`` became true; the process group was killed and reaped.
    FfmpegError
        Non-zero exit or timeout; the message carries the tail of ffmpeg's stderr.
    """
    cmd = [
        *_death_signal_prefix(),
        ffmpeg_exe(ffmpeg),
        "-hide_banner",
        "-nostdin",
        "-y",
        "-loglevel",
        "error",
        "-nostats",
    ]
    cmd += ["-progress", "pipe:1", *args]
    started = time.monotonic()
    stderr_file = _TailFile()
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=stderr_file.fileno(),
        text=True,
        bufsize=1,
        start_new_session=True,  # its own process group: cancellation kills ffmpeg and any child
    )
    blocks: queue.Queue[dict[str, str] | None] = queue.Queue()
    reader = threading.Thread(target=_read_progress, args=(proc.stdout, blocks), daemon=True)
    reader.start()
    count = 0
    try:
        if on_start is not None:
            on_start(proc.pid)
        while True:
            if should_stop():
                kill_process_group(proc)
                raise Cancelled("ffmpeg cancelled")
            if timeout_s is not None and time.monotonic() - started > timeout_s:
                kill_process_group(proc)
                raise FfmpegError(f"ffmpeg timed out after {timeout_s:.0f} s")
            try:
                block = blocks.get(timeout=poll_interval_s)
            except queue.Empty:
                continue
            if block is None:  # stdout closed: ffmpeg is exiting
                break
            count += 1
            position = parse_progress_time_s(block)
            if duration_s and position is not None:
                done = block.get("progress") == "end"
                fraction = 1.0 if done else clamp_fraction(position / duration_s)
                progress(fraction, f"encoded {min(position, duration_s):.1f}/{duration_s:.1f} s")
        returncode = proc.wait()
    except BaseException:
        kill_process_group(proc)
        raise
    finally:
        reader.join(timeout=5)
        if proc.stdout is not None:
            proc.stdout.close()
        tail = stderr_file.tail_and_close()
    if returncode != 0:
        raise FfmpegError(f"ffmpeg exited with {returncode}: {tail or 'no error output'}")
    return FfmpegRun(returncode, time.monotonic() - started, count, proc.pid)


class _TailFile:
    """An anonymous temp file for ffmpeg's stderr (a pipe could fill up and block ffmpeg)."""

    def __init__(self) -> None:
        import tempfile

        self._file = tempfile.TemporaryFile()

    def fileno(self) -> int:
        return self._file.fileno()

    def tail_and_close(self) -> str:
        try:
            size = self._file.seek(0, os.SEEK_END)
            self._file.seek(max(0, size - STDERR_TAIL_BYTES))
            return self._file.read().decode("utf-8", "replace").strip()
        finally:
            self._file.close()
