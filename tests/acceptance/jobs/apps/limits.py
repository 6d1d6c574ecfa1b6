"""The acceptance kinds' limits, shared by the worker app and the submitting test (which must not import the app)."""

from jobs.limits import ConcurrencyLimit

#: Jobs of one ``key`` run at most two at a time (tests/acceptance/jobs/test_admission_workers.py).
LIMITED = ConcurrencyLimit("acc.limited", limit=2, key="payload:key")
