"""All SQL of the job layer's read side: filtered lists, text search, exact counts, activity, the change feed.

Every filter the API and the UI offer is a predicate here (:func:`_where`), so a page, a count and a
bulk action see exactly the same jobs, at any table size:

- statuses (one or several), kind, queue, owner, created range: plain predicates; a page is
  ``ORDER BY created_at DESC, id DESC`` after a ``(created_at, id)`` row-value cursor (an index range);
  with several statuses, the newest of each status merged (one index range per status);
- text search: each term an id prefix, or a case-insensitive substring of kind, resource type/id, summary or
  error text; a term of one or two ASCII characters an id prefix only (:func:`id_prefix_only`), of one or two
  characters with one outside ASCII (東京) the ``job_bigrams`` index of both engines. Three characters or more:
  SQLite's ``jobs_search`` FTS5 trigram index (on SQLite, a page of a term that many jobs match compares rows);
  PostgreSQL's ``job_search`` with its ``pg_trgm`` index, after a page has looked for its rows among the newest
  jobs row by row (:data:`SEARCH_WALK_ROWS`);
- activity: per time bucket (and queue or kind), counts by outcome and nearest-rank percentiles
  (the value at rank ``ceil(p·n)``: a p95 is always one of the jobs' durations, never above the
  slowest), on both engines the same definition and statement (PostgreSQL's ``percentile_disc``,
  SQLite's ``activity_durations`` of :mod:`jobs.sqlite_aggregates`).

The change feed's position is the commit order of ``job_events``: SQLite's ``rowid`` (one writer at a
time allocates it inside its transaction), PostgreSQL's ``(change_xid, change_id)`` read only below
the oldest running transaction of this database (see revision 0009). On PostgreSQL the order across
jobs is that of transaction ids; within a job it is commit order, because an event's ``change_xid`` is
never below its job's previous event's (revision 0012).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Connection, bindparam, text

from .status import TERMINAL_STATUSES
from .store import JOB_COLUMNS, JobRow, _job

_TERMINAL = frozenset(str(s) for s in TERMINAL_STATUSES)
_HEX = re.compile(r"[0-9a-f]{1,32}")
#: The FTS5 trigram tokenizer matches substrings of at least this many characters.
TRIGRAM = 3
#: A search term is common (a page walks the jobs instead of sorting every match) when one job in this
#: many matches it, or at least :data:`WALK_MIN_MATCHES` do: a page then compares ~50 × this many rows at
#: most, and a rarer term has few enough matches to sort.
WALK_DENSITY = 200
WALK_MIN_MATCHES = 1000
#: PostgreSQL: a searched page first looks at most this many of the newest jobs (after its cursor), comparing
#: each row; only when they hold less than a page does it ask the trigram index (see :func:`job_list`).
SEARCH_WALK_ROWS = 10_000
#: ... and this many times as many for an id prefix alone of two hex digits, which one job in 256 matches: the
#: newest 10,000 hold 39 on average, less than a page of 50, and reading the prefix's range instead looks up
#: each of its matches on a heap page of its own (3,900 at 1M jobs; p99 125 ms on a cold cache), where the
#: newest jobs' pages are the ones in memory. Three times as many rows hold 117 on average.
PREFIX_WALK_FACTOR = 3
#: PostgreSQL: a search whose every word has fewer matches than this has its page collected from them and
#: sorted (see :func:`_rare_matches`).
FEW_MATCHES = 2_000
#: ``job_search.body`` computed from a job's own row (revision 0009's ``jobs_search_sync``): comparing it is
#: what the trigram index answers, row by row.
_PG_ROW_BODY = "lower(concat_ws(E'\\n', kind, resource_type, resource_id, summary, error))"


@dataclass(frozen=True)
class JobFilterSQL:
    """The filters of a list, count or bulk action, as the store takes them (times in ms)."""

    owner_id: str | None = None
    statuses: tuple[str, ...] = ()
    kind: str | None = None
    queue: str | None = None
    created_after: int | None = None
    created_before: int | None = None
    #: Text search terms; a job matches when it matches every one of them.
    search: tuple[str, ...] = ()
    parent_job_id: str | None = None
    #: Only jobs that are no workflow step (a grouped list shows the steps under their workflow).
    top_level: bool = False


#: One owner's jobs, and the same predicate written so that SQLite reads no index for it (see :func:`_by_status`).
_OWNER, _OWNER_UNINDEXED = "owner_id = :owner", "+owner_id = :owner"
#: :func:`_by_status` counts at most this many entries of each index range (a covering range: ~1 ms on SQLite).
PROBE_ENTRIES = 20_000


def _plan_for_these_values(conn: Connection) -> None:
    """PostgreSQL: plan the rest of this transaction's statements for their parameter values. psycopg prepares
    a statement after its fifth run, and PostgreSQL may settle, after five custom plans, on a generic plan, blind
    to how many jobs a search term or a filter value matches (at 1M jobs, a page searching "connection refused"
    went from 49 to 126 ms from its sixth run on: ``docs/benchmarks.md``). Planning costs well under a
    millisecond here."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SET LOCAL plan_cache_mode = force_custom_plan"))


