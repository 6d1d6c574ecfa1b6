"""The operator commands: ``tenure jobs|queues|dead-letters|schedules|workers …`` over the HTTP API.

Each command is one or a few API requests (:mod:`tenure_cli.remote`), so it is allowed exactly
what the token's user is allowed in the web app: a user sees and acts on their own jobs, an admin
on every job and on queues, dead letters, schedules and workers. Results print as a table, or as
JSON Lines with ``--json`` (:mod:`tenure_cli.output`). Exit codes: 0 ok, 1 refused or failed,
2 usage, 3 not found (:mod:`tenure_cli.remote`); 130 when ``jobs events --follow`` is interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any

from .output import Column, Output, cell, note, when
from .remote import DEFAULT_TIMEOUT_S, EXIT_OK, ApiError, Remote, segment

#: The command groups this module handles (``tenure GROUP …``).
GROUPS = ("jobs", "queues", "dead-letters", "schedules", "workers")
#: Statuses after which a job never changes again (docs/api.md).
TERMINAL = frozenset({"succeeded", "failed", "cancelled", "interrupted"})
#: Exit code of a follow stopped with Ctrl-C (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED = 130
#: The API's largest page of jobs, events and dead letters.
JOBS_PAGE_MAX, EVENTS_PAGE_MAX, DEAD_PAGE_MAX = 200, 500, 500

Command = Callable[[Remote, argparse.Namespace, Output], int]


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=None, help="the web app's base URL (default: TENURE_URL)")
    common.add_argument(
        "--token", default=None, help="API token (default: TENURE_TOKEN; prefer it, a flag shows in `ps`)"
    )
    common.add_argument("--json", action="store_true", help="JSON Lines on stdout: one object per line")
    common.add_argument("--timeout", type=_seconds, default=DEFAULT_TIMEOUT_S, help="seconds per request (default 30)")
    return common


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"not a whole number of at least 1: {value!r}")
    return number


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"not a number of seconds above 0: {value!r}")
    return seconds


def _leaf(group: Any, name: str, command: Command, help_: str) -> argparse.ArgumentParser:
    parser = group.add_parser(name, help=help_, description=help_, parents=[_common()])
    parser.set_defaults(command_fn=command)
    return parser


def add_parsers(sub: Any) -> None:
    """Add the operator command groups to ``tenure``'s subparsers."""
    jobs = sub.add_parser("jobs", help="list, inspect, follow, cancel, retry jobs (HTTP API)")
    jobs_sub = jobs.add_subparsers(dest="jobs_command", required=True)
    listing = _leaf(jobs_sub, "list", jobs_list, "jobs, newest first (yours; admins see all)")
    listing.add_argument("--status", action="append", help="only this status (repeatable: any of them)")
    listing.add_argument("--kind", help="only this job kind")
    listing.add_argument("--queue", help="only jobs of this queue")
    listing.add_argument("--owner", help="only the jobs of this user (a user name; admins only)")
    listing.add_argument("--created-after", metavar="ISO8601", help="created at or after (with offset)")
    listing.add_argument("--created-before", metavar="ISO8601", help="created before (with offset)")
    listing.add_argument(
        "--search",
        metavar="QUERY",
        help='the search box: words, "phrases" (id, kind, summary, error) and kind: status: owner: queue: parent:',
    )
    listing.add_argument("--parent", metavar="JOB_ID", help="only the steps of this workflow")
    listing.add_argument("--cursor", help="continue a listing from this cursor")
    _add_limit(listing, 50, "jobs", JOBS_PAGE_MAX)
    _leaf(jobs_sub, "show", jobs_show, "one job").add_argument("job_id")
    events = _leaf(jobs_sub, "events", jobs_events, "a job's timeline; --follow prints new events until it ends")
    events.add_argument("job_id")
    events.add_argument("--after", type=int, default=0, metavar="SEQ", help="only events after this sequence")
    events.add_argument("--follow", "-f", action="store_true", help="stream live until the job is finished")
    _add_page_size(events, EVENTS_PAGE_MAX)
    _leaf(jobs_sub, "cancel", jobs_cancel, "cancel a queued or running job").add_argument("job_id")
    _leaf(jobs_sub, "retry", jobs_retry, "run a failed, cancelled or interrupted job again as a new job").add_argument(
        "job_id"
    )
    _leaf(jobs_sub, "run-now", jobs_run_now, "start a delayed or backing-off job now (admin)").add_argument("job_id")
    _leaf(jobs_sub, "delete", jobs_delete, "delete a finished job (a workflow with its steps)").add_argument("job_id")

    queues = sub.add_parser("queues", help="queue depth, lag, pause and resume (admin)")
    queues_sub = queues.add_subparsers(dest="queues_command", required=True)
    _leaf(queues_sub, "list", _lister("/api/v1/queues", QUEUE_COLUMNS), "each queue's depth by state, lag and pause")
    for action, does in (("pause", "stop claims on a queue; its jobs wait"), ("resume", "resume claims on a queue")):
        _leaf(queues_sub, action, _pauser("queues", "queue", action), does).add_argument("name", metavar="QUEUE")

    dead = sub.add_parser("dead-letters", help="messages that failed for good: list, replay, purge (admin)")
    dead_sub = dead.add_subparsers(dest="dead_command", required=True)
    dead_list = _leaf(dead_sub, "list", dead_letters_list, "dead letters, oldest first")
    dead_list.add_argument("--queue", help="only this queue's")
    dead_list.add_argument("--after-id", type=int, default=0, metavar="ID", help="only ids after this one")
    _add_limit(dead_list, 100, "dead letters", DEAD_PAGE_MAX)
    for name, command, does in (
        ("replay", dead_letters_replay, "move dead letters back to ready: they run again"),
        ("purge", dead_letters_purge, "delete dead letters for good"),
    ):
        action = _leaf(dead_sub, name, command, does)
        action.add_argument("queue")
        which = action.add_mutually_exclusive_group(required=True)
        which.add_argument("--id", type=_positive, action="append", dest="ids", help="this dead letter (repeatable)")
        which.add_argument("--all", action="store_true", help="every dead letter of the queue")

    schedules = sub.add_parser("schedules", help="declared schedules: list, run now, pause, resume (admin)")
    schedules_sub = schedules.add_subparsers(dest="schedules_command", required=True)
    _leaf(schedules_sub, "list", _lister("/api/v1/schedules", SCHEDULE_COLUMNS), "schedules, next and last fire")
    _leaf(schedules_sub, "run", schedules_run, "fire a schedule once now").add_argument("name")
    for action, does in (("pause", "stop firing a schedule"), ("resume", "fire a schedule again from its next tick")):
        _leaf(schedules_sub, action, _pauser("schedules", "schedule", action), does).add_argument("name")

    workers = sub.add_parser("workers", help="live worker processes (admin)")
    workers_sub = workers.add_subparsers(dest="workers_command", required=True)
    _leaf(workers_sub, "list", _lister("/api/v1/workers", WORKER_COLUMNS), "worker processes: host, pid, queues …")


