"""The shapes the read side takes for speed return exactly what the plain predicates mean.

- Several statuses: a page is the newest of each status merged (``UNION ALL`` of one index range per
  status), on both engines; every page full until the last, together exactly the matching jobs.
- A common search term (SQLite): a page walks the jobs newest first and compares each row instead of
  asking the FTS index; the pages are the same as through the index.

The timings that motivate them are in docs/benchmarks.md (``bench/queries_bench.py``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event

import jobs
from jobs import queries, read_store
from jobs.queries import JobFilter

from .support import JobEnv


def _jobs(env: JobEnv, n: int) -> list[str]:
    env.declare("noop", lambda ctx: None)
    return [env.submit("noop", owner_id=f"u{i % 3}").id for i in range(n)]


def _pages(env: JobEnv, where: JobFilter, limit: int) -> list[list[str]]:
    pages: list[list[str]] = []
    cursor = None
    while True:
        page = queries.page_jobs(env.engine, where, owner_id="", is_admin=True, cursor=cursor, limit=limit)
        pages.append([r.id for r in page.items])
        cursor = page.next_cursor
        if cursor is None:
            return pages


def _newest_first(env: JobEnv, where_sql: str) -> list[str]:
    rows = env.sql(f"SELECT id FROM jobs WHERE {where_sql} ORDER BY created_at DESC, id DESC")
    return [r[0] for r in rows]


@contextmanager
def _statements(env: JobEnv, keep: Callable[[str], bool]) -> Iterator[list[tuple[str, Any]]]:
    """The statements (and their parameters) *env*'s engine runs inside the block that *keep* selects."""
    seen: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        if keep(statement):
            seen.append((statement, parameters))

    event.listen(env.engine, "before_cursor_execute", capture)
    try:
        yield seen
    finally:
        event.remove(env.engine, "before_cursor_execute", capture)


def _newest_first_statement(statement: str) -> bool:
    return "ORDER BY created_at DESC" in statement


def _plan_reads(env: JobEnv, statement: str, parameters: Any) -> list[str]:
    """The steps of SQLite's plan for *statement* that read the jobs table."""
    raw = env.engine.raw_connection()
    try:
        plan = [str(r[-1]) for r in raw.cursor().execute("EXPLAIN QUERY PLAN " + statement, parameters).fetchall()]
    finally:
        raw.close()
    return [step for step in plan if step.split(" ")[:2] in (["SEARCH", "jobs"], ["SCAN", "jobs"])]


def test_several_statuses_page_through_exactly_the_matching_jobs(env: JobEnv) -> None:
    ids = _jobs(env, 40)
    for i, job_id in enumerate(ids):
        if i % 4 == 1:
            env.sql("UPDATE jobs SET status = 'failed', completed_at = created_at + 1 WHERE id = :id", id=job_id)
        elif i % 4 == 2:
            env.sql("UPDATE jobs SET status = 'cancelled', completed_at = created_at + 1 WHERE id = :id", id=job_id)
    for statuses, where_sql in (
        (("failed", "cancelled"), "status IN ('failed', 'cancelled')"),
        (("queued", "failed"), "status IN ('queued', 'failed')"),
        (("cancelled", "failed", "queued"), "1 = 1"),
    ):
        pages = _pages(env, JobFilter(statuses=statuses), limit=3)
        expected = _newest_first(env, where_sql)
        assert [j for p in pages for j in p] == expected, statuses
        assert all(len(p) == 3 for p in pages[:-1]) and 1 <= len(pages[-1]) <= 3
        owned = queries.page_jobs(env.engine, JobFilter(statuses=statuses), owner_id="u1", limit=100).items
        assert [r.id for r in owned] == [j for j in expected if j in set(_newest_first(env, "owner_id = 'u1'"))], (
            statuses
        )