def _by_status(conn: Connection, f: JobFilterSQL) -> bool:
    """Whether one owner's jobs of one finished status are read from the status's range of
    ``ix_jobs_finished_created`` rather than the owner's of ``ix_jobs_owner_created`` (SQLite; both are newest
    first). SQLite has no statistics to tell which range is shorter, so both are counted, at most
    :data:`PROBE_ENTRIES` entries each; the owner's is read unless the status's is shorter. A rare status of
    an owner with many jobs (47 interrupted ``notify_email`` jobs among one owner's 71,000, a page: 77 → 16 ms)
    goes by status; one user's few jobs among millions of one status by owner."""
    if conn.dialect.name != "sqlite" or f.owner_id is None or len(f.statuses) != 1 or f.statuses[0] not in _TERMINAL:
        return False
    of_status = conn.execute(
        text("SELECT count(*) FROM (SELECT 1 FROM jobs WHERE status = :s AND completed_at IS NOT NULL LIMIT :n)"),
        {"s": f.statuses[0], "n": PROBE_ENTRIES},
    ).scalar_one()
    if of_status >= PROBE_ENTRIES:
        return False
    of_owner = conn.execute(
        text("SELECT count(*) FROM (SELECT 1 FROM jobs WHERE owner_id = :o LIMIT :n)"),
        {"o": f.owner_id, "n": PROBE_ENTRIES},
    ).scalar_one()
    return int(of_status) < int(of_owner)


def _status_terms(
    sqlite: bool, f: JobFilterSQL, placeholders: list[str], *, by_status: bool = False, listing: bool = True
) -> list[str]:
    """The predicates of a status filter over *placeholders* (one per status of ``f.statuses``); *by_status*:
    see :func:`_by_status`; *listing*: for a page rather than a count."""
    # Otherwise one owner's jobs come from the owner's index (``+status`` keeps SQLite's planner, which has no
    # statistics, off the status indexes: one user's few jobs among millions of that status).
    column = "+status" if sqlite and f.owner_id is not None and not by_status else "status"
    terms = [f"{column} = {placeholders[0]}" if len(placeholders) == 1 else f"{column} IN ({', '.join(placeholders)})"]
    if set(f.statuses) <= _TERMINAL and (listing or by_status):
        # Implied by the statuses (a CHECK constraint); spelled out so ix_jobs_finished_created applies: a page
        # walks it newest first, and :func:`_by_status` chose its range. A count reads ix_jobs_status_kind
        # instead, which holds status and kind but not completed_at: with the term, PostgreSQL visited every
        # counted job in the table (31,357 failed render_clip jobs of 1M: 116-163 ms, without it 3-5 ms).
        terms.append("completed_at IS NOT NULL")
    return terms


def _where(
    conn: Connection, f: JobFilterSQL, *, listing: bool = False, rowwise: bool = False
) -> tuple[list[str], dict[str, Any]]:
    """The predicates of *f* and their parameters. *listing*: for a page (newest first, a few rows),
    where a text search may walk the order instead of collecting every match (see :func:`_search`);
    *rowwise*: every search term compared row by row."""
    sqlite = conn.dialect.name == "sqlite"
    by_status = _by_status(conn, f)
    where: list[str] = []
    params: dict[str, Any] = {}
    if f.owner_id is not None:
        where.append(_OWNER_UNINDEXED if by_status else _OWNER)
        params["owner"] = f.owner_id
    if f.statuses:
        names = [f"s{i}" for i in range(len(f.statuses))]
        params.update(zip(names, f.statuses, strict=True))
        where.extend(_status_terms(sqlite, f, [":" + n for n in names], by_status=by_status, listing=listing))
    if f.kind is not None:
        where.append("kind = :kind")
        params["kind"] = f.kind
    if f.queue is not None:
        where.append("queue_name = :queue")
        params["queue"] = f.queue
    if f.parent_job_id is not None:
        where.append("parent_job_id = :parent")
        params["parent"] = f.parent_job_id
    if f.top_level:
        where.append("parent_job_id IS NULL")
    if f.created_after is not None:
        where.append("created_at >= :created_after")
        params["created_after"] = f.created_after
    if f.created_before is not None:
        where.append("created_at < :created_before")
        params["created_before"] = f.created_before
    for n, term in enumerate(f.search):
        clause, search_params = _search(conn, term, f"t{n}_", walk=rowwise or (listing and _common(conn, term)))
        where.append(clause)
        params.update(search_params)
    return where or ["1 = 1"], params


def _fts(q: str) -> str:
    """*q* as one FTS5 phrase: with the trigram tokenizer, a case-insensitive substring."""
    return '"' + q.replace('"', '""') + '"'


