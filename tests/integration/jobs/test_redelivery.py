"""Messages a server broker lost come back from the job store (jobs.redelivery), once, and only those."""

from __future__ import annotations

import jobs
from jobs.outbox import relay_once
from jobs.publish import JOB_ID_OPTION
from jobs.redelivery import republish_lost

from .support import JobEnv


def test_jobs_whose_messages_redis_lost_get_them_again(env: JobEnv) -> None:
    env.declare("echo", lambda ctx, **p: p)
    ids = [env.submit("echo", payload={"n": n}).id for n in range(3)]
    if env.backend == "sqlite":
        # Messages are rows of the job file, written in the jobs' own transactions: none can be lost.
        assert republish_lost(env.engine, env.broker, min_age_ms=0) == 0
        return
    assert relay_once(env.engine, env.broker) == 3
    # Nothing lost: nothing written again.
    assert republish_lost(env.engine, env.broker, min_age_ms=0) == 0
    # Redis restarted without persistence (here: the queue's keys deleted).
    client = env.broker.client
    ns = env.broker.namespace
    client.delete(f"{ns}:default", f"{ns}:default.msgs")
    # Too recent to be taken for lost (a message may be on its way through the outbox):
    assert republish_lost(env.engine, env.broker, min_age_ms=60_000) == 0
    assert republish_lost(env.engine, env.broker, min_age_ms=0) == 3
    assert relay_once(env.engine, env.broker) == 3
    assert republish_lost(env.engine, env.broker, min_age_ms=0) == 0
    consumer = env.broker.consume("default", prefetch=10, timeout=1000)
    delivered = []
    while len(delivered) < 3:
        message = next(consumer)
        if message is not None:
            delivered.append(message)
    assert sorted(m.options[JOB_ID_OPTION] for m in delivered) == sorted(ids)
    for message in delivered:
        ctx = env.claim(message.options[JOB_ID_OPTION])
        assert ctx is not None
        env.mw.runner(ctx)
        consumer.ack(message)
    consumer.close()
    assert [jobs.get_job(env.engine, i, owner_id="u1").status for i in ids] == ["succeeded"] * 3
