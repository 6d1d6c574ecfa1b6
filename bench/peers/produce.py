"""The producer of :mod:`bench.jobs_peers`, run as ``<system's python> -m bench.peers.produce APP …``.

It runs in each system's own interpreter (Oban's is Python 3.12 in its own virtualenv), so it imports the
standard library and the system's app module (``bench.peers.apps.<APP>``) only. The app module offers either
``open_producer()`` → an object with ``submit(stamp) -> id | None`` and ``close()``, or ``open_async_producer()``
(awaitable) → one with ``async submit(stamp)`` and ``async close()``: each library's own enqueue call, one job per
call, as an application submits them.

Modes (one JSON line on stdout):

* ``submit --n N``: N jobs as fast as one caller can, the first one untimed (connections, caches);
  ``{"per_s": (N - 1) / seconds}``.
* ``steady --rate R --seconds S``: ``R × S`` jobs at a steady rate, each stamped with ``time.time()`` taken just
  before its submit call (the job records ``start - stamp``); ``{"sent": …, "rate": achieved}``.

``--ids FILE`` writes the id each submit returned, one a line (for stores checked job by job: Celery's results).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any


def _submit_times(submit: Callable[[float], Any], n: int, ids: list[str]) -> float:
    ids.append(submit(0.0))
    t0 = time.perf_counter()
    for _ in range(n - 1):
        ids.append(submit(0.0))
    return (n - 1) / (time.perf_counter() - t0)


def _steady(submit: Callable[[float], Any], rate: float, seconds: float, ids: list[str]) -> float:
    count = int(rate * seconds)
    start = time.perf_counter()
    for i in range(count):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        ids.append(submit(time.time()))
    return count / (time.perf_counter() - start)


async def _submit_times_async(submit: Callable[[float], Awaitable[Any]], n: int, ids: list[str]) -> float:
    ids.append(await submit(0.0))
    t0 = time.perf_counter()
    for _ in range(n - 1):
        ids.append(await submit(0.0))
    return (n - 1) / (time.perf_counter() - t0)


async def _steady_async(
    submit: Callable[[float], Awaitable[Any]], rate: float, seconds: float, ids: list[str]
) -> float:
    count = int(rate * seconds)
    start = time.perf_counter()
    for i in range(count):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        ids.append(await submit(time.time()))
    return count / (time.perf_counter() - start)


def run(app: Any, args: argparse.Namespace, ids: list[str]) -> dict[str, float]:
    if hasattr(app, "open_producer"):
        producer = app.open_producer()
        try:
            if args.mode == "submit":
                return {"per_s": _submit_times(producer.submit, args.n, ids)}
            rate = _steady(producer.submit, args.rate, args.seconds, ids)
            return {"sent": int(args.rate * args.seconds), "rate": rate}
        finally:
            producer.close()

    async def main() -> dict[str, float]:
        producer = await app.open_async_producer()
        try:
            if args.mode == "submit":
                return {"per_s": await _submit_times_async(producer.submit, args.n, ids)}
            rate = await _steady_async(producer.submit, args.rate, args.seconds, ids)
            return {"sent": int(args.rate * args.seconds), "rate": rate}
        finally:
            await producer.close()

    return asyncio.run(main())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.peers.produce", description=__doc__.split("\n")[0])
    p.add_argument("app", help="module name under bench.peers.apps")
    p.add_argument("mode", choices=("submit", "steady"))
    p.add_argument("--n", type=int, default=1)
    p.add_argument("--rate", type=float, default=100.0)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--ids", type=Path, default=None)
    args = p.parse_args(argv)
    app = importlib.import_module(f"bench.peers.apps.{args.app}")
    ids: list[str] = []
    result = run(app, args, ids)
    if args.ids is not None:
        args.ids.write_text("".join(f"{i}\n" for i in ids if i is not None))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