def _common(conn: Connection, q: str) -> bool:
    """Whether at least one job in :data:`WALK_DENSITY` matches *q*'s text search (SQLite: an ASCII term, or one
    of one or two characters; an id prefix of one digit always does): then a page finds its rows sooner by
    walking the jobs newest first and comparing each than by collecting and sorting every match
    (``transcribe`` matched 300,000 of 1M jobs: 2 s to sort them for 50; bench/queries_bench.py)."""
    if conn.dialect.name != "sqlite":
        return False
    if id_prefix_only(q):
        # One hex digit starts one job id in 16: a page finds its rows among the newest ~800 jobs, where the
        # primary key's range is 62,500 jobs of 1M to sort (160-240 ms). Two digits: 3,900 to sort (13 ms).
        return len(q) == 1
    if len(q) >= TRIGRAM and not q.isascii():
        # (the row-by-row comparison folds ASCII case only, the trigram index all of Unicode)
        return False
    jobs = int(conn.execute(text("SELECT coalesce(max(rowid), 0) FROM jobs")).scalar_one())
    enough = max(WALK_MIN_MATCHES, jobs // WALK_DENSITY)
    if len(q) < TRIGRAM:
        # ("–" is in every render_clip job's summary: 400,000 of 1M jobs to sort for a page)
        matches, params = f"SELECT 1 FROM job_bigrams WHERE {_pairs(True, 'gram')}", {"gram": q}
    else:
        matches, params = "SELECT 1 FROM jobs_search WHERE jobs_search MATCH :fts", {"fts": _fts(q)}
    found = conn.execute(text(f"SELECT count(*) FROM ({matches} LIMIT :n)"), {**params, "n": enough}).scalar_one()
    return int(found) >= enough


def _pairs(sqlite: bool, name: str) -> str:
    """The condition on ``job_bigrams`` (revision 0021) of a term of one or two characters, one of them outside
    ASCII, bound to *name*: a pair is one key, one character the keys it starts (every character in the
    searched text is followed by another or by a line break). The database's own ``lower`` folds the term,
    as it folded the stored pairs."""
    term = f"lower(:{name})"
    return f"gram >= {term} AND gram < {term} || {'char' if sqlite else 'chr'}(1114111)"


def id_prefix_only(q: str) -> bool:
    """Whether the search term *q* matches only as the start of a job id: one or two ASCII characters.

    Neither trigram index can find a shorter string, so such a term was compared with every job that might
    match, all of them when few do (``zq`` at 1M jobs: 1.2 s on SQLite). Words that short are id prefixes or
    noise in ASCII text; in scripts that write a word in two characters (東京) they are words, and are still
    searched as text."""
    return len(q) < TRIGRAM and q.isascii()


def unsearchable(q: str) -> bool:
    """Whether the search term *q* can match no job: :func:`id_prefix_only`, and not hex digits."""
    return id_prefix_only(q) and _HEX.fullmatch(q.lower()) is None


def _search(conn: Connection, q: str, p: str, *, walk: bool = False) -> tuple[str, dict[str, Any]]:
    """An id prefix, or a substring of the searched fields (see the module docstring); the parameter
    names start with *p* (one term's names differ from another's). *walk*: compare each row instead of
    asking the trigram index (SQLite: for a term :func:`_common` found common; PostgreSQL: see :func:`job_list`)."""
    sqlite = conn.dialect.name == "sqlite"
    params: dict[str, Any] = {}
    terms: list[str] = []
    if unsearchable(q):
        return "(1 = 0)", params
    prefix = q.lower()
    by_id = _HEX.fullmatch(prefix) is not None
    if by_id:
        # ids are lower-case hex: a prefix is an index range of the primary key
        params[f"{p}id_lo"], params[f"{p}id_hi"] = _id_range(prefix)
    if id_prefix_only(q):
        column = "+id" if sqlite and walk else "id"  # walking: the primary key is no index of this search
        return f"({column} >= :{p}id_lo AND {column} < :{p}id_hi)", params
    if len(q) < TRIGRAM and not walk:
        params[f"{p}gram"] = q
        job = "rowid IN (SELECT job" if sqlite else "id IN (SELECT job_id"
        return f"({job} FROM job_bigrams WHERE {_pairs(sqlite, f'{p}gram')}))", params
    if by_id and sqlite:
        terms.append(f"(id >= :{p}id_lo AND id < :{p}id_hi)")
    if sqlite:
        if len(q) >= TRIGRAM and not walk:
            terms.append(f"rowid IN (SELECT rowid FROM jobs_search WHERE jobs_search MATCH :{p}fts)")
            params[f"{p}fts"] = _fts(q)
        else:
            fields = " || char(10) || ".join(
                f"coalesce({c}, '')" for c in ("kind", "resource_type", "resource_id", "summary", "error")
            )
            # (lowered by SQLite, as the stored pairs are: the same jobs as through ``job_bigrams``)
            terms.append(f"instr(lower({fields}), lower(:{p}needle)) > 0")
            params[f"{p}needle"] = q
    else:
        params[f"{p}like"] = _like(q)
        if walk:
            terms.append(f"{_PG_ROW_BODY} LIKE :{p}like")
            if by_id:
                terms.append(f"(id >= :{p}id_lo AND id < :{p}id_hi)")
        else:
            # One set of ids from both sources: "id range OR id IN (…)" made PostgreSQL walk every job
            # newest first testing both (1 s for a 4-digit prefix at 1M jobs; bench/queries_bench.py).
            sources = [f"SELECT job_id FROM job_search WHERE body LIKE :{p}like"]
            if by_id:
                sources.append(f"SELECT id FROM jobs WHERE id >= :{p}id_lo AND id < :{p}id_hi")
            terms.append(f"id IN ({' UNION ALL '.join(sources)})")
    return "(" + " OR ".join(terms) + ")", params


def _id_range(prefix: str) -> tuple[str, str]:
    """The primary key's range of the job ids starting with the hex digits *prefix*."""
    return prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)


