"""Settings: defaults, validation messages, and the snapshot jobs keep."""

from __future__ import annotations

import pytest

from jobs.settings import Settings, SettingsError


def test_defaults_share_one_sqlite_file() -> None:
    s = Settings.from_env({})
    assert s.database_url == "sqlite:///var/tenure.db"
    assert s.broker_url == s.database_url
    assert s.job_lease_ttl_s == 30.0
    assert s.recovery_interval_s == s.job_lease_ttl_s


def test_broker_url_required_with_postgres() -> None:
    with pytest.raises(SettingsError, match="TENURE_BROKER_URL is required"):
        Settings.from_env({"TENURE_DATABASE_URL": "postgresql://u@h/db"})
    s = Settings.from_env({"TENURE_DATABASE_URL": "postgresql://u@h/db", "TENURE_BROKER_URL": "redis://h:6379/0"})
    assert s.broker_url == "redis://h:6379/0"
    assert not s.database_is_sqlite


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TENURE_JOB_LEASE_TTL_S": "abc"}, "not a number"),
        ({"TENURE_JOB_LEASE_TTL_S": "0.01"}, "at least"),
        ({"TENURE_JOB_MAX_ATTEMPTS": "0"}, "at least 1"),
        ({"TENURE_DATABASE_URL": "mysql://x"}, "use sqlite"),
        ({"TENURE_BROKER_URL": "kafka://x"}, "use sqlite"),
    ],
)
def test_invalid_values_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message) as info:
        Settings.from_env(env)
    assert next(iter(env)) in str(info.value)


def test_snapshot_has_no_urls() -> None:
    s = Settings.from_env({"TENURE_DATABASE_URL": "postgresql://u:secret@h/db", "TENURE_BROKER_URL": "redis://h"})
    snap = s.job_snapshot()
    assert "secret" not in repr(snap)
    assert snap["output_root"] == "var/outputs"


def test_settings_are_frozen() -> None:
    s = Settings.from_env({})
    with pytest.raises(AttributeError):
        s.database_url = "x"  # type: ignore[misc]