def test_several_statuses_read_one_index_range_per_status(sqlite_env: JobEnv) -> None:
    env = sqlite_env
    for job_id in _jobs(env, 6):
        env.sql("UPDATE jobs SET status = 'failed', completed_at = created_at + 1 WHERE id = :id", id=job_id)
    with _statements(env, lambda s: "FROM jobs" in s and "UNION ALL" in s) as seen:
        jobs.list_jobs(
            env.engine, owner_id="", is_admin=True, where=JobFilter(statuses=("failed", "interrupted")), limit=2
        )
    ((statement, parameters),) = seen
    arms = _plan_reads(env, statement, parameters)
    assert arms == ["SEARCH jobs USING INDEX ix_jobs_finished_created (status=?)"] * 2, arms


def test_one_owners_jobs_of_a_finished_status_are_read_from_the_shorter_range(sqlite_env: JobEnv) -> None:
    env = sqlite_env
    ids = _jobs(env, 60)  # owners u0, u1, u2 in turn
    few = [env.submit("noop", owner_id="u9").id for _ in range(3)]
    # Given 20 jobs of u1 (14 failed, 2 cancelled), 20 of u2 (4 failed), 20 of u0 and 3 of u9 (1 failed)
    env.sql("UPDATE jobs SET status = 'failed', completed_at = created_at + 1 WHERE id = :id", id=few[1])
    for i, job_id in enumerate(ids):
        owner = f"u{i % 3}"
        if owner == "u1":
            status = "cancelled" if i % 10 == 1 else "failed" if i % 5 else "queued"
        else:
            status = "failed" if owner == "u2" and i % 5 == 2 else "queued"
        if status != "queued":
            env.sql("UPDATE jobs SET status = :s, completed_at = created_at + 1 WHERE id = :id", id=job_id, s=status)
    with _statements(env, _newest_first_statement) as statements:
        for owner, statuses, route in (
            # When one owner's jobs of some statuses are paged: by status where it has fewer jobs than the owner
            ("u1", ("cancelled",), "ix_jobs_finished_created (status=?)"),  # 2 cancelled jobs, u1's 20
            ("u2", ("failed",), "ix_jobs_finished_created (status=?)"),  # 19 failed jobs, u2's 20
            ("u9", ("failed",), "ix_jobs_owner_created (owner_id=?)"),  # u9's 3 jobs, 19 failed
            ("u1", ("cancelled", "failed", "queued"), None),  # one arm per status, each routed alone
        ):
            statements.clear()
            where = JobFilter(statuses=statuses)
            pages: list[list[str]] = []
            cursor = None
            while True:
                page = queries.page_jobs(env.engine, where, owner_id=owner, cursor=cursor, limit=3)
                pages.append([r.id for r in page.items])
                if (cursor := page.next_cursor) is None:
                    break
            # Then the pages are exactly the plain predicate's jobs, and the count says as many
            in_sql = ", ".join(f"'{s}'" for s in statuses)
            expected = _newest_first(env, f"owner_id = '{owner}' AND status IN ({in_sql})")
            assert [j for p in pages for j in p] == expected, (owner, statuses)
            assert queries.count_jobs(env.engine, where, owner_id=owner) == len(expected)
            if route is not None:
                assert _plan_reads(env, *statements[0]) == [f"SEARCH jobs USING INDEX {route}"], (owner, statuses)


def _with_errors(env: JobEnv, cancelled_every: int = 0) -> list[str]:
    """30 jobs ended with an error (every *cancelled_every*-th cancelled, the others failed)."""
    ids = _jobs(env, 30)
    for i, job_id in enumerate(ids):
        error = "Disk full on NODE-7" if i % 3 else "timeout"
        status = "cancelled" if cancelled_every and i % cancelled_every == 0 else "failed"
        env.sql(
            "UPDATE jobs SET status = :s, completed_at = created_at + 1, error = :e WHERE id = :id",
            id=job_id,
            s=status,
            e=error,
        )
    return ids