def _like(q: str) -> str:
    """PostgreSQL: the LIKE pattern of the substring *q* in ``job_search.body`` (stored lower-cased)."""
    return "%" + re.sub(r"([\\%_])", r"\\\1", q.lower()) + "%"


_NEWEST = "ORDER BY created_at DESC, id DESC LIMIT :limit"


def _after(where: list[str], params: dict[str, Any], before: tuple[int, str] | None) -> None:
    """Adds to *where* (and *params*) "after the ``(created_at, id)`` position *before*", if there is one."""
    if before is not None:
        # A row value, not "a < x OR (a = x AND b < y)": both engines turn it into an index range, where
        # the OR made SQLite walk the index from the newest job to the cursor on every page.
        where.append("(created_at, id) < (:b_created, :b_id)")
        params["b_created"], params["b_id"] = before


def job_list(conn: Connection, f: JobFilterSQL, *, before: tuple[int, str] | None, limit: int) -> list[JobRow]:
    """The matching jobs newest first, after the ``(created_at, id)`` position *before*, at most *limit*."""
    _plan_for_these_values(conn)
    several = len(f.statuses) > 1
    sqlite = conn.dialect.name == "sqlite"
    searched_first: tuple[str, ...] = ()
    # SQLite: only for several statuses (one status has its own rule, :func:`_common`), and ASCII terms (the
    # row-by-row comparison folds ASCII case only, the trigram index all of Unicode). PostgreSQL: not for a
    # word of one or two characters among one owner's jobs of one status: ix_jobs_owner_status_created hands
    # those over newest first, each probed in ``job_bigrams`` by its id, in page order (one user's '0–' among
    # their 6,417 failed jobs of 1M, 44 of them in their newest 10,000 jobs: a walk 52 ms, the probes 17 ms).
    probed = not sqlite and _owner_status(f) and all(len(t) < TRIGRAM for t in f.search)
    #: PostgreSQL: the ids of every match of a rare search (see :func:`_rare_matches`), or None.
    matched: list[str] | None = None
    if f.search and ((not sqlite and not probed) or (several and all(t.isascii() for t in f.search))):
        found = _search_newest(conn, f, before=before, limit=limit)
        if len(found) == limit:
            return found
        # Less than a page: *found* is every match among the newest jobs. A status none of them had is one the
        # term is rare in (or absent from), whose newest jobs would be probed down to the oldest for a match:
        # "ffmpeg" is in none of 49,484 cancelled jobs (0.5 s). Its matches come from the trigram index instead.
        # A status with matches there is walked newest first as without a search: "render" is in 40 % of the
        # jobs, and collecting every match to sort took 0.7 s for a bulk action's page of 500.
        seen = {r.status for r in found}
        searched_first = tuple(s for s in f.statuses if s not in seen) if several else ()
        if not sqlite:
            # PostgreSQL reads every match for the statuses searched first anyway; a walked status's arm read them
            # all once more ("ffmpeg" in failed, cancelled or interrupted jobs: two reads of 11,134 matches,
            # 220 ms). So one read serves every status, as it does when the search is rare.
            matched = None if searched_first else _rare_matches(conn, f.search)
            if searched_first or (several and matched is not None):
                searched_first = f.statuses
    listed = f if matched is None else replace(f, search=())
    where, params = _where(conn, replace(listed, statuses=()) if several else listed, listing=True)
    if matched is not None:
        # the search, answered: the page reads none of its indexes again
        where.append("id = ANY(:matched)")
        params["matched"] = matched
    _after(where, params, before)
    params["limit"] = limit
    if not several:
        sql = f"SELECT {JOB_COLUMNS} FROM jobs WHERE {' AND '.join(where)}"
        # (the fence: see the several statuses' "matches" arm below)
        sql = f"SELECT * FROM ({sql} OFFSET 0) AS matches {_NEWEST}" if matched is not None else f"{sql} {_NEWEST}"
    else:
        # Several statuses: the newest *limit* of each status (each an index range in order, as for one
        # status), merged. "status IN (…)" made both engines collect and sort every job of those statuses
        # (140,000 failed, cancelled and interrupted of 1M jobs: 1.4 s for a page).
        arms = []
        for i, status in enumerate(s for s in f.statuses if s not in searched_first):
            params[f"s{i}"] = status
            one = replace(f, statuses=(status,))
            by_status = _by_status(conn, one)
            arm = [_OWNER_UNINDEXED if by_status and term == _OWNER else term for term in where]
            terms = " AND ".join([*arm, *_status_terms(sqlite, one, [f":s{i}"], by_status=by_status)])
            arms.append(f"SELECT * FROM (SELECT {JOB_COLUMNS} FROM jobs WHERE {terms} {_NEWEST}) AS a{i}")
        if searched_first:
            names = [f"r{i}" for i in range(len(searched_first))]
            params.update(zip(names, searched_first, strict=True))
            rare = replace(f, statuses=searched_first)
            # every match from the index (SQLite: even of a term :func:`_common` would walk the jobs for)
            indexed = where
            if sqlite:
                indexed, indexed_params = _where(conn, replace(f, statuses=()))
                _after(indexed, indexed_params, before)
                params.update(indexed_params)
            terms = " AND ".join([*indexed, *_status_terms(sqlite, rare, [":" + n for n in names])])
            # A fence with no limit keeps the page's order and limit out of this inner query's plan, so it is
            # planned to find all the matches (SQLite takes no OFFSET without a LIMIT, PostgreSQL no LIMIT -1)
            fence = "LIMIT -1" if sqlite else "OFFSET 0"
            arms.append(f"SELECT * FROM (SELECT {JOB_COLUMNS} FROM jobs WHERE {terms} {fence}) AS matches")
        sql = f"SELECT * FROM ({' UNION ALL '.join(arms)}) AS u {_NEWEST}"
    return [r for r in map(_job, conn.execute(text(sql), params).fetchall()) if r is not None]