def _add_limit(parser: argparse.ArgumentParser, default: int, what: str, page_max: int) -> None:
    amount = parser.add_mutually_exclusive_group()
    amount.add_argument(
        "--limit", type=_positive, default=default, help=f"at most this many {what} (default {default})"
    )
    amount.add_argument("--all", action="store_true", help=f"all {what}, following every page")
    _add_page_size(parser, page_max)


def _add_page_size(parser: argparse.ArgumentParser, page_max: int) -> None:
    parser.add_argument(
        "--page-size",
        type=lambda v: min(_positive(v), page_max),
        default=page_max,
        help=f"items per request (default and most: {page_max}); further pages are followed",
    )


def run(args: argparse.Namespace) -> int:
    """Run the parsed operator command; its exit code. Errors are one line on stderr."""
    out = Output(json_lines=args.json)
    try:
        with Remote(
            args.url or os.environ.get("TENURE_URL"),
            args.token or os.environ.get("TENURE_TOKEN"),
            timeout_s=args.timeout,
        ) as remote:
            return args.command_fn(remote, args, out)
    except ApiError as exc:
        print(f"tenure: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `tenure jobs list | head`: the reader is gone, nothing left to say
        sys.stderr.close()
        return EXIT_OK


# -- jobs ----------------------------------------------------------------------------------------------

JOB_COLUMNS = [
    Column("ID", lambda j: j["id"]),
    Column("KIND", lambda j: j["kind"]),
    Column("STATUS", lambda j: j["status"] + (" (cancel requested)" if j.get("cancel_requested") else "")),
    Column("QUEUE", lambda j: j["queue"]),
    Column("OWNER", lambda j: j["owner"]),
    Column("ATTEMPT", lambda j: f"{j['attempt']}/{j['max_attempts']}"),
    Column("PROGRESS", lambda j: None if j.get("progress") is None else f"{j['progress']:.0%}"),
    Column("CREATED", lambda j: when(j["created_at"])),
    # Last: a summary has spaces (a folder, a clip window), the columns before it do not.
    Column("SUMMARY", lambda j: j.get("summary")),
]
JOB_FIELDS: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
    ("id", lambda j: j["id"]),
    ("kind", lambda j: j["kind"]),
    ("summary", lambda j: j.get("summary")),
    ("status", lambda j: j["status"]),
    ("queue", lambda j: j["queue"]),
    ("owner", lambda j: j["owner"]),
    ("priority", lambda j: j["priority"]),
    ("attempt", lambda j: f"{j['attempt']} of {j['max_attempts']}"),
    ("progress", lambda j: None if j.get("progress") is None else f"{j['progress']:.0%}"),
    ("message", lambda j: j.get("progress_message")),
    ("created", lambda j: when(j["created_at"])),
    ("started", lambda j: when(j.get("started_at"))),
    ("completed", lambda j: when(j.get("completed_at"))),
    ("cancel requested", lambda j: "yes" if j.get("cancel_requested") else "no"),
    ("error", lambda j: j.get("error")),
    ("result", lambda j: j.get("result")),
    ("retry of", lambda j: j.get("retry_of_job_id")),
    ("step of", lambda j: j.get("parent_job_id")),
    ("files", lambda j: ", ".join(j.get("files") or ()) or None),
    ("can cancel", lambda j: "yes" if j.get("can_cancel") else "no"),
    ("can retry", lambda j: "yes" if j.get("can_retry") else "no"),
]


