"""Tenure's Dramatiq brokers on SQLite and PostgreSQL leases (usable alone by any Dramatiq project).

from broker import SQLiteBroker
dramatiq.set_broker(SQLiteBroker("sqlite:///var/tenure.db"))
# or, on PostgreSQL (psycopg 3): from broker.postgres import PostgresBroker
"""

from .errors import DatabaseUnavailable, UnsupportedDatabase
from .expedite import expedite_delayed
from .factory import make_broker
from .rate_limits import SQLiteRateLimiterBackend
from .results import SQLiteResultBackend
from .sqlite import DEFAULT_LEASE_TTL_MS, DEFAULT_URL, SQLiteBroker, same_file
from .store import SCHEMA_VERSION, DeadMatch, schema_sql

__all__ = [
    "DEFAULT_LEASE_TTL_MS",
    "DEFAULT_URL",
    "SCHEMA_VERSION",
    "DatabaseUnavailable",
    "DeadMatch",
    "SQLiteBroker",
    "SQLiteRateLimiterBackend",
    "SQLiteResultBackend",
    "UnsupportedDatabase",
    "expedite_delayed",
    "make_broker",
    "same_file",
    "schema_sql",
]