def _rare_matches(conn: Connection, terms: tuple[str, ...]) -> list[str] | None:
    """PostgreSQL: the ids of the jobs matching every term of *terms* when each term is one ``job_search`` answers
    (three characters or more) with fewer than :data:`FEW_MATCHES` matches (an id prefix's jobs included, as
    :func:`_search` has them), else None. Then a page the newest jobs left short is collected from those ids and
    sorted: the planner's estimate of a trigram search is blind to the term (8,108 jobs for each of
    "room-1678/", 36 matches, and "ffmpeg", 11,134), and took it for common enough to walk every job newest
    first probing each (2.2 s for those 36 at 1M jobs). A page with one common word stays the planner's: all of
    that word's matches would be read to be hashed."""
    found: set[str] | None = None
    for q in terms:
        if len(q) < TRIGRAM:
            return None
        sources = ["SELECT job_id FROM job_search WHERE body LIKE :like"]
        params: dict[str, Any] = {"like": _like(q), "n": FEW_MATCHES}
        if _HEX.fullmatch(q.lower()) is not None:
            sources.append("SELECT id FROM jobs WHERE id >= :lo AND id < :hi")
            params["lo"], params["hi"] = _id_range(q.lower())
        rows = conn.execute(text(f"{' UNION ALL '.join(sources)} LIMIT :n"), params).fetchall()
        if len(rows) >= FEW_MATCHES:
            return None
        ids = {r[0] for r in rows}
        found = ids if found is None else found & ids
    return sorted(found or ())


def _owner_status(f: JobFilterSQL) -> bool:
    """Whether *f* asks for one owner's jobs of one status (on PostgreSQL an index range, newest first)."""
    return f.owner_id is not None and len(f.statuses) == 1