def _job_path(job_id: str, action: str = "") -> str:
    return f"/api/v1/jobs/{segment(job_id)}" + (f"/{action}" if action else "")


def jobs_list(remote: Remote, args: argparse.Namespace, out: Output) -> int:
    params = {
        "status": args.status,
        "kind": args.kind,
        "queue": args.queue,
        "owner": args.owner,
        "created_after": args.created_after,
        "created_before": args.created_before,
        "q": args.search,
        "parent": args.parent,
        "cursor": args.cursor,
    }
    params = {k: v for k, v in params.items() if v is not None}
    limit = None if args.all else args.limit
    out.table(remote.pages("/api/v1/jobs", params, limit=limit, page_size=args.page_size), JOB_COLUMNS)
    if remote.next_cursor is not None:
        note(f"more jobs: add --cursor {remote.next_cursor} (or use --all)")
    return EXIT_OK


def jobs_show(remote: Remote, args: argparse.Namespace, out: Output) -> int:
    out.record(remote.get(_job_path(args.job_id)), JOB_FIELDS)
    return EXIT_OK


def _events_after(remote: Remote, job_id: str, after: int, page_size: int) -> Iterator[dict[str, Any]]:
    """The job's events after sequence *after*, every page."""
    while True:
        page = remote.get(_job_path(job_id, "events"), after=after, limit=page_size)
        yield from page["items"]
        if len(page["items"]) < page_size:
            return
        after = page["next_after"]


def jobs_events(remote: Remote, args: argparse.Namespace, out: Output) -> int:
    if args.follow:
        return _follow(remote, args.job_id, args.after, args.page_size, out)
    events = _events_after(remote, args.job_id, args.after, args.page_size)
    first = next(events, None)  # a missing job is an error before anything is printed
    emit = _EventPrinter(out)
    for event in itertools.chain([first] if first else [], events):
        emit(event)
    return EXIT_OK


