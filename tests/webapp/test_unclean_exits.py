"""Unclean exits (the SQLite broker's marker of consumer processes that ended without closing it) on the
Workers page, in the API and in readiness until an admin acknowledges them. How a SIGKILLed worker gets
there is tests/integration/test_unclean_exits.py; the whole story under `make run` is
tests/acceptance/operations/test_procfile.py."""

from __future__ import annotations

import pytest
from dramatiq.brokers.redis import RedisBroker

from webapp import operations
from webapp.errors import Unavailable

from .conftest import login


def _crashed(web_broker, *pids: int) -> list[str]:  # type: ignore[no-untyped-def]
    """Unclean-exit rows as the broker records them when a later process finds these pids dead."""
    owners = [f"owner-{pid}" for pid in pids]
    with web_broker.store.write() as conn:
        for owner, pid in zip(owners, pids, strict=True):
            conn.execute(
                "INSERT INTO broker_unclean_exits (owner, host, pid, started_at, last_heartbeat_at, detected_at) "
                "VALUES (?, 'hostA', ?, 1000, 2000, 3000)",
                (owner, pid),
            )
    return owners


def _ready_detail(client, person):  # type: ignore[no-untyped-def]
    r = client.get("/api/health/ready", headers=person.bearer)
    assert r.status_code == 200, r.json  # a past crash never makes the system unready
    return r.json["components"]["unclean_exits"]


def test_unclean_exits_are_listed_until_acknowledged(client, web_broker, root, alice):  # type: ignore[no-untyped-def]
    assert _ready_detail(client, root)["detail"] == "no unclean exits"
    # Given two worker processes that ended uncleanly
    first, second = _crashed(web_broker, 111, 222)

    # Then readiness stays ok and names them (details for admins only), the API lists them
    assert _ready_detail(client, root)["detail"] == "2 unclean exit(s) awaiting acknowledgement: hostA/111, hostA/222"
    assert _ready_detail(client, alice) == {"status": "ok"}
    listed = client.get("/api/v1/workers/unclean-exits", headers=root.bearer).json
    assert sorted((e["owner"], e["host"], e["pid"]) for e in listed) == [(first, "hostA", 111), (second, "hostA", 222)]
    for bad in ({"owners": []}, {"owners": "x"}, {"owners": [""]}, {}):
        r = client.post("/api/v1/workers/unclean-exits/acknowledge", json=bad, headers=root.bearer)
        assert r.status_code == 422, (bad, r.json)

    # When an admin acknowledges one through the API, the other on the Workers page
    r = client.post("/api/v1/workers/unclean-exits/acknowledge", json={"owners": [first]}, headers=root.bearer)
    assert r.json == {"acknowledged": 1}
    token = login(client, root)
    page = client.get("/ops/workers").get_data(as_text=True)
    assert 'id="unclean-exits"' in page and "hostA / 222" in page and "hostA / 111" not in page
    assert client.post("/ops/workers/unclean-exits/acknowledge", data={"owner": second}).status_code == 400  # no CSRF
    done = client.post(
        "/ops/workers/unclean-exits/acknowledge", data={"csrf_token": token, "owner": second}, follow_redirects=True
    ).get_data(as_text=True)

    # Then they are gone from the page, the API and readiness
    assert "Acknowledged 1 unclean exit(s)." in done and 'id="unclean-exits"' not in done
    assert client.get("/api/v1/workers/unclean-exits", headers=root.bearer).json == []
    assert _ready_detail(client, root)["detail"] == "no unclean exits"


def test_server_brokers_keep_no_unclean_exit_marker() -> None:
    broker = RedisBroker(url="redis://127.0.0.1:6379/15", middleware=[])
    try:
        with pytest.raises(Unavailable) as raised:
            operations.unclean_exits(broker)
        assert raised.value.status == 503
        assert getattr(broker, "unclean_exits", None) is None  # readiness leaves the component out
    finally:
        broker.close()