@pytest.mark.parametrize("term", ["disk full", "node-7", "NoDe", "out", "zzz"])
def test_a_common_search_term_walks_the_jobs_and_finds_the_same_pages(
    sqlite_env: JobEnv, monkeypatch: pytest.MonkeyPatch, term: str
) -> None:
    env = sqlite_env
    _with_errors(env)
    with _statements(env, _newest_first_statement) as seen:
        through_index = _pages(env, JobFilter(search=term), limit=4)
    assert all("jobs_search" in s for s, _ in seen)
    monkeypatch.setattr(read_store, "WALK_MIN_MATCHES", 1)  # every term that matches anything is common
    with _statements(env, _newest_first_statement) as seen:
        walked = _pages(env, JobFilter(search=term), limit=4)
    statements = [s for s, _ in seen]
    assert walked == through_index
    matched = sum(len(p) for p in walked)
    assert matched == {"disk full": 20, "node-7": 20, "NoDe": 20, "out": 10, "zzz": 0}[term]
    # A term without a match is never common; one with matches is compared row by row.
    assert all(("jobs_search" in s) == (matched == 0) for s in statements), statements
    count = queries.count_jobs(env.engine, JobFilter(search=term), owner_id="", is_admin=True)
    assert count == matched


@pytest.mark.parametrize("walk_rows", [10_000, 7, 1])
def test_a_postgres_search_page_looks_among_the_newest_jobs_first_and_finds_the_same_pages(
    postgres_env: JobEnv, monkeypatch: pytest.MonkeyPatch, walk_rows: int
) -> None:
    env = postgres_env
    _with_errors(env, cancelled_every=4)
    newest_first = [r[0] for r in env.sql("SELECT id, error FROM jobs ORDER BY created_at DESC, id DESC")]
    errors = dict(env.sql("SELECT id, error FROM jobs"))
    owners = dict(env.sql("SELECT id, owner_id FROM jobs"))
    statuses = dict(env.sql("SELECT id, status FROM jobs"))
    monkeypatch.setattr(read_store, "SEARCH_WALK_ROWS", walk_rows)
    for term, where in (
        ("node-7", JobFilter(search="node-7")),
        ("timeout", JobFilter(search="TimeOut", statuses=("failed",))),
        ("disk full", JobFilter(search=("disk", "full"))),
        ("node-7", JobFilter(search="node-7", owner_id="u1")),  # one owner's newest jobs: their own index range
        # one owner's newest jobs of one status: the range of ix_jobs_owner_status_created
        ("timeout", JobFilter(search="timeout", owner_id="u0", statuses=("failed",))),
    ):
        with _statements(env, _newest_first_statement) as seen:
            pages = _pages(env, where, limit=4)
        statements = [s for s, _ in seen]
        # Then the pages are exactly the matching jobs, newest first, whichever way each page was found
        expected = [
            j
            for j in newest_first
            if term in (errors[j] or "").lower()
            and where.owner_id in (None, owners[j])
            and (not where.statuses or statuses[j] in where.statuses)
        ]
        assert [j for page in pages for j in page] == expected and expected, (term, pages)
        # and every page first looked among the newest jobs; the index answered only the pages that look missed
        walks = [s for s in statements if "LIMIT %(walk)s" in s]
        # (a rare search's page is collected from its matches' ids, found beforehand)
        from_index = [s for s in statements if "job_search" in s or "= ANY(%(matched)s)" in s]
        assert len(walks) == len(pages) and len(from_index) + len(walks) == len(statements), statements
        if walk_rows == 10_000:
            assert len(from_index) <= 1, statements  # the last page, with less than a page left to find
        if walk_rows == 1:
            assert len(from_index) == len(pages), statements
        if where.owner_id is not None and where.statuses:
            assert all("status = %(walk_status)s" in s for s in walks), walks


