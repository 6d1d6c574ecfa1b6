"""``jobs.db``'s connections on both engines: what each kind of transaction holds while it is open."""

from __future__ import annotations

from sqlalchemy import text

from jobs import db

from .support import JobEnv


def test_an_autocommit_read_holds_no_transaction_on_a_server_and_no_write_lock_on_sqlite(env: JobEnv) -> None:
    env.declare("plain", lambda ctx: None)
    job = env.submit("plain").id
    with db.autocommit(env.engine) as conn:
        assert conn.execute(text("SELECT count(*) FROM jobs")).scalar() == 1
        # Another writer commits while the block is open (on SQLite it gets the write lock at once)
        with db.write(env.engine) as tx:
            tx.conn.execute(text("UPDATE jobs SET priority = 7 WHERE id = :id"), {"id": job})
        if env.backend != "sqlite":
            assert conn.connection.driver_connection.info.transaction_status.name == "IDLE"
            # Each statement reads what is committed when it starts
            assert conn.execute(text("SELECT priority FROM jobs WHERE id = :id"), {"id": job}).scalar() == 7
    assert env.row(job).priority == 7