def _search_newest(conn: Connection, f: JobFilterSQL, *, before: tuple[int, str] | None, limit: int) -> list[JobRow]:
    """PostgreSQL (SQLite: with several statuses): the page of a search among the :data:`SEARCH_WALK_ROWS`
    newest jobs after *before*, each compared row by row. When it is full it is the page: every job outside
    those is older than all of them.

    The trigram index is no good at finding a page of a term many jobs match: it hands over every match (11,134
    for ``ffmpeg`` of 1M jobs), which are then looked up and sorted, and whether PostgreSQL plans that or a
    walk of the jobs depends on its estimate of the matches (80 for those 11,134; 145 ms). Walking is bounded
    here by the rows looked at, not the matches, so a rare term costs this walk (~11 ms) before the index."""
    where, params = _where(conn, f, listing=True, rowwise=True)
    # The newest jobs of one owner are an index range in order too (ix_jobs_owner_created), and on PostgreSQL
    # those of one owner and one status (ix_jobs_owner_status_created); other filters are applied to what was
    # walked, so the walk never reads more than its rows, however few jobs pass them.
    newest = [_OWNER] if f.owner_id is not None else []
    if conn.dialect.name == "postgresql" and _owner_status(f):
        newest.append("status = :walk_status")
        params["walk_status"] = f.statuses[0]
    _after(newest, params, before)
    two_digits = all(id_prefix_only(t) and len(t) == 2 for t in f.search)
    params["walk"], params["limit"] = SEARCH_WALK_ROWS * (PREFIX_WALK_FACTOR if two_digits else 1), limit
    sql = (
        f"SELECT {JOB_COLUMNS} FROM (SELECT * FROM jobs WHERE {' AND '.join(newest) or 'true'} "
        f"ORDER BY created_at DESC, id DESC LIMIT :walk) AS jobs WHERE {' AND '.join(where)} {_NEWEST}"
    )
    return [r for r in map(_job, conn.execute(text(sql), params).fetchall()) if r is not None]


def job_steps_of(conn: Connection, parent_ids: list[str], owner_id: str | None) -> list[JobRow]:
    """The steps of the workflows *parent_ids* (of *owner_id*'s jobs if given), oldest first."""
    if not parent_ids:
        return []
    owner = " AND owner_id = :owner" if owner_id is not None else ""
    sql = f"SELECT {JOB_COLUMNS} FROM jobs WHERE parent_job_id IN :parents{owner} ORDER BY created_at, id"
    rows = conn.execute(
        text(sql).bindparams(bindparam("parents", expanding=True)), {"parents": parent_ids, "owner": owner_id}
    ).fetchall()
    return [r for r in map(_job, rows) if r is not None]


def step_edges(conn: Connection, step_ids: list[str]) -> list[tuple[str, str]]:
    """The ``(step, step it runs after)`` edges among *step_ids*."""
    if not step_ids:
        return []
    sql = "SELECT job_id, depends_on_job_id FROM job_dependencies WHERE job_id IN :ids AND depends_on_job_id IN :ids"
    rows = conn.execute(text(sql).bindparams(bindparam("ids", expanding=True)), {"ids": step_ids}).fetchall()
    return [(str(a), str(b)) for a, b in rows]


def job_count(conn: Connection, f: JobFilterSQL) -> int:
    """How many jobs match, exactly."""
    _plan_for_these_values(conn)
    if _only_text(conn, f):
        # ``job_search`` holds one row per job (its key, a foreign key to jobs): the matches are the count, and
        # looking each up in jobs doubled its cost ("ffmpeg": 11,134 index probes, 71 of 100 ms).
        sql = "SELECT count(*) FROM job_search WHERE body LIKE :like"
        return int(conn.execute(text(sql), {"like": _like(f.search[0])}).scalar_one())
    where, params = _where(conn, f)
    return int(conn.execute(text(f"SELECT count(*) FROM jobs WHERE {' AND '.join(where)}"), params).scalar_one())


def _only_text(conn: Connection, f: JobFilterSQL) -> bool:
    """PostgreSQL: whether *f* is nothing but one search term that only ``job_search`` answers (three
    characters or more, and no id prefix)."""
    if conn.dialect.name != "postgresql" or len(f.search) != 1 or replace(f, search=()) != JobFilterSQL():
        return False
    q = f.search[0]
    return len(q) >= TRIGRAM and _HEX.fullmatch(q.lower()) is None


# -- activity ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ActivityRow:
    """Finished jobs of one bucket (and group): counts by outcome, durations in ms."""

    bucket: int
    group: str | None
    succeeded: int
    failed: int
    cancelled: int
    interrupted: int
    wait_p50_ms: int | None
    run_p50_ms: int | None
    run_p95_ms: int | None
    run_max_ms: int | None


_GROUPS = {None: "NULL", "queue": "queue_name", "kind": "kind"}