def test_a_postgres_search_for_a_two_digit_id_prefix_walks_three_times_as_many_newest_jobs(
    postgres_env: JobEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = postgres_env
    _with_errors(env)
    monkeypatch.setattr(read_store, "SEARCH_WALK_ROWS", 4)
    newest_first = _newest_first(env, "true")
    oldest = newest_first[-1]
    for term, walked in ((oldest[:2], 12), (oldest[:3], 4), ("disk", 4)):
        with _statements(env, _newest_first_statement) as seen:
            pages = _pages(env, JobFilter(search=term), limit=4)
        walks = [parameters["walk"] for statement, parameters in seen if "LIMIT %(walk)s" in statement]
        assert walks and set(walks) == {walked}, (term, walks)
        if term != "disk":  # the pages are the same, exactly: the jobs whose ids start with it, newest first
            assert [j for page in pages for j in page] == [j for j in newest_first if j.startswith(term)]


def test_a_postgres_search_of_several_statuses_reads_its_matches_once_when_the_newest_jobs_lack_a_status(
    postgres_env: JobEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given failed and cancelled jobs whose errors say "timeout", the newest three jobs one failed one of them
    env = postgres_env
    _with_errors(env, cancelled_every=4)
    monkeypatch.setattr(read_store, "SEARCH_WALK_ROWS", 3)
    where = JobFilter(search="timeout", statuses=("failed", "cancelled"))
    # When they are paged (each page walks the newest three jobs after it first, then asks the index)
    with _statements(env, _newest_first_statement) as seen:
        pages = _pages(env, where, limit=4)
    # Then the pages are exactly those jobs, newest first
    expected = _newest_first(env, "error = 'timeout' AND status IN ('failed', 'cancelled')")
    assert [j for page in pages for j in page] == expected and len(expected) == 10, pages
    # and a page the walk left short read the matches once for both statuses (not once per status)
    from_index = [s for s, _ in seen if "job_search" in s]
    assert from_index and all(s.count("job_search") == 1 for s in from_index), from_index


def test_a_postgres_search_page_the_newest_jobs_left_short_collects_a_rare_terms_matches_and_sorts_them(
    postgres_env: JobEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given 10 jobs whose errors say "timeout" and 20 "Disk full on NODE-7", and (scaled down) a term is rare
    # below 15 matches; each page looks at the newest job after it first
    env = postgres_env
    _with_errors(env, cancelled_every=4)
    monkeypatch.setattr(read_store, "SEARCH_WALK_ROWS", 1)
    monkeypatch.setattr(read_store, "FEW_MATCHES", 15)
    for where, matching, rare in (
        (JobFilter(search="timeout"), "error = 'timeout'", True),
        (JobFilter(search="timeout", statuses=("failed",)), "error = 'timeout' AND status = 'failed'", True),
        (JobFilter(search=("timeout", "out")), "error = 'timeout'", True),  # every word rare
        (JobFilter(search="node-7"), "error LIKE '%NODE-7'", False),
        (JobFilter(search=("full", "node-7")), "error LIKE '%NODE-7'", False),
        # a rare word and a common one (every job's kind): the common one's matches would all be read to be hashed
        (JobFilter(search=("timeout", "noop")), "error = 'timeout'", False),
    ):
        # When they are paged
        with _statements(env, _newest_first_statement) as seen:
            pages = _pages(env, where, limit=4)
        # Then the pages are exactly the matching jobs, newest first
        assert [j for page in pages for j in page] == _newest_first(env, matching), (where, pages)
        # and after each page's walk, the index answered: a rare search by the ids of its matches, collected and
        # sorted (fenced from the page's order and limit), a common one as PostgreSQL plans it
        from_index = [s for s, _ in seen if "LIMIT %(walk)s" not in s]
        assert len(from_index) == len(pages), from_index
        for statement in from_index:
            collected = "= ANY(%(matched)s)" in statement and "OFFSET 0) AS matches" in statement
            assert collected == rare and ("job_search" in statement) != rare, (where, statement)


def test_a_postgres_count_of_a_search_alone_counts_its_matches_without_looking_up_the_jobs(
    postgres_env: JobEnv,
) -> None:
    # Given 30 jobs, 10 of whose errors say "timeout" and 20 "Disk full on NODE-7"
    env = postgres_env
    _with_errors(env, cancelled_every=4)
    for term, where, expected in (
        ("timeout", JobFilter(search="timeout"), 10),
        ("node-7", JobFilter(search="NODE-7"), 20),
        ("100%", JobFilter(search="100%"), 0),  # LIKE's wildcards are searched as text
        # anything more than the term goes through the jobs table
        ("timeout+status", JobFilter(search="timeout", statuses=("cancelled",)), 3),
    ):
        # When they are counted
        with _statements(env, lambda s: "count(" in s) as seen:
            count = queries.count_jobs(env.engine, where, owner_id="", is_admin=True)
        # Then the count is exact, and a term alone was counted in job_search only
        assert count == expected, term
        (statement,) = [s for s, _ in seen]
        assert ("FROM jobs" not in statement) == (where.statuses == ()), statement
    # and a user's count is scoped to their jobs, so it reads the jobs table
    with _statements(env, lambda s: "count(" in s) as seen:
        mine = queries.count_jobs(env.engine, JobFilter(search="timeout"), owner_id="u0", is_admin=False)
    assert mine == len(_newest_first(env, "error = 'timeout' AND owner_id = 'u0'")) > 0
    assert all("owner_id" in s for s, _ in seen), seen


def test_a_postgres_search_of_a_short_word_among_one_owners_jobs_of_one_status_probes_them_in_page_order(
    postgres_env: JobEnv,
) -> None:
    # Given failed and cancelled jobs of three owners, some of whose errors hold a word of two characters
    env = postgres_env
    ids = _with_errors(env, cancelled_every=4)
    for job_id in ids[::2]:
        env.sql("UPDATE jobs SET error = error || ' 東京' WHERE id = :id", id=job_id)
    rows = env.sql("SELECT id, error, owner_id, status FROM jobs ORDER BY created_at DESC, id DESC")
    where = JobFilter(search="東京", owner_id="u1", statuses=("failed",))
    # When one owner's failed jobs holding it are paged
    with _statements(env, _newest_first_statement) as seen:
        pages = _pages(env, where, limit=1)
    # Then the pages are exactly those jobs, newest first
    expected = [j for j, error, *owned in rows if "東京" in (error or "") and owned == ["u1", "failed"]]
    assert [j for page in pages for j in page] == expected and len(pages) > 1, pages
    # and no page walked the newest jobs first: each was one statement, probing the short-word index
    statements = [s for s, _ in seen]
    assert len(statements) == len(pages), statements
    assert all("job_bigrams" in s and "LIMIT %(walk)s" not in s for s in statements), statements


def test_an_id_prefix_finds_its_jobs_on_both_engines(env: JobEnv) -> None:
    ids = _jobs(env, 12)
    for job_id in ids[:3]:
        prefix = job_id[:5]
        found = [
            r.id for r in queries.page_jobs(env.engine, JobFilter(search=prefix), owner_id="", is_admin=True).items
        ]
        assert job_id in found and all(j.startswith(prefix) for j in found), (prefix, found)
        assert queries.count_jobs(env.engine, JobFilter(search=prefix.upper()), owner_id="", is_admin=True) == len(
            found
        )


@pytest.mark.parametrize("walk_rows", [10_000, 7, 1])
def test_a_page_of_several_statuses_and_a_search_is_exact_however_it_is_found(
    env: JobEnv, monkeypatch: pytest.MonkeyPatch, walk_rows: int
) -> None:
    # Given failed and cancelled jobs with errors, of three owners
    _with_errors(env, cancelled_every=4)
    rows = env.sql("SELECT id, error, owner_id, status FROM jobs ORDER BY created_at DESC, id DESC")
    monkeypatch.setattr(read_store, "SEARCH_WALK_ROWS", walk_rows)
    mixed: list[str] = []
    searched: list[str] = []
    for term, where in (
        ("node-7", JobFilter(search="node-7", statuses=("failed", "interrupted"))),
        ("timeout", JobFilter(search="TIMEOUT", statuses=("failed", "cancelled"))),
        ("node-7", JobFilter(search="NODE-7", statuses=("cancelled", "interrupted"), owner_id="u2")),
    ):
        with _statements(env, _newest_first_statement) as seen:
            pages = _pages(env, where, limit=4)
        # Then the pages are exactly the matching jobs, newest first, whichever way each page was found
        expected = [
            job_id
            for job_id, error, owner, status in rows
            if term in (error or "").lower() and where.owner_id in (None, owner) and status in where.statuses
        ]
        assert [j for page in pages for j in page] == expected and expected, (term, pages)
        # and every page first looked among the newest jobs
        assert len([s for s, _ in seen if "AS jobs WHERE" in s]) == len(pages), seen
        fence = "LIMIT -1" if env.backend == "sqlite" else "OFFSET 0"
        mixed.extend(s for s, _ in seen if fence in s and "AS a0" in s)
        # (PostgreSQL: such a page reads every match once, for all the statuses: no walked arm beside them)
        searched.extend(s for s, _ in seen if fence in s)
    if walk_rows == 7:
        # and some page walked the status the look among the newest jobs found matches of and searched the other's
        # (SQLite), or searched both statuses' in one read of the matches (PostgreSQL)
        if env.backend == "sqlite":
            assert mixed
        else:
            # (from the index, or from the ids of a rare search's matches, found beforehand)
            once = [s.count("job_search") + s.count("= ANY(%(matched)s)") == 1 for s in searched]
            assert searched and not mixed and all(once), searched


def test_a_word_of_one_or_two_ascii_characters_is_an_id_prefix_only_on_both_engines(env: JobEnv) -> None:
    # Given jobs whose error text holds the first two characters of one job's id, and one that says 東京
    ids = _jobs(env, 12)
    term = ids[0][:2]
    for job_id in ids[1:]:
        env.sql(
            "UPDATE jobs SET status = 'failed', completed_at = created_at + 1, error = :e WHERE id = :id",
            id=job_id,
            e=f"x{term}y unable" if job_id != ids[-1] else "東京 timeout",
        )

    def found(where: JobFilter) -> set[str]:
        page = queries.page_jobs(env.engine, where, owner_id="", is_admin=True, limit=100)
        assert queries.count_jobs(env.engine, where, owner_id="", is_admin=True) == len(page.items)
        return {r.id for r in page.items}

    # Then two hex digits (either case) find the jobs whose id starts with them, not the texts holding them
    starting = {j for j in ids if j.startswith(term)}
    assert found(JobFilter(search=term)) == found(JobFilter(search=term.upper())) == starting
    assert found(JobFilter(search=term[0])) == {j for j in ids if j.startswith(term[0])}
    # two other ASCII characters can be no id; a longer word is text, and two characters of another script too
    assert found(JobFilter(search="zq")) == set()
    assert found(JobFilter(search=f"x{term}")) == set(ids[1:-1])
    assert found(JobFilter(search="東京")) == {ids[-1]}
    assert read_store.id_prefix_only("ab") and read_store.id_prefix_only("zq") and not read_store.id_prefix_only("東京")
    assert queries.unsearchable("zq") and not queries.unsearchable("aB") and not queries.unsearchable("東京")
    if env.backend == "sqlite":
        # and a page of one digit (one job id in 16) walks the jobs newest first; two digits read the id's range
        for prefix, route in ((term[0], "SCAN jobs USING INDEX ix_jobs_created"), (term, "SEARCH jobs USING INDEX")):
            with _statements(env, _newest_first_statement) as seen:
                queries.page_jobs(env.engine, JobFilter(search=prefix), owner_id="", is_admin=True, limit=5)
            assert [step.startswith(route) for step in _plan_reads(env, *seen[0])] == [True], (prefix, seen)


@pytest.mark.parametrize("common", [False, True], ids=["rare", "common"])
def test_one_or_two_characters_of_another_script_are_found_through_their_index_on_both_engines(
    env: JobEnv, monkeypatch: pytest.MonkeyPatch, common: bool
) -> None:
    # Given jobs with words of one or two characters outside ASCII: in a resource id at submit, in an error text
    # written later (and rewritten), and a job in plain ASCII; "common": any match makes a term common (SQLite:
    # a page compares the newest jobs row by row instead of sorting the index's matches)
    if common:
        monkeypatch.setattr(read_store, "WALK_MIN_MATCHES", 1)
        monkeypatch.setattr(read_store, "WALK_DENSITY", 10**9)
    env.declare("noop", lambda ctx: None)
    tokyo = env.submit("noop", resource=("room", "東京"), payload={}).id
    cafe = env.submit("noop", resource=("room", "ÉTÉ 2"), payload={}).id
    plain = env.submit("noop", resource=("room", "tokyo"), payload={}).id
    cat = env.submit("noop", payload={}).id
    fixed = env.submit("noop", payload={}).id
    for job_id, error in ((cat, "猫が逃げた"), (fixed, "猫 timeout")):
        env.sql(
            "UPDATE jobs SET status = 'failed', completed_at = created_at + 1, error = :e WHERE id = :id",
            id=job_id,
            e=error,
        )
    env.sql("UPDATE jobs SET error = 'node-7 timeout' WHERE id = :id", id=fixed)
    deleted = env.submit("noop", resource=("room", "東京"), payload={}).id
    env.sql("DELETE FROM jobs WHERE id = :id", id=deleted)

    def found(term: str) -> set[str]:
        where = JobFilter(search=term)
        page = queries.page_jobs(env.engine, where, owner_id="", is_admin=True, limit=100)
        assert queries.count_jobs(env.engine, where, owner_id="", is_admin=True) == len(page.items), term
        return {r.id for r in page.items}

    # Then a pair, a single character (at the start, inside or at the end of a field) and a pair with an ASCII
    # letter (either case) find exactly the jobs that hold them now
    assert found("東京") == {tokyo} and found("京") == {tokyo} and found("東") == {tokyo}
    assert found("猫") == {cat} and found("逃") == {cat} and found("た") == {cat} and found("猫が") == {cat}
    assert found("ÉT") == found("Ét") == found("É") == {cafe}
    assert found("京東") == set()
    # and a page was read from job_bigrams (or a common term's by comparing rows), which holds nothing for a job
    # in plain ASCII or for a deleted one
    rowid = "rowid" if env.backend == "sqlite" else "id"
    with _statements(env, _newest_first_statement) as seen:
        found("東京")
    # (PostgreSQL's page first compares the newest jobs row by row, "AS jobs WHERE")
    indexed = [statement for statement, _ in seen if "AS jobs WHERE" not in statement]
    compared = common and env.backend == "sqlite"
    assert indexed and all(("job_bigrams" in s) != compared and ("instr(" in s) == compared for s in indexed), seen
    job = "job" if env.backend == "sqlite" else "job_id"
    held = {r[0] for r in env.sql(f"SELECT DISTINCT j.id FROM job_bigrams AS b JOIN jobs AS j ON j.{rowid} = b.{job}")}
    assert held == {tokyo, cafe, cat} and plain not in held
    assert env.sql(f"SELECT count(*) FROM job_bigrams WHERE {job} NOT IN (SELECT {rowid} FROM jobs)")[0][0] == 0


ERRORS = ("Disk full on NODE-7", "disk read 50% done", "node_7 timeout", "timeout on NODE-7 disk")
#: Stands for the first six characters of the sixth job's id: a word that is an id prefix too.
ID_PREFIX = "<id prefix>"


@pytest.mark.parametrize(
    "words",
    [("disk", "node-7"), ("50%", "disk"), ("node_7",), ("node_7", "timeout"), ("TIMEOUT", "Disk"), (ID_PREFIX, "disk")],
)
def test_several_words_find_the_jobs_holding_every_one_on_both_engines(env: JobEnv, words: tuple[str, ...]) -> None:
    ids = _jobs(env, 24)
    for i, job_id in enumerate(ids):
        env.sql(
            "UPDATE jobs SET status = 'failed', completed_at = created_at + 1, error = :e WHERE id = :id",
            id=job_id,
            e=ERRORS[i % 4],
        )
    words = tuple(ids[5][:6] if w == ID_PREFIX else w for w in words)

    def holds(i: int, word: str) -> bool:
        return ids[i].startswith(word.lower()) or word.lower() in ERRORS[i % 4].lower()

    expected = {ids[i] for i in range(len(ids)) if all(holds(i, w) for w in words)}
    assert expected  # every case finds some jobs, and (below) not all of them
    pages = _pages(env, JobFilter(search=words), limit=3)
    assert [j for p in pages for j in p] == [j for j in _newest_first(env, "1 = 1") if j in expected]
    assert queries.count_jobs(env.engine, JobFilter(search=words), owner_id="", is_admin=True) == len(expected) < 24


def test_the_activity_chart_reads_one_covering_index_range(sqlite_env: JobEnv) -> None:
    env = sqlite_env
    for job_id in _jobs(env, 4):
        env.sql("UPDATE jobs SET status = 'failed', completed_at = created_at + 1 WHERE id = :id", id=job_id)
    with _statements(env, lambda s: s.startswith("WITH f AS")) as seen:
        buckets = queries.activity(
            env.engine, since=datetime.now(UTC) - timedelta(minutes=5), bucket_s=60, owner_id=None, is_admin=True
        )
    assert sum(b.failed for b in buckets) == 4
    ((statement, parameters),) = seen
    reads = _plan_reads(env, statement, parameters)
    assert reads == ["SEARCH jobs USING COVERING INDEX ix_jobs_finished_times (completed_at>? AND completed_at<?)"], (
        reads
    )


def test_a_count_of_one_status_and_kind_reads_one_covering_index_range(sqlite_env: JobEnv) -> None:
    env = sqlite_env
    env.declare("render", lambda ctx: None)
    ids = _jobs(env, 6) + [env.submit("render", owner_id="u1").id for _ in range(4)]
    for job_id in ids[::2]:
        env.sql("UPDATE jobs SET status = 'failed', completed_at = created_at + 1 WHERE id = :id", id=job_id)
    with _statements(env, lambda s: s.startswith("SELECT count(*) FROM jobs WHERE")) as seen:
        count = queries.count_jobs(
            env.engine, JobFilter(statuses=("failed",), kind="render"), owner_id="", is_admin=True
        )
    assert count == len(env.sql("SELECT id FROM jobs WHERE status = 'failed' AND kind = 'render'")) == 2
    ((statement, parameters),) = seen
    assert _plan_reads(env, statement, parameters) == [
        "SEARCH jobs USING COVERING INDEX ix_jobs_status_kind (status=? AND kind=?)"
    ]


def test_postgres_plans_every_list_and_count_for_its_own_values(postgres_env: JobEnv) -> None:
    env = postgres_env
    _with_errors(env)
    # When the same page and count run 18 times (psycopg prepares a statement after its fifth run, and
    # PostgreSQL weighs a generic plan after five custom ones)
    for term in ("disk", "node", "time", "full", "out", "zzz") * 3:
        queries.page_jobs(env.engine, JobFilter(search=(term,)), owner_id="", is_admin=True, limit=4)
        queries.count_jobs(env.engine, JobFilter(search=(term,)), owner_id="", is_admin=True)
    # Then PostgreSQL planned them for each search term, never with a generic plan blind to its matches
    with env.engine.connect() as conn:  # the pool's one connection, which prepared them
        plans = conn.exec_driver_sql(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE strpos(statement, 'job_search') > 0"
        ).fetchall()
    assert plans and sum(custom for _, custom in plans) >= 8, plans
    assert all(generic == 0 for generic, _ in plans), plans
