"""``tenure db``-adjacent commands on this machine: accounts (``tenure users``) and demo data (``tenure demo``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_users_parser(sub: argparse._SubParsersAction) -> None:
    users = sub.add_parser("users", help="web app accounts")
    users_sub = users.add_subparsers(dest="users_command", required=True)
    create = users_sub.add_parser("create", help="create a user; prints a generated password once")
    create.add_argument("name")
    create.add_argument("--admin", action="store_true", help="role admin (default: user)")
    create.add_argument(
        "--password-stdin", action="store_true", help="read the password from stdin instead of generating one"
    )
    users_sub.add_parser("ensure-admin", help="create user 'admin' with a random password if no admin exists")
    reset = users_sub.add_parser(
        "set-password", help="give a user a new password (e.g. a lost admin password); prints a generated one once"
    )
    reset.add_argument("name")
    reset.add_argument(
        "--password-stdin", action="store_true", help="read the password from stdin instead of generating one"
    )


def add_demo_parser(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser("demo", help="demo data")
    demo_sub = demo.add_subparsers(dest="demo_command", required=True)
    make = demo_sub.add_parser(
        "make-recording", help="write a synthetic live-stream recording folder (FLV segments + danmaku XML)"
    )
    make.add_argument("directory", help="folder to create (the files go directly into it)")
    make.add_argument("--segments", type=int, default=3, help="number of segments (default 3)")
    make.add_argument("--seconds", type=float, default=6.0, help="length of each segment (default 6)")
    make.add_argument(
        "--truncate", type=int, default=None, metavar="N", help="cut segment N as a crashed recorder would"
    )
    make.add_argument("--malformed-xml", type=int, default=None, metavar="N", help="cut segment N's danmaku XML")
    make.add_argument(
        "--room",
        type=int,
        default=23058,
        help="live room id (default 23058); a session is one room and start time, so give another room to "
        "import a second demo recording as a new session rather than an update of the first",
    )


def demo_command(args: argparse.Namespace) -> int:
    """``tenure demo make-recording DIR``: test-pattern video, tone, speech and danmaku, with ffmpeg."""
    from tasks.domain.demo_recording import make_recording
    from tasks.domain.media.ffmpeg import FfmpegError, FfmpegNotFound

    if args.segments < 1 or args.seconds <= 0:
        print("tenure: --segments must be at least 1 and --seconds positive", file=sys.stderr)
        return 2
    try:
        made = make_recording(
            args.directory,
            segments=args.segments,
            seconds=args.seconds,
            truncate_segment=args.truncate,
            malformed_xml=args.malformed_xml,
            room_id=args.room,
        )
    except (FfmpegError, FfmpegNotFound) as exc:
        print(f"tenure: {exc}", file=sys.stderr)
        return 1
    for segment in made.segments:
        notes = [n for n, on in (("truncated", segment.truncated), ("malformed xml", segment.xml_malformed)) if on]
        print(
            f"{segment.flv.name}  {segment.written_duration_s:.2f} s{'  (' + ', '.join(notes) + ')' if notes else ''}"
        )
    print(f"recording of room {made.room_id} in {made.folder}")
    return 0


def users_command(args: argparse.Namespace, database_url: str) -> int:
    """``tenure users …``: passwords are read from stdin or generated, never taken from argv."""
    from sqlalchemy import inspect

    import accounts
    from jobs.db import make_engine

    engine = make_engine(database_url)
    try:
        if not inspect(engine).has_table("users"):
            print("tenure: the database has no accounts tables yet; run `tenure db upgrade` first", file=sys.stderr)
            return 1
        if args.users_command == "ensure-admin":
            created = accounts.ensure_admin(engine)
            if created is None:
                print("an admin account exists")
                return 0
            user, password = created
            print(f"Created admin account {user.username!r} with password: {password}")
            print("Log in at the web app's /login page; this password is shown only once.")
            return 0
        password = sys.stdin.readline().rstrip("\n") if args.password_stdin else None
        if args.users_command == "set-password":
            return _set_password(engine, args.name, password)
        try:
            user, password = accounts.create_user(engine, args.name, password, role="admin" if args.admin else "user")
        except (accounts.AccountError, ValueError) as exc:
            print(f"tenure: {exc}", file=sys.stderr)
            return 1
        print(f"created {user.role} {user.username!r}")
        if not args.password_stdin:
            print(f"password (shown once): {password}")
        return 0
    finally:
        engine.dispose()


def _set_password(engine: Any, name: str, password: str | None) -> int:
    """``tenure users set-password NAME``: the typed password, or a generated one printed once."""
    import accounts

    user = accounts.get_user_by_name(engine, name)
    if user is None:
        print(f"tenure: no user named {name!r}", file=sys.stderr)
        return 1
    new = accounts.generate_password() if password is None else password
    try:
        accounts.set_password(engine, user.id, new)
    except (accounts.AccountError, ValueError) as exc:
        print(f"tenure: {exc}", file=sys.stderr)
        return 1
    print(f"password of {user.role} {user.username!r} changed")
    if password is None:
        print(f"password (shown once): {new}")
    return 0
