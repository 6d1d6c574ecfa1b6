"""Property-based API tests: schemathesis generates requests from /api/openapi.json on a live gunicorn.

Every operation gets ``MAX_EXAMPLES`` positive and ``MAX_EXAMPLES`` negative generated cases, sent as
an admin with a bearer token, and checked with schemathesis' full check set (``call_and_validate``):
no 5xx, responses conform to the documented status codes, content types, headers and schemas,
invalid input is rejected, auth is not ignored. Failures of every operation are collected and
reported together. (schemathesis' pytest plugin does not work with pytest 9, hence the explicit
hypothesis loop.)
"""

from __future__ import annotations

from urllib.parse import urlencode

import pytest
import schemathesis
from hypothesis import HealthCheck, assume, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.config import SchemathesisConfig

from .apps import web_kinds  # noqa: F401  (the deployment's kinds: their rules, for the filter below)
from .conftest import Deployment

pytestmark = [pytest.mark.slow]
#: Generated cases per operation and mode.
MAX_EXAMPLES = 10
#: Invalid data may also be refused with 413: a body over the API's 4 MiB limit is refused before it is parsed.
#: A negative case can be that large: one string far past its maxLength in astral characters (12 bytes each as
#: JSON escapes) once made a body of over 1 MiB, the limit then.
_REJECTION = SchemathesisConfig().projects.default.checks.negative_data_rejection.expected_statuses
CONFIG = SchemathesisConfig.from_dict(
    {"checks": {"negative_data_rejection": {"expected-statuses": [*_REJECTION, 413]}}}
)


@pytest.mark.timeout(300)  # ≥ 500 generated requests over ~70 operations: about 100 s alone, more on a busy machine
def test_openapi_fuzz(deployment: Deployment) -> None:
    auth = {"Authorization": f"Bearer {deployment.admin_token}"}
    own = {"token_id": deployment.api("GET", "/api/v1/me", headers=auth)["token"]["id"], "name": deployment.admin[0]}
    schema = schemathesis.openapi.from_url(deployment.base_url + "/api/openapi.json", headers=auth, config=CONFIG)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15
    calls: list[str] = []
    failures: dict[str, str] = {}
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            label = f"{operation.label} [{mode.value}]"
            try:
                _fuzz(operation, mode, auth, calls, own)
            except Unsatisfiable:
                continue  # nothing to make invalid (no parameters, no body)
            except (Exception, BaseExceptionGroup) as exc:  # collect: report every operation's failure at once
                failures[label] = str(exc)[:2000]
    assert not failures, "\n\n".join(f"{k}:\n{v}" for k, v in failures.items())
    print(f"schemathesis: {len(calls)} generated cases over {len(operations)} operations, 0 failures")
    assert len(calls) >= 500, len(calls)


#: Headers that frame the HTTP message itself; gunicorn parses them before any application code runs.
FRAMING_HEADERS = frozenset({"content-length", "transfer-encoding"})

#: Operations whose input is checked beyond what OpenAPI can say, and the one check that cannot apply.
#: An upload's files must carry an FLV/MP4/XML signature (a corrupt file is rejected before anything is
#: written); OpenAPI only says "binary", so schemathesis' random bytes are schema-valid yet rightly
#: refused with 422. A user's ``role`` must name a role that exists (roles are data, not a schema enum):
#: a well-formed name no role has is rightly refused with 422. Every other check (no 5xx, documented
#: statuses, response schemas, negative data rejected, auth) still runs on them.
CONTENT_CHECKED_BEYOND_SCHEMA = {"POST /api/v1/uploads", "POST /api/v1/users", "PATCH /api/v1/users/{name}"}


def _within_the_kinds_rules(label: str, body: object) -> bool:
    """False for a submit whose payload fits its kind's JSON Schema but breaks a rule the schema can only
    state in words (``x-rules``: one field against another, e.g. a clip's end after its start, ``x-after``):
    the API rightly refuses it (422), and that refusal is the rule working, not a bug."""
    if label != "POST /api/v1/jobs" or not isinstance(body, dict):
        return True
    payload = body.get("payload", {})  # the API's default for a submit without one
    if not isinstance(payload, dict):
        return True
    from jobs.registry import registry

    kind = registry.find(str(body.get("kind")))
    if kind is None or kind.schema.problems_of_schema(payload):
        return True
    return not kind.schema.problems(payload)  # what is left: the orderings and the kind's check


#: Operations whose ``q`` (a string, to OpenAPI) follows the search grammar, and where their filter is.
SEARCHED = {
    "GET /api/v1/jobs": "query",
    "POST /api/v1/jobs/bulk/cancel": "body",
    "POST /api/v1/jobs/bulk/retry": "body",
}


def _within_the_search_grammar(label: str, case: object) -> bool:
    """False for a ``q`` the search grammar refuses (an unknown qualifier, a ``kind:`` other than the
    ``kind`` beside it …) though the schema, a string, allows it: the API rightly answers 400 with the
    reason (``webapp.job_search``), and that refusal is the grammar working, not a bug."""
    where = SEARCHED.get(label)
    args = getattr(case, "query", None) if where == "query" else (getattr(case, "body", None) or {})
    if where == "body":
        args = args.get("filter") if isinstance(args, dict) else None
    if not isinstance(args, dict) or not isinstance(args.get("q"), str):
        return True
    from dataclasses import replace

    from webapp.gateway import JobQuery
    from webapp.job_search import SearchInvalid, apply, parse

    status = args.get("status") or ()
    given = JobQuery(
        statuses=tuple([status] if isinstance(status, str) else status),
        kind=args.get("kind") or None,
        queue=args.get("queue") or None,
        parent_job_id=args.get("parent") or None,
    )
    try:
        apply(replace(parse(args["q"]), owner=None), given, None, None)  # an owner name is looked up, never refused
    except SearchInvalid:
        return False
    return True


def _excluded_checks(label: str) -> list[object] | None:
    if label not in CONTENT_CHECKED_BEYOND_SCHEMA:
        return None
    from schemathesis.specs.openapi.checks import positive_data_acceptance

    return [positive_data_acceptance]


def _leaves_the_fuzzer_its_credentials(case: object, own: dict[str, object]) -> bool:
    """False for a case that would revoke the fuzzer's own token or change its own user (its password, its
    role, disabling it): the API would rightly do it, and every later case would then be refused."""
    params = getattr(case, "path_parameters", None) or {}
    return not any(params.get(key) == value for key, value in own.items())


def _fuzz(operation, mode, auth: dict[str, str], calls: list[str], own: dict[str, object]) -> None:  # type: ignore[no-untyped-def]
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def run(case) -> None:  # type: ignore[no-untyped-def]
        # gunicorn itself answers request lines over 8190 bytes (HTML 414) before the app sees them,
        # and so it does malformed message framing (a generated "Content-Length: T" is an HTML 400,
        # an unknown Transfer-Encoding a 501): HTTP's own layer, not the API the document describes.
        assume(len(case.formatted_path) + len(urlencode(case.query or {}, doseq=True)) < 7_000)
        assume(not FRAMING_HEADERS.intersection(name.lower() for name in (case.headers or {})))
        assume(mode is GenerationMode.NEGATIVE or _within_the_kinds_rules(operation.label, case.body))
        assume(mode is GenerationMode.NEGATIVE or _within_the_search_grammar(operation.label, case))
        assume(_leaves_the_fuzzer_its_credentials(case, own))
        calls.append(operation.label)
        case.call_and_validate(headers=auth, timeout=10, excluded_checks=_excluded_checks(operation.label))

    run()
