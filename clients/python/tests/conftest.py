"""The plugin's tests run small suites with pytester against a real daemon: PGLEASE_URL, a
daemon serving the template `app` of clients/testdata/migrations (customers alice and bob,
no orders). tests/it/helpers.rs starts one and runs them; by hand:

    pglease serve --listen 127.0.0.1:55481 --template app=migrations:$PWD/../testdata/migrations &
    PGLEASE_URL=http://127.0.0.1:55481 PGLEASE_BIN=$(which pglease) pytest tests
"""

import json
import os
import urllib.request

import pytest

pytest_plugins = ["pytester"]


def daemon_url() -> str:
    url = os.environ.get("PGLEASE_URL")
    if not url:
        pytest.fail(
            "PGLEASE_URL is not set: these tests need a real daemon serving template `app` "
            "(see tests/conftest.py); they skip nothing",
            pytrace=False,
        )
    return url.rstrip("/")


def authorized(request: urllib.request.Request) -> urllib.request.Request:
    """`request` with the daemon's token (PGLEASE_TOKEN), when it has one."""
    token = os.environ.get("PGLEASE_TOKEN")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    return request


def get(path: str):
    request = authorized(urllib.request.Request(daemon_url() + path))
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def open_leases(label_prefix: str) -> list:
    return [
        lease
        for lease in get("/status")["leases"]
        if (lease.get("label") or "").startswith(label_prefix)
    ]