class _EventPrinter:
    """Streams events one line each (a table cannot be aligned before the rows are known)."""

    def __init__(self, out: Output) -> None:
        self.out = out
        if not out.json_lines:
            out.text("SEQ   TIME                  TYPE              DATA")

    def __call__(self, event: dict[str, Any]) -> None:
        if self.out.json_lines:
            self.out.line(event)
            return
        seq = "-" if event["sequence"] is None else str(event["sequence"])
        self.out.text(f"{seq:<5} {when(event['created_at']):<21} {event['type']:<17} {cell(event['data'])}".rstrip())


def _follow(remote: Remote, job_id: str, after: int, page_size: int, out: Output) -> int:
    """Print the job's events, then each new one as it happens, until the job is finished.

    The live feed is opened before the job is read, so nothing that happens in between is missed;
    a notice about the job (or a heartbeat or resync) triggers a read of the events after the last
    one printed, so each event prints once, in sequence order, whatever the notices say. Progress
    (which writes no event) prints as an event of type ``progress`` with sequence ``null``.
    """
    with _ctrl_c_exits(), remote.live() as feed:
        next(feed)  # hello: the feed is open from here on
        job = remote.get(_job_path(job_id))
        emit = _EventPrinter(out)

        def catch_up(last: int) -> int:
            for event in _events_after(remote, job_id, last, page_size):
                emit(event)
                last = event["sequence"]
            return last

        last = catch_up(after)
        status = job["status"]
        while status not in TERMINAL:
            message = next(feed)
            if message.get("type") == "notice" and message.get("job_id") != job_id:
                continue
            if message.get("type") == "notice" and message.get("kind") == "progress":
                progress = {"progress": message.get("progress"), "message": message.get("message")}
                emit({"sequence": None, "type": "progress", "data": progress, "created_at": None})
                continue
            if message.get("type") == "notice":
                status = message.get("status") or status
            else:  # heartbeat or resync: re-read, in case a notice was not for us to see
                status = remote.get(_job_path(job_id))["status"]
            last = catch_up(last)
        catch_up(last)
    return EXIT_OK


