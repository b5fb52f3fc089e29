"""What the plugin's fixtures share with its pytest-django part (`django_plugin.py`): the
run's settings, stashed on pytest's config under `SETTINGS`, and the lease and release
that report failures as pytest does. Both `plugin.py` and `django_plugin.py` import it, and
it imports neither, so that the two stay free of a cycle.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from typing import Optional

import pytest

from .client import Client, Database, PgleaseError, PgleaseUnavailable


@dataclass
class Settings:
    url: str
    token: Optional[str]
    template: str
    ttl: Optional[int]
    wait_ms: Optional[int]
    keep_failed: Optional[int]
    start: bool
    binary: Optional[str]
    serve_args: list
    daemon: Optional[subprocess.Popen] = None
    daemon_log: Optional[str] = None
    #: The databases kept of failed tests that the started daemon serves after pytest exits.
    lingering: Optional[list] = None
    #: Leases not released yet, so that an interrupted run still gives them back.
    open_leases: dict = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: pytest.Config) -> "Settings":
        option = config.getoption
        keep = option("--pglease-keep-failed")
        if keep is None and os.environ.get("PGLEASE_KEEP_FAILED"):
            keep = int(os.environ["PGLEASE_KEEP_FAILED"])
        return cls(
            url=option("--pglease-url")
            or os.environ.get("PGLEASE_URL")
            or config.getini("pglease_url")
            or "http://127.0.0.1:5480",
            token=option("--pglease-token") or os.environ.get("PGLEASE_TOKEN") or None,
            template=option("--pglease-template")
            or os.environ.get("PGLEASE_TEMPLATE")
            or config.getini("pglease_template")
            or "default",
            ttl=option("--pglease-ttl"),
            wait_ms=option("--pglease-wait-ms"),
            keep_failed=keep,
            start=option("--pglease-start"),
            binary=option("--pglease-bin") or os.environ.get("PGLEASE_BIN"),
            serve_args=list(config.getini("pglease_serve_args"))
            + list(option("--pglease-serve-arg")),
        )

    def client(self) -> Client:
        return Client(self.url, self.token)


SETTINGS = pytest.StashKey[Settings]()


def lease(settings: Settings, template: str, label: str) -> Database:
    try:
        database = settings.client().lease(
            template, label=label, ttl_secs=settings.ttl, wait_ms=settings.wait_ms
        )
    except PgleaseError as error:
        pytest.fail(
            f"pglease: cannot lease a database of template {template!r} for {label}: "
            f"{error.status} {error.code}: {error.message}",
            pytrace=False,
        )
    except PgleaseUnavailable as error:
        pytest.fail(f"pglease: {error}", pytrace=False)
    settings.open_leases[database.id] = database
    return database


def release(settings: Settings, database: Database, keep_secs: Optional[int] = None) -> Optional[str]:
    """Gives the database back; with `keep_secs` keeps it. Returns a note for the report."""
    client = settings.client()
    settings.open_leases.pop(database.id, None)
    note = None
    try:
        if keep_secs:
            try:
                client.release(database.id, keep_secs=keep_secs)
                return (
                    f"database {database.database} kept as the test left it for up to "
                    f"{keep_secs} s: {database.url}"
                )
            except PgleaseError as error:
                if error.status >= 500 or error.code == "lease_not_found":
                    raise
                note = (
                    f"the daemon at {settings.url} is too old to keep databases "
                    f"({error.status} {error.code}); dropped it instead"
                )
        client.release(database.id)
    except (PgleaseError, PgleaseUnavailable) as error:
        import warnings

        warnings.warn(f"pglease: could not release lease {database.id}: {error}")
    return note