def job_activity(
    conn: Connection,
    *,
    since: int,
    until: int,
    bucket_ms: int,
    owner_id: str | None,
    group_by: str | None = None,
) -> list[ActivityRow]:
    """Jobs that finished in ``[since, until)``, by bucket ``(completed_at - since) // bucket_ms`` and group
    (``queue``, ``kind`` or none). Buckets without finished jobs are absent."""
    _plan_for_these_values(conn)
    group = _GROUPS[group_by]
    owner = " AND owner_id = :owner" if owner_id is not None else ""
    finished = (
        f"SELECT (completed_at - :since) / :bucket AS b, {group} AS g, status, "
        "CASE WHEN started_at IS NOT NULL THEN started_at - created_at END AS wait, "
        "CASE WHEN started_at IS NOT NULL THEN completed_at - started_at END AS run FROM jobs "
        # Finished jobs are those with a completed_at (a CHECK constraint): one range of
        # ix_jobs_finished_times, which holds every column read here (revision 0016).
        f"WHERE completed_at IS NOT NULL AND completed_at >= :since AND completed_at < :until{owner}"
    )
    counts = (
        "sum(CASE WHEN status = 'succeeded' THEN 1 ELSE 0 END) AS ok, "
        "sum(CASE WHEN status = 'failed' THEN 1 ELSE 0 END) AS failed, "
        "sum(CASE WHEN status = 'cancelled' THEN 1 ELSE 0 END) AS cancelled, "
        "sum(CASE WHEN status = 'interrupted' THEN 1 ELSE 0 END) AS interrupted, max(run) AS runmax"
    )
    # One pass over the finished jobs grouped by bucket and group; the percentiles skip the jobs that never
    # ran (cancelled while queued): counted, not timed.
    if conn.dialect.name == "postgresql":
        sql = (
            f"WITH f AS ({finished}) SELECT b, g, ok, failed, cancelled, interrupted, wait50, run50, run95, runmax "
            f"FROM (SELECT b, g, {counts}, percentile_disc(0.5) WITHIN GROUP (ORDER BY wait) AS wait50, "
            "percentile_disc(0.5) WITHIN GROUP (ORDER BY run) AS run50, "
            "percentile_disc(0.95) WITHIN GROUP (ORDER BY run) AS run95 FROM f GROUP BY b, g) AS a ORDER BY b, g"
        )
    else:
        sql = (
            f"WITH f AS ({finished}) SELECT b, g, ok, failed, cancelled, interrupted, "
            "json_extract(d, '$[0]') AS wait50, json_extract(d, '$[1]') AS run50, "
            "json_extract(d, '$[2]') AS run95, runmax "
            # activity_durations: jobs.sqlite_aggregates (nearest rank, as percentile_disc)
            f"FROM (SELECT b, g, {counts}, activity_durations(wait, run) AS d FROM f GROUP BY b, g) ORDER BY b, g"
        )
    rows = conn.execute(text(sql), {"since": since, "until": until, "bucket": bucket_ms, "owner": owner_id}).fetchall()
    return [
        ActivityRow(
            int(r[0]),
            r[1],
            int(r[2]),
            int(r[3]),
            int(r[4]),
            int(r[5]),
            *(None if v is None else int(v) for v in r[6:10]),
        )
        for r in rows
    ]


# -- the change feed ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChangeRow:
    """One event of the change feed, with its position and its job's current state."""

    position: tuple[int, int]
    job_id: str
    owner_id: str
    sequence: int
    type: str
    data: str
    status: str
    progress: float | None
    progress_message: str | None
    created_at: int


_CHANGE_COLUMNS = (
    "e.job_id, j.owner_id, e.sequence, e.type, e.data, j.status, j.progress, j.progress_message, e.created_at"
)


def event_changes_after(
    conn: Connection, after: tuple[int, int], owner_id: str | None, limit: int
) -> tuple[list[ChangeRow], tuple[int, int]]:
    """Events after position *after* (oldest first, at most *limit*, of *owner_id*'s jobs if given) and the
    position every event up to which was examined (the head when fewer than *limit* came back).

    SQLite positions are ``(rowid, 0)``: one writer at a time allocates rowids inside its transaction,
    so a reader's snapshot holds a prefix of them. PostgreSQL positions are ``(change_xid, change_id)``,
    read only below the oldest transaction of this database still running (:data:`_PG_HORIZON`: every
    older one has ended, every later one has a larger xid): nothing can commit behind a position once it
    was handed out. With *owner_id* this reads ``ix_job_events_owner``: that owner's events only, however
    many other owners' events lie in between.
    """
    owner = _owner_events(conn, owner_id)
    params: dict[str, Any] = {"a": after[0], "b": after[1], "owner": owner_id, "limit": limit}
    if conn.dialect.name == "sqlite":
        head = int(conn.execute(text("SELECT coalesce(max(rowid), 0) FROM job_events")).scalar_one())
        params["head"] = head
        rows = conn.execute(
            text(
                f"SELECT e.rowid, 0, {_CHANGE_COLUMNS} FROM job_events e JOIN jobs j ON j.id = e.job_id "
                f"WHERE e.rowid > :a AND e.rowid <= :head{owner} ORDER BY e.rowid LIMIT :limit"
            ),
            params,
        ).fetchall()
        end = (head, 0)
    else:
        # The horizon first, the events below it next: every transaction older than the horizon had ended
        # when it was read, so the later snapshot of the second statement holds all of their events.
        horizon = head_position(conn)[0] + 1
        params["horizon"] = horizon
        rows = conn.execute(
            text(
                f"SELECT e.change_xid, e.change_id, {_CHANGE_COLUMNS} FROM job_events e "
                "JOIN jobs j ON j.id = e.job_id WHERE (e.change_xid, e.change_id) > (:a, :b) "
                f"AND e.change_xid < :horizon{owner} ORDER BY e.change_xid, e.change_id LIMIT :limit"
            ),
            params,
        ).fetchall()
        end = (horizon - 1, _MAX_ID)
    changes = [ChangeRow((int(r[0]), int(r[1])), *r[2:]) for r in rows]
    if len(changes) >= limit:
        end = changes[-1].position
    return changes, max(end, after)


