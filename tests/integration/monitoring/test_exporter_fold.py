"""``monitoring.exporter.fold_finished_processes``: ended processes' files folded into archives, crash-safely."""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector

from monitoring.exporter import fold_finished_processes

KEY = json.dumps(["tenure_things", "tenure_things_total", {"queue": "q"}, "Things."])
GAUGE = json.dumps(["tenure_live", "tenure_live", {}, "Live."])


def write(path: Path, key: str, value: float) -> None:
    d = MmapedDict(str(path))
    d.write_value(key, value, 0.0)
    d.close()


def totals(directory: Path) -> dict[str, float]:
    return {s.name: s.value for m in MultiProcessCollector(None, path=str(directory)).collect() for s in m.samples}


def test_fold_keeps_every_total_and_drops_the_live_gauges(tmp_path: Path) -> None:
    write(tmp_path / "counter_11.db", KEY, 3)
    write(tmp_path / "counter_12.db", KEY, 4)
    write(tmp_path / "gauge_livesum_11.db", GAUGE, 1)
    fold_finished_processes(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["counter_archive.db"]
    assert totals(tmp_path) == {"tenure_things_total": 7}
    # a later run adds to the archive
    write(tmp_path / "counter_13.db", KEY, 5)
    fold_finished_processes(tmp_path)
    assert totals(tmp_path) == {"tenure_things_total": 12}


def test_an_interrupted_fold_is_finished_by_the_next_one(tmp_path: Path) -> None:
    # Given: a fold that moved the archive and one file aside, then died before writing the merge
    write(tmp_path / "counter_archive.db", KEY, 10)
    folding = tmp_path / "folding-counter"
    folding.mkdir()
    (tmp_path / "counter_archive.db").rename(folding / "counter_archive.db")
    write(folding / "counter_21.db", KEY, 2)
    write(tmp_path / "counter_22.db", KEY, 1)  # not moved yet
    assert totals(tmp_path) == {"tenure_things_total": 1}
    # When / Then: the next fold counts everything exactly once
    fold_finished_processes(tmp_path)
    assert totals(tmp_path) == {"tenure_things_total": 13}
    assert not folding.exists()


def test_a_fold_that_died_after_renaming_its_archive_only_cleans_up(tmp_path: Path) -> None:
    # Given: the merged archive is back in place, the folded parts still lie in folding/
    write(tmp_path / "counter_archive.db", KEY, 9)
    folding = tmp_path / "folding-counter"
    folding.mkdir()
    write(folding / "counter_31.db", KEY, 9)  # already inside the archive
    fold_finished_processes(tmp_path)
    assert totals(tmp_path) == {"tenure_things_total": 9}
    assert not folding.exists()