@contextlib.contextmanager
def _ctrl_c_exits() -> Iterator[None]:
    """While following, Ctrl-C exits 130 at once instead of raising KeyboardInterrupt.

    A follow only reads, so there is nothing to undo; a KeyboardInterrupt, which can surface at any bytecode,
    could surface inside httpx's connection pool while it holds a lock, and the exit would then wait on that
    lock forever (the Python docs' note on signal handlers that raise)."""
    previous = signal.signal(signal.SIGINT, _exit_interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _exit_interrupted(_signum: int, _frame: object) -> None:
    try:
        sys.stdout.flush()
    except (OSError, RuntimeError, ValueError):  # a closed or broken pipe, or a flush the signal interrupted
        pass
    os._exit(EXIT_INTERRUPTED)


def jobs_cancel(remote: Remote, args: argparse.Namespace, out: Output) -> int:
    answer = remote.post(_job_path(args.job_id, "cancel"))
    if answer["outcome"] == "cancelled":
        message = f"cancelled {args.job_id}"
    else:
        message = f"cancel requested for {args.job_id}: it is running and stops at its next checkpoint"
    out.done(answer, message)
    return EXIT_OK


def jobs_retry(remote: Remote, args: argparse.Namespace, out: Output) -> int:
    job = remote.post(_job_path(args.job_id, "retry"))
    out.done(job, f"retried {args.job_id} as {job['id']} ({job['status']})")
    return EXIT_OK


def jobs_run_now(remote: Remote, args: argparse.Namespace, out: Output) -> int:
    job = remote.post(_job_path(args.job_id, "run-now"))
    out.done(job, f"{job['id']} may start now ({job['status']})")
    return EXIT_OK


def jobs_delete(remote: Remote, args: argparse.Namespace, out: Output) -> int:
    answer = remote.call("DELETE", _job_path(args.job_id))
    steps = len(answer["deleted"]) - 1
    out.done(answer, f"deleted {args.job_id}" + (f" and its {steps} step(s)" if steps else ""))
    return EXIT_OK


# -- queues, dead letters, schedules, workers ----------------------------------------------------------

QUEUE_COLUMNS = [
    Column("QUEUE", lambda q: q["queue"]),
    Column("READY", lambda q: q["ready"]),
    Column("DELAYED", lambda q: q["delayed"]),
    Column("RUNNING", lambda q: q["leased"]),
    Column("DEAD", lambda q: q["dead"]),
    Column("LAG", lambda q: None if q.get("oldest_ready_age_s") is None else f"{q['oldest_ready_age_s']:.1f}s"),
    Column("PAUSED", lambda q: q["paused"]),
]
DEAD_COLUMNS = [
    Column("ID", lambda d: d["id"]),
    Column("QUEUE", lambda d: d["queue"]),
    Column("ACTOR", lambda d: d.get("actor")),
    Column("DELIVERIES", lambda d: d.get("deliveries")),
    Column("DEAD AT", lambda d: when(d.get("dead_at"))),
    Column("REASON", lambda d: d.get("reason")),
    Column("MESSAGE", lambda d: d.get("message_id")),
]
SCHEDULE_COLUMNS = [
    Column("NAME", lambda s: s["name"]),
    Column("CRON", lambda s: s["cron"]),
    Column("KIND", lambda s: s.get("kind")),
    Column("NEXT FIRE", lambda s: when(s.get("next_fire_at"))),
    Column("LAST FIRE", lambda s: when(s.get("last_fire_at"))),
    Column("PAUSED", lambda s: s["paused"]),
]
WORKER_COLUMNS = [
    Column("HOST", lambda w: w.get("host")),
    Column("PID", lambda w: w.get("pid")),
    Column("QUEUES", lambda w: ",".join(w["queues"])),
    Column("IN FLIGHT", lambda w: w["leased"]),
    Column("HEARTBEAT", lambda w: when(w.get("heartbeat_at"))),
    Column("STARTED", lambda w: when(w.get("started_at"))),
    Column("OWNER", lambda w: w["owner"]),
]


def _lister(path: str, columns: list[Column]) -> Command:
    """A command printing the list ``GET path`` answers."""

    def command(remote: Remote, args: argparse.Namespace, out: Output) -> int:
        out.table(remote.get(path), columns)
        return EXIT_OK

    return command


def _pauser(collection: str, what: str, action: str) -> Command:
    """A command posting ``/api/v1/<collection>/<name>/<pause|resume>``."""

    def command(remote: Remote, args: argparse.Namespace, out: Output) -> int:
        answer = remote.post(f"/api/v1/{collection}/{segment(args.name)}/{action}")
        out.done(answer, f"{what} {args.name} {'paused' if answer['paused'] else 'resumed'}")
        return EXIT_OK

    return command


def _dead_letters(
    remote: Remote, queue: str | None, after_id: int, limit: int | None, page_size: int
) -> Iterator[dict[str, Any]]:
    sent = 0
    while True:
        size = page_size if limit is None else min(page_size, limit - sent)
        page = remote.get("/api/v1/dead", queue=queue, after_id=after_id, limit=size)
        yield from page
        sent += len(page)
        if len(page) < size or (limit is not None and sent >= limit):
            return
        after_id = page[-1]["id"]


def dead_letters_list(remote: Remote, args: argparse.Namespace, out: Output) -> int:
    limit = None if args.all else args.limit
    out.table(_dead_letters(remote, args.queue, args.after_id, limit, args.page_size), DEAD_COLUMNS)
    return EXIT_OK


def _dead_selection(args: argparse.Namespace) -> dict[str, Any]:
    return {"queue": args.queue} if args.all else {"queue": args.queue, "ids": args.ids}


def dead_letters_replay(remote: Remote, args: argparse.Namespace, out: Output) -> int:
    answer = remote.post("/api/v1/dead/replay", _dead_selection(args))
    out.done(answer, f"replayed {answer['replayed']} dead letter(s) of queue {args.queue}")
    return EXIT_OK


def dead_letters_purge(remote: Remote, args: argparse.Namespace, out: Output) -> int:
    answer = remote.post("/api/v1/dead/purge", _dead_selection(args))
    out.done(answer, f"purged {answer['purged']} dead letter(s) of queue {args.queue}")
    return EXIT_OK


def schedules_run(remote: Remote, args: argparse.Namespace, out: Output) -> int:
    fire = remote.post(f"/api/v1/schedules/{segment(args.name)}/run")
    made = f"job {fire['job_id']}" if fire.get("job_id") else f"message {fire.get('message_id')}"
    out.done(fire, f"schedule {fire['schedule']} fired: {made}")
    return EXIT_OK
