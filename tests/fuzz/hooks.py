"""Schemathesis hooks for pglease's API fuzz run (tests/fuzz/run.sh).

503, 504 and 507 are part of pglease's contract — stopping or postgres down, `wait_ms` ran
out, no room in the byte budget — and documented in /openapi.json; any other 5xx is a bug.
This check replaces schemathesis' blanket `not_a_server_error`.
"""
import schemathesis

CAPACITY_ANSWERS = {503, 504, 507}


@schemathesis.check
def no_internal_error(ctx, response, case):
    if response.status_code >= 500 and response.status_code not in CAPACITY_ANSWERS:
        raise AssertionError(
            f"server error {response.status_code}: {response.text[:300]}"
        )


#: The longest a generated `POST /lease` waits for a database, in milliseconds.
LEASE_WAIT_MS = 2000

#: The longest a generated lease (or renewal) lives, in seconds.
LEASE_TTL_SECS = 5

#: The schema's own maxima (/openapi.json): above them a value is a negative case.
SCHEMA_MAX_WAIT_MS = 600_000
SCHEMA_MAX_TTL_SECS = 86_400


@schemathesis.hook
def map_body(ctx, body):
    """Caps how long a generated lease request waits (60 s without `wait_ms`, up to 600 s
    with it). A request the pool cannot serve yet — all of the connection budget while
    another generated lease holds a connection for hours — rightly waits that long and then
    answers 504; `--checks all` turns on `max_response_time` (10 s), which is to measure the
    API, not a wait the caller asked for. Bodies that are not objects, values that are not
    integers, and values beyond the schema's maximum go through as generated: those are
    negative cases, which the API must refuse (a cap would turn one into a valid request,
    which schemathesis then reports as invalid data accepted).

    A request without a body waits the default 60 s, which a hook cannot shorten; so the
    time a generated lease (or renewal) holds its connections is capped too: a lease
    asking for the whole connection budget then blocks the others for seconds, not for
    the hours it asked."""
    operation = getattr(ctx, "operation", None)
    if (
        operation is None
        or operation.method.upper() != "POST"
        or not isinstance(body, dict)
    ):
        return body
    if operation.path == "/lease":
        wait = body.get("wait_ms")
        if wait is None or (type(wait) is int and LEASE_WAIT_MS < wait <= SCHEMA_MAX_WAIT_MS):
            body["wait_ms"] = LEASE_WAIT_MS
    if operation.path in ("/lease", "/leases/{id}/renew"):
        ttl = body.get("ttl_secs")
        if ttl is None or (type(ttl) is int and LEASE_TTL_SECS < ttl <= SCHEMA_MAX_TTL_SECS):
            body["ttl_secs"] = LEASE_TTL_SECS
    return body
