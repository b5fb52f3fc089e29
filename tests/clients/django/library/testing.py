"""What the tests note for tests/it/django.rs: which database each test process really
connected to, one `PID DATABASE` line per call, in the file SEEN_DATABASES_FILE names."""

import os

from django.db import connection


def record_database() -> str:
    """Notes (and returns) the database this process's `default` connection is on."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_database()")
        name = cursor.fetchone()[0]
    path = os.environ.get("SEEN_DATABASES_FILE")
    if path:
        with open(path, "a") as seen:
            seen.write(f"{os.getpid()} {name}\n")
    return name
