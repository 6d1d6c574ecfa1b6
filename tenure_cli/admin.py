"""``tenure db``-adjacent commands on this machine: accounts (``tenure users``) and demo data (``tenure demo``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_users_parser(sub: argparse._SubParsersAction) -> None:
    users = sub.add_parser("users", help="web app accounts and roles (each change is recorded in the audit log)")
    users_sub = users.add_subparsers(dest="users_command", required=True)
    create = users_sub.add_parser("create", help="create a user; prints a generated password once")
    create.add_argument("name")
    create.add_argument("--role", default=None, help="the user's role (default: user; see `tenure users roles`)")
    create.add_argument("--admin", action="store_true", help="shorthand for --role admin")
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
    users_sub.add_parser("list", help="every user with their role")
    set_role = users_sub.add_parser("set-role", help="give a user another role")
    set_role.add_argument("name")
    set_role.add_argument("role")
    users_sub.add_parser("roles", help="every role with the actions it grants")
    define = users_sub.add_parser("define-role", help="define a role, or replace a defined role's actions")
    define.add_argument("role")
    define.add_argument(
        "--permission", action="append", default=[], metavar="ACTION", help="an action it grants (repeat)"
    )
    define.add_argument("--description", default="")
    drop = users_sub.add_parser("delete-role", help="delete a role nobody holds (built-in roles stay)")
    drop.add_argument("role")


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


def _entry(action: str, target_type: str, target: str, **details: Any) -> Any:
    """An audit entry for a change made from this command line: who ran it (the OS user on this host)."""
    import getpass
    import socket

    from accounts import audit

    return audit.Entry(
        action,
        actor_name=f"{getpass.getuser()}@{socket.gethostname()}",
        via="cli",
        user_agent="tenure users",
        target_type=target_type,
        target=target[:300],
        details=details,
    )


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
        try:
            return _users(args, engine)
        except (accounts.AccountError, ValueError) as exc:
            print(f"tenure: {exc}", file=sys.stderr)
            return 1
    finally:
        engine.dispose()


def _users(args: argparse.Namespace, engine: Any) -> int:
    import accounts
    from accounts import audit
    from accounts.permissions import ordered

    command = args.users_command
    if command == "ensure-admin":
        created = accounts.ensure_admin(engine, entry=_entry("user.create", "user", "admin"))
        if created is None:
            print("an admin account exists")
            return 0
        user, password = created
        print(f"Created admin account {user.username!r} with password: {password}")
        print("Log in at the web app's /login page; this password is shown only once.")
        return 0
    if command == "list":
        for user in accounts.list_users(engine):
            print("\t".join([user.username, user.role, *(["disabled"] if user.disabled else [])]))
        return 0
    if command == "roles":
        for role in accounts.list_roles(engine):
            kind = "built-in" if role.builtin else "defined"
            print(f"{role.name}\t{kind}\t{role.users} user(s)\t{' '.join(ordered(role.permissions))}")
        return 0
    if command == "set-role":
        user = _existing(engine, args.name)
        with audit.recorded(engine, _entry("user.role", "user", args.name, to=args.role)) as conn:
            before = accounts.set_role(conn, user.id, args.role)
        print(f"{args.name}: role {before} -> {args.role}")
        return 0
    if command == "define-role":
        return _define_role(engine, args)
    if command == "delete-role":
        with audit.recorded(engine, _entry("role.delete", "role", args.role)) as conn:
            accounts.delete_role(conn, args.role)
        print(f"deleted role {args.role!r}")
        return 0
    password = sys.stdin.readline().rstrip("\n") if args.password_stdin else None
    if command == "set-password":
        return _set_password(engine, args.name, password)
    role = "admin" if args.admin else (args.role or "user")
    with audit.recorded(engine, _entry("user.create", "user", args.name, role=role)) as conn:
        user, password = accounts.create_user(conn, args.name, password, role=role)
    print(f"created {user.role} {user.username!r}")
    if not args.password_stdin:
        print(f"password (shown once): {password}")
    return 0


def _existing(engine: Any, name: str) -> Any:
    import accounts

    user = accounts.get_user_by_name(engine, name)
    if user is None:
        raise accounts.UserNotFound(f"no user named {name!r}")
    return user


def _define_role(engine: Any, args: argparse.Namespace) -> int:
    import accounts
    from accounts import audit

    actions = sorted(set(args.permission))
    existing = accounts.get_role(engine, args.role)
    action = "role.update" if existing is not None else "role.create"
    with audit.recorded(engine, _entry(action, "role", args.role, permissions=actions)) as conn:
        if existing is None:
            accounts.create_role(conn, args.role, args.description, actions)
        else:
            accounts.update_role(conn, args.role, args.description, actions)
    print(f"role {args.role!r}: {' '.join(actions) or '(no actions)'}")
    return 0


def _set_password(engine: Any, name: str, password: str | None) -> int:
    """``tenure users set-password NAME``: the typed password, or a generated one printed once."""
    import accounts
    from accounts import audit

    user = accounts.get_user_by_name(engine, name)
    if user is None:
        print(f"tenure: no user named {name!r}", file=sys.stderr)
        return 1
    new = accounts.generate_password() if password is None else password
    with audit.recorded(engine, _entry("user.password", "user", name)) as conn:
        accounts.set_password(conn, user.id, new)
    print(f"password of {user.role} {user.username!r} changed")
    if password is None:
        print(f"password (shown once): {new}")
    return 0
