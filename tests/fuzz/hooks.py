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
