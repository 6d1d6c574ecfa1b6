"""The execution engine: what runs a job's attempt on a worker, one module per duty.

- :mod:`~jobs.execution.worker` — this process's worker identity, engine and running attempts;
- :mod:`~jobs.execution.binding` — the Dramatiq middleware that binds each message to its job: claims
  it (:mod:`~jobs.execution.claimer`) before the actor runs, fails kinds no worker can run;
- :mod:`~jobs.execution.runner` — the actor body: runs the kind's function, turns what it did into an
  outcome;
- :mod:`~jobs.execution.completer` — records that outcome, inline or batched with the message's ack
  (the one way an execution finishes a job);
- :mod:`~jobs.execution.keeper` — one thread per process: renews leases, enforces timeouts, writes
  pending progress, recovers expired jobs.

:func:`jobs.install` composes them on a broker. Importing this package imports none of them.
"""
