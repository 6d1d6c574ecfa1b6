"""One submit from its own process, started together with others: ``python -m … OWNER KEY PAYLOAD_JSON GO_FILE``.

Prints ``{"id": …, "created": …}`` or ``{"conflict": true}`` as JSON.
"""

from __future__ import annotations

import json
import os
import sys
import time

import jobs
from jobs.db import make_engine
from tests.acceptance.jobs.apps.jobs_app import settings  # declares the kinds on the broker


def main() -> None:
    owner, key, payload, go_file = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
    engine = make_engine(settings.database_url)
    jobs.publish.prepare_broker(jobs.registry.broker_for("acc_echo"), "jobs_acceptance")
    engine.connect().close()  # connect before the start line so every process is ready at once
    while not os.path.exists(go_file):
        time.sleep(0.001)
    try:
        job = jobs.submit(engine, owner_id=owner, kind="acc_echo", payload=payload, idempotency_key=key)
        print(json.dumps({"id": job.id, "created": job.created}))
    except jobs.IdempotencyConflict:
        print(json.dumps({"conflict": True}))


if __name__ == "__main__":
    main()