def _owner_events(conn: Connection, owner_id: str | None) -> str:
    """The predicate for *owner_id*'s events (none for ``None``) that ``ix_job_events_owner`` serves in
    position order: on SQLite its change columns are NULL and the implicit rowid follows them."""
    if owner_id is None:
        return ""
    if conn.dialect.name == "sqlite":
        return " AND e.owner_id = :owner AND e.change_xid IS NULL AND e.change_id IS NULL"
    return " AND e.owner_id = :owner"


def event_position_nth(
    conn: Connection,
    owner_id: str | None,
    n: int,
    *,
    after: tuple[int, int] | None = None,
    upto: tuple[int, int],
    backward: bool = False,
) -> tuple[int, int] | None:
    """The position of the *n*-th event (of *owner_id*'s jobs if given) in ``(after, upto]``: counted from
    the oldest, or from the newest when *backward*; None when there are fewer than *n*.

    Only positions the feed has handed out are counted from (below the horizon of
    :func:`event_changes_after`), so the answer never changes — unless retention deleted events in the
    range, which callers check with :func:`jobs.retention_store.pruned_position`.
    """
    params: dict[str, Any] = {"owner": owner_id, "c": upto[0], "d": upto[1], "skip": n - 1}
    order = "DESC" if backward else ""
    if conn.dialect.name == "sqlite":
        lower = "" if after is None else " AND e.rowid > :a"
        sql = (
            f"SELECT e.rowid, 0 FROM job_events e WHERE e.rowid <= :c{lower}{_owner_events(conn, owner_id)} "
            f"ORDER BY e.rowid {order} LIMIT 1 OFFSET :skip"
        )
    else:
        lower = "" if after is None else " AND (e.change_xid, e.change_id) > (:a, :b)"
        sql = (
            "SELECT e.change_xid, e.change_id FROM job_events e WHERE (e.change_xid, e.change_id) <= (:c, :d)"
            f"{lower}{_owner_events(conn, owner_id)} "
            f"ORDER BY e.change_xid {order}, e.change_id {order} LIMIT 1 OFFSET :skip"
        )
    if after is not None:
        params.update(a=after[0], b=after[1])
    row = conn.execute(text(sql), params).first()
    return None if row is None else (int(row[0]), int(row[1]))


#: The change id that no event reaches: ``(xid, _MAX_ID)`` stands after every event of transaction *xid*.
_MAX_ID = 2**62


#: The oldest transaction still running that may write this database's events, or the next id to be
#: handed out when none runs. A snapshot's in-progress ids span every database of the server, so a long
#: write elsewhere (a bulk load, another application) would hold the feed back. An id is dropped only
#: when ``pg_stat_activity`` names another database for it. Ids are never reused and a session's
#: database never changes, so that answer cannot be wrong, even if the view was read before the
#: snapshot. An id the view does not show (ended meanwhile, another role's session hidden from this
#: one, a prepared transaction) still holds the feed back.
_PG_HORIZON = text(
    "SELECT coalesce("
    "(SELECT min(x::text::bigint) FROM pg_snapshot_xip(snap.s) AS x WHERE NOT EXISTS ("
    "SELECT 1 FROM pg_stat_activity a WHERE a.datname <> current_database() "
    "AND a.backend_xid::text::bigint = x::text::bigint % 4294967296)), "
    "pg_snapshot_xmax(snap.s)::text::bigint) FROM (SELECT pg_current_snapshot() AS s) snap"
)


def head_position(conn: Connection) -> tuple[int, int]:
    """The position after every event a reader can see now (see :func:`event_changes_after`)."""
    if conn.dialect.name == "sqlite":
        return int(conn.execute(text("SELECT coalesce(max(rowid), 0) FROM job_events")).scalar_one()), 0
    horizon = int(conn.execute(_PG_HORIZON).scalar_one())
    return horizon - 1, _MAX_ID


def position_bound(conn: Connection) -> tuple[int, int]:
    """The last position this database can have handed out by now: a cursor past it is none of its own. On
    PostgreSQL the head can move back for a while (an id :data:`_PG_HORIZON` dropped as another database's may
    be in progress without ``pg_stat_activity`` naming it a moment later, under a suite's load), so a cursor
    handed out before can lie past it; the next transaction id to be handed out never moves back."""
    if conn.dialect.name == "sqlite":
        return head_position(conn)
    xmax = int(conn.execute(text("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")).scalar_one())
    return xmax - 1, _MAX_ID
